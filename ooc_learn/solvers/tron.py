"""Trust-region Newton method (TRON) for the L2-loss SVM primal (Lin, Weng, Keerthi 2008).

Objective, the block sub-problem of the IBCD paper, eq. (16)::

    min_w  f(w) = 1/2 |w|^2 + C sum_{l in B} L(y_l w^T x_l) - w^T v_Bbar,
    v_Bbar = sum_{l not in B} alpha_l y_l x_l      (rows outside the block, alpha fixed)

with L the squared hinge ``max(0, 1 - z)^2``; generalized Hessian ``H = I + 2C X_I^T X_I``
over ``I = {l : y_l w^T x_l < 1}`` (eq. 17). ``v_Bbar = 0`` and ``B`` = all rows is the plain
L2-loss SVM (LIBLINEAR ``-s 2``). The intercept is the weight of an augmented feature of
value ``bias`` (regularized, as LIBLINEAR ``-B``).

Method: trust-region Newton iterations; each step solves ``H s = -g`` approximately by
preconditioned conjugate gradient (Steihaug) inside the region ``|s|_M <= delta``, with the
diagonal preconditioner ``M = (1 - a) I + a diag(H)``, a = 0.01 (Hsia, Chiang, Lin 2018).
The region is updated from the ratio of actual to predicted reduction with LIBLINEAR's
constants (eta = 1e-4, 0.25, 0.75; sigma = 0.25, 0.5, 4).

Stopping rule (LIBLINEAR): ``|grad f(w)| <= eps |grad f(0)|`` (default eps = 0.01); CG stops
when its residual is ``<= eps_cg`` (0.1) times its start.

The optimiser :func:`tron` only talks to a problem object with ``n``, ``fun(w)``,
``grad(w)``, ``Hv(s)`` and ``diag_precond()``; :class:`L2LossPrimal` is the SVM one.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import numpy as np

from ooc_learn.losses import Loss, TruncatedLoss, get_loss
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from ._common import as_rows, check_labels, check_positive

__all__ = ["L2LossPrimal", "TronStats", "TronResult", "tron", "solve_tron"]

log = logging.getLogger(__name__)

_ETA0, _ETA1, _ETA2 = 1e-4, 0.25, 0.75
_SIGMA1, _SIGMA2, _SIGMA3 = 0.25, 0.5, 4.0
_PRECOND_MIX = 0.01


class L2LossPrimal:
    """The primal (16) on the rows ``rows`` of ``X``: ``fun / grad / Hv / diag_precond``.

    ``grad``, ``Hv`` and ``diag_precond`` use the margins of the last ``fun`` call, so call
    ``fun(w)`` first at every new point (TRON does).

    Parameters
    ----------
    X, y : rows in memory (float32 dense or CSR) and labels in {-1, +1}
    C : float
    loss : "sqhinge" (a smooth loss is needed for the Hessian)
    bias : float
        Value of the augmented constant feature; 0 for no intercept.
    rows : int array or bool mask, optional
        The block B (all rows by default).
    v_fixed : ndarray (d + 1,), optional
        ``v_Bbar``, the contribution of the rows outside the block.
    """

    def __init__(self, X, y, *, C: float = 1.0, loss: Loss | str = "sqhinge",
                 bias: float = 1.0, rows=None, v_fixed=None):
        where = "L2LossPrimal"
        check_positive(C, "C", where, hint="C is the SVM cost; try 1.")
        check_positive(bias, "bias", where, allow_zero=True, hint="Use 1 or 0.")
        loss = get_loss(loss)
        if not loss.smooth or isinstance(loss, TruncatedLoss):
            raise ParameterError(
                f"The 'loss' parameter of {where} must be a smooth convex loss (sqhinge). "
                f"Got {loss.name!r} instead.",
                "Use dual CD for the hinge; truncation goes through ooc_learn.solvers.relax.")
        self.loss, self.C, self.bias = loss, float(C), float(bias)
        self._args = kernel_args(X)
        n, d = X.shape
        self.y = check_labels(y, n, where)
        self.rows = as_rows(rows, n, where)
        self.n = d + 1
        if v_fixed is None:
            self.v = np.zeros(self.n)
        else:
            self.v = np.asarray(v_fixed, dtype=np.float64)
            if self.v.shape != (self.n,):
                raise ParameterError(f"v_fixed of {where} must have {self.n} entries "
                                     f"(d weights and the bias). Got {self.v.shape}.")
        self._yr = self.y[self.rows]
        self._z = np.empty(self.rows.shape[0])
        self._curv_rows = self.rows[:0]
        self._curv = np.empty(0)
        self.n_fun = self.n_grad = self.n_hv = 0

    def margins(self, w: np.ndarray) -> np.ndarray:
        """``y_l w^T x_l`` for the rows of the block."""
        z = np.empty(self.rows.shape[0])
        K.rows_dot(*self._args, self.bias, self.rows, w, z)
        return z * self._yr

    def fun(self, w: np.ndarray) -> float:
        self.n_fun += 1
        self._z = self.margins(w)
        h = self.loss.hess(self._z)
        keep = h != 0.0
        self._curv_rows, self._curv = self.rows[keep], h[keep]
        return float(0.5 * np.dot(w, w) + self.C * self.loss.value(self._z).sum()
                     - np.dot(w, self.v))

    def grad(self, w: np.ndarray) -> np.ndarray:
        self.n_grad += 1
        coef = self.C * self.loss.grad(self._z) * self._yr
        g = w - self.v
        K.rows_tdot(*self._args, self.bias, self.rows, coef, g)
        return g

    def Hv(self, s: np.ndarray) -> np.ndarray:
        self.n_hv += 1
        xs = np.empty(self._curv_rows.shape[0])
        K.rows_dot(*self._args, self.bias, self._curv_rows, s, xs)
        out = s.copy()
        K.rows_tdot(*self._args, self.bias, self._curv_rows, self.C * self._curv * xs, out)
        return out

    def diag_precond(self) -> np.ndarray:
        """``diag(H) = 1 + C sum_l L''(z_l) x_lj^2``."""
        out = np.ones(self.n)
        K.rows_col_sqsum(*self._args, self.bias, self._curv_rows, self.C * self._curv, out)
        return out

    def dual(self, w: np.ndarray) -> np.ndarray:
        """The block's dual variables ``alpha_l = -C L'(z_l)`` at ``w`` (KKT of eq. 16)."""
        return self.loss.dual_from_margin(self.margins(w), self.C)


class TronStats(NamedTuple):
    """Work and progress of one TRON solve."""

    iterations: int        #: accepted Newton steps
    cg_iterations: int     #: conjugate-gradient iterations (Hessian-vector products)
    fun_evals: int
    gnorm: float           #: final gradient norm
    gnorm0: float          #: gradient norm at w = 0 (the stopping reference)
    converged: bool
    objective: float


class TronResult(NamedTuple):
    w: np.ndarray
    stats: TronStats


def _trcg(problem, g, M, delta, eps_cg):
    """Preconditioned CG for ``H s = -g`` truncated at ``|s|_M = delta`` (Steihaug).

    Returns ``(s, r, iterations, hit_boundary)`` with ``r = -g - H s``.
    """
    s = np.zeros_like(g)
    r = -g
    z = r / M
    d = z.copy()
    zTr = float(np.dot(z, r))
    cgtol = eps_cg * math.sqrt(zTr)
    it = 0
    while True:
        if math.sqrt(max(zTr, 0.0)) <= cgtol:
            return s, r, it, False
        it += 1
        Hd = problem.Hv(d)
        dHd = float(np.dot(d, Hd))
        alpha = zTr / dHd
        s_new = s + alpha * d
        if math.sqrt(float(np.dot(s_new * M, s_new))) > delta:
            # go to the boundary along d: the positive root of |s + tau d|_M = delta
            std, sts, dtd = (float(np.dot(s * M, d)), float(np.dot(s * M, s)),
                             float(np.dot(d * M, d)))
            rad = math.sqrt(max(std * std + dtd * (delta * delta - sts), 0.0))
            tau = (delta * delta - sts) / (std + rad) if std >= 0 else (rad - std) / dtd
            s += tau * d
            r -= tau * Hd
            return s, r, it, True
        s = s_new
        r -= alpha * Hd
        z = r / M
        zTr_new = float(np.dot(z, r))
        d = z + (zTr_new / zTr) * d
        zTr = zTr_new


def _new_radius(delta, snorm, actred, prered, gs, fnew, f):
    """LIBLINEAR's trust-region update from the actual / predicted reduction ratio."""
    denom = fnew - f - gs
    alpha = _SIGMA3 if denom <= 0 else max(_SIGMA1, -0.5 * (gs / denom))
    if actred < _ETA0 * prered:
        return min(max(alpha, _SIGMA1) * snorm, _SIGMA2 * delta)
    if actred < _ETA1 * prered:
        return max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA2 * delta))
    if actred < _ETA2 * prered:
        return max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA3 * delta))
    return max(delta, min(alpha * snorm, _SIGMA3 * delta))


