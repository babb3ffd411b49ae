"""The read-only side of a fitted :class:`~.model.SparseRLS` that its cross-validation reads
(:mod:`.holdout_predict`, :mod:`.kfold_predict`, :mod:`.kfold_chol`, :mod:`.loo_predict`):
the fitted factors, and the training rows as rows of K~_B^T, R^T = K~_B^T C^-T and
U = R^T V, cached or formed from X chunk by chunk within the memory budget.

:class:`FittedRLS` is the base class of ``SparseRLS`` and holds no state of its own: it
reads what ``SparseRLS.fit`` sets (the factors ``_C``, ``_V``, ``_AR``, ``_z0``, ``_KyR``,
``_Y``; the basis ``basis_``, ``X_basis_``, ``_sqB``, ``_bsorted``, ``_bsorted_order``,
``delta_``, ``spec``, ``gamma_``; the rows ``_source`` and budget ``_budget``; the row cache
``_ucache``, ``_ucache_is_u``, ``_ucache_bytes``, ``_rt_rows_served``; ``stats_``).

The row cache holds the R^T rows the training pass formed (m x n float64, where the budget
allows); they become U in place, chunk by chunk, the first time more U rows are asked for
than the cache holds (:meth:`FittedRLS.u_rows`) or a pass over all of U is made
(:meth:`FittedRLS.iter_u_chunks`). Without a cache, rows are formed from X and counted as
kernel evaluations.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import numpy as np
import scipy.linalg as la

from ooc_learn.storage.budget import MemoryBudget

from . import _kernels
from .kernel import kernel_block

__all__ = ["FittedRLS"]


class FittedRLS:
    """The fitted factors and training rows of a sparse RLS model, read-only (see the module
    docstring for the attributes ``SparseRLS.fit`` sets that this reads)."""

    @contextmanager
    def row_chunk(self, h: int, per_row: int, cap: int = 0):
        """Rows per chunk for a pass over at most ``h`` rows whose temporaries cost
        ``per_row`` bytes a row, those bytes reserved for the ``with`` block: at most ``cap``
        (default 2^22 / n, 32 MiB per n-wide float64 array), halved until the budget grants
        them, evicting cached blocks first (a pass reads each row once: its chunk's size buys
        more than blocks it reads past; sized by the free budget alone, a cache the fit had
        filled cut the LOO pass at 1g to 4,558-row chunks and 3 s), and at least 16 (a
        BudgetExceededError when even those do not fit)."""
        n = self.basis_.size
        per_row = max(int(per_row), 1)
        step = int(max(1, min(h, cap or max(256, (1 << 22) // n))))
        step = self._budget.reserve_shrinking(step, lambda k: k * per_row, 16,
                                              "sparse RLS row chunk")
        try:
            yield step
        finally:
            self._budget.release(per_row * step)

    # -- rows of K~_B^T and U = K~_B^T Q -------------------------------------------------------
    def basis_hits(self, rows: np.ndarray):
        """(positions in ``rows`` that are basis rows, their basis column)."""
        idx = np.searchsorted(self._bsorted, rows)
        idx = np.minimum(idx, self._bsorted.size - 1)
        hit = self._bsorted[idx] == rows
        return np.flatnonzero(hit), self._bsorted_order[idx[hit]]

    def kernel_rows(self, Xr, rows: np.ndarray) -> np.ndarray:
        """K~(rows, B): the kernel plus the shift delta where a row is itself a basis row."""
        K = kernel_block(Xr, self.X_basis_, self.spec, self.gamma_, sqB=self._sqB)
        pos, bcol = self.basis_hits(rows)
        if pos.size and self.delta_:
            _kernels.add_shift(K, pos.astype(np.int64), bcol.astype(np.int64), self.delta_)
        return K

    def _rt_from_x(self, Xr, rows) -> np.ndarray:
        """R^T rows (K~_rows,B C^-T) computed from the rows, the same way as in fit."""
        K = self.kernel_rows(Xr, rows)
        return la.solve_triangular(self._C, K.T, lower=True, check_finite=False).T

    def _u_from_x(self, Xr, rows) -> np.ndarray:
        """U rows (K~_rows,B C^-T V) computed from the rows, the same way as in fit."""
        return self._rt_from_x(Xr, rows) @ self._V

    def rt_rows(self, rows: np.ndarray) -> np.ndarray:
        """R^T rows (R = C^-1 K~_B) of row positions ``rows``: cached, rotated back from cached
        U rows (U V^T), or formed from X (counted as kernel evaluations)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._ucache is not None:
            return self._ucache[rows] @ self._V.T if self._ucache_is_u else self._ucache[rows]
        RT = self._rt_from_x(self._source.take(rows), rows)
        self.stats_["kernel_evaluations"] = self.stats_.get("kernel_evaluations", 0) + RT.size
        return RT

    def _u_step(self) -> int:
        """Rows per chunk when the cached R^T rows are turned into U (about 16 MB a chunk)."""
        return max(256, (1 << 21) // self.basis_.size)

    def _convert_u_chunks(self):
        """Turn the cached R^T rows into U = R^T V in place, one chunk at a time, yielding each
        converted chunk (start, stop) while it is still in the CPU cache, so that a caller
        (the LOO) does its O(rows n c) work in the same pass. A caller that stops early still
        leaves a fully converted cache (the rest is converted on close)."""
        cache, V = self._ucache, self._V
        m = cache.shape[0]
        step = self._u_step()
        buf = np.empty((min(step, m), V.shape[1]))
        a = 0
        try:
            while a < m:
                b = min(a + step, m)
                out = buf[:b - a]
                np.matmul(cache[a:b], V, out=out)
                cache[a:b] = out
                a, a0 = b, a
                yield a0, b
        finally:
            while a < m:
                b = min(a + step, m)
                cache[a:b] = cache[a:b] @ V
                a = b
            self._ucache_is_u = True

    def _ensure_u_cache(self) -> None:
        if self._ucache is not None and not self._ucache_is_u:
            for _ in self._convert_u_chunks():
                pass

    def u_rows(self, rows: np.ndarray, *, need_x: bool = False):
        """(U rows, X rows or None) for row positions ``rows`` (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._ucache is not None:
            Xr = self._source.take(rows) if need_x else None
            if not self._ucache_is_u and self._rt_rows_served + rows.size <= self._ucache.shape[0]:
                # a few hold-out sets: rotate only their cached R^T rows (O(|H| n^2)); the
                # whole cache is converted (O(m n^2), once) when more than m rows are asked for
                self._rt_rows_served += rows.size
                return self._ucache[rows] @ self._V, Xr
            self._ensure_u_cache()
            return self._ucache[rows], Xr
        Xr = self._source.take(rows)
        U = self._u_from_x(Xr, rows)
        self.stats_["kernel_evaluations"] = self.stats_.get("kernel_evaluations", 0) + U.size
        return U, (Xr if need_x else None)

    def iter_u_chunks(self, extra: int = 0):
        """Yield (start, stop, U rows) covering all rows in order: from the cache (converting
        cached R^T rows to U in the same pass, see :meth:`_convert_u_chunks`), or formed from
        the source's chunks (store blocks) when nothing is cached. ``extra``: bytes a row of
        the caller's own temporaries costs; reserved with the pass's own."""
        n = self.basis_.size
        if self._ucache is None:
            yield from self._iter_formed(self._u_from_x, 8 * 3 * n + extra)
            return
        rows = min(self._u_step(), self._ucache.shape[0])
        held = rows * (extra + (0 if self._ucache_is_u else 8 * n))
        self._budget.reserve(held, "sparse RLS row chunk")
        try:
            if not self._ucache_is_u:
                for a, b in self._convert_u_chunks():
                    yield a, b, self._ucache[a:b]
                return
            yield from self._iter_cached()
        finally:
            self._budget.release(held)

    def iter_rt_chunks(self, per_row: int):
        """Yield (start, stop, R^T rows) covering all rows in order: the cached R^T rows in
        chunks, or formed from the source's chunks; ``per_row`` bytes a row of the caller's
        temporaries reserved for the chunk. Only while the cache holds R^T rows or nothing
        (``row_cache_kind`` "rt" or None)."""
        if self.row_cache_kind == "rt":
            m = self._ucache.shape[0]
            with self.row_chunk(m, per_row, self._u_step()) as step:
                for a in range(0, m, step):
                    yield a, min(a + step, m), self._ucache[a:a + step]
            return
        yield from self._iter_formed(self._rt_from_x, per_row)

    def _iter_cached(self):
        """(start, stop, cached rows) over the whole row cache, in chunks of ``_u_step()``."""
        m, step = self._ucache.shape[0], self._u_step()
        for a in range(0, m, step):
            yield a, min(a + step, m), self._ucache[a:a + step]

    def _iter_formed(self, form, per_row: int = 0):
        """(start, stop, rows) formed by ``form(X, row ids)`` from each chunk of the source
        (store blocks or array slices), kernel evaluations counted. ``per_row``: bytes of
        temporaries a row costs in the caller's loop (reserved; the source's chunks are cut
        further when the free budget holds fewer rows)."""
        for a, b, rows in self._iter_chunks(self._source, per_row, form):
            self.stats_["kernel_evaluations"] = (self.stats_.get("kernel_evaluations", 0)
                                                 + rows.size)
            yield a, b, rows

    def _iter_chunks(self, src, per_row: int, form):
        """(start, stop, form(X rows, row ids)) over the chunks of ``src``, each cut to the
        rows the free budget holds at ``per_row`` bytes a row (reserved while iterating)."""
        m = src.n_samples
        with (self.row_chunk(m, per_row) if per_row else nullcontext(m)) as step:
            for j in range(len(src.offsets) - 1):
                a, b = int(src.offsets[j]), int(src.offsets[j + 1])
                Xc = src.chunk(j)
                for s in range(a, b, step):
                    e = min(s + step, b)
                    yield s, e, form(Xc[s - a:e - a], np.arange(s, e))
                del Xc

    def release_cache(self) -> None:
        """Drop the cached U (or K_B^T) rows and give their bytes back to the budget."""
        if self._ucache is not None:
            self._ucache = None
            self._budget.release(self._ucache_bytes)
            self._ucache_bytes = 0

    # -- the fitted factors, read-only: what the CV modules read -------------------------------
    @property
    def Y_(self) -> np.ndarray:
        """The training labels as an (m, v) matrix."""
        return self._Y

    @property
    def chol_(self) -> np.ndarray:
        """C, the lower Cholesky factor of the shifted K_BB = C C^T (n x n)."""
        return self._C

    @property
    def V_(self) -> np.ndarray:
        """The eigenvectors of A = R R^T (R = C^-1 K~_B), A = V Lam V^T (n x n)."""
        return self._V

    @property
    def A_(self) -> np.ndarray:
        """A = R R^T, the training Gram matrix in R coordinates (n x n)."""
        return self._AR

    @property
    def z0_(self) -> np.ndarray:
        """z0 = Q^T K_B y (n x v)."""
        return self._z0

    @property
    def KyR_(self) -> np.ndarray:
        """C^-1 K_B y, K_B y in R coordinates (n x v)."""
        return self._KyR

    @property
    def source_(self):
        """The training rows (:func:`.source.make_source`)."""
        return self._source

    @property
    def budget_(self) -> MemoryBudget:
        """The memory budget the model's matrices and passes reserve from."""
        return self._budget

    @property
    def fold_grams_(self):
        """``(folds, R_H R_H^T per fold, R_H y_H per fold)`` of the folds given at fit time,
        or None."""
        return getattr(self, "_fold_grams", None)

    @property
    def row_cache_kind(self) -> str | None:
        """What the row cache holds: "u" (rows of U = K~_B^T Q), "rt" (rows of R^T, not yet
        turned into U) or None (nothing: rows are formed from X when asked for)."""
        if self._ucache is None:
            return None
        return "u" if self._ucache_is_u else "rt"

    @property
    def row_cache_(self) -> np.ndarray | None:
        """The cached rows (m x n; see :attr:`row_cache_kind`), None when nothing is cached."""
        return self._ucache

    @property
    def vector_y_(self) -> bool:
        """Whether ``fit`` was given a label vector (predictions are then vectors)."""
        return self._vector_y
