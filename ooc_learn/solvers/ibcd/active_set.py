"""The IBCD active set S: rows held for the solver with their dual variables (IBCD §4.2).

Rows are appended as the index returns them and removed when the outer relaxation declares
them outliers (or, under a tight cap, when their alpha is 0). Every byte is reserved from the
run's :class:`MemoryBudget`; S takes its quota from the LRU caches (the budget evicts their
entries first) up to ``resident_share`` of the cap, which leaves the caches a floor (the
paper's threshold m_LRU). Past that, S **spills**: its rows move to a file on disk and only
the per-row state (row id, label, norm, alpha: 32 bytes, plus 8 for CSR offsets) stays in
memory; the solver then reads S back in windows as it traverses it (the cyclic reader's next
rows, the sweeps of problem (13), the outlier check), each window a single contiguous read.

Storage grows geometrically (dense rows or CSR arrays); the spill file is written append-only
(rows in S order; a coded store's rows as its value codes, ``RowCodes``) and rewritten by
:meth:`ActiveSet.keep`. It lives in a private temporary
directory that :meth:`ActiveSet.release` removes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from numba import njit

from ooc_learn.storage.budget import MemoryBudget, format_size
from ooc_learn.storage.errors import BudgetExceededError
from ooc_learn.storage.value_codes import RowCodes

from .config import IBCDConfig

__all__ = ["ActiveSet"]

# spill folders are named SPILL_PREFIX + the owner's pid + "-" + a random part
SPILL_PREFIX = ".ooc-ibcd-spill-"
# per-row state kept in memory: row id, label, norm, alpha (8 bytes each), CSR offset (8)
STATE_BYTES = 40


class ActiveSet:
    """Growable rows ``X`` (dense float32 or CSR), labels, norms, alphas; spills to disk.

    Parameters
    ----------
    n_features : int
    sparse : bool
        CSR storage (for CSR stores) or dense rows.
    budget : MemoryBudget
        Capacity is reserved here; per-row state that does not fit even after spilling raises
        :class:`~ooc_learn.storage.errors.BudgetExceededError` naming ``--memory``.
    spill_dir : path, optional
        Where the spill file's temporary directory is made (default: the system's temporary
        directory). ``None`` with ``can_spill=False`` never spills.
    resident_share : float, optional
        The share of the cap S may hold in memory before spilling (default
        ``IBCDConfig.resident_share``).
    """

    def __init__(self, n_features: int, sparse: bool, budget: MemoryBudget, *,
                 spill_dir=None, can_spill: bool = True,
                 resident_share: float | None = None, value_table=None):
        self.d = int(n_features)
        self.sparse = bool(sparse)
        self.budget = budget
        # a coded store's rows spill as its value codes (a quarter of the bytes for uint8),
        # through a buffer paid for while S lives
        self._codes = None
        if value_table is not None and not self.sparse:
            budget.reserve(RowCodes.PIECE, "IBCD active-set spill codes")
            self._codes = RowCodes(value_table)
        self.m = 0
        self.nnz = 0
        self._reserved = 0
        self._cap_rows = 0
        self._cap_nnz = 0
        self.rows = np.empty(0, np.int64)
        self.y = np.empty(0, np.float64)
        self.sqn = np.empty(0, np.float64)
        self.alpha = np.empty(0, np.float64)
        self.indptr = np.zeros(1, np.int64)
        if self.sparse:
            self.indices = np.empty(0, np.int32)
            self.data = np.empty(0, np.float32)
        else:
            self.Xbuf = np.empty((0, self.d), np.float32)
        self.can_spill = bool(can_spill)
        self.spill_dir = spill_dir
        self.resident_share = float(IBCDConfig.resident_share if resident_share is None
                                    else resident_share)
        self.spilled = False
        self._dir: Path | None = None
        self.spills = 0            #: times S moved to disk
        self.rows_spilled = 0      #: rows written to the spill file
        self.rows_read_back = 0    #: rows read back from it

    # ---- capacity ----------------------------------------------------------------------
    def _bytes_for(self, cap_rows: int, cap_nnz: int, spilled: bool | None = None) -> int:
        """Bytes held in memory for these capacities: the per-row state (row id, label, norm,
        alpha, CSR offset) and, while resident, the rows themselves."""
        spilled = self.spilled if spilled is None else spilled
        if spilled:
            return cap_rows * STATE_BYTES
        if self.sparse:
            return cap_rows * STATE_BYTES + cap_nnz * 8
        return cap_rows * (STATE_BYTES + 4 * self.d)

    def _caps_for(self, need_rows: int, need_nnz: int) -> tuple[int, int]:
        # grow by half: the copy holds old + new, so doubling would need 3x the content;
        # from at least 1024 rows, or what 1/8 of the cap holds where that is fewer (under
        # a small cap, 1024 rows would leave the check that follows no room for its rows)
        floor = min(1024, self.budget.limit // 8 // max(1, self._bytes_for(1, 0)))
        cap_rows = max(self._cap_rows, floor, 1)
        while cap_rows < need_rows:
            cap_rows = cap_rows * 3 // 2
        cap_nnz = 0
        if self.sparse and not self.spilled:
            cap_nnz = max(self._cap_nnz, 1 << 14)
            while cap_nnz < need_nnz:
                cap_nnz = cap_nnz * 3 // 2
        if (not self.spilled and self._bytes_for(cap_rows, cap_nnz)
                > self.resident_share * self.budget.limit):
            # near the share, grow to the need (+1/16) rather than by half
            cap_rows = max(need_rows, min(cap_rows, need_rows + need_rows // 16))
            if self.sparse:
                cap_nnz = max(need_nnz, min(cap_nnz, need_nnz + need_nnz // 16))
        return cap_rows, cap_nnz

    def _growth(self, cap_rows: int, cap_nnz: int):
        """How S grows to these capacities: (arrays to copy as (name, new size, items kept),
        bytes held after, largest old array). One array at a time, each old buffer dropped
        once copied: at any moment the new arrays plus at most one old one are held (new >=
        old for each), so the grown S and its largest old array are paid for until the copy
        ends (all of old and new at once can fail a cap that the grown state fits)."""
        m = self.m
        plan = [(name, cap_rows, m) for name in ("rows", "y", "sqn", "alpha")]
        plan.append(("indptr", cap_rows + 1, m + 1))
        if self.sparse and not self.spilled:
            plan += [("indices", cap_nnz, self.nnz), ("data", cap_nnz, self.nnz)]
        elif not self.sparse and not self.spilled:
            plan.append(("Xbuf", cap_rows, m))
        largest_old = max(getattr(self, name).nbytes for name, _, _ in plan)
        return plan, self._bytes_for(cap_rows, cap_nnz), largest_old

    def _grow(self, need_rows: int, need_nnz: int) -> None:
        if need_rows <= self._cap_rows and (not self.sparse or self.spilled
                                            or need_nnz <= self._cap_nnz):
            # S holds them already (as ``fits`` says): near its share, _caps_for would
            # give a capacity below the current one, a reallocation fits never paid for
            return
        cap_rows, cap_nnz = self._caps_for(need_rows, need_nnz)
        if cap_rows == self._cap_rows and cap_nnz == self._cap_nnz:
            return
        plan, new_bytes, largest_old = self._growth(cap_rows, cap_nnz)
        if not self.spilled and self.can_spill and not self.budget.try_reserve(
                new_bytes + largest_old - self._reserved):
            # ``fits`` said yes a moment ago, but what it counted on is held now (the lesson
            # of a new RSS reading, a buffer of the step): spill rather than stop (§4.2)
            self.spill()
            return self._grow(need_rows, need_nnz)
        if self.spilled or not self.can_spill:
            self.budget.reserve(new_bytes + largest_old - self._reserved, "IBCD active set")
        for name, size, keep in plan:
            old = getattr(self, name)
            out = np.empty((size,) + old.shape[1:], old.dtype)
            out[:keep] = old[:keep]
            setattr(self, name, out)
            del old
        self.budget.release(largest_old)
        self._reserved = new_bytes
        self._cap_rows, self._cap_nnz = cap_rows, cap_nnz

    def fits(self, k: int, nnz: int = 0) -> bool:
        """Whether ``k`` more rows (``nnz`` stored values) fit without spilling: within S's
        resident share of the cap and within the budget once cache entries are evicted."""
        if self.m + k <= self._cap_rows and (not self.sparse or self.spilled
                                             or self.nnz + nnz <= self._cap_nnz):
            return True
        _, new, largest_old = self._growth(*self._caps_for(self.m + k, self.nnz + nnz))
        if not self.spilled and new > self.resident_share * self.budget.limit:
            return False
        # what the growth reserves (see _growth); S takes its quota from the caches: a trial
        # reservation evicts their LRU entries
        extra = new + largest_old - self._reserved
        if not self.budget.try_reserve(extra):
            return False
        self.budget.release(extra)
        return True

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
            self.indptr[a + 1:b + 1] = X.indptr[1:] + self.nnz
            if self.spilled:
                self._append_file(X)
            else:
                self.indices[self.nnz:self.nnz + add_nnz] = X.indices
                self.data[self.nnz:self.nnz + add_nnz] = X.data
            self.nnz += add_nnz
        else:
            X = X.toarray() if sp.issparse(X) else X
            if self.spilled:
                self._append_file(X)
            else:
                self.Xbuf[a:b] = X
        self.m = b
        return np.arange(a, b, dtype=np.int64)

    @property
    def X(self):
        """The rows of S as a float32 ndarray view or a CSR matrix over the buffers (only
        while S is resident: a spilled S is read with :meth:`take` and :meth:`windows`)."""
        if self.spilled:
            raise RuntimeError("the active set is spilled to disk; read it with take() or "
                               "windows()")
        if self.sparse:
            return sp.csr_matrix((self.data[: self.nnz], self.indices[: self.nnz],
                                  self.indptr[: self.m + 1]), shape=(self.m, self.d),
                                 copy=False)
        return self.Xbuf[: self.m]

    def view(self):
        """``(X, y, sqn, alpha)`` over the first m rows (alpha is writable, shared)."""
        return self.X, self.y[: self.m], self.sqn[: self.m], self.alpha[: self.m]

    def state(self):
        """``(y, sqn, alpha)`` over the first m rows, resident or not (alpha writable)."""
        return self.y[: self.m], self.sqn[: self.m], self.alpha[: self.m]

    # ---- reading (resident or spilled) ---------------------------------------------------
    def read(self, a: int, b: int):
        """The rows ``a:b`` of S (a view when resident; one file read when spilled)."""
        if not self.spilled:
            return self.X[a:b]
        self.rows_read_back += b - a
        return _read_file(self._dir, self.sparse, self.d, self.indptr, a, b, self._codes)

    def take(self, pos: np.ndarray):
        """The rows at positions ``pos`` of S (a copy), reading contiguous runs."""
        pos = np.asarray(pos, dtype=np.int64)
        if not self.spilled:
            return self.X[pos]
        if pos.size == 0:
            return self.read(0, 0)
        order = np.argsort(pos, kind="stable")
        sp_ = pos[order]
        runs = np.split(np.arange(sp_.size), np.flatnonzero(np.diff(sp_) > 1) + 1)
        if self.sparse:
            parts = [None] * len(runs)
            for j, run in enumerate(runs):
                parts[j] = self.read(int(sp_[run[0]]), int(sp_[run[-1]]) + 1)
            inv = np.empty_like(order)
            inv[order] = np.arange(order.size)
            return sp.vstack(parts, format="csr")[inv]
        # dense: each run is read straight into its rows of the output (no concatenation)
        out = np.empty((pos.size, self.d), np.float32)
        for run in runs:
            out[order[run]] = self.read(int(sp_[run[0]]), int(sp_[run[-1]]) + 1)
        return out

    def bytes_of(self, pos: np.ndarray) -> int:
        """Bytes the rows at ``pos`` take in memory (what :meth:`take` allocates)."""
        pos = np.asarray(pos, dtype=np.int64)
        if self.sparse:
            return int(8 * (self.indptr[pos + 1] - self.indptr[pos]).sum() + 8 * pos.size)
        return 4 * self.d * int(pos.size)

    def window_rows(self) -> int:
        """Rows per traversal window: a sixth of the cap (a spilled S holds only its per-row
        state, so the caches keep most of the rest), less when little of the cap is free."""
        per_row = 4 * self.d if not self.sparse else max(8, 8 * self.nnz // max(self.m, 1))
        # under a very small cap the per-row state may hold much of it: take what is free
        share = min(self.budget.limit // 6, max(self.budget.available // 3,
                                                self.budget.limit // 32))
        return int(max(16, share // max(per_row, 1)))

    def windows(self):
        """Yield ``(a, b, X)`` covering S in order: one piece when resident, windows of
        :meth:`window_rows` rows (each reserved while in use) when spilled."""
        if not self.spilled:
            yield 0, self.m, self.X
            return
        step = self.window_rows()
        for a in range(0, self.m, step):
            b = min(self.m, a + step)
            nb = _range_bytes(self.sparse, self.d, self.indptr, a, b)
            with self.budget.reservation(nb, "IBCD active-set window"):
                yield a, b, self.read(a, b)

    # ---- spilling ----------------------------------------------------------------------
    def spill(self) -> None:
        """Move the rows of S to a file on disk; keep only the per-row state in memory."""
        if self.spilled:
            return
        if not self.can_spill:
            raise BudgetExceededError(
                f"The IBCD active set ({self.m} rows, {format_size(self._reserved)}) does "
                f"not fit the {format_size(self.budget.cap)} memory cap.",
                "Raise --memory (or OOC_MEMORY), or allow spilling to disk.")
        base = self.spill_dir if self.spill_dir is not None else tempfile.gettempdir()
        try:
            self._dir = self._new_folder(base)
        except OSError as exc:
            raise BudgetExceededError(
                f"The IBCD active set must spill to disk but {base} is not writable "
                f"({exc.strerror}).", "Pass a writable --spill-dir, or raise --memory.") from exc
        self._append_file(self.X)
        # from now on only the per-row state is held (its arrays keep their capacity)
        self.spilled = True
        self.Xbuf = np.empty((0, self.d), np.float32)
        self.indices = np.empty(0, np.int32)
        self.data = np.empty(0, np.float32)
        self._cap_nnz = 0
        self.budget.release(self._reserved)
        self._reserved = self._bytes_for(self._cap_rows, 0)
        self.budget.reserve(self._reserved, "IBCD active set")
        self.spills += 1

    def _new_folder(self, base) -> Path:
        """A private spill folder under ``base`` (named after this process) with empty row
        files; the folders of runs whose process is gone (a killed run cannot remove its
        own) are removed first."""
        from ooc_learn.storage.resources import remove_dead_owned

        remove_dead_owned(base, SPILL_PREFIX)
        folder = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=base))
        for name in (("data.bin", "indices.bin") if self.sparse else ("X.bin",)):
            (folder / name).touch()
        return folder

    def _append_file(self, X) -> None:
        if self.sparse:
            X = sp.csr_matrix(X)
            with open(self._dir / "data.bin", "ab") as f:
                np.ascontiguousarray(X.data, np.float32).tofile(f)
            with open(self._dir / "indices.bin", "ab") as f:
                np.ascontiguousarray(X.indices, np.int32).tofile(f)
        else:
            with open(self._dir / "X.bin", "ab") as f:
                if self._codes is not None:
                    self._codes.write(X, f)
                else:
                    np.ascontiguousarray(X, np.float32).tofile(f)
        self.rows_spilled += X.shape[0]

    # ---- removal -----------------------------------------------------------------------
    def keep(self, mask: np.ndarray) -> None:
        """Drop the rows where ``mask`` is False, compacting in place (a spilled S is
        rewritten window by window, and comes back into memory when it fits again)."""
        keep = np.flatnonzero(mask)
        rows, y, sqn, alpha = (self.rows[keep].copy(), self.y[keep].copy(),
                               self.sqn[keep].copy(), self.alpha[keep].copy())
        if not self.spilled:
            # rows move forward inside the buffers: no copy of S (it would be unpaid for,
            # and as large as S's share of the cap)
            k = keep.size
            if self.sparse:
                self.nnz = int(compact_csr(self.indptr, self.indices, self.data, keep))
            else:
                compact_dense(self.Xbuf, keep)
            self.rows[:k], self.y[:k], self.sqn[:k], self.alpha[:k] = rows, y, sqn, alpha
            self.m = k
            return
        old, indptr_old, m_old = self._dir, self.indptr[: self.m + 1].copy(), self.m
        step = self.window_rows()
        self._dir = self._new_folder(old.parent)
        self.m, self.nnz = 0, 0
        for a in range(0, m_old, step):
            b = min(m_old, a + step)
            sel = keep[(keep >= a) & (keep < b)]
            if sel.size == 0:
                continue
            nb = _range_bytes(self.sparse, self.d, indptr_old, a, b)
            with self.budget.reservation(2 * nb, "IBCD active-set window"):
                X = _read_file(old, self.sparse, self.d, indptr_old, a, b,
                               self._codes)[sel - a]
                self.rows_read_back += b - a
                i = np.searchsorted(keep, sel)
                self.add(rows[i], X, y[i], sqn[i], alpha[i])
        shutil.rmtree(old, ignore_errors=True)
        self._maybe_return()

    def _maybe_return(self) -> None:
        """Bring a spilled S back into memory when it fits within half its resident share."""
        need = self._bytes_for(self.m, self.nnz, spilled=False)
        if need > 0.5 * self.resident_share * self.budget.limit:
            return
        # S takes its quota from the caches: a reservation evicts their LRU entries. The rows
        # read back are held beside the buffers they are copied into: both are paid for (the
        # read was not; a 1g run's RSS passed its account by up to a whole S there)
        if not self.budget.try_reserve(2 * need + self._reserved):
            return
        self.budget.release(need + self._reserved)
        try:
            X = self.read(0, self.m)
            rows, y, sqn, alpha = (self.rows[: self.m].copy(), self.y[: self.m].copy(),
                                   self.sqn[: self.m].copy(), self.alpha[: self.m].copy())
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self.spilled = False
            self.budget.release(self._reserved)
            self._reserved, self._cap_rows, self._cap_nnz = 0, 0, 0
            self.m, self.nnz = 0, 0
            self.add(rows, X, y, sqn, alpha)
            del X
        finally:
            self.budget.release(need)

    def release(self) -> None:
        self.budget.release(self._reserved)
        self._reserved = 0
        if self._codes is not None:
            self.budget.release(RowCodes.PIECE)
            self._codes = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @property
    def nbytes(self) -> int:
        return self._reserved

    def row_bytes(self) -> int:
        """Bytes of S's rows in memory: what a pass of dual CD over S reads."""
        return _range_bytes(self.sparse, self.d, self.indptr, 0, self.m)


