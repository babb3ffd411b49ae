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

Block minimisation (Yu et al. 2010, ``--solver bm``): the orchestrator keeps ``alpha`` (n)
and ``w``; for each block b it reads the rows, calls :func:`dcd_subproblem` on the block's
rows with ``alpha[off_b:off_b1]`` as warm start (a few passes, ``max_iter`` small) and moves
on; one outer iteration reads every block once (:func:`solve_bm_streamed`).
:func:`solve_dcd_streamed` is the one-pass-per-block case with LIBLINEAR's global shrinking
and stopping rule, i.e. full dual CD with the rows streamed.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Callable, NamedTuple

import numpy as np

from ooc_learn.losses import Loss, get_loss
from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from ._common import as_rows, check_labels, check_positive, kernel_args, seed_state

__all__ = ["DCDStats", "DCDResult", "dcd_subproblem", "solve_dcd", "dual_objective",
           "primal_objective", "solve_dcd_streamed", "solve_dcd_store", "solve_bm_streamed",
           "drop_rows", "held_out"]

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
    loss = get_loss(loss)
    Xd, ip, ix, dt, sparse = kernel_args(X)
    n = X.shape[0]
    r = as_rows(rows, n, "primal_objective")
    z = np.empty(r.shape[0])
    K.rows_dot(Xd, ip, ix, dt, sparse, float(bias), r, np.asarray(w, dtype=np.float64), z)
    z *= np.asarray(y, dtype=np.float64)[r]
    return float(0.5 * np.dot(w, w) + C * loss.value(z).sum())


def _check_common(C, eps, max_iter, bias, where):
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
    _check_common(C, eps, max_iter, bias, where)
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
    _check_common(C, eps, max_iter, bias, "solve_dcd")
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
                      f"{stats.pg_max - stats.pg_min:.3g}). Raise max_iter or eps, or scale "
                      "the features.", RuntimeWarning, stacklevel=2)
    log.info("dcd: %d passes, %d updates, objective %.6g", stats.epochs, stats.updates,
             stats.objective)
    return DCDResult(w, alpha, stats)


