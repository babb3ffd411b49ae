"""Newton's method on the smoothed hinge, then dual CD: against a tiny QP and LIBLINEAR."""
import re

import numpy as np
import pytest
import scipy.optimize as so
import scipy.sparse as sp

from ooc_learn.solvers.dcd import dcd_subproblem, primal_objective
from ooc_learn.solvers import hinge_newton
from ooc_learn.solvers.hinge_newton import newton_hinge, newton_hinge_windows

from solver_data import DATASETS, as_layout


def augmented(X, bias=1.0):
    Xd = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    return np.hstack([Xd.astype(np.float64), np.full((Xd.shape[0], 1), bias)])


def dual_qp(X, y, C, fixed=None):
    """The hinge SVM's dual by L-BFGS-B (box constraints only: the bias is a feature):
    min 1/2 |v + Z^T a|^2 - sum a, 0 <= a <= C; ``fixed`` = v."""
    Z = augmented(X) * y[:, None]
    v = np.zeros(Z.shape[1]) if fixed is None else fixed

    def f(a):
        u = v + Z.T @ a
        return 0.5 * u @ u - a.sum(), Z @ u - 1.0

    res = so.minimize(f, np.zeros(len(y)), jac=True, method="L-BFGS-B",
                      bounds=[(0.0, C)] * len(y), options={"ftol": 1e-15, "gtol": 1e-12,
                                                            "maxiter": 20000})
    return res.x, v + Z.T @ res.x


def test_newton_then_dual_cd_matches_a_tiny_qp(layout):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 3)).astype(np.float32)
    X[:2] = 0.0           # all-zero rows
    X[5] = X[6]           # a duplicate
    y = np.where(X[:, 0] - 0.5 * X[:, 1] + 0.4 * rng.normal(size=60) > 0, 1.0, -1.0)
    X = as_layout(X, layout)
    C = 2.0
    alpha, w = np.zeros(60), np.zeros(4)
    st = newton_hinge(X, y, alpha, w, C=C, bias=1.0)
    assert st.converged
    res = dcd_subproblem(X, y, alpha, w, C=C, bias=1.0, eps=1e-6, max_iter=10000, rng=0)
    assert res.converged
    _, w_qp = dual_qp(X, y, C)
    P_ours = primal_objective(X, y, w, "hinge", C)
    P_qp = primal_objective(X, y, w_qp, "hinge", C)
    # the primal optimum is unique: objectives within 1e-7 relative, w within 1e-4
    assert abs(P_ours - P_qp) <= 1e-7 * P_qp
    np.testing.assert_allclose(w, w_qp, atol=1e-4)


@pytest.mark.parametrize("data", sorted(DATASETS))
def test_newton_leaves_a_feasible_dual_point_near_liblinears_optimum(data, layout, capfd):
    liblinear = pytest.importorskip("liblinear.liblinearutil")
    X, y = DATASETS[data]()
    X = as_layout(X, layout)
    n, d = X.shape
    C = 0.5
    alpha, w = np.zeros(n), np.zeros(d + 1)
    newton_hinge(X, y, alpha, w, C=C, bias=1.0)
    # a dual point: alpha in [0, C] and w = Z^T alpha
    assert alpha.min() >= 0.0 and alpha.max() <= C
    np.testing.assert_allclose(w, augmented(X).T @ (alpha * y), atol=1e-6 * max(1, n * C))
    P = primal_objective(X, y, w, "hinge", C)
    D = alpha.sum() - 0.5 * w @ w
    # the smoothed problem's solution: its duality gap is below C h |rows| (h = 0.01), and in
    # practice far below
    assert 0.0 <= P - D <= 1e-2 * P
    # dual CD from there to LIBLINEAR's rule, against LIBLINEAR itself at a tight eps
    res = dcd_subproblem(X, y, alpha, w, C=C, bias=1.0, eps=0.01, max_iter=1000, rng=0)
    assert res.converged
    capfd.readouterr()
    Xl = X if sp.issparse(X) else X.astype(np.float64)
    liblinear.train(y, Xl, f"-s 3 -c {C} -B 1 -e 0.001")
    obj_lib = float(re.search(r"Objective value = (\S+)", capfd.readouterr().out).group(1))
    # LIBLINEAR prints the dual objective in minimisation form (-D): ours is at least as
    # high a dual value (within 1e-4), and the duality gap certifies it within 1e-3 of P*
    assert -res.objective >= -obj_lib - 1e-4 * abs(obj_lib)
    P = primal_objective(X, y, w, "hinge", C)
    assert P + res.objective <= 1e-3 * P


