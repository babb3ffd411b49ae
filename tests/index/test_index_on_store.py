"""The index on a real store: built by ingest, added by build_index, opened by open_forest."""

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.api import ingest_arrays
from ooc_learn.index.build import build_index
from ooc_learn.index.forest import open_forest
from ooc_learn.index.orderer import forest_orderer
from ooc_learn.storage.errors import IndexStateError, ParameterError
from ooc_learn.storage.store import open_store


def _data(rng, n=3000, d=12, csr=False):
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = np.where(X[:, 0] + 0.7 * rng.normal(size=n) > 0, 1.0, -1.0).astype(np.float32)
    if csr:
        X[rng.random((n, d)) < 0.6] = 0
        return sp.csr_matrix(X), y
    return X, y


def _brute(store, w, s=1.0):
    X, y, _ = store.read_range(0, store.n_samples)
    m = y * (X @ w)
    return np.flatnonzero((m < 1) & (m >= -s))


@pytest.mark.parametrize("csr", [False, True])
def test_ingest_builds_the_index_and_queries_are_exact(tmp_path, csr):
    rng = np.random.default_rng(7)
    X, y = _data(rng, csr=csr)
    with ingest_arrays(X, y, tmp_path / "s", build_index=True, n_blocks=3, width=4,
                       leaf_size=25, seed=1) as store:
        w = rng.normal(size=12)
        with open_forest(store) as forest:
            rows, n_e = forest.query(w, n=None)
            assert np.array_equal(np.sort(rows), _brute(store, w)) and n_e == 3000
            rows, n_e = forest.query(w, n=100, seed=3)
            Xr, yr, _ = store.gather(rows)
            m = yr * (Xr @ w)
            assert len(rows) == 100 and np.all((m < 1) & (m >= -1)) and n_e >= 100
            assert forest.meta["width"] == 4 and forest.meta["leaf_size"] == 25


def test_build_index_adds_an_index_to_a_store(tmp_path):
    rng = np.random.default_rng(8)
    X, y = _data(rng)
    path = tmp_path / "s"
    ingest_arrays(X, y, path, build_index=False, n_blocks=2).close()
    with open_store(path) as store:
        with pytest.raises(IndexStateError, match="has no"):
            store.require_index()
        with pytest.raises(IndexStateError, match=f"store {path} has no index.*ooc-index "
                                                  f"{path} --overwrite"):
            open_forest(store)
        before = store.read_range(0, store.n_samples)
    stats = build_index(path, width=5, leaf_size=40, seed=2)
    assert stats["n_blocks"] == 2 and stats["build_seconds"] > 0
    w = rng.normal(size=12)
    with open_store(path) as store:
        after = store.read_range(0, store.n_samples)
        # the same rows, each block permuted into leaf order
        for b in range(2):
            lo, hi = store.block_offsets[b], store.block_offsets[b + 1]
            assert sorted(before[2][lo:hi]) == sorted(after[2][lo:hi])
        with open_forest(store) as forest:
            rows, _ = forest.query(w, n=None)
        assert np.array_equal(np.sort(rows), _brute(store, w))
    with pytest.raises(IndexStateError, match="already has an index.*--overwrite"):
        build_index(path)
    build_index(path, width=3, leaf_size=20, overwrite=True)
    with open_store(path) as store, open_forest(store) as forest:
        assert forest.meta["width"] == 3
        assert np.array_equal(np.sort(forest.query(w, n=None)[0]), _brute(store, w))


def test_bad_index_parameters_are_refused_before_any_work(tmp_path):
    with pytest.raises(ParameterError, match="'width' parameter of build_block_tree"):
        forest_orderer(width=0)
    with pytest.raises(ParameterError, match="'leaf_size' parameter"):
        build_index(tmp_path / "does-not-exist", leaf_size=0)


_KILL_MID_BUILD = textwrap.dedent("""
    import os, signal, sys
    import ooc_learn.index.build as b
    import ooc_learn.index.orderer as o
    real, calls = o.build_block_tree, []
    def dying(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    o.build_block_tree = dying  # the trees are built by ForestOrderer.order
    b.build_index(sys.argv[1], width=4, leaf_size=30)
""")


