"""Alpha-seeded k-fold CV equals cold-start SMO on the same folds, and LIBSVM per fold."""

import numpy as np
import pytest
import scipy.sparse as sp
from libsvm.svmutil import svm_parameter, svm_predict, svm_problem, svm_train

from ooc_learn.kernel import make_folds, svm_cv
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import BudgetExceededError, ParameterError, UsageError

SEEDINGS = ["sir", "mir", "ato", "avg", "top"]


@pytest.fixture(scope="module")
def cold_runs(cancer):
    X, y = cancer
    out = {}
    for kernel, kw in (("rbf", {"C": 10.0, "gamma": 0.05}), ("linear", {"C": 1.0})):
        for tol in (1e-3, 1e-7):
            out[kernel, tol] = svm_cv(X, y, kernel=kernel, k=10, seeding=None, tol=tol, **kw)
    return out


@pytest.mark.parametrize("seeding", SEEDINGS)
@pytest.mark.parametrize("kernel,kw", [("rbf", {"C": 10.0, "gamma": 0.05}),
                                       ("linear", {"C": 1.0})])
def test_seeded_equals_cold_start(cancer, cold_runs, seeding, kernel, kw):
    X, y = cancer
    cold = cold_runs[kernel, 1e-3]
    res = svm_cv(X, y, kernel=kernel, k=10, seeding=seeding, **kw)
    np.testing.assert_array_equal(res.folds, cold.folds)
    # default eps = 1e-3: accuracy and every fold score identical to cold start
    assert res.estimate == cold.estimate
    np.testing.assert_array_equal(res.fold_scores, cold.fold_scores)
    # tight eps: decision values agree to 1e-4, labels agree wherever |decision| >= 1e-6
    cold_t = cold_runs[kernel, 1e-7]
    tight = svm_cv(X, y, kernel=kernel, k=10, seeding=seeding, tol=1e-7, **kw)
    assert np.max(np.abs(tight.predictions - cold_t.predictions)) <= 1e-4
    sure = np.abs(cold_t.predictions) >= 1e-6
    assert np.array_equal(tight.predictions[sure] > 0, cold_t.predictions[sure] > 0)
    assert tight.estimate == cold_t.estimate


def test_sir_needs_fewer_iterations(cancer, cold_runs):
    X, y = cancer
    cold = cold_runs["rbf", 1e-3]
    sir = svm_cv(X, y, kernel="rbf", C=10.0, gamma=0.05, k=10, seeding="sir")
    assert sir.stats["smo_iterations"] < cold.stats["smo_iterations"]
    assert sir.stats["fold_iterations"][0] == cold.stats["fold_iterations"][0]  # round 0 cold
    # per-phase counts (pair gap > 1, 1..0.1, 0.1..0.01, 0.01..tol) add up to the totals
    for res in (cold, sir):
        ph = np.asarray(res.stats["fold_phase_iterations"])
        assert ph.shape == (10, 4) and ph.min() >= 0
        np.testing.assert_array_equal(ph.sum(axis=1), res.stats["fold_iterations"])
        assert res.stats["phase_iterations"] == ph.sum(axis=0).tolist()


def test_matches_libsvm_per_fold(cancer):
    """Our per-row held-out labels vs LIBSVM trained on each fold's training rows."""
    X, y = cancer
    ypm = np.where(y == 1, 1.0, -1.0)
    folds = make_folds(len(y), 5, seed=3)
    res = svm_cv(X, y, kernel="rbf", C=10.0, gamma=0.05, folds=folds, seeding="sir")
    lib = np.empty(len(y))
    for h in range(5):
        tr, te = folds != h, folds == h
        m = svm_train(svm_problem(ypm[tr].tolist(), X[tr].astype(np.float64).tolist()),
                      svm_parameter("-s 0 -t 2 -c 10 -g 0.05 -e 0.001 -q"))
        lib[te] = svm_predict([0] * te.sum(), X[te].astype(np.float64).tolist(), m, "-q")[0]
    # held-out labels agree on >= 99.5 % of rows
    assert np.mean(np.where(res.predictions > 0, 1.0, -1.0) == lib) >= 0.995


