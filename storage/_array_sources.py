"""Streaming readers of binary array sources for ingest: ``.npy``, ``.npz`` and idx (MNIST).

:mod:`parsers` dispatches here from ``iter_chunks``. A ``.npy`` file is read in order, a row
range at a time (compressed or not); an ``.npz`` archive is read member by member with
:class:`_NpyReader`, either a dense ``X`` with ``y``, or a CSR matrix saved by
``scipy.sparse.save_npz`` plus ``y``. Every chunk is checked for finite values and canonical
CSR structure and returned as a :class:`RawChunk`.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np

from . import _parse_kernels as K
from .errors import IngestError, NonFiniteError
from .source_io import (IDX_TYPES, INDEX_SENTINEL, RawChunk, is_idx_head, label_index,
                        open_binary, read_full)
from .sniff import NO_LABEL

__all__ = ["iter_npy", "iter_npz", "iter_idx", "idx_labels_path", "npy_width"]


def _check_numeric(dtype, shape, path, what: str, ndim: int) -> None:
    if dtype.hasobject or dtype.kind not in "biuf":
        raise IngestError(f"{what} has dtype {dtype}, not a numeric type",
                          "Save a numeric array (bool, int or float).", path=path)
    if len(shape) != ndim and not (ndim == 1 and len(shape) == 2 and shape[1] == 1):
        raise IngestError(f"{what} has shape {shape}; expected a {ndim}-D array",
                          "Save X as a 2-D (rows x columns) array and y as a 1-D array.",
                          path=path)


def _finite(a: np.ndarray, path, what: str, row0: int) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        r, *c = np.argwhere(bad)[0] if a.ndim == 2 else (np.argmax(bad),)
        col = int(c[0]) + 1 if c else None
        raise NonFiniteError(f"{what} in row {row0 + int(r) + 1} is NaN or infinite",
                             path=path, column=col)


def _dense_chunk(labels, feats, row0: int, bytes_read: int, path) -> RawChunk:
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    _finite(labels, path, "the label", row0)
    if feats.dtype != np.float32:
        feats = np.asarray(feats, dtype=np.float64)
    with np.errstate(over="ignore"):
        f32 = np.asarray(feats, dtype=np.float32)
    _finite(f32, path, "a value", row0)
    indptr = np.empty(f32.shape[0] + 1, np.int64)
    cols, vals = K.dense_to_csr(np.ascontiguousarray(f32), indptr)
    n_cols = f32.shape[1]
    return RawChunk(labels, indptr, cols, vals, row0 + 1, None,
                    0 if n_cols else INDEX_SENTINEL, n_cols - 1, n_cols, bytes_read)


def iter_npy(path, chunk_bytes: int, label_column) -> Iterator[RawChunk]:
    p = os.fspath(path)
    if isinstance(label_column, str) and label_column != NO_LABEL:
        raise IngestError(f"label_column={label_column!r} is a name, but .npy columns have none",
                          "Pass the label column's number.", path=p)
    with open_binary(p) as f:
        reader = _NpyReader(f, p, "the .npy array", 2)  # checks dtype and shape first
        n, width = reader.shape
        # NO_LABEL (rows to predict): every column a feature, the labels 0
        lab = None if label_column == NO_LABEL else label_index(p, label_column, None, width)
        keep = [j for j in range(width) if j != lab]
        step = max(1, chunk_bytes // max(1, width * reader.dtype.itemsize))
        # read in order, a chunk at a time, compressed or not: a memory map would leave every
        # page it touched resident, beside the bucket buffers, under the memory cap
        for a in range(0, n, step):
            block = reader.read(min(step, n - a))
            labels = np.zeros(block.shape[0]) if lab is None else block[:, lab]
            yield _dense_chunk(labels, block[:, keep], a, f.raw_tell(), p)


def npy_width(path) -> int:
    """The columns of the rows of a 2-d ``.npy`` file (compressed or not), from its header."""
    p = os.fspath(path)
    with open_binary(p) as f:
        return int(_NpyReader(f, p, "the .npy array", 2).shape[1])


class _NpyReader:
    """Sequential reader of a ``.npy`` stream (a zip member or a decompressed file)."""

    def __init__(self, fp, path: str, what: str, ndim: int):
        self.fp, self.path, self.what = fp, path, what
        try:
            version = np.lib.format.read_magic(fp)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            self.shape, fortran, self.dtype = read(fp)
        except (ValueError, OSError, EOFError) as exc:
            raise IngestError(f"{what} is not a readable .npy array: {exc}",
                              "Re-create it with numpy.save / numpy.savez.", path=path) from exc
        _check_numeric(self.dtype, self.shape, path, what, ndim)
        if fortran and len(self.shape) == 2 and self.shape[1] > 1 and ndim == 2:
            raise IngestError(f"{what} is stored in Fortran (column) order, which cannot be "
                              "streamed by rows", "Save np.ascontiguousarray(X) instead.",
                              path=path)
        self.row_items = int(np.prod(self.shape[1:], dtype=np.int64))

    def read(self, rows: int) -> np.ndarray:
        nbytes = rows * self.row_items * self.dtype.itemsize
        data = read_full(self.fp, nbytes)
        if len(data) != nbytes:
            raise IngestError(f"{self.what} ends early (truncated file)",
                              "Re-create the file.", path=self.path)
        return np.frombuffer(data, dtype=self.dtype).reshape((rows, *self.shape[1:]))


#: the (X, y) member pairs an archive is read by when it lacks the default ("X", "y"), in
#: order: numpy's positional np.savez(f, X, y), scikit-learn's data / target, and the like
NPZ_PAIRS = (("X", "y"), ("x", "y"), ("data", "target"), ("features", "labels"),
             ("X_train", "y_train"), ("x_train", "y_train"), ("arr_0", "arr_1"))


def npz_pair(names, keys) -> tuple[str, str]:
    """The members holding X and y among ``names``: ``keys`` where asked for (not the
    default), else the first of :data:`NPZ_PAIRS` present."""
    keys = tuple(keys)
    if keys != NPZ_PAIRS[0]:
        return keys
    return next((pair for pair in NPZ_PAIRS if pair[0] in names and pair[1] in names), keys)


def _npz_member(zf, names, key, path, ndim, what):
    if key not in names:
        raise IngestError(f"the .npz archive has no member {key!r}; it has {sorted(names)}",
                          "Save X and y (np.savez(f, X=X, y=y); data / target and "
                          "np.savez(f, X, y) are read too), a sparse CSR matrix with y (data, "
                          "indices, indptr, shape, format, y); from Python, name the members with "
                          "npz_keys=.",
                          path=path)
    return _NpyReader(zf.open(names[key]), path, f"the .npz member {key!r}", ndim)


def iter_npz(path, chunk_bytes: int, keys: tuple[str, str]) -> Iterator[RawChunk]:
    p = os.fspath(path)
    try:
        zf = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError) as exc:
        raise IngestError(f"the .npz archive cannot be read: {exc}",
                          "Re-create it with numpy.savez.", path=p) from exc
    with zf:
        names = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        xk, yk = npz_pair(names, keys)
        size = os.path.getsize(p)
        if xk not in names and {"data", "indices", "indptr"} <= names.keys():
            yield from _iter_npz_csr(zf, names, yk, p, chunk_bytes, size)
            return
        X = _npz_member(zf, names, xk, p, 2, "X")
        y = _npz_member(zf, names, yk, p, 1, "y")
        n, width = X.shape
        if y.shape[0] != n:
            raise IngestError(f"X has {n} rows but y has {y.shape[0]} labels",
                              "Save one label per row.", path=p)
        step = max(1, chunk_bytes // max(1, width * X.dtype.itemsize))
        for a in range(0, n, step):
            m = min(step, n - a)
            yield _dense_chunk(y.read(m), X.read(m), a, int(size * (a + m) / max(n, 1)), p)


def _iter_npz_csr(zf, names, yk, p: str, chunk_bytes: int, size: int) -> Iterator[RawChunk]:
    fmt = np.lib.format.read_array(zf.open(names["format"])) if "format" in names else "csr"
    fmt = str(fmt.item().decode() if isinstance(fmt, np.ndarray) and fmt.dtype.kind == "S"
              else np.asarray(fmt).item())
    if fmt != "csr":
        raise IngestError(f"the sparse matrix in the .npz archive is {fmt.upper()}, not CSR",
                          "Convert it with X.tocsr() before scipy.sparse.save_npz.", path=p)
    if "shape" not in names:
        raise IngestError("the sparse .npz archive has no 'shape' member",
                          "Save it with scipy.sparse.save_npz.", path=p)
    n, width = (int(v) for v in np.lib.format.read_array(zf.open(names["shape"])))
    ptr = _npz_member(zf, names, "indptr", p, 1, "indptr")
    ind = _npz_member(zf, names, "indices", p, 1, "indices")
    dat = _npz_member(zf, names, "data", p, 1, "data")
    y = _npz_member(zf, names, yk, p, 1, "y")
    if ptr.shape[0] != n + 1 or y.shape[0] != n:
        raise IngestError(f"indptr has {ptr.shape[0]} entries and y {y.shape[0]} labels for "
                          f"{n} rows", "Save a consistent CSR matrix and one label per row.",
                          path=p)
    start = int(ptr.read(1)[0])
    if start:
        ind.read(start), dat.read(start)
    budget = max(1, chunk_bytes // 12)
    row = 0
    while row < n:
        ends = ptr.read(min(max(1, chunk_bytes // 16), n - row)).astype(np.int64)
        labels = y.read(ends.shape[0])
        cut = 0
        while cut < ends.shape[0]:
            stop = max(cut + 1, int(np.searchsorted(ends, start + budget, "right")))
            stop = min(stop, ends.shape[0])
            indptr = np.concatenate(([start], ends[cut:stop])) - start
            if np.any(np.diff(indptr) < 0) or ends[stop - 1] > ind.shape[0]:
                raise IngestError(f"indptr is not a valid CSR row pointer near row {row + cut}",
                                  "Re-create the matrix with scipy.sparse.", path=p)
            k = int(indptr[-1])
            chunk = _csr_chunk(labels[cut:stop], indptr, ind.read(k).astype(np.int64),
                               dat.read(k), width, row + cut, int(size * (row + stop) / n), p)
            yield chunk
            start, cut = int(ends[stop - 1]), stop
        row += ends.shape[0]


def _csr_chunk(labels, indptr, indices, data, width: int, row0: int, bytes_read: int,
               p: str) -> RawChunk:
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    _finite(labels, p, "the label", row0)
    with np.errstate(over="ignore"):  # via float64, as float(token) would
        values = np.asarray(data if data.dtype == np.float32 else data.astype(np.float64),
                            dtype=np.float32)
    bad = ~np.isfinite(values)
    if bad.any():
        k = int(np.argmax(bad))
        row = row0 + int(np.searchsorted(indptr, k, "right"))
        raise NonFiniteError(f"a value in row {row} is NaN or infinite", path=p,
                             column=int(indices[k]) + 1)
    code, r, idx = K.sort_check_rows(indptr, indices, values, width)
    if code:
        what = {K.E_INDEX_NEG: "is negative", K.E_INDEX_BIG: f"is >= the {width} columns",
                K.E_DUPLICATE: "appears twice"}[code]
        raise IngestError(f"column index {idx} in row {row0 + r + 1} {what}",
                          "Save a canonical CSR matrix (X.sum_duplicates(); X.sort_indices()).",
                          path=p)
    nnz = int(K.drop_zeros(indptr, indices, values))
    return RawChunk(labels, indptr, indices[:nnz], values[:nnz], row0 + 1, None,
                    0 if width else INDEX_SENTINEL, width - 1, width, bytes_read)


# -- idx (MNIST, Fashion-MNIST) ----------------------------------------------------------------
def idx_labels_path(images) -> Path | None:
    """The labels file of an idx images file: ``X-images-idx3-ubyte[.gz]`` pairs with
    ``X-labels-idx1-ubyte[.gz]`` beside it (compressed or not), as MNIST ships them."""
    images = Path(images)
    name = images.name
    if "images" not in name or "idx3" not in name:
        return None
    stem = name.replace("images", "labels").replace("idx3", "idx1")
    bare = stem[:-3] if stem.endswith(".gz") else stem
    for candidate in (stem, bare, bare + ".gz"):
        if (images.parent / candidate).is_file():
            return images.parent / candidate
    return images.parent / stem


def _idx_header(f, p: str, what: str) -> tuple[np.dtype, tuple]:
    head = bytes(read_full(f, 4))
    if not is_idx_head(head):
        raise IngestError(f"{what} is not an idx file (its first bytes are {head!r})",
                          "Pass the MNIST-format files as downloaded (gzip'd or not).", path=p)
    dims = np.frombuffer(bytes(read_full(f, 4 * head[3])), ">u4")
    if dims.size != head[3]:
        raise IngestError(f"{what} ends inside its header (truncated file)",
                          "Download the file again.", path=p)
    return np.dtype(IDX_TYPES[head[2]]), tuple(int(v) for v in dims)


def iter_idx(path, chunk_bytes: int) -> Iterator[RawChunk]:
    """Rows of an idx images file (each image flattened; unsigned bytes scaled to [0, 1], as
    the usual MNIST loaders do) with the labels of its ``-labels-idx1-`` file. The headers
    and the pairing are checked now; the rows are read lazily."""
    p = os.fspath(path)
    with open_binary(p) as f:
        dtype, shape = _idx_header(f, p, "the images file")
    if len(shape) == 1:
        raise IngestError("this is an idx labels file (one dimension); it is read with its "
                          "images file", "Pass the images file (…-images-idx3-…); its labels "
                          "are found beside it.", path=p)
    labels_at = idx_labels_path(p)
    if labels_at is None or not labels_at.is_file():
        want = labels_at.name if labels_at is not None else "NAME-labels-idx1-ubyte"
        raise IngestError(f"the labels of this idx images file are not beside it (looked for "
                          f"{want})", "Keep the MNIST names: X-images-idx3-ubyte[.gz] with "
                          "X-labels-idx1-ubyte[.gz] in the same folder.", path=p)
    with open_binary(labels_at) as g:
        ldtype, lshape = _idx_header(g, os.fspath(labels_at), "the labels file")
    n = shape[0]
    if len(lshape) != 1 or lshape[0] != n:
        raise IngestError(f"the labels file {labels_at.name} holds {lshape[0]} labels for {n} "
                          "images", "Pair each images file with its own labels file.", path=p)
    return _idx_rows(p, labels_at, dtype, ldtype, n, int(np.prod(shape[1:], dtype=np.int64)),
                     chunk_bytes)


def _idx_rows(p: str, labels_at: Path, dtype, ldtype, n: int, width: int,
              chunk_bytes: int) -> Iterator[RawChunk]:
    with open_binary(p) as f, open_binary(labels_at) as g:
        _idx_header(f, p, "the images file")
        _idx_header(g, os.fspath(labels_at), "the labels file")
        step = max(1, chunk_bytes // max(1, width * dtype.itemsize))
        for a in range(0, n, step):
            m = min(step, n - a)
            raw = read_full(f, m * width * dtype.itemsize)
            lab = read_full(g, m * ldtype.itemsize)
            if len(raw) != m * width * dtype.itemsize or len(lab) != m * ldtype.itemsize:
                raise IngestError(f"the idx data end before row {a + m} of {n} (truncated "
                                  "file)", "Download the files again.", path=p)
            X = np.frombuffer(raw, dtype).reshape(m, width)
            X = X / np.float32(255) if dtype == np.uint8 else X
            yield _dense_chunk(np.frombuffer(lab, ldtype), X, a, f.raw_tell(), p)