def solve_dcd_streamed(read_block: Callable[[int], tuple], block_offsets, n_features: int, *,
                       loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                       eps: float = 0.1, max_iter: int = 1000, shrinking: bool = True,
                       seed=0, sqnorms=None, budget=None, on_epoch=None, holdout=None,
                       warm=None) -> DCDResult:
    """Full dual CD with the rows streamed block by block (``--solver dcd`` out of core).

    Same objective, update and stopping rule as :func:`solve_dcd`; only the visiting order
    differs: each pass visits the blocks in a random order and the (unshrunk) rows of each
    block in a random order, so each pass reads every block holding an unshrunk row once.
    ``alpha`` (n float64), the per-block row permutations (n int32) and the squared norms
    (n float64) stay in memory and are reserved from ``budget``. Shrinking works across blocks
    with LIBLINEAR's global thresholds; a block whose rows are all shrunk is not read.

    Parameters
    ----------
    read_block : callable
        ``read_block(b) -> (X_b, y_b, ...)`` for rows ``block_offsets[b]:block_offsets[b+1]``.
    block_offsets : int array (R + 1,)
    sqnorms : callable or array, optional
        ``sqnorms(start, stop)`` or an (n,) array of squared row norms; computed from each
        block when missing.
    on_epoch : callable, optional
        ``on_epoch(epoch, stats)`` after every pass (progress lines).
    holdout : (start, stop) or bool array (n,), optional
        Rows left out of the problem (a cross-validation fold; a range, or a mask True on
        them): never visited, their alpha stays 0; a block wholly inside is not read.
    warm : (alpha, w), optional
        A warm start, used and updated in place: alpha (n,) float64 with 0 on the held-out
        rows, and w (d + 1,) = sum_i alpha_i y_i [x_i, bias] (see :func:`drop_rows`).
    """
    where = "solve_dcd_streamed"
    _check_common(C, eps, max_iter, bias, where)
    loss = get_loss(loss).base()
    off = np.asarray(block_offsets, dtype=np.int64)
    d = int(n_features)
    upper, diag = loss.dual_upper(C), loss.dual_diag(C)
    with StreamedDual(read_block, off, d, holdout=holdout, warm=warm, sqnorms=sqnorms,
                      seed=seed, where=where, budget=budget,
                      what="dual CD state (alpha, row lists, row norms)") as sd:
        alpha, w, active, sizes, state = sd.alpha, sd.w, sd.active, sd.sizes, sd.state
        pgmax_old, pgmin_old = np.inf, -np.inf
        epochs = upd = vis = 0
        pgmax = pgmin = 0.0
        converged = False
        streamed = not (off.shape[0] == 2 and on_epoch is None)
        if not streamed:
            # one block: LIBLINEAR's whole outer loop in one kernel call, the same passes in
            # the same order (a9a, one block, shrunk passes of ~5k rows: the Python loop's
            # per-pass block lookup and label copy took ~0.1 ms of each ~0.4 ms pass)
            for b, args, yf, sq, index, lo, hi in sd.blocks():
                epochs, upd, vis, pgmax, pgmin, converged = K.dcd_solve(
                    *args, float(bias), yf, sq, index[:int(active[b])], alpha[lo:hi], w,
                    upper, diag, float(eps), False, int(max_iter), bool(shrinking), state)
                sd.rows_read += (hi - lo) * (int(epochs) - 1)  # as if read every pass
                sd.blocks_read += int(epochs) - 1
        while streamed and epochs < max_iter:
            pgmax, pgmin = -np.inf, np.inf
            for b, args, yf, sq, index, lo, hi in sd.blocks():
                act, pmax, pmin, u, v = K.dcd_epoch(
                    *args, float(bias), yf, sq, index, int(active[b]), alpha[lo:hi], w, upper,
                    diag, pgmax_old, pgmin_old, bool(shrinking), state)
                active[b] = act
                pgmax, pgmin = max(pgmax, pmax), min(pgmin, pmin)
                upd += u
                vis += v
            epochs += 1
            rows_read = sd.rows_read
            if not np.isfinite(pgmax):  # every row shrunk
                pgmax = pgmin = 0.0
            if on_epoch is not None:
                on_epoch(epochs, {"objective": dual_objective(w, alpha, diag),
                                  "pg_spread": pgmax - pgmin, "rows_read": rows_read})
            if pgmax - pgmin <= eps:
                if np.array_equal(active, sizes):
                    converged = True
                    break
                active[:] = sizes
                pgmax_old, pgmin_old = np.inf, -np.inf
                continue
            pgmax_old = pgmax if pgmax > 0 else np.inf
            pgmin_old = pgmin if pgmin < 0 else -np.inf
        obj = dual_objective(w, alpha, diag)
        if not math.isfinite(obj):
            raise OOCError(f"Dual CD diverged (objective {obj}) after {epochs} passes.",
                           "Scale the features (e.g. to [0, 1]) or lower C.")
        if not converged:
            warnings.warn(f"Streamed dual CD reached max_iter={max_iter} passes before the "
                          f"projected-gradient spread fell to eps={eps}. Raise max_iter or "
                          "eps.", RuntimeWarning, stacklevel=2)
        stats = DCDStats(epochs, int(upd), int(vis), float(pgmax), float(pgmin), converged,
                         obj, int(sd.rows_read), int(sd.blocks_read))
        return DCDResult(w, alpha, stats)


