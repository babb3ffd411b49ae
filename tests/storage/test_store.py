"""Store writer/reader, external shuffle and the store's failure modes (from arrays)."""

import json
import os
import multiprocessing as mp
import warnings

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import (BudgetExceededError, ClosedError, IndexStateError,
                                      ParameterError, StoreExistsError, StoreFormatError)
from ooc_learn.storage.ingest import ingest_arrays
from ooc_learn.storage.shuffle import balanced_sizes, deal_chunk
from ooc_learn.storage.store import open_store


def make_data(rng, n=600, d=15, sparse=False):
    if sparse:
        X = sp.random(n, d * 4, density=0.1, random_state=rng.integers(1 << 30),
                      format="csr", dtype=np.float32)
        keep = np.ones(n, np.float32)
        keep[3] = 0  # an all-zero row
        X = (sp.diags(keep) @ X).tocsr()
        X.eliminate_zeros()
    else:
        X = rng.normal(size=(n, d)).astype(np.float32)
        X[5] = 0.0
        X[7] = X[6]  # duplicate rows
    y = np.where(rng.random(n) < 0.3, 1.0, -1.0)
    return X, y


def dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_round_trip_by_row_id(tmp_path, rng, sparse):
    X, y = make_data(rng, sparse=sparse)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=7, seed=1,
                       layout="csr" if sparse else "dense") as store:
        assert store.layout == ("csr" if sparse else "dense")
        assert (store.n_samples, store.n_features) == X.shape
        Xs, ys, ids = store.read_range(0, store.n_samples)
        # the stored rows are a permutation of the source rows, matched by row_id
        assert np.array_equal(np.sort(ids), np.arange(X.shape[0]))
        assert np.array_equal(dense(Xs), dense(X)[ids])
        assert np.array_equal(ys, y[ids].astype(np.float32))
        sq = (dense(X)[ids].astype(np.float64) ** 2).sum(1)
        np.testing.assert_allclose(store.sqnorms(), sq, rtol=1e-6)
        # blocks concatenated are the whole store
        parts = list(store.iter_blocks())
        assert len(parts) == 7
        assert np.array_equal(np.concatenate([p[2] for p in parts]), ids)


def test_blocks_are_balanced_random_shards_of_sorted_source(tmp_path, rng):
    n = 4000
    X = rng.normal(size=(n, 3)).astype(np.float32)
    y = np.r_[np.ones(1000), -np.ones(3000)]  # sorted by class
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=8, seed=0) as store:
        sizes = store.block_sizes
        assert sizes.max() - sizes.min() <= 1 and sizes.sum() == n
        # every block holds close to the global 25 % positives (hypergeometric sd ~ 1.4 %)
        for Xb, yb, ids in store.iter_blocks():
            assert abs((yb > 0).mean() - 0.25) < 0.07
            assert np.all(np.diff(ids) != 1) or len(ids) < 3 or (np.diff(ids) == 1).mean() < 0.2


def test_deal_chunk_is_exact_and_uniform():
    rng = np.random.default_rng(0)
    sizes = balanced_sizes(10, 3)
    assert sizes.tolist() == [4, 3, 3]
    # chunked dealing fills every bucket to its exact size
    rem = sizes.copy()
    labels = np.concatenate([deal_chunk(rem, m, rng) for m in (4, 3, 3)])
    assert np.bincount(labels, minlength=3).tolist() == [4, 3, 3] and rem.sum() == 0
    # each row is equally likely to land in each bucket (positions x buckets frequencies)
    counts = np.zeros((10, 3))
    for _ in range(3000):
        rem = sizes.copy()
        lab = np.concatenate([deal_chunk(rem, m, rng) for m in (2, 5, 3)])
        counts[np.arange(10), lab] += 1
    expected = sizes / 10 * 3000
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_same_seed_same_store_other_seed_other_order(tmp_path, rng):
    X, y = make_data(rng)
    a = ingest_arrays(X, y, tmp_path / "a", n_blocks=4, seed=5)
    b = ingest_arrays(X, y, tmp_path / "b", n_blocks=4, seed=5)
    c = ingest_arrays(X, y, tmp_path / "c", n_blocks=4, seed=6)
    assert np.array_equal(a.row_ids(), b.row_ids())
    assert not np.array_equal(a.row_ids(), c.row_ids())
    for s in (a, b, c):
        s.close()


