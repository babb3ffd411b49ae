"""Dual coordinate descent for linear support vector regression (Ho & Lin, JMLR 2012).

The primal, with the intercept as the weight of a constant feature ``bias`` (regularized, as
LIBLINEAR's ``-B``)::

    min_w  1/2 |w|^2 + C sum_i L(y_i - w^T x_i),
    L(r) = max(0, |r| - p)      ("epsilon_insensitive", LIBLINEAR -s 13)
    L(r) = max(0, |r| - p)^2    ("squared_epsilon_insensitive", LIBLINEAR -s 12; p = 0 is
                                  least squares: ridge regression with alpha = 1 / (2 C))

and its dual, solved one variable at a time in a random order (the kernel
:func:`~ooc_learn.solvers._kernels.svr_epoch`)::

    min_beta  1/2 beta^T (Q + D) beta - y^T beta + p |beta|_1,   -U <= beta_i <= U,
    Q_ij = x_i^T x_j,  w = sum_i beta_i x_i,
    L1: U = C, D = 0;  L2: U = inf, D_ii = 1 / (2 C).

Stopping rule (LIBLINEAR's): the summed violation of the optimality conditions over one
pass of the unshrunk problem falls to ``eps`` times its sum over the first pass. A warm
start would measure its first pass near the optimum and so stop later than a cold one at the
same ``eps``; it takes the ``reference`` of the cold solve it continues instead
(cross-validation's folds), so every fold is solved to the same accuracy. The reference is
the first pass's violation, as LIBLINEAR's, not the violation at beta = 0,
sum_i max(|y_i| - p, 0), which is larger and stops the solve above LIBLINEAR's objective.
Shrinking as LIBLINEAR's.

The rows stream block by block as for the classifiers' dual CD
(:func:`~ooc_learn.solvers.dcd_streamed.solve_dcd_streamed`): beta (n float64), the per-block row
lists and the squared norms stay in memory, reserved from the budget; ``holdout`` leaves a
range of rows out (a cross-validation fold) and ``warm`` starts from a previous (beta, w).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, NamedTuple

import numpy as np

from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from .dcd_streamed import StreamedDual

__all__ = ["SVR_LOSSES", "SVRStats", "SVRResult", "solve_svr", "solve_svr_streamed",
           "solve_svr_store", "svr_primal_objective"]

SVR_LOSSES = ("squared_epsilon_insensitive", "epsilon_insensitive")


class SVRStats(NamedTuple):
    epochs: int
    updates: int
    visits: int
    violation: float  # the last pass's summed violation over the reference
    converged: bool
    rows_read: int = 0
    reference: float = 0.0  # the summed violation the stopping rule is relative to


class SVRResult(NamedTuple):
    w: np.ndarray       # (d + 1,): weights and the bias feature's weight
    beta: np.ndarray    # (n,) the dual variables (0 on held-out rows)
    stats: SVRStats


def _box(loss: str, C: float) -> tuple[float, float]:
    """``(U, D_ii)`` of the dual for the loss at cost C."""
    if loss == "epsilon_insensitive":
        return C, 0.0
    if loss == "squared_epsilon_insensitive":
        return math.inf, 0.5 / C
    raise ParameterError(f"The 'loss' parameter of the SVR solver must be one of "
                         f"{', '.join(SVR_LOSSES)}. Got {loss!r} instead.",
                         "squared_epsilon_insensitive with epsilon 0 is least squares.")


def _check(C, epsilon, eps, max_iter, bias, where):
    for name, v, ok, hint in (
            ("C", C, lambda v: v > 0 and math.isfinite(v), "C is the cost; try 1."),
            ("epsilon", epsilon, lambda v: v >= 0 and math.isfinite(v),
             "0 fits least squares; LIBLINEAR's -p default is 0.1."),
            ("eps", eps, lambda v: v > 0, "LIBLINEAR's default is 0.1."),
            ("bias", bias, lambda v: v >= 0, "1 adds an intercept, 0 none.")):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v)):
            raise ParameterError(f"The '{name}' parameter of {where} is out of range. Got "
                                 f"{v!r}.", hint)
    if not (isinstance(max_iter, int) and max_iter >= 1):
        raise ParameterError(f"The 'max_iter' parameter of {where} must be an int >= 1. Got "
                             f"{max_iter!r}.", "Try 1000.")


def svr_primal_objective(X, y, w, *, loss: str, C: float, epsilon: float,
                         bias: float = 1.0) -> float:
    """``1/2 |w|^2 + C sum L(y_i - w^T [x_i, bias])`` on in-memory rows."""
    r = np.asarray(y, dtype=np.float64) - (np.asarray(X @ w[:-1]).ravel() + w[-1] * bias)
    e = np.maximum(np.abs(r) - epsilon, 0.0)
    return float(0.5 * w @ w + C * (e.sum() if loss == "epsilon_insensitive" else e @ e))


def solve_svr_streamed(read_block: Callable[[int], tuple], block_offsets, n_features: int, *,
                       loss: str = "squared_epsilon_insensitive", C: float = 1.0,
                       epsilon: float = 0.0, bias: float = 1.0, eps: float = 0.1,
                       max_iter: int = 1000, shrinking: bool = True, seed=0, sqnorms=None,
                       budget=None, on_epoch=None, holdout=None, warm=None,
                       reference: float | None = None) -> SVRResult:
    """Dual CD for linear SVR with the rows streamed block by block (module docstring).

    ``read_block(b) -> (X_b, y_b, ...)``; ``sqnorms`` an (n,) array or ``sqnorms(a, b)``;
    ``on_epoch(epoch, info)`` after each pass; ``holdout = (start, stop)`` rows left out;
    ``warm = (beta, w)`` used and updated in place (beta 0 on the held-out rows);
    ``reference``: the first-pass violation of a cold solve to stop relative to (default:
    this solve's first pass).
    """
    where = "solve_svr_streamed"
    _check(C, epsilon, eps, max_iter, bias, where)
    upper, diag = _box(loss, C)
    off = np.asarray(block_offsets, dtype=np.int64)
    d = int(n_features)
    with StreamedDual(read_block, off, d, holdout=holdout, warm=warm, sqnorms=sqnorms,
                      seed=seed, where=where, budget=budget,
                      what="SVR dual state (beta, row lists, row norms)") as sd:
        beta, w, active, sizes = sd.alpha, sd.w, sd.active, sd.sizes
        gmax_old = np.inf
        reference = -1.0 if reference is None else float(reference)
        epochs = upd = vis = 0
        violation = np.inf
        converged = False
        while epochs < max_iter:
            gmax = gnorm1 = 0.0
            for b, args, yf, sq, index, lo, hi in sd.blocks():
                act, gm, gn, u, v = K.svr_epoch(
                    *args, float(bias), yf, sq, index, int(active[b]), beta[lo:hi], w, upper,
                    diag, float(epsilon), gmax_old, bool(shrinking), sd.state)
                active[b] = act
                gmax = max(gmax, gm)
                gnorm1 += gn
                upd += u
                vis += v
            epochs += 1
            if reference < 0:
                reference = gnorm1
            violation = gnorm1 / reference if reference > 0 else 0.0
            if on_epoch is not None:
                on_epoch(epochs, {"violation": violation, "rows_read": sd.rows_read})
            if violation <= eps:
                if np.array_equal(active, sizes):
                    converged = True
                    break
                active[:] = sizes
                gmax_old = np.inf
                continue
            gmax_old = gmax if gmax > 0 else np.inf
        if not np.isfinite(w).all():
            raise OOCError(f"SVR dual CD diverged after {epochs} passes.",
                           "Scale the features (e.g. to [0, 1]) or lower C.")
        if not converged:
            warnings.warn(f"SVR dual CD reached max_iter={max_iter} passes before the "
                          f"violation fell to eps={eps} of its start (it is {violation:.3g})."
                          " Raise max_iter (ooc-train: --max-outer, 100 passes each) or eps (--eps), or "
                          "scale the features.", RuntimeWarning,
                          stacklevel=2)
        return SVRResult(w, beta, SVRStats(epochs, int(upd), int(vis), float(violation),
                                           converged, int(sd.rows_read), float(reference)))


def solve_svr(X, y, *, loss: str = "squared_epsilon_insensitive", C: float = 1.0,
              epsilon: float = 0.0, bias: float = 1.0, eps: float = 0.1, max_iter: int = 1000,
              shrinking: bool = True, seed=0) -> SVRResult:
    """Linear SVR on in-memory rows (one block of :func:`solve_svr_streamed`).

    >>> import numpy as np
    >>> X = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    >>> res = solve_svr(X, np.array([2.0, 4.0, 6.0]), C=1e6, bias=0.0, eps=1e-9)
    >>> round(float(res.w[0]), 4)
    2.0
    """
    y = np.asarray(y, dtype=np.float64).ravel()
    if y.shape[0] != X.shape[0]:
        raise ParameterError(f"y has {y.shape[0]} values for {X.shape[0]} rows.")
    return solve_svr_streamed(lambda b: (X, y), [0, X.shape[0]], X.shape[1], loss=loss, C=C,
                              epsilon=epsilon, bias=bias, eps=eps, max_iter=max_iter,
                              shrinking=shrinking, seed=seed)


def solve_svr_store(store, **kwargs) -> SVRResult:
    """:func:`solve_svr_streamed` over the blocks of a regression store."""
    if store.task != "regression":
        raise ParameterError(f"SVR fits a regression store; {store.path} holds a {store.task} "
                             "task.", "Train a classifier on it instead.")
    return solve_svr_streamed(store.read_block, store.block_offsets, store.n_features,
                              sqnorms=store.sqnorms, budget=store.budget, **kwargs)