class StreamedDual:
    """The state a streamed dual CD (SVM or SVR) keeps beside w: the dual variables over all
    rows, each block's list of training rows (its active prefix shrinks), the squared row
    norms (from ``sqnorms`` or computed at a block's first read), and the random state.
    :meth:`blocks` visits the blocks holding an active row in a fresh random order and yields
    each one's kernel arguments. A context manager: its 20 B a row (and w) are reserved from
    ``budget`` before they are allocated and released on exit."""

    def __init__(self, read_block, off, d: int, *, holdout, warm, sqnorms, seed, where,
                 budget=None, what="dual state"):
        n = int(off[-1])
        self.budget, self.need = budget, 8 * n + 4 * n + 8 * n + 8 * (d + 1)
        if budget is not None:
            budget.reserve(self.need, what)
        self.read_block, self.off, self.sqnorms = read_block, off, sqnorms
        self.alpha, self.w = _warm_state(warm, n, d, where)
        self.index = np.empty(n, dtype=np.int32)
        self.sizes = _train_index(off, holdout, self.index)
        self.active = self.sizes.copy()
        self.sqn = np.full(n, np.nan)
        if sqnorms is not None and not callable(sqnorms):
            self.sqn[:] = np.asarray(sqnorms, dtype=np.float64)
        self.gen = np.random.default_rng(seed)
        self.state = seed_state(self.gen)
        self.rows_read = self.blocks_read = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.budget is not None:
            self.budget.release(self.need)
            self.budget = None
        return False

    def blocks(self):
        """``(b, kernel args, y as float64, squared norms, row list, lo, hi)`` per block."""
        off = self.off
        for b in self.gen.permutation(off.shape[0] - 1):
            if self.active[b] == 0:
                continue
            lo, hi = int(off[b]), int(off[b + 1])
            Xb, yb = self.read_block(int(b))[:2]
            self.rows_read += hi - lo
            self.blocks_read += 1
            args = kernel_args(Xb)
            sq = self.sqn[lo:hi]
            if hi > lo and np.isnan(sq[0]):
                sq[:] = (self.sqnorms(lo, hi) if callable(self.sqnorms)
                         else K.row_sqnorms(*args, hi - lo))
            yield (int(b), args, np.asarray(yb, dtype=np.float64), sq, self.index[lo:hi],
                   lo, hi)


def _warm_state(warm, n: int, d: int, where: str):
    """``(alpha, w)``: zeros, or the caller's warm start checked for shape and dtype."""
    if warm is None:
        return np.zeros(n), np.zeros(d + 1)
    alpha, w = warm
    for name, a, size in (("alpha", alpha, n), ("w", w, d + 1)):
        if (not isinstance(a, np.ndarray) or a.dtype != np.float64 or a.shape != (size,)
                or not a.flags.writeable):
            raise ParameterError(f"The warm {name} of {where} must be a writable float64 "
                                 f"array of shape ({size},).", "Pass None for a cold start.")
    return alpha, w


def held_out(holdout, n: int, where: str = "holdout"):
    """A holdout as ``(start, stop, mask)``: a row range (``mask`` None), or a boolean mask
    of the n rows (True: held out; ``start:stop`` its span). None holds nothing out."""
    if holdout is None:
        return 0, 0, None
    if isinstance(holdout, np.ndarray) and holdout.dtype == bool:
        if holdout.shape != (n,):
            raise ParameterError(f"The {where} mask must have one entry per row ({n}). Got "
                                 f"shape {holdout.shape}.", "Pass folds == i.")
        idx = np.flatnonzero(holdout)
        if idx.size == 0 or idx.size == n:
            raise ParameterError(f"The {where} mask must hold out some rows and leave some.",
                                 "Pass the rows of one cross-validation fold.")
        return int(idx[0]), int(idx[-1]) + 1, holdout
    a, z = (int(v) for v in holdout)
    if not 0 <= a < z <= n or z - a == n:
        raise ParameterError(f"The {where} range must be (start, stop) with 0 <= start < "
                             f"stop <= {n} that leaves rows to train on. Got {holdout!r}.",
                             "Pass the rows of one cross-validation fold.")
    return a, z, None


def _train_index(off: np.ndarray, holdout, index: np.ndarray, shuffle: bool = True):
    """Fill ``index[lo:lo + size_b]`` with the local rows of block b that are not held out
    and return ``size_b`` per block (``holdout``: a (start, stop) range of store rows, a
    boolean mask of them, or None)."""
    R = off.shape[0] - 1
    sizes = np.diff(off).astype(np.int64)
    a, z, mask = held_out(holdout, int(off[-1]))
    for b in range(R):
        lo, hi = int(off[b]), int(off[b + 1])
        keep = np.arange(hi - lo, dtype=np.int32)
        if a < hi and z > lo:  # the held-out rows of this block leave its list
            keep = keep[~mask[lo:hi]] if mask is not None else \
                keep[(keep < a - lo) | (keep >= z - lo)]
        index[lo:lo + keep.size] = keep
        sizes[b] = keep.size
    return sizes


