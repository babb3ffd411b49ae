"""External shuffle: deal rows into balanced random buckets as they are parsed; cut blocks.

Ingest parses its sources once and hands every chunk of rows straight to a :class:`Dealer`
and a :class:`BucketWriter` (no spill in source order). The dealer does not need the row
count: the rows are cut into consecutive *groups* of R0 (the bucket count) and each group
gives one row to every bucket, in a random order drawn afresh per group. So after any number
of rows the bucket sizes differ by at most one, and every bucket is a stratified random
sample of the whole source (one row from each group): a source sorted by class still gives
buckets with the global class shares.

Once n, d and the layout are known, :func:`plan_blocks` cuts the buckets, concatenated in
order, into the final R balanced blocks: bucket b = block b when R0 = R, else each block takes
whole buckets plus a random share of the bucket(s) at its ends (``deal_chunk``), so every
bucket file is read exactly once, block after block.

Bucket files are sequences of *records* (one per flush): an int64 header ``(m, kind, k)``,
``m`` labels (<f8), ``m`` row ids (<i8), then either CSR (``kind`` 0, ``k`` = nnz: ``m`` row
lengths <i4, ``k`` indices <i4, ``k`` values <f4) or dense rows (``kind`` 1, ``k`` = width:
``m * k`` values <f4, raw feature index = column), whichever is smaller for that record: a dense
source costs 4 bytes an entry in its buckets, as in the store, not 8.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from numba import njit

from .arrays import stack_rows

__all__ = ["Dealer", "BucketWriter", "MemoryBucket", "Record", "iter_records", "read_bucket",
           "plan_blocks", "balanced_sizes", "deal_chunk"]

_HEADER = np.dtype("<i8")
_CSR, _DENSE = 0, 1
# bytes of a row in a CSR record besides its entries: label, row id, length
_ROW_BYTES = 8 + 8 + 4


def balanced_sizes(n: int, n_buckets: int) -> np.ndarray:
    """Bucket sizes that differ by at most one and sum to ``n``."""
    sizes = np.full(n_buckets, n // n_buckets, dtype=np.int64)
    sizes[: n % n_buckets] += 1
    return sizes


def deal_chunk(remaining: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Bucket labels for the next ``m`` rows; ``remaining`` capacities are decremented.

    Sequentially drawing each row's bucket with probability proportional to the remaining
    capacity gives a uniformly random balanced assignment; a chunk's counts under that process
    are multivariate hypergeometric, and their order within the chunk is uniform. With ``m``
    equal to the remaining total it is a random arrangement of exact counts (how
    :func:`plan_blocks`' boundary buckets are shared between their blocks).
    """
    counts = rng.multivariate_hypergeometric(remaining, m) if m < remaining.sum() else remaining.copy()
    remaining -= counts
    labels = np.repeat(np.arange(len(remaining), dtype=np.int64), counts)
    rng.shuffle(labels)
    return labels


