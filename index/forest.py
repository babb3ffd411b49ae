"""Query the metric forest for the IBCD step: best-bin-first search and shrinking.

The IBCD inner loop (Yen et al. 2013, Algorithm 1) asks ``queryIndex(w; w_t, s, n)`` for up
to n fresh rows satisfying eq. 10,

    y·w_tᵀx ≥ L⁻¹(1+s)   (not an outlier at the outer iterate w_t)   and   y·wᵀx < 1,

and for n_e, the number of rows it examined. Rows near the hyperplane w are found as nearest
neighbours of the query −V(ŵ) in the degree-2 embedding (§3.2): −V(ŵ)ᵀV(x̂) = −(ŵᵀx̂)². The
search is best-bin-first (§4.1): one priority queue over the partitions of every tree, trees
entering in a random order (the seed). A partition is ranked by its pivot's angle to the
hyperplane, blended with the lower bound its covering radius gives (``rank_mu`` of
:class:`~ooc_learn.index.search_config.SearchConfig`), instead of the paper's nearest Voronoi
boundary: in V-space the query is at distance ≥ √2 from every row, so boundary distances
bound nothing (and ranked leaves worse). Pivots are rows of their node, read from the store
(format 2 keeps no vectors in LMDB): a node of at most ``span_bytes`` of rows is read in one
slice that also serves every leaf below it. Every returned row is verified exactly from its
stored values; a pivot row that qualifies is returned as soon as its margin is computed
(``pivot_candidates``). Shrinking on the index (§4.3) stops visiting rows far outside the
range, and nodes whose rows are all shrunk.

The parts: the search loop runs in numba (``_search_kernels.bbf_run``) for as long as the
decoded records and rows it needs are at hand (:class:`~ooc_learn.index.resident.Resident`),
and here, entry by entry, otherwise; the frontier and the set of pivot rows returned are
numpy arrays reserved from the memory budget (:class:`~ooc_learn.index.frontier.Frontier`);
the outlier threshold L⁻¹(1+s) is the loss's (:func:`ooc_learn.losses.outlier_margin`); the
opened index, its records and its rows are :class:`~ooc_learn.index.view.ForestView`'s.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ooc_learn.losses import outlier_margin
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.jit import await_kernel

from ._frontier_kernels import (ORDER_MASK, ORDER_SHIFT, fenwick_mark, fenwick_prefix,
                                frontier_pop, frontier_push)
from ._search_kernels import (BBF_LOW_PREC, BBF_MISS, BBF_READ_LIMIT, bbf_run, expand_node,
                              scan_leaf)
from .found import RowBuffer
from .frontier import FRONTIER_ENTRY_BYTES, SEEN_MIN, Frontier
from .kernel_args import Children, Picks, Query, Stops
from .records import Node
from .search_config import SearchConfig
from .view import ForestView

__all__ = ["Forest", "open_forest", "view_labels", "FRONTIER_ENTRY_BYTES"]

if Node._fields[2:9] != Children._fields:
    raise ImportError("lmdb_io.Node's columns must be kernel_args.Children's (see expand)")
_NO_MASK = np.zeros(0, np.uint8)
_NO_FEN = np.zeros(0, np.int32)
class Forest(ForestView):
    """A metric forest bound to a row provider, queried for the IBCD step (eq. 10).

    Takes the parameters of :class:`~ooc_learn.index.view.ForestView` (the index directory,
    the row provider, the store's shape, the budget and the caches); adds :meth:`query` and
    shrinking (:meth:`shrink`, :meth:`unshrink`), whose state costs 5 bytes a row of the
    budget while on.
    """

    def __init__(self, path, *, search: SearchConfig | None = None, **kwargs):
        self._shrunk, self._fen, self._shrink_hi = _NO_MASK, _NO_FEN, math.inf
        self.search = SearchConfig() if search is None else search
        super().__init__(path, **kwargs)

    def close(self) -> None:
        """Release the caches, the shrink state and the LMDB handle. Closing twice is fine."""
        super().close()
        self.unshrink()

    def _span_rows(self, max_read: float) -> float:
        """The most rows a node may have to be read whole (``SearchConfig.span_bytes``; 0:
        none): at least two leaves' worth (a node just above a leaf splits into up to
        ``width`` small leaves, whose pivots would otherwise be read one by one), and at most
        1/``span_read_share`` of what the query may read, so one read cannot end a query."""
        cfg = self.search
        if not cfg.span_bytes:
            return 0.0
        return min(max(cfg.span_bytes / self._row_bytes, 2 * self.meta["leaf_size"]),
                   max_read / cfg.span_read_share)

    # ---------------------------------------------------------------- shrinking (§4.3)
    def shrink(self, threshold: float = 1.0, rows=None) -> int:
        """Shrink on the index from now on (IBCD §4.3); return how many rows are shrunk.

        Every row a later query examines with y·wᵀx > 1 + ``threshold`` or y·wₜᵀx below the
        outlier margin is marked and never visited again; a node whose rows are all marked
        is skipped without a read. ``rows`` (store positions, e.g. the active set) are
        marked now. :meth:`unshrink` restores everything. The state costs 5 bytes per row
        of the memory budget.
        """
        self._alive()
        if not threshold >= 0:
            raise ParameterError(f"The 'threshold' parameter of shrink must be >= 0. Got "
                                 f"{threshold!r} instead.", "The paper's T is a margin "
                                 "slack such as 1.0.")
        if self._shrunk.shape[0] == 0:
            self.budget.reserve(5 * self.n_samples, "index shrink state")
            self._shrunk = np.zeros(self.n_samples, np.uint8)
            self._fen = np.zeros(self.n_samples, np.int32)
        self._shrink_hi = 1.0 + float(threshold)
        if rows is not None:
            fenwick_mark(self._fen, self._shrunk, self._rows_arg(rows, "rows", "shrink"))
        return self.n_shrunk

    def unshrink(self) -> int:
        """Restore every shrunk row and stop shrinking; return how many were restored."""
        restored = self.n_shrunk
        if self._shrunk.shape[0]:
            self.budget.release(5 * self.n_samples)
        self._shrunk, self._fen, self._shrink_hi = _NO_MASK, _NO_FEN, math.inf
        return restored

    @property
    def n_shrunk(self) -> int:
        return int(fenwick_prefix(self._fen, self.n_samples)) if self._fen.shape[0] else 0

    def _rows_arg(self, rows, name: str, where: str) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (self.n_samples,):
                raise ParameterError(
                    f"The '{name}' parameter of {where} must be a boolean mask of "
                    f"{self.n_samples} rows or an array of row positions. Got a mask of shape "
                    f"{rows.shape} instead.", "Pass one entry per store row.")
            return np.flatnonzero(rows)
        rows = rows.astype(np.int64, copy=False).ravel()
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_samples):
            raise ParameterError(
                f"The '{name}' parameter of {where} must hold row positions in "
                f"[0, {self.n_samples}). Got values in [{rows.min()}, {rows.max()}] instead.",
                "Pass store row positions (as returned by query).")
        return rows

    # ---------------------------------------------------------------- the query
    def _weights(self, w, name: str):
        w = np.asarray(w, dtype=np.float64).ravel()
        d = self.n_features
        if w.shape[0] not in (d, d + 1) or not np.all(np.isfinite(w)):
            raise ParameterError(
                f"The '{name}' parameter of query must be a finite vector of {d} weights "
                f"(or {d + 1} with the bias last). Got {w.shape[0]} entries instead.",
                "Pass the model's coefficients.")
        if w.shape[0] == d + 1:
            return np.ascontiguousarray(w[:d]), float(w[d]), True
        return w, 0.0, False

    def query(self, w, *, w_outer=None, s=1.0, n: int | None = 1000, exclude=None,
              seed: int = 0, loss: str = "hinge", max_examined: int | None = None,
              bounded: bool = False, min_precision: float = 0.0,
              max_read: int | None = None, with_rows: bool = False, trees=None):
        """Up to ``n`` fresh rows satisfying eq. 10, and the number of rows examined
        (``with_rows``: and their values).

        Parameters
        ----------
        w : array (n_features,) or (n_features + 1,)
            The current weights. With ``n_features + 1`` entries the last is the bias b,
            the weight of a constant feature 1 (LIBLINEAR's ``-B 1``): margins are wᵀx + b
            and the search runs in the augmented space [x, 1].
        w_outer : array like ``w``, optional
            The outer iterate w_t of the truncated-loss relaxation (default: ``w``).
        s : float or None
            The truncation; rows with y·w_tᵀx < L⁻¹(1+s) are outliers (hinge: −s; squared
            hinge: 1 − √(1+s), see :func:`outlier_margin`). ``None``: no truncation.
        n : int or None
            The number of fresh rows wanted; ``None`` returns every qualifying row.
        exclude : bool or uint8 mask (n_samples,), or array of row positions, optional
            Rows not to return and not to examine (the active set). A C-contiguous bool or
            uint8 array of ``n_samples`` entries is a mask (non-zero: excluded) and is used
            as is, without a copy: the caller owns it, keeps it between queries and updates
            it as rows join or leave (IBCD's ``in_S``); it must not change during a call.
            Any other array is a list of row positions, copied into a mask of
            ``n_samples`` bytes (paid from the budget) for the call.
        seed : int
            Orders the trees at random (bias reduction, §4.1).
        loss : "hinge" or "sqhinge"
            Which L⁻¹(1+s) to use.
        max_examined : int, optional
            Stop after examining this many rows.
        max_read : int, optional
            Stop once this many rows were read from the store (leaf and node slices and
            pivot rows the cache did not hold; ``last_query["read_limited"]``). Where bounds
            are loose the search expands nodes whose slices it reads without examining their
            rows: under a tight cap that costs more reads than the rows examined tell.
        min_precision : float
            Stop once at least 2·``n`` rows were examined and fewer than this share of them
            qualified (``last_query["low_precision"]``): the best-first order examines the
            likeliest partitions first, so the share only falls from there, and a caller with
            a cheaper way to find sparse rows (IBCD's sequential check) takes over. 0: never.
        bounded : bool
            When the memory cap holds no larger frontier, stop the search there (setting
            ``last_query["truncated"]``) instead of raising the ``--memory`` error. The rows
            returned are then still verified, but fewer than ``n`` no longer proves that no
            other row qualifies: the caller must check another way (IBCD's scan).
        with_rows : bool
            Return :class:`~ooc_learn.index.found.Found`, the rows with their values: each
            row is copied as the search verifies it, from the rows it verified it in, with
            its label (as the search reads it: a one-vs-rest view's) and squared norm, so
            the caller reads nothing again. (A pivot row examined as its partition is
            reached, ``pivot_candidates="reached"``, is read after the search.)
        trees : sequence of int, optional
            Search these blocks' trees only (a shard's blocks of a store; default: all).

        Returns
        -------
        rows : int64 ndarray
            Store row positions in the order found, none repeated or excluded, each verified.
        n_examined : int
            Rows examined as candidates, each counted once: the rows of the leaves scanned
            and the pivot rows returned (see SearchConfig.pivot_candidates; excluded and shrunk rows are
            not examined). Pivot rows whose margins only ranked partitions are counted in
            ``last_query["pivots_scored"]``, not here.

        With ``with_rows``, one :class:`~ooc_learn.index.found.Found` ``(rows, n_examined,
        X, y, sqnorm)`` instead.
        """
        self._alive()
        wv, b, aug = self._weights(w, "w")
        if w_outer is None:
            wt, bt, same = wv, b, True
        else:
            wt, bt, aug_t = self._weights(w_outer, "w_outer")
            if aug_t != aug:
                raise ParameterError(
                    f"The 'w_outer' parameter of query must have as many entries as 'w' "
                    f"({len(np.ravel(w))}). Got {len(np.ravel(w_outer))} instead.",
                    "Pass both with or both without the bias.")
            same = bool(np.array_equal(wt, wv) and bt == b)
        if s is not None and not (float(s) >= 0):
            raise ParameterError(f"The 's' parameter of query must be >= 0 or None. Got "
                                 f"{s!r} instead.", "s = 1 is the ramp loss's usual value.")
        low = outlier_margin(loss, s)
        limit = self.n_samples if n is None else n
        if not isinstance(limit, (int, np.integer)) or isinstance(limit, bool) or limit < 1:
            raise ParameterError(f"The 'n' parameter of query must be an int >= 1 or None. "
                                 f"Got {n!r} instead.", "IBCD asks for about 1000 rows.")
        max_ex = self.n_samples if max_examined is None else int(max_examined)
        if max_ex < 0:
            raise ParameterError(f"The 'max_examined' parameter of query must be >= 0. Got "
                                 f"{max_examined!r} instead.", "Use None for no limit.")
        if not 0.0 <= float(min_precision) < 1.0:
            raise ParameterError(f"The 'min_precision' parameter of query must be in [0, 1). "
                                 f"Got {min_precision!r} instead.", "0 disables it.")
        max_rd = math.inf if max_read is None else int(max_read)
        if max_rd < 0:
            raise ParameterError(f"The 'max_read' parameter of query must be >= 0. Got "
                                 f"{max_read!r} instead.", "Use None for no limit.")
        only = None
        if trees is not None:
            only = np.zeros(self.n_blocks, bool)
            t = np.asarray(trees, dtype=np.int64).ravel()
            if t.size and (t.min() < 0 or t.max() >= self.n_blocks):
                raise ParameterError(f"The 'trees' parameter of query must name blocks in "
                                     f"0:{self.n_blocks}.", "Pass the shard's block numbers.")
            only[t] = True
        return self._search(wv, b, aug, wt, bt, same, low, int(limit), max_ex, exclude, seed,
                            bool(bounded), float(min_precision), max_rd, bool(with_rows),
                            only)

    def _exclusion(self, exclude):
        """The exclusion as a uint8 mask: a caller's mask as is, row positions copied in.

        Returns ``(mask, reserved bytes)``; the bytes of a mask made here are paid from the
        budget until the query ends.
        """
        if exclude is None:
            return _NO_MASK, 0
        a = exclude if isinstance(exclude, np.ndarray) else np.asarray(exclude)
        if a.ndim == 1 and a.shape[0] == self.n_samples and a.dtype in (np.bool_, np.uint8):
            mask = a.view(np.uint8) if a.dtype == np.bool_ else a
            if mask.flags.c_contiguous:
                return mask, 0
        rows = self._rows_arg(a, "exclude", "query")
        self.budget.reserve(self.n_samples, "index query exclusion mask")
        mask = np.zeros(self.n_samples, np.uint8)
        mask[rows] = 1
        return mask, self.n_samples

    def _search(self, wv, b, aug, wt, bt, same, low, limit, max_ex, exclude, seed, bounded,
                min_prec=0.0, max_read=math.inf, with_rows=False, only=None):
        stats = dict(nodes_expanded=0, leaves_scanned=0, nodes_skipped=0, rows_read=0,
                     rows_examined=0, rows_shrunk=0, pivots_scored=0, pivots_examined=0,
                     frontier_peak=0, truncated=False, low_precision=False,
                     read_limited=False)
        self.last_query = stats
        self._ahead.clear()
        excl, excl_bytes = self._exclusion(exclude)
        fr = Frontier(self.budget, soft=bounded)
        buf = (RowBuffer(self.budget, self.n_features, min(limit, self.n_samples),
                         soft=bounded) if with_rows else None)
        try:
            rows, n_ex = self._best_bin_first(wv, b, aug, wt, bt, same, low, limit, max_ex,
                                              excl, seed, fr, stats, min_prec, max_read, buf,
                                              only)
            if buf is None:
                return rows, n_ex
            return buf.found(rows, n_ex, self._read_found)
        finally:
            stats["frontier_peak"] = fr.peak
            stats["frontier_bytes"] = fr.peak_bytes
            fr.release()
            self.budget.release(excl_bytes)
            if buf is not None:  # the rows handed back are the caller's to pay for
                buf.release()

    def _read_found(self, rows):
        """Rows a search returned without their values at hand, read."""
        X, y = self._read_scattered(rows)
        self.last_query["rows_read"] += rows.shape[0]
        return X, y

    def _best_bin_first(self, wv, b, aug, wt, bt, same, low, limit, max_ex, excl, seed, fr,
                        stats, min_prec=0.0, max_read=math.inf, buf=None, only=None):
        take = self.search.pivot_candidates != "none"
        now = self.search.pivot_candidates == "qualifying"
        rank = np.random.default_rng(seed).permutation(self.n_blocks)
        # a bounded search that the cap cannot start returns nothing, flagged truncated (the
        # set of pivot rows returned starts with room, or the numba loop's first expansion
        # would come back to Python for it)
        stats["truncated"] = not fr.ensure(self.n_blocks, SEEN_MIN // 2 if now else 0)
        stats["frontier_entry_bytes"] = FRONTIER_ENTRY_BYTES
        for t, h in enumerate(self.headers):
            if h.n_rows and not stats["truncated"] and (only is None or only[t]):
                # roots: priority 0, the tree's rank, pushed before any child
                fr.size = frontier_push(fr.pri, fr.ent, fr.size, 0.0,
                                        (int(rank[t]) << ORDER_SHIFT) + ORDER_MASK,
                                        h.row_offset, h.row_offset + h.n_rows, -1, -1,
                                        (t << 32) + (1 if h.n_internal == 0 else 0), -1)
        # the kernels' bundles, packed (see kernel_args); b is 0.0 without a bias (see
        # _weights), so every margin is wᵀx + b
        query = tuple(Query(wv, b, wt, bt, same, low, self._shrink_hi,
                            float(wv @ wv) + (b * b if aug else 0.0), aug, float(self.search.rank_mu),
                            float(self.search.rank_lam)))
        # returned, examined, newly shrunk, in seen, pivots examined
        state = np.zeros(5, np.int64)
        out = np.empty(min(limit, self.n_samples), np.int64)
        pk = Picks(out, state, excl, self._shrunk, self._fen, self._fen.shape[0] > 0, fr.seen,
                   limit, max_ex, take, now)
        picks = tuple(pk)
        vals = None if buf is None else buf.values()  # the values' buffers, if copied
        count = 0
        pops = 0  # an upper bound on the rows in the seen set (one per pop at most)
        prec_from = 2 * limit if min_prec > 0.0 else max_ex
        stops = tuple(Stops(prec_from, min_prec, float(max_read)))
        # the loop runs in numba (bbf_run) while the records and rows it needs are at hand;
        # each entry that needs Python (a read, a tree to decode, frontier room) comes back
        # popped and is served below, as every entry is without the resident arrays
        res = self.node_cache
        fast = res.enabled and not (take and not now)
        # order counter, expanded, scanned, skipped, scored, frontier peak, rows read
        cnt = np.zeros(7, np.int64)
        ret = np.zeros(6, np.int64)
        span_rows = self._span_rows(max_read)
        while fr.size and state[0] < limit and state[1] < max_ex:
            if state[1] >= prec_from and state[0] < min_prec * state[1]:
                stats["low_precision"] = True
                break
            if stats["rows_read"] >= max_read:
                stats["read_limited"] = True
                break
            if fast:
                cnt[0] = count
                cnt[6] = stats["rows_read"]
                await_kernel("bbf_run")  # a first run's helper may be compiling it
                fr.size, code, pri = bbf_run(fr.pri, fr.ent, fr.size, query, picks, vals,
                                             res.nodes_packed, res.row_slots(span_rows),
                                             res.rows, stops, cnt, ret)
                count = int(cnt[0])
                stats["rows_read"] = int(cnt[6])
                if code == BBF_LOW_PREC:
                    stats["low_precision"] = True
                    break
                if code == BBF_READ_LIMIT:
                    stats["read_limited"] = True
                    break
                if code != BBF_MISS:
                    break
                order, s0, e0, ss, se, tc = ret.tolist()
            else:
                pops += 1
                if (take and not now and 2 * pops > fr.seen.shape[0]
                        and not fr.ensure(0, pops)):
                    stats["truncated"] = True  # bounded: stopped where the cap ends
                    break
                if pk.seen is not fr.seen:  # the frontier grew the set
                    pk = pk._replace(seen=fr.seen)
                    picks = tuple(pk)
                n_before = int(state[0])  # a pivot may be taken as its partition is reached
                if buf is not None and take and not now and not buf.room(n_before, 1):
                    stats["truncated"] = True  # bounded: stopped where the cap ends
                    break
                fr.size, pri, order, s0, e0, ss, se, tc, skipped = frontier_pop(
                    fr.pri, fr.ent, fr.size, picks)
                stats["nodes_skipped"] += skipped
                if buf is not None and take and not now and state[0] > n_before:
                    buf.skip(n_before)  # its values are read after the search
                if tc < 0:
                    break
            t, code = tc >> 32, tc & 0xFFFFFFFF
            v, leaf = code >> 1, code & 1
            if ss < 0 and e0 - s0 <= span_rows:
                ss, se = s0, e0
            # rows: tree t's whole block when the store caches it, else the span's slice
            blk = res.blocks.get(t)
            if leaf:
                if blk is not None:
                    stats["rows_read"] += res.first_use(t, v, e0 - s0, ss, se)
                    (Xd, indptr, indices, data, is_csr), y = blk
                    base = int(res.boff[t])
                else:
                    key = ("span", t, ss, se) if ss >= 0 else ("leaf", t, v)
                    base = ss if ss >= 0 else s0
                    stop = se if ss >= 0 else e0
                    self._read_ahead(fr.ent[:fr.size], key, base, stop, span_rows)
                    (Xd, indptr, indices, data, is_csr), y = self._rows(key, base, stop)
                if buf is not None:
                    if not buf.room(int(state[0]), min(e0 - s0, limit - int(state[0])),
                                    int(indptr[e0 - base] - indptr[s0 - base]) if is_csr
                                    else 0, is_csr):
                        stats["truncated"] = True
                        break
                    vals = buf.values()
                scan_leaf(Xd, indptr, indices, data, is_csr, y, s0 - base, e0 - base, s0, query,
                          picks, vals)
                stats["leaves_scanned"] += 1
                continue
            node = self.node(t, v)
            stats["nodes_expanded"] += 1
            if blk is not None:
                stats["rows_read"] += res.first_use(t, v, node.pivot_row.shape[0], ss, se)
                P, yP = blk
                at = node.pivot_row - int(res.boff[t])
            elif ss >= 0:
                P, yP = self._rows(("span", t, ss, se), ss, se)
                at = node.pivot_row - ss
            else:
                P, yP = self._pivot_rows(t, v, node)
                at = np.arange(node.pivot_row.shape[0], dtype=np.int64)
            k = int(at.shape[0])
            if not fr.ensure(k, int(state[3]) + k if now else pops):
                stats["truncated"] = True  # bounded: stopped where the cap ends
                break
            if pk.seen is not fr.seen:
                pk = pk._replace(seen=fr.seen)
                picks = tuple(pk)
            if buf is not None:  # the pivots taken now (room for the layout, at least)
                if not buf.room(int(state[0]), min(k, limit - int(state[0])) if now else 0,
                                int((P[1][at + 1] - P[1][at]).sum()) if now and P[4] else 0,
                                P[4]):
                    stats["truncated"] = True
                    break
                vals = buf.values()
            # a Node's columns are the Children bundle, radius chosen for the query; as the
            # named tuple bbf_run passes, so this call has bbf_run's signature (compiled once,
            # by a first run's helper too)
            kids = Children(*node[2:8], node.radius_aug if aug else node.radius)
            fr.size = expand_node(*P, yP, at, query, kids, pri, fr.pri, fr.ent, fr.size,
                                  order & ~ORDER_MASK, count, ss, se, t, picks, vals)
            count += k
            stats["pivots_scored"] += k
        stats["nodes_expanded"] += int(cnt[1])
        stats["leaves_scanned"] += int(cnt[2])
        stats["nodes_skipped"] += int(cnt[3])
        stats["pivots_scored"] += int(cnt[4])
        fr.peak = max(fr.peak, int(cnt[5]))
        n_out, n_ex = int(state[0]), int(state[1])
        stats["rows_examined"] = n_ex
        stats["rows_shrunk"] = int(state[2])
        stats["pivots_examined"] = int(state[4])
        return out[:n_out].copy(), n_ex

    def stats(self) -> dict:
        """Cache statistics and the last query's work counters."""
        return {"cache": self.cache.stats() if not self.closed else {},
                "node_cache": self.node_cache.stats() if not self.closed else {},
                "roots": self.roots.stats() if not self.closed else {},
                "last_query": dict(self.last_query), "n_shrunk": self.n_shrunk}


def view_labels(store):
    """How the search maps the stored labels of the store's cached blocks: None where the
    store reads them as stored."""
    return store.labels_out if getattr(store, "positive", None) is not None else None


def open_forest(store, *, cache_bytes: int | None = None,
                search: SearchConfig | None = None) -> Forest:
    """The index of an open store (``STORE/index.lmdb``), reading leaf rows through it;
    ``search``: the query's tunables (default ``SearchConfig()``).

    Raises :class:`IndexStateError` naming the store and the fix when the index is missing,
    of another format version, built for other rows, or corrupted.
    """
    from ooc_learn.storage.format import INDEX_DIR

    return Forest(Path(store.path) / INDEX_DIR, read_range=store.read_range,
                  n_samples=store.n_samples, n_features=store.n_features,
                  block_offsets=store.block_offsets, budget=store.budget,
                  name=str(store.path), cache_bytes=cache_bytes, read_rows=store.read_rows,
                  block_cache=store.block_cache, block_labels=view_labels(store),
                  will_need=store.read_ahead,
                  search=search)
