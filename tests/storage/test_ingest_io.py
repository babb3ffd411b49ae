"""Ingest reads its source once and writes the store once: the dealing pass (stratified random
buckets as rows are parsed), the plan that cuts buckets into blocks, and the byte counts."""

import hashlib
import logging

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from ooc_learn.api import ingest
from ooc_learn.storage import ingest_parse
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import IngestError
from ooc_learn.storage.shuffle import BucketWriter, Dealer, iter_records, plan_blocks, read_bucket


def class_sorted_csv(path, rng, n=12000, d=8):
    """A CSV whose rows are sorted by class: 50 % class 0, then 1/3 class 1, then class 2."""
    y = np.repeat([0, 1, 2], [n // 2, n // 3, n - n // 2 - n // 3])
    X = rng.normal(size=(n, d)).astype(np.float32)
    X[::97] = 0.0  # all-zero rows
    np.savetxt(path, np.column_stack([y, X]), delimiter=",", fmt="%.9g")
    return X, y


def blocks_of(store):
    return [(ids, yb) for _, yb, ids in store.iter_blocks()]


def assert_balanced(store, n):
    sizes = store.block_sizes
    assert sizes.sum() == n and sizes.max() - sizes.min() <= 1, sizes.tolist()


def force_buckets(monkeypatch, r0):
    monkeypatch.setattr(ingest_parse, "deal_buckets", lambda *a, **k: r0)


# ---- (a) a class-sorted source gives blocks with the global class shares ---------------------
@pytest.mark.parametrize("case", ["blocks", "block_rows", "merge", "redeal"])
def test_class_sorted_source_gives_blocks_with_the_global_shares(tmp_path, rng, case,
                                                                  monkeypatch):
    src = tmp_path / "sorted.csv"
    X, y = class_sorted_csv(src, rng)
    kw = {"blocks": dict(n_blocks=8), "block_rows": dict(block_rows=1000),
          "merge": dict(n_blocks=5), "redeal": dict(n_blocks=12)}[case]
    if case == "merge":
        force_buckets(monkeypatch, 13)  # 13 buckets into 5 blocks: shared boundary buckets
    if case == "redeal":
        force_buckets(monkeypatch, 3)   # 3 buckets, each larger than a block: dealt again
    # an 8 MiB cap parses 256 KiB of text at a time: the dealing spans many chunks
    with ingest([src], tmp_path / "s", build_index=False, memory="8M", seed=3, **kw) as store:
        assert_balanced(store, len(y))
        stats = store.ingest_stats
        assert stats["redealt_buckets"] == (3 if case == "redeal" else 0)
        share = np.bincount(y) / len(y)
        for ids, _ in blocks_of(store):
            got = np.bincount(y[ids], minlength=3) / len(ids)
            # a random balanced shard of 1000 rows: sd of the class-0 share ~1.5 %; the
            # stratified deal puts every class's rows evenly into every bucket
            assert np.abs(got - share).max() < 0.01, (got, share)
        # and the rows are the source's, each once, under their source position
        Xs, ys, ids = store.read_range(0, store.n_samples)
        assert np.array_equal(np.sort(ids), np.arange(len(y)))
        np.testing.assert_array_equal(Xs, X[ids])


def test_blocks_of_a_sorted_source_are_not_runs_of_it(tmp_path, rng):
    src = tmp_path / "sorted.csv"
    class_sorted_csv(src, rng, n=4000)
    with ingest([src], tmp_path / "s", build_index=False, n_blocks=4, memory="8M") as store:
        for ids, _ in blocks_of(store):
            gaps = np.diff(np.sort(ids))
            assert gaps.max() < 4 * 4  # one row from every group of 4 source rows
            assert len(np.unique(ids % 4)) == 4  # not a fixed stride


# ---- (b) balanced block sizes ---------------------------------------------------------------
@pytest.mark.parametrize("r0", [None, 1, 3, 16, 64])
@pytest.mark.parametrize("kw", [dict(n_blocks=7), dict(block_rows=100), dict(block_rows=1003),
                                dict(n_blocks=2000)])
def test_block_sizes_are_balanced_for_any_n(tmp_path, rng, monkeypatch, kw, r0):
    n = 1003  # prime: divisible by no block count
    X = sp.random(n, 30, density=0.2, random_state=1, format="csr")
    y = rng.choice([-1.0, 1.0], n)
    src = tmp_path / "t.svm"
    dump_svmlight_file(X, y, str(src), zero_based=False)
    if r0 is not None:
        force_buckets(monkeypatch, r0)
    with ingest([src], tmp_path / "s", build_index=False, **kw) as store:
        assert_balanced(store, n)
        want = min(n, kw["n_blocks"]) if "n_blocks" in kw else -(-n // kw["block_rows"])
        assert store.n_blocks == want
        if "block_rows" in kw:
            assert store.block_sizes.max() <= kw["block_rows"]
        assert np.array_equal(np.sort(store.row_ids()), np.arange(n))


def test_auto_blocks_deal_into_the_final_blocks_when_one_chunk_holds_the_input(tmp_path, rng):
    X = rng.normal(size=(3000, 20)).astype(np.float32)
    y = rng.choice([-1.0, 1.0], 3000)
    src = tmp_path / "x.npy"
    np.save(src, np.column_stack([y, X]).astype(np.float32))
    with ingest([src], tmp_path / "s", build_index=False, block_rows=700) as store:
        st = store.ingest_stats
        assert st["n_blocks"] == 5 and st["buckets"] == 5 and st["redealt_buckets"] == 0


# ---- (c) bytes read and written -------------------------------------------------------------
def svm_source(path, rng, n=20000, d=500, per_row=15):
    cols = np.sort(rng.random((n, d)).argsort(axis=1)[:, :per_row], axis=1)
    X = sp.csr_matrix((rng.random(n * per_row).astype(np.float32) + 0.01, cols.ravel(),
                       np.arange(0, n * per_row + 1, per_row)), shape=(n, d))
    dump_svmlight_file(X, rng.choice([-1.0, 1.0], n), str(path), zero_based=False)


def npy_source(path, rng, n=5000, d=200):
    A = rng.random((n, d + 1), dtype=np.float32)
    A[:, 0] = rng.integers(0, 2, n)
    np.save(path, A)


@pytest.mark.parametrize("kind", ["libsvm", "npy"])
def test_source_is_read_once_and_store_written_once(tmp_path, rng, kind):
    src = tmp_path / ("t.svm" if kind == "libsvm" else "x.npy")
    (svm_source if kind == "libsvm" else npy_source)(src, rng)
    size = src.stat().st_size
    assert size > 2 << 20
    # a 32 MiB cap: several parse chunks, several blocks (merged from more buckets)
    with ingest([src], tmp_path / "s", memory="32M", block_rows=1500) as store:
        st = store.ingest_stats
        assert store.has_index and st["n_blocks"] > 2 and st["buckets"] >= st["n_blocks"]
        on_disk = sum(f.stat().st_size for f in store.path.rglob("*") if f.is_file())
        assert st["store_bytes"] == on_disk
        assert st["bytes_in"] == size
        # read: the source once, the buckets once; written: the buckets once, the store once
        assert st["bytes_read"] == size + st["bucket_bytes"]
        assert st["bytes_written"] == st["bucket_bytes"] + st["store_bytes"]
        assert st["bytes_read"] <= 2.2 * size, st["bytes_read"] / size
        assert st["bytes_written"] <= 2.2 * st["store_bytes"], st["bytes_written"] / on_disk
        # the buckets hold about what the store holds (a dense source's rows stay dense)
        assert st["bucket_bytes"] <= 1.1 * st["store_bytes"]
        # the kernel's own count (/proc/self/io, where there is one): what reached the disk
        # layer is at most what ingest wrote through it, plus the page-aligned tails of its
        # files and HDF5's metadata
        if st["io_write_bytes"] is not None:
            assert st["io_write_bytes"] <= st["bytes_written"] + (8 << 20)


@pytest.mark.parametrize("kind", ["libsvm", "npy"])
def test_a_source_the_write_buffer_holds_is_read_once_and_no_bucket_is_written(
        tmp_path, rng, kind, monkeypatch):
    """Where every row fits the bucket write buffer the buckets stay in memory: the source is
    read once and the store written once, and the store is the one the bucket files give."""
    from ooc_learn.storage.shuffle import BucketWriter

    src = tmp_path / ("t.svm" if kind == "libsvm" else "x.npy")
    (svm_source if kind == "libsvm" else npy_source)(src, rng, n=4000)
    size = src.stat().st_size
    with ingest([src], tmp_path / "mem", memory="512M", n_blocks=4) as a:
        st = a.ingest_stats
        assert st["bucket_bytes"] == 0 and not (tmp_path / "mem" / "buckets").exists()
        assert st["bytes_read"] == st["bytes_in"] == size
        assert st["bytes_written"] == st["store_bytes"]
        # the same rows through bucket files
        close = BucketWriter.close
        monkeypatch.setattr(BucketWriter, "close", lambda self, **kw: close(self))
        with ingest([src], tmp_path / "files", memory="512M", n_blocks=4) as b:
            assert b.ingest_stats["bucket_bytes"] > 0
            assert b.ingest_stats["bytes_read"] > size
            assert np.array_equal(a.block_offsets, b.block_offsets)
            for (Xa, ya, ia), (Xb, yb, ib) in zip(a.iter_blocks(), b.iter_blocks()):
                assert np.array_equal(ia, ib) and np.array_equal(ya, yb)
                assert (abs(Xa - Xb)).max() == 0


def test_buckets_in_memory_go_to_files_when_the_block_does_not_fit_beside_them(
        tmp_path, rng, monkeypatch):
    """The buckets stay in memory only while the first block fits beside them: otherwise
    they are written to their files after all, and the store is the same."""
    from ooc_learn.storage import ingest as ingest_mod

    src = tmp_path / "x.npy"
    npy_source(src, rng, n=4000)
    # a block 1 KiB larger than what the buckets' buffer leaves free
    monkeypatch.setattr(ingest_mod, "check_block_fits",
                        lambda budget, rows, per_row: budget.available + 1024)
    with ingest([src], tmp_path / "t", memory="512M", n_blocks=4) as st:
        assert st.ingest_stats["bucket_bytes"] > 0  # spilled to files
        assert st.ingest_stats["bytes_read"] == st.ingest_stats["bytes_in"] + \
            st.ingest_stats["bucket_bytes"]
        assert st.n_samples == 4000


def test_sha256_of_a_source_parsed_in_many_chunks(tmp_path, rng):
    src = tmp_path / "t.svm"
    svm_source(src, rng, n=8000)
    with ingest([src], tmp_path / "s", build_index=False, memory="8M") as store:
        meta = store.metadata["sources"][0]
        assert meta["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
        assert meta["bytes"] == src.stat().st_size


# ---- (d) same seed, same store --------------------------------------------------------------
def test_same_seed_same_store(tmp_path, rng):
    src = tmp_path / "t.svm"
    svm_source(src, rng, n=6000)
    stores = [ingest([src], tmp_path / f"s{i}", build_index=False, memory="8M",
                     block_rows=700, seed=seed) for i, seed in enumerate((4, 4, 5))]
    try:
        a, b, c = stores
        assert a.ingest_stats["buckets"] > a.n_blocks  # merged from more buckets
        assert np.array_equal(a.block_offsets, b.block_offsets)
        for (Xa, ya, ia), (Xb, yb, ib) in zip(a.iter_blocks(), b.iter_blocks()):
            assert np.array_equal(ia, ib) and np.array_equal(ya, yb)
            assert (Xa != Xb).nnz == 0
        assert not np.array_equal(a.row_ids(), c.row_ids())
        assert [set(x[2].tolist()) for x in a.iter_blocks()] != \
            [set(x[2].tolist()) for x in c.iter_blocks()]
    finally:
        for s in stores:
            s.close()


# ---- failures and the budget ----------------------------------------------------------------
def test_bad_line_after_buckets_were_written_leaves_nothing(tmp_path, rng):
    src = tmp_path / "bad.svm"
    svm_source(src, rng, n=20000)
    lines = src.read_bytes().splitlines(keepends=True)
    lines[18000] = b"1 3:0.5 7:oops\n"
    src.write_bytes(b"".join(lines))
    budget = MemoryBudget("8M")  # 256 KiB chunks, 2 MiB of bucket buffers: flushed by then
    with pytest.raises(IngestError) as ei:
        ingest([src], tmp_path / "s", build_index=False, memory=budget)
    assert ei.value.line == 18001 and ei.value.path.endswith("bad.svm")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.svm"]
    assert budget.used == 0


def test_budget_is_charged_and_released(tmp_path, rng):
    src = tmp_path / "t.svm"
    svm_source(src, rng, n=6000)
    budget = MemoryBudget("16M")
    with ingest([src], tmp_path / "s", build_index=False, memory=budget) as store:
        assert budget.peak >= budget.limit // 4  # the bucket buffers were reserved
        assert store.n_samples == 6000
    assert budget.used == 0


def test_a_redeal_is_logged(tmp_path, rng, monkeypatch, caplog):
    src = tmp_path / "t.svm"
    svm_source(src, rng, n=3000)
    force_buckets(monkeypatch, 2)
    with caplog.at_level(logging.WARNING, logger="ooc_learn.storage.ingest"):
        with ingest([src], tmp_path / "s", build_index=False, n_blocks=6) as store:
            assert_balanced(store, 3000)
            st = store.ingest_stats
    assert st["redealt_buckets"] == 2 and "--blocks" in caplog.text
    # the re-dealt rows are read and written once more, and counted
    assert st["bytes_read"] > st["bytes_in"] + st["bucket_bytes"] // 2


# ---- the pieces -------------------------------------------------------------------------
def test_dealer_is_balanced_after_every_row_and_ignores_chunking():
    whole = Dealer(5, np.random.default_rng(1)).deal(103)
    d = Dealer(5, np.random.default_rng(1))
    parts = np.concatenate([d.deal(m) for m in (1, 0, 7, 5, 40, 50)])
    assert np.array_equal(whole, parts)
    for k in range(1, 104):
        c = np.bincount(whole[:k], minlength=5)
        assert c.max() - c.min() <= 1
    for g in range(20):  # every group of 5 rows is a permutation of the buckets
        assert sorted(whole[5 * g:5 * g + 5].tolist()) == list(range(5))
    # each row position within a group is equally likely to go to each bucket
    counts = np.zeros((5, 5))
    dl = Dealer(5, np.random.default_rng(2))
    lab = dl.deal(5 * 4000).reshape(-1, 5)
    for j in range(5):
        counts[j] = np.bincount(lab[:, j], minlength=5)
    assert np.all(np.abs(counts - 800) < 5 * np.sqrt(800))


@pytest.mark.parametrize("rows,R", [([3, 3, 2, 2], 3), ([5] * 8, 3), ([2, 1, 2, 2], 4),
                                    ([4, 4, 3], 7), ([0, 3, 0, 3], 2), ([6, 6, 6], 3)])
def test_plan_cuts_the_buckets_into_balanced_blocks(rows, R):
    p = plan_blocks(rows, R)
    sizes = p.block_sizes
    assert sizes.sum() == sum(rows) and sizes.max() - sizes.min() <= 1
    got = np.zeros(R, np.int64)
    for s, bl, ct in zip(rows, p.bucket_blocks, p.bucket_counts):
        assert ct.sum() == s and np.all(ct > 0)
        assert np.all(np.diff(bl) == 1)  # consecutive blocks: each bucket is read once
        np.add.at(got, bl, ct)
    assert np.array_equal(got, sizes)
    assert p.identity == (len(rows) == R)


@pytest.mark.parametrize("dense_rows", [True, False])
def test_bucket_records_round_trip(tmp_path, rng, dense_rows):
    n, d = 500, 40
    X = sp.random(n, d, density=0.9 if dense_rows else 0.05, random_state=2, format="csr",
                  dtype=np.float32)
    keep = np.ones(n, np.float32)
    keep[7] = 0  # an empty row
    cols = np.ones(d, np.float32)
    cols[0] = 0  # raw index 0 unused: the rows are also read with base 1 below
    X = (sp.diags(keep) @ X @ sp.diags(cols)).tocsr()
    X.eliminate_zeros()
    labels = rng.normal(size=n)
    w = BucketWriter(tmp_path / "b", 3, buffer_bytes=1 << 16, record_bytes=1 << 12)
    lab = Dealer(3, rng).deal(n)
    for a in range(0, n, 64):  # several chunks, records cut at 4 KiB
        s = slice(a, a + 64)
        Xc = X[s]
        w.add(lab[s], labels[s], np.arange(a, min(n, a + 64)), Xc.indptr.astype(np.int64),
              Xc.indices.astype(np.int64), Xc.data)
    w.flush()
    assert w.rows.sum() == n and np.array_equal(w.rows, np.bincount(lab, minlength=3))
    read = [0]
    total = 0
    for b in range(3):
        recs = list(iter_records(w.path(b), lambda k: read.__setitem__(0, read[0] + k)))
        assert len(recs) > 1
        assert all((r.rownnz is None) == dense_rows for r in recs)
        ids = np.concatenate([r.row_ids for r in recs])
        assert np.array_equal(ids, np.flatnonzero(lab == b))  # source order within a bucket
        Xd = np.concatenate([r.rows("dense", d, 0) for r in recs])
        np.testing.assert_array_equal(Xd, X[ids].toarray())
        Xc = sp.vstack([r.rows("csr", d + 2, 0) for r in recs]).tocsr()
        assert Xc.shape == (len(ids), d + 2)
        np.testing.assert_array_equal(Xc.toarray()[:, :d], X[ids].toarray())
        np.testing.assert_array_equal(np.concatenate([r.labels for r in recs]), labels[ids])
        total += w.path(b).stat().st_size
        # the whole file in one read, records decoded into the store's layout: the same rows
        # (raw indices shifted by the base, columns past the last entry zero)
        for layout, width, base in (("dense", d, 0), ("csr", d + 2, 0), ("dense", d - 1, 1),
                                    ("csr", d - 1, 1)):
            got_n = [0]
            lab_b, ids_b, Xb = read_bucket(w.path(b), layout, width, base,
                                           lambda k: got_n.__setitem__(0, got_n[0] + k))
            assert got_n[0] == w.path(b).stat().st_size
            np.testing.assert_array_equal(ids_b, ids)
            np.testing.assert_array_equal(lab_b, labels[ids])
            want = np.zeros((len(ids), width), np.float32)
            ref = X[ids].toarray()[:, base:]
            want[:, :ref.shape[1]] = ref[:, :width]
            assert Xb.shape == want.shape and sp.issparse(Xb) == (layout == "csr")
            np.testing.assert_array_equal(Xb.toarray() if sp.issparse(Xb) else Xb, want)
    assert read[0] == total == w.bytes_written


def test_bucket_records_survive_short_writes(tmp_path, rng, monkeypatch):
    # writev may write fewer bytes than asked (a signal): the record's rest follows in order
    import os

    from ooc_learn.storage import shuffle

    real = os.writev

    def short(fd, views):  # at most 7 bytes a call
        first = next(bytes(v[:7]) for v in views if v.nbytes)
        return real(fd, [first])

    monkeypatch.setattr(shuffle.os, "writev", short)
    X = sp.random(40, 12, density=0.3, random_state=3, format="csr", dtype=np.float32)
    w = BucketWriter(tmp_path / "b", 2, buffer_bytes=1 << 16)
    lab = np.arange(40) % 2
    w.add(lab, np.arange(40.0), np.arange(40), X.indptr.astype(np.int64),
          X.indices.astype(np.int64), X.data)
    w.close()
    for b in range(2):
        labels, ids, Xb = read_bucket(w.path(b), "dense", 12, 0)
        np.testing.assert_array_equal(ids, np.flatnonzero(lab == b))
        np.testing.assert_array_equal(labels, ids.astype(float))
        np.testing.assert_array_equal(Xb, X[ids].toarray())


@pytest.mark.parametrize("later", ["alike", "denser"])
def test_binary_sources_deal_into_a_quarter_more_buckets_than_blocks(tmp_path, rng, later,
                                                                    monkeypatch):
    from ooc_learn.storage import ingest as ingest_mod

    # a .npy's rows are all one size: the bucket count is the block count estimated from the
    # first chunk plus a quarter (not doubled to a power of two), so records are larger. Rows
    # denser than the first chunk's (a dense layout where CSR was estimated: fewer rows a
    # block) make buckets larger than blocks, which are dealt again: the store is the same
    n, d = 200_000, 20
    X = rng.normal(size=(n, d)).astype(np.float32)
    if later == "denser":
        X[: n // 2] *= rng.random((n // 2, d)) < 0.1  # the first half 10 % dense
    y = rng.choice([-1.0, 1.0], n).astype(np.float32)
    src = tmp_path / "x.npy"
    np.save(src, np.column_stack([y, X]))
    # the bucket path, as for a compressed .npy (an uncompressed one this size is read by row
    # position: storage/ingest_direct.py)
    monkeypatch.setattr(ingest_mod, "probe_array_files", lambda *a, **k: None)
    # 17 MB under an 8 MiB cap: blocks and parse chunks hold a small share of it
    with ingest([src], tmp_path / "s", build_index=False, memory="8M", seed=1) as store:
        st = store.ingest_stats
        assert_balanced(store, n)
        if later == "alike":
            R = st["n_blocks"]
            assert R >= 8 and R <= st["buckets"] <= int(np.ceil(1.25 * R)) + 1
            assert st["redealt_buckets"] == 0
        else:
            assert st["redealt_buckets"] > 0
        Xs, ys, ids = store.read_range(0, n)
        assert np.array_equal(np.sort(ids), np.arange(n))
        np.testing.assert_array_equal(Xs.toarray() if sp.issparse(Xs) else Xs, X[ids])
        np.testing.assert_array_equal(ys, y[ids])
