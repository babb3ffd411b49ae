"""Value codes (``storage/value_codes.py``): a dense X with few distinct values is stored as
1- or 2-byte codes and read back as the same float32 rows, bit for bit, by every read path;
a store whose later blocks bring more values than the first showed starts again wider; a
forced width that cannot hold the data is refused without touching what is stored."""

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from ooc_learn.api import ingest, ingest_arrays
from ooc_learn.storage.errors import IngestError, StoreFormatError
from ooc_learn.storage.store import open_store
from ooc_learn.storage.value_codes import ValueCodes, ValueCodesFull, decode

INGEST = [sys.executable, "-c",
          "import sys; from ooc_learn.cli import ingest_main; sys.exit(ingest_main())"]


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Pieces of 64 KiB, so that these small stores' reads take several (and the direct
    reads' SMALL_READ floor is met by one piece)."""
    import ooc_learn.storage.arrays as arrays

    monkeypatch.setattr(arrays, "CODED_PIECE", 64 << 10)
    monkeypatch.setattr(arrays, "SMALL_READ", 16 << 10)


def pixels(rng, n=3000, d=64):
    """Image-like rows: 256 levels k / 255 (float32 as numpy rounds them), half of them 0."""
    X = (rng.integers(0, 256, (n, d)) / 255).astype(np.float32)
    X[rng.random((n, d)) < 0.5] = 0.0
    y = np.where(X[:, :8].sum(1) > np.median(X[:, :8].sum(1)), 1.0, -1.0)
    return X, y


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def test_pixels_are_stored_as_uint8_codes_and_every_read_gives_the_same_bits(tmp_path, rng):
    X, y = pixels(rng)
    with ingest_arrays(X, y, tmp_path / "c", n_blocks=4) as coded, \
            ingest_arrays(X, y, tmp_path / "f", n_blocks=4, value_codes=None) as plain:
        assert coded.value_codes == "uint8" and plain.value_codes is None
        assert coded.metadata["value_codes"]["width"] == "uint8"
        assert coded.metadata["value_codes"]["distinct"] == np.unique(bits(X)).size
        assert 3 * (tmp_path / "c" / "data.h5").stat().st_size < (
            tmp_path / "f" / "data.h5").stat().st_size
        A, ya, ids = coded.read_range(0, coded.n_samples)
        B, yb, idb = plain.read_range(0, plain.n_samples)
        assert A.dtype == np.float32
        np.testing.assert_array_equal(ids, idb)
        np.testing.assert_array_equal(bits(A), bits(X[ids]))
        np.testing.assert_array_equal(bits(A), bits(B))
        # a block through the cache, scattered rows, runs of rows, a range inside a block
        b1 = coded.read_block(1)[0]
        lo, hi = coded.block_offsets[1:3]
        np.testing.assert_array_equal(bits(b1), bits(A[lo:hi]))
        rows = np.array([0, 1, 2, 57, 58, 900, 1500, 2999])
        np.testing.assert_array_equal(bits(coded.read_rows(rows)[0]), bits(A[rows]))
        G, _, gi = coded.gather(rows[::-1], whole_blocks=False)
        np.testing.assert_array_equal(bits(G), bits(A[rows[::-1]]))
        assert coded.verify() == [] and plain.verify() == []
        # past the page cache (O_DIRECT where the file system has it): pieces of codes
        # read aligned into the reader's buffer, a chunk larger than a piece
        with open_store(tmp_path / "c", direct=True) as d:
            for lo, hi in ((0, d.n_samples), (7, 2993), (1, 2)):
                np.testing.assert_array_equal(bits(d.read_range(lo, hi)[0]), bits(A[lo:hi]))
        # the bytes read are the codes': a quarter of the float32 rows (+ labels, ids)
        before = coded.bytes_read
        coded.read_range(0, 1000)
        assert coded.bytes_read - before == 1000 * (64 + 4 + 8)


def test_a_direct_npy_ingest_writes_codes_and_the_same_rows(tmp_path, rng):
    X, y = pixels(rng, n=20000, d=100)
    src = tmp_path / "train.npy"
    np.save(src, np.insert(X, 0, y, axis=1))
    with ingest([src], tmp_path / "s", label_column=0, memory="10M", seed=1) as st:
        assert st.ingest_stats["direct_passes"] >= 2  # the direct path, in group passes
        assert st.value_codes == "uint8" and st.has_index
        A, ys, ids = st.read_range(0, st.n_samples)
        np.testing.assert_array_equal(bits(A), bits(X[ids]))
        assert st.verify() == []


