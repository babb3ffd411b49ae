"""Where sparse RLS reads its training rows: in-memory arrays or a block Store.

Both sources expose the same small interface: ``n_samples``, ``n_features``, ``offsets`` (row
chunks: fixed-size slices of the arrays, or the store's blocks cut to that size), ``chunk(j)``
-> X rows of chunk j, and ``take(rows)`` -> X rows at arbitrary positions. Labels are held in
memory as an (m, v) float64 matrix (m * v * 8 bytes, reserved from the budget by the model).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.errors import ParameterError

__all__ = ["ArraySource", "StoreSource", "make_source", "as_label_matrix"]


def as_label_matrix(y, m: int, owner: str = "SparseRLS.fit") -> tuple[np.ndarray, bool]:
    """Labels as a finite (m, v) float64 matrix; also whether the input was a vector."""
    y = np.asarray(y)
    if y.ndim not in (1, 2):
        raise ParameterError(
            f"The 'y' parameter of {owner} must be a vector or a matrix (one column per "
            f"output). Got an array with {y.ndim} dimensions instead.")
    if y.shape[0] != m:
        raise ParameterError(
            f"The 'y' parameter of {owner} must have one row per sample ({m}). "
            f"Got {y.shape[0]} instead.")
    try:
        Y = np.asarray(y, dtype=np.float64).reshape(m, -1)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"The 'y' parameter of {owner} must be numeric. {exc}") from None
    if Y.shape[1] == 0:
        raise ParameterError(f"The 'y' parameter of {owner} must have at least one column.")
    bad = ~np.isfinite(Y)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ParameterError(
            f"The 'y' parameter of {owner} must be finite. Got {Y[bad][0]!r} at row {row} "
            f"instead.", "Drop or impute rows with missing labels before fitting.")
    return np.ascontiguousarray(Y), y.ndim == 1


class ArraySource:
    """Rows of an in-memory dense ndarray or CSR matrix, read in slices of ``chunk_rows``."""

    is_store = False

    def __init__(self, X, chunk_rows: int):
        if sp.issparse(X):
            X = sp.csr_matrix(X)
        else:
            X = np.asarray(X)
            if X.ndim != 2:
                raise ParameterError(
                    f"The 'X' parameter of SparseRLS.fit must be a 2-d array, a CSR matrix or "
                    f"a Store. Got an array with {X.ndim} dimensions instead.")
            if not np.issubdtype(X.dtype, np.number):
                raise ParameterError("The 'X' parameter of SparseRLS.fit must be numeric.")
        self.X = X
        self.n_samples, self.n_features = X.shape
        self.offsets = np.append(np.arange(0, self.n_samples, max(1, chunk_rows)),
                                 self.n_samples).astype(np.int64)
        self.rows_read = 0

    def check_finite(self) -> None:
        data = self.X.data if sp.issparse(self.X) else self.X
        if not np.isfinite(data).all():
            raise ParameterError("The 'X' parameter of SparseRLS.fit must be finite.",
                                 "Remove or impute NaN/inf feature values.")

    def chunk(self, j: int):
        a, b = int(self.offsets[j]), int(self.offsets[j + 1])
        self.rows_read += b - a
        return self.X[a:b]

    def take(self, rows):
        rows = np.asarray(rows, dtype=np.int64)
        self.rows_read += rows.size
        return self.X[rows]


class StoreSource:
    """Rows of a :class:`~ooc_learn.storage.store.Store`. Chunks are the store's blocks cut into
    pieces of at most ``chunk_rows`` rows (so the kernel temporaries stay chunk-sized however
    large a block is); ``block_offsets`` keeps the block boundaries (k-fold groups blocks)."""

    is_store = True

    def __init__(self, store, chunk_rows: int):
        self.store = store
        self.n_samples, self.n_features = int(store.n_samples), int(store.n_features)
        self.block_offsets = np.asarray(store.block_offsets, dtype=np.int64)
        bo, step = self.block_offsets, max(1, int(chunk_rows))
        cuts = [np.arange(a, b, step) for a, b in zip(bo[:-1], bo[1:])]
        self.offsets = np.append(np.concatenate(cuts) if cuts else np.empty(0, np.int64),
                                 self.n_samples).astype(np.int64)
        self._block_of = np.searchsorted(bo, self.offsets[:-1], side="right") - 1
        self._held = (-1, None)          # the last block read (its chunks are served from it)
        self._rows_read0 = int(getattr(store, "rows_read", 0))

    @property
    def rows_read(self) -> int:
        return int(getattr(self.store, "rows_read", 0)) - self._rows_read0

    def check_finite(self) -> None:
        """Stores are checked at ingest."""

    def labels(self) -> np.ndarray:
        return np.asarray(self.store.labels(), dtype=np.float64)

    def chunk(self, j: int):
        blk = int(self._block_of[j])
        if self._held[0] != blk:
            self._held = (-1, None)
            X, _, _ = self.store.read_block(blk)
            self._held = (blk, X)
        a0 = int(self.block_offsets[blk])
        a, b = int(self.offsets[j]) - a0, int(self.offsets[j + 1]) - a0
        X = self._held[1]
        if j + 2 >= len(self.offsets) or self._block_of[j + 1] != blk:
            self._held = (-1, None)      # the block's last chunk: let the block go
        return X[a:b]

    def take(self, rows):
        X, _, _ = self.store.gather(np.asarray(rows, dtype=np.int64))
        return X


def make_source(X, chunk_rows: int):
    """An :class:`ArraySource` or :class:`StoreSource` for ``X``."""
    if hasattr(X, "iter_blocks") and hasattr(X, "block_offsets"):
        return StoreSource(X, chunk_rows)
    return ArraySource(X, chunk_rows)
