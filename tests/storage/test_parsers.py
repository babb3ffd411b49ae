"""Streaming source parsers: exact agreement with scikit-learn and clear errors on bad input.

Reference: ``sklearn.datasets.load_svmlight_file`` (values compared as float32 with ``==``, no
tolerance) and, for single tokens, Python's ``float`` followed by ``np.float32``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import time
import tracemalloc
from decimal import Decimal

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import (dump_svmlight_file, load_breast_cancer, load_diabetes,
                              load_svmlight_file)

from ooc_learn.storage import _parse_kernels as K
from ooc_learn.storage import source_io
from ooc_learn.storage.errors import IngestError, ParameterError
from ooc_learn.storage.parsers import iter_chunks
from ooc_learn.storage.sniff import detect_format
from ooc_learn.storage.source_io import RawChunk, open_binary

# ---------------------------------------------------------------------------------------------
# helpers


def collect(path, **kw):
    """All chunks of ``path`` joined: (labels, indptr, indices, values, min, max, lines, chunks)."""
    chunks = list(iter_chunks(path, **kw))
    assert chunks and all(isinstance(c, RawChunk) for c in chunks)
    for c in chunks:
        assert c.labels.dtype == np.float64 and c.values.dtype == np.float32
        assert c.indptr.dtype == np.int64 and c.indices.dtype == np.int64
        assert c.indptr[0] == 0 and c.indptr[-1] == c.values.size == c.indices.size
        assert np.all(c.values != 0), "explicit zeros must be dropped"
        for r in range(c.n_rows):  # ascending, unique within each row
            assert np.all(np.diff(c.indices[c.indptr[r]:c.indptr[r + 1]]) > 0)
    offsets = np.cumsum([0] + [c.values.size for c in chunks[:-1]])
    indptr = np.concatenate([[0]] + [c.indptr[1:] + o for c, o in zip(chunks, offsets)])
    lines = None if chunks[0].line_numbers is None else \
        np.concatenate([c.line_numbers for c in chunks])
    return (np.concatenate([c.labels for c in chunks]), indptr,
            np.concatenate([c.indices for c in chunks]),
            np.concatenate([c.values for c in chunks]),
            min(c.min_index for c in chunks), max(c.max_index for c in chunks), lines, chunks)


def as_csr_like_sklearn(path, **kw):
    """Our parse, base-converted by scikit-learn's zero_based="auto" rule."""
    y, indptr, ind, val, lo, hi, _, _ = collect(path, **kw)
    shift = 0 if lo == 0 else 1
    return y, sp.csr_matrix((val, ind - shift, indptr), shape=(len(y), hi + 1 - shift))


def assert_same_as_sklearn(path, reference=None, **kw):
    y, X = as_csr_like_sklearn(path, **kw)
    Xs, ys = load_svmlight_file(str(reference or path), dtype=np.float32)
    assert X.shape == Xs.shape
    assert np.array_equal(y, ys)  # exact float64 labels
    assert (X != Xs).nnz == 0     # exact float32 values
    return y, X


def random_matrix(rng, n, d, density):
    X = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-3, 4, (n, d))
    X[rng.random((n, d)) >= density] = 0.0
    X[::7] = 0.0  # empty rows (label only)
    return X


FORMATS = ["{!r}", "{:.6f}", "{:.3e}", "{:g}", "{:.17g}", "{:+.2E}"]


def write_libsvm(path, X, y, *, base=1, crlf=False, comments=False, qid=False, shuffle=None,
                 formats=FORMATS):
    """Our own writer: varied float spellings, labels '+1'/'-1'/'1.5e3', comments, qid, CRLF."""
    nl = "\r\n" if crlf else "\n"
    out = ["# generated for a test" + nl] if comments else []
    for i in range(X.shape[0]):
        cols = np.flatnonzero(X[i])
        if shuffle is not None:
            cols = shuffle.permutation(cols)
        lab = {1.0: "+1", -1.0: "-1", 1500.0: "1.5e3"}.get(float(y[i]), repr(float(y[i])))
        toks = [lab] + ([f"qid:{i // 5}"] if qid else [])
        toks += [f"{c + base}:" + formats[(i + c) % len(formats)].format(float(X[i, c]))
                 for c in cols]
        tail = f"  # row {i}" if comments and i % 3 == 0 else ""
        out.append(" ".join(toks) + tail + nl)
        if comments and i % 4 == 0:
            out.append("# a comment line" + nl + nl)
    with open(path, "w", newline="") as f:
        f.write("".join(out))


def labels_for(rng, n):
    return rng.choice([1.0, -1.0, 1500.0, 2.0, 0.25], size=n)


# ---------------------------------------------------------------------------------------------
# LIBSVM round trips against scikit-learn


