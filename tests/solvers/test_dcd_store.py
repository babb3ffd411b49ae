"""Out-of-core dual CD on a store equals in-memory dual CD on the same rows and blocks."""
import numpy as np
import pytest

from ooc_learn.solvers.dcd import solve_dcd
from ooc_learn.solvers.dcd_streamed import solve_dcd_store, solve_dcd_streamed
from ooc_learn.storage.errors import BudgetExceededError, ParameterError
from solver_data import DATASETS


@pytest.fixture(params=["gaussian", "sparse"])
def store(request, tmp_path):
    from ooc_learn.storage.ingest import ingest_arrays

    X, y = DATASETS[request.param]()
    st = ingest_arrays(X, y, tmp_path / "s", n_blocks=4, memory="64M", seed=1)
    yield st
    st.close()


@pytest.mark.parametrize("loss", ["hinge", "sqhinge"])
def test_streamed_store_equals_in_memory_blocks(store, loss):
    res = solve_dcd_store(store, loss=loss, C=1.0, eps=0.01, max_iter=5000, seed=9)
    X, y, _ = store.read_range(0, store.n_samples)
    off = store.block_offsets

    def read(b):
        return X[off[b]:off[b + 1]], y[off[b]:off[b + 1]]

    mem = solve_dcd_streamed(read, off, store.n_features, loss=loss, C=1.0, eps=0.01,
                             max_iter=5000, seed=9, sqnorms=store.sqnorms())
    # same rows, same blocks, same permutation scheme: identical iterates
    np.testing.assert_array_equal(res.alpha, mem.alpha)
    np.testing.assert_array_equal(res.w, mem.w)
    assert res.stats == mem.stats
    assert res.stats.converged
    assert store.n_samples <= res.stats.rows_read <= res.stats.epochs * store.n_samples
    # and the same optimum as the in-memory solver with its plain permutation (1e-3 relative)
    ref = solve_dcd(X, y, loss=loss, C=1.0, eps=0.01, max_iter=5000, seed=2)
    assert res.stats.objective == pytest.approx(ref.stats.objective, rel=1e-3)
    agree = np.mean(np.sign(X @ res.w[:-1] + res.w[-1]) == np.sign(X @ ref.w[:-1] + ref.w[-1]))
    assert agree >= 0.995


@pytest.mark.parametrize("holdout", [None, (40, 90)])
def test_one_block_runs_the_whole_loop_in_one_kernel_with_the_same_iterates(tmp_path,
                                                                            holdout):
    # one block and no per-pass callback: LIBLINEAR's outer loop runs in one kernel call
    # (dcd_solve); with a callback the Python loop runs the same passes: identical results
    from ooc_learn.storage.ingest import ingest_arrays

    X, y = DATASETS["sparse"]()
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=1, memory="64M", seed=1) as st:
        passes = []
        fast = solve_dcd_store(st, C=1.0, eps=0.01, seed=3, holdout=holdout)
        slow = solve_dcd_store(st, C=1.0, eps=0.01, seed=3, holdout=holdout,
                               on_epoch=lambda e, info: passes.append(e))
    np.testing.assert_array_equal(fast.alpha, slow.alpha)
    np.testing.assert_array_equal(fast.w, slow.w)
    assert fast.stats == slow.stats and fast.stats.converged
    assert passes == list(range(1, slow.stats.epochs + 1))
    if holdout is not None:
        assert not fast.alpha[holdout[0]:holdout[1]].any()


def test_streamed_state_is_reserved_from_the_budget(tmp_path):
    from ooc_learn.storage.ingest import ingest_arrays
    from ooc_learn.storage.store import open_store

    X, y = DATASETS["gaussian"]()
    ingest_arrays(X, y, tmp_path / "s", n_blocks=3, memory="64M").close()
    with open_store(tmp_path / "s", memory="16K") as st:   # alpha alone needs 12 KB
        with pytest.raises(BudgetExceededError, match="--memory"):
            solve_dcd_store(st)
        assert st.budget.used == 0


def test_store_parameter_checks_come_first(tmp_path):
    with pytest.raises(ParameterError, match="'C' parameter of solve_dcd_store must be > 0"):
        solve_dcd_store(object(), C=0.0)


@pytest.mark.parametrize("data, loss", [("sparse", "hinge"), ("sparse", "sqhinge"),
                                        ("breast_cancer", "hinge")])
def test_block_minimisation_reaches_the_dcd_optimum(data, loss, tmp_path):
    # (the near-separable gaussian set needs ~3000 passes of any dual CD: not a unit test)
    from ooc_learn.solvers.dcd_streamed import solve_bm_streamed
    from ooc_learn.storage.ingest import ingest_arrays

    store = ingest_arrays(*DATASETS[data](), tmp_path / "s", n_blocks=4, memory="64M")

    X, y, _ = store.read_range(0, store.n_samples)
    ref = solve_dcd(X, y, loss=loss, C=1.0, eps=1e-3, max_iter=20000, seed=0)
    seen = []
    res = solve_bm_streamed(store.read_block, store.block_offsets, store.n_features, loss=loss,
                            C=1.0, eps=0.05, max_outer=300, inner_max_iter=20, seed=4,
                            sqnorms=store.sqnorms, budget=store.budget,
                            on_outer=lambda t, info: seen.append(info["objective"]))
    assert res.stats.converged
    assert res.stats.objective == pytest.approx(ref.stats.objective, rel=1e-3)
    # each outer iteration reads every block once; the dual objective only goes down
    assert res.stats.rows_read == res.stats.epochs * store.n_samples
    assert np.all(np.diff(seen) <= 1e-9 * np.abs(seen[:-1]))
    store.close()


@pytest.mark.parametrize("solver", ["dcd", "bm"])
def test_a_trained_models_objective_is_its_primal_beside_the_dual(store, solver):
    # the dual value alone, reported as the objective, made a stopped solve look better
    # than the optimum; the model of all rows reports its primal (one more pass) and the dual
    from ooc_learn.solvers.dcd import primal_objective
    from ooc_learn.training import train

    model = train(store, solver=solver, C=1.0, max_outer=2)  # stopped early: a gap
    st = model.meta["stats"]
    X, y, _ = store.read_range(0, store.n_samples)
    w = np.append(model.coef_, model.intercept_)
    assert st["objective"] == pytest.approx(primal_objective(X, y, w, "hinge", 1.0),
                                            rel=1e-9)
    assert st["dual_objective"] < st["objective"]


def test_a_pegasos_models_objective_is_its_primal_too(store):
    # --json said "objective": null for PEGASOS alone
    from ooc_learn.solvers.dcd import primal_objective
    from ooc_learn.training import train

    model = train(store, solver="pegasos", C=1.0, epochs=2)
    X, y, _ = store.read_range(0, store.n_samples)
    w = np.append(model.coef_, model.intercept_)
    assert model.meta["stats"]["objective"] == pytest.approx(
        primal_objective(X, y, w, "hinge", 1.0), rel=1e-9)
