"""A query's rows handed back with their values: the rows, labels and norms of the store."""

import numpy as np
import pytest
import scipy.sparse as sp
from _forest_helpers import blobs, make_indexed

from ooc_learn.api import ingest_arrays
from ooc_learn.index import forest as forest_mod
from ooc_learn.index.search_config import SearchConfig
from ooc_learn.index._row_kernels import row_sqnorm
from ooc_learn.solvers._kernels import row_sqnorms
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.store import open_store


def assert_rows_of(found, X, y):
    """``found`` holds rows ``found.rows`` of (X, y), bit for bit, with the solvers' norms."""
    want = X[found.rows]
    if sp.issparse(X):
        assert sp.issparse(found.X)
        assert np.array_equal(found.X.indptr, want.indptr)
        assert np.array_equal(found.X.indices, want.indices)
        assert np.array_equal(found.X.data, want.data)
    else:
        assert found.X.dtype == np.float32 and np.array_equal(found.X, want)
    assert np.array_equal(found.y, np.asarray(y)[found.rows])
    ref = row_sqnorms(*kernel_args(want), want.shape[0])
    assert found.sqnorm.dtype == np.float64
    assert np.array_equal(found.sqnorm.view(np.int64), ref.view(np.int64))


@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("budget", ["64M", "80K"])   # the numba loop; Python's, entry by entry
@pytest.mark.parametrize("pivots", ["qualifying", "reached", "none"])
def test_the_rows_returned_are_the_stores(tmp_path, data_rng, csr, budget, pivots):
    X, y = blobs(data_rng, n=3000, d=6, csr=csr)   # zero rows and duplicates included
    store, _ = make_indexed(X, y, tmp_path, n_blocks=3, width=4, leaf_size=8, budget=budget)
    cfg = SearchConfig(pivot_candidates=pivots)
    with store.forest(search=cfg) as f:
        assert f.node_cache.enabled == (budget == "64M")
        # every qualifying row (n=None, about half of them) would not fit the small cap
        for seed, n in enumerate((1, 37, 700) + ((None,) if budget == "64M" else ())):
            w = np.append(data_rng.normal(size=6), 0.3)
            rows, n_e = f.query(w, n=n, seed=seed)
            found = f.query(w, n=n, seed=seed, with_rows=True)
            # the same answer, with the values
            assert np.array_equal(found.rows, rows) and found.n_examined == n_e
            assert_rows_of(found, store.X, store.y)
            if pivots != "none" and n is None:
                assert f.last_query["pivots_examined"] > 0
        f.query(w, n=200)
        used = f.budget.used
        assert len(f.query(w, n=200, with_rows=True).rows) == 200
        assert f.budget.used == used   # the buffers' bytes were given back


def test_a_query_that_finds_nothing(tmp_path, data_rng):
    X, y = blobs(data_rng, n=300, d=4)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2)
    with store.forest() as f:
        found = f.query(np.zeros(4), n=10, exclude=np.arange(300), with_rows=True)
        assert found.rows.shape == (0,) and found.n_examined == 0
        assert found.X.shape == (0, 4) and found.y.shape == found.sqnorm.shape == (0,)


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_on_a_store_the_labels_are_the_views(tmp_path, rng, layout):
    # a multiclass store read as one class against the rest: the rows come back labelled
    # +1 / -1, as the search read them, from the store's cached blocks and from its reads
    X = rng.normal(size=(2400, 12)).astype(np.float32)
    X[rng.random(X.shape) < 0.5] = 0.0
    cls = rng.integers(0, 3, size=2400).astype(np.float64)
    ingest_arrays(sp.csr_matrix(X) if layout == "csr" else X, cls, tmp_path / "mc",
                  task="multiclass", n_blocks=3, build_index=True, layout=layout).close()
    with open_store(tmp_path / "mc", positive=1) as st:
        Xa, ya, _ = st.read_range(0, st.n_samples)
        assert set(np.unique(ya)) == {-1.0, 1.0}
        st.read_block(1)   # one block in the store's cache
        f = forest_mod.open_forest(st)
        try:
            for seed in range(3):
                found = f.query(rng.normal(size=12), n=500, seed=seed, with_rows=True)
                assert len(found.rows) > 100
                assert_rows_of(found, Xa, ya)
        finally:
            f.close()


@pytest.mark.parametrize("d", [1, 7, 64, 784, 1000])
def test_the_copy_sums_norms_as_the_solvers_kernel(rng, d):
    # the IBCD run's bits depend on S's norms: the index's sum is the solvers', term for term
    X = (rng.normal(size=(50, d)) * rng.exponential(size=(50, 1)) * 1e3).astype(np.float32)
    for M in (X, sp.csr_matrix(np.where(rng.random(X.shape) < 0.3, X, 0))):
        args = kernel_args(M)
        mine = np.array([row_sqnorm(*args, i) for i in range(M.shape[0])])
        ref = row_sqnorms(*args, M.shape[0])
        assert np.array_equal(mine.view(np.int64), ref.view(np.int64))
