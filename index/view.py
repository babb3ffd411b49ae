"""The opened metric forest: its files checked against the store, records and rows read.

:class:`ForestView` holds what a query reads: the LMDB environment (its mapped pages paid
from the budget as a window), the meta record and tree headers (checked against the store's
shape and rows), node records (decoded a tree at a time into the resident cache when the cap
allows, else one by one), and row slices of the store (spans, leaves, pivot rows) through
the caches; :class:`~ooc_learn.index.forest.Forest` adds the search and shrinking.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import lmdb
import numpy as np

from ooc_learn.storage.arrays import kernel_args, rows_one_by_one
from ooc_learn.storage.budget import MemoryBudget, holds_rows
from ooc_learn.storage.cache import LRUCache
from ooc_learn.storage.errors import ClosedError, IndexStateError

from .lmdb_io import CorruptIndex, IndexVersionMismatch, SharedReader, index_summary
from .records import (INDEX_FORMAT, INDEX_FORMAT_VERSION, META_KEY, Node, decode_node,
                      decode_tree_header, node_key, rows_crc, tree_key, tree_node_records)
from .resident import Resident

__all__ = ["ForestView", "ROOT_SHARE"]

# the roots' records and pivot rows (read by every query) are cached apart, in at most
# 1/ROOT_SHARE of the cap, given back last under pressure
ROOT_SHARE = 8
# frontier entries (heap positions 0..READ_AHEAD-1, near the next ones popped) whose leaf
# reads start together when the search waits for one (``will_need``)
READ_AHEAD = 16
# Where not None, whether the search runs its compiled loop over the whole cached store,
# instead of the rule (the cap holds the store's rows): a capped first run's warm-up helper
# sets False where the command's cap does not hold them (ooc_learn.cli.warmup), so that its
# run on the head of the store compiles the kernels the command calls
HOLDS_DATA: bool | None = None
# bytes one cache entry costs beyond its arrays' data (key and value tuples, dict slot), and
# per array its ndarray header: small leaves make many small entries (the memory promise)
_ENTRY_OVERHEAD = 400
_ARRAY_OVERHEAD = 112


class ForestView:
    """Read-only view of a metric forest, bound to a row provider: the opened index, checked
    against the store, and its node records and row slices read through the caches.
    :class:`~ooc_learn.index.forest.Forest` adds the query.

    Parameters
    ----------
    path : str or Path
        The index directory (``STORE/index.lmdb``).
    read_range : callable
        ``read_range(start, stop) -> (X, y, row_ids)`` for contiguous store rows; X a
        float32 ndarray or CSR matrix. A :class:`~ooc_learn.storage.store.Store` is one
        provider, an in-memory array another.
    read_rows : callable, optional
        ``read_rows(rows) -> (X, y)`` for sorted, scattered store rows (a node's pivot rows)
        in one call; default: one ``read_range`` per row.
    n_samples, n_features : int
        The store's shape, checked against the index.
    block_offsets : array of int
        The store's block row offsets, checked against the index.
    budget : MemoryBudget, optional
        The run's memory cap; the caches (and the forest's shrink state) reserve from it.
    name : str, optional
        How errors name the store (default: the parent directory of ``path``).
    cache_bytes : int, optional
        A bound on each of the caches (leaf and pivot rows; node records; the roots' records
        and pivot rows, at most 1/ROOT_SHARE of the cap) alone (default: whatever the
        budget allows).
    block_cache : LRUCache, optional
        The store's block cache (entries ``("block", b)`` → ``(X, y, row_ids)``): while it
        holds block t, the search reads tree t's rows from it without calling Python.
    block_labels : callable, optional
        Maps a cached block's labels to the ones the search reads: the cache keeps the stored
        labels (it is shared by the store's views), a one-vs-rest view reads +1 / -1
        (``Store.labels_out``). The mapped copy is paid from the budget while mirrored.
    will_need : callable, optional
        ``will_need(spans)`` starts the reads of the row spans ``(start, stop)`` that
        ``read_range`` will be asked for (``Store.will_need``): the search names the leaves
        at the top of its frontier as it waits for one.
    """

    def __init__(self, path, *, read_range: Callable, n_samples: int, n_features: int,
                 block_offsets, budget=None, name: str | None = None,
                 cache_bytes: int | None = None, read_rows: Callable | None = None,
                 block_cache: LRUCache | None = None, block_labels: Callable | None = None,
                 will_need: Callable | None = None):
        self.path = Path(path)
        self._will_need = will_need
        self._ahead: set = set()  # the leaves named to will_need in this query
        self._block_cache = None
        self.block_labels = block_labels
        self.name = str(name) if name is not None else str(self.path.parent)
        self._read_range = read_range
        self._read_rows = read_rows
        self.n_samples = int(n_samples)
        self.n_features = int(n_features)
        self.block_offsets = np.asarray(block_offsets, dtype=np.int64)
        self.budget = MemoryBudget.coerce(budget)
        self._reader = None
        self._map_window = 0
        self._mapped = 0
        self.last_query: dict = {}  # the last query's counters (reads add to rows_read)
        self.remaps = 0
        self._row_bytes = 4.0 * (self.n_features + 3)  # updated from every read
        try:
            self._reader = SharedReader.acquire(self.path)
        except FileNotFoundError:
            found = index_summary(self.path)  # something in the index's place?
            if found["state"] == "damaged":
                raise self._error(f"The index of store {self.name} is damaged ({self.path} "
                                  f"is {found['reason']}).") from None
            raise self._error(f"The store {self.name} has no index ({self.path} is missing).",
                              build=True) from None
        except IndexVersionMismatch as exc:
            raise self._error(f"The index of store {self.name} was written by index format "
                              f"{exc.version!r}; this is format {INDEX_FORMAT_VERSION}.") \
                from None
        except CorruptIndex as exc:
            raise self._error(f"The index of store {self.name} is corrupted or incomplete: "
                              f"{exc}.") from None
        except lmdb.Error as exc:
            raise self._error(f"The index of store {self.name} cannot be opened ({exc}); "
                              f"it is corrupted.") from None
        # LMDB serves reads from a memory map: every page a query touches stays resident until
        # the map is dropped. That residency is paid from the budget as a window; when the
        # bytes read pass it, the environment is reopened, which unmaps the pages.
        size = (self.path / "data.mdb").stat().st_size
        want = int(min(size + (1 << 16), max(1 << 18, self.budget.limit // 16)))
        self._map_window = want if self.budget.try_reserve(want) else 0
        try:
            self.meta = self._check_meta()
            self.headers = [self._header(t) for t in range(self.n_blocks)]
        except BaseException:
            self.close()
            raise
        # leaf and pivot rows; node records apart, in the decoded trees (Resident),
        # registered later with the budget, so pressure (S growing, the block cache) takes
        # rows first: every query walks the upper records, they are given back last
        self.cache = LRUCache(self.budget, cache_bytes, name="index rows")
        self.node_cache = self.roots = None
        try:
            # the numba loop only where the cap holds the data (rows at 4 (d + 3) bytes,
            # _row_bytes's first estimate): capped runs keep the Python loop, records
            # decoded one by one, uncached (with it, capped IBCD runs took other paths and
            # read more, not understood yet)
            holds_data = (holds_rows(self.budget.limit, self.n_samples, self.n_features)
                          if HOLDS_DATA is None else HOLDS_DATA)
            self.node_cache = Resident(
                self.budget, n_nodes=[h.n_nodes for h in self.headers],
                n_samples=self.n_samples, block_offsets=self.block_offsets,
                max_bytes=cache_bytes, holds_data=holds_data, read_tree=self._tree_records,
                corrupt=self._corrupt, block_labels=block_labels)
            self.cache.listen(self.node_cache.rows_put, self.node_cache.rows_drop)
            # registered after the others: evicted last
            root_bytes = self.budget.limit // ROOT_SHARE
            self.roots = LRUCache(self.budget, root_bytes if cache_bytes is None
                                  else min(root_bytes, int(cache_bytes)), name="index roots")
            self.roots.listen(self.node_cache.rows_put, self.node_cache.rows_drop)
            if block_cache is not None:
                block_cache.listen(self.node_cache.rows_put, self.node_cache.rows_drop)
                self._block_cache = block_cache
            self._check_rows()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- opening and checks
    def _error(self, message: str, build: bool = False) -> IndexStateError:
        verb = "Build" if build else "Rebuild"
        return IndexStateError(message, f"{verb} it with `ooc-index {self.name} --overwrite`.")

    def _get(self, key: bytes, what: str):
        try:
            with self._reader.read() as txn:
                raw = txn.get(key)
            # a record touches its pages and the B-tree path above them (4 KiB pages)
            self._account_mapped((0 if raw is None else len(raw)) + 3 * 4096)
            return raw
        except lmdb.Error as exc:
            raise self._error(f"The index of store {self.name} is corrupted: reading {what} "
                              f"failed ({exc}).") from None

    def _corrupt(self, problem: str) -> IndexStateError:
        return self._error(f"The index of store {self.name} is corrupted: {problem}.")

    def _tree_records(self, t: int) -> list:
        """``(v, record)`` of every node record of tree t, by one cursor walk."""
        try:
            with self._reader.read() as txn:
                records = list(tree_node_records(txn, t))
        except lmdb.Error as exc:
            raise self._error(f"The index of store {self.name} is corrupted: reading the nodes "
                              f"of tree {t} failed ({exc}).") from None
        self._account_mapped(sum(len(raw) for _, raw in records) + 3 * 4096)
        return records

    def _account_mapped(self, nbytes: int) -> None:
        """Count ``nbytes`` of mapped pages against the window; past it, drop the map."""
        self._mapped += nbytes
        if self._mapped > self._map_window:
            self._reader.remap()
            self._mapped = 0
            self.remaps += 1

    def _check_meta(self) -> dict:
        raw = self._get(META_KEY, "the meta record")
        try:
            meta = json.loads(bytes(raw).decode()) if raw is not None else None
        except (UnicodeDecodeError, ValueError):
            meta = "garbled"
        if meta == "garbled" or (meta is not None and not isinstance(meta, dict)):
            raise self._error(f"The index of store {self.name} is corrupted: its meta record "
                              f"is not readable.")
        if meta is None or meta.get("format") != INDEX_FORMAT or not meta.get("complete"):
            raise self._error(f"The index of store {self.name} is incomplete or not an "
                              f"ooc-learn index (no finished meta record).")
        if meta.get("format_version") != INDEX_FORMAT_VERSION:
            raise self._error(f"The index of store {self.name} was written by index format "
                              f"{meta.get('format_version')!r}; this is format "
                              f"{INDEX_FORMAT_VERSION}.")
        mine = dict(n_samples=self.n_samples, n_features=self.n_features,
                    n_blocks=len(self.block_offsets) - 1)
        for key, want in mine.items():
            if meta.get(key) != want:
                raise self._error(f"The index of store {self.name} does not match the store: "
                                  f"index {key}={meta.get(key)!r}, store {key}={want}.")
        if list(meta.get("block_offsets", [])) != self.block_offsets.tolist():
            raise self._error(f"The index of store {self.name} does not match the store: "
                              f"the block row offsets differ.")
        return meta

    def _header(self, t: int):
        try:
            h = decode_tree_header(self._get(tree_key(t), f"tree {t}"), t)
        except ValueError as exc:
            raise self._error(f"The index of store {self.name} is corrupted: {exc}.") from None
        if h.row_offset != self.block_offsets[t] or \
                h.row_offset + h.n_rows != self.block_offsets[t + 1]:
            raise self._error(f"The index of store {self.name} does not match the store: "
                              f"tree {t} covers other rows than block {t}.")
        return h

    def _check_rows(self) -> None:
        """Compare the first tree's root pivots with the store's rows (catches re-ingest)."""
        h = self.headers[0] if self.headers else None
        if h is None or h.n_internal == 0:
            return
        node = self.node(0, 0)
        P, _ = self._read_pivots(node)
        if rows_crc(P) != h.pivot_crc:
            raise self._error(f"The index of store {self.name} does not match the store: "
                              f"pivot row {int(node.pivot_row[0])} (or another root pivot) "
                              f"differs from the stored row (the data were rewritten after "
                              f"the index was built).")

    def verify(self) -> int:
        """Decode every node record of every tree (each one checked, its rows inside its
        parent's and its block's); raises :class:`IndexStateError` at the first fault.
        Returns the number of records read."""
        seen = 0
        for t, h in enumerate(self.headers):
            if h.n_internal == 0:
                continue
            todo = [(0, int(self.block_offsets[t]), int(self.block_offsets[t + 1]))]
            left = h.n_internal  # a cycle of child ids would otherwise never end
            while todo:
                v, lo, hi = todo.pop()
                node = self._decode(t, v)
                seen += 1
                left -= 1
                if node.start < lo or node.stop > hi or left < 0:
                    raise self._error(f"The index of store {self.name} is corrupted: node {v} "
                                      f"of tree {t} lies outside its parent's rows.")
                for c, a, b, leaf in zip(node.child_id.tolist(), node.child_start.tolist(),
                                         node.child_stop.tolist(), node.child_leaf.tolist()):
                    if not leaf:
                        todo.append((c, a, b))
        return seen

    # ---------------------------------------------------------------- state
    @property
    def n_blocks(self) -> int:
        return len(self.block_offsets) - 1

    @property
    def map_window_bytes(self) -> int:
        """Budget held for LMDB pages mapped by reads (the map is dropped past it)."""
        return self._map_window

    @property
    def closed(self) -> bool:
        return self._reader is None

    def _alive(self):
        if self._reader is None:
            raise ClosedError(f"The index of store {self.name} is closed.",
                              "Open it again with ooc_learn.index.open_forest(store).")

    def close(self) -> None:
        """Release the caches and the LMDB handle. Closing twice is fine."""
        res = getattr(self, "node_cache", None)
        caches = (getattr(self, "cache", None), getattr(self, "roots", None))
        if res is not None:
            for cache in caches + (self._block_cache,):
                if cache is not None:
                    cache.unlisten(res.rows_put, res.rows_drop)
            res.close()
        self._block_cache = None
        for cache in caches:
            if cache is not None:
                cache.close()
        if self._reader is not None:
            self._reader.release()
            self._reader = None
            self.budget.release(self._map_window)
            self._map_window = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---------------------------------------------------------------- node and leaf reads
    def node(self, t: int, v: int) -> Node:
        """Node record v of tree t: from the decoded trees (:class:`Resident`), its tree
        decoded first if need be; read alone when the cap holds no room for that."""
        ns = self.node_cache.slot(t, v)
        if ns >= 0:
            return self.node_cache.record(ns)
        if v == 0:  # a root (see ROOT_SHARE)
            def load():
                node = self._decode(t, v)
                return node, _ENTRY_OVERHEAD + sum(a.nbytes + _ARRAY_OVERHEAD for a in node
                                                   if isinstance(a, np.ndarray))
            return self.roots.get_or_load(("node", t), load)
        return self._decode(t, v)

    def _decode(self, t: int, v: int) -> Node:
        """Node record v of tree t, read alone."""
        raw = self._get(node_key(t, v), f"node {v} of tree {t}")
        try:
            return decode_node(raw, t, v)
        except ValueError as exc:
            raise self._error(f"The index of store {self.name} is corrupted: {exc}.") from None

    def _rows(self, key, start: int, stop: int):
        """Rows ``start:stop`` as kernel arrays and labels, through the LRU cache."""
        def load():
            X, y, _ = self._read_range(start, stop)
            arrays = kernel_args(X)
            y = np.ascontiguousarray(y, dtype=np.float32)
            nbytes = (sum(a.nbytes + _ARRAY_OVERHEAD for a in arrays[:4]) + y.nbytes
                      + _ARRAY_OVERHEAD + _ENTRY_OVERHEAD)
            self.last_query["rows_read"] += stop - start
            if stop > start:
                self._row_bytes = nbytes / (stop - start)
            return (arrays, y), nbytes
        return self.cache.get_or_load(key, load)

    def _read_ahead(self, ent, key, start: int, stop: int, span_rows: float) -> None:
        """Before the leaf read ``key`` (rows ``start:stop``) waits, start it and the reads
        of the uncached leaves among the next READ_AHEAD frontier entries ``ent`` (the top
        of the heap, near the next ones popped) in one batch (``will_need``)."""
        if self._will_need is None or key in self.cache:
            return
        spans = [(start, stop)]
        resident = self.node_cache.blocks
        for _, s0, e0, ss, se, tc, _ in ent[:READ_AHEAD].tolist():
            t, code = tc >> 32, tc & 0xFFFFFFFF
            if not code & 1 or t in resident:  # a node, or rows the search has at hand
                continue
            if ss < 0 and e0 - s0 <= span_rows:
                ss, se = s0, e0
            k = ("span", t, ss, se) if ss >= 0 else ("leaf", t, code >> 1)
            if k not in self._ahead and k not in self.cache:
                self._ahead.add(k)
                spans.append((ss, se) if ss >= 0 else (s0, e0))
        if len(spans) > 1:
            self._will_need(spans)

    def _read_pivots(self, node):
        """A node's pivot rows ``(X, y)`` (in the node's order)."""
        return self._read_scattered(node.pivot_row)

    def _read_scattered(self, rows):
        """Store rows ``(X, y)`` in the order given, read in store order."""
        if self._read_rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
            order = np.argsort(rows, kind="stable")
            X, y = self._read_rows(rows[order])
            inv = np.empty_like(order)
            inv[order] = np.arange(order.size)
            return X[inv], np.asarray(y)[inv]
        return rows_one_by_one(self._read_range, rows)

    def _pivot_rows(self, t: int, v: int, node):
        """The pivot rows of an upper node as kernel arrays and labels, through the cache."""
        def load():
            P, y = self._read_pivots(node)
            arrays = kernel_args(P)
            y = np.ascontiguousarray(y, dtype=np.float32)
            self.last_query["rows_read"] += y.shape[0]
            return (arrays, y), (sum(a.nbytes + _ARRAY_OVERHEAD for a in arrays[:4])
                                 + y.nbytes + _ARRAY_OVERHEAD + _ENTRY_OVERHEAD)
        return (self.roots if v == 0 else self.cache).get_or_load(("pivots", t, v), load)