@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("base", [0, 1])
@pytest.mark.parametrize("chunk_bytes", [8 << 20, 97, 1])
def test_libsvm_matches_sklearn(tmp_path, rng, kind, base, chunk_bytes):
    X = random_matrix(rng, 120, 40, 0.1 if kind == "sparse" else 1.0)
    if base == 0:
        X[3, 0] = 1.0  # index 0 present: scikit-learn's "auto" reads the file as 0-based
    y = labels_for(rng, 120)
    path = tmp_path / "data.svm"
    write_libsvm(path, X, y, base=base, crlf=True, comments=True, qid=True)
    _, ours = assert_same_as_sklearn(path, chunk_bytes=chunk_bytes)
    assert ours.shape[1] == 40 - (X[:, -1] == 0).all() and ours.nnz == np.count_nonzero(X)
    labels, *_, lines, chunks = collect(path, chunk_bytes=chunk_bytes)
    text = path.read_text().split("\n")  # every row knows its line in the file
    assert [float(text[k - 1].split()[0]) for k in lines] == labels.tolist()
    assert [c.first_line for c in chunks] == [c.line_numbers[0] for c in chunks]
    sizes = [c.bytes_read for c in chunks]
    assert sizes == sorted(sizes) and sizes[-1] == os.path.getsize(path)


def test_dump_svmlight_file_round_trip(tmp_path, rng):
    X = random_matrix(rng, 200, 25, 0.3)
    y = rng.integers(0, 3, 200)
    for zero_based in (True, False):
        path = tmp_path / f"dump{zero_based}.svm"
        dump_svmlight_file(X, y, str(path), zero_based=zero_based, comment="made by sklearn",
                           query_id=np.arange(200) // 10)
        assert_same_as_sklearn(path, chunk_bytes=300)


@pytest.mark.parametrize("loader", [load_breast_cancer, load_diabetes])
def test_bundled_datasets_libsvm_and_csv(tmp_path, loader):
    X, y = loader(return_X_y=True)
    svm = tmp_path / "data.svm"
    dump_svmlight_file(X, y, str(svm), zero_based=False)
    ys, Xs = assert_same_as_sklearn(svm, chunk_bytes=4096)
    assert np.array_equal(Xs.toarray(), X.astype(np.float32))
    csv_path = tmp_path / "data.csv"
    names = ["target"] + [f"f{j}" for j in range(X.shape[1])]
    np.savetxt(csv_path, np.column_stack([y, X]), delimiter=",", fmt="%.17g",
               header=",".join(names), comments="")
    yc, ip, ind, val, lo, hi, lines, chunks = collect(csv_path, label_column="target",
                                                      chunk_bytes=4096)
    assert detect_format(csv_path) == "csv" and chunks[0].n_columns == X.shape[1]
    assert (lo, hi) == (0, X.shape[1] - 1)
    assert np.array_equal(yc, y)
    dense = sp.csr_matrix((val, ind, ip), shape=X.shape).toarray()
    assert np.array_equal(dense, X.astype(np.float32))
    assert lines[0] == 2 and lines[-1] == len(y) + 1


def test_unsorted_indices_are_sorted(tmp_path, rng):
    X = random_matrix(rng, 80, 30, 0.4)
    y = labels_for(rng, 80)
    write_libsvm(tmp_path / "sorted.svm", X, y)
    write_libsvm(tmp_path / "unsorted.svm", X, y, shuffle=np.random.default_rng(1))
    # scikit-learn refuses unsorted rows, so compare with it on the sorted twin
    assert_same_as_sklearn(tmp_path / "unsorted.svm", reference=tmp_path / "sorted.svm",
                           chunk_bytes=200)


@pytest.mark.parametrize("comp", ["gz", "bz2", "xz"])
def test_compressed_sources_by_magic(tmp_path, rng, comp):
    X = random_matrix(rng, 150, 20, 0.3)
    y = labels_for(rng, 150)
    plain = tmp_path / "plain.svm"
    write_libsvm(plain, X, y, comments=True)
    opener = {"gz": gzip.open, "bz2": bz2.open, "xz": lzma.open}[comp]
    packed = tmp_path / "packed.txt"  # misleading extension: detection is by magic bytes
    with open(plain, "rb") as src, opener(packed, "wb") as dst:
        dst.write(src.read())
    assert detect_format(packed) == "libsvm"
    with open_binary(packed) as f:
        assert f.read() == plain.read_bytes()
    assert_same_as_sklearn(packed, reference=plain, chunk_bytes=333)
    sizes = [c.bytes_read for c in iter_chunks(packed, chunk_bytes=333)]
    assert sizes == sorted(sizes) and sizes[-1] == os.path.getsize(packed)


def test_many_slow_tokens_resume_the_kernel(tmp_path, rng):
    """Tokens outside the exact fast path go to Python; more than the scratch holds at once."""
    n, d = 300, 40
    X = rng.standard_normal((n, d)) * 1e-30  # exponents beyond 1e-22: slow path
    X[0, :] = rng.standard_normal(d) * 1e30
    y = rng.standard_normal(n)  # repr labels with 17 digits are slow too
    path = tmp_path / "slow.svm"
    write_libsvm(path, X, y, formats=["{!r}"])
    one_row = tmp_path / "wide.svm"  # a single row with more slow tokens than the scratch
    wide = rng.standard_normal((1, 5000)) * 1e-25
    write_libsvm(one_row, wide, np.array([0.1]), formats=["{!r}"])
    for p in (path, one_row):
        assert_same_as_sklearn(p)


def test_min_and_max_index_include_zeros(tmp_path):
    path = tmp_path / "z.svm"
    path.write_text("1 0:0 4:1.5 9:0\n-1 2:0.0\n")
    y, ip, ind, val, lo, hi, _, _ = collect(path)
    assert (lo, hi) == (0, 9)
    assert ip.tolist() == [0, 1, 1] and ind.tolist() == [4] and val.tolist() == [1.5]
    assert_same_as_sklearn(path)
    labels_only = bad(path.parent, "1\n-1 # no features\n", "labels.svm")
    assert collect(labels_only)[4:6] == (source_io.INDEX_SENTINEL, -1)


def test_long_lines_and_tiny_chunks(tmp_path, rng):
    X = random_matrix(rng, 5, 3000, 1.0)
    path = tmp_path / "long.svm"
    write_libsvm(path, X, labels_for(rng, 5))
    assert_same_as_sklearn(path, chunk_bytes=1000)


# ---------------------------------------------------------------------------------------------
# number conversion: bit-exact with float()


def scan(tok: str, f32: bool):
    b = np.frombuffer(tok.encode() + b"\n", np.uint8)
    return K.scan_number(b, 0, len(b), f32)


def check_token(tok: str):
    kind, value, end = scan(tok, True)
    assert end == len(tok) and kind in (K.NUM_EXACT, K.NUM_SLOW)
    with np.errstate(over="ignore"):
        ref32 = np.float32(float(tok))
    if kind == K.NUM_EXACT:
        assert np.float32(value) == ref32 and np.signbit(np.float32(value)) == np.signbit(ref32)
    kind, value, _ = scan(tok, False)
    if kind == K.NUM_EXACT:
        assert value == float(tok)


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False),
       st.sampled_from(["{!r}", "{:.3e}", "{:g}", "{:.9g}", "{:.17g}", "{:.20e}", "{:f}"]))