def test_newton_keeps_the_fixed_rows_part_of_w(layout):
    """IBCD's S: rows outside it keep their alpha, whose part v of w Newton must not move."""
    X, y = DATASETS["gaussian"]()
    X = as_layout(X, layout)
    n, d = X.shape
    C = 1.0
    rng = np.random.default_rng(0)
    outside = rng.random(n) < 0.3
    a_out = np.where(outside, rng.uniform(0, C, n), 0.0)
    v = augmented(X).T @ (a_out * y)
    S = np.flatnonzero(~outside)
    XS = X[S]
    alpha = rng.uniform(0, C, S.size)
    w = v + augmented(XS).T @ (alpha * y[S])
    newton_hinge(XS, y[S], alpha, w, C=C, bias=1.0)
    np.testing.assert_allclose(w - augmented(XS).T @ (alpha * y[S]), v, atol=1e-6 * n)
    # and the solution is the QP's with v fixed
    res = dcd_subproblem(XS, y[S], alpha, w, C=C, bias=1.0, eps=1e-5, max_iter=20000, rng=0)
    assert res.converged
    _, w_qp = dual_qp(XS, y[S], C, fixed=v)
    np.testing.assert_allclose(w, w_qp, atol=2e-3)


@pytest.mark.parametrize("h, steps", [(0.01, 100), (0.1, 10)], ids=["final", "quick"])
def test_newton_over_windows_matches_the_solve_in_memory(layout, h, steps):
    """IBCD's spilled S: the rows are read window by window and the rows whose weight
    changed read back; alpha and w are those of the solve over rows in memory (to rounding:
    the last step may fall on either side of the decrement's tolerance), the fixed rows'
    part of w included, whatever the windows' size."""
    X, y = DATASETS["gaussian"]()
    X = as_layout(X, layout)
    n, d = X.shape
    rng = np.random.default_rng(3)
    a0 = np.where(rng.random(n) < 0.5, rng.uniform(0, 1.0, n), 0.0)
    v = rng.normal(size=d + 1)
    w0 = v + augmented(X).T @ (a0 * y)
    a_mem, w_mem = a0.copy(), w0.copy()
    ref = newton_hinge(X, y, a_mem, w_mem, C=1.0, bias=1.0, h=h, max_newton=steps)
    reads = []

    def windows(step=n // 3 + 7):
        for a in range(0, n, step):
            b = min(n, a + step)
            yield a, b, X[a:b]

    def take(pos):
        reads.append(len(pos))
        return X[pos]

    a_win, w_win = a0.copy(), w0.copy()
    got = newton_hinge_windows(windows, take, y, a_win, w_win, C=1.0, bias=1.0, h=h,
                               max_newton=steps)
    assert abs(got.iterations - ref.iterations) <= 1 and ref.iterations > 1
    assert (got.band, got.converged, got.changed) == (ref.band, ref.converged, ref.changed)
    assert reads and max(reads) <= 256  # rows read back a chunk at a time
    np.testing.assert_allclose(a_win, a_mem, rtol=0, atol=1e-8)
    np.testing.assert_allclose(w_win, w_mem, rtol=1e-8, atol=1e-8)


def test_non_finite_margins_leave_alpha_and_w_as_they_came():
    X = np.ones((40, 3), np.float32)
    X[7, 1] = np.inf
    y = np.where(np.arange(40) % 2, 1.0, -1.0)
    alpha, w = np.full(40, 0.25), np.zeros(4)
    w[:] = augmented(np.nan_to_num(X, posinf=0.0)).T @ (alpha * y)
    a0, w0 = alpha.copy(), w.copy()
    st = newton_hinge(X, y, alpha, w, C=1.0, bias=1.0)
    assert not st.converged and st.changed == 0
    np.testing.assert_array_equal(alpha, a0)
    np.testing.assert_array_equal(w, w0)


def test_a_c_so_large_that_the_hessian_loses_its_definiteness_ends_approximate(tmp_path):
    # at C ~ 1e14 and up the identity in H = I + C/(2h) Z^T Z is lost to float64's rounding
    # beside the band's rows: Cholesky refused H and `ooc-train --C 1e14` ended in a
    # LinAlgError traceback (exit 1), where dcd and bm end with the "approximate" warning.
    # Newton's method now stops there at a feasible dual point and dual CD goes on
    import ooc_learn
    from ooc_learn.api import ingest_arrays
    from ooc_learn.datasets import make_linear_classification

    X, y, _ = make_linear_classification(2000, seed=0)
    with ingest_arrays(X, y, tmp_path / "s", build_index=True) as store:
        for C in (1e14, 1e20):
            with pytest.warns(RuntimeWarning, match="approximate"):
                m = ooc_learn.train(store, C=C)
            assert np.isfinite(m.coef_).all() and m.score(X, y) > 0.8
            assert m.meta["stats"]["converged"] is False  # it was True beside the warning
    # from a warm dual point (as IBCD's S comes to it), both the solve in memory and the
    # one over windows (a spilled S) stop at a feasible dual point with w = Z^T alpha
    Xd = X[:300].toarray().astype(np.float32)
    yd = y[:300]
    alpha0, w0 = np.zeros(300), np.zeros(51)
    dcd_subproblem(Xd, yd, alpha0, w0, C=1e14, bias=1.0, max_iter=20)
    for windows in (False, True):
        alpha, w = alpha0.copy(), w0.copy()
        if windows:
            wins = lambda: iter([(0, 150, Xd[:150]), (150, 300, Xd[150:])])  # noqa: E731
            res = newton_hinge_windows(wins, lambda pos: Xd[pos], yd, alpha, w, C=1e14,
                                       bias=1.0)
        else:
            res = newton_hinge(Xd, yd, alpha, w, C=1e14, bias=1.0)
        assert not res.converged
        assert np.all((alpha >= 0) & (alpha <= 1e14)) and np.isfinite(w).all()
        np.testing.assert_allclose(w, augmented(Xd).T @ (alpha * yd), rtol=1e-6,
                                   atol=1e-6 * np.abs(w).max())


@pytest.mark.parametrize("layout", ["dense", "csr"])
def test_the_hessian_followed_by_rank_updates_solves_as_the_band_built_afresh(layout):
    # H follows the band by rank updates while fewer rows change than the band holds (else it
    # is rebuilt), and every solve is by H as it is then: its factor is refreshed after each
    # change, so each Newton direction is exact
    from ooc_learn.solvers import hinge_newton as hn
    from ooc_learn.storage.arrays import kernel_args

    rng = np.random.default_rng(3)
    X = as_layout(rng.normal(size=(300, 6)).astype(np.float32), layout)
    Z = augmented(X)
    H = hn._Hessian(*kernel_args(X), 1.0, 7, 2.5)
    g = rng.normal(size=7)
    # 0.2, 0.75 and 5 of the band changing: updated, updated, rebuilt
    bands = [np.arange(0, 100), np.arange(10, 110), np.arange(40, 140), np.arange(200, 230)]
    rebuilt = []
    for band in bands:
        H.follow(band)
        rebuilt.append(H.rebuilt)
        ref = np.eye(7) + 2.5 * Z[band].T @ Z[band]
        np.testing.assert_allclose(H.solve(g), np.linalg.solve(ref, g), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(H.solve(2 * g), 2 * np.linalg.solve(ref, g), rtol=1e-10,
                                   atol=1e-12)
    assert rebuilt == [True, False, False, True]


def test_newton_takes_data_up_to_4096_features_a_common_embedding_width():
    # MAX_FEATURES counts features: 4,096-wide dense embeddings take Newton's method (H of
    # 4,097^2 float64, 128 MiB), wider data do not; the rows rule is 8 (d + 1)
    assert hinge_newton.applies(4096) and not hinge_newton.applies(4097)
    assert hinge_newton.applies(784, 8 * 785) and not hinge_newton.applies(784, 8 * 785 - 1)
