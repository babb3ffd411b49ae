"""External shuffle: spill parsed rows, deal them into balanced random buckets, read buckets back.

Pass 1 appends parsed rows to a *spill* (raw little-endian arrays, in source order). Once the
row count n is known, pass 2 streams the spill and deals the rows into R buckets so that
every balanced assignment (bucket sizes n//R or n//R + 1) is equally likely: for each chunk
of m rows, the number going to each bucket is a multivariate hypergeometric draw over the
buckets' remaining capacities, and those labels are shuffled within the chunk. Memory is
O(chunk + R), whatever n is. Pass 3 (in :mod:`ingest`) loads one bucket at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

__all__ = ["Spill", "BucketWriter", "read_bucket", "balanced_sizes", "deal_chunk"]

_REC_HEADER = np.dtype("<i8")


class Spill:
    """Append-only store of parsed rows: labels, per-row nnz, indices, values."""

    _FILES = {"labels": "<f8", "rownnz": "<i4", "indices": "<i4", "values": "<f4"}

    def __init__(self, directory):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fh = {k: open(self.directory / f"spill.{k}", "wb") for k in self._FILES}
        self.n_rows = 0
        self.nnz = 0

    def append(self, labels, indptr, indices, values) -> None:
        rownnz = np.diff(indptr).astype("<i4")
        self._fh["labels"].write(np.ascontiguousarray(labels, "<f8"))
        self._fh["rownnz"].write(rownnz)
        self._fh["indices"].write(np.ascontiguousarray(indices, "<i4"))
        self._fh["values"].write(np.ascontiguousarray(values, "<f4"))
        self.n_rows += len(labels)
        self.nnz += int(indptr[-1])

    def close_writing(self) -> None:
        for fh in self._fh.values():
            fh.close()

    def iter_rows(self, chunk_rows: int):
        """Yield ``(labels, indptr, indices, values)`` chunks of up to ``chunk_rows`` rows."""
        fh = {k: open(self.directory / f"spill.{k}", "rb") for k in self._FILES}
        try:
            done = 0
            while done < self.n_rows:
                m = min(chunk_rows, self.n_rows - done)
                labels = np.fromfile(fh["labels"], "<f8", m)
                rownnz = np.fromfile(fh["rownnz"], "<i4", m)
                indptr = np.zeros(m + 1, np.int64)
                np.cumsum(rownnz, out=indptr[1:])
                nz = int(indptr[-1])
                indices = np.fromfile(fh["indices"], "<i4", nz)
                values = np.fromfile(fh["values"], "<f4", nz)
                yield labels, indptr, indices, values
                done += m
        finally:
            for f in fh.values():
                f.close()

    def remove(self) -> None:
        for k in self._FILES:
            (self.directory / f"spill.{k}").unlink(missing_ok=True)


def balanced_sizes(n: int, n_buckets: int) -> np.ndarray:
    """Bucket sizes that differ by at most one and sum to ``n``."""
    sizes = np.full(n_buckets, n // n_buckets, dtype=np.int64)
    sizes[: n % n_buckets] += 1
    return sizes


def deal_chunk(remaining: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Bucket labels for the next ``m`` rows; ``remaining`` capacities are decremented.

    Sequentially drawing each row's bucket with probability proportional to the remaining
    capacity gives a uniformly random balanced assignment; a chunk's counts under that process
    are multivariate hypergeometric, and their order within the chunk is uniform.
    """
    counts = rng.multivariate_hypergeometric(remaining, m) if m < remaining.sum() else remaining.copy()
    remaining -= counts
    labels = np.repeat(np.arange(len(remaining), dtype=np.int64), counts)
    rng.shuffle(labels)
    return labels


class BucketWriter:
    """Buffer rows per bucket in memory and append them as records to one file per bucket."""

    def __init__(self, directory, n_buckets: int, buffer_bytes: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.n_buckets = n_buckets
        self.buffer_bytes = max(1 << 16, int(buffer_bytes))
        self._pending: list[list] = [[] for _ in range(n_buckets)]
        self._pending_bytes = 0

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
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            r0, r1 = int(bounds[b]), int(bounds[b + 1])
            e0, e1 = int(ebounds[r0]), int(ebounds[r1])
            self._pending[b].append((lab[r0:r1], rid[r0:r1], nz[r0:r1], ind[e0:e1],
                                     val[e0:e1]))
        # the slices together cover the gathered chunk
        self._pending_bytes += lab.nbytes + rid.nbytes + nz.nbytes + ind.nbytes + val.nbytes
        if self._pending_bytes > self.buffer_bytes:
            self.flush()

    def flush(self) -> None:
        """Append each bucket's pending rows as one record (header, then field by field)."""
        for b, recs in enumerate(self._pending):
            if not recs:
                continue
            m = sum(len(r[0]) for r in recs)
            nnz = sum(len(r[3]) for r in recs)
            with open(self.path(b), "ab") as fh:
                fh.write(np.array([m, nnz], dtype=_REC_HEADER))
                for field in range(5):
                    for rec in recs:
                        fh.write(rec[field])
            recs.clear()
        self._pending_bytes = 0


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


def read_bucket(path):
    """Load a whole bucket file: ``(labels, row_ids, indptr, indices, values)``."""
    labels, rids, nzs, inds, vals = [], [], [], [], []
    with open(path, "rb") as fh:
        while True:
            head = np.fromfile(fh, _REC_HEADER, 2)
            if head.size < 2:
                break
            m, nnz = int(head[0]), int(head[1])
            labels.append(np.fromfile(fh, "<f8", m))
            rids.append(np.fromfile(fh, "<i8", m))
            nzs.append(np.fromfile(fh, "<i4", m))
            inds.append(np.fromfile(fh, "<i4", nnz))
            vals.append(np.fromfile(fh, "<f4", nnz))
    if not labels:
        e = np.empty(0)
        return e, e.astype(np.int64), np.zeros(1, np.int64), e.astype(np.int32), e.astype(np.float32)
    rownnz = np.concatenate(nzs)
    indptr = np.zeros(rownnz.size + 1, np.int64)
    np.cumsum(rownnz, out=indptr[1:])
    return (np.concatenate(labels), np.concatenate(rids), indptr,
            np.concatenate(inds), np.concatenate(vals))