@pytest.mark.parametrize("reader", ["preadv", "h5py"])
@pytest.mark.parametrize("memory", [None, 20_000], ids=["whole-blocks", "rows"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_gather_returns_rows_in_order_given(tmp_path, rng, sparse, memory, reader,
                                            monkeypatch):
    if reader == "h5py":  # datasets h5py must read (chunked or compressed ones)
        from ooc_learn.storage.arrays import Slicer

        monkeypatch.setattr(Slicer, "of", classmethod(lambda cls, fd, ds, *fds: ds))
    X, y = make_data(rng, n=3000, sparse=sparse)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=5).close()
    with open_store(tmp_path / "s", memory=memory) as store:
        Xall, yall, idall = store.read_range(0, store.n_samples)
        # block 0: a run of consecutive rows and rows 3 apart (one read with the rows
        # between); block 2: a dense run (labels and ids read as one span); block 4: a few
        # rows far apart (labels and ids read row by row too); in no order
        rows = np.r_[np.arange(200, 210), np.arange(300, 330, 3), np.arange(1200, 1240),
                     rng.choice(np.arange(2400, 3000, 40), 8, replace=False)]
        rows[:3] = rows[0]  # repeats are allowed
        rows = rng.permutation(rows)
        before = store.rows_read
        Xg, yg, ig = store.gather(rows)
        assert np.array_equal(dense(Xg), dense(Xall)[rows])
        assert np.array_equal(yg, yall[rows]) and np.array_equal(ig, idall[rows])
        read = store.rows_read - before
        if memory is None:  # whole blocks, through the cache
            assert read == 3 * 600 and store.block_is_cached(0)
        else:  # the wanted rows and the few between close ones, not whole blocks
            assert not store.block_is_cached(0)
            assert read == 10 + 28 + 40 + 8
        srt = np.sort(rows)  # rows in order come back without the final permutation
        Xg, yg, ig = store.gather(srt)
        assert np.array_equal(dense(Xg), dense(Xall)[srt])
        assert np.array_equal(yg, yall[srt]) and np.array_equal(ig, idall[srt])
        assert store.gather([])[0].shape[0] == 0
        with pytest.raises(IndexError):
            store.gather([store.n_samples])


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_a_sample_gather_reads_whole_only_blocks_its_runs_would_mostly_read(tmp_path, rng,
                                                                           sparse):
    X, y = make_data(rng, n=4000, sparse=sparse)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    with open_store(tmp_path / "s") as store:  # the cap holds every block
        Xall, yall, _ = store.read_range(0, store.n_samples)
        before = store.rows_read
        # 1 row in 100 of block 0 and 1 in 2 of block 1
        rows = np.r_[np.arange(0, 1000, 100), np.arange(1000, 2000, 2)]
        Xg, yg, _ = store.gather(rows, whole_blocks=False)
        assert np.array_equal(dense(Xg), dense(Xall)[rows]) and np.array_equal(yg, yall[rows])
        assert not store.block_is_cached(0) and store.block_is_cached(1)
        assert store.rows_read - before == 10 + 1000
        # a cached block serves a later sample without a read; the default reads whole
        before = store.rows_read
        store.gather(np.arange(1000, 2000, 100), whole_blocks=False)
        assert store.rows_read == before
        store.gather(np.arange(0, 1000, 100))
        assert store.block_is_cached(0) and store.rows_read - before == 1000


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("memory", [None, 40_000], ids=["whole-blocks", "chunks"])
def test_iter_chunks_covers_the_store_in_order(tmp_path, rng, sparse, memory):
    X, y = make_data(rng, n=2000, d=50, sparse=sparse)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    budget = MemoryBudget(memory)
    with open_store(tmp_path / "s", memory=budget) as store:
        Xall, yall, idall = store.read_range(0, store.n_samples)
        starts, parts = [], []
        for a, Xc, yc, ic in store.iter_chunks(100):
            starts.append(a)
            parts.append((dense(Xc), yc, ic))
            assert budget.used <= budget.limit
        assert starts[0] == 0 and all(np.diff(starts) > 0)
        assert np.array_equal(np.vstack([p[0] for p in parts]), dense(Xall))
        assert np.array_equal(np.concatenate([p[1] for p in parts]), yall)
        assert np.array_equal(np.concatenate([p[2] for p in parts]), idall)
        # a small cap reads ranges of at most 100 rows, never whole 500-row blocks
        assert (max(p[0].shape[0] for p in parts) <= 100) == (memory is not None)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("memory", [None, 40_000], ids=["whole-blocks", "chunks"])
def test_iter_range_and_fold_rows_read_parts_of_blocks_by_the_read_policy(tmp_path, rng,
                                                                         sparse, memory):
    # a CV fold's rows (a range across blocks, or a mask of them) as read_range gives them:
    # views of a cached block, or chunks paid from the budget under a small cap
    from ooc_learn.cv.linear_folds import fold_rows

    X, y = make_data(rng, n=2000, d=50, sparse=sparse)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    budget = MemoryBudget(memory)
    with open_store(tmp_path / "s", memory=budget) as store:
        Xall, yall, idall = store.read_range(0, store.n_samples)
        got = list(store.iter_range(620, 990, 100))
        assert [g[0] for g in got][0] == 620 and sum(g[1].shape[0] for g in got) == 370
        assert np.array_equal(np.vstack([dense(g[1]) for g in got]), dense(Xall[620:990]))
        assert np.array_equal(np.concatenate([g[3] for g in got]), idall[620:990])
        assert (len(got) > 1) == (memory is not None)
        with pytest.raises(IndexError, match="one block"):
            list(store.iter_range(400, 600, 100))  # blocks of 500 rows
        mask = rng.random(store.n_samples) < 0.3
        for m in (None, mask):
            parts = list(fold_rows(store, 130, 1720, m))
            pos = np.concatenate([p[2] for p in parts])
            want = np.arange(130, 1720) if m is None else 130 + np.flatnonzero(m[130:1720])
            assert np.array_equal(pos, want)
            assert np.array_equal(np.vstack([dense(p[0]) for p in parts]), dense(Xall[want]))
            assert np.array_equal(np.concatenate([p[1] for p in parts]), yall[want])
            assert budget.used <= budget.limit


def test_small_reads_go_through_the_descriptor_without_read_ahead(tmp_path, rng, monkeypatch):
    """A query's few rows are read through the store's second descriptor (no read-ahead),
    a scan's chunk of at least SMALL_READ bytes through the first; both give the rows."""
    import ooc_learn.storage.arrays as A
    X, y = make_data(rng, n=3000, d=200)  # 800 bytes a row: 1311 rows make SMALL_READ
    ingest_arrays(X, y, tmp_path / "s", n_blocks=1).close()
    with open_store(tmp_path / "s") as store:
        assert store._fd_small not in (None, store._fd)
        used = []
        real = os.preadv

        def preadv(fd, bufs, offset):
            used.append(fd)
            return real(fd, bufs, offset)

        monkeypatch.setattr(A.os, "preadv", preadv)
        Xc, _, ids = store.read_range(0, 3000)
        assert np.array_equal(Xc, X[ids].astype(np.float32))
        assert store._fd in used  # the rows' matrix (2.4 MB); the labels are small
        used.clear()
        Xr, _ = store.read_rows(np.array([5, 900, 2500]))
        assert np.array_equal(Xr, Xc[[5, 900, 2500]])
        assert set(used) == {store._fd_small}


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_scattered_rows_are_all_asked_for_before_the_first_read_waits(tmp_path, rng,
                                                                     monkeypatch):
    """On a store read past the page cache, read_rows (a node's pivot rows) and gather's
    runs name every row's bytes to the kernel (POSIX_FADV_WILLNEED) on the small-read
    descriptor before the first preadv, so the reads run together; the rows read are
    unchanged. A store the page cache holds advises nothing (the advice would only cost)."""
    import ooc_learn.storage.arrays as A
    X, y = make_data(rng, n=3000, d=200)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    with open_store(tmp_path / "s", direct=False) as store:
        calls = []
        monkeypatch.setattr(A.os, "posix_fadvise", lambda *a: calls.append(a))
        store.read_rows(np.array([5, 900, 2500]))
        store.will_need([(0, 3), (7, 9)])
        assert not store.past_page_cache and calls == []
        monkeypatch.undo()
    with open_store(tmp_path / "s", direct=True) as store:
        if not store.past_page_cache:
            pytest.skip("this file system refuses O_DIRECT")
        Xall, yall, _ = store.read_range(0, 3000)
        events = []
        real_read, real_advise = os.preadv, os.posix_fadvise

        def preadv(fd, bufs, offset):
            events.append(("read", fd, offset, len(bufs[0])))
            return real_read(fd, bufs, offset)

        def posix_fadvise(fd, offset, length, advice):
            events.append(("advise", fd, offset, length, advice))
            return real_advise(fd, offset, length, advice)

        monkeypatch.setattr(A.os, "preadv", preadv)
        monkeypatch.setattr(A.os, "posix_fadvise", posix_fadvise)
        rows = np.array([5, 6, 900, 1777, 2500, 2999])
        Xr, yr = store.read_rows(rows)
        assert np.array_equal(Xr, Xall[rows]) and np.array_equal(yr, yall[rows])
        sl = store._ds["X"]
        advised = [e for e in events if e[0] == "advise" and e[2] >= sl.offset
                   and e[2] < sl.offset + 3000 * sl.row_bytes]
        assert [e[1:] for e in advised] == [
            (store._fd_small, sl.offset + r * sl.row_bytes, sl.row_bytes,
             os.POSIX_FADV_WILLNEED) for r in rows]
        first_read = min(i for i, e in enumerate(events) if e[0] == "read")
        assert events.index(advised[-1]) < first_read
    # gather by runs (a cap too small for whole blocks): each run is named first, one
    # advice a run
    with open_store(tmp_path / "s", memory="2M", direct=True) as store:
        sl = store._ds["X"]
        events.clear()
        want = np.array([10, 11, 12, 400, 401, 2100, 2400])  # blocks 0:1500, 1500:3000
        Xg, yg, ids = store.gather(want)
        assert not store.reads_whole_block(0)
        assert np.array_equal(Xg, Xall[want]) and np.array_equal(yg, yall[want])
        spans = sorted((e[2], e[3]) for e in events if e[0] == "advise")
        for a, b in [(10, 13), (400, 402), (2100, 2101), (2400, 2401)]:
            assert (sl.offset + a * sl.row_bytes, (b - a) * sl.row_bytes) in spans


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_large_reads_bypass_the_page_cache_where_asked_and_equal_buffered_ones(
        tmp_path, rng, monkeypatch, sparse):
    """direct=True: a read of SMALL_READ bytes or more goes through the O_DIRECT descriptor
    (the aligned range around it, the rows a view of it), a small one does not; every read
    equals the buffered store's, at any start, to the file's last row."""
    import ooc_learn.storage.arrays as A
    if sparse:
        X = sp.random(3000, 800, density=0.2, random_state=1, format="csr", dtype=np.float32)
        y = np.where(rng.random(3000) < 0.5, 1.0, -1.0)
    else:
        X, y = make_data(rng, n=3000, d=200)  # 800 bytes a row: 1311 rows make SMALL_READ
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2, layout="csr" if sparse else "dense").close()
    with open_store(tmp_path / "s", direct=True) as a, \
            open_store(tmp_path / "s", direct=False) as b:
        if a._fd_direct is None:
            pytest.skip("this file system refuses O_DIRECT")
        assert b._fd_direct is None
        used = []
        real = os.preadv

        def preadv(fd, bufs, offset):
            used.append((fd, offset % A.DIRECT_ALIGN, len(bufs[0]) % A.DIRECT_ALIGN))
            return real(fd, bufs, offset)

        monkeypatch.setattr(A.os, "preadv", preadv)
        for lo, hi in [(0, 3000), (1, 2999), (7, 1700), (1499, 3000), (2999, 3000), (5, 9)]:
            used.clear()
            Xa, ya, ia = a.read_range(lo, hi)
            direct = [u for u in used if u[0] == a._fd_direct]
            assert all(u[1:] == (0, 0) for u in direct)  # offsets and lengths aligned
            Xb, yb, ib = b.read_range(lo, hi)
            big = (Xb.nnz * 4 if sparse else (hi - lo) * 800) >= A.SMALL_READ
            assert bool(direct) == big, (lo, hi)
            assert len(direct) == (2 if sparse else 1) or not big  # one read per array
            assert np.array_equal(dense(Xa), dense(Xb)) and np.array_equal(ya, yb)
            assert np.array_equal(ia, ib)
            assert np.array_equal(dense(Xa), dense(X)[ia].astype(np.float32))