def test_float_tokens_are_exact(x, fmt):
    check_token(fmt.format(x))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-149, max_value=127), st.integers(0, 2**23 - 1),
       st.integers(-3, 3), st.integers(17, 25))
def test_tokens_near_float32_midpoints_are_exact(e2, frac, nudge, digits):
    """Decimals a few units in the 25th digit around the midpoint of two float32 neighbours."""
    lo = np.float32(np.ldexp(1.0 + frac / 2**23, e2))
    hi = np.nextafter(lo, np.float32(np.inf))
    if not np.isfinite(hi):
        return
    mid = (Decimal(float(lo)) + Decimal(float(hi))) / 2
    tok = f"{mid + mid * Decimal(nudge) * Decimal(10) ** -digits:.{digits}e}"
    check_token(tok)


def test_fixed_float_spellings():
    for tok in ["+1", "-1", "2", "1.5e3", ".5", "5.", "-.5e-2", "0.1", "1e22", "1e23", "3e37",
                "123456789012345678901234567890", "0.000000000000000000000000001234",
                "1e-45", "7e-46", "3.4028235e38", "1.17549435e-38", "-0", "0e999"]:
        check_token(tok)
    for tok in ["inf", "-Infinity", "nan", "NaN"]:
        assert scan(tok, True)[0] == K.NUM_NONFINITE
    for tok in ["e5", ".", "-", "1e", "1e+", "x"]:
        assert scan(tok, True)[0] == K.NUM_BAD


def test_many_formatted_values_through_the_parser(tmp_path, rng):
    vals = rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 38, 3000)
    toks = [f.format(float(v)) for v, f in zip(vals, FORMATS * 500)]
    path = tmp_path / "v.svm"
    path.write_text("".join(f"1 1:{t}\n" for t in toks))
    _, ip, _, val, _, _, _, _ = collect(path, chunk_bytes=1000)
    want = np.array([np.float32(float(t)) for t in toks], dtype=np.float32)
    assert np.array_equal(val, want[want != 0]) and ip[-1] == np.count_nonzero(want)


# ---------------------------------------------------------------------------------------------
# CSV, npy, npz


