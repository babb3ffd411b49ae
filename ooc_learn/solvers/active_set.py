"""The IBCD active set S: rows held in memory with their dual variables.

Rows are appended as the index returns them and removed only when the outer relaxation
declares them outliers. Storage grows geometrically (dense rows or CSR arrays), and every byte
of capacity is reserved from the run's :class:`MemoryBudget` (IBCD §4.2: S takes its quota
from the caches, whose LRU entries the budget evicts first).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.budget import MemoryBudget

__all__ = ["ActiveSet"]


class ActiveSet:
    """Growable in-memory rows ``X`` (dense float32 or CSR), labels, norms, alphas.

    Parameters
    ----------
    n_features : int
    sparse : bool
        CSR storage (for CSR stores) or dense rows.
    budget : MemoryBudget
        Capacity is reserved here; a growth that does not fit raises
        :class:`~ooc_learn.storage.errors.BudgetExceededError` naming ``--memory``.
    """

    def __init__(self, n_features: int, sparse: bool, budget: MemoryBudget):
        self.d = int(n_features)
        self.sparse = bool(sparse)
        self.budget = budget
        self.m = 0
        self.nnz = 0
        self._reserved = 0
        self._cap_rows = 0
        self._cap_nnz = 0
        self.rows = np.empty(0, np.int64)
        self.y = np.empty(0, np.float64)
        self.sqn = np.empty(0, np.float64)
        self.alpha = np.empty(0, np.float64)
        if self.sparse:
            self.indptr = np.zeros(1, np.int64)
            self.indices = np.empty(0, np.int32)
            self.data = np.empty(0, np.float32)
        else:
            self.Xbuf = np.empty((0, self.d), np.float32)

    # ---- capacity ----------------------------------------------------------------------
    def _bytes_for(self, cap_rows: int, cap_nnz: int) -> int:
        per_row = 8 + 8 + 8 + 8 + (8 if self.sparse else 4 * self.d)
        return cap_rows * per_row + (cap_nnz * 8 if self.sparse else 0)

    def _grow(self, need_rows: int, need_nnz: int) -> None:
        # grow by half: the copy holds old + new, so doubling would need 3x the content
        cap_rows = max(self._cap_rows, 1024)
        while cap_rows < need_rows:
            cap_rows = cap_rows * 3 // 2
        cap_nnz = max(self._cap_nnz, 1 << 14) if self.sparse else 0
        while self.sparse and cap_nnz < need_nnz:
            cap_nnz = cap_nnz * 3 // 2
        if cap_rows == self._cap_rows and cap_nnz == self._cap_nnz:
            return
        new_bytes = self._bytes_for(cap_rows, cap_nnz)
        # old and new buffers coexist during the copy: both are paid for until it ends
        self.budget.reserve(new_bytes, "IBCD active set")

        def grown(a, size):
            out = np.empty((size,) + a.shape[1:], a.dtype)
            out[: len(a)] = a
            return out

        m = self.m
        self.rows = grown(self.rows[:m], cap_rows)
        self.y = grown(self.y[:m], cap_rows)
        self.sqn = grown(self.sqn[:m], cap_rows)
        self.alpha = grown(self.alpha[:m], cap_rows)
        if self.sparse:
            self.indptr = grown(self.indptr[: m + 1], cap_rows + 1)
            self.indices = grown(self.indices[: self.nnz], cap_nnz)
            self.data = grown(self.data[: self.nnz], cap_nnz)
        else:
            self.Xbuf = grown(self.Xbuf[:m], cap_rows)
        self.budget.release(self._reserved)
        self._reserved = new_bytes
        self._cap_rows, self._cap_nnz = cap_rows, cap_nnz

    def fits(self, k: int, nnz: int = 0) -> bool:
        """Whether ``k`` more rows (``nnz`` stored values) fit without exceeding the budget."""
        if self.m + k <= self._cap_rows and (not self.sparse or self.nnz + nnz <= self._cap_nnz):
            return True
        cap_rows = max(self._cap_rows, 1024)
        while cap_rows < self.m + k:
            cap_rows = cap_rows * 3 // 2
        cap_nnz = max(self._cap_nnz, 1 << 14) if self.sparse else 0
        while self.sparse and cap_nnz < self.nnz + nnz:
            cap_nnz = cap_nnz * 3 // 2
        return self._bytes_for(cap_rows, cap_nnz) <= self.budget.available

    # ---- content -----------------------------------------------------------------------
    def add(self, rows, X, y, sqn, alpha=None) -> np.ndarray:
        """Append rows; return their local positions in S."""
        k = len(rows)
        if k == 0:
            return np.empty(0, np.int64)
        add_nnz = int(X.indptr[-1]) if self.sparse else 0
        self._grow(self.m + k, self.nnz + add_nnz)
        a, b = self.m, self.m + k
        self.rows[a:b] = rows
        self.y[a:b] = y
        self.sqn[a:b] = sqn
        self.alpha[a:b] = 0.0 if alpha is None else alpha
        if self.sparse:
            X = sp.csr_matrix(X)
            self.indices[self.nnz:self.nnz + add_nnz] = X.indices
            self.data[self.nnz:self.nnz + add_nnz] = X.data
            self.indptr[a + 1:b + 1] = X.indptr[1:] + self.nnz
            self.nnz += add_nnz
        else:
            self.Xbuf[a:b] = X.toarray() if sp.issparse(X) else X
        self.m = b
        return np.arange(a, b, dtype=np.int64)

    @property
    def X(self):
        """The rows of S as a float32 ndarray view or a CSR matrix over the buffers."""
        if self.sparse:
            return sp.csr_matrix((self.data[: self.nnz], self.indices[: self.nnz],
                                  self.indptr[: self.m + 1]), shape=(self.m, self.d),
                                 copy=False)
        return self.Xbuf[: self.m]

    def view(self):
        """``(X, y, sqn, alpha)`` over the first m rows (alpha is writable, shared)."""
        return self.X, self.y[: self.m], self.sqn[: self.m], self.alpha[: self.m]

    def keep(self, mask: np.ndarray) -> None:
        """Drop the rows where ``mask`` is False (outliers leaving S), compacting in place."""
        keep = np.flatnonzero(mask)
        X = self.X[keep]
        rows, y, sqn, alpha = (self.rows[keep].copy(), self.y[keep].copy(),
                               self.sqn[keep].copy(), self.alpha[keep].copy())
        self.m, self.nnz = 0, 0
        self.add(rows, X, y, sqn, alpha)

    def release(self) -> None:
        self.budget.release(self._reserved)
        self._reserved = 0

    @property
    def nbytes(self) -> int:
        return self._reserved