def test_a_store_larger_than_the_memory_left_is_read_past_the_page_cache(tmp_path, rng,
                                                                          monkeypatch):
    import ooc_learn.storage.measure as M
    X, y = make_data(rng)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    size = (tmp_path / "s" / "data.h5").stat().st_size
    monkeypatch.setattr(M, "memory_headroom_bytes", lambda: size - 1)
    with open_store(tmp_path / "s") as store:
        from ooc_learn.storage.arrays import open_direct
        fd = open_direct(tmp_path / "s" / "data.h5")
        if fd is None:
            pytest.skip("this file system refuses O_DIRECT")
        os.close(fd)
        assert store._fd_direct is not None
    for room in (size, None):  # the page cache holds it, or the memory cannot be read
        monkeypatch.setattr(M, "memory_headroom_bytes", lambda: room)
        with open_store(tmp_path / "s") as store:
            assert store._fd_direct is None
    # OOC_DIRECT_IO overrides the rule for every store a run opens; an unknown value is refused
    monkeypatch.setenv("OOC_DIRECT_IO", "on")
    with open_store(tmp_path / "s") as store:
        assert store._fd_direct is not None
    monkeypatch.setattr(M, "memory_headroom_bytes", lambda: size - 1)
    monkeypatch.setenv("OOC_DIRECT_IO", "OFF")
    with open_store(tmp_path / "s") as store:
        assert store._fd_direct is None
    with open_store(tmp_path / "s", direct=True) as store:  # the argument wins
        assert store._fd_direct is not None
    from ooc_learn.storage.errors import ParameterError
    monkeypatch.setenv("OOC_DIRECT_IO", "sometimes")
    with pytest.raises(ParameterError, match="OOC_DIRECT_IO='sometimes'") as err:
        open_store(tmp_path / "s")
    assert "auto" in err.value.hint