def tron(problem, w0=None, *, eps: float = 0.01, eps_cg: float = 0.1,
         max_iter: int = 1000) -> TronResult:
    """Minimise ``problem.fun`` by trust-region Newton from ``w0`` (zeros by default).

    ``problem`` provides ``n``, ``fun(w)``, ``grad(w)`` (after ``fun`` at the same w),
    ``Hv(s)`` and ``diag_precond()``. See the module docstring for the rule.
    """
    check_positive(eps, "eps", "tron", hint="LIBLINEAR's default for the primal is 0.01.")
    check_positive(eps_cg, "eps_cg", "tron", hint="Use 0.1.")
    check_positive(max_iter, "max_iter", "tron", integer=True, hint="Try 1000.")
    n = problem.n
    zero = np.zeros(n)
    problem.fun(zero)
    gnorm0 = float(np.linalg.norm(problem.grad(zero)))
    w = zero if w0 is None else np.array(w0, dtype=np.float64)
    f = problem.fun(w)
    g = problem.grad(w)
    gnorm = float(np.linalg.norm(g))
    M = (1 - _PRECOND_MIX) + _PRECOND_MIX * problem.diag_precond()
    delta = math.sqrt(float(np.dot(g / M, g)))
    it = cg_total = 0
    converged = gnorm <= eps * gnorm0
    first = True
    while not converged and it < max_iter:
        s, r, cg_it, _ = _trcg(problem, g, M, delta, eps_cg)
        cg_total += cg_it
        w_new = w + s
        gs = float(np.dot(g, s))
        prered = -0.5 * (gs - float(np.dot(s, r)))
        fnew = problem.fun(w_new)
        actred = f - fnew
        snorm = math.sqrt(float(np.dot(s * M, s)))
        if first:
            delta = min(delta, snorm)
            first = False
        delta = _new_radius(delta, snorm, actred, prered, gs, fnew, f)
        if actred > _ETA0 * prered:
            it += 1
            w, f = w_new, fnew
            g = problem.grad(w)
            M = (1 - _PRECOND_MIX) + _PRECOND_MIX * problem.diag_precond()
            gnorm = float(np.linalg.norm(g))
            log.debug("tron iter %d f %.6g |g| %.3g CG %d", it, f, gnorm, cg_it)
            if gnorm <= eps * gnorm0:
                converged = True
                break
        else:
            problem.fun(w)  # restore the margins of the current point for the next Hv
        if not math.isfinite(f):
            raise OOCError(f"TRON diverged (objective {f}) at iteration {it}.",
                           "Scale the features (e.g. to [0, 1]) or lower C.")
        if (abs(actred) <= 1e-12 * abs(f) and abs(prered) <= 1e-12 * abs(f)) or \
                (actred <= 0 and prered <= 0):
            log.info("tron: no further progress possible at iteration %d (|g| %.3g)", it, gnorm)
            break
    stats = TronStats(it, cg_total, problem.n_fun, gnorm, gnorm0, bool(converged), float(f))
    return TronResult(w, stats)


def solve_tron(X, y, *, C: float = 1.0, loss: Loss | str = "sqhinge", bias: float = 1.0,
               rows=None, v_fixed=None, w0=None, eps: float = 0.01, eps_cg: float = 0.1,
               max_iter: int = 1000) -> TronResult:
    """The L2-loss SVM primal (or its block sub-problem (16)) solved by :func:`tron`.

    >>> import numpy as np
    >>> X = np.array([[2.0], [-2.0]], dtype=np.float32)
    >>> res = solve_tron(X, np.array([1.0, -1.0]), C=1.0, bias=0.0, eps=1e-8)
    >>> round(float(res.w[0]), 6)    # minimises w^2/2 + 2 (1 - 2w)^2
    0.470588
    """
    problem = L2LossPrimal(X, y, C=C, loss=loss, bias=bias, rows=rows, v_fixed=v_fixed)
    return tron(problem, w0, eps=eps, eps_cg=eps_cg, max_iter=max_iter)
