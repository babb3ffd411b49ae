"""Rows in memory and on disk at the lowest level: sizes and stacking of row matrices, runs of
sorted rows, and direct slice reads of a contiguous HDF5 dataset."""

from __future__ import annotations

import os
import threading

import numpy as np
import scipy.sparse as sp

from .errors import NonFiniteError, ParameterError, StoreFormatError
from .integrity import REBUILD_HINT
from .value_codes import decode

__all__ = ["CodedDataset", "CodedSlicer", "coded_piece_bytes", "IMPUTE_HINT", "RUN_GAP", "Slicer", "first_nonfinite", "kernel_args", "matrix_nbytes",
           "nonfinite_text", "refuse_nonfinite", "open_direct", "open_random", "row_sqnorms", "rows_nbytes",
           "rows_one_by_one", "run_bounds", "stack_rows"]

_EMPTY_DENSE = np.empty((0, 0), dtype=np.float32)
_EMPTY_PTR = np.empty(0, dtype=np.int64)  # dense: no row pointers (kernels test its length)
_EMPTY_I32 = np.empty(0, dtype=np.int32)
_EMPTY_F32 = np.empty(0, dtype=np.float32)

# what a refusal of NaN / infinite values in arrays a user passes says to do
IMPUTE_HINT = "Remove or impute those values (e.g. sklearn's SimpleImputer)."

# Store.gather reads wanted rows at most this far apart with one call (run_bounds)
RUN_GAP = 16


def first_nonfinite(X) -> tuple[int, int] | None:
    """``(row, column)`` of the first NaN or infinite value of a dense array or a CSR
    matrix (the float32 copy of a source: its overflows too), None where every value is
    finite."""
    if sp.issparse(X):
        bad = np.flatnonzero(~np.isfinite(X.data))
        if not bad.size:
            return None
        return int(np.searchsorted(X.indptr, bad[0], side="right")) - 1, int(X.indices[bad[0]])
    if np.isfinite(X).all():
        return None
    r, c = np.argwhere(~np.isfinite(X))[0]
    return int(r), int(c)


def nonfinite_text(source_value) -> str:
    """What a value that is not finite in float32 was in its source: NaN or infinite, or
    finite but beyond float32's range."""
    return ("a value beyond float32's range (|x| > 3.4e38)" if np.isfinite(source_value)
            else "a NaN or infinite value")


def refuse_nonfinite(X, source=None, *, row0: int = 0, hint: str = NonFiniteError.HINT,
                     path=None) -> None:
    """Raise :class:`NonFiniteError` naming the first NaN or infinite value of ``X`` (rows
    ``row0`` on of ``source``, the values before a float32 copy, where given: one finite
    there but beyond float32 is said to be so)."""
    bad = first_nonfinite(X)
    if bad is None:
        return
    row, col = row0 + bad[0], bad[1]
    value = X[bad[0], bad[1]] if source is None else source[row, col]
    raise NonFiniteError(f"Row {row} of X holds {nonfinite_text(value)} (column {col}).",
                         hint, path=path)


def matrix_nbytes(X) -> int:
    """Bytes held by a dense array or a CSR matrix (its data, indices and indptr)."""
    if sp.issparse(X):
        return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    return int(X.nbytes)


def stack_rows(mats):
    """Dense arrays or CSR matrices stacked by rows (one part is returned as is)."""
    if len(mats) == 1:
        return mats[0]
    if sp.issparse(mats[0]):
        return sp.vstack(mats, format="csr")
    return np.concatenate(mats)


def kernel_args(X):
    """``(Xd, indptr, indices, data, sparse)`` for the numba kernels of every layer, the
    unused layout's arrays empty, converting only where the dtypes differ: dense input becomes
    C-contiguous float32; CSR input gets int64 ``indptr``, int32 ``indices``, float32 ``data``.
    """
    if sp.issparse(X):
        X = X.tocsr() if X.format != "csr" else X
        return (_EMPTY_DENSE, np.ascontiguousarray(X.indptr, dtype=np.int64),
                np.ascontiguousarray(X.indices, dtype=np.int32),
                np.ascontiguousarray(X.data, dtype=np.float32), True)
    X = np.asarray(X)
    if X.ndim != 2:
        raise ParameterError(f"X must be a 2-d array or a CSR matrix. Got {X.ndim} dimensions.",
                             "Reshape a single sample with X.reshape(1, -1).")
    return np.ascontiguousarray(X, dtype=np.float32), _EMPTY_PTR, _EMPTY_I32, _EMPTY_F32, False