def test_a_bad_direct_io_setting_exits_2_naming_it(tmp_path, rng):
    import subprocess
    import sys
    X, y = make_data(rng)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    cmd = [sys.executable, "-c",
           "import sys; from ooc_learn.cli import info_main; sys.exit(info_main())",
           str(tmp_path / "s")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OOC_DIRECT_IO": "maybe"})
    assert r.returncode == 2 and "OOC_DIRECT_IO='maybe'" in r.stderr, r.stderr
    assert "auto" in r.stderr and "Traceback" not in r.stderr
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "OOC_DIRECT_IO": "off"})
    assert ok.returncode == 0, ok.stderr


def test_a_direct_read_past_the_end_of_a_truncated_file_names_the_row(tmp_path):
    from ooc_learn.storage.arrays import Slicer, open_direct
    from ooc_learn.storage.errors import StoreFormatError
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["X"] = np.arange(4000 * 300, dtype=np.float32).reshape(4000, 300)
    fd = open_direct(path)
    if fd is None:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        with h5py.File(path, "r") as f:
            sl = Slicer.of(os.open(path, os.O_RDONLY), f["X"], None, fd)
            assert np.array_equal(sl[100:3000], f["X"][100:3000])
            os.truncate(path, sl.offset + 2000 * sl.row_bytes + 7)
            with pytest.raises(StoreFormatError, match="ends before row 1000 .*truncated"):
                sl[1000:4000]
            os.close(sl.fd)
    finally:
        os.close(fd)


