"""Dual coordinate descent for linear SVMs with the rows streamed block by block: full dual CD
out of core (``--solver dcd``) and block minimisation (``--solver bm``).

Objective, update and stopping rule are :mod:`.dcd`'s (Hsieh et al., ICML 2008): the dual
``min 1/2 alpha^T (Q + D) alpha - e^T alpha``, ``0 <= alpha_i <= U``, over all n rows.
Only ``alpha`` (n float64), the per-block row lists (n int32) and the squared row norms
(n float64) stay in memory, reserved from the budget (:class:`StreamedDual`); the rows are
read a block at a time.

:func:`solve_dcd_streamed` is the one-pass-per-block case with LIBLINEAR's global shrinking
and stopping rule, i.e. full dual CD with the rows streamed.

Block minimisation (Yu et al. 2010, ``--solver bm``): the orchestrator keeps ``alpha`` (n)
and ``w``; for each block b it reads the rows, runs dual CD on the block's rows with
``alpha[off_b:off_b1]`` as warm start (a few passes, ``max_iter`` small) and moves on; one
outer iteration reads every block once (:func:`solve_bm_streamed`).

Both take a cross-validation fold out (``holdout``: a range or a row mask, never visited,
its alpha at 0) and a warm start (``warm``); :func:`drop_rows` takes rows out of a dual
solution, the next fold's warm start.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np

from ooc_learn.losses import Loss, get_loss
from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from ooc_learn.storage.arrays import kernel_args

from ._common import check_positive, seed_state
from .dcd import DCDResult, DCDStats, check_dual_params, dual_objective, loss_sum

__all__ = ["solve_dcd_streamed", "solve_dcd_store", "solve_bm_streamed", "StreamedDual",
           "drop_rows", "held_out", "store_primal_objective"]

#: rows a chunk of :func:`store_primal_objective` holds where a block is not read whole
PRIMAL_CHUNK_ROWS = 8192


def store_primal_objective(store, w, loss, C: float, bias: float = 1.0) -> float:
    """``1/2 |w|^2 + C sum_i L(y_i [x_i, bias]^T w)`` over every row of ``store``, streamed
    by its read policy (``Store.iter_chunks``): one pass of :func:`~.dcd.loss_sum`."""
    w = np.asarray(w, dtype=np.float64)
    total = 0.0
    for _, X, y, _ in store.iter_chunks(PRIMAL_CHUNK_ROWS, ids=False):
        total += loss_sum(X, y, w, loss, bias)
        del X, y
    return 0.5 * float(w @ w) + C * total


def solve_dcd_streamed(read_block: Callable[[int], tuple], block_offsets, n_features: int, *,
                       loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                       eps: float = 0.1, max_iter: int = 1000, shrinking: bool = True,
                       seed=0, sqnorms=None, budget=None, on_epoch=None, holdout=None,
                       warm=None) -> DCDResult:
    """Full dual CD with the rows streamed block by block (``--solver dcd`` out of core).

    Same objective, update and stopping rule as :func:`~.dcd.solve_dcd`; only the visiting order
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
    check_dual_params(C, eps, max_iter, bias, where)
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
            # the same order, without the Python loop's block lookup and label copy per pass
            # (a cost of the order of a shrunk pass itself)
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
                          f"projected-gradient spread fell to eps={eps}. Raise max_iter "
                          "(ooc-train: --max-outer, 100 passes each) or eps (--eps).", RuntimeWarning, stacklevel=2)
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
    check_dual_params(C, eps, max_iter, bias, where)
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
    check_dual_params(C, eps, inner_max_iter, bias, where)
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
        if not stats.converged:  # as dual CD, IBCD and SVR say where they stop short
            warnings.warn(f"Block minimisation reached max_outer={max_outer} passes over the "
                          f"blocks before the projected-gradient spread fell to eps={eps} "
                          f"(it is {spread:.3g}): the solution is approximate. Raise "
                          "max_outer or eps.", RuntimeWarning, stacklevel=2)
        return DCDResult(w, alpha, stats)
    finally:
        if budget is not None:
            budget.release(need)
