"""Sparse RLS fitted from a block Store equals the in-memory fit on the same rows."""

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.rls import SparseRLS

from _rls_reference import brute_predict

from ooc_learn.storage import ingest as store_mod


@pytest.fixture(params=["dense", "csr"])
def store_and_arrays(request, tmp_path, rng):
    m, d = 300, 5
    X = rng.normal(size=(m, d)).astype(np.float32)
    if request.param == "csr":
        X[rng.random(size=X.shape) < 0.5] = 0
        X = sp.csr_matrix(X)
    Xd = X.toarray() if sp.issparse(X) else X
    y = (np.sin(Xd[:, 0]) + 0.5 * Xd[:, 1] + 0.1 * rng.normal(size=m)).astype(np.float32)
    store = store_mod.ingest_arrays(X, y, tmp_path / "s.store", n_blocks=6, task="regression",
                                    layout=request.param, seed=3)
    Xs, ys, _ = store.read_range(0, store.n_samples)    # the rows in store order
    yield store, Xs, np.asarray(ys, dtype=np.float64)
    store.close()


def test_store_fit_and_cv_equal_in_memory(store_and_arrays):
    store, Xs, ys = store_and_arrays
    kw = dict(n_basis=30, lam=0.2, gamma=0.3, seed=5)
    mem = SparseRLS(**kw).fit(Xs, ys)
    sto = SparseRLS(**kw).fit(store)
    np.testing.assert_array_equal(sto.basis_, mem.basis_)
    np.testing.assert_allclose(sto.coef_, mem.coef_, rtol=1e-9, atol=1e-12)
    lams = [0.01, 1.0]
    np.testing.assert_allclose(sto.loo_predict_path(lams, "remove"),
                               mem.loo_predict_path(lams, "remove"), rtol=1e-8, atol=1e-12)
    # folds = groups of whole blocks on a store
    f_sto = sto.kfold_predict_path(3, lams, "remove")
    blocks = np.array_split(np.arange(store.n_blocks), 3)
    off = store.block_offsets
    folds = [np.arange(off[g[0]], off[g[-1] + 1]) for g in blocks]
    np.testing.assert_allclose(f_sto, mem.kfold_predict_path(folds, lams, "remove"),
                               rtol=1e-8, atol=1e-12)
    Xd = Xs.toarray() if sp.issparse(Xs) else Xs
    Xd = np.asarray(Xd, dtype=np.float64)
    H = folds[1]
    ref = brute_predict(mem, Xd, ys, np.setdiff1d(np.arange(ys.size), H),
                        np.setdiff1d(mem.basis_, H), 1.0, H)[:, 0]
    np.testing.assert_allclose(f_sto[1, H], ref, rtol=1e-6, atol=1e-8)


def test_store_streaming_without_u_cache(store_and_arrays):
    """Under a cap too small for U (m x n), U rows are re-formed block by block per fold and for
    LOO; results are unchanged. Multi-output labels aligned with the store rows work too."""
    store, Xs, ys = store_and_arrays
    Y = np.c_[ys, ys ** 2]
    kw = dict(n_basis=30, lam=0.2, gamma=0.3, seed=5)
    mem = SparseRLS(**kw).fit(Xs, Y)
    sto = SparseRLS(memory="120K", **kw).fit(store, Y)
    assert sto._ucache is None
    np.testing.assert_allclose(sto.loo_predict("skip"), mem.loo_predict("skip"), rtol=1e-8,
                               atol=1e-12)
    np.testing.assert_allclose(sto.kfold_predict(2, "keep"), mem.kfold_predict(
        [np.arange(0, store.block_offsets[3]), np.arange(store.block_offsets[3], 300)], "keep"),
        rtol=1e-8, atol=1e-12)
    assert sto.stats_["kernel_evaluations"] > 300 * 30
    np.testing.assert_allclose(sto.predict(Xs), mem.predict(Xs), rtol=1e-9, atol=1e-12)


def test_store_blocks_cut_into_chunks(store_and_arrays, monkeypatch):
    """Store blocks larger than the model's chunk are read once and cut into chunks (kernel
    temporaries stay chunk-sized); fit, LOO and block-group folds are unchanged."""
    import ooc_learn.rls.model as model_mod
    from ooc_learn.rls.source import make_source

    store, Xs, ys = store_and_arrays
    kw = dict(n_basis=30, lam=0.2, gamma=0.3, seed=5, folds=3)
    blocks_read = []
    read_block = store.read_block
    monkeypatch.setattr(store, "read_block", lambda j: blocks_read.append(j) or read_block(j))
    whole = SparseRLS(**kw).fit(store)
    reads_whole, blocks_read[:] = list(blocks_read), []
    monkeypatch.setattr(model_mod, "make_source", lambda X, rows: make_source(X, 16))
    cut = SparseRLS(**kw).fit(store)
    assert len(cut._source.offsets) - 1 > store.n_blocks
    assert blocks_read == reads_whole                     # the training pass reads each block once
    np.testing.assert_array_equal(cut._source.block_offsets, store.block_offsets)
    np.testing.assert_allclose(cut.coef_, whole.coef_, rtol=1e-9, atol=1e-12)
    lams = [0.01, 1.0]
    np.testing.assert_allclose(cut.loo_predict_path(lams, "remove"),
                               whole.loo_predict_path(lams, "remove"), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(cut.kfold_predict_path(3, lams, "remove"),
                               whole.kfold_predict_path(3, lams, "remove"), rtol=1e-8,
                               atol=1e-12)
