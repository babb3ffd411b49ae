"""The rows a query returns with their values: the buffers the search copies them into.

A query asked for its rows' values (``Forest.query(..., with_rows=True)``) copies each row
as the search verifies it, from the arrays it verified it in (a leaf's rows, a node's pivot
rows), with its label and squared norm: the caller (IBCD's active set) reads nothing again.
:class:`RowBuffer` holds the buffers (the kernels'
:class:`~ooc_learn.index.kernel_args.Values`), grows them as the search asks, paid from the
budget while the search fills them, and hands the rows back as :class:`Found`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.arrays import kernel_args

from ._row_kernels import row_sqnorm
from .kernel_args import Values
from .tree import EMPTY_IDX, EMPTY_PTR, EMPTY_VAL, EMPTY_X

__all__ = ["Found", "RowBuffer"]

# rows the buffers start with (they double as the search asks, up to the rows wanted)
FIRST_ROWS = 1024
_NO_F64 = np.zeros(0, np.float64)


class Found(NamedTuple):
    """A query's rows with their values (``Forest.query(..., with_rows=True)``)."""

    rows: np.ndarray      #: int64 (k,): store rows, in the order found
    n_examined: int       #: rows examined (as ``query`` returns it)
    X: object             #: float32 ndarray (k, d), or CSR (k, d) for a CSR store
    y: np.ndarray         #: float32 (k,): labels as the search read them (a view's)
    sqnorm: np.ndarray    #: float64 (k,): ‖x‖², summed as the solvers' ``row_sqnorms`` does


class RowBuffer:
    """The buffers one query copies its rows' values into, paid from ``budget`` until
    :meth:`release` (the rows handed back are the caller's to pay for).

    :meth:`values` is the kernels' :class:`~ooc_learn.index.kernel_args.Values` bundle;
    :meth:`room` grows the buffers (new arrays, the rows copied so far kept) so that they hold
    some more rows, in the layout of the first rows the search serves; :meth:`found` hands
    the rows back. With ``soft`` a growth the cap cannot hold is refused (the search stops
    there) instead of raising the ``--memory`` error.
    """

    def __init__(self, budget, n_features: int, limit: int, soft: bool = False):
        self.budget, self.soft = budget, soft
        self.d, self.limit = int(n_features), int(limit)
        self.csr = None  # the layout, learned from the first rows the search serves
        self.reserved = 0
        self.out_X, self.out_ptr, self.out_ind, self.out_dat = (EMPTY_X, EMPTY_PTR,
                                                                EMPTY_IDX, EMPTY_VAL)
        self.out_y, self.out_sqn = EMPTY_VAL, _NO_F64
        self._packed = None

    def values(self) -> tuple:
        """The buffers as the kernels take them (:class:`~ooc_learn.index.kernel_args.Values`,
        packed)."""
        if self._packed is None:
            self._packed = tuple(Values(self.out_X, self.out_ptr, self.out_ind, self.out_dat,
                                        self.out_y, self.out_sqn))
        return self._packed

    def skip(self, r: int) -> None:
        """Row r was returned without its values (read after the search): an empty row."""
        if self.csr:
            self.out_ptr[r + 1] = self.out_ptr[r]

    def room(self, n: int, rows: int, nnz: int = 0, csr: bool | None = None) -> bool:
        """Room for ``rows`` more rows (``nnz`` more stored values, CSR) after the ``n``
        copied, in the layout ``csr`` of the rows at hand (None: as known); False when a
        soft budget refused it (the search stops there). Growth replaces the buffers: take
        :meth:`values` again."""
        if self.csr is None:
            if csr is None:  # nothing served yet: no row can be returned either
                return True
            self.csr = bool(csr)
        cap, ncap = self.out_y.shape[0], self.out_dat.shape[0]
        need = n + rows
        need_nnz = int(self.out_ptr[n]) + nnz if self.csr else 0
        if cap and need <= cap and need_nnz <= ncap:
            return True
        if need > cap or not cap:
            cap = max(need, min(self.limit, max(2 * cap, FIRST_ROWS)))
        if self.csr and (need_nnz > ncap or not ncap):
            # at first as many stored values a row as the rows at hand have
            ncap = max(need_nnz, 2 * ncap, -(-cap * nnz // max(1, rows)))
        return self._alloc(n, cap, ncap if self.csr else 0)

    def _alloc(self, n: int, rows: int, nnz: int) -> bool:
        """New buffers of ``rows`` rows (``nnz`` stored values), the first ``n`` copied."""
        nbytes = rows * (4 * (0 if self.csr else self.d) + 4 + 8 + (8 if self.csr else 0)) \
            + 8 * nnz
        if self.soft:
            if not self.budget.try_reserve(nbytes):
                return False
        else:
            self.budget.reserve(nbytes, "index query's rows", hint="or ask for fewer rows (n)")
        X = np.empty((0, 0) if self.csr else (rows, self.d), np.float32)
        ptr = np.zeros(rows + 1 if self.csr else 1, np.int64)
        ind, dat = np.empty(nnz, np.int32), np.empty(nnz, np.float32)
        yv, sqn = np.empty(rows, np.float32), np.full(rows, -1.0)
        if n:
            yv[:n], sqn[:n] = self.out_y[:n], self.out_sqn[:n]
            if self.csr:
                z = int(self.out_ptr[n])
                ptr[:n + 1] = self.out_ptr[:n + 1]
                ind[:z], dat[:z] = self.out_ind[:z], self.out_dat[:z]
            else:
                X[:n] = self.out_X[:n]
        self.out_X, self.out_ptr, self.out_ind, self.out_dat = X, ptr, ind, dat
        self.out_y, self.out_sqn = yv, sqn
        self._packed = None
        self.budget.release(self.reserved)
        self.reserved = nbytes
        return True

    def release(self) -> None:
        """Give the buffers' bytes back to the budget (the query is over)."""
        self.budget.release(self.reserved)
        self.reserved = 0

    def found(self, rows: np.ndarray, n_examined: int, read_rows) -> Found:
        """The ``rows`` returned (``len(rows)`` copied) as :class:`Found`. Rows whose values
        the search did not have at hand (pivots examined as their partition was reached)
        are read with ``read_rows(rows) -> (X, y)`` first."""
        k = rows.shape[0]
        missing = np.flatnonzero(self.out_sqn[:k] < 0)
        if self.csr:
            z = int(self.out_ptr[k])
            X = sp.csr_matrix((self.out_dat[:z], self.out_ind[:z], self.out_ptr[:k + 1]),
                              shape=(k, self.d))
        else:
            X = self.out_X[:k] if self.csr is False else np.empty((0, self.d), np.float32)
        if missing.size:
            Xm, ym = read_rows(rows[missing])
            self.out_y[missing] = ym
            arrays = kernel_args(Xm)
            self.out_sqn[missing] = [row_sqnorm(*arrays, i) for i in range(missing.size)]
            if self.csr:  # the rows read take their places between the copied ones
                perm = np.arange(k)
                perm[missing] = k + np.arange(missing.size)
                X = sp.vstack([X, sp.csr_matrix(Xm)], format="csr")[perm]
            else:
                X[missing] = Xm
        return Found(rows, int(n_examined), X, self.out_y[:k], self.out_sqn[:k])