class Dealer:
    """Bucket of each next row: every consecutive group of ``n_buckets`` rows goes one row to
    each bucket, in a fresh random order per group (see module doc).

    The random stream is one ``rng.random(n_buckets)`` per group, drawn when the group starts,
    so the assignment does not depend on how the rows are chunked.

    >>> d = Dealer(4, np.random.default_rng(0))
    >>> labels = np.concatenate([d.deal(3), d.deal(7)])
    >>> sorted(np.bincount(labels, minlength=4).tolist())
    [2, 2, 3, 3]
    >>> sorted(labels[:4].tolist())
    [0, 1, 2, 3]
    """

    def __init__(self, n_buckets: int, rng: np.random.Generator):
        self.n_buckets = int(n_buckets)
        self.rng = rng
        self._left = np.empty(0, np.int64)  # the rest of the current group

    def deal(self, m: int) -> np.ndarray:
        r = self.n_buckets
        if r == 1:
            return np.zeros(m, np.int64)
        out = np.empty(m, np.int64)
        k = min(m, self._left.shape[0])
        out[:k] = self._left[:k]
        self._left = self._left[k:]
        if m > k:
            groups = -(-(m - k) // r)
            perm = np.argsort(self.rng.random((groups, r)), axis=1).reshape(-1)
            out[k:] = perm[:m - k]
            self._left = perm[m - k:].copy()
        return out


class BucketWriter:
    """Buffer rows per bucket in memory and append them as records to one file per bucket.

    Parameters
    ----------
    directory : path
        Where the bucket files go (created).
    n_buckets : int
    buffer_bytes : int
        Rows are written when the buffered rows of all buckets together exceed this.
    record_bytes : int, optional
        The most one record holds (default ``buffer_bytes // 8``, at least 1 MiB): bounds what
        a reader holds at once.

    Attributes ``rows`` (rows per bucket), ``bytes_written``.

    A writer closed with ``in_memory=True`` that never had to flush (every row it was given
    fits its buffer) writes nothing: :meth:`bucket` then hands each bucket out as a
    :class:`MemoryBucket` (ingest reads its source once and writes the store once).
    :meth:`spill` writes them after all.
    """

    def __init__(self, directory, n_buckets: int, buffer_bytes: int,
                 record_bytes: int | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.n_buckets = int(n_buckets)
        self.buffer_bytes = max(1 << 16, int(buffer_bytes))
        self.record_bytes = int(record_bytes or max(1 << 20, self.buffer_bytes // 8))
        self.rows = np.zeros(self.n_buckets, np.int64)
        self.bytes_written = 0
        self._pending: list[list] = [[] for _ in range(self.n_buckets)]
        self._pending_bytes = 0
        # bucket files stay open between flushes where the process may hold that many:
        # reopening every bucket file at every flush is slow
        self._files: dict = {}
        self._max_open = max(0, _open_files_allowed() - 256)
        self.flushed = False  # a flush wrote records: the buckets are files
        self.in_memory = False

    def bucket(self, b: int):
        """Bucket ``b``: its file, or its :class:`MemoryBucket` where it stayed in memory."""
        return MemoryBucket(self._pending[b], self.path(b)) if self.in_memory else self.path(b)

    def spill(self) -> None:
        """Write buckets held in memory to their files (:meth:`bucket` then gives paths)."""
        if self.in_memory:
            self.in_memory = False
            self.close()

    def path(self, b: int) -> Path:
        return self.directory / f"bucket{b:06d}.bin"

    def add(self, bucket_of_row, labels, row_ids, indptr, indices, values) -> None:
        """Scatter one chunk of rows to their buckets (``bucket_of_row``: one label per row).

        One vectorised gather puts the chunk's rows in bucket order (rows of one bucket keep
        their source order); each bucket then takes a slice of it, so the work per chunk is
        O(rows + entries + R) with no per-bucket fancy indexing.
        """
        order = np.argsort(bucket_of_row, kind="stable")
        bounds = np.searchsorted(bucket_of_row[order], np.arange(self.n_buckets + 1))
        lens = np.diff(indptr)[order]
        ebounds = np.zeros(len(order) + 1, np.int64)
        np.cumsum(lens, out=ebounds[1:])
        ind = np.empty(int(ebounds[-1]), "<i4")
        val = np.empty(int(ebounds[-1]), "<f4")
        _gather_rows(indptr, order, ebounds, indices, values, ind, val)
        lab = np.ascontiguousarray(labels[order], "<f8")
        rid = np.ascontiguousarray(row_ids[order], "<i8")
        nz = lens.astype("<i4")
        sizes = np.diff(bounds)
        self.rows += sizes
        for b in np.flatnonzero(sizes).tolist():
            r0, r1 = int(bounds[b]), int(bounds[b + 1])
            e0, e1 = int(ebounds[r0]), int(ebounds[r1])
            self._pending[b].append((lab[r0:r1], rid[r0:r1], nz[r0:r1], ind[e0:e1],
                                     val[e0:e1]))
        # the slices together cover the gathered chunk
        self._pending_bytes += lab.nbytes + rid.nbytes + nz.nbytes + ind.nbytes + val.nbytes
        if self._pending_bytes > self.buffer_bytes:
            self.flush()

    def flush(self) -> None:
        """Append each bucket's pending rows as records of at most ``record_bytes``."""
        self.flushed = self.flushed or self._pending_bytes > 0
        for b, pieces in enumerate(self._pending):
            if not pieces:
                continue
            fd = self._files.get(b)
            if fd is None:
                fd = os.open(self.path(b), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                for rec in _group_pieces(pieces, self.record_bytes):
                    self.bytes_written += _write_record(fd, *rec)
            finally:
                if b in self._files or len(self._files) < self._max_open:
                    self._files[b] = fd
                else:
                    os.close(fd)
            pieces.clear()
        self._pending_bytes = 0

    def close(self, *, in_memory: bool = False) -> None:
        """Flush, and close the bucket files (the files are complete after this); with
        ``in_memory``, keep the rows in memory instead where no flush wrote any."""
        if in_memory and not self.flushed:
            self.in_memory = True
            return
        try:
            self.flush()
        finally:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()


def _open_files_allowed() -> int:
    """The process's soft limit on open files (1024 where it cannot be read)."""
    try:
        import resource

        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return 1024


def _piece_bytes(nz) -> np.ndarray:
    """Cumulative CSR record bytes of a piece's rows (0 first)."""
    c = np.zeros(nz.shape[0] + 1, np.int64)
    np.cumsum(_ROW_BYTES + 8 * nz.astype(np.int64), out=c[1:])
    return c


def _group_pieces(pieces, limit: int):
    """Concatenate consecutive pieces into records of at most ``limit`` bytes (a piece over the
    limit is cut by rows; a single row over it is a record of its own)."""
    group, size = [], 0
    for lab, rid, nz, ind, val in pieces:
        cum = _piece_bytes(nz)
        r, m = 0, lab.shape[0]
        while r < m:
            if group and size + int(cum[r + 1] - cum[r]) > limit:
                yield _concat(group)
                group, size = [], 0
            # the most rows from r on that fit in what is left, at least one
            s = int(np.searchsorted(cum, cum[r] + (limit - size), "right")) - 1
            s = min(max(s, r + 1), m)
            e0, e1 = (int(cum[i] - _ROW_BYTES * i) // 8 for i in (r, s))
            group.append((lab[r:s], rid[r:s], nz[r:s], ind[e0:e1], val[e0:e1]))
            size += int(cum[s] - cum[r])
            r = s
    if group:
        yield _concat(group)


def _concat(group):
    if len(group) == 1:
        return group[0]
    return tuple(np.concatenate([g[f] for g in group]) for f in range(5))


def _write_record(fd: int, lab, rid, nz, ind, val) -> int:
    """Write one record, dense when that is smaller than CSR, with one system call (writev,
    where a buffered file object makes two or three); return the bytes written."""
    m, nnz = lab.shape[0], ind.shape[0]
    width = int(ind.max()) + 1 if nnz else 0
    if nnz and 4 * m * width <= 4 * m + 8 * nnz:
        X = np.zeros((m, width), "<f4")
        _scatter_rows(nz, ind, val, X)
        parts = (np.array([m, _DENSE, width], _HEADER), lab, rid, X)
    else:
        parts = (np.array([m, _CSR, nnz], _HEADER), lab, rid, nz, ind, val)
    views = [memoryview(np.ascontiguousarray(p)).cast("B") for p in parts]
    while views:  # one call, unless it writes short (a signal): then the rest, in order
        k = os.writev(fd, views)
        if k <= 0:
            raise OSError("could not write a bucket record")
        while views and k >= views[0].nbytes:
            k -= views[0].nbytes
            views.pop(0)
        if views and k:
            views[0] = views[0][k:]
    return sum(p.nbytes for p in parts)


@njit(cache=True, nogil=True)
def _gather_rows(indptr, order, out_ptr, indices, values, out_ind, out_val):
    """Copy the entries of rows ``order`` (in that order) into ``out_*`` at ``out_ptr``."""
    for k in range(order.shape[0]):
        r = order[k]
        a = indptr[r]
        o = out_ptr[k]
        for j in range(indptr[r + 1] - a):
            out_ind[o + j] = indices[a + j]
            out_val[o + j] = values[a + j]


@njit(cache=True, nogil=True)
def _scatter_rows(rownnz, indices, values, out):
    """Write CSR rows (given by their lengths) into the dense ``out`` (zeroed)."""
    e = 0
    for i in range(rownnz.shape[0]):
        for _ in range(rownnz[i]):
            out[i, indices[e]] = values[e]
            e += 1


class MemoryBucket:
    """A bucket that stayed in memory: its pieces as :class:`BucketWriter` buffered them,
    read as a bucket file's records would be (the same rows in the same order); ``path``:
    its file, once the writer spilled it (:meth:`BucketWriter.spill`)."""

    def __init__(self, pieces, path):
        self.pieces, self.path = pieces, path

    def records(self):
        for lab, rid, nz, ind, val in self.pieces:
            yield Record(lab, rid, nz, ind, val)

    def read(self, layout: str, n_features: int, base: int):
        """All rows (at least one) in the store's layout, as :func:`read_bucket` gives a
        file's."""
        return (np.concatenate([q[0] for q in self.pieces]),
                np.concatenate([q[1] for q in self.pieces]),
                stack_rows([r.rows(layout, n_features, base) for r in self.records()]))

    def unlink(self) -> None:
        self.pieces.clear()  # the writer's list: its memory goes now


class Record(NamedTuple):
    """One record of a bucket file: ``values`` is ``(m, width)`` for a dense record, else the
    CSR entries with ``rownnz`` and ``indices``. Feature indices are raw (source base)."""

    labels: np.ndarray
    row_ids: np.ndarray
    rownnz: np.ndarray | None
    indices: np.ndarray | None
    values: np.ndarray

    @property
    def n_rows(self) -> int:
        return int(self.labels.shape[0])

    def csr(self):
        """``(indptr, indices, values)`` of the rows, raw indices (as the parsers give)."""
        if self.rownnz is None:
            X = sp.csr_matrix(self.values)
            return X.indptr.astype(np.int64), X.indices.astype(np.int64), X.data
        indptr = np.zeros(self.n_rows + 1, np.int64)
        np.cumsum(self.rownnz, out=indptr[1:])
        return indptr, self.indices, self.values

    def rows(self, layout: str, n_features: int, base: int):
        """The rows in the store's layout: float32 ``(m, d)`` ndarray or CSR matrix with
        0-based columns (raw index - ``base``)."""
        m, d = self.n_rows, int(n_features)
        if self.rownnz is None:
            Xr = self.values[:, base:]
            if layout == "dense":
                if Xr.shape[1] == d:
                    return Xr if base == 0 else np.ascontiguousarray(Xr)
                out = np.zeros((m, d), np.float32)
                out[:, :Xr.shape[1]] = Xr
                return out
            X = sp.csr_matrix(Xr)
            return sp.csr_matrix((X.data, X.indices, X.indptr), shape=(m, d))
        indptr, indices, values = self.csr()
        if base:
            indices = indices - np.int32(base)
        if layout == "dense":
            out = np.zeros((m, d), np.float32)
            _scatter_rows(self.rownnz, indices, values, out)
            return out
        return sp.csr_matrix((values, indices, indptr), shape=(m, d))


def _body_bytes(m: int, kind: int, k: int) -> int:
    """Bytes of a record after its header (see the module docstring)."""
    return 16 * m + (4 * m * k if kind == _DENSE else 4 * m + 8 * k)


def _decode(body: np.ndarray, m: int, kind: int, k: int) -> Record:
    """The :class:`Record` a record's body (uint8, after the header) holds, as views."""
    lab, rid, o = body[:8 * m].view("<f8"), body[8 * m:16 * m].view("<i8"), 16 * m
    if kind == _DENSE:
        return Record(lab, rid, None, None, body[o:o + 4 * m * k].view("<f4").reshape(m, k))
    return Record(lab, rid, body[o:o + 4 * m].view("<i4"),
                  body[o + 4 * m:o + 4 * m + 4 * k].view("<i4"),
                  body[o + 4 * m + 4 * k:o + 4 * m + 8 * k].view("<f4"))


def iter_records(path, counter=None):
    """Yield the :class:`Record` s of one bucket file, one record in memory at a time (two
    reads each); ``counter(nbytes)`` sees every read. (Of a :class:`MemoryBucket`, its
    records, nothing read.)"""
    if isinstance(path, MemoryBucket):
        yield from path.records()
        return
    with open(path, "rb") as fh:
        while True:
            head = np.fromfile(fh, _HEADER, 3)
            if head.size < 3:
                return
            m, kind, k = (int(v) for v in head)
            size = _body_bytes(m, kind, k)
            body = np.fromfile(fh, np.uint8, size)
            if body.size != size:  # only a bug or a full disk can cause this
                raise OSError(f"bucket file {path} ends inside a record")
            if counter is not None:
                counter(head.nbytes + size)
            yield _decode(body, m, kind, k)


def read_bucket(path, layout: str, n_features: int, base: int, counter=None):
    """All rows of one bucket file in the store's layout, as ``(labels, row_ids, X)``.

    The file is read with one call and its records are decoded from that buffer straight
    into the outputs: a record costs a few array views, where :func:`iter_records` and
    :meth:`Record.rows` cost two reads and an array of its own.
    ``counter(nbytes)`` sees the bytes read. (Of a :class:`MemoryBucket`, its rows, nothing
    read.)"""
    if isinstance(path, MemoryBucket):
        return path.read(layout, n_features, base)
    buf = np.fromfile(path, np.uint8)
    if counter is not None:
        counter(buf.nbytes)
    recs, off, n = [], 0, 0
    while off < buf.size:
        if off + 24 > buf.size:
            raise OSError(f"bucket file {path} ends inside a record")
        m, kind, k = struct.unpack_from("<qqq", buf, off)
        end = off + 24 + _body_bytes(m, kind, k)
        if end > buf.size:
            raise OSError(f"bucket file {path} ends inside a record")
        recs.append(_decode(buf[off + 24:end], m, kind, k))
        n += m
        off = end
    labels, row_ids = np.empty(n, "<f8"), np.empty(n, "<i8")
    d = int(n_features)
    dense = layout == "dense"
    X = np.zeros((n, d), np.float32) if dense else None
    parts = []  # CSR output: (row lengths, indices, values) per record
    pos = 0
    for rec in recs:
        m = rec.n_rows
        labels[pos:pos + m] = rec.labels
        row_ids[pos:pos + m] = rec.row_ids
        if rec.rownnz is None:
            V = rec.values[:, base:]
            if dense:
                X[pos:pos + m, :V.shape[1]] = V
            else:
                Vc = sp.csr_matrix(V)
                parts.append((np.diff(Vc.indptr), Vc.indices, Vc.data))
        else:
            ind = rec.indices - np.int32(base) if base else rec.indices
            if dense:
                _scatter_rows(rec.rownnz, ind, rec.values, X[pos:pos + m])
            else:
                parts.append((rec.rownnz, ind, rec.values))
        pos += m
    del buf, recs
    if dense:
        return labels, row_ids, X
    indptr = np.zeros(n + 1, np.int64)
    if parts:
        np.cumsum(np.concatenate([q[0] for q in parts]), out=indptr[1:])
        ind = np.concatenate([q[1] for q in parts]).astype(np.int32, copy=False)
        val = np.concatenate([q[2] for q in parts]).astype(np.float32, copy=False)
    else:
        ind, val = np.empty(0, np.int32), np.empty(0, np.float32)
    return labels, row_ids, sp.csr_matrix((val, ind, indptr), shape=(n, d))


class BlockPlan(NamedTuple):
    """How the buckets, concatenated in order, become the blocks (see :func:`plan_blocks`)."""

    block_sizes: np.ndarray      # (R,)
    bucket_blocks: list          # per bucket: int64 array of the blocks it gives rows to
    bucket_counts: list          # per bucket: rows it gives to each of those blocks
    identity: bool               # bucket b is block b


def plan_blocks(bucket_rows, n_blocks: int) -> BlockPlan:
    """Cut the buckets, concatenated in order, into ``n_blocks`` blocks of balanced sizes.

    When there are as many buckets as blocks (their sizes already differ by at most one),
    bucket b is block b. Otherwise the blocks get sizes ``balanced_sizes(n, R)`` and each
    takes the buckets that lie inside its range of the concatenation whole, and a share of a
    bucket it shares with a neighbour; which rows of a shared bucket go where is drawn at
    random when it is read (``deal_chunk``), so every block stays a random sample.

    >>> p = plan_blocks([3, 3, 2, 2], 3)
    >>> p.block_sizes.tolist(), [b.tolist() for b in p.bucket_blocks]
    ([4, 3, 3], [[0], [0, 1], [1, 2], [2]])
    >>> [c.tolist() for c in p.bucket_counts]
    [[3], [1, 2], [1, 1], [2]]
    """
    rows = np.asarray(bucket_rows, dtype=np.int64)
    n = int(rows.sum())
    if rows.shape[0] == n_blocks and (n_blocks == 0 or rows.max() - rows.min() <= 1):
        return BlockPlan(rows.copy(), [np.array([b]) for b in range(n_blocks)],
                         [np.array([s]) for s in rows], True)
    sizes = balanced_sizes(n, n_blocks)
    ends = np.cumsum(sizes)
    starts = np.concatenate(([0], np.cumsum(rows)[:-1]))
    blocks, counts = [], []
    for a, s in zip(starts.tolist(), rows.tolist()):
        if s == 0:
            blocks.append(np.empty(0, np.int64))
            counts.append(np.empty(0, np.int64))
            continue
        c0 = int(np.searchsorted(ends, a, "right"))
        c1 = int(np.searchsorted(ends, a + s - 1, "right"))
        bl = np.arange(c0, c1 + 1)
        lo = np.maximum(np.concatenate(([0], ends))[bl], a)
        hi = np.minimum(ends[bl], a + s)
        blocks.append(bl)
        counts.append(hi - lo)
    return BlockPlan(sizes, blocks, counts, False)
