"""The contract every ingest source must pass (``storage/parsers.py``, ``_array_sources.py``).

A new source format is added as one line of ``SOURCES``; it must then pass every test here.
Every source is written from the SAME small data (small integers and dyadic fractions, so
text round-trips exactly; an all-zero row, a duplicate row, three classes) and:

* ingests to the same store: the same n_samples, n_features, task and label map, and the same
  rows (X and y) once ordered by ``row_id``, each equal to the data written;
* a malformed file (one case per format) raises ``IngestError`` whose message names the file,
  and leaves no store behind;
* a NaN feature value is refused the same way, by every source.
"""
import bz2
import gzip
import io
import lzma
import struct
from typing import Callable, NamedTuple

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.api import ingest, ingest_arrays
from ooc_learn.storage.errors import IngestError

N, D = 30, 6


def _data():
    rng = np.random.default_rng(7)
    X = rng.integers(-2, 4, size=(N, D)).astype(np.float32)
    X[rng.random((N, D)) < 0.5] = 0.0
    X[4, 1], X[6, 3] = 0.5, -1.25  # exact in binary, so exact in text
    X[0] = 0.0                     # an all-zero row
    X[2] = X[1]                    # a duplicate row
    X[3, 0], X[3, D - 1] = 1.0, 2.0  # every column index appears (LIBSVM infers d from them)
    y = np.arange(N) % 3           # classes 0, 1, 2
    return X, y


# -- writers: (X, y) -> [(file name, bytes)], the source to ingest first -----------------------
def _num(v) -> str:
    return str(int(v)) if np.isfinite(v) and v == int(v) else repr(float(v))


def _libsvm(X, y):
    lines = [" ".join([str(int(label))] + [f"{j + 1}:{_num(v)}" for j, v in enumerate(row)
                                            if v != 0]) for row, label in zip(X, y)]
    return [("d.svm", ("\n".join(lines) + "\n").encode())]


def _csv(X, y):
    lines = [",".join([str(int(label))] + [_num(v) for v in row]) for row, label in zip(X, y)]
    return [("d.csv", ("\n".join(lines) + "\n").encode())]


def _csv_header(X, y):  # the label last, found by its header name
    lines = [",".join([f"f{j}" for j in range(D)] + ["label"])]
    lines += [",".join([_num(v) for v in row] + [str(int(label))]) for row, label in zip(X, y)]
    return [("h.csv", ("\n".join(lines) + "\n").encode())]


def _npy(X, y):  # the label as the last column (label_column=-1)
    buf = io.BytesIO()
    np.save(buf, np.c_[X, y.astype(np.float32)])
    return [("d.npy", buf.getvalue())]


def _npz(**members):
    buf = io.BytesIO()
    np.savez(buf, **members)
    return buf.getvalue()


def _npz_dense(X, y):
    return [("d.npz", _npz(X=X, y=y))]


def _npz_csr(X, y, shift=0):
    m = sp.csr_matrix(X)
    return [("s.npz", _npz(data=m.data, indices=m.indices + shift, indptr=m.indptr,
                           format=np.array(b"csr"), shape=np.array(m.shape), y=y))]