def test_sigkill_during_build_index_leaves_the_store_usable(tmp_path):
    rng = np.random.default_rng(9)
    X, y = _data(rng, n=1500)
    path = tmp_path / "s"
    ingest_arrays(X, y, path, build_index=False, n_blocks=3).close()
    proc = subprocess.run([sys.executable, "-c", _KILL_MID_BUILD, str(path)],
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    with open_store(path) as store:
        assert not store.has_index and store.read_range(0, 10)[0].shape == (10, 12)
    build_index(path, width=4, leaf_size=30)
    with open_store(path) as store, open_forest(store) as forest:
        w = rng.normal(size=12)
        assert np.array_equal(np.sort(forest.query(w, n=None)[0]), _brute(store, w))


def test_the_search_starts_the_next_leaf_reads_while_it_waits_for_one(tmp_path):
    # a leaf read that misses the caches first names the uncached leaves at the top of the
    # frontier to will_need (Store.will_need: POSIX_FADV_WILLNEED), so their disk reads run
    # while the search scans; the answer must not change, and most later leaf reads must
    # have been named before they were asked for
    from ooc_learn.index.forest import Forest
    from ooc_learn.index.search_config import SearchConfig
    from ooc_learn.storage.format import INDEX_DIR

    rng = np.random.default_rng(11)
    X, y = _data(rng, n=4000)
    ingest_arrays(X, y, tmp_path / "s", build_index=True, n_blocks=2, width=4,
                  leaf_size=20, seed=1).close()
    # open_forest names leaves ahead only for a store read past the page cache
    with open_store(tmp_path / "s", direct=False) as store, open_forest(store) as forest:
        assert forest._will_need is None
    with open_store(tmp_path / "s", direct=True) as store:
        with open_forest(store) as forest:
            assert (forest._will_need is not None) == store.past_page_cache
        w = rng.normal(size=12)
        found = {}
        for ahead in (False, True):
            named, reads, waiting = [], [], []

            def read_range(a, b, reads=reads, waiting=waiting):
                if waiting:  # the read the batch was started for comes next
                    assert (a, b) == waiting.pop()
                reads.append((a, b))
                return store.read_range(a, b, ids=False)

            def will_need(spans, named=named, reads=reads, waiting=waiting):
                assert len(spans) >= 2 and not waiting
                waiting.append(tuple(spans[0]))
                named.extend((tuple(s), len(reads)) for s in spans[1:])
                store.will_need(spans)

            forest = Forest(tmp_path / "s" / INDEX_DIR, read_range=read_range,
                            n_samples=store.n_samples, n_features=store.n_features,
                            block_offsets=store.block_offsets, budget=store.budget,
                            read_rows=store.read_rows, search=SearchConfig(span_bytes=0),
                            will_need=will_need if ahead else None)
            with forest:
                rows, n_e = forest.query(w, n=400, seed=5)
                found[ahead] = (np.sort(rows), n_e)
        assert np.array_equal(found[True][0], found[False][0])
        assert found[True][1] == found[False][1]
        # every span named lies in the store, a leaf's size at most, and none twice
        spans = [s for s, _ in named]
        assert named and len(set(spans)) == len(spans)
        assert all(0 <= a < b <= store.n_samples and b - a <= 64 for a, b in spans)
        first_named = {}
        for s, at in named:
            first_named.setdefault(s, at)
        early = [i for i, r in enumerate(reads[1:], 1) if first_named.get(r, i) < i]
        assert len(early) >= 0.5 * (len(reads) - 1), (len(early), len(reads))


def test_leaves_default_by_the_rows_width(tmp_path):
    """Without a leaf size, ingest and build_index take 16 rows a leaf for narrow rows and 32
    where a node of 16-row leaves outgrows a search's span (wide rows); a size given is kept."""
    from ooc_learn.index.lmdb_io import index_meta
    from ooc_learn.index.tree import DEFAULT_LEAF_SIZE, WIDE_LEAF_SIZE, default_leaf_size

    rng = np.random.default_rng(11)
    narrow, _ = _data(rng, n=500, d=22)
    wide, _ = _data(rng, n=500, d=784)
    sparse_wide, _ = _data(rng, n=500, d=784, csr=True)
    # a row's bytes times 16 x 10 against 128 KiB: 88, 3136 and ~2.5k bytes (60 % zeros)
    assert default_leaf_size(narrow) == DEFAULT_LEAF_SIZE
    assert default_leaf_size(wide) == WIDE_LEAF_SIZE
    assert default_leaf_size(sparse_wide) == WIDE_LEAF_SIZE
    assert default_leaf_size(sp.csr_matrix(wide * (rng.random(wide.shape) < 0.05))) \
        == DEFAULT_LEAF_SIZE
    assert default_leaf_size(wide, width=2) == DEFAULT_LEAF_SIZE  # a node of 2 leaves fits
    for d, want in ((22, DEFAULT_LEAF_SIZE), (784, WIDE_LEAF_SIZE)):
        X, y = _data(rng, n=2000, d=d)
        path = tmp_path / f"s{d}"
        ingest_arrays(X, y, path, build_index=True, n_blocks=2).close()
        assert index_meta(path / "index.lmdb")["leaf_size"] == want
        assert build_index(path, overwrite=True)["leaf_size"] == want
        assert index_meta(path / "index.lmdb")["leaf_size"] == want
        build_index(path, overwrite=True, leaf_size=8)
        assert index_meta(path / "index.lmdb")["leaf_size"] == 8


def test_a_span_holds_at_least_two_leaves(tmp_path):
    """A node of up to two leaves' rows is read whole, whatever its bytes (wide rows), a
    larger one where ``span_bytes`` holds it (narrow rows); ``span_bytes=0``: none."""
    from ooc_learn.index.search_config import SearchConfig

    rng = np.random.default_rng(12)
    for d, leaf in ((784, 32), (12, 16)):
        X, y = _data(rng, n=600, d=d)
        ingest_arrays(X, y, tmp_path / f"s{d}", build_index=True, n_blocks=1,
                      leaf_size=leaf).close()
        with open_store(tmp_path / f"s{d}") as store:
            for span in (128 << 10, 0):
                with open_forest(store, search=SearchConfig(span_bytes=span)) as forest:
                    forest.query(rng.normal(size=d), n=50)  # the rows' size, learned
                    got = forest._span_rows(float("inf"))
                    want = max(2 * leaf, span / forest._row_bytes) if span else 0.0
                    assert got == pytest.approx(want), (d, span, got, want)
                    assert forest._span_rows(40.0) == min(got, 10.0)
                    if d == 12 and span:  # narrow rows: the bytes decide, hundreds of rows
                        assert got > 1000
            if d == 784:  # 3 KiB rows: 128 KiB holds 41, two leaves 64
                with open_forest(store) as forest:
                    forest.query(rng.normal(size=d), n=50)
                    assert forest._span_rows(float("inf")) == 64
