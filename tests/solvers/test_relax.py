"""The truncated-loss relaxation (eq. 5): J never increases, fixed points, robustness."""
import numpy as np
import pytest

from ooc_learn.losses import get_loss
from ooc_learn.solvers.dcd import primal_objective, solve_dcd
from ooc_learn.solvers.relax import relax, relax_in_memory, truncated_objective
from ooc_learn.storage.errors import ParameterError
from solver_data import as_layout


def flipped(n, seed, flip=0.12):
    """Separable data whose labels are flipped on 12 % of rows far on the positive side."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 10)).astype(np.float32)
    m = X @ (np.ones(10) / np.sqrt(10))
    y = np.where(m > 0, 1.0, -1.0)
    if flip:
        y[rng.choice(np.flatnonzero(m > 1.0), size=int(flip * n), replace=False)] = -1.0
    return X, y


def accuracy(w, X, y):
    return np.mean(np.sign(X @ w[:-1] + w[-1]) == y)


@pytest.mark.parametrize("loss, solver", [("hinge", "dcd"), ("sqhinge", "dcd"),
                                          ("sqhinge", "tron")])
def test_objective_never_increases_and_ends_at_a_fixed_point(loss, solver, layout):
    X, y = flipped(2000, seed=1)
    X = as_layout(X, layout)
    eps = 1e-3 if solver == "dcd" else 1e-5     # tight inner solves for the fixed-point check
    res = relax_in_memory(X, y, loss=loss, s=1.0, C=1.0, solver=solver, init_sample=300,
                          eps=eps, max_iter=10000, seed=4)
    J = np.array(res.stats.objectives)
    assert res.stats.converged and res.stats.outer_iterations >= 1
    assert np.all(np.diff(J) <= 1e-12 * J[:-1])          # (2) is non-increasing
    tl = get_loss(loss, s=1.0)
    z = y * (X @ res.w[:-1] + res.w[-1])
    assert truncated_objective(res.w, z, tl, 1.0) == pytest.approx(J[-1], rel=1e-9)
    np.testing.assert_array_equal(res.inlier, z >= -1.0)
    # fixed point: w solves the convex problem of L on its own inliers (within 1e-3)
    ref = solve_dcd(X[res.inlier], y[res.inlier], loss=loss, C=1.0, eps=1e-4, max_iter=20000)
    P_w = primal_objective(X, y, res.w, loss, 1.0, rows=res.inlier)
    P_ref = primal_objective(X[res.inlier], y[res.inlier], ref.w, loss, 1.0)
    assert P_w == pytest.approx(P_ref, rel=1e-3)


def test_truncation_beats_the_convex_loss_on_flipped_labels():
    X, y = flipped(3000, seed=2)
    Xt, yt = flipped(3000, seed=3, flip=0.0)
    trunc = relax_in_memory(X, y, loss="hinge", s=1.0, C=1.0, init_sample=500, seed=0)
    convex = solve_dcd(X, y, loss="hinge", C=1.0)
    acc_t, acc_c = accuracy(trunc.w, Xt, yt), accuracy(convex.w, Xt, yt)
    assert acc_t >= 0.97 and acc_t >= acc_c + 0.05, (acc_t, acc_c)
    # and on (2) itself: the relaxation's J is below J of the convex solution
    tl = get_loss("hinge", s=1.0)
    z_c = y * (X @ convex.w[:-1] + convex.w[-1])
    assert trunc.stats.objectives[-1] < truncated_objective(convex.w, z_c, tl, 1.0)
    assert trunc.stats.n_outliers[-1] >= 0.1 * len(y)    # the flipped rows are left out


def test_a_bad_inner_solver_cannot_raise_the_objective():
    X, y = flipped(500, seed=5)
    w0 = solve_dcd(X, y, C=1.0).w
    calls = []

    def bad_solver(w_t, inlier, warm, tighten):
        calls.append(tighten)
        return w_t + 5.0, warm, {"tighten": tighten}

    def margins(w):
        return y * (X @ w[:-1] + w[-1])

    res = relax(bad_solver, margins, get_loss("hinge", s=1.0), 1.0, w0)
    assert calls == [0, 1, 2, 3]                  # tightened, then gave up
    np.testing.assert_array_equal(res.w, w0)
    assert res.stats.objectives == [res.stats.objectives[0]] and not res.stats.converged


def test_custom_solver_sees_inliers_of_the_current_w():
    X, y = flipped(400, seed=6)
    seen = []

    def solver(w_t, inlier, warm, tighten):
        seen.append((w_t.copy(), inlier.copy()))
        r = solve_dcd(X[inlier], y[inlier], C=1.0, eps=1e-3, max_iter=5000)
        return r.w, None, r.stats

    def margins(w):
        return y * (X @ w[:-1] + w[-1])

    w0 = solve_dcd(X, y, C=1.0).w
    res = relax(solver, margins, get_loss("hinge", s=0.5), 1.0, w0)
    for w_t, inl in seen:
        np.testing.assert_array_equal(inl, margins(w_t) >= -0.5)
    assert res.stats.margin_passes == len(seen) + 1


def test_relax_parameter_errors():
    X, y = flipped(100, seed=7)
    with pytest.raises(ParameterError, match="'solver' parameter of relax_in_memory must be"):
        relax_in_memory(X, y, solver="sgd")
    with pytest.raises(ParameterError, match="needs the squared hinge"):
        relax_in_memory(X, y, loss="hinge", solver="tron")
    with pytest.raises(ParameterError, match="'s' parameter of relax_in_memory must be >= 0"):
        relax_in_memory(X, y, s=-2.0)
    with pytest.raises(ParameterError, match="'loss' parameter of relax must be a truncated"):
        relax(None, None, get_loss("hinge"), 1.0, np.zeros(11))
