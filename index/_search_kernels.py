"""Numba kernels of the best-bin-first search (IBCD paper §4.1): rank, expand, scan, loop.

:func:`expand_node` scores a node's pivots and pushes its children on the frontier,
:func:`scan_leaf` tests a leaf's rows against eq. 10, and :func:`bbf_run` is the search loop
itself, run here for as long as the records and rows it needs are at hand. They take their
arguments as the bundles of :mod:`~ooc_learn.index.kernel_args` (the query ``q``, the rows
found ``picks``, the decoded ``nodes``, where rows are, ``slots``), rows in either layout as
in :mod:`~ooc_learn.index._row_kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List
from numba.types import Tuple, float32, int32, int64

from ._frontier_kernels import (ORDER_MASK, PV_NONE, PV_SHRINK, PV_TAKE, fenwick_add,
                                fenwick_prefix, frontier_pop, frontier_push, seen_add,
                                seen_contains)
from ._row_kernels import copy_row, margin, margins2
from .kernel_args import Children, NodeArrays, Picks, Query, RowSlots, Stops, Values

__all__ = ["child_priority", "expand_node", "scan_leaf", "bbf_run", "block_first_use",
           "copy_found", "values_room",
           "new_row_list", "clear_row_list", "row_list_set", "BBF_DONE", "BBF_LOW_PREC",
           "BBF_MISS", "BBF_READ_LIMIT", "SLOT_COUNTED"]

BBF_DONE = 0       # the frontier ran empty, or n rows were found, or max_examined reached
BBF_LOW_PREC = 1   # min_precision stopped the search
BBF_MISS = 2       # the popped entry needs what only Python has: rows, a node, room
BBF_READ_LIMIT = 3  # max_read rows were read
SLOT_COUNTED = -2  # span_slot / pv_slot: no slice cached, but its rows were counted read


@njit(cache=True, nogil=True)
def child_priority(margin, wsq, pv_sqnorm, radius, is_leaf, augment, parent_pri, mu, lam):
    """The best-bin-first priority of one child for the query q = −V(ŵ).

    With ``margin`` = wᵀp (+ b), its pivot p lies at angle α = arcsin|ŵᵀp̂| from the
    hyperplane (cos² = (ŵᵀp̂)² is V(ŵ)ᵀV(p̂), −cos² the inner product with q), and every row
    of the child lies within angle r = arccos √radius of ±p̂ (the stored covering radius in
    d = arccos cos²), so at least max(α − r, 0) from the hyperplane. An internal child gets
    max(parent, (1 − ``mu``)·α + ``mu``·max(α − r, 0)) (the lower bound at ``mu`` = 1, the
    pivot's angle at 0), a leaf α + ``lam``·r. With ``augment`` the rows carry a constant
    feature 1 (the bias).
    """
    psq = np.float64(pv_sqnorm) + (1.0 if augment else 0.0)
    den = wsq * psq
    c = abs(margin) / np.sqrt(den) if den > 0.0 else 0.0
    alpha = np.arcsin(min(c, 1.0))
    r = np.arccos(np.sqrt(min(max(np.float64(radius), 0.0), 1.0)))
    if is_leaf:
        return alpha + lam * r
    # (1 − mu)·α + mu·max(α − r, 0) = α − mu·min(r, α)
    return max(parent_pri, alpha - mu * min(r, alpha))


@njit(cache=True, nogil=True)
def expand_node(X, indptr, indices, data, is_csr, y, at, query, kids, parent_pri, fpri, fent,
                size, order_hi, count, ss, se, tree, picks, vals):
    """Score a node's pivots and push its children on the frontier; return the new size.

    Pivot j is row ``at[j]`` of the given arrays (labels ``y``), store row
    ``kids.pivot_row[j]``; its margin wᵀp + b ranks child j (:func:`child_priority`). With
    ``picks.take_pivots`` the entry also carries the pivot's verdict under eq. 10 (PV_TAKE,
    PV_SHRINK or PV_NONE), so ``frontier_pop`` can examine the pivot as a candidate if the
    search reaches its partition, without recomputing anything. With ``picks.take_now``
    instead, a pivot that satisfies eq. 10 is returned at once (counted as examined and
    added to ``seen``) if it lies in its child's rows and is not excluded, shrunk or seen;
    the others are left to the leaf scans; unless ``vals`` is None its values are copied
    into the :class:`~ooc_learn.index.kernel_args.Values` buffers. The entries pushed carry
    ``order_hi`` (the tree's rank), the push count from ``count`` on, the span (``ss``,
    ``se``) and ``tree``. The caller made room for every child (frontier) and pivot
    (``seen``, and the value buffers: :func:`values_room`). A child whose rows are all
    shrunk is not pushed: the frontier holds only partitions a search can still use.
    """
    q, kids, pk = Query(*query), Children(*kids), Picks(*picks)
    w, b, wt, bt, same_outer, low = q.w, q.b, q.wt, q.bt, q.same_outer, q.low
    shrink_hi = q.shrink_hi
    excl, shrunk, fen, state, out = pk.excl, pk.shrunk, pk.fen, pk.state, pk.out
    take_now = pk.take_now
    k = at.shape[0]
    for j in range(k):
        i = at[j]
        m = margin(X, indptr, indices, data, is_csr, i, w, b)
        leaf = kids.child_leaf[j]
        pri = child_priority(m, q.wsq, kids.pivot_sqnorm[j], kids.radius[j], leaf, q.augment,
                             parent_pri, q.mu, q.lam)
        count += 1
        order = order_hi + (ORDER_MASK - count)
        tcode = tree * 4294967296 + 2 * np.int64(kids.child_id[j]) + (1 if leaf else 0)
        pv = np.int64(-1)
        if pk.take_pivots:
            yi = np.float64(y[i])
            mw = yi * m
            verdict = PV_NONE
            if mw < 1.0 or mw > shrink_hi:
                mt = mw if same_outer else yi * margin(X, indptr, indices, data, is_csr, i, wt,
                                                       bt)
                if mw < 1.0 and mt >= low:
                    verdict = PV_TAKE
                elif mw > shrink_hi or mt < low:
                    verdict = PV_SHRINK
            elif not same_outer:
                mt = yi * margin(X, indptr, indices, data, is_csr, i, wt, bt)
                if mt < low:
                    verdict = PV_SHRINK
            g = np.int64(kids.pivot_row[j])
            pv = 4 * g + verdict
            if (take_now and verdict == PV_TAKE
                    and kids.child_start[j] <= g < kids.child_stop[j]
                    and state[0] < pk.need and state[1] < pk.max_examine
                    and not (excl.shape[0] > 0 and excl[g])
                    and not (shrunk.shape[0] > 0 and shrunk[g]) and seen_add(pk.seen, g)):
                state[3] += 1
                state[1] += 1
                state[4] += 1
                out[state[0]] = g
                if vals is not None:
                    v = Values(*vals)
                    copy_row(X, indptr, indices, data, is_csr, i, y[i], state[0], v.X, v.ptr,
                             v.ind, v.dat, v.y, v.sqn)
                state[0] += 1
            if take_now:
                pv = np.int64(-1)  # never examined again when its partition is reached
        c0, c1 = kids.child_start[j], kids.child_stop[j]
        if pk.shrink_on and fenwick_prefix(fen, c1) - fenwick_prefix(fen, c0) == c1 - c0:
            continue
        size = frontier_push(fpri, fent, size, pri, order, c0, c1, ss, se, tcode, pv)
    return size


@njit(cache=True, nogil=True)
def scan_leaf(X, indptr, indices, data, is_csr, y, a, z, row0, query, picks, vals):
    """Test the rows ``a:z`` of the given arrays (store rows ``row0`` on), one leaf, against
    eq. 10 and collect the fresh ones (see :func:`_scan_rows`), their values too unless
    ``vals`` is None (:func:`copy_found`)."""
    r0 = picks[1][0]
    if is_csr:
        _scan_rows(X, indptr[a:z + 1], indices, data, True, y[a:z], row0, query, picks)
    else:
        _scan_rows(X[a:z], indptr, indices, data, False, y[a:z], row0, query, picks)
    if vals is not None:  # (a test on the argument's type: compiled away)
        copy_found(X, indptr, indices, data, is_csr, y, row0 - a, r0, picks[0], picks[1],
                   vals)


@njit(cache=True, nogil=True)
def copy_found(X, indptr, indices, data, is_csr, y, row0, r0, out, state, vals):
    """Copy the rows returned from ``r0`` on (``out``, ``state`` of the Picks bundle), store
    row g being row g − ``row0`` of the given arrays, into the
    :class:`~ooc_learn.index.kernel_args.Values` buffers ``vals`` (the caller made room:
    :func:`values_room`). A pass of its own after the scan: copying inside the scan's loop
    slowed it by ~5 %."""
    v = Values(*vals)
    for r in range(r0, state[0]):
        i = out[r] - row0
        copy_row(X, indptr, indices, data, is_csr, i, y[i], r, v.X, v.ptr, v.ind, v.dat, v.y,
                 v.sqn)


@njit(cache=True, nogil=True)
def _scan_rows(X, indptr, indices, data, is_csr, y, row0, query, picks):
    """Test every row of the given arrays against eq. 10 and collect the fresh ones.

    A row (global position ``row0 + i``) is skipped without being examined if it is
    excluded, shrunk, or was examined as a pivot in this query (in ``seen``, when
    ``picks.state[3]`` > 0). An examined row qualifies if y·wₜᵀx ≥ ``query.low`` (not an outlier
    at the outer iterate) and y·wᵀx < 1 (non-zero gradient). With ``picks.shrink_on``,
    examined rows with y·wᵀx > ``query.shrink_hi`` or outliers are marked shrunk (IBCD §4.3).
    Stops once ``picks.need`` rows are collected or ``picks.max_examine`` rows were examined.
    """
    q, pk = Query(*query), Picks(*picks)
    w, b, wt, bt, same_outer, low = q.w, q.b, q.wt, q.bt, q.same_outer, q.low
    excl, shrunk, fen, state, out = pk.excl, pk.shrunk, pk.fen, pk.state, pk.out
    need, max_examine = pk.need, pk.max_examine
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
        if check_seen and seen_contains(pk.seen, g):
            continue
        state[1] += 1
        yi = np.float64(y[i])
        if same_outer:
            mw = yi * margin(X, indptr, indices, data, is_csr, i, w, b)
            mt = mw
        else:
            m1, m2 = margins2(X, indptr, indices, data, is_csr, i, w, b, wt, bt)
            mw, mt = yi * m1, yi * m2
        if mw < 1.0 and mt >= low:
            out[state[0]] = g
            state[0] += 1
        elif pk.shrink_on and (mw > q.shrink_hi or mt < low):
            shrunk[g] = 1
            fenwick_add(fen, g, 1)
            state[2] += 1


# ------------------------------------------------------------------ the row list
# The rows at hand, one typed list of (X, indptr, indices, data, y) slices (a span, an upper
# node's pivot rows, a cached block), made and changed here, not by numba.typed.List's methods
# from Python: those are compiled in every process, never cached (``ooc-train`` on a 3000-row
# store: 2.2 s of its 2.5 s were compiling List's constructor and clear).
_ROW_SLICE = Tuple((float32[:, ::1], int64[::1], int32[::1], float32[::1], float32[::1]))


@njit(cache=True)
def new_row_list():
    """An empty row list."""
    return List.empty_list(_ROW_SLICE)


@njit(cache=True)
def clear_row_list(rows):
    rows.clear()


@njit(cache=True)
def row_list_set(rows, slot, x, p, i, d, y):
    """Put one row slice in slot ``slot`` of the row list (appending)."""
    if slot == len(rows):
        rows.append((x, p, i, d, y))
    else:
        rows[slot] = (x, p, i, d, y)


# ------------------------------------------------------------------ the search loop
@njit(cache=True, nogil=True)
def values_room(state, vals, is_csr, rows, nnz):
    """Whether the :class:`~ooc_learn.index.kernel_args.Values` buffers ``vals`` hold
    ``rows`` more rows of ``nnz`` more stored values (CSR)."""
    v = Values(*vals)
    r = state[0]
    if r + rows > v.y.shape[0]:
        return False
    return not is_csr or v.ptr[r] + nnz <= v.dat.shape[0]


@njit(cache=True, nogil=True, inline="always")
def _rows_nnz(indptr, at):
    nnz = 0
    for j in range(at.shape[0]):
        nnz += indptr[at[j] + 1] - indptr[at[j]]
    return nnz


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
def bbf_run(fpri, fent, size, query, picks, vals, nodes, slots, rows, stops, cnt, ret):
    """The best-bin-first loop of ``Forest._best_bin_first``, for as long as it can run here.

    Pops entries (``frontier_pop``), scans leaves (:func:`scan_leaf`) and expands nodes
    (:func:`expand_node`) exactly as the Python loop does, from the decoded node records
    (``nodes``, :class:`~ooc_learn.index.kernel_args.NodeArrays`) and the rows at hand in
    the row list ``rows``, found through ``slots`` (:class:`~ooc_learn.index.kernel_args.
    RowSlots`): tree t's whole store block when the store caches it, else the row slices of
    the forest's cache (a span by its first row, an upper node's pivot rows by node). An
    entry that needs anything else (a record or rows not at hand, frontier, ``seen`` or
    value-buffer room) is returned to Python, popped, in ``ret`` (order, start, stop, span
    start, span stop, tree code) with its priority. ``cnt`` counts [order counter, nodes expanded,
    leaves scanned, nodes skipped, pivots scored, frontier peak, rows read by the query].
    Unless ``vals`` is None, the rows returned are copied into its buffers
    (:class:`~ooc_learn.index.kernel_args.Values`) as they are verified (a search that
    copies nothing passes None: numba compiles it without the copies, and the call unboxes
    no buffers).

    Rows read: the Python loop counts the rows of each span, big leaf and upper node's pivots
    it loads into the forest's row cache, which keeps them, so each counts once while
    cached; IBCD's cost model and ``max_read`` were tuned on that count. Rows taken here
    from a cached block count the same way: the first use of a span (or big leaf, or
    pivots) marks its lookup entry SLOT_COUNTED and adds its rows; the marks of a block
    are cleared when the store's cache lets the block go. The search stops
    (BBF_READ_LIMIT) once ``cnt[6]`` reaches ``stops.max_read``.
    Returns ``(size, BBF_*, priority)``.
    """
    q, pk, nodes = Query(*query), Picks(*picks), NodeArrays(*nodes)
    slots, stops = RowSlots(*slots), Stops(*stops)
    state, seen = pk.state, pk.seen
    node_slot, span_slot, pv_slot = nodes.node_slot, slots.span_slot, slots.pv_slot
    rad = nodes.c_rada if q.augment else nodes.c_rad
    while size > 0 and state[0] < pk.need and state[1] < pk.max_examine:
        if state[1] >= stops.prec_from and state[0] < stops.min_prec * state[1]:
            return size, BBF_LOW_PREC, 0.0
        if cnt[6] >= stops.max_read:
            return size, BBF_READ_LIMIT, 0.0
        size, pri, order, s0, e0, ss, se, tc, skipped = frontier_pop(fpri, fent, size, picks)
        cnt[3] += skipped
        if tc < 0:
            break
        t = tc >> 32
        code = tc & 0xFFFFFFFF
        v = code >> 1
        if ss < 0 and e0 - s0 <= slots.span_rows:
            ss, se = s0, e0
        # rows: the tree's whole block if cached, else the span's slice
        slot = slots.blk_slot[t]
        rbase = slots.boff[t]
        if slot >= 0:
            g = nodes.base[t] + v
            if code & 1:
                cnt[6] += block_first_use(span_slot, pv_slot, g, e0 - s0, ss, se)
            elif ss >= 0:
                cnt[6] += block_first_use(span_slot, pv_slot, g, 0, ss, se)
            elif node_slot[g] >= 0:  # an undecoded node counts once decoded, in Python
                cnt[6] += block_first_use(span_slot, pv_slot, g, nodes.k[node_slot[g]], ss,
                                          se)
        elif ss >= 0:
            slot = span_slot[ss]
            rbase = ss
            if slot >= 0 and slots.slot_stop[slot] != se:
                slot = -1
        miss = False
        if code & 1:
            if slot < 0:
                miss = True
            else:
                # scan_leaf's slicing, inline: a call of scan_leaf here cost ~6 % of the
                # loop's time (its call layer stays in the compiled loop)
                a, z = s0 - rbase, e0 - rbase
                X, P, I, D, Y = rows[slot]
                room = True
                if vals is not None:  # (tests of the argument's type: compiled away)
                    room = values_room(state, vals, slots.is_csr, min(z - a, pk.need - state[0]),
                                       P[z] - P[a] if slots.is_csr else 0)
                if not room:
                    miss = True
                else:
                    r0 = state[0]
                    if slots.is_csr:
                        _scan_rows(X, P[a:z + 1], I, D, True, Y[a:z], s0, query, picks)
                    else:
                        _scan_rows(X[a:z], P, I, D, False, Y[a:z], s0, query, picks)
                    if vals is not None:
                        copy_found(X, P, I, D, slots.is_csr, Y, rbase, r0, pk.out, state,
                                   vals)
                    cnt[2] += 1
                    continue
        else:
            g = nodes.base[t] + v
            ns = node_slot[g]
            if ns < 0:
                miss = True
            else:
                by_row = slot >= 0
                if not by_row:
                    slot = pv_slot[g]  # an upper node's pivot rows, in the node's order
                k = nodes.k[ns]
                if (slot < 0 or size + k > fpri.shape[0]
                        or (pk.take_now and 2 * (state[3] + k) > seen.shape[0])):
                    miss = True
                else:
                    f = nodes.first[ns]
                    piv = nodes.c_piv[f:f + k]
                    if by_row:
                        at = piv - rbase
                    else:
                        at = np.arange(k)
                    X, P, I, D, Y = rows[slot]
                    room = True
                    if vals is not None:
                        room = not pk.take_now or values_room(
                            state, vals, slots.is_csr, min(k, pk.need - state[0]),
                            _rows_nnz(P, at) if slots.is_csr else 0)
                    if not room:
                        miss = True
                    else:
                        cnt[5] = max(cnt[5], size + k)
                        kids = Children(nodes.c_id[f:f + k], nodes.c_start[f:f + k],
                                        nodes.c_stop[f:f + k], nodes.c_leaf[f:f + k], piv,
                                        nodes.c_sq[f:f + k], rad[f:f + k])
                        size = expand_node(X, P, I, D, slots.is_csr, Y, at, query, kids,
                                           pri, fpri, fent, size, order & ~ORDER_MASK, cnt[0],
                                           ss, se, t, picks, vals)
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