def test_iter_chunks_shrinks_its_ranges_to_what_the_cap_holds(tmp_path, rng):
    from ooc_learn.storage.store import CHUNK_MIN_ROWS
    X, y = make_data(rng, n=2000, d=50)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    budget = MemoryBudget(40_000)
    with open_store(tmp_path / "s", memory=budget) as store:
        Xall = store.read_range(0, store.n_samples)[0]
        row = store.estimated_bytes(1)
        # the caller holds all but 60 rows' room (IBCD: S, the pool and the selection)
        budget.reserve(budget.available - 60 * row)
        parts = []
        for a, Xc, _, _ in store.iter_chunks(100):
            parts.append(Xc)
            assert budget.used <= budget.limit
        assert np.array_equal(np.vstack(parts), Xall)
        sizes = [p.shape[0] for p in parts]
        assert CHUNK_MIN_ROWS <= min(sizes) and max(sizes) <= 60
        # below CHUNK_MIN_ROWS rows of room the cap's error names --memory
        budget.reserve(budget.available - row)
        with pytest.raises(BudgetExceededError, match="--memory"):
            next(store.iter_chunks(100))
        budget.release(budget.used)


def test_iter_chunks_shrinks_its_ranges_to_what_the_rss_leaves(tmp_path, rng, monkeypatch):
    """A process budget whose account has room but whose RSS is near the cap (what the
    account does not itemise: the caller's last chunk while the next is read) reads smaller
    ranges instead of passing the cap."""
    import ooc_learn.storage.budget as B
    from ooc_learn.storage.store import CHUNK_MIN_ROWS
    X, y = make_data(rng, n=2000, d=50)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    budget = MemoryBudget.for_process(B.current_rss_bytes() + (300 << 20), late_load=0)
    with open_store(tmp_path / "s", memory=budget) as store:
        Xall = store.read_range(0, store.n_samples)[0]
        row = store.estimated_bytes(1)
        monkeypatch.setattr(B, "current_rss_bytes",
                            lambda: budget.cap - budget.rss_headroom - 60 * row)
        budget._rss_at = -float("inf")
        assert budget.limit - budget.used > 100_000 * row  # the account alone would grant
        parts = [Xc for _, Xc, _, _ in store.iter_chunks(100)]
        assert np.array_equal(np.vstack(parts), Xall)
        sizes = [p.shape[0] for p in parts]
        assert CHUNK_MIN_ROWS <= min(sizes) and max(sizes) <= 60


