"""K-fold CV of the linear SVM on a store (linear_cv / linear_cv_grid / ooc-train --cv).

Reference: each fold retrained from scratch, in memory, on the same training rows (to eps 1e-9);
the decision values of the held-out rows must agree. LIBLINEAR (-s 3 -B 1) is the peer for the
fold objectives.
"""

import json
import warnings

import numpy as np
import pytest
from liblinear.liblinearutil import parameter, problem, train as ll_train

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import train_main
from ooc_learn.cv.folds import store_fold_bounds
from ooc_learn.cv.linear import linear_cv, linear_cv_grid
from ooc_learn.cv.linear_folds import fold_plan
from ooc_learn.model import load_model
from ooc_learn.solvers.dcd import primal_objective, solve_dcd
from ooc_learn.solvers.dcd_streamed import drop_rows, solve_dcd_store
from ooc_learn.solvers.ibcd import solve_ibcd
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.store import open_store
from ooc_learn.training import train


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(7)
    n, d = 1200, 12
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = np.where(X @ rng.normal(size=d) + 0.3 + 0.8 * rng.normal(size=n) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True).close()
    return tmp_path / "s"


def _rows(path):
    with open_store(path) as st:
        X, y, _ = st.read_range(0, st.n_samples)
        return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64), \
            store_fold_bounds(st.block_offsets, 5)


def _retrained_fold_decisions(X, y, bounds, C, loss="hinge"):
    """Decision values of every row from an SVM retrained from scratch without its fold, in
    memory, to eps 1e-9 (LIBLINEAR stops at 1000 passes short of that on this data: its
    primal objective is 1e-5 above this one's; see test_fold_objectives_not_above_liblinear)."""
    dv = np.empty(len(y))
    for i in range(len(bounds) - 1):
        a, z = bounds[i], bounds[i + 1]
        tr = np.r_[0:a, z:len(y)]
        w = solve_dcd(X[tr].astype(np.float32), y[tr], loss=loss, C=C, eps=1e-9,
                      max_iter=10**6).w
        dv[a:z] = X[a:z] @ w[:-1] + w[-1]
    return dv


def _liblinear_w(X, y, C):
    m = ll_train(problem(y, X), parameter(f"-s 3 -c {C} -B 1 -e 1e-6 -q"))
    w = np.array([m.get_decfun_coef(j + 1) for j in range(X.shape[1])]
                 + [m.get_decfun_bias()])
    return w if m.get_labels()[0] == 1 else -w


