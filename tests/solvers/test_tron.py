"""TRON and the primal (16) against scipy.optimize; finite-difference checks of grad and Hv."""
import numpy as np
import pytest
from scipy.optimize import minimize

from ooc_learn.solvers.dcd import solve_dcd
from ooc_learn.solvers.tron import L2LossPrimal, solve_tron, tron
from ooc_learn.storage.errors import ParameterError
from solver_data import DATASETS, as_layout


def _problem(data, layout, rng, with_block):
    X, y = DATASETS[data]()
    X = as_layout(X, layout)
    n, d = X.shape
    rows = np.sort(rng.choice(n, n // 2, replace=False)) if with_block else None
    v = rng.normal(scale=0.3, size=d + 1) if with_block else None
    return X, y, rows, v


@pytest.mark.parametrize("with_block", [False, True], ids=["full", "block_eq16"])
@pytest.mark.parametrize("data", ["breast_cancer", "sparse"])
def test_tron_matches_scipy(data, with_block, layout, rng):
    X, y, rows, v = _problem(data, layout, rng, with_block)
    C = 0.7
    res = solve_tron(X, y, C=C, rows=rows, v_fixed=v, eps=1e-8)
    prob = L2LossPrimal(X, y, C=C, rows=rows, v_fixed=v)

    def fg(w):
        return prob.fun(w), prob.grad(w)

    ref = minimize(fg, np.zeros(prob.n), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-10, "ftol": 1e-15, "maxiter": 20000})
    assert res.stats.converged
    # same convex problem: objectives within 1e-6 relative
    assert abs(res.stats.objective - ref.fun) <= 1e-6 * abs(ref.fun)
    assert res.stats.objective <= ref.fun + 1e-9 * abs(ref.fun)


@pytest.mark.parametrize("with_block", [False, True])
def test_primal_grad_and_hv_finite_differences(with_block, layout, rng):
    X, y, rows, v = _problem("gaussian", layout, rng, with_block)
    prob = L2LossPrimal(X, y, C=1.3, rows=rows, v_fixed=v)
    w = rng.normal(scale=0.2, size=prob.n)
    u = rng.normal(size=prob.n)
    h = 1e-6
    prob.fun(w)
    g = prob.grad(w)
    fd = np.array([(prob.fun(w + h * e) - prob.fun(w - h * e)) / (2 * h) for e in np.eye(prob.n)])
    assert np.max(np.abs(fd - g)) <= 1e-4 * max(1.0, np.abs(g).max())
    prob.fun(w)
    Hu = prob.Hv(u)
    fd_h = []
    for sgn in (1, -1):
        prob.fun(w + sgn * h * u)
        fd_h.append(prob.grad(w + sgn * h * u))
    fd_hv = (fd_h[0] - fd_h[1]) / (2 * h)
    assert np.max(np.abs(fd_hv - Hu)) <= 1e-4 * max(1.0, np.abs(Hu).max())
    prob.fun(w)
    # the preconditioner is the Hessian's diagonal
    H = np.array([prob.Hv(e) for e in np.eye(prob.n)])
    np.testing.assert_allclose(prob.diag_precond(), np.diag(H), rtol=1e-9)


def test_tron_agrees_with_dual_cd_and_recovers_alpha():
    X, y = DATASETS["breast_cancer"]()
    res = solve_tron(X, y, C=1.0, eps=1e-6)
    dual = solve_dcd(X, y, loss="sqhinge", C=1.0, eps=1e-5, max_iter=50000)
    # primal optimum = - dual optimum (strong duality), within 1e-5 relative
    assert abs(res.stats.objective + dual.stats.objective) <= 1e-5 * res.stats.objective
    alpha = L2LossPrimal(X, y, C=1.0).dual(res.w)
    np.testing.assert_allclose(alpha, dual.alpha, atol=1e-3)


def test_tron_on_a_dense_quadratic_solves_exactly(rng):
    """A quadratic problem: one Newton step inside a large region, CG to tolerance."""
    A = rng.normal(size=(6, 6))
    H = A @ A.T + np.eye(6)
    b = rng.normal(size=6)

    class Quad:
        n, n_fun = 6, 0

        def fun(self, w):
            self.n_fun += 1
            return 0.5 * w @ H @ w - b @ w

        def grad(self, w):
            return H @ w - b

        def Hv(self, s):
            return H @ s

        def diag_precond(self):
            return np.diag(H).copy()

    res = tron(Quad(), eps=1e-12, eps_cg=1e-12)
    np.testing.assert_allclose(res.w, np.linalg.solve(H, b), rtol=1e-8)


def test_tron_refuses_nonsmooth_loss():
    X, y = DATASETS["gaussian"]()
    with pytest.raises(ParameterError, match="'loss' parameter of L2LossPrimal must be a smooth"):
        L2LossPrimal(X, y, loss="hinge")
    with pytest.raises(ParameterError, match="'C' parameter of L2LossPrimal must be > 0"):
        L2LossPrimal(X, y, C=0)
    with pytest.raises(ParameterError, match="v_fixed of L2LossPrimal must have"):
        L2LossPrimal(X, y, v_fixed=np.zeros(2))
