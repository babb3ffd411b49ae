"""Linear regression on a store: least squares (normal equations) and SVR (dual CD).

References: scikit-learn's Ridge (the same objective on the rows with a bias column:
alpha = 1/(2C), the bias weight regularized) and LIBLINEAR -s 12 / -s 13 (the same SVR
objectives); cross-validation against refitting per fold.
"""

import json

import numpy as np
import pytest
from liblinear.liblinearutil import parameter, problem, train as ll_train
from sklearn.datasets import load_diabetes
from sklearn.linear_model import Ridge

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import predict_main, train_main
from ooc_learn.cv.linear import linear_cv, linear_cv_grid
from ooc_learn.cv.linear_folds import fold_plan
from ooc_learn.model import load_model, regression_errors
from ooc_learn.solvers.dcd_streamed import drop_rows
from ooc_learn.solvers.svr import solve_svr, solve_svr_store, svr_primal_objective
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.store import open_store
from ooc_learn.training import train


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    return X.astype(np.float32), y / 100.0


@pytest.fixture
def store(tmp_path, diabetes):
    X, y = diabetes
    ingest_arrays(X, y, tmp_path / "r", n_blocks=4, task="regression").close()
    return tmp_path / "r"


def _augmented_ridge(X, y, C):
    Xa = np.c_[X.astype(np.float64), np.ones(len(y))]
    return Ridge(alpha=0.5 / C, fit_intercept=False, solver="cholesky").fit(Xa, y).coef_


def _liblinear_w(X, y, s, C, p):
    m = ll_train(problem(y, X.astype(np.float64)),
                 parameter(f"-s {s} -c {C} -p {p} -B 1 -e 1e-8 -q"))
    return np.array([m.get_decfun_coef(j + 1) for j in range(X.shape[1])]
                    + [m.get_decfun_bias()])


@pytest.mark.parametrize("C", [0.1, 10.0])
def test_least_squares_dual_cd_matches_ridge(diabetes, C):
    X, y = diabetes
    res = solve_svr(X, y, loss="squared_epsilon_insensitive", C=C, epsilon=0.0, eps=1e-8,
                    max_iter=100000)
    assert res.stats.converged
    assert np.abs(res.w - _augmented_ridge(X, y, C)).max() < 1e-4


@pytest.mark.parametrize("loss, s", [("squared_epsilon_insensitive", 12),
                                     ("epsilon_insensitive", 13)])
@pytest.mark.parametrize("C", [0.1, 10.0])
def test_svr_objective_not_above_liblinear(diabetes, loss, s, C):
    X, y = diabetes
    res = solve_svr(X, y, loss=loss, C=C, epsilon=0.1, eps=1e-6, max_iter=100000)
    ours = svr_primal_objective(X, y, res.w, loss=loss, C=C, epsilon=0.1)
    ref = svr_primal_objective(X, y, _liblinear_w(X, y, s, C, 0.1), loss=loss, C=C,
                               epsilon=0.1)
    # LIBLINEAR stops at 1000 passes; ours at the violation bound: never worse than 1e-6
    assert ours <= ref * (1 + 1e-6), (ours, ref)
    assert ours >= ref * (1 - 1e-2), (ours, ref)


def test_exact_solver_is_ridge_and_close_to_sklearn_with_free_intercept(store, diabetes):
    X, y = diabetes
    m = train(store, C=2.0)
    assert m.regression and m.meta["solver"] == "exact"
    w = np.r_[m.coef_, m.intercept_]
    assert np.abs(w - _augmented_ridge(X, y, 2.0)).max() < 1e-6  # labels stored as float32
    with open_store(store) as st:
        err = regression_errors(m, st)
        assert m.score(st) == pytest.approx(err["r2"])
    free = Ridge(alpha=0.25).fit(X, y)  # scikit-learn's unregularized intercept
    rmse_free = np.sqrt(np.mean((y - free.predict(X)) ** 2))
    assert abs(err["rmse"] - rmse_free) <= 0.01 * rmse_free
    assert err["rmse"] == pytest.approx(np.sqrt(np.mean((y - m.predict(X)) ** 2)))


def test_svr_holdout_and_warm_start_on_the_store(store, diabetes):
    X, y = diabetes
    with open_store(store) as st:
        a, z = 100, 250
        tr = np.r_[0:a, z:len(y)]
        Xs, ys, _ = st.read_range(0, st.n_samples)
        Xs, ys = np.asarray(Xs), np.asarray(ys, dtype=np.float64)
        ref = solve_svr(Xs[tr], ys[tr], loss="epsilon_insensitive", C=1.0, epsilon=0.1,
                        eps=1e-9, max_iter=100000)
        res = solve_svr_store(st, loss="epsilon_insensitive", C=1.0, epsilon=0.1, eps=1e-9,
                              max_iter=100000, holdout=(a, z))
        assert not res.beta[a:z].any()
        assert np.abs(res.w - ref.w).max() < 1e-5
        full = solve_svr_store(st, loss="epsilon_insensitive", C=1.0, epsilon=0.1, eps=1e-9,
                               max_iter=100000)
        beta, w = full.beta.copy(), full.w.copy()
        drop_rows(st.read_range, a, z, beta, w, 1.0, signed=True)
        assert np.allclose(w, np.c_[Xs, np.ones(len(ys))].T @ beta, atol=1e-8)
        warm = solve_svr_store(st, loss="epsilon_insensitive", C=1.0, epsilon=0.1, eps=1e-9,
                               max_iter=100000, holdout=(a, z), warm=(beta, w))
        assert np.abs(warm.w - ref.w).max() < 1e-5