def test_small_counts_take_uint16_and_continuous_values_stay_float32(tmp_path, rng):
    counts = rng.integers(0, 2000, (4000, 30)).astype(np.float32)
    y = np.where(rng.random(4000) < 0.5, 1.0, -1.0)
    with ingest_arrays(counts, y, tmp_path / "u16") as st:
        assert st.value_codes == "uint16"
        A, _, ids = st.read_range(0, st.n_samples)
        np.testing.assert_array_equal(bits(A), bits(counts[ids]))
    Z = rng.normal(size=(4000, 30)).astype(np.float32)
    with ingest_arrays(Z, y, tmp_path / "f32") as st:
        assert st.value_codes is None
        assert st.ingest_stats["restarts"] == 0


def rare_values_later(rng, n=20000, d=20):
    """150 common values everywhere and 600 that each appear once: the first of 10 blocks
    shows ~210 distinct values (uint8), the store 750."""
    X = rng.integers(0, 150, (n, d)).astype(np.float32)
    cells = rng.choice(n * d, 600, replace=False)
    X.flat[cells] = 1000.0 + np.arange(600)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    return X, y


def test_more_values_in_later_blocks_start_the_ingest_again_wider(tmp_path, rng):
    X, y = rare_values_later(rng)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=10, seed=3) as st:
        assert st.ingest_stats["restarts"] == 1
        assert st.value_codes == "uint16"
        assert st.metadata["value_codes"]["distinct"] == 750
        A, _, ids = st.read_range(0, st.n_samples)
        np.testing.assert_array_equal(bits(A), bits(X[ids]))
        assert st.verify() == []
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no leftover of the first try