def row_sqnorms(X) -> np.ndarray:
    """Squared Euclidean norm of every row (dense or CSR), accumulated in float64 without a
    float64 copy of dense rows."""
    if sp.issparse(X):
        X = X.tocsr()
        d = X.data.astype(np.float64)
        d *= d
        sq = np.zeros(X.shape[0], np.float64)
        rows = np.flatnonzero(np.diff(X.indptr))
        if rows.size:  # consecutive non-empty rows: each segment is one row's entries
            sq[rows] = np.add.reduceat(d, X.indptr[rows])
        return sq
    return np.einsum("ij,ij->i", X, X, dtype=np.float64, casting="safe")


def rows_nbytes(X, y, row_ids) -> int:
    return matrix_nbytes(X) + int(y.nbytes + (0 if row_ids is None else row_ids.nbytes))


def run_bounds(rows: np.ndarray, gap: int = RUN_GAP) -> list[tuple[int, int]]:
    """Index bounds ``(i, j)`` of the runs of sorted ``rows`` at most ``gap`` apart: each run
    is read with one call (a few unwanted rows in between cost less than another call)."""
    cuts = (np.flatnonzero(np.diff(rows) > gap) + 1).tolist()
    return list(zip([0] + cuts, cuts + [len(rows)]))


# where the platform has it (not Windows, not macOS)
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None) if hasattr(os, "posix_fadvise") else None

# reads below this many bytes (an index leaf, a node's pivot rows, a run of a sample) go
# through the descriptor without read-ahead (``open_random``)
SMALL_READ = 1 << 20