def drop_rows(read_range, start: int, stop: int, alpha: np.ndarray, w: np.ndarray,
              bias: float, *, signed: bool = False, mask=None, block_offsets=None) -> int:
    """Take rows out of a dual solution in place: ``w -= sum alpha_i y_i x_i`` over them and
    their alpha set to 0 (the next fold's held-out rows leave the warm start). The rows are
    ``start:stop``, or those of a boolean ``mask`` over all rows within that span.
    ``signed``: the dual variables carry their sign (SVR's beta, ``w = sum beta_i x_i``).
    ``read_range(a, b) -> (X, y, ...)``; only rows with a non-zero alpha are read, one span
    per block of ``block_offsets`` (default: one block). Returns the rows read."""
    off = (np.array([0, alpha.shape[0]], np.int64) if block_offsets is None
           else np.asarray(block_offsets, dtype=np.int64))
    read = 0
    for b in range(off.size - 1):
        lo, hi = max(int(off[b]), start), min(int(off[b + 1]), stop)
        if lo >= hi:
            continue
        take = alpha[lo:hi] != 0
        if mask is not None:
            take &= mask[lo:hi]
        nz = np.flatnonzero(take)
        if nz.size == 0:
            continue
        a, z = lo + int(nz[0]), lo + int(nz[-1]) + 1
        X, y = read_range(a, z)[:2]
        rows = (nz - (a - lo)).astype(np.int64)
        Xd, ip, ix, dt, sparse = kernel_args(X)
        neg = np.zeros(z - a)
        neg[rows] = -alpha[a:z][rows]
        if signed:  # rebuild_w adds alpha_i sign(y_i) x_i: beta's own sign goes in as label
            coef, sign = np.abs(neg), np.where(neg > 0, 1.0, -1.0)
        else:
            coef, sign = neg, np.asarray(y, dtype=np.float64)
        K.rebuild_w(Xd, ip, ix, dt, sparse, float(bias), sign, rows, coef, w)
        alpha[a + rows] = 0.0
        read += z - a
    return read


def solve_dcd_store(store, *, loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                    eps: float = 0.1, max_iter: int = 1000, shrinking: bool = True, seed=0,
                    on_epoch=None, holdout=None, warm=None) -> DCDResult:
    """:func:`solve_dcd_streamed` over the blocks of a binary :class:`~ooc_learn.Store`.

    The dual state is reserved from ``store.budget``; ``alpha`` is returned in store row
    order. Example::

        with open_store("train.store", memory="256M") as store:
            res = solve_dcd_store(store, loss="hinge", C=1.0)
    """
    where = "solve_dcd_store"
    _check_common(C, eps, max_iter, bias, where)
    get_loss(loss)
    if store.task != "binary":
        raise ParameterError(f"{where} trains a binary classifier; the store {store.path} "
                             f"holds a {store.task} task.",
                             "Ingest with --positive-label to make a one-vs-rest problem.")
    return solve_dcd_streamed(store.read_block, store.block_offsets, store.n_features,
                              loss=loss, C=C, bias=bias, eps=eps, max_iter=max_iter,
                              shrinking=shrinking, seed=seed, sqnorms=store.sqnorms,
                              budget=store.budget, on_epoch=on_epoch, holdout=holdout,
                              warm=warm)