@pytest.mark.parametrize("solver", ["dcd", "bm", "ibcd"])
@pytest.mark.parametrize("warm", [True, False])
def test_folds_match_retraining_per_fold(store, solver, warm):
    X, y, bounds = _rows(store)
    ref = _retrained_fold_decisions(X, y, bounds, 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = linear_cv(store, 5, solver=solver, C=0.05, eps=1e-6, max_outer=1000,
                     warm_start=warm)
    assert res.k == 5 and res.metric == "accuracy"
    assert np.array_equal(res.folds, np.repeat(np.arange(5), np.diff(bounds)))
    # both to a tight eps (bm: at its 1000 outer iterations): decisions within 5e-3
    assert np.abs(res.predictions - ref).max() < 5e-3
    ref_acc = [np.mean((ref[a:z] > 0) == (y[a:z] > 0)) for a, z in zip(bounds[:-1], bounds[1:])]
    near = np.abs(ref) < 5e-3  # rows on the margin may fall either way
    for i, (a, z) in enumerate(zip(bounds[:-1], bounds[1:])):
        assert abs(res.fold_scores[i] - ref_acc[i]) <= near[a:z].sum() / (z - a) + 1e-12
    assert res.estimate == pytest.approx(np.mean((res.predictions > 0) == (y > 0)))


@pytest.mark.parametrize("solver", ["dcd", "bm"])
def test_folds_in_threads_match_retraining_per_fold(store, solver):
    X, y, bounds = _rows(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grid = linear_cv_grid(store, 5, [0.01, 0.05], solver=solver, eps=1e-6, max_outer=1000,
                           n_jobs=3)
    assert grid[0].stats["jobs"] == 3
    for r in grid:
        ref = _retrained_fold_decisions(X, y, bounds, r.stats["C"])
        assert np.abs(r.predictions - ref).max() < 5e-3
        assert [f["fold"] for f in r.stats["folds"]] == list(range(5))
    with pytest.raises(ParameterError, match="n_jobs"):
        linear_cv(store, 5, solver=solver, n_jobs=0)


def test_fold_objectives_not_above_liblinear(store):
    X, y, bounds = _rows(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for solver in ("dcd", "ibcd"):
            res = linear_cv(store, 5, solver=solver, C=0.05, eps=1e-6, max_outer=1000)
            for i, f in enumerate(res.stats["folds"]):
                a, z = bounds[i], bounds[i + 1]
                tr = np.r_[0:a, z:len(y)]
                ll = primal_objective(X[tr].astype(np.float32), y[tr], _liblinear_w(X[tr], y[tr], 0.05),
                                      "hinge", 0.05)
                # dcd reports its dual value (a lower bound), IBCD the primal on S
                assert f["objective"] <= ll * (1 + 1e-5), (solver, i, f["objective"], ll)
                assert f["objective"] >= ll * (1 - 1e-3), (solver, i, f["objective"], ll)


@pytest.mark.parametrize("solver", ["dcd", "ibcd"])
def test_warm_and_cold_folds_agree_at_default_eps(store, solver):
    # the warm start changes where dual CD starts, not the problem: at LIBLINEAR's eps the
    # two runs differ by the solution's tolerance only (the speed is scripts/bench_linear_cv)
    cold = linear_cv(store, 5, solver=solver, C=0.05, warm_start=False)
    warm = linear_cv(store, 5, solver=solver, C=0.05)
    assert warm.method == f"{solver}-warm" and cold.method == solver
    assert np.abs(cold.predictions - warm.predictions).max() < 0.15
    assert abs(cold.estimate - warm.estimate) <= 0.01


def test_grid_matches_each_c_alone_and_liblinear(store):
    X, y, bounds = _rows(store)
    Cs = [0.5, 0.01, 0.05]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grid = linear_cv_grid(store, 5, Cs, solver="dcd", eps=1e-6, max_outer=200)
    assert [r.stats["C"] for r in grid] == [0.01, 0.05, 0.5]  # ascending: the warm path
    for r in grid:
        ref = _retrained_fold_decisions(X, y, bounds, r.stats["C"])
        assert np.abs(r.predictions - ref).max() < 5e-3
        alone = linear_cv(store, 5, solver="dcd", C=r.stats["C"], eps=1e-6, max_outer=200)
        assert abs(alone.estimate - r.estimate) <= 2 / len(y)


def test_ibcd_grid_warm_along_c_matches_liblinear(store):
    X, y, bounds = _rows(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grid = linear_cv_grid(store, 5, [0.01, 0.05], solver="ibcd", eps=1e-6)
    for r in grid:
        ref = _retrained_fold_decisions(X, y, bounds, r.stats["C"])
        assert np.abs(r.predictions - ref).max() < 5e-3


def test_held_out_rows_never_join_the_problem(store):
    X, y, bounds = _rows(store)
    a, z = int(bounds[2]), int(bounds[3])
    tr = np.r_[0:a, z:len(y)]
    ref = solve_dcd(X[tr].astype(np.float32), y[tr], C=0.05, eps=1e-9, max_iter=100000)
    with open_store(store) as st:
        res = solve_dcd_store(st, C=0.05, eps=1e-6, max_iter=100000, holdout=(a, z))
        assert not res.alpha[a:z].any()
        assert np.abs(res.w - ref.w).max() < 1e-4
        ib = solve_ibcd(st, C=0.05, eps=1e-6, holdout=(a, z), n=100, init_sample=300)
        assert not ((ib.sv_rows >= a) & (ib.sv_rows < z)).any()
        assert np.abs(ib.w - ref.w).max() < 1e-3
        # the warm start: a full solution with the fold's rows taken out
        full = solve_dcd_store(st, C=0.05, eps=1e-6, max_iter=100000)
        alpha, w = full.alpha.copy(), full.w.copy()
        drop_rows(st.read_range, a, z, alpha, w, 1.0)
        Xall = np.c_[X, np.ones(len(y))]
        assert np.allclose(w, Xall.T @ (alpha * y), atol=1e-6)
        warm = solve_dcd_store(st, C=0.05, eps=1e-6, max_iter=100000, holdout=(a, z),
                               warm=(alpha, w))
        assert np.abs(warm.w - ref.w).max() < 1e-4
        ib2 = solve_ibcd(st, C=0.05, eps=1e-6, holdout=(a, z), n=100,
                         warm=(full.alpha.nonzero()[0], full.alpha[full.alpha > 0]))
        assert np.abs(ib2.w - ref.w).max() < 1e-3
        with pytest.raises(Exception, match="holdout"):
            solve_ibcd(st, holdout=(0, st.n_samples))


def test_cli_cv_grid_and_final_model(store, tmp_path, capsys):
    model = tmp_path / "m.npz"
    assert train_main([str(store), "--cv", "5", "--C", "0.01,1", "--solver", "dcd",
                       "--eps", "1e-3", "-o", str(model), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    grid = linear_cv_grid(store, 5, [0.01, 1.0], solver="dcd", eps=1e-3)
    assert [g["C"] for g in out["grid"]] == [0.01, 1.0]
    assert [g["estimate"] for g in out["grid"]] == pytest.approx([r.estimate for r in grid])
    best = max(grid, key=lambda r: r.estimate).stats["C"]
    assert out["best_C"] == best
    m = load_model(model)
    assert m.meta["C"] == best
    ref = train(store, solver="dcd", C=best, eps=1e-3)
    assert np.abs(m.coef_ - ref.coef_).max() < 1e-9
    assert out["final_model"]["model"] == str(model)
    assert out["final_model"]["converged"] is True  # dual CD reached eps within its passes


@pytest.mark.parametrize("argv, flag", [
    (["--cv", "5", "--lam", "0.1"], "--lam"),
    (["--cv", "5", "--solver", "dcd", "--cv-method", "tree"], "--solver dcd"),
    (["--cv", "5", "--cv-method", "tree", "-o", "m.npz"], "-o"),
    (["--cv", "loo"], "Leave-one-out"),
    (["--C", "0.1,1", "-o", "m.npz"], "--cv"),
    (["--lam", "0.1", "-o", "m.npz"], "--lam"),
    (["--cv", "5", "--solver", "pegasos", "--cv-method", "warm"], "--cv-method warm"),
])
def test_cli_cv_refuses_flags_that_do_not_apply(store, tmp_path, capsys, argv, flag):
    argv = [a if a != "m.npz" else str(tmp_path / "m.npz") for a in argv]
    assert train_main([str(store), "--quiet"] + argv) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()


def test_cli_bad_cost_list_exits_2(store, capsys):
    for bad in ("0.1,x", "0,1", "1,1", "-1"):
        with pytest.raises(SystemExit) as e:
            train_main([str(store), "--cv", "5", "--C", bad])
        assert e.value.code == 2


def test_pegasos_cv_runs_treecv_at_the_training_lambda(store, capsys):
    assert train_main([str(store), "--cv", "4", "--solver", "pegasos", "--C", "2", "--json",
                       "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cv_method"] == "tree" and out["learner"] == "pegasos" and out["k"] == 4
    # PEGASOS at lam = 1/(C n) scores close to the SVM on this separable-ish problem
    svm = linear_cv(store, 4, solver="dcd", C=2.0)
    assert out["estimate"] < 0.5 and abs((1 - out["estimate"]) - svm.estimate) < 0.1


def test_folds_inside_one_block_are_random_and_match_retraining(tmp_path):
    # one indexed block: its rows are in the metric tree's leaf order, so contiguous folds
    # would be clusters of similar rows; the rows are dealt to the folds at random instead
    rng = np.random.default_rng(3)
    n, d = 900, 6
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = np.where(X @ rng.normal(size=d) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "one", n_blocks=1, build_index=True).close()
    with open_store(tmp_path / "one") as st:
        Xs, ys, _ = st.read_range(0, n)
        Xs, ys = np.asarray(Xs), np.asarray(ys, dtype=np.float64)
        folds, contiguous = fold_plan(st.block_offsets, 4, seed=0)
    assert not contiguous and np.array_equal(np.bincount(folds), [225] * 4)
    # far from contiguous: rows of a fold are spread over the whole block
    assert all(np.ptp(np.flatnonzero(folds == i)) > 0.9 * n for i in range(4))
    for solver in ("dcd", "ibcd"):
        res = linear_cv(tmp_path / "one", 4, solver=solver, C=0.05, eps=1e-6, max_outer=1000)
        assert np.array_equal(res.folds, folds)
        for i in range(4):
            held = folds == i
            w = solve_dcd(Xs[~held], ys[~held], C=0.05, eps=1e-9, max_iter=10**6).w
            ref = Xs[held] @ w[:-1] + w[-1]
            assert np.abs(res.predictions[held] - ref).max() < 5e-3


def test_c_search_path_matches_each_c_alone(store, capsys, tmp_path):
    from ooc_learn.cv.c_search import linear_c_search

    path = linear_c_search(store, 5, solver="dcd", C_min=1e-3, C_max=64.0, eps=1e-4,
                        max_outer=100, patience=2)
    Cs = [r.stats["C"] for r in path]
    assert Cs[0] == 1e-3 and all(b == 2 * a for a, b in zip(Cs, Cs[1:])) and Cs[-1] <= 64
    for r in path[::3]:  # each C's folds equal a cross-validation at that C alone
        alone = linear_cv(store, 5, solver="dcd", C=r.stats["C"], eps=1e-4, max_outer=100)
        assert abs(alone.estimate - r.estimate) <= 3 / len(r.predictions)
    # it stopped at C_max, or when the last 2 Cs gained no more than min_delta (1e-3)
    scores = [r.estimate for r in path]
    assert Cs[-1] * 2 > 64 or max(scores[-2:]) <= max(scores[:-2]) + 1e-3
    # the CLI: the same search, and -o trains at the best C
    model = tmp_path / "m.npz"
    assert train_main([str(store), "--cv", "5", "--C-search", "--solver", "dcd", "--eps",
                       "1e-4", "-o", str(model), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best_C"] == max(out["grid"], key=lambda g: g["estimate"])["C"]
    assert load_model(model).meta["C"] == out["best_C"]


def test_c_search_refusals(store, capsys):
    for argv in (["--cv", "5", "--C-search", "--C", "1"], ["--C-search", "-o", "x.npz"],
                 ["--cv", "5", "--C-search", "--solver", "pegasos"]):
        assert train_main([str(store), "--quiet"] + argv) == 2
        assert "--C-search" in capsys.readouterr().err


def test_fold_count_refusals_do_not_offer_a_leave_one_out_they_refuse(store):
    # k > n, and k = 2.5, said "use k='loo'", which the linear SVM's CV then refused
    from ooc_learn.cv.c_search import linear_c_search
    from ooc_learn.cv.linear import linear_cv
    from ooc_learn.storage.errors import ParameterError

    n = 1200
    for fn, k in ((linear_cv, n + 1), (linear_cv, 2.5), (linear_cv, "x"),
                  (linear_c_search, n + 1)):
        with pytest.raises(ParameterError) as e:
            fn(str(store), k)
        assert "loo" not in str(e.value) + e.value.hint, (fn, k)


def _makespan(tasks, threads):
    """The (fold, C) solves the busiest thread does when each free thread takes the next task."""
    import heapq

    load = [0] * threads
    for ids, cs in tasks:
        heapq.heappush(load, heapq.heappop(load) + len(ids) * (cs.stop - cs.start))
    return max(load)


@pytest.mark.parametrize("k", [2, 3, 5, 7, 10])
@pytest.mark.parametrize("m", [1, 2, 4, 5])
@pytest.mark.parametrize("threads", [1, 2, 3, 4, 6, 12])
def test_fold_tasks_cover_every_fold_and_c_once_and_share_them_evenly(k, m, threads):
    from ooc_learn.cv.linear_folds import fold_chains, fold_tasks

    tasks = fold_tasks(k, m, threads)
    pairs = [(i, j) for ids, cs in tasks for i in ids for j in range(m)[cs]]
    assert sorted(pairs) == [(i, j) for i in range(k) for j in range(m)]
    for ids, cs in tasks:  # consecutive folds (warm from the one before) at a run of Cs
        assert ids == list(range(ids[0], ids[0] + len(ids))) and 0 <= cs.start < cs.stop <= m
    # never busier than runs of whole folds, and within a run of Cs of the even share
    chains = [(ids, slice(0, m)) for ids in fold_chains(k, min(threads, k))]
    span = _makespan(tasks, threads)
    assert span <= _makespan(chains, threads)
    if threads < k and m > 1:
        assert span <= -(-k * m // threads) + -(-m // 2)
    assert fold_tasks(5, 4, 2) == [([0, 1], slice(0, 4)), ([2, 3], slice(0, 4)),
                                   ([4], slice(0, 2)), ([4], slice(2, 4))]
