"""Where IBCD's rows come from: one reader for the index's leaf reads and S's row fetches."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ooc_learn.storage.arrays import matrix_nbytes

from .. import _kernels as K
from .._common import kernel_args, rows_in_order

__all__ = ["RowSource", "row_sqn"]


class RowSource:
    """One reader for the index's leaf reads and the active set's row fetches (§4.2).

    The forest IBCD queries reads its leaves through :meth:`read_range`: from the store's
    block cache when the block is cached, else as a range read that is also remembered (bytes
    paid from the budget, never evicting) until the next :meth:`fetch`. :meth:`fetch` then
    takes the rows a query returned from those cached blocks and remembered leaves, so a row
    the index just read is not read again; only rows of leaves the forest had cached earlier
    are gathered, as runs (``whole_blocks=False``).

    Neither loads a block whole where the cap would allow it (``Store.reads_whole_block``):
    a query wants a few leaves of a block, and the forest caches the leaves it read; loading
    whole blocks made every run read the store once whatever it needed. The scan check
    still reads whole blocks through the cache.
    """

    def __init__(self, store, memo_share: int = 8):
        self.store = store
        self.memo_share = int(memo_share)
        self.offsets = np.asarray(store.block_offsets, dtype=np.int64)
        self._memo: dict = {}  # start -> (stop, X, y) of leaves read since the last fetch
        self._memo_bytes = 0

    def open_forest(self):
        from ooc_learn.index.forest import Forest, view_labels
        from ooc_learn.storage.format import INDEX_DIR

        st = self.store
        st.require_index()
        return Forest(Path(st.path) / INDEX_DIR, read_range=self.read_range,
                      n_samples=st.n_samples, n_features=st.n_features,
                      block_offsets=st.block_offsets, budget=st.budget, name=str(st.path),
                      read_rows=self.read_rows, block_cache=st.block_cache,
                      block_labels=view_labels(st))

    def read_range(self, start: int, stop: int):
        b = int(np.searchsorted(self.offsets, start, side="right") - 1)
        if (0 <= b < len(self.offsets) - 1 and stop <= self.offsets[b + 1]
                and self.store.block_is_cached(b)):
            X, y, ids = self.store.read_block(b)
            lo = int(self.offsets[b])
            return X[start - lo:stop - lo], y[start - lo:stop - lo], ids[start - lo:stop - lo]
        X, y, ids = self.store.read_range(start, stop, ids=False)  # the index needs no ids
        nb = matrix_nbytes(X) + y.nbytes
        # remembered only within a share of the cap: a long search must not starve the rest
        if (self._memo_bytes + nb <= self.store.budget.limit // self.memo_share
                and self.store.budget.try_reserve(nb, evict=False)):
            self._memo[int(start)] = (int(stop), X, y)
            self._memo_bytes += nb
        return X, y, ids

    def read_rows(self, rows):
        """Sorted scattered rows (a node's pivot rows): from the block cache when their block
        is cached, else one direct read each."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size:
            b = int(np.searchsorted(self.offsets, rows[0], side="right") - 1)
            if rows[-1] < self.offsets[b + 1] and self.store.block_is_cached(b):
                X, y, _ = self.store.read_block(b)
                return X[rows - self.offsets[b]], y[rows - self.offsets[b]]
        return self.store.read_rows(rows)

    def clear(self) -> None:
        self._memo.clear()
        self.store.budget.release(self._memo_bytes)
        self._memo_bytes = 0

    def fetch(self, rows):
        """``(X, y)`` of store rows, in the order given; reads only what is not at hand."""
        rows = np.asarray(rows, dtype=np.int64)
        parts = []  # (positions in rows, X, y)
        left = np.ones(rows.size, bool)
        blocks = np.searchsorted(self.offsets, rows, side="right") - 1
        order = np.argsort(blocks, kind="stable")
        ub, first = np.unique(blocks[order], return_index=True)
        for b, a, z in zip(ub, first, np.r_[first[1:], rows.size]):
            if not self.store.block_is_cached(int(b)):
                continue
            pos = order[a:z]
            X, y, _ = self.store.read_block(int(b))
            local = rows[pos] - self.offsets[b]
            parts.append((pos, X[local], y[local]))
            left[pos] = False
        if self._memo and left.any():
            starts = np.fromiter(self._memo.keys(), np.int64, len(self._memo))
            starts.sort()
            stops = np.array([self._memo[int(a)][0] for a in starts], np.int64)
            pos = np.flatnonzero(left)
            i = np.searchsorted(starts, rows[pos], side="right") - 1
            hit = (i >= 0) & (rows[pos] < stops[np.maximum(i, 0)])
            for j in np.unique(i[hit]):
                sel = pos[hit & (i == j)]
                _, X, y = self._memo[int(starts[j])]
                local = rows[sel] - starts[j]
                parts.append((sel, X[local], y[local]))
                left[sel] = False
        self.clear()
        if left.any():
            pos = np.flatnonzero(left)
            X, y, _ = self.store.gather(rows[pos], whole_blocks=False)
            parts.append((pos, X, y))
        if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(rows.size)):
            return parts[0][1], parts[0][2]
        return rows_in_order(parts, rows.size)


def row_sqn(X) -> np.ndarray:
    """Squared row norms for the active set, accumulated in float64 by the solvers' kernel
    (no float64 copy of X)."""
    return K.row_sqnorms(*kernel_args(X), X.shape[0])
