"""Dual CD against LIBLINEAR (the trusted peer), on dense and CSR rows, plus sub-problem use."""
import re

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.losses import get_loss
from ooc_learn.solvers import _kernels as K
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.solvers.dcd import dcd_subproblem, dual_objective, primal_objective, solve_dcd
from ooc_learn.storage.errors import ParameterError

from solver_data import DATASETS, as_layout

liblinear = pytest.importorskip("liblinear.liblinearutil")

SOLVER_CODE = {"hinge": 3, "sqhinge": 1}


def liblinear_fit(X, y, loss, C, capfd):
    """LIBLINEAR's w (bias last) and its printed dual objective."""
    capfd.readouterr()
    Xl = X if sp.issparse(X) else X.astype(np.float64)
    m = liblinear.train(y, Xl, f"-s {SOLVER_CODE[loss]} -c {C} -B 1")
    out = capfd.readouterr().out
    obj = float(re.search(r"Objective value = (\S+)", out).group(1))
    w, b = m.get_decfun()
    sign = 1.0 if m.get_labels()[0] == 1 else -1.0   # LIBLINEAR's first label is its +1
    return sign * np.r_[np.asarray(w), b], obj


@pytest.mark.parametrize("loss", ["hinge", "sqhinge"])
@pytest.mark.parametrize("data", sorted(DATASETS))
def test_dcd_matches_liblinear(data, loss, layout, capfd):
    X, y = DATASETS[data]()
    X = as_layout(X, layout)
    C = 0.5
    res = solve_dcd(X, y, loss=loss, C=C, bias=1.0, eps=0.1, seed=3)
    w_lib, obj_lib = liblinear_fit(X, y, loss, C, capfd)
    assert res.stats.converged
    # same problem, same default stopping rule: dual objectives within 1e-3 relative
    assert abs(res.stats.objective - obj_lib) <= 1e-3 * abs(obj_lib)
    ours = np.sign(X @ res.w[:-1] + res.w[-1])
    theirs = np.sign(X @ w_lib[:-1] + w_lib[-1])
    assert np.mean(ours == theirs) >= 0.995
    # the reported objective is the dual objective of the returned alpha and w
    diag = get_loss(loss).dual_diag(C)
    assert res.stats.objective == pytest.approx(dual_objective(res.w, res.alpha, diag), rel=1e-12)


@pytest.mark.parametrize("loss", ["hinge", "sqhinge"])
def test_dcd_tight_tolerance_closes_duality_gap(loss, layout):
    X, y = DATASETS["breast_cancer"]()
    X = as_layout(X, layout)
    res = solve_dcd(X, y, loss=loss, C=1.0, eps=1e-4, max_iter=20000, seed=0)
    assert res.stats.converged
    P = primal_objective(X, y, res.w, loss, 1.0)
    # strong duality: primal = -dual at the optimum (gap below 1e-4 relative)
    assert abs(P + res.stats.objective) <= 1e-4 * abs(P)
    # w is sum alpha_i y_i [x_i, 1] (eq. 8)
    Xd = X.toarray() if sp.issparse(X) else X
    w = (res.alpha * y) @ np.c_[Xd.astype(np.float64), np.ones(len(y))]
    np.testing.assert_allclose(res.w, w, atol=1e-8)


def test_subproblem_only_moves_its_rows_and_warm_start_continues(rng):
    X, y = DATASETS["gaussian"]()
    n, d = X.shape
    alpha, w = np.zeros(n), np.zeros(d + 1)
    block = rng.choice(n, size=300, replace=False)
    st = dcd_subproblem(X, y, alpha, w, block, loss="hinge", C=1.0, eps=1e-3, max_iter=5000, rng=1)
    outside = np.setdiff1d(np.arange(n), block)
    assert np.all(alpha[outside] == 0) and st.converged
    # the block's solution is the full solve restricted to the block
    ref = solve_dcd(X[block], y[block], loss="hinge", C=1.0, eps=1e-3, max_iter=5000, seed=1)
    assert st.objective == pytest.approx(ref.stats.objective, rel=1e-4)
    # warm start on all rows reaches the full optimum, and never increases the objective
    st2 = dcd_subproblem(X, y, alpha, w, None, loss="hinge", C=1.0, eps=1e-3, max_iter=5000, rng=2)
    full = solve_dcd(X, y, loss="hinge", C=1.0, eps=1e-3, max_iter=5000, seed=2)
    assert st2.objective <= st.objective
    assert st2.objective == pytest.approx(full.stats.objective, rel=1e-4)


def test_bool_mask_rows_equal_index_rows():
    X, y = DATASETS["sparse"]()
    mask = np.zeros(X.shape[0], bool)
    mask[::3] = True
    outs = []
    for rows in (mask, np.flatnonzero(mask)):
        a, w = np.zeros(X.shape[0]), np.zeros(X.shape[1] + 1)
        outs.append((dcd_subproblem(X, y, a, w, rows, rng=5), w))
    assert outs[0][0] == outs[1][0]
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_same_seed_same_result_and_inputs_untouched():
    X, y = DATASETS["gaussian"]()
    X0, y0 = X.copy(), y.copy()
    a = solve_dcd(X, y, seed=7)
    b = solve_dcd(X, y, seed=7)
    c = solve_dcd(X, y, seed=8)
    np.testing.assert_array_equal(a.w, b.w)
    assert not np.array_equal(a.alpha, c.alpha)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)


def test_no_bias_means_no_intercept():
    X = np.array([[2.0], [-2.0]], dtype=np.float32)
    res = solve_dcd(X, np.array([1.0, -1.0]), C=10.0, bias=0.0, eps=1e-8)
    assert res.w[-1] == 0.0 and res.w[0] == pytest.approx(0.5, abs=1e-9)  # margin 1 at |x| = 2


def test_kernels_agree_on_dense_and_csr(rng):
    X = rng.normal(size=(50, 7)).astype(np.float32)
    w = rng.normal(size=8)
    rows = np.arange(50, dtype=np.int64)
    outs = []
    for Xl in (X, sp.csr_matrix(X)):
        args = kernel_args(Xl)
        z = np.empty(50)
        K.rows_dot(*args, 1.0, rows, w, z)
        outs.append(z)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-10)
    np.testing.assert_allclose(outs[0], X.astype(np.float64) @ w[:7] + w[7], rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"C": -1.0}, r"The 'C' parameter of solve_dcd must be > 0. Got -1.0 instead."),
    ({"eps": 0}, r"The 'eps' parameter of solve_dcd must be > 0"),
    ({"max_iter": 2.5}, r"The 'max_iter' parameter of solve_dcd must be an integer > 0"),
    ({"bias": -1}, r"The 'bias' parameter of solve_dcd must be >= 0"),
    ({"loss": "log"}, r"'loss' parameter must be one of"),
])
def test_bad_parameters(kwargs, match):
    X, y = DATASETS["gaussian"]()
    with pytest.raises(ParameterError, match=match):
        solve_dcd(X, y, **kwargs)


def test_bad_labels_and_warm_start():
    X, y = DATASETS["gaussian"]()
    with pytest.raises(ParameterError, match="must hold labels -1 and \\+1"):
        solve_dcd(X, (y > 0).astype(float))
    with pytest.raises(ParameterError, match="alpha of dcd_subproblem must lie in"):
        dcd_subproblem(X, y, np.full(len(y), 5.0), np.zeros(X.shape[1] + 1), C=1.0)
    with pytest.raises(ParameterError, match="w of dcd_subproblem must be a writable float64"):
        dcd_subproblem(X, y, np.zeros(len(y)), np.zeros(3))
