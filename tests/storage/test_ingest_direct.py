"""Direct ingest of arrays on disk (``storage/ingest_direct.py``): an uncompressed .npy or an
.npz of stored members that the write buffer does not hold is read once, by row arithmetic in
group passes, and the store is written once; the store holds every row once, in balanced
blocks that are stratified samples of the source, as the bucket path's are."""

import hashlib
import json

import numpy as np
import pytest

from ooc_learn.api import ingest
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import IngestError
from ooc_learn.storage.ingest_direct import plan_passes, probe_array_files


def sorted_npy(path, rng, n=20000, d=100, label_col=0, dtype=np.float32):
    """Rows sorted by class (50 % class 0, then 1/3 class 1, then class 2)."""
    y = np.repeat([0, 1, 2], [n // 2, n // 3, n - n // 2 - n // 3]).astype(dtype)
    X = rng.random((n, d)).astype(dtype)
    A = np.insert(X, label_col if label_col >= 0 else d + 1 + label_col, y, axis=1)
    np.save(path, A)
    return X, y


def pieces_digest(data: bytes, piece: int) -> str:
    """sha256 of the sha256 digests of consecutive ``piece``-byte slices (the last shorter)."""
    h = hashlib.sha256()
    for a in range(0, len(data), piece):
        h.update(hashlib.sha256(data[a:a + piece]).digest())
    return h.hexdigest()


def check_rows(store, X, y_stored):
    Xs, ys, ids = store.read_range(0, store.n_samples)
    assert np.array_equal(np.sort(ids), np.arange(X.shape[0]))
    np.testing.assert_array_equal(Xs, X[ids].astype(np.float32))
    np.testing.assert_array_equal(ys, y_stored[ids])
    return ids


@pytest.mark.parametrize("memory", ["6M", "12M"])
def test_a_sorted_npy_is_read_once_into_balanced_stratified_blocks(tmp_path, rng, memory):
    src = tmp_path / "x.npy"
    X, y = sorted_npy(src, rng)
    size = src.stat().st_size
    with ingest([src], tmp_path / "s", memory=memory, seed=3) as store:
        st = store.ingest_stats
        assert st["direct_passes"] >= 2 and st["bucket_bytes"] == 0
        assert store.task == "multiclass" and store.has_index and store.verify() == []
        assert store.nnz == np.count_nonzero(X)
        ids = check_rows(store, X, y)
        sizes = store.block_sizes
        assert sizes.max() - sizes.min() <= 1, sizes.tolist()
        # read: the source once (a digest piece cut by a split run: read again, one a pass
        # at most) and the raw labels' spool (8 bytes a row) back; written: the store once
        # and that spool
        spool = 8 * X.shape[0]
        extra = st["bytes_read"] - spool - (size - 128)
        assert 0 <= extra <= st["direct_passes"] * (32 << 10), (extra, st["direct_passes"])
        assert st["bytes_written"] == st["store_bytes"] + spool
        share = np.bincount(y.astype(int)) / len(y)
        for b in range(store.n_blocks):
            blk = ids[store.block_offsets[b]:store.block_offsets[b + 1]]
            got = np.bincount(y[blk].astype(int), minlength=3) / len(blk)
            # a block is a sample of every part of the file: its group's runs are dealt from
            # all of it. A run is ~1/30 of a group here (~1/150 at scale), and where a class
            # boundary falls inside a round of runs the group's runs there may be all of one
            # class: two boundaries, a run each, ~3 % each
            assert np.abs(got - share).max() < 0.08, (b, got, share)
        # the digest is the sha256 of the file's 32 KiB pieces of rows, whatever the cap
        meta = store.metadata["sources"][0]
        rows = src.read_bytes()[size - X.shape[0] * 101 * 4:]
        assert meta["sha256_pieces"] == pieces_digest(rows, meta["piece_rows"] * 404)
        assert meta["bytes"] == size and "sha256" not in meta


def test_the_same_seed_gives_the_same_store_and_the_digest_ignores_the_cap(tmp_path, rng):
    src = tmp_path / "x.npy"
    sorted_npy(src, rng, n=12000, d=50)
    a = ingest([src], tmp_path / "a", memory="4M", seed=1, build_index=False)
    b = ingest([src], tmp_path / "b", memory="4M", seed=1, build_index=False)
    c = ingest([src], tmp_path / "c", memory="3M", seed=1, build_index=False)
    try:
        assert a.ingest_stats["direct_passes"] and c.ingest_stats["direct_passes"]
        assert np.array_equal(a.row_ids(), b.row_ids())
        assert a.fingerprint() == b.fingerprint()
        assert (a.metadata["sources"][0]["sha256_pieces"]
                == c.metadata["sources"][0]["sha256_pieces"])
    finally:
        for s in (a, b, c):
            s.close()


@pytest.mark.parametrize("label_col", [-1, 7])
def test_a_label_column_anywhere_and_float64_values(tmp_path, rng, label_col):
    src = tmp_path / "x.npy"
    X, y = sorted_npy(src, rng, n=6000, d=40, label_col=label_col, dtype=np.float64)
    col = label_col % 41
    with ingest([src], tmp_path / "s", memory="2M", label_column=col,
                build_index=False, n_features=45) as store:
        assert store.ingest_stats["direct_passes"] >= 2
        assert store.n_features == 45
        Xp = np.zeros((6000, 45))
        Xp[:, :40] = X
        check_rows(store, Xp, y.astype(np.float32))


def test_an_npz_of_stored_members_is_read_directly_and_a_deflated_one_by_buckets(
        tmp_path, rng):
    X = rng.random((8000, 60)).astype(np.float32)
    y = rng.choice([-3.0, 5.0], 8000)
    np.savez(tmp_path / "s.npz", X=X, y=y)
    np.savez_compressed(tmp_path / "c.npz", X=X, y=y)
    with ingest([tmp_path / "s.npz"], tmp_path / "a", memory="2M", build_index=False) as a, \
            ingest([tmp_path / "c.npz"], tmp_path / "b", memory="2M", build_index=False) as b:
        assert a.ingest_stats["direct_passes"] >= 2
        assert b.ingest_stats["direct_passes"] is None and b.ingest_stats["bucket_bytes"] > 0
        for st in (a, b):
            assert st.task == "binary" and st.label_map["positive"] == 5.0
            check_rows(st, X, np.where(y == 5.0, 1.0, -1.0).astype(np.float32))
        meta = a.metadata["sources"][0]
        # pieces of the rows, then of the labels
        h = hashlib.sha256()
        for data, item in ((X.tobytes(), 240), (y.tobytes(), 8)):
            for k in range(0, len(data), meta["piece_rows"] * item):
                h.update(hashlib.sha256(data[k:k + meta["piece_rows"] * item]).digest())
        assert meta["sha256_pieces"] == h.hexdigest()


def test_several_files_keep_their_row_ids_and_regression_labels(tmp_path, rng):
    parts = []
    for i in range(3):
        A = rng.random((3000 + i, 31)).astype(np.float32)
        np.save(tmp_path / f"p{i}.npy", A)
        parts.append(A)
    A = np.concatenate(parts)
    with ingest([tmp_path / f"p{i}.npy" for i in range(3)], tmp_path / "s", memory="2M",
                build_index=False) as store:
        assert store.ingest_stats["direct_passes"] >= 2 and store.task == "regression"
        check_rows(store, A[:, 1:], A[:, 0])
        assert [s["rows"] for s in store.metadata["sources"]] == [3000, 3001, 3002]


def test_a_sparse_array_falls_back_to_the_buckets(tmp_path, rng):
    A = np.zeros((8000, 61), np.float32)
    A[:, 0] = rng.choice([0.0, 1.0], 8000)
    A[:, 1:][rng.random((8000, 60)) < 0.05] = 1.0
    np.save(tmp_path / "x.npy", A)
    with ingest([tmp_path / "x.npy"], tmp_path / "s", memory="2M",
                build_index=False) as store:
        assert store.layout == "csr" and store.ingest_stats["direct_passes"] is None
        # the first group was read before the layout was known: read once more
        assert store.ingest_stats["bytes_read"] > (tmp_path / "x.npy").stat().st_size
        Xs, ys, ids = store.read_range(0, store.n_samples)
        np.testing.assert_array_equal(Xs.toarray(), A[ids, 1:])


def test_shards_from_a_direct_ingest(tmp_path, rng):
    from ooc_learn.storage.store import open_store

    src = tmp_path / "x.npy"
    X, y = sorted_npy(src, rng, n=9000, d=30)
    man = ingest([src], tmp_path / "s", memory="2M", shards=3)
    assert man.task == "multiclass" and man.ingest_stats["direct_passes"] >= 2
    seen = []
    for k in range(3):
        with open_store(man.shard_path(k)) as sh:
            assert sh.verify() == [] and sh.has_index
            Xs, ys, ids = sh.read_range(0, sh.n_samples)
            np.testing.assert_array_equal(Xs, X[ids])
            np.testing.assert_array_equal(ys, y[ids])
            assert sh.task == "multiclass" and "sha256_pieces" in sh.metadata["sources"][0]
            assert sh.nnz == man.shards[k]["nnz"] == np.count_nonzero(X[ids])
            seen.append(ids)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(9000))


@pytest.mark.parametrize("what", ["value", "label"])
def test_a_nan_in_a_late_pass_names_file_row_and_column_and_leaves_nothing(tmp_path, rng,
                                                                          what):
    src = tmp_path / "x.npy"
    A = rng.random((12000, 41)).astype(np.float32)
    A[11000, 0 if what == "label" else 5] = np.nan
    np.save(src, A)
    budget = MemoryBudget("2M")
    with pytest.raises(IngestError) as ei:
        ingest([src], tmp_path / "s", memory=budget)
    msg = str(ei.value)
    assert "row 11001" in msg and "x.npy" in msg and "NaN or infinite" in msg
    assert isinstance(ei.value, ValueError)  # NonFiniteError, as scikit-learn raises
    if what == "value":
        assert ei.value.column == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]
    assert budget.used == 0


