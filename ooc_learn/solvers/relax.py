"""Truncated-loss SVM by convex relaxation (IBCD paper §2, eq. 5).

Objective (2), non-convex::

    J(w) = 1/2 |w|^2 + C sum_l R_s(y_l w^T x_l),   R_s(z) = min(L(z), 1 + s).

Each outer iteration t fixes the loss of the current outliers OUT(w_t) = {l : y_l w_t^T x_l
< L^-1(1 + s)} at the cap 1 + s and solves the convex problem of L on the rest (eq. 5)::

    w_{t+1} = argmin_w 1/2 |w|^2 + C sum_{l in IN(w_t)} L(y_l w^T x_l)   (+ C |OUT| (1 + s)).

Because (5) upper-bounds (2) and equals it at w_t, J never increases; the loop stops when the
outlier set stops changing (then w_t is a fixed point: a minimiser of (5) whose own outlier
set is the one it was solved for) or after ``max_outer`` iterations. The convex solver is
inexact (it stops at a tolerance), so an iteration whose J would rise is re-solved with a
tighter tolerance (``tighten`` = 1, 2, 3 asks for 10x, 100x, 1000x) and, failing that, the
loop stops at w_t: the returned sequence of J is non-increasing by construction.

The step "solve the convex problem on IN(w_t)" is a callable, so IBCD plugs in its
out-of-core solver; :func:`relax_in_memory` plugs in dual CD or TRON on arrays::

    solve_convex(w_t, inlier, warm, tighten) -> (w, warm, stats)
    margins(w) -> y * (X w)   for every row (a full pass; streamed out of core)

``inlier`` is the boolean mask IN(w_t) over all n rows, ``warm`` an opaque warm start owned
by the solver (None at the first call; dual CD keeps alpha in it).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import numpy as np

from ooc_learn.losses import Loss, TruncatedLoss, get_loss
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import ParameterError

from . import _kernels as K
from ._common import as_rows, check_labels, check_positive
from .dcd import dcd_subproblem
from .tron import L2LossPrimal, tron

__all__ = ["RelaxStats", "RelaxResult", "relax", "relax_in_memory", "truncated_objective",
           "DualCDConvexSolver", "TronConvexSolver", "outer_loop", "STOP"]

log = logging.getLogger(__name__)

_MAX_TIGHTEN = 3


class RelaxStats(NamedTuple):
    """Progress of the relaxation."""

    outer_iterations: int      #: convex problems accepted
    objectives: list           #: J(w_0), J(w_1), ... (non-increasing)
    n_outliers: list           #: |OUT(w_t)| for each accepted w_t
    converged: bool            #: OUT stopped changing
    inner: list                #: the convex solver's statistics, one per solve
    margin_passes: int         #: full passes computing margins (rows read / n)


class RelaxResult(NamedTuple):
    w: np.ndarray
    warm: Any                  #: the convex solver's final state (alpha for dual CD)
    inlier: np.ndarray         #: IN(w) of the returned w
    stats: RelaxStats


def truncated_objective(w: np.ndarray, z: np.ndarray, loss: TruncatedLoss, C: float) -> float:
    """J(w) of eq. (2) from the margins ``z = y * X w`` of every row."""
    return float(0.5 * np.dot(w, w) + C * loss.value(z).sum())


# what an outer step returns to end the loop at the last accepted iterate, unconverged
STOP = -1


def outer_loop(step: Callable[[int], int | None], max_outer: int) -> tuple[int, bool]:
    """The relaxation's outer loop, shared by :func:`relax` and IBCD.

    ``step(t)`` runs outer iteration t = 1, 2, ...: it fixes the outliers OUT(w_t), solves
    the convex problem (5) and returns how many rows changed side between OUT(w_t) and the
    outlier set before it (None where that is not known yet), or ``STOP`` to end at the
    last accepted iterate. The loop ends when no row changed side (a fixed point) or after
    ``max_outer`` iterations. Returns ``(iterations accepted, converged)``.
    """
    t = 0
    while t < max_outer:
        changed = step(t + 1)
        if changed == STOP:
            return t, False
        t += 1
        if changed == 0:
            return t, True
    return t, False


def relax(solve_convex: Callable, margins: Callable[[np.ndarray], np.ndarray],
          loss: TruncatedLoss, C: float, w0: np.ndarray, *, max_outer: int = 50,
          warm=None, on_outer=None) -> RelaxResult:
    """Run the relaxation (5) from ``w0``; see the module docstring for the contract.

    ``on_outer(t, info)`` is called after every accepted iteration with the objective, the
    number of outliers and the inner statistics (for progress lines).
    """
    check_positive(C, "C", "relax", hint="C is the SVM cost; try 1.")
    check_positive(max_outer, "max_outer", "relax", integer=True, hint="Try 50.")
    if not isinstance(loss, TruncatedLoss):
        raise ParameterError("The 'loss' parameter of relax must be a truncated loss. "
                             f"Got {loss!r} instead.", "Use get_loss('hinge', s=1.0).")
    w = np.array(w0, dtype=np.float64)
    z = margins(w)
    inlier = loss.inlier(z)
    J = truncated_objective(w, z, loss, C)
    objectives, n_out, inner = [J], [int((~inlier).sum())], []
    state = {"w": w, "warm": warm, "J": J, "inlier": inlier, "passes": 1}

    def step(t):
        w, J, inlier = state["w"], state["J"], state["inlier"]
        warm = state["warm"]
        for tighten in range(_MAX_TIGHTEN + 1):
            w_new, warm_new, st = solve_convex(w, inlier, warm, tighten)
            inner.append(st)
            z_new = margins(w_new)
            state["passes"] += 1
            J_new = truncated_objective(w_new, z_new, loss, C)
            if J_new <= J * (1 + 1e-12) + 1e-12:
                break
            log.info("relax: J rose from %.8g to %.8g (inexact inner solve); tightening",
                     J, J_new)
            warm = warm_new
        else:
            log.warning("relax: the inner solver could not decrease J after %d tighter "
                        "solves; stopping at iteration %d.", _MAX_TIGHTEN, t - 1)
            state["warm"] = warm
            return STOP
        new_inlier = loss.inlier(z_new)
        changed = int(np.count_nonzero(new_inlier != inlier))
        state.update(w=w_new, warm=warm_new, J=J_new, inlier=new_inlier)
        objectives.append(J_new)
        n_out.append(int((~new_inlier).sum()))
        if on_outer is not None:
            on_outer(t, {"objective": J_new, "n_outliers": n_out[-1], "changed": changed,
                         "inner": st})
        log.info("relax %d: J %.8g, %d outliers (%d rows changed side)", t, J_new, n_out[-1],
                 changed)
        return changed

    t, converged = outer_loop(step, max_outer)
    w, warm, inlier, passes = state["w"], state["warm"], state["inlier"], state["passes"]
    return RelaxResult(w, warm, inlier, RelaxStats(t, objectives, n_out, converged, inner,
                                                   passes))


class DualCDConvexSolver:
    """``solve_convex`` for :func:`relax` by dual CD on the inliers of in-memory rows.

    Keeps alpha between outer iterations; rows that became outliers get alpha = 0 and ``w``
    is rebuilt from alpha (eq. 8), so the warm start is always a feasible dual point of (7).
    """

    def __init__(self, X, y, *, loss: Loss, C: float, bias: float, eps: float,
                 max_iter: int, rng):
        self.X, self.y, self.loss, self.C, self.bias = X, y, loss, C, bias
        self.eps, self.max_iter, self.rng = eps, max_iter, rng
        self._args = kernel_args(X)
        self._sqn = K.row_sqnorms(*self._args, X.shape[0])

    def __call__(self, w_t, inlier, warm, tighten):
        n, d = self.X.shape
        alpha = np.zeros(n) if warm is None else warm.copy()
        alpha[~inlier] = 0.0
        w = np.zeros(d + 1)
        K.rebuild_w(*self._args, self.bias, self.y, np.flatnonzero(alpha).astype(np.int64),
                    alpha, w)
        st = dcd_subproblem(self.X, self.y, alpha, w, inlier, loss=self.loss, C=self.C,
                            bias=self.bias, eps=self.eps / 10.0 ** tighten,
                            max_iter=self.max_iter, rng=self.rng, sqnorms=self._sqn)
        return w, alpha, st


class TronConvexSolver:
    """``solve_convex`` for :func:`relax` by TRON on the inliers (squared hinge only)."""

    def __init__(self, X, y, *, loss: Loss, C: float, bias: float, eps: float,
                 max_iter: int):
        self.X, self.y, self.loss, self.C, self.bias = X, y, loss, C, bias
        self.eps, self.max_iter = eps, max_iter

    def __call__(self, w_t, inlier, warm, tighten):
        prob = L2LossPrimal(self.X, self.y, C=self.C, loss=self.loss, bias=self.bias,
                            rows=inlier)
        res = tron(prob, w_t, eps=self.eps / 10.0 ** tighten, max_iter=self.max_iter)
        return res.w, None, res.stats


def relax_in_memory(X, y, *, loss: str | Loss = "hinge", s: float = 1.0, C: float = 1.0,
                    bias: float = 1.0, solver: str = "dcd", w0=None,
                    init_sample: int | None = 10000, max_outer: int = 50,
                    eps: float | None = None, max_iter: int = 1000, seed=0,
                    on_outer=None) -> RelaxResult:
    """Truncated-loss linear SVM on in-memory rows by the relaxation (5).

    ``w0`` defaults to the convex-loss solution on a random sample of ``init_sample`` rows
    (the paper's practical start; all rows when ``init_sample`` is None or >= n).
    ``solver`` is "dcd" (hinge or squared hinge, dual) or "tron" (squared hinge, primal);
    ``eps`` defaults to 0.1 for dual CD and 0.01 for TRON (LIBLINEAR's defaults).

    >>> import numpy as np
    >>> X = np.array([[1.0], [2.0], [-1.0], [-2.0], [-3.0]], dtype=np.float32)
    >>> y = np.array([1.0, 1.0, -1.0, -1.0, 1.0])         # the last row is a flipped label
    >>> res = relax_in_memory(X, y, s=1.0, C=1.0, bias=0.0)
    >>> bool(res.inlier[-1]), bool(res.w[0] > 0)
    (False, True)
    """
    where = "relax_in_memory"
    check_positive(C, "C", where, hint="C is the SVM cost; try 1.")
    check_positive(s, "s", where, allow_zero=True, hint="The paper uses s = 1.")
    check_positive(bias, "bias", where, allow_zero=True, hint="Use 1 or 0.")
    if solver not in ("dcd", "tron"):
        raise ParameterError(f"The 'solver' parameter of {where} must be 'dcd' or 'tron'. "
                             f"Got {solver!r} instead.")
    tloss = get_loss(loss, s=s)
    base = tloss.base()
    if solver == "tron" and not base.smooth:
        raise ParameterError(f"The 'solver' parameter of {where} is 'tron', which needs the "
                             f"squared hinge. Got loss {base.name!r}.",
                             "Use solver='dcd' for the hinge.")
    eps = (0.1 if solver == "dcd" else 0.01) if eps is None else eps
    check_positive(eps, "eps", where, hint="Use 0.1 for dual CD, 0.01 for TRON.")
    n, d = X.shape
    yf = check_labels(y, n, where)
    gen = np.random.default_rng(seed)
    if solver == "dcd":
        inner = DualCDConvexSolver(X, yf, loss=base, C=C, bias=bias, eps=eps,
                                   max_iter=max_iter, rng=gen)
    else:
        inner = TronConvexSolver(X, yf, loss=base, C=C, bias=bias, eps=eps,
                                 max_iter=max_iter)
    warm = None
    if w0 is None:
        all_in = np.ones(n, dtype=bool)
        if init_sample is not None and init_sample < n:
            all_in[:] = False
            all_in[gen.choice(n, size=int(init_sample), replace=False)] = True
        w0, warm, _ = inner(np.zeros(d + 1), all_in, None, 0)
    args = kernel_args(X)
    rows = as_rows(None, n, where)

    def margins(w):
        z = np.empty(n)
        K.rows_dot(*args, float(bias), rows, w, z)
        return z * yf

    return relax(inner, margins, tloss, C, w0, max_outer=max_outer, warm=warm,
                 on_outer=on_outer)