def _idx_file(arr, code):
    return (struct.pack(">BBBB", 0, 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
            + arr.astype(arr.dtype.newbyteorder(">")).tobytes())


def _idx(X, y, labels=None):
    # float32 images (type 0x0D) are taken as they are (unsigned bytes would be scaled by 1/255)
    labels = y if labels is None else labels
    return [("d-images-idx3-ubyte", _idx_file(X.reshape(len(X), 2, D // 2), 0x0D)),
            ("d-labels-idx1-ubyte", _idx_file(labels.astype(np.uint8), 0x08))]


# -- malformations: (X, y) -> files, one per format --------------------------------------------
def _bad_libsvm(X, y):
    (name, raw), = _libsvm(X, y)
    lines = raw.decode().splitlines()
    lines[5] += " 3:0.5x"
    return [(name, ("\n".join(lines) + "\n").encode())]


def _bad_csv(X, y):
    (name, raw), = _csv(X, y)
    lines = raw.decode().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",seven"
    return [(name, ("\n".join(lines) + "\n").encode())]


def _bad_csv_header(X, y):
    (name, raw), = _csv_header(X, y)
    lines = raw.decode().splitlines()
    lines[5] = lines[5].split(",", 1)[1]  # a row one field short
    return [(name, ("\n".join(lines) + "\n").encode())]


def _bad_npy(X, y):
    (name, raw), = _npy(X, y)
    return [(name, raw[:-10])]  # truncated inside the array data


def _bad_npz_dense(X, y):
    return _npz_dense(X, y[:-1])  # one label short


def _bad_npz_csr(X, y):
    return _npz_csr(X, y, shift=D)  # column indices past the matrix's width


def _bad_idx(X, y):
    return _idx(X, y, labels=y[:-1])  # a labels file of the wrong length


def _truncated(files):
    """The first (compressed) file cut in half: a broken stream."""
    (name, raw), *rest = files
    return [(name, raw[: len(raw) // 2]), *rest]


_COMPRESS = {"": lambda b: b, ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


class FileSource(NamedTuple):
    write: Callable           # (X, y) -> [(name, bytes)]
    malformed: Callable       # (X, y) -> [(name, bytes)], before compression
    compression: str = ""     # "", ".gz", ".bz2" or ".xz": applied to every file
    kwargs: dict = {}         # what ingest needs besides the path

    def files(self, tmp, X, y, bad=False):
        """Write the source (or its malformed twin) into ``tmp``; return the paths."""
        out = []
        files = (self.malformed if bad and not self.compression else self.write)(X, y)
        files = [(name + self.compression, _COMPRESS[self.compression](raw))
                 for name, raw in files]
        if bad and self.compression:
            files = _truncated(files)
        for name, raw in files:
            (tmp / name).write_bytes(raw)
            out.append(tmp / name)
        return out

    def name(self, X, y) -> str:
        """What an error about this source must name: its (first) file."""
        return self.write(X, y)[0][0] + self.compression

    def ingest(self, tmp, X, y, out, bad=False):
        return ingest(self.files(tmp, X, y, bad)[0], out, n_blocks=3, **self.kwargs)


class ArraySource(NamedTuple):
    csr: bool

    def name(self, X, y) -> str:
        return "<arrays>"

    def ingest(self, tmp, X, y, out, bad=False):
        if bad:
            y = y.astype(np.float64)
            y[5] = np.inf  # the one malformation in-memory arrays can carry
        X = sp.csr_matrix(X) if self.csr else X
        return ingest_arrays(X, y, out, n_blocks=3, build_index=True)


# ---------------------------------------------------------------------------------------------
# THE TABLE: every source format. Add a new one here, in one line.
SOURCES = {
    "libsvm": FileSource(_libsvm, _bad_libsvm),
    "libsvm.gz": FileSource(_libsvm, _bad_libsvm, ".gz"),
    "libsvm.xz": FileSource(_libsvm, _bad_libsvm, ".xz"),
    "csv": FileSource(_csv, _bad_csv),
    "csv.bz2": FileSource(_csv, _bad_csv, ".bz2"),
    "csv-header": FileSource(_csv_header, _bad_csv_header),
    "csv-header.gz": FileSource(_csv_header, _bad_csv_header, ".gz"),
    "npy": FileSource(_npy, _bad_npy, kwargs={"label_column": -1}),
    "npy.gz": FileSource(_npy, _bad_npy, ".gz", kwargs={"label_column": -1}),
    "npz-dense": FileSource(_npz_dense, _bad_npz_dense),
    "npz-csr": FileSource(_npz_csr, _bad_npz_csr),
    "idx": FileSource(_idx, _bad_idx),
    "idx.gz": FileSource(_idx, _bad_idx, ".gz"),
    "arrays-dense": ArraySource(csr=False),
    "arrays-csr": ArraySource(csr=True),
}
# ---------------------------------------------------------------------------------------------

# real bugs found by this suite: (test, source) -> reason (strict xfail: fixing it turns red)
KNOWN_BUGS: dict = {}


def _cases(test: str):
    return [pytest.param(i, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[test, i]))
            if (test, i) in KNOWN_BUGS else i for i in sorted(SOURCES)]


def _content(store):
    """(X dense, y) in row_id order, and the sorted row ids."""
    X, y, ids = store.read_range(0, store.n_samples)
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    order = np.argsort(ids, kind="stable")
    return X[order], np.asarray(y)[order], np.asarray(ids)[order]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The store of the in-memory dense arrays: what every source must ingest to."""
    X, y = _data()
    out = tmp_path_factory.mktemp("reference") / "store"
    with ingest_arrays(X, y, out, n_blocks=3, build_index=True) as st:
        return {"n": st.n_samples, "d": st.n_features, "task": st.task,
                "label_map": st.label_map, "content": _content(st)}


@pytest.mark.parametrize("name", _cases("same"))
def test_every_source_ingests_the_same_store(tmp_path, reference, name):
    X, y = _data()
    with SOURCES[name].ingest(tmp_path, X, y, tmp_path / "store") as store:
        assert (store.n_samples, store.n_features) == (reference["n"], reference["d"]) == (N, D)
        assert store.task == reference["task"] == "multiclass"
        assert store.label_map == reference["label_map"]
        Xs, ys, ids = _content(store)
    assert np.array_equal(ids, np.arange(N))  # every row once
    assert Xs.dtype == np.float32 and np.array_equal(Xs, X)
    assert np.array_equal(ys, y)  # classes 0..2 keep their codes
    rX, ry, _ = reference["content"]
    assert np.array_equal(Xs, rX) and np.array_equal(ys, ry)


@pytest.mark.parametrize("name", _cases("malformed"))
def test_malformed_source_is_refused_naming_the_file(tmp_path, name):
    X, y = _data()
    out = tmp_path / "store"
    with pytest.raises(IngestError) as info:
        SOURCES[name].ingest(tmp_path, X, y, out, bad=True).close()
    assert SOURCES[name].name(X, y) in str(info.value)
    assert not out.exists()  # a failed ingest leaves no store behind


@pytest.mark.parametrize("name", _cases("nan"))
def test_nan_feature_value_is_refused_naming_the_file(tmp_path, name):
    X, y = _data()
    X[7, 2] = np.nan
    out = tmp_path / "store"
    with pytest.raises(IngestError) as info:
        SOURCES[name].ingest(tmp_path, X, y, out).close()
    assert SOURCES[name].name(X, y) in str(info.value)
    assert not out.exists()
