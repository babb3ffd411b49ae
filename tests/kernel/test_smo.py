"""SMO against LIBSVM (libsvm-official) on the same C, gamma and eps."""

import numpy as np
import pytest
import scipy.sparse as sp
from libsvm.svmutil import svm_parameter, svm_predict, svm_problem, svm_train

from ooc_learn.kernel import train_svm
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import BudgetExceededError, ParameterError, UsageError

KERNELS = [("rbf", {"gamma": 0.05, "C": 10.0}, 2), ("linear", {"C": 0.5}, 0),
           ("poly", {"gamma": 0.1, "C": 1.0, "degree": 2, "coef0": 1.0}, 1)]


def _libsvm(X, ypm, kernel_code, params):
    opts = (f"-s 0 -t {kernel_code} -c {params['C']} -g {params.get('gamma', 1)} "
            f"-d {params.get('degree', 3)} -r {params.get('coef0', 0)} -e 0.001 -q")
    return svm_train(svm_problem(ypm.tolist(), X.astype(np.float64).tolist()),
                     svm_parameter(opts))


def _dual_objective(model, Xs, kernel, params):
    """1/2 a'Qa - e'a of a solution given by support rows and coefficients (float64 kernel)."""
    Xs = Xs.astype(np.float64)
    dot = Xs @ Xs.T
    if kernel == "linear":
        Km = dot
    elif kernel == "rbf":
        sq = np.diag(dot)
        Km = np.exp(-params["gamma"] * (sq[:, None] + sq[None, :] - 2 * dot))
    else:
        Km = (params["gamma"] * dot + params["coef0"]) ** params["degree"]
    return 0.5 * model @ Km @ model - np.abs(model).sum()


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("kernel,params,code", KERNELS)
def test_smo_matches_libsvm(cancer, kernel, params, code, layout):
    X, y = cancer
    Xtr, ytr, Xte = X[:400], y[:400], X[400:]
    ypm = np.where(ytr == 1, 1.0, -1.0)
    Xin = sp.csr_matrix(Xtr) if layout == "csr" else Xtr
    ours = train_svm(Xin, ytr, kernel=kernel, tol=1e-3, **params)
    lib = _libsvm(Xtr, ypm, code, params)
    lib_idx = np.array(lib.get_sv_indices()) - 1
    lib_obj = _dual_objective(np.array(lib.get_sv_coef())[:, 0], Xtr[lib_idx], kernel, params)
    our_obj = _dual_objective(ours.dual_coef, Xtr[ours.support], kernel, params)
    # dual objective within 1e-4 relative (both stop at the eps = 1e-3 KKT point)
    assert abs(our_obj - lib_obj) <= 1e-4 * abs(lib_obj)
    assert abs(ours.objective - our_obj) <= 1e-6 * abs(our_obj)
    lib_pred, _, _ = svm_predict([0] * len(Xte), Xte.astype(np.float64).tolist(), lib, "-q")
    our_pred = np.where(ours.decision_function(Xte) > 0, 1.0, -1.0)
    # predictions on held-out rows agree on >= 99.5 %
    assert np.mean(our_pred == np.array(lib_pred)) >= 0.995
    assert ours.stats["iterations"] > 0 and ours.stats["kernel_evaluations"] > 0


def test_warm_start_from_solution_needs_no_work(cancer):
    X, y = cancer
    first = train_svm(X, y, C=1.0, gamma=0.05, tol=1e-3)
    again = train_svm(X, y, C=1.0, gamma=0.05, tol=1e-3, alpha0=first.alpha)
    assert again.stats["iterations"] <= 2
    assert abs(again.objective - first.objective) <= 1e-9 * abs(first.objective)


def test_warm_start_other_C_matches_cold(cancer):
    """Warm start from C=1 at C=2 (alpha scaled stays feasible) ends at the cold objective."""
    X, y = cancer
    base = train_svm(X, y, C=1.0, gamma=0.05, tol=1e-6)
    cold = train_svm(X, y, C=2.0, gamma=0.05, tol=1e-6)
    warm = train_svm(X, y, C=2.0, gamma=0.05, tol=1e-6, alpha0=base.alpha)
    assert abs(warm.objective - cold.objective) <= 1e-7 * abs(cold.objective)
    assert warm.stats["iterations"] < cold.stats["iterations"]


def test_small_cache_same_solution_more_kernel_work(cancer):
    X, y = cancer
    big = train_svm(X, y, C=10.0, gamma=0.05)
    small = train_svm(X, y, C=10.0, gamma=0.05, memory=MemoryBudget("2M"),
                      cache_bytes=10 * 8 * len(y))
    assert abs(big.objective - small.objective) <= 1e-12 * abs(big.objective)
    assert small.stats["kernel_columns_computed"] > big.stats["kernel_columns_computed"]
    assert big.stats["kernel_columns_computed"] <= len(y)


def test_cache_reserves_from_budget_and_releases(cancer):
    X, y = cancer
    budget = MemoryBudget("64M")
    train_svm(X, y, C=1.0, memory=budget)
    assert budget.used == 0 and budget.peak >= len(y) * len(y) * 8
    with pytest.raises(BudgetExceededError, match="at least 2 columns"):
        train_svm(X, y, C=1.0, memory=MemoryBudget(80000))


def test_bad_inputs(cancer):
    X, y = cancer
    with pytest.raises(ParameterError, match="'C' parameter of train_svm must be"):
        train_svm(X, y, C=-1.0)
    with pytest.raises(ParameterError, match="'kernel' parameter"):
        train_svm(X, y, kernel="sigmoid")
    with pytest.raises(UsageError, match="exactly two classes"):
        train_svm(X, np.ones(len(y)))
    Xn = X.copy()
    Xn[3, 2] = np.nan
    with pytest.raises(UsageError, match="NaN or infinity .first at row 3"):
        train_svm(Xn, y)
    with pytest.raises(ParameterError, match="alpha0"):
        train_svm(X, y, alpha0=np.ones(len(y)))


@pytest.mark.parametrize("layout", ["dense", "csr"])
@pytest.mark.parametrize("kernel,params,code", KERNELS)
def test_the_whole_matrix_at_once_equals_the_columns_one_by_one(cancer, kernel, params, code,
                                                                 layout):
    """Where the cache holds every column they are computed at once by one matrix product
    (BLAS); a cache of 2 columns computes each in numba. Same values (summation order
    aside), and every later request is a hit."""
    from ooc_learn.kernel.smo import KernelMatrix

    X, _ = cancer
    X = np.asarray(X[:300], dtype=np.float32)
    Xin = sp.csr_matrix(X) if layout == "csr" else X
    kw = dict(gamma=params.get("gamma", 1.0), degree=params.get("degree", 3),
              coef0=params.get("coef0", 0.0))
    with KernelMatrix(Xin, kernel, budget=MemoryBudget("64M"), **kw) as full, \
            KernelMatrix(Xin, kernel, budget=MemoryBudget("64M"), cache_bytes=2 * 8 * 300,
                         **kw) as lazy:
        assert full.counters()["kernel_columns_computed"] == 300
        for g in (0, 7, 150, 299):
            np.testing.assert_allclose(full.column(g), lazy.column(g), rtol=1e-12, atol=1e-12)
        before = full.counters()["kernel_columns_computed"]
        full.column(42)
        assert full.counters()["kernel_columns_computed"] == before
