"""Where IBCD's index reads its rows, and the squared norms of rows joining S."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ooc_learn.storage.arrays import kernel_args

from .. import _kernels as K

__all__ = ["RowSource", "row_sqn"]


class RowSource:
    """The reader IBCD's forest reads its rows through (§4.2): from the store's block cache
    when the block is cached, else the rows wanted alone. The rows a query returns come with
    their values (``Forest.query(..., with_rows=True)``): nothing is fetched again.

    Neither loads a block whole where the cap would allow it (``Store.reads_whole_block``):
    a query wants a few leaves of a block, and the forest caches the leaves it read; loading
    whole blocks made every run read the store once whatever it needed. The scan check
    still reads whole blocks through the cache.
    """

    def __init__(self, store):
        self.store = store
        self.offsets = np.asarray(store.block_offsets, dtype=np.int64)

    def open_forest(self):
        from ooc_learn.index.forest import Forest, view_labels
        from ooc_learn.storage.format import INDEX_DIR

        st = self.store
        st.require_index()
        return Forest(Path(st.path) / INDEX_DIR, read_range=self.read_range,
                      n_samples=st.n_samples, n_features=st.n_features,
                      block_offsets=st.block_offsets, budget=st.budget, name=str(st.path),
                      read_rows=self.read_rows, block_cache=st.block_cache,
                      block_labels=view_labels(st),
                      will_need=st.read_ahead)

    def read_range(self, start: int, stop: int):
        b = int(np.searchsorted(self.offsets, start, side="right") - 1)
        if (0 <= b < len(self.offsets) - 1 and stop <= self.offsets[b + 1]
                and self.store.block_is_cached(b)):
            X, y, ids = self.store.read_block(b)
            lo = int(self.offsets[b])
            return X[start - lo:stop - lo], y[start - lo:stop - lo], ids[start - lo:stop - lo]
        return self.store.read_range(start, stop, ids=False)  # the index needs no ids

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


def row_sqn(X) -> np.ndarray:
    """Squared row norms for the active set, accumulated in float64 by the solvers' kernel
    (no float64 copy of X)."""
    return K.row_sqnorms(*kernel_args(X), X.shape[0])