def open_random(path) -> int:
    """A read-only descriptor of ``path`` for scattered small reads: no read-ahead
    (``POSIX_FADV_RANDOM``, kept per descriptor; where ``os.posix_fadvise`` exists).
    Through the default one, the index's queries under a 224M cap read 8.7 GB from the disk
    for the 3.6 GB they asked for, the kernel's 8 MiB read-ahead evicted before use
    (bench-log, 2026-11-27)."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


# O_DIRECT reads: file offset, length and buffer on this boundary (the largest logical block
# size in use; 512-byte devices accept it too)
DIRECT_ALIGN = 4096


def open_direct(path) -> int | None:
    """A read-only descriptor of ``path`` that bypasses the page cache (``O_DIRECT``), or
    None where the platform or the file system has none (tmpfs refuses the flag; some file
    systems open it and refuse the reads: one aligned read is tried)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag or not hasattr(os, "preadv"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return None
    try:
        raw, p = _aligned(DIRECT_ALIGN)
        os.preadv(fd, [memoryview(raw)[p:p + DIRECT_ALIGN]], 0)
    except OSError:
        os.close(fd)
        return None
    return fd


def _aligned(nbytes: int) -> tuple[np.ndarray, int]:
    """``(raw, p)``: a fresh byte array with room for ``nbytes`` from ``raw[p]`` on, the first
    DIRECT_ALIGN boundary in it."""
    raw = np.empty(nbytes + DIRECT_ALIGN, np.uint8)
    return raw, -raw.ctypes.data % DIRECT_ALIGN


class Slicer:
    """Row slices ``[a:b]`` of one contiguous, uncompressed HDF5 dataset read straight from
    the file with ``os.preadv`` into a fresh array: one system call, none of h5py's
    per-call selection work (~15 us, most of a 16-row leaf read's cost). The file is only
    read, and what a read returns lives in this process's heap like any other array (no
    mapping that would count in RSS). Reads of at least ``SMALL_READ`` bytes (a scan's
    chunks) go through ``fd``, or ``fd_direct`` (``O_DIRECT``) where one is given, the
    smaller ones through ``fd_small`` (without read-ahead; ``fd`` where none is given)."""

    __slots__ = ("fd", "fd_small", "fd_direct", "offset", "dtype", "row_shape", "row_bytes",
                 "n")

    def __init__(self, fd: int, ds, fd_small: int | None = None, fd_direct: int | None = None):
        self.fd = fd
        self.fd_small = fd if fd_small is None else fd_small
        self.fd_direct = fd_direct
        self.offset = int(ds.id.get_offset())
        self.dtype = ds.dtype
        self.row_shape = tuple(ds.shape[1:])
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * ds.dtype.itemsize
        self.n = int(ds.shape[0])

    @classmethod
    def of(cls, fd: int, ds, fd_small: int | None = None, fd_direct: int | None = None,
           table: np.ndarray | None = None, piece: int | None = None):
        """A slicer for ``ds``, or ``ds`` itself when it is not stored as plain bytes; with
        ``table``, ``ds`` holds value codes, and both read them decoded
        (:class:`CodedSlicer`, :class:`CodedDataset`)."""
        try:
            plain = (ds.chunks is None and ds.compression is None and ds.dtype.isnative
                     and ds.dtype.kind in "fiub" and ds.id.get_offset() is not None)
        except Exception:  # an HDF5 build that cannot say: keep h5py's reads
            plain = False
        if table is not None:
            return CodedSlicer(fd, ds, fd_small, fd_direct, table, piece) if plain else \
                CodedDataset(ds, table)
        return cls(fd, ds, fd_small, fd_direct) if plain else ds

    def _read_into(self, buf: memoryview, row: int) -> None:
        """Fill ``buf`` with the bytes from row ``row`` on (preadv may return fewer)."""
        fd = self.fd if len(buf) >= SMALL_READ else self.fd_small
        self._fill(fd, buf, self.offset + row * self.row_bytes, len(buf), row)

    @staticmethod
    def _fill(fd: int, buf: memoryview, pos: int, need: int, row: int, align: int = 1) -> None:
        """Read from file offset ``pos`` into ``buf`` until ``need`` bytes are in (``preadv``
        may return fewer). With ``align`` (O_DIRECT) a short read off that boundary is the
        file's end. Where the file ends first, the error names ``row``, the read's first."""
        got = 0
        while got < need:
            k = os.preadv(fd, [buf[got:]], pos + got)
            if k <= 0 or (k % align and got + k < need):
                raise StoreFormatError(f"data.h5 ends before row {row} of one of its "
                                       "datasets (the file is truncated).", REBUILD_HINT)
            got += k

    def will_need(self, spans) -> None:
        """Start the reads of the row spans ``(a, b)`` ahead of the calls that wait for them
        (``POSIX_FADV_WILLNEED``: the kernel queues them all at once, where one ``preadv``
        after another waits out each read alone), where the file is read past the page cache
        (``fd_direct``: it outgrows the cache, so its rows are mostly not there). Scattered
        3 KiB rows of a 3.2 GB store in a 1 GiB cgroup, page cache dropped: 52-55 us a row
        one after another, 11-19 us with the batch's spans advised first (8-256 rows); rows
        in the cache pay 0.45 us a row for nothing (bench-log, 2026-11-27)."""
        if _WILLNEED is None or self.fd_direct is None or len(spans) < 2:
            return
        rb, off = self.row_bytes, self.offset
        for a, b in spans:
            os.posix_fadvise(self.fd_small, off + a * rb, (b - a) * rb, _WILLNEED)

    def take(self, rows) -> np.ndarray:
        """Rows at the positions ``rows`` (in range), one read each into one array, all
        started at once (:meth:`will_need`)."""
        out = np.empty((len(rows),) + self.row_shape, self.dtype)
        if out.nbytes:
            buf, rb = memoryview(out).cast("B"), self.row_bytes
            rows = [int(r) for r in rows]
            self.will_need([(r, r + 1) for r in rows])
            for i, r in enumerate(rows):
                self._read_into(buf[i * rb:(i + 1) * rb], r)
        return out

    def take_runs(self, rows: np.ndarray, runs, out: np.ndarray) -> int:
        """Rows at the sorted positions ``rows`` (in range) into ``out`` (C-contiguous, one
        row each), one read per run (``run_bounds``): a run of consecutive rows is read
        straight into ``out``. Returns how many rows were read."""
        if not out.nbytes:
            return 0
        buf, rb = memoryview(out).cast("B"), self.row_bytes
        # steps other than +1 before each position (a repeat is one): a run without any
        # is consecutive rows
        odd = np.r_[0, np.cumsum(np.diff(rows) != 1)].tolist()
        pos = rows.tolist()
        self.will_need([(pos[i], pos[j - 1] + 1) for i, j in runs
                        if (pos[j - 1] + 1 - pos[i]) * rb < SMALL_READ])
        read = 0
        for i, j in runs:
            r0, r1 = pos[i], pos[j - 1] + 1
            read += r1 - r0
            if odd[j - 1] == odd[i]:
                self._read_into(buf[i * rb:j * rb], r0)
            else:
                np.take(self._slice(r0, r1), rows[i:j] - r0, axis=0, out=out[i:j])
        return read

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b, _ = sl.indices(self.n)
        return self._slice(a, b)

    def _slice(self, a: int, b: int) -> np.ndarray:
        """Rows ``a:b`` as stored."""
        shape = (max(a, b) - a,) + self.row_shape
        at = self.offset + a * self.row_bytes
        if (self.fd_direct is not None and shape[0] * self.row_bytes >= SMALL_READ
                and at % self.dtype.itemsize == 0):
            return self._read_direct(at, shape)
        out = np.empty(shape, self.dtype)
        if out.nbytes:
            self._read_into(memoryview(out).cast("B"), a)
        return out

    def _read_direct(self, at: int, shape) -> np.ndarray:
        """The rows of ``shape`` from file offset ``at`` by ``O_DIRECT``: the aligned range
        around them is read into an aligned buffer, and they are a view of it (no copy; at
        most 3 pages more than the rows)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        lo = at - at % DIRECT_ALIGN
        hi = at + nbytes + (-(at + nbytes) % DIRECT_ALIGN)
        raw, p = _aligned(hi - lo)
        self._fill(self.fd_direct, memoryview(raw)[p:p + hi - lo], lo, at - lo + nbytes,
                   (at - self.offset) // self.row_bytes, DIRECT_ALIGN)
        start = p + at - lo
        return raw[start:start + nbytes].view(self.dtype).reshape(shape)


#: the codes a coded read holds at a time on their way to the float32 rows (at least
#: SMALL_READ: a scan's pieces are still read past the page cache where the store is)
CODED_PIECE = 4 << 20


def coded_piece_bytes(limit: int) -> int:
    """The codes a coded read holds at a time (:class:`CodedSlicer`) under a cap of working
    share ``limit``: 1/64 of it, 64 KiB to ``CODED_PIECE`` (4 MiB; a direct read wants 1 MiB
    or more, which caps of 64 MiB and up give)."""
    return int(min(CODED_PIECE, max(64 << 10, limit // 64)))


class CodedSlicer(Slicer):
    """A :class:`Slicer` over value codes (:mod:`~ooc_learn.storage.value_codes`) that
    returns the rows decoded, as float32; ``row_bytes`` and the offsets stay the file's
    (codes), ``dtype`` is the codes'.

    The codes pass through one buffer of ``piece`` bytes (default ``CODED_PIECE``; the
    store sizes it from its cap and reserves it) per reading thread, made at
    its first read and kept while the store is open (aligned, for ``O_DIRECT``): a chunk
    costs the float32 rows returned and nothing more. A fresh piece each time did not: its
    free raised glibc's mmap threshold to its size, and from then on every array below it
    came from the heap, whose freed pages stay resident; the exact stop at 1g peaked at 781
    MiB under ``--memory 768M`` (bench-log, session 50)."""

    __slots__ = ("table", "_local", "_piece_bytes")

    def __init__(self, fd, ds, fd_small, fd_direct, table, piece: int | None = None):
        super().__init__(fd, ds, fd_small, fd_direct)
        self.table = table
        self._local = threading.local()
        self._piece_bytes = max(CODED_PIECE if piece is None else int(piece), self.row_bytes)

    @property
    def buffer_bytes(self) -> int:
        """What a reading thread's piece buffer holds (its memory, alignment included)."""
        return self._piece_bytes + 3 * DIRECT_ALIGN

    def _piece_rows(self) -> int:
        return max(1, self._piece_bytes // max(1, self.row_bytes))

    def _buffer(self) -> tuple[np.ndarray, int]:
        got = getattr(self._local, "buf", None)
        if got is None:
            got = self._local.buf = _aligned(self._piece_bytes + 2 * DIRECT_ALIGN)
        return got

    def _piece(self, a: int, b: int) -> np.ndarray:
        """The codes of rows ``a:b`` (at most a piece) in this thread's buffer."""
        rb = self.row_bytes
        nbytes = (b - a) * rb
        at = self.offset + a * rb
        raw, p = self._buffer()
        if (self.fd_direct is not None and nbytes >= SMALL_READ
                and at % self.dtype.itemsize == 0):
            lo = at - at % DIRECT_ALIGN
            hi = at + nbytes + (-(at + nbytes) % DIRECT_ALIGN)
            self._fill(self.fd_direct, memoryview(raw)[p:p + hi - lo], lo, at - lo + nbytes,
                       a, DIRECT_ALIGN)
            start = p + at - lo
        else:
            self._read_into(memoryview(raw)[p:p + nbytes], a)
            start = p
        return raw[start:start + nbytes].view(self.dtype).reshape((b - a,) + self.row_shape)

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b, _ = sl.indices(self.n)
        return self.read_into(a, max(a, b), np.empty((max(a, b) - a,) + self.row_shape,
                                                      np.float32))

    def read_into(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        """Rows ``a:b`` decoded into the first rows of ``out`` (C-contiguous float32, at
        least ``b - a`` rows; a buffer a pass reuses: its pages are not faulted in again);
        returns them."""
        step = self._piece_rows()
        for p in range(a, b, step):
            q = min(b, p + step)
            decode(self._piece(p, q), self.table, out[p - a:q - a])
        return out[:b - a]

    def take(self, rows) -> np.ndarray:
        return decode(super().take(rows), self.table)

    def take_runs(self, rows: np.ndarray, runs, out: np.ndarray) -> int:
        """As :meth:`Slicer.take_runs`, into float32 ``out``: the runs (cut to pieces) a
        piece's worth of codes at a time."""
        step = self._piece_rows()
        cut = [(s, min(j, s + step)) for i, j in runs for s in range(i, j, step)]
        raw, p = self._buffer()
        read = 0
        k = 0
        while k < len(cut):
            i0 = cut[k][0]
            z = k + 1
            while z < len(cut) and cut[z][1] - i0 <= step:
                z += 1
            j1 = cut[z - 1][1]
            codes = raw[p:p + (j1 - i0) * self.row_bytes].view(self.dtype).reshape(
                (j1 - i0,) + self.row_shape)
            read += super().take_runs(rows[i0:j1], [(i - i0, j - i0) for i, j in cut[k:z]],
                                      codes)
            decode(codes, self.table, out[i0:j1])
            k = z
        return read


class CodedDataset:
    """An h5py dataset of value codes read decoded (where :class:`CodedSlicer` cannot read
    the file itself)."""

    def __init__(self, ds, table):
        self.ds, self.table = ds, table
        self.shape, self.dtype = ds.shape, ds.dtype

    def __getitem__(self, sl):
        return decode(self.ds[sl], self.table)

    def read_into(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        return decode(self.ds[a:b], self.table, out[:b - a])


def rows_one_by_one(read_range, rows):
    """``(X, y)`` of the rows ``rows`` (in that order), one ``read_range(r, r + 1)`` each:
    for scattered rows where nothing reads them faster (a CSR store, an in-memory provider)."""
    parts = [read_range(int(r), int(r) + 1) for r in rows]
    if not parts:
        X, y, _ = read_range(0, 0)
        return X, y
    return stack_rows([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
