"""The folds of a store for the linear SVM's cross-validation: which row is in which fold,
and a fold's rows read block by block.

Where the store has at least k blocks, a fold is a group of whole blocks
(:func:`~ooc_learn.cv.folds.store_fold_bounds`): ingest shuffled the rows into blocks, so a
fold is a random part of the rows, and holding one out skips its blocks. Where a block must
hold several folds, its rows go to them at random (:func:`fold_plan`), not as contiguous
ranges: an indexed store keeps each block's rows in the metric tree's leaf order, so a range
is a cluster of similar rows, and a fold of one cluster misstates the accuracy; dealt at
random, the folds give LIBLINEAR's estimate.
"""

from __future__ import annotations

import numpy as np

from .folds import store_fold_bounds

__all__ = ["fold_plan", "fold_span", "fold_chains", "fold_tasks", "fold_rows",
           "decision_values"]


def fold_plan(block_offsets, k: int, seed: int = 0):
    """``(folds, contiguous)``: the fold of each store row (int32) and whether every fold is
    a contiguous range (k <= blocks: whole blocks). Otherwise each block's rows are dealt to
    its folds (sizes as :func:`~ooc_learn.cv.folds.store_fold_bounds`) in a random order."""
    bounds = store_fold_bounds(block_offsets, k)
    folds = np.repeat(np.arange(k, dtype=np.int32), np.diff(bounds))
    off = np.asarray(block_offsets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    contiguous = True
    for b in range(off.size - 1):
        lo, hi = int(off[b]), int(off[b + 1])
        if hi > lo and folds[lo] != folds[hi - 1]:
            folds[lo:hi] = rng.permutation(folds[lo:hi])
            contiguous = False
    return folds, contiguous


def fold_span(folds, contiguous: bool, i: int):
    """``(start, stop, holdout)`` of fold i: its span and a range or a row mask."""
    if contiguous:
        idx = np.flatnonzero(folds == i)
        a, z = int(idx[0]), int(idx[-1]) + 1
        return a, z, (a, z)
    mask = folds == i
    idx = np.flatnonzero(mask)
    return int(idx[0]), int(idx[-1]) + 1, mask


def fold_chains(k: int, jobs: int) -> list[list[int]]:
    """The folds 0..k-1 cut into ``jobs`` runs of consecutive folds (sizes differing by at
    most one), run side by side; within a run each fold starts from the one before, as all
    of them do one after another (``jobs`` = 1). 5 folds, 2 runs: [0, 1, 2], [3, 4]."""
    return [list(map(int, ids)) for ids in np.array_split(np.arange(k), max(1, min(jobs, k)))]


def fold_tasks(k: int, m: int, threads: int) -> list[tuple[list[int], slice]]:
    """The tasks of a CV of ``k`` folds at ``m`` Cs on ``threads`` threads (local threads or
    a Dask cluster's): ``(folds, Cs)``, the folds a task solves one after another at each C
    of the slice, each fold warm from the one before and each C from the one before (the
    first from scratch). Run in this order, a free thread taking the next task:

    - ``threads`` >= k: one fold a task, its Cs cut into ``threads // k`` runs;
    - k a multiple of ``threads``, or one C: the runs of :func:`fold_chains`, every C;
    - else ``threads`` runs of k // threads folds at every C, then each of the r folds left
      over cut into ceil(threads / r) runs of Cs, so that each thread solves about
      k m / threads (fold, C) pairs. Runs of k // threads + 1 folds would leave threads idle
      for m solves each: 5 folds at 4 Cs on 2 threads are [0, 1], [2, 3], fold 4 at C_1..2
      and fold 4 at C_3..4 (10 and 10 solves), not [0, 1, 2] and [3, 4] (12 and 8).
    """
    threads = max(1, int(threads))
    if threads >= k:
        runs = np.array_split(np.arange(m), max(1, min(m, threads // k)))
        return [([i], slice(int(c[0]), int(c[-1]) + 1)) for c in runs for i in range(k)]
    q, r = divmod(k, threads)
    if r == 0 or m == 1:
        return [(ids, slice(0, m)) for ids in fold_chains(k, threads)]
    runs = np.array_split(np.arange(m), min(m, -(-threads // r)))
    chains = [(ids, slice(0, m)) for ids in fold_chains(threads * q, threads)]
    return chains + [([i], slice(int(c[0]), int(c[-1]) + 1))
                     for i in range(threads * q, k) for c in runs]


#: rows a fold's scoring reads at a time where a block is not read whole
SCORE_CHUNK_ROWS = 8192


def fold_rows(st, a: int, z: int, mask=None):
    """``(X, y, positions)`` for the store rows a:z (those of ``mask`` among them), a block's
    part at a time, by the store's read policy (``Store.iter_range``): the block through
    its cache where it takes one (one the solver left there is not read again), else
    chunks paid from the budget (a fold of whole blocks read past the budget took a block
    beside the cap)."""
    off = np.asarray(st.block_offsets, dtype=np.int64)
    b = int(np.searchsorted(off, a, side="right") - 1)
    lo = a
    while lo < z:
        hi = min(z, int(off[b + 1]))
        sel = None if mask is None else np.flatnonzero(mask[lo:hi])
        if sel is None or sel.size:
            s0, s1 = (lo, hi) if sel is None else (lo + int(sel[0]), lo + int(sel[-1]) + 1)
            for c0, X, y, _ in st.iter_range(s0, s1, SCORE_CHUNK_ROWS, ids=False):
                n = X.shape[0]
                if sel is None:
                    yield X, y, np.arange(c0, c0 + n)
                else:
                    at = sel[(sel >= c0 - lo) & (sel < c0 - lo + n)]
                    if at.size:
                        yield X[at - (c0 - lo)], np.asarray(y)[at - (c0 - lo)], lo + at
                del X, y  # before the next chunk or block is read
        lo, b = hi, b + 1


def decision_values(X, w, bias) -> np.ndarray:
    """The decision values ``X w[:-1] + w[-1] bias`` of rows X."""
    return np.asarray(X @ w[:-1]).ravel() + w[-1] * bias
