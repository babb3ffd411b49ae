"""TreeCV streaming from an on-disk store: folds follow blocks, results equal the reference."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin

from ooc_learn.cv.folds import store_fold_bounds
from ooc_learn.cv.kfold import kfold_cv
from ooc_learn.cv.treecv import tree_cv
from ooc_learn.learners import ExactLeastSquares, Pegasos
from ooc_learn.storage.ingest import ingest_arrays

from _treecv_reference import brute_force_scores, tree_updates


@pytest.fixture(params=["dense", "csr"])
def reg_store(request, tmp_path, rng):
    n, d = 131, 5
    X = rng.standard_normal((n, d)).astype(np.float32)
    X[rng.random((n, d)) < 0.5] = 0.0
    y = X.astype(np.float64) @ rng.standard_normal(d) + 0.3 * rng.standard_normal(n)
    Xin = sp.csr_matrix(X) if request.param == "csr" else X
    store = ingest_arrays(Xin, y, tmp_path / "reg.store", n_blocks=6, seed=1,
                          layout=request.param, task="regression")
    yield store
    store.close()


@pytest.mark.parametrize("k", [2, 3, 5, 10, 17, "loo"])
def test_store_exact_tree_equals_standard_and_brute_force(reg_store, k):
    store = reg_store
    n = store.n_samples
    kk = n if k == "loo" else k
    lrn = ExactLeastSquares(0.25)
    t = tree_cv(store, lrn, k)
    s = kfold_cv(store, lrn, k)
    np.testing.assert_allclose(t.fold_scores, s.fold_scores, rtol=1e-10, atol=1e-12)
    Xs, ys, ids = store.read_range(0, n)
    bounds = store_fold_bounds(store.block_offsets, kk)
    np.testing.assert_allclose(t.fold_scores,
                               brute_force_scores(Xs, ys.astype(np.float64), bounds, 0.25),
                               rtol=1e-9, atol=1e-12)
    expect = np.empty(n, np.int64)
    expect[ids] = np.repeat(np.arange(kk), np.diff(bounds))  # folds by row_id
    np.testing.assert_array_equal(t.folds, expect)
    np.testing.assert_array_equal(s.folds, expect)
    assert t.stats["updates"] == tree_updates(list(np.diff(bounds)))
    assert s.stats["updates"] == (kk - 1) * n
    assert t.stats["models_saved_max"] <= math.ceil(math.log2(kk)) + 2
    if kk <= store.n_blocks:
        assert set(bounds) <= set(store.block_offsets)  # folds are groups of whole blocks
    else:
        assert set(store.block_offsets) <= set(bounds)  # no fold straddles two blocks
        if k == "loo":  # below some level the held-out range lies in one block
            assert t.stats["kernel_subtrees"] >= 1
            assert t.stats["rows_read"] < n * (math.ceil(math.log2(n)) + 1)


def test_store_randomized_phases_streamed_blockwise(reg_store):
    # a cap too small to hold a training phase: blocks in random order, rows shuffled within
    store = reg_store
    lrn = ExactLeastSquares(0.25)
    ref = kfold_cv(store, lrn, 6)
    t = tree_cv(store, lrn, 6, randomized=True, seed=2, memory=4000)
    assert t.stats["blockwise_randomized_phases"] > 0
    np.testing.assert_allclose(t.fold_scores, ref.fold_scores, rtol=1e-10)
    t2 = tree_cv(store, lrn, 6, randomized=True, seed=2)
    assert "blockwise_randomized_phases" not in t2.stats
    np.testing.assert_allclose(t2.fold_scores, ref.fold_scores, rtol=1e-10)


def test_store_pegasos_parallel_equals_sequential(tmp_path, rng):
    n, d = 400, 6
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = np.where(X[:, 0] - X[:, 1] + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    with ingest_arrays(X, y, tmp_path / "bin.store", n_blocks=5, seed=0) as store:
        for k in (4, "loo"):
            seq = tree_cv(store, Pegasos(0.01), k)
            par = tree_cv(store, Pegasos(0.01), k, n_jobs=2)
            np.testing.assert_array_equal(par.fold_scores, seq.fold_scores)
            np.testing.assert_array_equal(par.folds, seq.folds)
            assert par.stats["updates"] == seq.stats["updates"]
        # the same rows as in-memory arrays in store order, cut at the same fold bounds
        Xs, ys, ids = store.read_range(0, n)
        r = tree_cv(store, Pegasos(0.01), 5)
        bounds = store_fold_bounds(store.block_offsets, 5)
        lrn = Pegasos(0.01)
        assert r.estimate < 0.3 and r.stats["rows_read"] >= n
        # Algorithm 1's training phases (chunk ranges) for each held-out fold, by hand
        order = {0: [(3, 5), (2, 3), (1, 2)], 1: [(3, 5), (2, 3), (0, 1)],
                 2: [(3, 5), (0, 2)], 3: [(0, 3), (4, 5)], 4: [(0, 3), (3, 4)]}
        for i, phases in order.items():
            m = lrn.init(d, n)
            for a, b in phases:
                m = lrn.update(m, Xs[bounds[a]:bounds[b]], ys[bounds[a]:bounds[b]])
            score = lrn.score(m, Xs[bounds[i]:bounds[i + 1]], ys[bounds[i]:bounds[i + 1]])
            assert r.fold_scores[i] == pytest.approx(score / (bounds[i + 1] - bounds[i]),
                                                     abs=1e-12)


def test_store_under_a_small_memory_cap(tmp_path, rng):
    from ooc_learn.storage.store import open_store

    n, d = 4000, 20
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = np.where(X[:, 0] + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "cap.store", n_blocks=8, seed=0).close()
    results = {}
    for cap in ("150K", "64M"):
        with open_store(tmp_path / "cap.store", memory=cap) as store:
            r = tree_cv(store, Pegasos(1e-3), 100)
            assert store.budget.peak <= store.budget.limit
            results[cap] = r
    small, big = results["150K"], results["64M"]
    np.testing.assert_array_equal(small.fold_scores, big.fold_scores)
    # with room for every block each is read from disk once; under the cap, once per level
    assert big.stats["store_rows_read"] == n
    assert small.stats["store_rows_read"] > 2 * n
    assert small.stats["rows_read"] == big.stats["rows_read"]


def test_a_model_wider_than_the_cap_is_refused_before_it_is_made(tmp_path, rng):
    # ExactLeastSquares holds d^2 floats: at d = 100,000 (one stray feature index) 74.5 GiB,
    # which init allocated before the budget was asked (numpy's MemoryError, or the OS's
    # OOM killer); the budget now refuses it with the figures first
    from ooc_learn.learners import LeastSquaresSGD
    from ooc_learn.learners.one_vs_rest import OneVsRest
    from ooc_learn.storage.errors import BudgetExceededError
    from ooc_learn.storage.store import open_store

    n, d = 300, 100_000
    X = sp.random(n, 5, density=0.8, random_state=0, format="csr", dtype=np.float32)
    X = sp.hstack([X, sp.csr_matrix((n, d - 5), dtype=np.float32)]).tocsr()
    X[7, d - 1] = 1.0
    y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "wide.store", seed=0).close()
    with open_store(tmp_path / "wide.store", memory="300M") as store:
        used = store.budget.used
        for cv in (tree_cv, kfold_cv):
            with pytest.raises(BudgetExceededError, match=r"100,000 features.*74\.5G"):
                cv(store, ExactLeastSquares(), 3)
            assert store.budget.used == used
        r = tree_cv(store, Pegasos(1e-3), 3)  # 0.8 MB a model: it runs
        assert np.isfinite(r.fold_scores).all()
    # what each learner says before init is what its model takes
    for learner in (Pegasos(), LeastSquaresSGD(), ExactLeastSquares(),
                    OneVsRest(Pegasos(), np.array([0.0, 1.0, 2.0]))):
        assert learner.init_nbytes(37, 10) == learner.nbytes(learner.init(37, 10))


def test_folds_inside_an_indexed_block_are_not_ranges_of_its_leaf_order(tmp_path, rng):
    # an indexed block keeps its rows in the metric tree's leaf order (clusters); folds cut
    # inside it take its rows in a fixed random order instead, and stay exact
    from ooc_learn.api import ingest_arrays as ingest_indexed

    n, d = 400, 4
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = X.astype(np.float64) @ rng.standard_normal(d) + 0.1 * rng.standard_normal(n)
    with ingest_indexed(X, y, tmp_path / "one", n_blocks=1, build_index=True,
                        task="regression") as store:
        lrn = ExactLeastSquares(0.25)
        t = tree_cv(store, lrn, 4)
        s = kfold_cv(store, lrn, 4)
        np.testing.assert_allclose(t.fold_scores, s.fold_scores, rtol=1e-10, atol=1e-12)
        Xs, ys, ids = store.read_range(0, n)
        pos_fold = t.folds[ids]  # the fold of each store row, in store order
        for i in range(4):
            where = np.flatnonzero(pos_fold == i)
            assert where.size == 100 and np.ptp(where) > 0.9 * n  # spread, not a range
            # the reference: refit without the fold's rows
            held = pos_fold == i
            Xa, ya = np.asarray(Xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
            w = np.linalg.solve(Xa[~held].T @ Xa[~held] + 0.25 * np.eye(d),
                                Xa[~held].T @ ya[~held])
            assert t.fold_scores[i] == pytest.approx(np.mean((Xa[held] @ w - ya[held]) ** 2),
                                                     rel=1e-8)


_FED = []  # (first column of the rows one partial_fit saw), shared by the recorder's copies


class _Recorder(ClassifierMixin, BaseEstimator):
    """A scikit-learn incremental estimator that records the rows it is fed."""

    def partial_fit(self, X, y, classes=None):
        X = X.toarray() if sp.issparse(X) else np.asarray(X)
        _FED.append(X[:, 0].copy())
        return self

    def predict(self, X):
        return np.ones(X.shape[0])



@pytest.mark.parametrize("build_index", [True, False])
def test_an_indexed_stores_blocks_reach_the_learner_in_random_order(tmp_path, rng,
                                                                   build_index):
    """An indexed store keeps a block's rows in its metric tree's leaf order (clusters of
    similar rows); TreeCV feeds an incremental learner each block in a fixed random
    permutation instead, with whole-block folds (k <= blocks) too. Fed cluster after
    cluster, Pegasos's 10-fold estimate on the 1.02M-row augmented Fashion-MNIST store was an
    error of 0.250 against 0.106 in random order (its test error 0.10-0.12). A store without
    an index (rows dealt at random by ingest) is fed as stored."""
    from ooc_learn.api import ingest_arrays as ingest_indexed
    from ooc_learn.learners import SklearnPartialFit

    X = rng.normal(size=(4000, 3)).astype(np.float32)
    y = np.where(X[:, 0] > 0, 1, -1)
    with ingest_indexed(X, y, tmp_path / "s", n_blocks=4, build_index=build_index) as st:
        stored = [np.asarray(st.read_block(b)[0])[:, 0] for b in range(st.n_blocks)]
        _FED.clear()
        tree_cv(st, SklearnPartialFit(_Recorder(), classes=[-1, 1]), 4)
    whole = {}  # each block's feeds that held all of its rows
    for fed in _FED:
        for b, rows in enumerate(stored):
            if fed.shape == rows.shape and np.array_equal(np.sort(fed), np.sort(rows)):
                whole.setdefault(b, []).append(fed)
    assert sorted(whole) == [0, 1, 2, 3]
    for b, feeds in whole.items():
        for fed in feeds:
            assert np.array_equal(fed, stored[b]) != build_index, b
            assert np.array_equal(fed, feeds[0])  # the same fixed order every time
