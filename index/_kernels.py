"""Numba kernels of the metric forest: tree build, pivot scores, leaf scans, shrink counts.

Pure functions over arrays and scalars. Every kernel that reads rows takes both layouts
through the same argument list: a dense float32 matrix ``X`` (n, d) and the three CSR arrays
(``indptr`` int64, ``indices`` int32, ``data`` float32) with a flag ``is_csr``; the unused
layout is passed as empty arrays. The metric is the angle in the degree-2 embedding V (IBCD
paper §3.2, §4.1): V(â)ᵀV(b̂) = (âᵀb̂)², so d(a, b) = arccos((âᵀb̂)²), computed from one
dot product and the stored squared norms; V(x) is never formed.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.typed import List
from numba.types import float32, int32, int64

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


@njit(cache=True, nogil=True, fastmath=True)
def _dot_dense(X, a, b):
    # float32 with fastmath lets LLVM vectorise the sum (4x faster than float64 here); the
    # result only picks the nearest pivot, where rounding can at most flip a near-tie
    acc = np.float32(0.0)
    for k in range(X.shape[1]):
        acc += X[a, k] * X[b, k]
    return np.float64(acc)


@njit(cache=True, nogil=True, fastmath=True)
def _dots_dense(x, P, k, acc):
    """acc[j] = xᵀP[j] for the k pivot rows (float32 sums, see _dot_dense)."""
    for j in range(k):
        s = np.float32(0.0)
        for t in range(x.shape[0]):
            s += x[t] * P[j, t]
        acc[j] = s


@njit(cache=True, nogil=True)
def _dot_csr(indptr, indices, data, a, b):
    """xₐᵀx_b by merging the ascending column indices of two CSR rows."""
    acc = 0.0
    i, ie = indptr[a], indptr[a + 1]
    j, je = indptr[b], indptr[b + 1]
    while i < ie and j < je:
        ci, cj = indices[i], indices[j]
        if ci == cj:
            acc += np.float64(data[i]) * np.float64(data[j])
            i += 1
            j += 1
        elif ci < cj:
            i += 1
        else:
            j += 1
    return acc


@njit(cache=True, nogil=True)
def _dot_rows(X, indptr, indices, data, is_csr, a, b):
    if is_csr:
        return _dot_csr(indptr, indices, data, a, b)
    return _dot_dense(X, a, b)


@njit(cache=True, nogil=True)
def cos2_rows(X, indptr, indices, data, is_csr, sqnorm, a, b):
    """(âᵀb̂)² = V(â)ᵀV(b̂); 0 when either row is zero (a zero row is at angle π/2 to all)."""
    den = np.float64(sqnorm[a]) * np.float64(sqnorm[b])
    if den <= 0.0:
        return 0.0
    dot = _dot_rows(X, indptr, indices, data, is_csr, a, b)
    c = dot * dot / den
    return 1.0 if c > 1.0 else c


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
                acc[j] = _dot_csr(indptr, indices, data, row, piv[j])
        else:
            _dots_dense(X[row], P, k, acc)
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


SEED_POOL = 8
SPREAD_MIN = 1


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
            ga = _dot_rows(X, indptr, indices, data, is_csr, row, p) + 1.0
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


@njit(cache=True, nogil=True)
def pivot_margins(X, indptr, indices, data, is_csr, rows, w, b):
    """wᵀx + b for the rows ``rows`` of the given arrays (the pivots of a node)."""
    out = np.empty(rows.shape[0], np.float64)
    for j in range(rows.shape[0]):
        out[j] = _margin(X, indptr, indices, data, is_csr, rows[j], w, b)
    return out


@njit(cache=True, nogil=True)
def _child_priority(margin, wsq, pv_sqnorm, radius, is_leaf, augment, parent_pri, mu, lam):
    psq = np.float64(pv_sqnorm) + (1.0 if augment else 0.0)
    den = wsq * psq
    c = abs(margin) / np.sqrt(den) if den > 0.0 else 0.0
    alpha = np.arcsin(min(c, 1.0))
    r = np.arccos(np.sqrt(min(max(np.float64(radius), 0.0), 1.0)))
    if is_leaf:
        return alpha + lam * r
    # (1 − mu)·α + mu·max(α − r, 0): the pivot's own angle at mu = 0, the exact lower bound
    # at mu = 1 (α − r, never below 0), a scale-free blend between
    return max(parent_pri, alpha - mu * min(r, alpha))


@njit(cache=True, nogil=True)
def child_priorities(margins, wsq, pv_sqnorm, radius, is_leaf, augment, parent_pri, mu, lam):
    """Best-bin-first priorities of a node's partitions for the query q = −V(ŵ).

    With ``margins[j]`` = wᵀpⱼ (+ b), pivot j lies at angle αⱼ = arcsin|ŵᵀp̂ⱼ| from the
    hyperplane (cos² = (ŵᵀp̂ⱼ)² is V(ŵ)ᵀV(p̂ⱼ), −cos² the inner product with q), and every
    row of child j lies within angle rⱼ = arccos √radiusⱼ of ±p̂ⱼ (the stored covering
    radius in d = arccos cos²), so at least max(αⱼ − rⱼ, 0) from the hyperplane. An internal
    child gets max(parent, (1 − ``mu``)·αⱼ + ``mu``·max(αⱼ − rⱼ, 0)) (the lower bound at
    ``mu`` = 1, the pivot's angle at 0), a leaf αⱼ + ``lam``·rⱼ.
    With ``augment`` the rows carry a constant feature 1 (the bias).
    """
    k = margins.shape[0]
    out = np.empty(k, np.float64)
    for j in range(k):
        out[j] = _child_priority(margins[j], wsq, pv_sqnorm[j], radius[j], is_leaf[j],
                                 augment, parent_pri, mu, lam)
    return out


# ------------------------------------------------------------------ the search frontier
# A binary min-heap in two parallel arrays: ``fpri`` (cap,) float64 priorities and ``fent``
# (cap, 7) int64 entries [order, start, stop, span start, span stop, tree·2³² + code, pivot]:
# ``order`` = tree rank·2⁴⁰ + (2⁴⁰ − 1 − push count) breaks ties by the tree's random rank,
# then newest first (depth first); ``code`` = 2·node + leaf flag; span start −1: no span;
# ``pivot`` = 4·(store row of the child's pivot) + its verdict (PV_*), −1 for a root.
# 64 bytes an entry (FRONTIER_ENTRY_BYTES), paid from the budget by the caller.
FRONTIER_WIDTH = 7
PV_NONE = 0      # the pivot neither qualifies nor is shrunk
PV_TAKE = 1      # it satisfies eq. 10
PV_SHRINK = 2    # it is far outside the range (shrinking on the index)
_ORDER_SHIFT = 40
_ORDER_MASK = (1 << 40) - 1


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
def frontier_pop(fpri, fent, size, fen, shrink_on, take_pivots, excl, shrunk, seen, need,
                 max_examine, out, state):
    """Pop the best entry whose rows are not all shrunk (those are dropped and counted).

    With ``take_pivots`` the pivot of the popped partition, if it lies in the partition's
    rows, is now examined as a candidate (its margins were computed when its parent was
    expanded, see :func:`expand_node`): unless excluded, shrunk or already examined
    (``seen``), it counts in ``state[1]``, is
    returned in ``out`` if it satisfies eq. 10 and marked shrunk if far outside the range.
    ``state`` is [rows returned, rows examined, rows newly shrunk, rows in ``seen``, pivots
    examined]. Returns ``(size, priority, order, start, stop, span start, span stop,
    tree·2³² + code, n_skipped)``; ``tcode`` is −1 when the frontier ran empty.
    """
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
        if take_pivots and s0 <= g < e0 and state[0] < need and state[1] < max_examine:
            verdict = pv & 3
            if not ((excl.shape[0] > 0 and excl[g]) or (shrunk.shape[0] > 0 and shrunk[g])):
                if seen_add(seen, g):
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


# The rows examined as pivot candidates in one query: an open-addressing hash set of row
# positions (int64, −1 empty, a power-of-two capacity kept at most half full by the caller),
# so a leaf scan skips a row already examined as a pivot (no double count, no repeat).
@njit(cache=True, nogil=True, inline="always")
def _seen_slot(seen, g):
    mask = seen.shape[0] - 1
    h = (np.uint64(g) * _GOLDEN) >> np.uint64(20)
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
def expand_node(X, indptr, indices, data, is_csr, y, at, w, b, wt, bt, same_outer, low,
                wsq, augment, pivot_row, pv_sqnorm, radius, child_leaf, child_id,
                child_start, child_stop, parent_pri, mu, lam, fpri, fent, size, order_hi,
                count, ss, se, tree, take_pivots, shrink_hi, take_now, excl, shrunk, seen,
                need, max_examine, out, state, fen, shrink_on):
    """Score a node's pivots and push its children on the frontier; return the new size.

    Pivot j is row ``at[j]`` of the given arrays (labels ``y``), store row ``pivot_row[j]``;
    its margin wᵀp + b ranks child j (:func:`child_priorities`). With ``take_pivots`` the
    entry also carries the pivot's verdict under eq. 10 (PV_TAKE, PV_SHRINK or PV_NONE),
    so :func:`frontier_pop` can examine the pivot as a candidate if the search reaches its
    partition, without recomputing anything. With ``take_now`` instead, a pivot that
    satisfies eq. 10 is returned at once (counted as examined and added to ``seen``) if it
    lies in its child's rows and is not excluded, shrunk or seen; the others are left to the
    leaf scans. ``state`` is as in :func:`scan_leaf`. The caller made room for every child
    (frontier) and pivot (``seen``). A child whose rows are all shrunk (Fenwick ``fen``) is
    not pushed: the frontier holds only partitions a search can still use.
    """
    k = at.shape[0]
    for j in range(k):
        i = at[j]
        m = _margin(X, indptr, indices, data, is_csr, i, w, b)
        leaf = child_leaf[j]
        pri = _child_priority(m, wsq, pv_sqnorm[j], radius[j], leaf, augment, parent_pri,
                              mu, lam)
        count += 1
        order = order_hi + (_ORDER_MASK - count)
        tcode = tree * 4294967296 + 2 * np.int64(child_id[j]) + (1 if leaf else 0)
        pv = np.int64(-1)
        if take_pivots:
            yi = np.float64(y[i])
            mw = yi * m
            verdict = PV_NONE
            if mw < 1.0 or mw > shrink_hi:
                mt = mw if same_outer else yi * _margin(X, indptr, indices, data, is_csr, i,
                                                        wt, bt)
                if mw < 1.0 and mt >= low:
                    verdict = PV_TAKE
                elif mw > shrink_hi or mt < low:
                    verdict = PV_SHRINK
            elif not same_outer:
                mt = yi * _margin(X, indptr, indices, data, is_csr, i, wt, bt)
                if mt < low:
                    verdict = PV_SHRINK
            g = np.int64(pivot_row[j])
            pv = 4 * g + verdict
            if (take_now and verdict == PV_TAKE and child_start[j] <= g < child_stop[j]
                    and state[0] < need and state[1] < max_examine
                    and not (excl.shape[0] > 0 and excl[g])
                    and not (shrunk.shape[0] > 0 and shrunk[g]) and seen_add(seen, g)):
                state[3] += 1
                state[1] += 1
                state[4] += 1
                out[state[0]] = g
                state[0] += 1
            if take_now:
                pv = np.int64(-1)  # never examined again when its partition is reached
        c0, c1 = child_start[j], child_stop[j]
        if shrink_on and fenwick_prefix(fen, c1) - fenwick_prefix(fen, c0) == c1 - c0:
            continue
        size = frontier_push(fpri, fent, size, pri, order, c0, c1, ss, se, tcode, pv)
    return size


# Reassociation lets LLVM vectorise the sums (a margin on Fashion-MNIST's 784 features 1150 ->
# 490 ns, a query with the blocks cached 2.3x faster; 620 ns without 'nsz'). The last bits of a
# margin may differ from a sequential sum's: a row within rounding of a threshold of eq. 10 can
# go either way, and IBCD's own margins (the solvers' kernels) decide what it does with it.
_VEC = {"reassoc", "contract", "nsz"}


@njit(cache=True, nogil=True, fastmath=_VEC)
def _margin(X, indptr, indices, data, is_csr, i, w, b):
    acc = b
    if is_csr:
        for t in range(indptr[i], indptr[i + 1]):
            acc += np.float64(data[t]) * w[indices[t]]
    else:
        for j in range(X.shape[1]):
            acc += np.float64(X[i, j]) * w[j]
    return acc


@njit(cache=True, nogil=True, fastmath=_VEC)
def _margins2(X, indptr, indices, data, is_csr, i, w, b, wt, bt):
    """``_margin`` at w and at wₜ in one pass over the row."""
    acc, act = b, bt
    if is_csr:
        for t in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[t])
            acc += v * w[indices[t]]
            act += v * wt[indices[t]]
    else:
        for j in range(X.shape[1]):
            v = np.float64(X[i, j])
            acc += v * w[j]
            act += v * wt[j]
    return acc, act


@njit(cache=True, nogil=True)
def scan_leaf(X, indptr, indices, data, is_csr, y, row0, w, b, wt, bt, same_outer, low,
              excl, shrunk, fen, shrink_on, shrink_hi, need, max_examine, out, seen, state):
    """Test the rows of one leaf against eq. 10 and collect the fresh ones.

    A row (global position ``row0 + i``) is skipped without being examined if it is
    excluded, shrunk, or was examined as a pivot in this query (in ``seen``, when ``state[3]``
    > 0). An examined row qualifies if y·wₜᵀx ≥ ``low`` (not an outlier at the outer
    iterate) and y·wᵀx < 1 (non-zero gradient). With ``shrink_on``, examined rows with
    y·wᵀx > ``shrink_hi`` or outliers are marked in ``shrunk`` and counted in the Fenwick
    tree ``fen`` (IBCD §4.3). Stops once ``need`` rows are collected or ``max_examine`` rows
    were examined. ``state`` is [rows returned, rows examined, rows newly shrunk, rows in
    ``seen``, pivots examined], updated in place.
    """
    m = y.shape[0]
    check_seen = state[3] > 0
    for i in range(m):
        if state[0] >= need or state[1] >= max_examine:
            break
        g = row0 + i
        if excl.shape[0] > 0 and excl[g]:
            continue
        if shrunk.shape[0] > 0 and shrunk[g]:
            continue
        if check_seen and seen_contains(seen, g):
            continue
        state[1] += 1
        yi = np.float64(y[i])
        if same_outer:
            mw = yi * _margin(X, indptr, indices, data, is_csr, i, w, b)
            mt = mw
        else:
            m1, m2 = _margins2(X, indptr, indices, data, is_csr, i, w, b, wt, bt)
            mw, mt = yi * m1, yi * m2
        if mw < 1.0 and mt >= low:
            out[state[0]] = g
            state[0] += 1
        elif shrink_on and (mw > shrink_hi or mt < low):
            shrunk[g] = 1
            fenwick_add(fen, g, 1)
            state[2] += 1


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


@njit(cache=True, nogil=True)
def brute_force_margins(X, indptr, indices, data, is_csr, y, w, b):
    """y·(wᵀx + b) for every row, float64 (reference scans and benchmarks)."""
    n = y.shape[0]
    out = np.empty(n, np.float64)
    for i in range(n):
        out[i] = np.float64(y[i]) * _margin(X, indptr, indices, data, is_csr, i, w, b)
    return out



# ------------------------------------------------------------------ node records in bulk
# A tree's node records (lmdb_io.encode_node) decoded by one call into the flat arrays of
# forest._Resident, with every check of lmdb_io.decode_node (CRC-32 included), so the
# search's loop never waits on Python to decode a record.
def _crc_table():
    t = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        t = np.where(t & np.uint64(1), (t >> np.uint64(1)) ^ np.uint64(0xEDB88320),
                     t >> np.uint64(1))
    return t


CRC_TABLE = _crc_table()
# a node record (lmdb_io.encode_node): a head (magic, version, flags, tree, start, stop, first
# child, k), k + 1 child bounds (int32), then per child a leaf flag, pivot offset, pivot
# squared norm and two float16 radii, then the CRC-32
NODE_HEAD_BYTES = 36
NODE_CHILD_BYTES = 1 + 4 + 4 + 2 + 2 + 4   # the columns above, and the child's bound
NODE_FIXED_BYTES = NODE_HEAD_BYTES + 4 + 4  # head, the last bound, the CRC
_U8 = np.uint64(8)
_U16 = np.uint64(16)
_U24 = np.uint64(24)
_U32 = np.uint64(32)
_FF = np.uint64(0xFF)


@njit(cache=True, nogil=True)
def _crc32(buf, a, z, table):
    """zlib's CRC-32 of ``buf[a:z]``."""
    c = np.uint64(0xFFFFFFFF)
    for i in range(a, z):
        c = table[(c ^ np.uint64(buf[i])) & _FF] ^ (c >> _U8)
    return c ^ np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _u32(buf, p):
    return (np.uint64(buf[p]) | (np.uint64(buf[p + 1]) << _U8)
            | (np.uint64(buf[p + 2]) << _U16) | (np.uint64(buf[p + 3]) << _U24))


@njit(cache=True, nogil=True)
def _i32(buf, p):
    u = np.int64(_u32(buf, p))
    return u - 4294967296 if u >= 2147483648 else u


@njit(cache=True, nogil=True)
def _i64(buf, p):
    return np.int64(_u32(buf, p) | (_u32(buf, p + 4) << _U32))


@njit(cache=True, nogil=True)
def _ieee(bits, n_exp, n_man):
    """The IEEE binary float with these bits, ``n_exp`` exponent and ``n_man`` mantissa bits
    (float32: 8, 23; float16: 5, 10), as a float64 (exact)."""
    b = np.int64(bits)
    top = (1 << n_exp) - 1
    e = (b >> n_man) & top
    m = b & ((1 << n_man) - 1)
    shift = (top >> 1) + n_man  # the exponent bias plus the mantissa's width
    if e == 0:
        v = math.ldexp(float(m), 1 - shift)
    elif e == top:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(float(m + (1 << n_man)), e - shift)
    return -v if (b >> (n_exp + n_man)) & 1 else v


@njit(cache=True, nogil=True)
def decode_records(buf, offs, vids, tree, n_nodes, table, base, node_slot, slot, pos,
                   nd_first, nd_k, nd_start, nd_stop, c_id, c_start, c_stop, c_leaf, c_piv,
                   c_sq, c_rad, c_rada):
    """Decode the node records ``buf[offs[r]:offs[r+1]]`` (node ``vids[r]`` of ``tree``).

    Node r goes to slot ``slot + r`` (its children from position ``pos`` on) and
    ``node_slot[base + v]`` points at it. Returns ``(r, slot, pos)``: r = −1 when every
    record decoded, else the first record that fails a check (lmdb_io.decode_node names it).
    """
    for r in range(vids.shape[0]):
        a = offs[r]
        z = offs[r + 1]
        v = vids[r]
        if z - a < NODE_FIXED_BYTES or not 0 <= v < n_nodes:
            return r, slot, pos
        end = z - 4
        if _crc32(buf, a, end, table) != _u32(buf, end):
            return r, slot, pos
        if (buf[a] != 79 or buf[a + 1] != 79 or buf[a + 2] != 67 or buf[a + 3] != 78
                or (np.int64(buf[a + 4]) | (np.int64(buf[a + 5]) << 8)) != 2
                or _i32(buf, a + 8) != tree):
            return r, slot, pos
        start = _i64(buf, a + 12)
        stop = _i64(buf, a + 20)
        c0 = _i32(buf, a + 28)
        k = _i32(buf, a + 32)
        if k < 0 or NODE_FIXED_BYTES + NODE_CHILD_BYTES * k != z - a:
            return r, slot, pos
        p = a + NODE_HEAD_BYTES
        span = stop - start
        if k > 0 and (_i32(buf, p) != 0 or _i32(buf, p + 4 * k) != span):
            return r, slot, pos
        pl = p + 4 * (k + 1)
        pp = pl + k
        ps = pp + 4 * k
        pr = ps + 4 * k
        pa = pr + 2 * k
        for j in range(k):
            lo = _i32(buf, p + 4 * j)
            hi = _i32(buf, p + 4 * j + 4)
            pv = _i32(buf, pp + 4 * j)
            if hi < lo or pv < 0 or pv >= span:
                return r, slot, pos
            q = pos + j
            c_id[q] = c0 + j
            c_start[q] = start + lo
            c_stop[q] = start + hi
            c_leaf[q] = buf[pl + j] != 0
            c_piv[q] = start + pv
            c_sq[q] = _ieee(_u32(buf, ps + 4 * j), 8, 23)
            c_rad[q] = _ieee(np.uint64(buf[pr + 2 * j])
                             | (np.uint64(buf[pr + 2 * j + 1]) << _U8), 5, 10)
            c_rada[q] = _ieee(np.uint64(buf[pa + 2 * j])
                              | (np.uint64(buf[pa + 2 * j + 1]) << _U8), 5, 10)
        nd_first[slot] = pos
        nd_k[slot] = k
        nd_start[slot] = start
        nd_stop[slot] = stop
        node_slot[base + v] = slot
        slot += 1
        pos += k
    return -1, slot, pos


# ------------------------------------------------------------------ the search loop
# The row lists are made and emptied here, not by numba.typed.List's methods from Python:
# those are compiled in every process, never cached (``ooc-train`` on a 3000-row store: 2.2 s
# of its 2.5 s were compiling List's constructor and clear, once per list type)
@njit(cache=True)
def new_row_lists():
    """Empty typed lists for the kernels' five row arrays (see rows_slot_set)."""
    return (List.empty_list(float32[:, ::1]), List.empty_list(int64[::1]),
            List.empty_list(int32[::1]), List.empty_list(float32[::1]),
            List.empty_list(float32[::1]))


@njit(cache=True)
def clear_row_lists(RX, RP, RI, RD, RY):
    RX.clear()
    RP.clear()
    RI.clear()
    RD.clear()
    RY.clear()


@njit(cache=True)
def rows_slot_set(RX, RP, RI, RD, RY, slot, x, p, i, d, y):
    """Put one cached row slice in slot ``slot`` of the search's row lists (appending)."""
    if slot == len(RX):
        RX.append(x)
        RP.append(p)
        RI.append(i)
        RD.append(d)
        RY.append(y)
    else:
        RX[slot] = x
        RP[slot] = p
        RI[slot] = i
        RD[slot] = d
        RY[slot] = y


BBF_DONE = 0       # the frontier ran empty, or n rows were found, or max_examined reached
BBF_LOW_PREC = 1   # min_precision stopped the search
BBF_MISS = 2       # the popped entry needs what only Python has: rows, a node, room
BBF_READ_LIMIT = 3  # max_read rows were read
SLOT_COUNTED = -2  # span_slot / pv_slot: no slice cached, but its rows were counted read


@njit(cache=True, nogil=True)
def block_first_use(span_slot, pv_slot, g, rows, ss, se):
    """Rows an entry taken from a cached block counts as read (see bbf_run): its span's
    (``ss``, ``se``), else ``rows`` (a big leaf's rows, an upper node's pivots; node ``g``),
    the first time only; 0 after."""
    if ss >= 0:
        if span_slot[ss] != -1:
            return 0
        span_slot[ss] = SLOT_COUNTED
        return se - ss
    if pv_slot[g] != -1:
        return 0
    pv_slot[g] = SLOT_COUNTED
    return rows


@njit(cache=True, nogil=True)
def bbf_run(fpri, fent, size, fen, shrink_on, take, now, excl, shrunk, seen, need,
            max_examine, out, state, prec_from, min_prec, base, node_slot, nd_first, nd_k,
            c_id, c_start, c_stop, c_leaf, c_piv, c_sq, c_rad, blk_slot, boff, span_slot,
            slot_stop, pv_slot, RX, RP, RI, RD, RY, is_csr, w, b, wt, bt, same_outer, low,
            wsq, augment, shrink_hi, mu, lam, span_rows, read0, max_read, cnt, ret):
    """The best-bin-first loop of ``Forest._best_bin_first``, for as long as it can run here.

    Pops entries (:func:`frontier_pop`), scans leaves (:func:`scan_leaf`) and expands nodes
    (:func:`expand_node`) exactly as the Python loop does, from the node records in the flat
    arrays (``node_slot[base[t] + v]``, −1: not decoded) and rows at hand: tree t's whole
    store block (``blk_slot[t]``, its first row ``boff[t]``) when the store caches it, else
    the row slices of the forest's cache (``span_slot[start]`` with ``slot_stop``, and
    ``pv_slot`` for the pivot rows of nodes above the spans); −1: not at hand. An entry
    that needs anything else (a record or rows not at hand, frontier or ``seen`` room) is
    returned to Python, popped, in ``ret`` (order,
    start, stop, span start, span stop, tree code) with its priority. ``cnt`` counts [order
    counter, nodes expanded, leaves scanned, nodes skipped, pivots scored, frontier peak,
    rows read].

    Rows read: the Python loop counts the rows of each span, big leaf and upper node's pivots
    it loads into the forest's row cache, which keeps them, so each counts once while
    cached; IBCD's cost model and ``max_read`` were tuned on that count. Rows taken here
    from a cached block count the same way: the first use of a span (or big leaf, or
    pivots) marks its lookup entry SLOT_COUNTED and adds its rows; the marks of a block
    are cleared when the store's cache lets the block go. The search stops
    (BBF_READ_LIMIT) once ``read0`` + these reach ``max_read``.
    Returns ``(size, BBF_*, priority)``.
    """
    while size > 0 and state[0] < need and state[1] < max_examine:
        if state[1] >= prec_from and state[0] < min_prec * state[1]:
            return size, BBF_LOW_PREC, 0.0
        if read0 + cnt[6] >= max_read:
            return size, BBF_READ_LIMIT, 0.0
        size, pri, order, s0, e0, ss, se, tc, skipped = frontier_pop(
            fpri, fent, size, fen, shrink_on, take, excl, shrunk, seen, need, max_examine,
            out, state)
        cnt[3] += skipped
        if tc < 0:
            break
        t = tc >> 32
        code = tc & 0xFFFFFFFF
        v = code >> 1
        if ss < 0 and e0 - s0 <= span_rows:
            ss, se = s0, e0
        # rows: the tree's whole block if cached, else the span's slice
        slot = blk_slot[t]
        rbase = boff[t]
        if slot >= 0:
            g = base[t] + v
            if code & 1:
                cnt[6] += block_first_use(span_slot, pv_slot, g, e0 - s0, ss, se)
            elif ss >= 0:
                cnt[6] += block_first_use(span_slot, pv_slot, g, 0, ss, se)
            elif node_slot[g] >= 0:  # an undecoded node counts once decoded, in Python
                cnt[6] += block_first_use(span_slot, pv_slot, g, nd_k[node_slot[g]], ss, se)
        elif ss >= 0:
            slot = span_slot[ss]
            rbase = ss
            if slot >= 0 and slot_stop[slot] != se:
                slot = -1
        miss = False
        if code & 1:
            if slot < 0:
                miss = True
            else:
                a, z = s0 - rbase, e0 - rbase
                y = RY[slot]
                if is_csr:
                    scan_leaf(RX[slot], RP[slot][a:z + 1], RI[slot], RD[slot], True, y[a:z],
                              s0, w, b, wt, bt, same_outer, low, excl, shrunk, fen,
                              shrink_on, shrink_hi, need, max_examine, out, seen, state)
                else:
                    scan_leaf(RX[slot][a:z], RP[slot], RI[slot], RD[slot], False, y[a:z],
                              s0, w, b, wt, bt, same_outer, low, excl, shrunk, fen,
                              shrink_on, shrink_hi, need, max_examine, out, seen, state)
                cnt[2] += 1
                continue
        else:
            g = base[t] + v
            ns = node_slot[g]
            if ns < 0:
                miss = True
            else:
                by_row = slot >= 0
                if not by_row:
                    slot = pv_slot[g]  # an upper node's pivot rows, in the node's order
                k = nd_k[ns]
                if (slot < 0 or size + k > fpri.shape[0]
                        or (now and 2 * (state[3] + k) > seen.shape[0])):
                    miss = True
                else:
                    f = nd_first[ns]
                    piv = c_piv[f:f + k]
                    if by_row:
                        at = piv - rbase
                    else:
                        at = np.arange(k)
                    cnt[5] = max(cnt[5], size + k)
                    bq = b if augment else 0.0
                    size = expand_node(
                        RX[slot], RP[slot], RI[slot], RD[slot], is_csr, RY[slot], at, w,
                        bq, wt, bt, same_outer, low, wsq, augment, piv,
                        c_sq[f:f + k], c_rad[f:f + k], c_leaf[f:f + k], c_id[f:f + k],
                        c_start[f:f + k], c_stop[f:f + k], pri, mu, lam, fpri, fent, size,
                        order & ~_ORDER_MASK, cnt[0], ss, se, t, take, shrink_hi, now, excl,
                        shrunk, seen, need, max_examine, out, state, fen, shrink_on)
                    cnt[0] += k
                    cnt[1] += 1
                    cnt[4] += k
                    continue
        if miss:
            ret[0] = order
            ret[1] = s0
            ret[2] = e0
            ret[3] = ss
            ret[4] = se
            ret[5] = tc
            return size, BBF_MISS, pri
    return size, BBF_DONE, 0.0