@pytest.mark.parametrize("solver", ["exact", "dcd"])
@pytest.mark.parametrize("k", [4, 7])  # whole blocks; rows of a block dealt to its folds
def test_regression_cv_matches_refitting_per_fold(store, solver, k):
    with open_store(store) as st:
        Xs, ys, _ = st.read_range(0, st.n_samples)
        Xs, ys = np.asarray(Xs), np.asarray(ys, dtype=np.float64)
        folds, contiguous = fold_plan(st.block_offsets, k)
    assert contiguous == (k == 4)
    grid = linear_cv_grid(store, k, [0.1, 1.0], solver=solver, eps=1e-9, max_outer=1000)
    for r in grid:
        C = r.stats["C"]
        assert r.metric == "rmse" and np.array_equal(r.folds, folds)
        sse = 0.0
        for i in range(k):
            held = folds == i
            w = _augmented_ridge(Xs[~held], ys[~held], C)
            dv = Xs[held] @ w[:-1] + w[-1]
            assert np.abs(r.predictions[held] - dv).max() < 1e-4
            sse += float(((ys[held] - dv) ** 2).sum())
        assert r.estimate == pytest.approx(np.sqrt(sse / len(ys)), rel=1e-5)


def test_least_squares_leave_one_out_matches_refitting_per_row(store, capsys):
    """--cv loo of least squares: every row's prediction by the model of the other rows
    (Ridge refitted per row), for every C from the same two passes."""
    with open_store(store) as st:
        Xs, ys, _ = st.read_range(0, st.n_samples)
        Xs, ys = np.asarray(Xs), np.asarray(ys, dtype=np.float64)
    grid = linear_cv_grid(store, "loo", [0.01, 1.0, 100.0])
    rows = np.random.default_rng(0).choice(len(ys), 40, replace=False)
    for r in grid:
        assert r.stats["loo"] and r.k == len(ys)
        for i in rows:
            keep = np.arange(len(ys)) != i
            w = _augmented_ridge(Xs[keep], ys[keep], r.stats["C"])
            assert r.predictions[i] == pytest.approx(Xs[i] @ w[:-1] + w[-1], rel=1e-6,
                                                     abs=1e-9)
        assert r.estimate == pytest.approx(np.sqrt(np.mean((ys - r.predictions) ** 2)))
    # two passes over the store at most (the block cache may hold some), for the three Cs
    assert len(ys) - 3 < sum(r.stats["rows_read"] for r in grid) <= 2 * len(ys)
    assert train_main([str(store), "--cv", "loo", "--C", "0.01,1,100", "--json",
                       "--quiet"]) == 0
    cv = json.loads(capsys.readouterr().out)
    assert [g["estimate"] for g in cv["grid"]] == [r.estimate for r in grid]
    assert "fold_scores" not in cv["grid"][0]  # one per row: not listed
    # SVR has no closed form: refused, naming the one that has
    assert train_main([str(store), "--cv", "loo", "--solver", "dcd", "--quiet"]) == 2
    assert "--solver exact" in capsys.readouterr().err
    # the C search takes K folds (with "loo" it ran one dual CD solve per row and C)
    from ooc_learn.cv.c_search import linear_c_search

    with pytest.raises(ParameterError, match="not leave-one-out") as exc:
        linear_c_search(store, "loo")
    assert "--cv loo --C" in exc.value.hint
    with pytest.raises(ParameterError, match="rows a fold"):
        linear_c_search(store, 300)
    # the search scores least squares by the exact solver (the model training runs), each
    # C as the exact grid scores it alone (it had switched to dual CD's SVR)
    path = linear_c_search(store, 5, C_min=0.25, C_max=64.0)
    exact = linear_cv_grid(store, 5, [r.stats["C"] for r in path], solver="exact")
    assert [r.method for r in path] == [r.method for r in exact]
    np.testing.assert_allclose([r.estimate for r in path], [r.estimate for r in exact],
                               rtol=1e-12)


def test_cli_regression_train_predict_and_cv(store, tmp_path, capsys, diabetes):
    model = tmp_path / "m.npz"
    assert train_main([str(store), "-o", str(model), "--C", "2", "--json", "--quiet",
                       "--test", str(store)]) == 0
    out = json.loads(capsys.readouterr().out)
    m = load_model(model)
    assert m.regression and out["solver"] == "exact"
    with open_store(store) as st:
        err = regression_errors(m, st)
    assert out["test_rmse"] == pytest.approx(err["rmse"])
    assert predict_main([str(model), str(store), "--json", "--quiet"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["rmse"] == pytest.approx(err["rmse"]) and pred["r2"] == pytest.approx(err["r2"])
    assert train_main([str(store), "--cv", "4", "--C", "0.001,1,100", "--json",
                       "--quiet"]) == 0
    cv = json.loads(capsys.readouterr().out)
    assert cv["metric"] == "rmse"
    best = min(cv["grid"], key=lambda g: g["estimate"])
    assert cv["best_C"] == best["C"] and cv["estimate"] == best["estimate"]
    ref = linear_cv(store, 4, C=best["C"])
    assert ref.estimate == pytest.approx(best["estimate"])


def test_regression_flags_that_do_not_apply_exit_2(store, tmp_path, capsys):
    for argv, what in ((["--solver", "ibcd"], "classifiers"),
                       (["--loss", "hinge"], "classification loss"),
                       (["--solver", "exact", "--epsilon", "0.1"], "least squares"),
                       (["--truncate", "1"], "truncated")):
        assert train_main([str(store), "-o", str(tmp_path / "m.npz"), "--quiet"] + argv) == 2
        assert what in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()
    with pytest.raises(ParameterError, match="epsilon"):
        linear_cv(store, 3, epsilon=-1.0)