def test_block_cache_stays_inside_budget(tmp_path, rng):
    X, y = make_data(rng, n=2000, d=50)
    budget = MemoryBudget(3 * 60_000)  # about 3 blocks of 250 rows x 50 float32
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=8, memory=budget) as store:
        for _ in range(2):
            for b in range(store.n_blocks):
                store.read_block(b)
                assert budget.used <= budget.limit
        assert store._cache.stats()["entries"] < store.n_blocks
    assert budget.used == 0  # closing gives everything back


def test_views_of_one_store_share_its_block_cache(tmp_path, rng):
    """One-vs-rest views of a multiclass store under one budget read each block once between
    them, and each still sees its own +1 / -1 labels (the cache keeps the stored ones)."""
    X = rng.normal(size=(900, 12)).astype(np.float32)
    y = rng.integers(0, 3, 900).astype(np.float64)
    ingest_arrays(X, y, tmp_path / "mc", n_blocks=3, task="multiclass").close()
    budget = MemoryBudget("64M")
    with open_store(tmp_path / "mc", memory=budget) as raw:
        stored = [raw.read_block(b)[1].copy() for b in range(3)]
        assert raw.rows_read == 900
        views = [open_store(tmp_path / "mc", memory=budget, positive=c) for c in (0, 1, 2)]
        for c, view in enumerate(views):
            for b in range(3):
                Xb, yb, _ = view.read_block(b)
                np.testing.assert_array_equal(yb, np.where(stored[b] == c, 1.0, -1.0))
                np.testing.assert_array_equal(Xb, raw.read_block(b)[0])
                # the stored labels stay as stored in the shared cache
                np.testing.assert_array_equal(view.read_block(b, stored_labels=True)[1],
                                              stored[b])
            assert view.rows_read == 0  # every block came from the shared cache
        for view in views:
            view.close()
        assert raw.block_is_cached(0)  # the others closing leaves the cache to raw
    assert budget.used == 0
    # under another budget a view has a cache of its own
    with open_store(tmp_path / "mc", memory="64M", positive=1) as other:
        other.read_block(0)
        assert other.rows_read == 300


def test_a_block_asked_for_by_two_threads_at_once_is_read_once(tmp_path, rng):
    import threading

    from ooc_learn.storage.cache import LRUCache

    cache = LRUCache(MemoryBudget("1M"))
    started, go, calls = threading.Event(), threading.Event(), []

    def load():
        calls.append(1)
        started.set()
        go.wait(5)
        return np.arange(10), 80

    got = []
    t1 = threading.Thread(target=lambda: got.append(cache.get_or_load("k", load)))
    t1.start()
    started.wait(5)
    t2 = threading.Thread(target=lambda: got.append(cache.get_or_load("k", load)))
    t2.start()
    go.set()
    t1.join(5)
    t2.join(5)
    assert len(calls) == 1 and len(got) == 2 and got[0] is got[1]
    assert cache.misses == 1 and cache.hits == 1


def test_use_after_close_and_double_close(tmp_path, rng):
    X, y = make_data(rng)
    store = ingest_arrays(X, y, tmp_path / "s", n_blocks=2)
    store.close()
    store.close()
    with pytest.raises(ClosedError, match="closed"):
        store.read_block(0)
    with pytest.raises(ClosedError):
        store.gather([0])


def test_tiny_budget_names_the_flag(tmp_path, rng):
    X, y = make_data(rng, n=5000, d=40)
    with pytest.raises(BudgetExceededError, match="memory cap") as ei:
        ingest_arrays(X, y, tmp_path / "s", n_blocks=1, memory="100K")
    assert "--memory" in ei.value.hint
    assert not (tmp_path / "s").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind
    budget = MemoryBudget("1K")
    with pytest.raises(BudgetExceededError, match="--memory"):
        budget.reserve(2048, "test buffer")


def test_existing_output_refused_unless_overwrite(tmp_path, rng):
    X, y = make_data(rng)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    before = (tmp_path / "s" / "data.h5").read_bytes()
    with pytest.raises(StoreExistsError, match="already exists"):
        ingest_arrays(X[:10], y[:10], tmp_path / "s")
    assert (tmp_path / "s" / "data.h5").read_bytes() == before
    with ingest_arrays(X[:10], y[:10], tmp_path / "s", overwrite=True) as s:
        assert s.n_samples == 10


