"""What the numba search loop reads without calling Python: decoded trees and rows at hand.

:class:`Resident` is the forest's node cache (its records decoded a whole tree at a time) and
the mirror of its row caches in a numba typed list; ``Forest._best_bin_first`` hands both to
``_search_kernels.bbf_run`` as :class:`~ooc_learn.index.kernel_args.NodeArrays` and
:class:`~ooc_learn.index.kernel_args.RowSlots`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import numpy as np

from ooc_learn.storage.budget import MemoryBudget

from ._record_kernels import CRC_TABLE, decode_records
from ._search_kernels import (SLOT_COUNTED, block_first_use, clear_row_list, new_row_list,
                              row_list_set)
from .kernel_args import NodeArrays, RowSlots
from .records import Node, decode_node
from .node_record import CHILD_BYTES as RECORD_CHILD_BYTES
from .node_record import FIXED_BYTES as RECORD_FIXED_BYTES
from .tree import EMPTY_IDX, EMPTY_PTR, EMPTY_VAL, EMPTY_X

__all__ = ["Resident", "NODE_SLOT_BYTES", "CHILD_BYTES"]

# the decoded arrays of NodeArrays: per node slot, and per child position
_NODE_DTYPES = dict(first=np.int64, k=np.int64, start=np.int64, stop=np.int64)
_CHILD_DTYPES = dict(c_id=np.int32, c_start=np.int64, c_stop=np.int64, c_leaf=np.bool_,
                     c_piv=np.int64, c_sq=np.float32, c_rad=np.float32, c_rada=np.float32)
NODE_SLOT_BYTES = sum(np.dtype(t).itemsize for t in _NODE_DTYPES.values())  # 32
CHILD_BYTES = sum(np.dtype(t).itemsize for t in _CHILD_DTYPES.values())     # 41


class Resident:
    """What the numba search loop (``_search_kernels.bbf_run``) reads without calling Python.

    - **Node records**, decoded a whole tree at a time (one LMDB cursor walk and one
      ``decode_records`` call) into flat arrays (``nodes``): per node its first child and
      child count, per child its columns. ``node_slot[base[t] + v]`` is the slot of node v
      of tree t, −1 when its tree is not loaded. These arrays are the forest's node cache:
      paid from the budget, bounded by ``max_bytes``, and given back tree by tree under
      pressure, the first decoded first, the rest moved down into smaller arrays (an evictor
      registered after the row cache's, so rows go first; giving all back at once made a
      capped run decode the same trees over and over); a tree is decoded again when a search
      reaches it. Decoded per node, each record would cost a Python call and a return from
      numba.
    - **Row slices**: every span and pivot-row entry of the forest's row cache, and every
      block of the store's block cache, is mirrored into a numba typed list (the same
      arrays, no copy), found by ``span_slot[span start]`` (with ``slot_stop``),
      ``pv_slot[base[t] + v]`` and ``blk_slot[t]``; the caches' listeners take an entry
      out of the list when it leaves its cache, so the list never holds memory the budget
      no longer pays for.

    All of it is bounded by ``max_bytes``, by default a quarter of the cap. The lookup
    tables (4 bytes a row and two 4-byte entries a node) are reserved once; when they take
    more than half that bound, the cap holds no room for them or ``holds_data`` is False,
    the forest runs without this (``enabled`` False): every pop then goes through Python,
    and node records are decoded one by one, uncached.

    Parameters
    ----------
    budget : MemoryBudget
        The forest's budget.
    n_nodes : sequence of int
        The number of nodes of each tree.
    n_samples : int
        The store's rows.
    block_offsets : array of int
        The store's block row offsets (tree t covers block t).
    max_bytes : int or None
        The bound (default: a quarter of the cap).
    holds_data : bool
        Whether the cap holds the store's rows (see ``Forest.__init__``).
    read_tree : callable
        ``read_tree(t) -> [(v, record bytes), ...]``: tree t's node records.
    corrupt : callable
        ``corrupt(problem) -> Exception``: the error raised for a record that fails its
        checks.
    block_labels : callable, optional
        Maps a cached block's labels to the ones the search reads (``Forest.block_labels``).
    """

    def __init__(self, budget: MemoryBudget, *, n_nodes, n_samples: int, block_offsets,
                 max_bytes: int | None, holds_data: bool, read_tree: Callable,
                 corrupt: Callable, block_labels: Callable | None = None):
        self.budget = budget
        self._read_tree = read_tree
        self._corrupt = corrupt
        self.block_labels = block_labels
        # a share of the cap: under a tight cap, all of it let the decoded trees crowd out
        # everything else, and each reservation gave back a tree the next pop decoded again
        self.max_bytes = self.budget.limit // 4 if max_bytes is None else int(max_bytes)
        self.csr = False
        counts = np.asarray(n_nodes, np.int64)
        self.base = np.zeros(len(counts), np.int64)
        if len(counts) > 1:
            self.base[1:] = np.cumsum(counts)[:-1]
        total = int(counts.sum())
        self.fixed = 4 * n_samples + 8 * total
        self.enabled = (holds_data and 2 * self.fixed <= self.max_bytes
                        and self.budget.try_reserve(self.fixed))
        if not self.enabled:
            self.fixed = 0
            total = 0
        self.node_slot = np.full(total, -1, np.int32)
        self.pv_slot = np.full(total, -1, np.int32)
        self.span_slot = np.full(n_samples if self.enabled else 0, -1, np.int32)
        self.loaded = np.zeros(len(counts), bool)
        self.trees: OrderedDict = OrderedDict()  # tree -> (slot, nodes, position, children)
        self.n_nodes = counts
        self._busy = False
        self.misses = 0  # trees decoded
        self._empty_nodes()
        # row slices: the typed list, slots reused through a free list
        self.rows = new_row_list()
        self.slot_stop = np.zeros(0, np.int64)
        self.n_slots = 0
        self.blk_slot = np.full(len(counts), -1, np.int32)
        self.boff = np.asarray(block_offsets, np.int64)
        self._slots: dict = {}
        self._free: list[int] = []
        self.blocks: dict = {}  # tree -> the kernels' arrays of its cached block
        self.label_bytes: dict = {}  # block -> bytes of its mapped labels (block_labels)
        self._row_slots_key = self._row_slots = None
        self.budget.register_evictor(self._evict)

    # ---------------------------------------------------------------- node records
    def _empty_nodes(self):
        self.used = self.pos = 0
        self.arr_bytes = 0
        self.nodes = NodeArrays(self.base, self.node_slot,
                                **{name: np.zeros(0, dtype) for name, dtype
                                   in {**_NODE_DTYPES, **_CHILD_DTYPES}.items()})

    @property
    def nodes(self) -> NodeArrays:
        """The decoded records (:class:`~ooc_learn.index.kernel_args.NodeArrays`)."""
        return self._nodes

    @nodes.setter
    def nodes(self, value: NodeArrays) -> None:
        self._nodes = value
        self.nodes_packed = tuple(value)  # as the kernels take it (see kernel_args)

    @property
    def nbytes(self) -> int:
        return self.fixed + self.arr_bytes

    def __len__(self) -> int:
        return self.used

    def _grow(self, nodes: int, children: int) -> bool:
        """Room for ``nodes`` more node slots and ``children`` more children: capacity
        doubled, or just what is needed when the cap holds no more."""
        n_cap, c_cap = self.nodes.k.shape[0], self.nodes.c_id.shape[0]
        need_n, need_c = self.used + nodes, self.pos + children
        if need_n <= n_cap and need_c <= c_cap:
            return True
        for new_n, new_c in ((max(need_n, 2 * n_cap, 64), max(need_c, 2 * c_cap, 512)),
                             (max(need_n, n_cap), max(need_c, c_cap))):
            nbytes = new_n * NODE_SLOT_BYTES + new_c * CHILD_BYTES
            if self.fixed + nbytes > self.max_bytes:
                continue
            self._busy = True  # the budget's evictors must not take these arrays now
            try:
                ok = self.budget.try_reserve(nbytes)
            finally:
                self._busy = False
            if ok:
                self._resize(new_n, new_c, nbytes)
                return True
        return False

    def _resize(self, new_n: int, new_c: int, nbytes: int) -> None:
        """New arrays of these capacities (``nbytes`` already reserved), contents kept."""
        new = {}
        for names, size in ((_NODE_DTYPES, new_n), (_CHILD_DTYPES, new_c)):
            for name in names:
                old = getattr(self.nodes, name)
                new[name] = np.empty(size, old.dtype)
                keep = min(size, old.shape[0])
                new[name][:keep] = old[:keep]
        self.nodes = self.nodes._replace(**new)
        self.budget.release(self.arr_bytes)
        self.arr_bytes = nbytes

    def reset(self) -> int:
        """Forget every decoded tree; return the bytes given back."""
        freed = self.arr_bytes
        if self.used or freed:
            self.node_slot.fill(-1)
            self.loaded.fill(False)
            self.trees.clear()
            self.budget.release(freed)
            self._empty_nodes()
        return freed

    def _evict(self, need: int) -> int:
        """Give back the trees decoded first until ``need`` bytes are free (the rest moved
        down into smaller arrays); all of them when ``need`` takes that."""
        if self._busy or not self.trees:
            return 0
        drop, freed = [], 0
        for t, (_, sn, _, pn) in self.trees.items():
            drop.append(t)
            freed += sn * NODE_SLOT_BYTES + pn * CHILD_BYTES
            if freed >= need:
                break
        if len(drop) == len(self.trees):
            return self.reset()
        for t in drop:
            del self.trees[t]
            self.node_slot[self.base[t]:self.base[t] + self.n_nodes[t]] = -1
            self.loaded[t] = False
        old = self.nodes
        n_keep = sum(sn for _, sn, _, _ in self.trees.values())
        c_keep = sum(pn for _, _, _, pn in self.trees.values())
        new = {name: np.empty(n_keep, dtype) for name, dtype in _NODE_DTYPES.items()}
        new.update({name: np.empty(c_keep, dtype) for name, dtype in _CHILD_DTYPES.items()})
        ns = ps = 0
        for t, (sa, sn, pa, pn) in list(self.trees.items()):
            for name in _NODE_DTYPES:
                new[name][ns:ns + sn] = getattr(old, name)[sa:sa + sn]
            new["first"][ns:ns + sn] += ps - pa
            for name in _CHILD_DTYPES:
                new[name][ps:ps + pn] = getattr(old, name)[pa:pa + pn]
            seg = self.node_slot[self.base[t]:self.base[t] + self.n_nodes[t]]
            seg[seg >= 0] += ns - sa
            self.trees[t] = (ns, sn, ps, pn)
            ns += sn
            ps += pn
        self.nodes = old._replace(**new)
        self.used, self.pos = ns, ps
        nbytes = ns * NODE_SLOT_BYTES + ps * CHILD_BYTES
        released = self.arr_bytes - nbytes
        self.budget.release(released)
        self.arr_bytes = nbytes
        return released

    def load_tree(self, t: int) -> bool:
        """Decode every node record of tree t; False when the cap holds no room for them."""
        if not self.enabled:
            return False
        if self.loaded[t]:
            return True
        records = self._read_tree(t)
        vids = [v for v, _ in records]
        parts = [raw for _, raw in records]
        lens = np.fromiter((len(p) for p in parts), np.int64, len(parts))
        kids = np.maximum((lens - RECORD_FIXED_BYTES) // RECORD_CHILD_BYTES, 0)
        room = len(parts) * NODE_SLOT_BYTES + int(kids.sum()) * CHILD_BYTES
        if not self._grow(len(parts), int(kids.sum())):
            self._evict(room)  # the trees decoded first make room for this one
            if not self._grow(len(parts), int(kids.sum())):
                return False
        slot0, pos0 = self.used, self.pos
        offs = np.zeros(len(parts) + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        buf = np.frombuffer(b"".join(parts), np.uint8)
        bad, self.used, self.pos = decode_records(
            buf, offs, np.array(vids, np.int64), t, int(self.n_nodes[t]), CRC_TABLE,
            self.used, self.pos, self.nodes_packed)
        if bad >= 0:
            self.node_slot[self.base[t]:self.base[t] + self.n_nodes[t]] = -1
            self.used, self.pos = slot0, pos0
            v = vids[bad]
            try:  # the per-record decoder names what is wrong
                decode_node(parts[bad], t, v)
                problem = f"node {v} of tree {t} is not a valid node record"
            except ValueError as exc:
                problem = str(exc)
            raise self._corrupt(problem)
        self.loaded[t] = True
        self.trees[t] = (slot0, self.used - slot0, pos0, self.pos - pos0)
        self.misses += 1
        return True

    def slot(self, t: int, v: int) -> int:
        """The slot of node v of tree t (its tree decoded first), or −1."""
        if not self.load_tree(t):
            return -1
        return int(self.node_slot[self.base[t] + v]) if 0 <= v < self.n_nodes[t] else -1

    def record(self, ns: int) -> Node:
        nd = self.nodes
        a, k = int(nd.first[ns]), int(nd.k[ns])
        z = a + k
        return Node(int(nd.start[ns]), int(nd.stop[ns]), nd.c_id[a:z].copy(),
                    nd.c_start[a:z].copy(), nd.c_stop[a:z].copy(), nd.c_leaf[a:z].copy(),
                    nd.c_piv[a:z].copy(), nd.c_sq[a:z].copy(), nd.c_rad[a:z].copy(),
                    nd.c_rada[a:z].copy())

    # ---------------------------------------------------------------- row slices
    def row_slots(self, span_rows: float) -> tuple:
        """Where ``bbf_run`` finds the rows at hand (nodes of at most ``span_rows`` rows are
        read whole): :class:`~ooc_learn.index.kernel_args.RowSlots`, packed."""
        # built again only when one of these changed (the cached tuple holds slot_stop, so
        # its id is not reused meanwhile)
        key = (id(self.slot_stop), self.csr, float(span_rows))
        if key != self._row_slots_key:
            self._row_slots_key = key
            self._row_slots = tuple(RowSlots(self.blk_slot, self.boff, self.span_slot,
                                             self.slot_stop, self.pv_slot, self.csr,
                                             float(span_rows)))
        return self._row_slots

    def rows_put(self, key, value) -> None:
        """Listener of the row cache (and of the store's block cache): mirror span,
        pivot-row and block entries."""
        if not self.enabled or key[0] not in ("span", "pivots", "block"):
            return
        if key[0] == "block":
            X, y, _ = value
            if not isinstance(X, np.ndarray) or not 0 <= key[1] < self.blk_slot.shape[0]:
                return  # CSR blocks: the kernels' int64 row pointers would be a copy
            Xd, indptr, indices, data, is_csr = X, EMPTY_PTR, EMPTY_IDX, EMPTY_VAL, False
            if self.block_labels is not None:
                y = np.ascontiguousarray(self.block_labels(y), np.float32)
                # no eviction here: this runs inside the block cache's insert
                if not self.budget.try_reserve(y.nbytes, evict=False):
                    return
                self.label_bytes[key[1]] = y.nbytes
        else:
            (Xd, indptr, indices, data, is_csr), y = value
        if not (Xd.flags.c_contiguous and y.flags.c_contiguous and y.dtype == np.float32
                and Xd.dtype == np.float32 and Xd.ndim == 2 and indptr.dtype == np.int64
                and indices.dtype == np.int32 and data.dtype == np.float32):
            return
        self.csr = bool(is_csr)
        if self._free:
            slot = self._free.pop()
        else:
            slot = self.n_slots
            self.n_slots += 1
        if slot >= self.slot_stop.shape[0]:
            grown = np.zeros(max(64, 2 * self.slot_stop.shape[0]), np.int64)
            grown[:self.slot_stop.shape[0]] = self.slot_stop
            self.slot_stop = grown
        row_list_set(self.rows, slot, Xd, indptr, indices, data, y)
        if key[0] == "span":
            self.span_slot[key[2]] = slot
            self.slot_stop[slot] = key[3]
        elif key[0] == "block":
            self.blk_slot[key[1]] = slot
            self.blocks[key[1]] = ((Xd, indptr, indices, data, False), y)
        else:
            self.pv_slot[self.base[key[1]] + key[2]] = slot
        self._slots[key] = slot

    def first_use(self, t: int, v: int, rows: int, ss: int, se: int) -> int:
        """Rows an entry served from tree t's cached block counts as read (the rule the
        numba loop applies, :func:`~ooc_learn.index._search_kernels.block_first_use`)."""
        return int(block_first_use(self.span_slot, self.pv_slot, int(self.base[t]) + v, rows,
                                   ss, se))

    def rows_drop(self, key, value) -> None:
        """Listener: a mirrored entry left its cache; its slot is emptied and reused."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return
        if key[0] == "span":
            if self.span_slot[key[2]] == slot:
                self.span_slot[key[2]] = -1
        elif key[0] == "block":
            t = key[1]
            self.blk_slot[t] = -1
            self.blocks.pop(t, None)
            self.budget.release(self.label_bytes.pop(t, 0))
            # the block's rows count as read again when next used (see bbf_run)
            for marks, a, z in ((self.span_slot, self.boff[t], self.boff[t + 1]),
                                (self.pv_slot, self.base[t], self.base[t] + self.n_nodes[t])):
                seg = marks[a:z]
                seg[seg == SLOT_COUNTED] = -1
        else:
            self.pv_slot[self.base[key[1]] + key[2]] = -1
        row_list_set(self.rows, slot, EMPTY_X, EMPTY_PTR, EMPTY_IDX, EMPTY_VAL, EMPTY_VAL)
        self._free.append(slot)

    def stats(self) -> dict:
        return {"name": "index nodes", "trees": int(self.loaded.sum()), "nodes": self.used,
                "bytes": self.nbytes, "misses": self.misses, "row_slots": len(self._slots)}

    def forget_rows(self) -> None:
        """Empty every row slot at once (the caches are closing)."""
        self._slots.clear()
        self._free.clear()
        self.blocks.clear()
        self.budget.release(sum(self.label_bytes.values()))
        self.label_bytes.clear()
        self.n_slots = 0
        self.span_slot.fill(-1)
        self.pv_slot.fill(-1)
        self.blk_slot.fill(-1)
        clear_row_list(self.rows)

    def close(self) -> None:
        self.forget_rows()
        self.reset()
        self.budget.unregister_evictor(self._evict)
        self.budget.release(self.fixed)
        self.fixed = 0
        self.enabled = False