def test_the_cli_reports_the_direct_passes_and_exit_2_on_bad_values(tmp_path, rng):
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ooc_learn.cli", "ingest", str(src), "-o",
                               str(tmp_path / "s"), "--quiet", "--no-index", *args],
                              capture_output=True, text=True, timeout=300)

    src = tmp_path / "x.npy"
    sorted_npy(src, rng, n=20000, d=500)  # 40 MB: more than a 250M process's write buffer
    r = run("--memory", "250M", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["direct_passes"] >= 1 and out["bytes_read"] < 1.01 * src.stat().st_size
    A = np.load(src)
    A[19000, 3] = np.inf
    np.save(src, A)
    r = run("--memory", "250M", "--overwrite")
    assert r.returncode == 2 and "x.npy" in r.stderr and "row 19001" in r.stderr, r.stderr
    with open(tmp_path / "s" / "meta.json") as fh:
        assert json.load(fh)["n_samples"] == 20000  # the old store is still there


def test_probe_takes_only_plain_arrays(tmp_path, rng):
    A = rng.random((50, 5)).astype(np.float32)
    np.save(tmp_path / "c.npy", A)
    np.save(tmp_path / "f.npy", np.asfortranarray(A))
    np.save(tmp_path / "w.npy", A[:, :4].astype(np.float64))
    import gzip
    (tmp_path / "g.npy.gz").write_bytes(gzip.compress((tmp_path / "c.npy").read_bytes()))
    assert probe_array_files([tmp_path / "c.npy"], "auto", None)[0].n == 50
    assert probe_array_files([tmp_path / "f.npy"], "auto", None) is None
    assert probe_array_files([tmp_path / "g.npy.gz"], "auto", None) is None
    # files of one ingest share one row layout
    assert probe_array_files([tmp_path / "c.npy", tmp_path / "w.npy"], "auto", None) is None
    (tmp_path / "t.npy").write_bytes((tmp_path / "c.npy").read_bytes()[:-7])  # truncated
    assert probe_array_files([tmp_path / "t.npy"], "auto", None) is None


@pytest.mark.parametrize("n,blocks,group", [(1003, 7, 300), (50000, 8, 9000),
                                            (50000, 64, 9000), (10, 10, 1), (777, 3, 777)])
def test_the_plan_gives_every_group_its_blocks_rows_from_all_of_the_input(n, blocks, group):
    files = [n // 3, n - n // 3]
    plan = plan_passes(files, 100, blocks, group * 100, np.random.default_rng(0), align=16)
    assert plan is not None
    assert np.array_equal(plan.block_sizes, np.sort(plan.block_sizes)[::-1])
    assert plan.block_sizes.sum() == n and np.ptp(plan.block_sizes) <= 1
    first = np.concatenate(([0], np.cumsum(plan.group_blocks)))
    for g in range(plan.n_groups):
        mine = plan.run_group == g
        want = plan.block_sizes[first[g]:first[g + 1]].sum()
        assert plan.run_rows[mine].sum() == want <= group
    # the runs tile every file exactly once
    for i, m in enumerate(files):
        sel = plan.run_file == i
        starts, rows = plan.run_start[sel], plan.run_rows[sel]
        assert starts[0] == 0 and np.array_equal(starts[1:], (starts + rows)[:-1])
        assert (starts + rows)[-1] == m
    if plan.n_groups > 1 and plan.run_rows.shape[0] >= 4 * blocks:
        # every group reads from every part of the input: each round of `blocks` runs gives
        # it as many runs as it has blocks
        rounds = np.arange(plan.run_rows.shape[0]) // blocks
        for g in range(plan.n_groups):
            got = np.bincount(rounds[plan.run_group == g], minlength=rounds.max() + 1)
            assert got[:-2].min() >= plan.group_blocks[g] - 1, got  # a split may move one
    if n > 50:  # one block of n rows does not fit a group of 50
        assert plan_passes([n], 100, 1, 50 * 100, np.random.default_rng(0)) is None


@pytest.mark.parametrize("view", ["whole", "rows", "asarray"])
def test_a_memory_mapped_npy_is_read_from_its_file_by_row_position(tmp_path, rng, view):
    """ingest_arrays of np.load(..., mmap_mode="r") (or a C-ordered view of it) reads the rows
    from the file, by row position, with the labels from memory; a private (copy-on-write)
    mapping, whose changes the file does not see, and plain arrays go through the buckets."""
    from ooc_learn.api import ingest_arrays

    np.save(tmp_path / "x.npy", rng.random((30000, 60), dtype=np.float32))
    X = np.load(tmp_path / "x.npy", mmap_mode="r")
    y = np.where(rng.random(30000) < 0.3, 2.0, 7.0)
    X, y = {"whole": (X, y), "rows": (X[1234:25000], y[1234:25000]),
            "asarray": (np.asarray(X[5:]), y[5:])}[view]
    with ingest_arrays(X, y, tmp_path / "s", memory="6M", build_index=True) as st:
        stats = st.ingest_stats
        assert stats["direct_passes"] >= 2 and st.verify() == [] and st.task == "binary"
        check_rows(st, np.asarray(X), np.where(y == 7.0, 1.0, -1.0).astype(np.float32))
        spool = 8 * X.shape[0]
        assert X.nbytes <= stats["bytes_read"] - spool <= 1.05 * X.nbytes
        meta = st.metadata["sources"][0]
        assert meta["name"] == "x.npy" and meta["rows"] == X.shape[0]
    cow = np.load(tmp_path / "x.npy", mmap_mode="c")
    cow[0, 0] = 5.0  # only in this process's copy of the page
    with ingest_arrays(cow, np.resize(y, 30000), tmp_path / "c", memory="6M") as st:
        assert st.ingest_stats["direct_passes"] is None
        Xs, _, ids = st.read_range(0, st.n_samples)
        assert Xs[np.flatnonzero(ids == 0)[0], 0] == 5.0