def test_wrong_format_reopen(tmp_path, rng):
    with pytest.raises(StoreFormatError, match="No store"):
        open_store(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreFormatError, match="not an ooc-learn store"):
        open_store(tmp_path / "empty")
    X, y = make_data(rng)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=2).close()
    with h5py.File(tmp_path / "s" / "data.h5", "r+") as f:
        f.attrs["format_version"] = 99
    with pytest.raises(StoreFormatError, match="format 99"):
        open_store(tmp_path / "s")
    with h5py.File(tmp_path / "s" / "data.h5", "r+") as f:
        f.attrs["format_version"] = 1
        f.attrs["complete"] = False
    with pytest.raises(StoreFormatError, match="incomplete"):
        open_store(tmp_path / "s")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "data.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(StoreFormatError, match="cannot be opened"):
        open_store(tmp_path / "junk")


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_digests_are_checked_once_a_handle_and_again_by_verify(tmp_path, rng, sparse,
                                                                monkeypatch):
    import ooc_learn.storage.store as store_module

    X, y = make_data(rng, sparse=sparse)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=5, seed=1,
                  layout="csr" if sparse else "dense").close()
    hashed = []
    real = store_module.digest
    monkeypatch.setattr(store_module, "digest", lambda a: hashed.append(a.size) or real(a))
    store = open_store(tmp_path / "s")
    n = store.n_samples
    store.read_range(0, n)
    first = len(hashed)
    assert first >= 5 * 3  # X (or its three CSR arrays), y and row_id of each block
    store.read_range(0, n)
    list(store.iter_blocks())
    assert len(hashed) == first  # a second pass over the same handle hashes nothing
    # damage block 0 on disk: this handle's next reads see it; verify() checks again
    with h5py.File(tmp_path / "s" / "data.h5", "r") as f:
        at = f["data" if sparse else "X"].id.get_offset()
    with open(tmp_path / "s" / "data.h5", "r+b") as fh:
        fh.seek(at)
        was = fh.read(4)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in was))
    problems = store.verify()
    assert len(hashed) > first
    assert any("block 0" in p and "checksum" in p for p in problems), problems
    store.close()
    with open_store(tmp_path / "s") as fresh:
        with pytest.raises(StoreFormatError, match="block 0 .*checksum"):
            fresh.read_range(0, n)


def test_store_without_index_says_how_to_build_it(tmp_path, rng):
    X, y = make_data(rng)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=2) as store:
        with pytest.raises(IndexStateError, match="no metric-forest index") as ei:
            store.require_index()
        assert "ooc-index" in ei.value.hint


def test_bad_parameters_rejected_before_reading(tmp_path, rng):
    X, y = make_data(rng)
    with pytest.raises(ParameterError, match="'n_blocks' parameter of ingest must be"):
        ingest_arrays(X, y, tmp_path / "s", n_blocks=0)
    with pytest.raises(ParameterError, match="either"):
        ingest_arrays(X, y, tmp_path / "s", n_blocks=2, block_rows=10)
    with pytest.raises(ParameterError, match="'layout'"):
        ingest_arrays(X, y, tmp_path / "s", layout="diagonal")
    assert list(tmp_path.iterdir()) == []


def test_label_mapping_and_tasks(tmp_path, rng):
    X = rng.normal(size=(60, 2)).astype(np.float32)
    y = rng.choice([2.0, 4.0], 60)
    with ingest_arrays(X, y, tmp_path / "b") as s:
        assert s.task == "binary" and s.label_map == {"positive": 4.0, "negative": 2.0}
        _, ys, ids = s.read_range(0, 60)
        assert np.array_equal(ys, np.where(y[ids] == 4.0, 1, -1))
    y3 = rng.integers(0, 5, 60).astype(float)
    with ingest_arrays(X, y3, tmp_path / "m") as s:
        assert s.task == "multiclass"
    with ingest_arrays(X, y3, tmp_path / "ovr", positive_label=3) as s:
        _, ys, ids = s.read_range(0, 60)
        assert s.task == "binary" and np.array_equal(ys, np.where(y3[ids] == 3, 1, -1))
    yr = rng.normal(size=60)
    with ingest_arrays(X, yr, tmp_path / "r") as s:
        assert s.task == "regression"
        _, ys, ids = s.read_range(0, 60)
        np.testing.assert_array_equal(ys, yr[ids])  # float64: a target is kept as given


def _read_sum(path, q):
    with open_store(path) as s:
        q.put(float(sum(float(np.asarray(s.read_block(b)[1]).sum())
                        for b in range(s.n_blocks))))