@pytest.mark.parametrize("delim", [",", "\t", ";", " "])
def test_csv_delimiters_and_label_column(tmp_path, rng, delim):
    A = rng.integers(-2, 3, (50, 6)).astype(float) / 4
    path = tmp_path / "d.csv"
    sep = "   " if delim == " " else delim
    path.write_text("".join(sep.join(map(repr, row)) + "\r\n" for row in A.tolist()))
    y, ip, ind, val, lo, hi, lines, chunks = collect(path, label_column=-1, chunk_bytes=64)
    assert detect_format(path) == "csv"
    assert np.array_equal(y, A[:, -1]) and chunks[0].n_columns == 5
    dense = sp.csr_matrix((val, ind, ip), shape=(50, 5)).toarray()
    assert np.array_equal(dense, A[:, :-1].astype(np.float32))
    assert lines.tolist() == list(range(1, 51))


def test_csv_header_options(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("# made by hand\n\na,label,b\n1,5,0\n2,6,3.5\n")
    y, ip, ind, val, *_ = collect(path, label_column="label")
    assert y.tolist() == [5, 6] and ind.tolist() == [0, 0, 1] and val.tolist() == [1, 2, 3.5]
    numeric = tmp_path / "n.csv"
    numeric.write_text("1,2\n3,4\n")
    assert collect(numeric, header=True)[0].tolist() == [3]
    assert collect(numeric, header=False)[0].tolist() == [1, 3]
    with pytest.raises(IngestError, match="no header line"):
        iter_chunks(numeric, label_column="y")
    with pytest.raises(IngestError, match="no column named 'y'"):
        iter_chunks(path, label_column="y")
    with pytest.raises(IngestError, match="out of range"):
        iter_chunks(path, label_column=3)


def test_csv_quoted_numbers_as_r_and_spreadsheets_write_them(tmp_path):
    """R's write.csv quotes the header, text and row names ("1"); a spreadsheet may quote
    every field. A quoted number is read as the number (bit for bit as unquoted), and the
    class names stay the label; a quote left open or a doubled one is a bad field."""
    from ooc_learn.storage.ingest import ingest

    r = tmp_path / "r.csv"
    r.write_text('"","a","b","label"\n"1",0.1,"2.5e-3","x"\n"2","3",-4,"y"\n')
    with ingest([r], tmp_path / "r.store") as store:
        assert store.label_map["names"] == ["x", "y"]  # the column named label
        X, y, ids = store.gather(np.arange(2))
        X = X[np.argsort(ids)]
        assert X.tolist() == np.float32([[1, 0.1, 2.5e-3], [2, 3, -4]]).tolist()
    every = tmp_path / "q.csv"
    every.write_text('"f1","f2","f3"\n"1","0.5","7"\n"-1","1.5","8"\n')
    y, ip, ind, val, *_ = collect(every)
    assert y.tolist() == [1, -1] and val.tolist() == [0.5, 7, 1.5, 8]
    for bad, token in (('1,0,"2\n', '"2'), ('1,0,""2"\n', '""2"'), ('1,0,"2"3\n', '"2"3')):
        path = tmp_path / "bad.csv"
        path.write_text("label,a,b\n" + bad)
        with pytest.raises(IngestError, match="not a number") as exc:
            collect(path)
        assert f"token '{token}'" in str(exc.value) and "line 2" in str(exc.value)


def test_a_headerless_csv_whose_label_looks_last_warns(tmp_path):
    # UCI's files put the class last; the default (first column) then took a feature as
    # the label without a word. A label-first file says nothing
    last = tmp_path / "last.csv"
    last.write_text("".join(f"{i * 0.37:.2f},{i % 5 * 1.5},{i % 2}\n" for i in range(20)))
    with pytest.warns(RuntimeWarning, match="--label-column -1"):
        assert collect(last)[0].tolist()[:2] == [0.0, 0.37]
    assert collect(last, label_column=-1)[0].tolist()[:3] == [0, 1, 0]
    first = tmp_path / "first.csv"
    first.write_text("".join(f"{i % 2},{i * 0.37:.2f},{i % 5 * 1.5}\n" for i in range(20)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert collect(first)[0].tolist()[:3] == [0, 1, 0]


def test_csv_label_column_found_by_header_name(tmp_path):
    """A header naming the label (label / y / target / class, any case) picks that column
    (it silently took column 0 before, the last column then became a feature); two such names
    are refused, naming both; no such name keeps the first column."""
    last = tmp_path / "last.csv"
    last.write_text("f1,f2,Target\n0.5,2,1\n1.5,0,0\n")
    y, ip, ind, val, *_ = collect(last)
    assert y.tolist() == [1, 0] and val.tolist() == [0.5, 2, 1.5]
    assert collect(last, label_column=0)[0].tolist() == [0.5, 1.5]  # asked for: honoured
    both = tmp_path / "both.csv"
    both.write_text("y,f2,label\n1,2,3\n")
    with pytest.raises(IngestError, match=r"more than one label column: 'y' \(column 0\), "
                                          r"'label' \(column 2\)") as exc:
        iter_chunks(both)
    assert "--label-column" in exc.value.hint
    assert collect(both, label_column="label")[0].tolist() == [3]
    plain = tmp_path / "plain.csv"
    plain.write_text("a,b,c\n7,8,9\n")
    with pytest.warns(RuntimeWarning, match="names no label column.*'a', is the label"):
        assert collect(plain)[0].tolist() == [7]  # the first column, said so
    numeric = tmp_path / "n.csv"
    numeric.write_text("4,2\n3,1\n")
    assert collect(numeric)[0].tolist() == [4, 3]


def test_byte_order_mark_is_skipped(tmp_path):
    svm = bad(tmp_path, "\ufeff1 1:0.5\n-1 2:2\n")
    assert detect_format(svm) == "libsvm" and collect(svm)[0].tolist() == [1, -1]
    csv = bad(tmp_path, "\ufefflabel,a\n1,2\n", "bom.csv")
    assert collect(csv, label_column="label")[3].tolist() == [2.0]


def test_npy_dense(tmp_path, rng):
    A = random_matrix(rng, 101, 7, 0.5)
    path = tmp_path / "a.npy"
    np.save(path, A)
    y, ip, ind, val, lo, hi, lines, chunks = collect(path, label_column=2, chunk_bytes=200)
    assert detect_format(path) == "npy" and len(chunks) > 5 and lines is None
    assert chunks[1].first_line == chunks[0].n_rows + 1
    assert np.array_equal(y, A[:, 2])
    dense = sp.csr_matrix((val, ind, ip), shape=(101, 6)).toarray()
    assert np.array_equal(dense, np.delete(A, 2, axis=1).astype(np.float32))
    packed = tmp_path / "a.npy.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert collect(packed, label_column=2, chunk_bytes=200)[0].tolist() == y.tolist()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_dense_and_csr(tmp_path, rng, save):
    X = random_matrix(rng, 90, 12, 0.3).astype(np.float32)
    y = rng.integers(0, 2, 90)
    dense = tmp_path / "d.npz"
    save(dense, X=X, y=y)
    yd, ip, ind, val, *_ = collect(dense, chunk_bytes=100)
    assert detect_format(dense) == "npz" and np.array_equal(yd, y)
    assert np.array_equal(sp.csr_matrix((val, ind, ip), shape=X.shape).toarray(), X)
    named = tmp_path / "named.npz"
    save(named, features=X, target=y[:, None])
    assert np.array_equal(collect(named, npz_keys=("features", "target"))[0], y)
    S = sp.csr_matrix(X)
    S.data[::5] = 0.0  # explicit zeros are dropped
    shuffled = S.copy()  # unsorted column indices within rows are sorted
    for r in range(90):
        a, b = shuffled.indptr[r], shuffled.indptr[r + 1]
        order = rng.permutation(b - a)
        shuffled.indices[a:b], shuffled.data[a:b] = S.indices[a:b][order], S.data[a:b][order]
    sparse = tmp_path / "s.npz"
    save(sparse, data=shuffled.data, indices=shuffled.indices, indptr=shuffled.indptr,
         shape=np.array(S.shape), format=np.bytes_(b"csr"), y=y)
    ys, ip, ind, val, lo, hi, _, chunks = collect(sparse, chunk_bytes=64)
    assert len(chunks) > 3 and np.array_equal(ys, y) and (lo, hi) == (0, 11)
    S.eliminate_zeros()
    assert np.array_equal(ip, S.indptr) and np.array_equal(ind, S.indices)
    assert np.array_equal(val, S.data)


# ---------------------------------------------------------------------------------------------
# bad input


def bad(tmp_path, text: str, name="bad.svm", **kw):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def raises_at(path, match, line, column=None, **kw):
    with pytest.raises(IngestError, match=match) as info:
        for _ in iter_chunks(path, **kw):
            pass
    err = info.value
    assert err.line == line and err.path == str(path)
    if column is not None:
        assert err.column == column
    assert err.hint
    return err


GOOD = "# header comment\n1 1:0.5 3:2\n-1 2:1\n"


@pytest.mark.parametrize("chunk_bytes", [8 << 20, 5])
@pytest.mark.parametrize("token", ["3:x", "3", ":4", "a:1", "3:", "3:1.5.2", "3:1e", "qid:x"])
def test_malformed_tokens(tmp_path, token, chunk_bytes):
    path = bad(tmp_path, GOOD + f"1 1:1 {token} 7:2\n")
    err = raises_at(path, "malformed", 4, column=3, chunk_bytes=chunk_bytes)
    assert err.token == token and "line 4" in str(err) and str(path) in str(err)


def test_long_bad_token_is_shortened(tmp_path):
    err = raises_at(bad(tmp_path, GOOD + "1 3:" + "x" * 10_000 + "\n"), "malformed", 4)
    assert err.token.startswith("3:xxx") and len(err.token) < 100 and len(str(err)) < 600


@pytest.mark.parametrize("line,match", [("abc 1:2", "label is not a number"),
                                        ("1:0.5 2:1", "no label"),
                                        ("nan 1:2", "label is NaN or infinite"),
                                        ("-inf 1:2", "label is NaN or infinite"),
                                        ("1e400 1:2", "label overflows")])
def test_bad_labels(tmp_path, line, match):
    raises_at(bad(tmp_path, GOOD + line + "\n"), match, 4, column=1)


@pytest.mark.parametrize("token,match", [("4:nan", "NaN or infinite"), ("4:-inf", "NaN or inf"),
                                         ("4:1e39", "overflows float32"),
                                         ("4:1e400", "overflows float32")])
def test_nonfinite_values(tmp_path, token, match):
    err = raises_at(bad(tmp_path, GOOD + f"1 1:1 {token}\n"), match, 4, column=3)
    assert err.token == token


@pytest.mark.parametrize("token,match", [("-3:1", "negative"),
                                         ("2147483648:1", "above 2\\*\\*31-1"),
                                         ("9" * 40 + ":1", "above 2\\*\\*31-1")])
def test_bad_indices_without_big_allocations(tmp_path, token, match):
    path = bad(tmp_path, GOOD + f"1 {token}\n")
    tracemalloc.start()
    try:
        raises_at(path, match, 4, column=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20  # nothing proportional to the index (2**31 * 4 bytes would be 8 GiB)
    assert collect(bad(tmp_path, "1 2147483647:1\n", "max.svm"))[5] == 2**31 - 1


@pytest.mark.parametrize("row,column", [("1 3:1 3:2", 3), ("1 5:1 3:1 5:2", 4)])
def test_duplicate_index(tmp_path, row, column):
    err = raises_at(bad(tmp_path, GOOD + row + "\n"), "index . appears twice", 4, column=column)
    assert err.token.endswith(":2")


@pytest.mark.parametrize("text", ["", "\n\n  \n", "# only\n# comments\n"])
def test_empty_source(tmp_path, text):
    path = bad(tmp_path, text)
    for fmt in ("auto", "libsvm", "csv"):
        with pytest.raises(IngestError, match="no data rows") as info:
            list(iter_chunks(path, fmt=fmt))
        assert info.value.path == str(path)
    packed = tmp_path / "empty.svm.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(IngestError, match="no data rows"):
        list(iter_chunks(packed, fmt="libsvm"))


def test_csv_errors(tmp_path):
    head = "y,a,b\n1,2,3\n"
    raises_at(bad(tmp_path, head + "1,2,3,4\n", "w.csv"), "4 fields but the file has 3", 3)
    raises_at(bad(tmp_path, head + "1,2\n", "n.csv"), "2 fields but the file has 3", 3)
    raises_at(bad(tmp_path, head + "1,,3\n", "m.csv"), "missing value", 3, column=2)
    err = raises_at(bad(tmp_path, head + "1,2,x\n", "t.csv"), "not a number", 3, column=3)
    assert err.token == "x"
    raises_at(bad(tmp_path, head + "1,2,nan\n", "f.csv"), "NaN or infinite", 3, column=3)
    raises_at(bad(tmp_path, "1 2 3\n4 5 6 7\n", "ws.csv"), "4 fields", 2)


def test_layout_change_mid_file(tmp_path):
    lib = bad(tmp_path, GOOD * 3 + "1,0.5,2,3\n")
    raises_at(lib, "detected as LIBSVM from its first lines but line 10 looks like CSV", 10)
    raises_at(lib, "read as LIBSVM but line 10 looks like CSV", 10, fmt="libsvm")
    csv = bad(tmp_path, "1,2,3\n4,5,6\n1 1:2 2:3\n", "c.csv")
    raises_at(csv, "detected as CSV from its first lines but line 3 looks like LIBSVM", 3)


def test_missing_and_unreadable_files(tmp_path, monkeypatch):
    with pytest.raises(IngestError, match="does not exist") as info:
        iter_chunks(tmp_path / "nope.svm")
    assert info.value.path == str(tmp_path / "nope.svm") and "path" in info.value.hint
    with pytest.raises(IngestError, match="is a directory"):
        iter_chunks(tmp_path, fmt="libsvm")
    locked = bad(tmp_path, GOOD)
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):  # root ignores permission bits: simulate the refusal
            def refuse(path, *args, **kw):
                raise PermissionError(13, "Permission denied", str(path))
            monkeypatch.setattr(source_io, "open", refuse, raising=False)
        with pytest.raises(IngestError, match="permission denied") as info:
            iter_chunks(locked)
        assert info.value.path == str(locked) and "chmod" in info.value.hint
    finally:
        locked.chmod(0o644)


@pytest.mark.parametrize("comp", ["gz", "xz", "bz2"])
def test_truncated_and_corrupted_streams(tmp_path, rng, comp):
    text = "".join(f"1 1:{v!r} 2:{v / 3!r}\n" for v in rng.standard_normal(5000).tolist()).encode()
    packed = {"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}[comp](text)
    cut = tmp_path / f"cut.{comp}"
    cut.write_bytes(packed[:len(packed) // 2])
    with pytest.raises(IngestError, match="truncated or corrupted") as info:
        list(iter_chunks(cut, fmt="libsvm", chunk_bytes=4096))
    assert info.value.path == str(cut)
    broken = bytearray(packed)
    broken[len(broken) // 2:len(broken) // 2 + 64] = bytes(64)
    bad_file = tmp_path / f"bad.{comp}"
    bad_file.write_bytes(bytes(broken))
    with pytest.raises(IngestError, match="truncated or corrupted|malformed|not a number"):
        list(iter_chunks(bad_file, fmt="libsvm"))


def test_binary_source_errors(tmp_path):
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(IngestError, match="not a numeric type"):
        list(iter_chunks(obj))
    flat = tmp_path / "f.npy"
    np.save(flat, np.arange(5.0))
    with pytest.raises(IngestError, match="expected a 2-D array"):
        list(iter_chunks(flat))
    holes = tmp_path / "h.npy"
    np.save(holes, np.array([[1.0, 2.0], [1.0, np.nan]]))
    with pytest.raises(IngestError, match="row 2 is NaN") as info:
        list(iter_chunks(holes))
    assert info.value.column == 1
    no_y = tmp_path / "x.npz"
    np.savez(no_y, X=np.ones((3, 2)))
    with pytest.raises(IngestError, match="no member 'y'"):
        list(iter_chunks(no_y))
    csc = tmp_path / "csc.npz"
    M = sp.random(5, 4, density=0.5, format="csc", random_state=0)
    np.savez(csc, data=M.data, indices=M.indices, indptr=M.indptr, shape=M.shape,
             format=np.bytes_(b"csc"), y=np.ones(5))
    with pytest.raises(IngestError, match="CSC, not CSR"):
        list(iter_chunks(csc))
    dup = tmp_path / "dup.npz"
    np.savez(dup, data=np.ones(2), indices=np.array([1, 1]), indptr=np.array([0, 2]),
             shape=np.array([1, 3]), format=np.bytes_(b"csr"), y=np.ones(1))
    with pytest.raises(IngestError, match="index 1 in row 1 appears twice"):
        list(iter_chunks(dup))
    garbage = tmp_path / "g.bin"
    garbage.write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(IngestError, match="not text"):
        detect_format(garbage)


@pytest.mark.parametrize("kw,name", [({"fmt": "json"}, "fmt"), ({"chunk_bytes": 0}, "chunk_bytes"),
                                     ({"label_column": 1.5}, "label_column"),
                                     ({"delimiter": "ab"}, "delimiter"),
                                     ({"header": "yes"}, "header"),
                                     ({"npz_keys": ("X",)}, "npz_keys")])
def test_parameters_checked_before_reading(tmp_path, kw, name):
    with pytest.raises(ParameterError, match=f"The '{name}' parameter of iter_chunks must be"):
        iter_chunks(tmp_path / "does-not-exist", **kw)


def test_detect_format(tmp_path):
    cases = {"a.txt": ("# c\n1 qid:1 2:3\n", "libsvm"), "b.txt": ("1\n-1\n", "libsvm"),
             "c.txt": ("x,y\n1,2\n", "csv"), "d.txt": ("1\t2\t3\n", "csv"),
             "e.txt": ("1 2 3\n", "csv"), "f.txt": ("1 1:2\n1,2,3\n", "libsvm")}
    for name, (text, fmt) in cases.items():
        assert detect_format(bad(tmp_path, text, name)) == fmt, name


# ---------------------------------------------------------------------------------------------
# speed (long: run with -m slow)


@pytest.mark.slow
def test_parse_throughput_vs_sklearn(tmp_path):
    """Our parse alone must reach 1.5x scikit-learn's throughput on a ~80 MB LIBSVM file."""
    rng = np.random.default_rng(0)
    path = tmp_path / "bench.svm"
    n, d = 200_000, 300
    with open(path, "w") as f:
        for a in range(0, n, 20_000):
            mask = rng.random((20_000, d)) < 0.1
            vals = rng.standard_normal((20_000, d))
            ys = rng.integers(0, 2, 20_000) * 2 - 1
            f.write("".join(f"{ys[i]:+d} " + " ".join(f"{c + 1}:{vals[i, c]:.6f}"
                                                       for c in np.flatnonzero(mask[i])) + "\n"
                            for i in range(20_000)))
    list(iter_chunks(path, chunk_bytes=1 << 16))  # warm numba's cache
    mb = os.path.getsize(path) / 1e6
    t0 = time.perf_counter()
    for _ in iter_chunks(path):
        pass
    ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_svmlight_file(str(path), dtype=np.float32)
    theirs = time.perf_counter() - t0
    print(f"\n{mb:.1f} MB: iter_chunks {mb / ours:.1f} MB/s, load_svmlight_file "
          f"{mb / theirs:.1f} MB/s, ratio {theirs / ours:.2f}x")
    assert theirs / ours >= 1.5


def _write_idx(path, arr, code=0x08, gz=False):
    import gzip as _gz
    import struct

    big = arr.astype(arr.dtype.newbyteorder(">"))
    raw = (struct.pack(">BBBB", 0, 0, code, arr.ndim)
           + struct.pack(f">{arr.ndim}I", *arr.shape) + big.tobytes())
    with (_gz.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(raw)


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_idx_images_with_their_labels(tmp_path, rng, gz):
    """MNIST / Fashion-MNIST as downloaded: images flattened and scaled to [0, 1], labels from
    the -labels-idx1- file beside them."""
    imgs = rng.integers(0, 256, (37, 4, 3)).astype(np.uint8)
    imgs[5] = 0  # an all-zero image
    labels = rng.integers(0, 10, 37).astype(np.uint8)
    ext = ".gz" if gz else ""
    images = tmp_path / f"train-images-idx3-ubyte{ext}"
    _write_idx(images, imgs, gz=gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{ext}", labels, gz=gz)
    assert detect_format(images) == "idx"
    y, ip, ind, val, lo, hi, lines, chunks = collect(images, chunk_bytes=60)
    assert len(chunks) > 1 and y.tolist() == labels.tolist()
    dense = sp.csr_matrix((val, ind, ip), shape=(37, 12)).toarray()
    np.testing.assert_array_equal(dense, (imgs.reshape(37, 12) / np.float32(255)))
    with pytest.raises(IngestError, match="idx labels file"):
        iter_chunks(tmp_path / f"train-labels-idx1-ubyte{ext}")
    other = tmp_path / f"t10k-images-idx3-ubyte{ext}"
    _write_idx(other, imgs, gz=gz)
    with pytest.raises(IngestError, match="t10k-labels-idx1-ubyte"):
        list(iter_chunks(other))
    _write_idx(tmp_path / f"t10k-labels-idx1-ubyte{ext}", labels[:30], gz=gz)
    with pytest.raises(IngestError, match="30"):
        list(iter_chunks(other))


def test_idx_truncated_images_are_refused(tmp_path, rng):
    imgs = rng.integers(0, 256, (10, 2, 2)).astype(np.uint8)
    images = tmp_path / "x-images-idx3-ubyte"
    _write_idx(images, imgs)
    _write_idx(tmp_path / "x-labels-idx1-ubyte", np.arange(10, dtype=np.uint8))
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(IngestError, match="truncated"):
        list(iter_chunks(images))


def test_csv_class_names_as_labels(tmp_path):
    """A label column of class names: codes as the names are first met (the ingest orders
    them), quotes and spaces taken off; without a LabelNames the column is refused; fixed
    names (test data) refuse another name, naming its line."""
    from ooc_learn.storage.labels import LabelNames

    src = tmp_path / "iris.csv"
    src.write_text('1.5,0.2,"setosa"\n4.7,1.4, versicolor\n1.4,0.2,setosa\r\n6.0,2.5,virginica\n')
    names = LabelNames()
    y, ip, ind, val, *_ = collect(src, label_names=names, chunk_bytes=30)
    assert names.names == ["setosa", "versicolor", "virginica"] and y.tolist() == [0, 1, 0, 2]
    assert val[:2].tolist() == [1.5, np.float32(0.2)]  # the first line is data, no header
    with pytest.raises(IngestError, match="holds text"):
        iter_chunks(src)
    fixed = LabelNames(["setosa", "virginica"], fixed=True)
    with pytest.raises(IngestError, match="'versicolor' is not a class") as exc:
        collect(src, label_names=fixed)
    assert exc.value.line == 2
    headed = tmp_path / "h.csv"
    headed.write_text("a,species,b\n1,x,2\n3,y,4\n")  # the one text column is the label
    y, ip, ind, val, *_ = collect(headed, label_names=LabelNames())
    assert y.tolist() == [0, 1] and val.tolist() == [1, 2, 3, 4]
