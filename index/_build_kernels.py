"""Numba kernels that build one metric tree: K-way nearest-pivot splits (IBCD paper §4.1).

Pure functions over arrays and scalars; rows in either layout as in
:mod:`~ooc_learn.index._row_kernels`. Pivots are drawn from our own splitmix64 stream, seeded
by the caller, so the same seed builds the same tree in any thread.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._row_kernels import cos2_rows, dot_csr, dot_rows, dots_dense

__all__ = ["build_tree_kernel", "SEED_POOL", "SPREAD_MIN"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@njit(cache=True, nogil=True)
def _next_u64(state):
    """splitmix64 step on ``state`` (uint64 array of length 1): our own stream, thread-safe."""
    state[0] += _GOLDEN
    z = state[0]
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True)
def _randbelow(state, m):
    return np.int64(_next_u64(state) % np.uint64(m))


@njit(cache=True, nogil=True)
def _assign(X, indptr, indices, data, is_csr, sqnorm, order, s, e, piv, k, group, counts,
            work, acc, c2row, c2aug):
    """Send each row of order[s:e] to its nearest pivot (largest cos², ties to the lowest).

    ``c2row[i - s]`` / ``c2aug[i - s]`` receive the row's cos² to that pivot, plain and in the
    bias-augmented space [x, 1] (the query's covering-radius bounds use both).

    For CSR rows with a workspace ``work`` (d, width), the pivots are scattered into it
    once so each row costs one pass over its non-zeros instead of k index merges.
    """
    for j in range(k):
        counts[j] = 0
    scatter = is_csr and work.shape[0] > 0
    if not is_csr:
        # the k pivot rows side by side: each row is then one pass over contiguous memory
        d = X.shape[1]
        P = np.empty((k, d), np.float32)
        for j in range(k):  # element by element: a slice copy compiles numba's broadcasting
            for c in range(d):
                P[j, c] = X[piv[j], c]
    if scatter:
        for j in range(k):
            for t in range(indptr[piv[j]], indptr[piv[j] + 1]):
                work[indices[t], j] = data[t]
    for i in range(s, e):
        row = order[i]
        if scatter:
            for j in range(k):
                acc[j] = 0.0
            for t in range(indptr[row], indptr[row + 1]):
                v = np.float64(data[t])
                c = indices[t]
                for j in range(k):
                    acc[j] += v * work[c, j]
        elif is_csr:
            for j in range(k):
                acc[j] = dot_csr(indptr, indices, data, row, piv[j])
        else:
            dots_dense(X[row], P, k, acc)
        best = -1.0
        bk = 0
        for j in range(k):
            den = np.float64(sqnorm[row]) * np.float64(sqnorm[piv[j]])
            c2 = acc[j] * acc[j] / den if den > 0.0 else 0.0
            if c2 > best:
                best = c2
                bk = j
        group[i - s] = bk
        c2row[i - s] = min(best, 1.0)
        ga = acc[bk] + 1.0
        c2aug[i - s] = min(ga * ga / ((np.float64(sqnorm[row]) + 1.0)
                                      * (np.float64(sqnorm[piv[bk]]) + 1.0)), 1.0)
        counts[bk] += 1
    if scatter:
        for j in range(k):
            for t in range(indptr[piv[j]], indptr[piv[j] + 1]):
                work[indices[t], j] = 0.0
    top = 0
    for j in range(k):
        top = max(top, counts[j])
    return top


SEED_POOL = 8   # pivot candidates drawn per pivot, for the D² sampling
SPREAD_MIN = 1  # nodes of at most SPREAD_MIN·K·leaf_size rows take K random pivots


@njit(cache=True, nogil=True)
def _spread_pivots(X, indptr, indices, data, is_csr, sqnorm, order, s, nc, k, state, piv,
                   near):
    """Pick k pivots among the nc candidates order[s:s+nc] by D² sampling in d.

    The first candidate is the first pivot; each next one is drawn with probability
    proportional to 1 − (its largest cos² to a pivot so far), as k-means++ does, so the
    pivots spread over the node instead of crowding in its dense parts. ``near`` (≥ nc
    entries) is scratch.
    """
    for i in range(nc):
        near[i] = 0.0
    chosen = 0
    c = 0
    for j in range(k):
        piv[j] = order[s + c]
        near[c] = 1.0
        chosen += 1
        if j == k - 1:
            break
        tot = 0.0
        for i in range(nc):
            if near[i] < 1.0:
                c2 = cos2_rows(X, indptr, indices, data, is_csr, sqnorm, order[s + i],
                               piv[j])
                if c2 > near[i]:
                    near[i] = c2
                tot += 1.0 - near[i]
        if tot <= 0.0:  # every candidate coincides with a pivot: take the next ones
            c = j + 1
            continue
        u = (np.float64(_next_u64(state) >> np.uint64(11)) / 9007199254740992.0) * tot
        c = -1
        for i in range(nc):
            if near[i] < 1.0:
                u -= 1.0 - near[i]
                c = i
                if u <= 0.0:
                    break
        if c < 0:
            c = j + 1
    return chosen


@njit(cache=True, nogil=True)
def _split_node(X, indptr, indices, data, is_csr, sqnorm, order, s, e, width, state,
                piv, group, counts, tmp, work, acc, c2row, c2aug, rad, rad_aug, spread_min):
    """K-way split of order[s:e] in place; returns the number of pivots used.

    ``rad[j]`` / ``rad_aug[j]`` receive the covering radius of cell j as the smallest cos²
    between the pivot and a row of the cell (plain and bias-augmented; 1 for an empty cell).

    Pivots are chosen by D² sampling (:func:`_spread_pivots`) among ``SEED_POOL``·K
    candidates drawn without replacement from the node's rows (partial Fisher-Yates). If
    every row lands with one pivot (all pivots metrically identical: duplicates or zero
    rows), the draw is repeated; after three failures the rows are equidistant from every
    pivot, so any split is a valid Voronoi split and the node is cut into K equal runs.
    """
    m = e - s
    k = min(width, m)
    top = m
    for _ in range(3):
        nc = min(m, SEED_POOL * k) if m > spread_min else k
        for j in range(nc):
            r = s + j + _randbelow(state, m - j)
            t = order[s + j]
            order[s + j] = order[r]
            order[r] = t
        _spread_pivots(X, indptr, indices, data, is_csr, sqnorm, order, s, nc, k, state,
                       piv, c2row)
        top = _assign(X, indptr, indices, data, is_csr, sqnorm, order, s, e, piv, k,
                      group, counts, work, acc, c2row, c2aug)
        if top < m:
            break
    if top == m:
        for j in range(k):
            counts[j] = 0
        for i in range(m):
            g = (i * k) // m
            group[i] = g
            counts[g] += 1
            row, p = order[s + i], piv[g]
            c2row[i] = cos2_rows(X, indptr, indices, data, is_csr, sqnorm, row, p)
            ga = dot_rows(X, indptr, indices, data, is_csr, row, p) + 1.0
            c2aug[i] = min(ga * ga / ((np.float64(sqnorm[row]) + 1.0)
                                      * (np.float64(sqnorm[p]) + 1.0)), 1.0)
    for j in range(k):
        rad[j] = 1.0
        rad_aug[j] = 1.0
    for i in range(m):
        g = group[i]
        rad[g] = min(rad[g], c2row[i])
        rad_aug[g] = min(rad_aug[g], c2aug[i])
    # stable counting sort of the node's rows by group: every child is one contiguous run
    pos = 0
    for j in range(k):
        c = counts[j]
        counts[j] = pos
        pos += c
    for i in range(m):
        g = group[i]
        tmp[counts[g]] = order[s + i]
        counts[g] += 1
    for i in range(m):
        order[s + i] = tmp[i]
    return k


@njit(cache=True, nogil=True)
def build_tree_kernel(X, indptr, indices, data, is_csr, sqnorm, width, leaf_size, seed,
                      work):
    """Build one metric tree over the rows of a block.

    Returns ``(order, start, stop, first_child, n_children, pivot_row, depth, radius,
    radius_aug)``: ``order`` is
    the leaf order (a permutation of 0..n-1, every node one contiguous run of it); node 0 is
    the root; node v covers ``order[start[v]:stop[v]]``; its children are ``first_child[v]
    .. first_child[v] + n_children[v] - 1`` (``n_children == 0`` for a leaf); ``pivot_row[c]``
    is the (original) row whose Voronoi cell child c is in its parent (-1 for the root);
    ``radius[c]`` is the smallest cos² between that pivot and a row of child c (its covering
    radius in the metric d), ``radius_aug[c]`` the same for rows augmented by a constant 1.
    ``work`` is a zeroed (d, width) float32 scatter workspace for CSR rows, or (0, 0) to
    merge index lists instead (when d·width would be too large to hold).
    """
    n = sqnorm.shape[0]
    order = np.arange(n)
    cap = 2 * n + 1
    start = np.zeros(cap, np.int64)
    stop = np.zeros(cap, np.int64)
    first_child = np.full(cap, -1, np.int32)
    n_children = np.zeros(cap, np.int32)
    pivot_row = np.full(cap, -1, np.int64)
    depth = np.zeros(cap, np.int32)
    radius = np.ones(cap, np.float32)
    radius_aug = np.ones(cap, np.float32)
    c2row = np.empty(n, np.float64)
    c2aug = np.empty(n, np.float64)
    rad = np.ones(width, np.float64)
    rad_aug = np.ones(width, np.float64)
    stack = np.empty(cap, np.int64)
    group = np.empty(n, np.int32)
    tmp = np.empty(n, np.int64)
    piv = np.empty(width, np.int64)
    counts = np.zeros(width, np.int64)
    acc = np.zeros(width, np.float64)
    state = np.empty(1, np.uint64)
    state[0] = np.uint64(seed)
    stop[0] = n
    n_nodes = 1
    sp = 0
    stack[sp] = 0
    sp += 1
    while sp > 0:
        sp -= 1
        v = stack[sp]
        s, e = start[v], stop[v]
        if e - s <= leaf_size:
            continue
        k = _split_node(X, indptr, indices, data, is_csr, sqnorm, order, s, e, width, state,
                        piv, group, counts, tmp, work, acc, c2row, c2aug, rad, rad_aug,
                        SPREAD_MIN * width * leaf_size)
        lo = s
        first_child[v] = n_nodes
        for j in range(k):
            hi = counts[j] + s  # counts now hold the run ends (relative to s)
            if hi == lo:
                continue  # an empty cell: its pivot went to an identical earlier pivot
            c = n_nodes
            n_nodes += 1
            start[c] = lo
            stop[c] = hi
            pivot_row[c] = piv[j]
            radius[c] = rad[j]
            radius_aug[c] = rad_aug[j]
            depth[c] = depth[v] + 1
            n_children[v] += 1
            stack[sp] = c
            sp += 1
            lo = hi
    return (order, start[:n_nodes].copy(), stop[:n_nodes].copy(),
            first_child[:n_nodes].copy(), n_children[:n_nodes].copy(),
            pivot_row[:n_nodes].copy(), depth[:n_nodes].copy(), radius[:n_nodes].copy(),
            radius_aug[:n_nodes].copy())
