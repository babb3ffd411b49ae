"""PEGASOS against a slow, obviously-correct reference of the paper's update, and convergence."""
import math

import numpy as np
import pytest

from ooc_learn.solvers import _kernels as K
from ooc_learn.solvers._common import seed_state
from ooc_learn.solvers.dcd import primal_objective, solve_dcd
from ooc_learn.solvers.pegasos import solve_pegasos, solve_pegasos_streamed
from ooc_learn.storage.errors import ParameterError
from solver_data import DATASETS, as_layout


def reference_pegasos(X, y, C, squared, epochs, seed, project=True):
    """The paper's update written out, with the kernel's own row order."""
    X = X.toarray() if hasattr(X, "toarray") else X
    Xa = np.c_[X.astype(np.float64), np.ones(len(y))]
    n = len(y)
    lam = 1.0 / (C * n)
    r = math.sqrt((2.0 if squared else 1.0) / lam)
    gen = np.random.default_rng(seed)
    w = np.zeros(Xa.shape[1])
    t = 1
    for _ in range(epochs):
        order = np.arange(n, dtype=np.int64)
        K.shuffle_prefix(order, n, seed_state(gen))
        for i in order:
            eta = 1.0 / (lam * t)
            z = y[i] * Xa[i] @ w
            g = (2 * (1 - z) if squared else 1.0) if z < 1 else 0.0
            w = (1 - eta * lam) * w + eta * g * y[i] * Xa[i]
            if project and np.linalg.norm(w) > r:
                w *= r / np.linalg.norm(w)
            t += 1
    return w


@pytest.mark.parametrize("loss", ["hinge", "sqhinge"])
def test_pegasos_equals_reference_update(loss, layout):
    X, y = DATASETS["breast_cancer"]()
    X = as_layout(X, layout)
    res = solve_pegasos(X, y, loss=loss, C=1.0, epochs=3, seed=11)
    ref = reference_pegasos(X, y, 1.0, loss == "sqhinge", 3, 11)
    np.testing.assert_allclose(res.w, ref, rtol=1e-8, atol=1e-10)
    assert res.steps == 3 * len(y) and res.rows_read == 3 * len(y)


def test_pegasos_approaches_the_svm_optimum():
    X, y = DATASETS["breast_cancer"]()
    opt = solve_dcd(X, y, C=1.0, eps=1e-4, max_iter=20000)
    P_opt = primal_objective(X, y, opt.w, "hinge", 1.0)
    P = [primal_objective(X, y, solve_pegasos(X, y, C=1.0, epochs=e, seed=0).w, "hinge", 1.0)
         for e in (1, 20, 300)]
    assert P[0] > P[1] > P[2]
    assert P[2] <= 1.03 * P_opt          # the last iterate is within 3 % after 300 passes
    acc = np.mean(np.sign(X @ opt.w[:-1] + opt.w[-1]) == y)
    res = solve_pegasos(X, y, C=1.0, epochs=300, seed=0)
    assert np.mean(np.sign(X @ res.w[:-1] + res.w[-1]) == y) >= acc - 0.01


def test_streamed_blocks_reproducible_and_learn(rng):
    X, y = DATASETS["gaussian"]()
    off = np.array([0, 400, 400, 1000, len(y)])      # an empty block is skipped

    def read(b):
        return X[off[b]:off[b + 1]], y[off[b]:off[b + 1]]

    a = solve_pegasos_streamed(read, off, X.shape[1], C=1.0, epochs=2, seed=3)
    b = solve_pegasos_streamed(read, off, X.shape[1], C=1.0, epochs=2, seed=3)
    np.testing.assert_array_equal(a.w, b.w)
    assert a.rows_read == 2 * len(y)
    assert np.mean(np.sign(X @ a.w[:-1] + a.w[-1]) == y) >= 0.8


def test_pegasos_parameter_errors():
    X, y = DATASETS["gaussian"]()
    with pytest.raises(ParameterError, match="'epochs' parameter of solve_pegasos must be an"):
        solve_pegasos(X, y, epochs=0)
    with pytest.raises(ParameterError, match="'C' parameter of PegasosState must be > 0"):
        solve_pegasos(X, y, C=float("nan"))
    with pytest.raises(ParameterError, match="must be convex"):
        solve_pegasos(X, y, loss=__import__("ooc_learn.losses").losses.get_loss("hinge", s=1))