def test_a_forced_width_too_narrow_is_refused_and_the_old_store_is_kept(tmp_path, rng):
    X, y = pixels(rng, n=500, d=10)
    with ingest_arrays(X, y, tmp_path / "s") as st:
        before = st.read_range(0, st.n_samples)[0]
    Xr, yr = rare_values_later(rng)
    with pytest.raises(IngestError, match="value-codes auto"):
        ingest_arrays(Xr, yr, tmp_path / "s", value_codes="uint8", n_blocks=10,
                      overwrite=True)
    with open_store(tmp_path / "s") as st:
        np.testing.assert_array_equal(st.read_range(0, st.n_samples)[0], before)
    # the command: exit 2, the fix named, the store as it was
    src = tmp_path / "rare.npy"
    np.save(src, np.insert(Xr, 0, yr, axis=1))
    r = subprocess.run(INGEST + [str(src), "-o", str(tmp_path / "s"), "--label-column", "0",
                                 "--value-codes", "uint8", "--overwrite", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "--value-codes" in r.stderr and "750" not in r.stdout
    with open_store(tmp_path / "s") as st:
        np.testing.assert_array_equal(st.read_range(0, st.n_samples)[0], before)


def test_the_cli_reports_the_codes_and_none_keeps_float32(tmp_path, rng, capsys):
    from ooc_learn.cli import info_main

    X, y = pixels(rng, n=2000, d=20)
    src = tmp_path / "px.npy"
    np.save(src, np.insert(X, 0, y, axis=1))
    for flag, want in (("auto", "uint8"), ("none", None)):
        r = subprocess.run(INGEST + [str(src), "-o", str(tmp_path / flag), "--label-column",
                                     "0", "--value-codes", flag, "--json", "--quiet"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["value_codes"] == want
        with open_store(tmp_path / flag) as st:
            assert st.value_codes == want
            with h5py.File(tmp_path / flag / "data.h5", "r") as f:
                assert f.attrs["format_version"] == (2 if want else 1)
        capsys.readouterr()
        assert info_main([str(tmp_path / flag)]) == 0
        assert ("X as uint8 codes of" in capsys.readouterr().out) == (want is not None)


def test_a_damaged_code_fails_its_block_digest(tmp_path, rng):
    X, y = pixels(rng, n=800, d=16)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    with h5py.File(tmp_path / "s" / "data.h5", "r+") as f:
        f["X"][10, 3] = (int(f["X"][10, 3]) + 1) % 256
    with open_store(tmp_path / "s") as st:
        problems = st.verify()
        assert len(problems) == 1 and "block 0" in problems[0] and "checksum (X)" in problems[0]
        with pytest.raises(StoreFormatError, match="checksum"):
            st.read_range(0, int(st.block_offsets[1]))


def test_a_value_table_of_the_wrong_size_is_refused_by_name(tmp_path, rng):
    X, y = pixels(rng, n=300, d=8)
    ingest_arrays(X, y, tmp_path / "s").close()
    with h5py.File(tmp_path / "s" / "data.h5", "r+") as f:
        table = f["X_values"][:]
        del f["X_values"]
        f.create_dataset("X_values", data=table[:100])
    with pytest.raises(StoreFormatError, match="X_values"):
        open_store(tmp_path / "s")


def test_a_model_trained_on_codes_is_the_one_trained_on_float32(tmp_path):
    from sklearn.datasets import load_digits

    from ooc_learn.solvers.ibcd import solve_ibcd

    d = load_digits()
    X = (d.data / 16).astype(np.float32)
    y = np.where(d.target < 5, 1.0, -1.0)
    ws = []
    for codes in ("auto", None):
        with ingest(_npy(tmp_path, X, y), tmp_path / f"s{codes}", label_column=0, seed=0,
                    value_codes=codes) as st:
            assert (st.value_codes is not None) == (codes == "auto")
            ws.append(solve_ibcd(st, C=1.0, init_sample=300, n=100).w)
    np.testing.assert_array_equal(ws[0], ws[1])


def _npy(tmp_path, X, y):
    src = tmp_path / "digits.npy"
    np.save(src, np.insert(X, 0, y, axis=1))
    return [src]


def test_the_codes_written_before_an_overflow_still_decode():
    codes = ValueCodes("uint8")
    first = codes.encode(np.arange(200, dtype=np.float32).reshape(20, 10))
    with pytest.raises(ValueCodesFull):
        codes.encode(np.arange(100, 400, dtype=np.float32))
    table = codes.table()
    assert table.shape == (256,)
    np.testing.assert_array_equal(decode(first, table),
                                  np.arange(200, dtype=np.float32).reshape(20, 10))


def test_a_capped_scan_through_one_reused_buffer_finds_what_float32_chunks_find(tmp_path,
                                                                                rng):
    """IBCD's check scans a store the cap keeps out of memory in chunks decoded into one
    buffer (``iter_chunks(reuse=True)``): the rows it admits, their values and the pool are
    those of the float32 store's fresh chunks."""
    from ooc_learn.solvers.ibcd.check import scan_rows
    from ooc_learn.solvers.ibcd.rows import RowSource

    X, y = pixels(rng, n=12000, d=64)
    answers = []
    for codes in ("auto", None):
        ingest_arrays(X, y, tmp_path / f"s{codes}", n_blocks=6, value_codes=codes).close()
        with open_store(tmp_path / f"s{codes}", memory="1M") as st:
            assert not st.reads_whole_block(0)  # the cap reads chunks, not cached blocks
            w = np.linspace(-1, 1, 65)
            in_S = np.zeros(st.n_samples, bool)
            in_S[::7] = True
            ans, pool, _ = scan_rows(RowSource(st), w, w, -np.inf, in_S, 1.0, 500, 300)
            answers.append((ans, pool, st.rows_read))
    (a, pa, ra), (b, pb, rb) = answers
    assert ra == rb == 12000 and a.scanned and 0 < len(a.rows) <= 500
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(bits(a.X), bits(b.X))
    assert (a.worst, a.n_viol) == (b.worst, b.n_viol)
    np.testing.assert_array_equal(pa[0], pb[0])
    np.testing.assert_array_equal(bits(pa[1]), bits(pb[1]))


def test_indexing_a_coded_store_later_keeps_its_codes_and_rows(tmp_path, rng):
    from ooc_learn.index.build import build_index

    X, y = pixels(rng, n=4000, d=32)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=2) as st:
        assert st.value_codes == "uint8" and not st.has_index
        A, _, ids = st.read_range(0, st.n_samples)
        distinct = st.metadata["value_codes"]["distinct"]
    build_index(tmp_path / "s")  # every block rewritten in leaf order
    with open_store(tmp_path / "s") as st:
        assert st.value_codes == "uint8" and st.has_index
        assert st.metadata["value_codes"]["distinct"] == distinct
        B, _, idb = st.read_range(0, st.n_samples)
        order = np.argsort(idb)
        np.testing.assert_array_equal(bits(B[order]), bits(A[np.argsort(ids)]))
        assert st.verify() == []