def solve_bm_streamed(read_block: Callable[[int], tuple], block_offsets, n_features: int, *,
                      loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                      eps: float = 0.1, max_outer: int = 50, inner_eps: float = 0.1,
                      inner_max_iter: int = 10, seed=0, sqnorms=None, budget=None,
                      on_outer=None, holdout=None, warm=None) -> DCDResult:
    """Block minimisation (Yu, Hsieh, Chang, Lin, KDD 2010) with dual CD on each block.

    Objective: the dual (7) over all rows. Outer iteration: visit the blocks in a random
    order; for each, load it and solve its sub-problem (the other blocks' alpha fixed, their
    contribution already in ``w``) by dual CD warm-started from its alpha, at most
    ``inner_max_iter`` passes or PG spread ``<= inner_eps``. Stopping rule: the spread of the
    projected gradient measured in the first pass over each block (before that block moves)
    is ``<= eps`` over all blocks, or ``max_outer`` outer iterations. ``alpha`` (n float64)
    and the squared norms (n float64) are reserved from ``budget``. In the returned stats,
    ``epochs`` counts outer iterations and ``blocks_read`` block loads. ``holdout`` and
    ``warm`` are those of :func:`solve_dcd_streamed`.
    """
    where = "solve_bm_streamed"
    _check_common(C, eps, inner_max_iter, bias, where)
    check_positive(max_outer, "max_outer", where, integer=True, hint="Try 50.")
    check_positive(inner_eps, "inner_eps", where, hint="Use 0.1.")
    loss = get_loss(loss).base()
    off = np.asarray(block_offsets, dtype=np.int64)
    n, R, d = int(off[-1]), off.shape[0] - 1, int(n_features)
    upper, diag = loss.dual_upper(C), loss.dual_diag(C)
    need = 20 * n + 8 * (d + 1)
    if budget is not None:
        budget.reserve(need, "block-minimisation state (alpha, row norms, row lists)")
    try:
        alpha, w = _warm_state(warm, n, d, where)
        local = np.empty(n, dtype=np.int32)
        sizes = _train_index(off, holdout, local, shuffle=False)
        sqn = np.full(n, np.nan)
        if sqnorms is not None and not callable(sqnorms):
            sqn[:] = np.asarray(sqnorms, dtype=np.float64)
        gen = np.random.default_rng(seed)
        state = seed_state(gen)
        outer = epochs = upd = vis = rows_read = 0
        spread = np.inf
        while outer < max_outer:
            pgmax, pgmin = -np.inf, np.inf
            for b in gen.permutation(R):
                lo, hi = off[b], off[b + 1]
                if sizes[b] == 0:
                    continue
                Xb, yb = read_block(int(b))[:2]
                rows_read += hi - lo
                args = kernel_args(Xb)
                sq = sqn[lo:hi]
                if np.isnan(sq[0]):
                    sq[:] = (sqnorms(lo, hi) if callable(sqnorms)
                             else K.row_sqnorms(*args, hi - lo))
                yf = np.asarray(yb, dtype=np.float64)
                index = local[lo:lo + sizes[b]].astype(np.int64)
                # first pass without shrinking measures the block's PG before it moves
                _, pmax, pmin, u, v = K.dcd_epoch(*args, float(bias), yf, sq, index,
                                                  index.size,
                                                  alpha[lo:hi], w, upper, diag, np.inf,
                                                  -np.inf, False, state)
                pgmax, pgmin = max(pgmax, pmax), min(pgmin, pmin)
                e = u2 = v2 = 0
                if inner_max_iter > 1:
                    e, u2, v2, _, _, _ = K.dcd_solve(
                        *args, float(bias), yf, sq, index, alpha[lo:hi], w, upper, diag,
                        float(inner_eps), False, int(inner_max_iter) - 1, True, state)
                epochs += 1 + e
                upd += u + u2
                vis += v + v2
            outer += 1
            spread = pgmax - pgmin
            if on_outer is not None:
                on_outer(outer, {"objective": dual_objective(w, alpha, diag),
                                 "pg_spread": spread, "rows_read": rows_read, "w": w})
            if spread <= eps:
                break
        obj = dual_objective(w, alpha, diag)
        if not math.isfinite(obj):
            raise OOCError(f"Block minimisation diverged (objective {obj}).",
                           "Scale the features (e.g. to [0, 1]) or lower C.")
        stats = DCDStats(outer, int(upd), int(vis), float(pgmax), float(pgmin),
                         bool(spread <= eps), obj, int(rows_read), int(outer * R))
        return DCDResult(w, alpha, stats)
    finally:
        if budget is not None:
            budget.release(need)
