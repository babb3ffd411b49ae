"""Dual coordinate descent for L1- and L2-loss linear SVMs (Hsieh et al., ICML 2008).

Objective (the dual of ``min_w 1/2 |w|^2 + C sum_i L(y_i w^T x_i)``)::

    min_alpha  f(alpha) = 1/2 alpha^T (Q + D) alpha - e^T alpha,   0 <= alpha_i <= U,
    Q_ij = y_i y_j x_i^T x_j,   w = sum_i alpha_i y_i x_i   (IBCD paper eq. 7, 8)

with U = C, D_ii = 0 for the hinge (L1 loss) and U = inf, D_ii = 1/(2C) for the squared hinge
(L2 loss). Each pass visits the rows of the sub-problem in a fresh random order and solves
each one-variable problem in closed form, ``alpha_i <- min(max(alpha_i - G_i / Qbar_ii, 0),
U)`` with ``G_i = y_i w^T x_i - 1 + D_ii alpha_i`` (eq. 9), keeping ``w`` in step.

Stopping rule (LIBLINEAR): the spread ``max PG - min PG`` of the projected gradient over one
pass of the unshrunk problem is ``<= eps`` (default 0.1, absolute as in LIBLINEAR;
``relative_eps=True`` measures it against the spread of the first pass instead).
Shrinking: Algorithm 3 of Hsieh et al.; shrunk rows are restored and checked before stopping.

Bias: the intercept is the weight of an augmented constant feature of value ``bias``
(LIBLINEAR's ``-B 1``), so it is **regularized** like every other weight.

The kernels work on any subset of rows in memory with a warm start (``alpha``, ``w``),
which is how IBCD's block sub-problem (eq. 11/15), the block-minimisation baseline and the
truncated-loss relaxation (rows of OUT(w_t) left out, their alpha at 0) reuse them.

Streamed out of core, block by block, the same dual (full dual CD, block minimisation) is
:mod:`.dcd_streamed`'s.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import NamedTuple

import numpy as np

from ooc_learn.losses import Loss, get_loss
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from ._common import as_rows, check_labels, check_positive, seed_state

__all__ = ["DCDStats", "DCDResult", "dcd_subproblem", "solve_dcd", "dual_objective",
           "primal_objective", "loss_sum", "check_dual_params"]

log = logging.getLogger(__name__)


class DCDStats(NamedTuple):
    """Work and progress of one dual-CD solve."""

    epochs: int            #: passes over the (shrunk) sub-problem
    updates: int           #: coordinate updates that changed alpha
    visits: int            #: rows visited (inner products computed)
    pg_max: float          #: max projected gradient in the last pass
    pg_min: float          #: min projected gradient in the last pass
    converged: bool        #: the PG spread fell below eps on the unshrunk problem
    objective: float       #: dual objective f(alpha) over all alpha passed in
    rows_read: int = 0     #: rows read from storage (streamed solvers only)
    blocks_read: int = 0   #: blocks read from storage (streamed solvers only)


class DCDResult(NamedTuple):
    """The solution of :func:`solve_dcd`: ``w`` has d+1 entries (``w[d]`` is the bias weight)."""

    w: np.ndarray
    alpha: np.ndarray
    stats: DCDStats


def dual_objective(w: np.ndarray, alpha: np.ndarray, diag: float) -> float:
    """``f(alpha) = 1/2 |w|^2 + sum_i (D_ii/2 alpha_i^2 - alpha_i)`` with ``w`` from eq. (8)."""
    a = np.asarray(alpha, dtype=np.float64)
    return float(0.5 * np.dot(w, w) + 0.5 * diag * np.dot(a, a) - a.sum())


def primal_objective(X, y, w: np.ndarray, loss: Loss | str, C: float, bias: float = 1.0,
                     rows=None) -> float:
    """``1/2 |w|^2 + C sum_{i in rows} L(y_i [x_i, bias]^T w)``."""
    return float(0.5 * np.dot(w, w) + C * loss_sum(X, y, w, loss, bias, rows))


def loss_sum(X, y, w: np.ndarray, loss: Loss | str, bias: float = 1.0, rows=None) -> float:
    """``sum_{i in rows} L(y_i [x_i, bias]^T w)``: the loss part of :func:`primal_objective`
    (a store's is summed chunk by chunk: ``dcd_streamed.store_primal_objective``)."""
    loss = get_loss(loss)
    Xd, ip, ix, dt, sparse = kernel_args(X)
    r = as_rows(rows, X.shape[0], "primal_objective")
    z = np.empty(r.shape[0])
    K.rows_dot(Xd, ip, ix, dt, sparse, float(bias), r, np.asarray(w, dtype=np.float64), z)
    z *= np.asarray(y, dtype=np.float64)[r]
    return float(loss.value(z).sum())


def check_dual_params(C, eps, max_iter, bias, where):
    """Refuse a C, eps, max_iter or bias that no dual CD solver takes, naming ``where``."""
    check_positive(C, "C", where, hint="C is the SVM cost; try 1.")
    check_positive(eps, "eps", where, hint="LIBLINEAR's default for dual CD is 0.1.")
    check_positive(max_iter, "max_iter", where, integer=True, hint="Try 1000.")
    check_positive(bias, "bias", where, allow_zero=True,
                   hint="Use 1 for an intercept (LIBLINEAR -B 1) or 0 for none.")


def dcd_subproblem(X, y, alpha: np.ndarray, w: np.ndarray, rows=None, *,
                   loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                   eps: float = 0.1, max_iter: int = 1000, shrinking: bool = True,
                   relative_eps: bool = False, rng=None, sqnorms=None) -> DCDStats:
    """Dual CD on the rows ``rows`` of ``X`` (all rows by default), warm-started, in place.

    Parameters
    ----------
    X : float32 ndarray (m, d) or CSR matrix
        The rows in memory (a whole data set, an active set or a block).
    y : ndarray (m,)
        Labels in {-1, +1}.
    alpha : float64 ndarray (m,)
        Dual variables of the rows of X, updated in place for ``rows``; the others are fixed
        (their contribution must already be in ``w``).
    w : float64 ndarray (d + 1,)
        ``sum_i alpha_i y_i [x_i, bias]`` over all rows of the problem, updated in place.
    rows : int array or bool mask, optional
        The free variables (IBCD's block B, or IN(w_t) for the truncated relaxation).
    sqnorms : ndarray (m,), optional
        Squared row norms (the store keeps them); computed when missing.

    Returns
    -------
    DCDStats
        ``objective`` is the dual objective over all of ``alpha``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32); y = np.array([1.0, -1.0])
    >>> a = np.zeros(2); w = np.zeros(3)
    >>> dcd_subproblem(X, y, a, w, C=1.0).converged
    True
    """
    where = "dcd_subproblem"
    check_dual_params(C, eps, max_iter, bias, where)
    loss = get_loss(loss).base()
    Xd, ip, ix, dt, sparse = kernel_args(X)
    n, d = X.shape
    yf = check_labels(y, n, where)
    if (not isinstance(alpha, np.ndarray) or alpha.dtype != np.float64
            or alpha.shape != (n,) or not alpha.flags.writeable):
        raise ParameterError(f"alpha of {where} must be a writable float64 array of shape "
                             f"({n},).", "Pass np.zeros(n) for a cold start.")
    if (not isinstance(w, np.ndarray) or w.dtype != np.float64 or w.shape != (d + 1,)
            or not w.flags.writeable):
        raise ParameterError(f"w of {where} must be a writable float64 array of shape "
                             f"({d + 1},) (d weights and the bias weight).",
                             "Pass np.zeros(d + 1) for a cold start.")
    index = as_rows(rows, n, where)
    upper, diag = loss.dual_upper(C), loss.dual_diag(C)
    if index.size and (alpha[index].min() < 0 or alpha[index].max() > upper):
        raise ParameterError(f"alpha of {where} must lie in [0, {upper}] for the {loss.name} "
                             "loss.", "Clip the warm start or start from zeros.")
    sqn = (K.row_sqnorms(Xd, ip, ix, dt, sparse, n) if sqnorms is None
           else np.asarray(sqnorms, dtype=np.float64))
    state = seed_state(rng)
    epochs, upd, vis, pgmax, pgmin, conv = K.dcd_solve(
        Xd, ip, ix, dt, sparse, float(bias), yf, sqn, index, alpha, w, upper, diag,
        float(eps), bool(relative_eps), int(max_iter), bool(shrinking), state)
    obj = dual_objective(w, alpha, diag)
    if not math.isfinite(obj):
        raise OOCError(f"Dual CD diverged (objective {obj}) after {epochs} passes.",
                       "Scale the features (e.g. to [0, 1]) or lower C.")
    return DCDStats(int(epochs), int(upd), int(vis), float(pgmax), float(pgmin), bool(conv), obj)


def solve_dcd(X, y, *, loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
              eps: float = 0.1, max_iter: int = 1000, shrinking: bool = True,
              relative_eps: bool = False, rows=None, alpha0=None, seed=0,
              warn: bool = True) -> DCDResult:
    """Solve the L1/L2-loss SVM dual on in-memory rows from scratch (or from ``alpha0``).

    Equivalent to LIBLINEAR ``-s 3`` (hinge) / ``-s 1`` (sqhinge) with ``-B bias -e eps``.
    A non-converged run (``max_iter`` passes) warns, naming ``max_iter``/``eps``, unless
    ``warn`` is False (a deliberately short solve; a filter set by ``warnings.catch_warnings``
    is not thread-safe, and one-vs-rest classes train in threads).

    >>> import numpy as np
    >>> X = np.array([[2.0], [-2.0]], dtype=np.float32)
    >>> res = solve_dcd(X, np.array([1.0, -1.0]), C=10.0, bias=0.0, eps=1e-6)
    >>> round(float(res.w[0]), 6)
    0.5
    """
    check_dual_params(C, eps, max_iter, bias, "solve_dcd")
    loss = get_loss(loss).base()
    n, d = X.shape
    alpha = np.zeros(n) if alpha0 is None else np.array(alpha0, dtype=np.float64)
    yf = check_labels(y, n, "solve_dcd")
    w = np.zeros(d + 1)
    if alpha0 is not None:
        Xd, ip, ix, dt, sparse = kernel_args(X)
        K.rebuild_w(Xd, ip, ix, dt, sparse, float(bias), yf, np.arange(n, dtype=np.int64),
                    alpha, w)
    stats = dcd_subproblem(X, yf, alpha, w, rows, loss=loss, C=C, bias=bias, eps=eps,
                           max_iter=max_iter, shrinking=shrinking, relative_eps=relative_eps,
                           rng=seed)
    if warn and not stats.converged:
        warnings.warn(f"Dual CD reached max_iter={max_iter} passes before the projected-"
                      f"gradient spread fell to eps={eps} (it is "
                      f"{stats.pg_max - stats.pg_min:.3g}). Raise max_iter (ooc-train: "
                      "--max-outer, 100 passes each) or eps (--eps), or scale the features.", RuntimeWarning, stacklevel=2)
    log.info("dcd: %d passes, %d updates, objective %.6g", stats.epochs, stats.updates,
             stats.objective)
    return DCDResult(w, alpha, stats)
