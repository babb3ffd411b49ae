"""Numba kernels of the search frontier: the best-first heap, the rows seen, the shrunk rows.

- The frontier is a binary min-heap in two parallel arrays: ``fpri`` (cap,) float64 priorities
  and ``fent`` (cap, FRONTIER_WIDTH) int64 entries [order, start, stop, span start, span stop,
  tree·2³² + code, pivot]: ``order`` = tree rank·2⁴⁰ + (2⁴⁰ − 1 − push count) breaks ties by
  the tree's random rank, then newest first (depth first); ``code`` = 2·node + leaf flag; span
  start −1: no span; ``pivot`` = 4·(store row of the child's pivot) + its verdict (PV_*), −1
  for a root. The caller (:class:`~ooc_learn.index.frontier.Frontier`) pays its bytes from the
  budget and makes room before a push.
- The rows examined as pivot candidates in one query (``seen``): an open-addressing hash set
  of row positions (int64, −1 empty, a power-of-two capacity kept at most half full by the
  caller), so a leaf scan skips a row already examined as a pivot.
- The rows shrunk on the index (IBCD §4.3): a uint8 mark per row and a Fenwick tree over the
  marks, so "are all rows of this partition shrunk" is two prefix sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernel_args import Picks

__all__ = ["FRONTIER_WIDTH", "PV_NONE", "PV_TAKE", "PV_SHRINK", "ORDER_SHIFT", "ORDER_MASK",
           "frontier_push", "frontier_pop", "seen_contains", "seen_add", "seen_rehash",
           "fenwick_add", "fenwick_prefix", "fenwick_mark"]

FRONTIER_WIDTH = 7  # int64 fields of an entry
PV_NONE = 0      # the pivot neither qualifies nor is shrunk
PV_TAKE = 1      # it satisfies eq. 10
PV_SHRINK = 2    # it is far outside the range (shrinking on the index)
ORDER_SHIFT = 40
ORDER_MASK = (1 << 40) - 1
_FIB = np.uint64(0x9E3779B97F4A7C15)  # 2⁶⁴/φ: Fibonacci hashing of row positions


@njit(cache=True, nogil=True, inline="always")
def _f_less(fpri, fent, i, j):
    if fpri[i] != fpri[j]:
        return fpri[i] < fpri[j]
    return fent[i, 0] < fent[j, 0]


@njit(cache=True, nogil=True, inline="always")
def _f_swap(fpri, fent, i, j):
    p = fpri[i]
    fpri[i] = fpri[j]
    fpri[j] = p
    for c in range(FRONTIER_WIDTH):
        x = fent[i, c]
        fent[i, c] = fent[j, c]
        fent[j, c] = x


@njit(cache=True, nogil=True)
def frontier_push(fpri, fent, size, pri, order, s0, e0, ss, se, tcode, pivot):
    """Push one entry (the caller made room); return the new size."""
    i = size
    fpri[i] = pri
    fent[i, 0] = order
    fent[i, 1] = s0
    fent[i, 2] = e0
    fent[i, 3] = ss
    fent[i, 4] = se
    fent[i, 5] = tcode
    fent[i, 6] = pivot
    while i > 0:
        parent = (i - 1) >> 1
        if _f_less(fpri, fent, i, parent):
            _f_swap(fpri, fent, i, parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True, nogil=True)
def _frontier_remove_top(fpri, fent, size):
    size -= 1
    if size > 0:
        fpri[0] = fpri[size]
        for c in range(FRONTIER_WIDTH):
            fent[0, c] = fent[size, c]
        i = 0
        while True:
            a = 2 * i + 1
            if a >= size:
                break
            m = a
            if a + 1 < size and _f_less(fpri, fent, a + 1, a):
                m = a + 1
            if _f_less(fpri, fent, m, i):
                _f_swap(fpri, fent, m, i)
                i = m
            else:
                break
    return size



@njit(cache=True, nogil=True)
def frontier_pop(fpri, fent, size, picks):
    """Pop the best entry whose rows are not all shrunk (those are dropped and counted).

    With ``picks.take_pivots`` the pivot of the popped partition, if it lies in the
    partition's rows, is now examined as a candidate (its margins were computed when its
    parent was expanded, see ``_search_kernels.expand_node``): unless excluded, shrunk or
    already examined (``seen``), it counts as examined, is returned in ``picks.out`` if it
    satisfies eq. 10 and marked shrunk if far outside the range (see
    :class:`~ooc_learn.index.kernel_args.Picks`). Returns ``(size, priority, order, start,
    stop, span start, span stop, tree·2³² + code, n_skipped)``; the tree code is −1 when the
    frontier ran empty.
    """
    picks = Picks(*picks)
    fen, shrink_on, excl, shrunk = picks.fen, picks.shrink_on, picks.excl, picks.shrunk
    state, out = picks.state, picks.out
    skipped = 0
    while size > 0:
        p = fpri[0]
        order, s0, e0 = fent[0, 0], fent[0, 1], fent[0, 2]
        ss, se, tc, pv = fent[0, 3], fent[0, 4], fent[0, 5], fent[0, 6]
        size = _frontier_remove_top(fpri, fent, size)
        if shrink_on and fenwick_prefix(fen, e0) - fenwick_prefix(fen, s0) == e0 - s0:
            skipped += 1
            continue
        g = pv >> 2
        # only a pivot inside the partition: no leaf holding it can have been scanned yet
        # (a pivot lies in another cell when it ties with an earlier pivot, e.g. zero rows)
        if (picks.take_pivots and s0 <= g < e0 and state[0] < picks.need
                and state[1] < picks.max_examine):
            verdict = pv & 3
            if not ((excl.shape[0] > 0 and excl[g]) or (shrunk.shape[0] > 0 and shrunk[g])):
                if seen_add(picks.seen, g):
                    state[3] += 1
                    state[1] += 1
                    state[4] += 1
                    if verdict == PV_TAKE:
                        out[state[0]] = g
                        state[0] += 1
                    elif verdict == PV_SHRINK and shrink_on:
                        shrunk[g] = 1
                        fenwick_add(fen, g, 1)
                        state[2] += 1
        return size, p, order, s0, e0, ss, se, tc, skipped
    return size, 0.0, 0, 0, 0, -1, -1, np.int64(-1), skipped


@njit(cache=True, nogil=True, inline="always")
def _seen_slot(seen, g):
    mask = seen.shape[0] - 1
    h = (np.uint64(g) * _FIB) >> np.uint64(20)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True, inline="always")
def _seen_probe(seen, g):
    """The slot holding g, or the empty slot where it would go (linear probing)."""
    mask = seen.shape[0] - 1
    i = _seen_slot(seen, g)
    while seen[i] != g and seen[i] >= 0:
        i = (i + 1) & mask
    return i


@njit(cache=True, nogil=True)
def seen_contains(seen, g):
    return seen[_seen_probe(seen, g)] == g


@njit(cache=True, nogil=True)
def seen_add(seen, g):
    """Add g; return False if it was there already."""
    i = _seen_probe(seen, g)
    if seen[i] == g:
        return False
    seen[i] = g
    return True


@njit(cache=True, nogil=True)
def seen_rehash(old, new):
    """Move every row of ``old`` into the empty (all −1) set ``new``."""
    for x in old:
        if x >= 0:
            seen_add(new, x)


@njit(cache=True, nogil=True)
def fenwick_add(fen, i, delta):
    """Add ``delta`` at position i of the Fenwick (binary indexed) tree ``fen``."""
    j = i + 1
    n = fen.shape[0]
    while j <= n:
        fen[j - 1] += delta
        j += j & (-j)


@njit(cache=True, nogil=True)
def fenwick_prefix(fen, i):
    """Sum of positions 0..i-1."""
    acc = 0
    j = i
    while j > 0:
        acc += fen[j - 1]
        j -= j & (-j)
    return acc


@njit(cache=True, nogil=True)
def fenwick_mark(fen, shrunk, rows):
    """Mark ``rows`` shrunk (those not yet marked); return how many were new."""
    new = 0
    for r in rows:
        if not shrunk[r]:
            shrunk[r] = 1
            fenwick_add(fen, r, 1)
            new += 1
    return new