def test_two_processes_read_one_store_at_once(tmp_path, rng):
    X, y = make_data(rng, n=3000)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=6).close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_read_sum, args=(tmp_path / "s", q)) for _ in range(2)]
    with open_store(tmp_path / "s") as mine:  # and this process holds it open too
        for p in procs:
            p.start()
        results = [q.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        assert results[0] == results[1] == pytest.approx(float(mine.labels().sum()))


def test_meta_json_mirrors_attributes(tmp_path, rng):
    X, y = make_data(rng)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=3) as s:
        meta = json.loads((tmp_path / "s" / "meta.json").read_text())
        assert meta["n_samples"] == s.n_samples and meta["format_version"] == 1
        assert meta["metadata"]["params"]["n_blocks"] == 3


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_direct_reads_equal_h5py_reads(tmp_path, rng, sparse):
    # read_range takes row slices straight from the file (os.preadv at the dataset's offset)
    # where a dataset is plain contiguous bytes; every slice must equal h5py's own read
    from ooc_learn.storage.arrays import Slicer

    X, y = make_data(rng, sparse=sparse)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=5, seed=1,
                       layout="csr" if sparse else "dense") as store:
        names = ["y", "row_id"] + (["indptr", "data", "indices"] if sparse else ["X"])
        with h5py.File(tmp_path / "s" / "data.h5", "r") as f:
            for name in names:
                sl = store._ds[name]
                assert isinstance(sl, Slicer), name  # the writer's layout is plain bytes
                n = f[name].shape[0]
                for a, b in [(0, n), (0, 0), (n - 1, n), (3, 4), (17, 211), (n, n)]:
                    got = sl[a:b]
                    ref = f[name][a:b]
                    assert got.dtype == ref.dtype and got.shape == ref.shape, (name, a, b)
                    assert np.array_equal(got, ref), (name, a, b)
        for a, b in [(0, 1), (250, 330), (599, 600)]:
            Xs, ys, ids = store.read_range(a, b)
            assert np.array_equal(dense(Xs), dense(X)[ids])
            assert np.array_equal(ys, y[ids].astype(np.float32))


def test_chunked_or_compressed_dataset_keeps_h5py_reads(tmp_path):
    from ooc_learn.storage.arrays import Slicer

    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("c", data=np.arange(100.0).reshape(50, 2), chunks=(10, 2))
        f.create_dataset("z", data=np.arange(100.0), compression="gzip")
        f.create_dataset("p", data=np.arange(100.0).reshape(50, 2))
    fd = os.open(tmp_path / "f.h5", os.O_RDONLY)
    try:
        with h5py.File(tmp_path / "f.h5", "r") as f:
            c, z = f["c"], f["z"]
            assert Slicer.of(fd, c) is c
            assert Slicer.of(fd, z) is z
            p = Slicer.of(fd, f["p"])
            assert isinstance(p, Slicer)
            assert np.array_equal(p[7:19], f["p"][7:19])
    finally:
        os.close(fd)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_read_rows_takes_scattered_sorted_rows(tmp_path, rng, sparse):
    X, y = make_data(rng, sparse=sparse)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=3, seed=1,
                       layout="csr" if sparse else "dense") as store:
        Xa, ya, _ = store.read_range(0, store.n_samples)
        for rows in ([0], [5, 6, 7], [1, 90, 333, 599], []):
            before = store.rows_read
            Xr, yr = store.read_rows(rows)
            assert np.array_equal(dense(Xr), dense(Xa)[rows]) and Xr.shape[0] == len(rows)
            assert np.array_equal(yr, ya[rows])
            assert store.rows_read - before == len(rows)
        for bad in ([3, 2], [-1], [600]):
            with pytest.raises(IndexError):
                store.read_rows(bad)


def test_arrays_refuse_complex_values_missing_labels_and_values_float32_cannot_hold(tmp_path):
    # found by a new-user run: complex X lost its imaginary part, a None label became a
    # class named 'None', and 1e50 was called "NaN or infinite"
    from ooc_learn.storage.errors import NonFiniteError

    with pytest.raises(ParameterError, match="complex"):
        ingest_arrays(np.array([[1 + 2j], [2.0]]), [0, 1], tmp_path / "c")
    with pytest.raises(ParameterError, match="Label 1 of y is missing"):
        ingest_arrays(np.ones((3, 1)), np.array(["a", None, "b"], dtype=object),
                      tmp_path / "n")
    with pytest.raises(NonFiniteError, match="beyond float32's range"):
        ingest_arrays(np.array([[1e-50], [1e50]]), [0, 1], tmp_path / "b")
    # 1e30 fits float32, its square does not: stored as an inf squared norm, with numpy's
    # overflow warning on the way
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NonFiniteError, match="Row 1 .* squared norm"):
            ingest_arrays(np.array([[1.0], [1e30]]), [0, 1], tmp_path / "q")
    assert not any(tmp_path.iterdir())