def test_sparse_and_dense_agree(make_blobs):
    X, y = make_blobs(200, 6, seed=1)
    Xs = X.copy()
    Xs[np.abs(Xs) < 0.5] = 0.0
    a = svm_cv(Xs, y, kernel="rbf", C=2.0, gamma=0.3, k=5, seeding="sir")
    b = svm_cv(sp.csr_matrix(Xs), y, kernel="rbf", C=2.0, gamma=0.3, k=5, seeding="sir")
    assert np.max(np.abs(a.predictions - b.predictions)) <= 1e-9
    assert a.stats["smo_iterations"] == b.stats["smo_iterations"]


def test_leave_one_out_folds_with_sir(cancer_small):
    X, y = cancer_small
    n = len(y)
    cold = svm_cv(X, y, kernel="rbf", C=5.0, gamma=0.05, k=n, seeding=None)
    sir = svm_cv(X, y, kernel="rbf", C=5.0, gamma=0.05, k=n, seeding="sir")
    assert sir.estimate == cold.estimate
    assert sir.stats["smo_iterations"] < 0.5 * cold.stats["smo_iterations"]


def test_store_input(tmp_path, cancer_small):
    from ooc_learn.storage.ingest import ingest_arrays
    from ooc_learn.storage.store import open_store

    X, y = cancer_small
    ypm = np.where(y == 1, 1, -1)
    store = ingest_arrays(X, ypm, tmp_path / "s.store", n_blocks=3, seed=0)
    Xs, ys, _ = store.read_range(0, store.n_samples)
    folds = make_folds(len(ys), 4, seed=0)
    a = svm_cv(store, kernel="rbf", C=5.0, gamma=0.05, folds=folds)
    b = svm_cv(Xs, ys, kernel="rbf", C=5.0, gamma=0.05, folds=folds)
    assert a.estimate == b.estimate
    assert np.max(np.abs(a.predictions - b.predictions)) <= 1e-12
    assert store.budget.used == 0 or store.budget.used < 1 << 20
    store.close()
    tiny = open_store(tmp_path / "s.store", memory=MemoryBudget(8000))
    with pytest.raises(BudgetExceededError, match="gathers all 120 rows.*Raise --memory"):
        svm_cv(tiny, k=3)
    tiny.close()


def test_bad_inputs(cancer_small):
    X, y = cancer_small
    with pytest.raises(ParameterError, match="'C' parameter of svm_cv must be a finite number "
                                             "> 0. Got -1.0 instead"):
        svm_cv(X, y, C=-1.0)
    with pytest.raises(ParameterError, match="'k' parameter of svm_cv must be <= the number"):
        svm_cv(X, y, k=len(y) + 1)
    with pytest.raises(ParameterError, match="'k' parameter of svm_cv must be an integer >= 2"):
        svm_cv(X, y, k=1)
    with pytest.raises(ParameterError, match="'seeding' parameter"):
        svm_cv(X, y, seeding="magic")
    with pytest.raises(ParameterError, match="'kernel' parameter"):
        svm_cv(X, y, kernel="tanh")
    with pytest.raises(ParameterError, match="'gamma' parameter"):
        svm_cv(X, y, gamma=0.0)
    with pytest.raises(ParameterError, match="'folds' parameter"):
        svm_cv(X, y, folds=np.zeros(3, dtype=int))
    with pytest.raises(UsageError, match="only one class"):
        svm_cv(X, np.zeros(len(y)), k=3)
    Xi = X.copy()
    Xi[7, 0] = np.inf
    with pytest.raises(UsageError, match="NaN or infinity"):
        svm_cv(Xi, y, k=3)