def _range_bytes(sparse: bool, d: int, indptr: np.ndarray, a: int, b: int) -> int:
    """Bytes the rows a:b take in memory once read (CSR: values, indices and offsets)."""
    if sparse:
        return 8 * int(indptr[b] - indptr[a]) + 8 * (b - a + 1)
    return 4 * d * (b - a)


def _read_file(folder: Path, sparse: bool, d: int, indptr: np.ndarray, a: int, b: int,
               codes: RowCodes | None = None):
    if codes is not None:
        with open(folder / "X.bin", "rb") as f:
            return codes.read(f, codes.row_bytes(d) * a, b - a, d)
    if sparse:
        lo, hi = int(indptr[a]), int(indptr[b])
        data = np.fromfile(folder / "data.bin", np.float32, hi - lo, offset=4 * lo)
        idx = np.fromfile(folder / "indices.bin", np.int32, hi - lo, offset=4 * lo)
        return sp.csr_matrix((data, idx, indptr[a:b + 1] - lo), shape=(b - a, d))
    X = np.fromfile(folder / "X.bin", np.float32, (b - a) * d, offset=4 * d * a)
    return X.reshape(b - a, d)


@njit(cache=True)
def compact_dense(X, keep):
    """Rows ``keep`` (ascending) of X moved to its first ``len(keep)`` rows, in place."""
    d = X.shape[1]
    for i in range(keep.shape[0]):
        r = keep[i]
        if r != i:
            for j in range(d):
                X[i, j] = X[r, j]


@njit(cache=True)
def compact_csr(indptr, indices, data, keep):
    """CSR rows ``keep`` (ascending) moved to the front of the buffers, in place; returns
    the new nnz (``indptr[:len(keep) + 1]`` rewritten: row r >= i is read before row i is
    written, and values only move forward)."""
    out = 0
    for i in range(keep.shape[0]):
        r = keep[i]
        a, b = indptr[r], indptr[r + 1]
        indptr[i] = out
        for p in range(a, b):
            indices[out] = indices[p]
            data[out] = data[p]
            out += 1
    indptr[keep.shape[0]] = out
    return out
