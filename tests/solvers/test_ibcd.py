"""IBCD (Algorithm 1) and ooc-train end to end on indexed stores."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import predict_main, train_main
from ooc_learn.model import load_model
from ooc_learn.solvers.dcd import solve_dcd
from ooc_learn.solvers.ibcd import solve_ibcd
from ooc_learn.solvers.tron import solve_tron
from ooc_learn.storage.errors import ParameterError
from ooc_learn.training import train

TRAIN = [sys.executable, "-c",
         "import sys; from ooc_learn.cli import train_main; sys.exit(train_main())"]


def problem(rng, n=3000, d=20, sparse=False, flip=0.05):
    if sparse:
        X = sp.random(n, d * 5, density=0.1, random_state=rng.integers(1 << 30), format="csr",
                      dtype=np.float32)
        w = rng.normal(size=d * 5)
    else:
        X = rng.normal(size=(n, d)).astype(np.float32)
        w = rng.normal(size=d)
    y = np.where(X @ w + 0.2 > 0, 1.0, -1.0)
    y[rng.random(n) < flip] *= -1
    return X, y


def full_kkt_violation(store, w, sv_rows, sv_alpha, C, bias=1.0):
    """Largest projected-gradient violation of problem (7) over EVERY row of the store."""
    alpha = np.zeros(store.n_samples)
    alpha[sv_rows] = sv_alpha
    worst = 0.0
    d = store.n_features
    for b in range(store.n_blocks):
        lo, hi = store.block_offsets[b], store.block_offsets[b + 1]
        X, y, _ = store.read_range(lo, hi)
        g = y * (np.asarray(X @ w[:d]).ravel() + bias * w[d]) - 1.0  # hinge: D_ii = 0
        a = alpha[lo:hi]
        pg = np.where(a <= 0, np.minimum(g, 0), np.where(a >= C, np.maximum(g, 0), g))
        worst = max(worst, float(np.abs(pg).max()))
    return worst


def assert_hinge_optimum(store, w, C, eps):
    """The hinge SVM's objective at ``w`` equals in-memory dual CD's to 1e-3 relative."""
    Xa, ya, _ = store.read_range(0, store.n_samples)
    ref = solve_dcd(Xa, ya.astype(float), C=C, eps=eps, max_iter=5000)
    d = Xa.shape[1]

    def primal(v):
        m = ya * (np.asarray(Xa @ v[:d]).ravel() + v[d])
        return 0.5 * v @ v + C * np.maximum(0, 1 - m).sum()

    assert primal(w) == pytest.approx(primal(ref.w), rel=1e-3)


@pytest.mark.parametrize("query_share", [None, 0.0, 2.0, "scan", "no-pool"],
                         ids=["default-share", "cut", "exhaustive", "scan", "no-pool"])
@pytest.mark.parametrize("leaf_size", [None, 50], ids=["default-leaf", "leaf50"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_ibcd_is_optimal_on_all_rows(tmp_path, rng, sparse, leaf_size, query_share):
    # C = 0.1: dual CD on S converges within its 1000 passes (at C = 1 with 5 % flipped
    # labels it may not, and then IBCD warns, as LIBLINEAR does, that its answer is
    # approximate); a converged IBCD must be eps-optimal on every row of the store
    # query_share 0: every query stops at 2n rows examined (the cut path to the scan check);
    # 2 (and no precision floor): queries run until exhausted (the index alone proves no
    # qualifying row is left; 2, as an upper node's pivot rows count as read again when a
    # span below it is read whole); both without the query-or-scan cost model, which would take
    # the scan first. "scan": every query costs more than a scan (VISIT_COST), so after the
    # first query the scans find the rows. "no-pool": every check scans the store (the pool
    # of rows near the margin is off)
    tuning = {}
    if query_share == "no-pool":
        tuning = {"pool_share": 1 << 62}
    elif query_share == "scan":
        tuning = {"visit_cost": 1e12}
    elif query_share is not None:
        tuning = {"query_share": query_share, "cost_model": False}
    if query_share == 2.0:
        tuning["min_precision"] = 0.0
    X, y = problem(rng, sparse=sparse)
    C, eps = 0.1, 0.01
    extra = {} if leaf_size is None else {"leaf_size": leaf_size}
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True, **extra,
                       layout="csr" if sparse else "dense") as store:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = solve_ibcd(store, C=C, n=200, eps=eps, init_sample=500, seed=1, **tuning)
        # the KKT conditions hold on every row, so a row the index missed would show here
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C)
        assert viol < 2 * eps, viol
        # and the objective equals in-memory dual CD's to 1e-3 relative
        assert_hinge_optimum(store, res.w, C, eps)
        assert res.stats["rows_read"] > 0 and res.stats["outer_iterations"] == 1
        if query_share is None:  # S doubled at least once: the re-solve and prune ran
            assert res.stats["S_resolves"] >= 1 and res.stats["pruned"] > 0
        if query_share == "no-pool":
            assert res.stats["pool_hits"] == 0
        if query_share == 0.0:
            assert res.stats["queries_cut"] > 0
        if query_share == 2.0:
            assert res.stats["queries_cut"] == 0
        if query_share == "scan":
            assert res.stats["queries"] == 1 and res.stats["queries_slow"] == 1
            assert res.stats["full_checks"] >= 2


def test_ibcd_warns_when_dual_cd_on_S_stops_at_max_iter(tmp_path):
    # C = 1 with 5 % flipped labels: 1000 dual CD passes do not reach eps = 1e-4 on S
    X, y = problem(np.random.default_rng(1), n=3000)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        with pytest.warns(RuntimeWarning, match="approximate"):
            res = solve_ibcd(store, C=1.0, n=200, eps=1e-4, init_sample=500, seed=1)
        assert res.stats["S_converged"] is False


def test_newton_on_S_converges_where_dual_cd_alone_stops_at_its_pass_limit(tmp_path):
    # C = 1, eps = 0.01, 5 % flipped labels: 1000 dual CD passes leave S short of eps (IBCD
    # warns); Newton's method on the smoothed hinge first (the default) reaches it, and the
    # certified solution is eps-optimal on every row of the store, at a lower objective
    # (the checks admit the most violating: on the path of their default uniform sample,
    # dual CD alone reaches eps here)
    X, y = problem(np.random.default_rng(1), n=3000)
    C, eps = 1.0, 0.01
    kw = dict(C=C, n=200, eps=eps, init_sample=500, seed=1, admit="worst")
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        with pytest.warns(RuntimeWarning, match="approximate"):
            dual_only = solve_ibcd(store, **kw, newton=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = solve_ibcd(store, **kw)
        assert res.stats["S_converged"] and res.stats["newton_solves"] >= 1
        assert not dual_only.stats["S_converged"] and dual_only.stats["newton_solves"] == 0
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C) < eps
        assert res.stats["objective"] <= dual_only.stats["objective"]


def test_a_final_solve_whose_dual_cd_stalls_is_taken_again_by_newton(tmp_path, monkeypatch):
    # the problem above, with S below Newton's rows-per-feature rule: dual CD runs first in
    # the final solve, stalls at its 1000 passes, and Newton's method takes over from there
    # (then in every final solve of the run); the certified solution is eps-optimal on
    # every row of the store, where dual CD alone ends approximate
    from ooc_learn.solvers import hinge_newton

    monkeypatch.setattr(hinge_newton, "MIN_ROWS_PER_FEATURE", 10**6)
    X, y = problem(np.random.default_rng(1), n=3000)
    C, eps = 1.0, 0.01
    kw = dict(C=C, n=200, eps=eps, init_sample=500, seed=1)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = solve_ibcd(store, **kw)
        assert res.stats["S_converged"] and res.stats["newton_after_stall"] == 1
        assert res.stats["newton_solves"] >= 1
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C) < eps


def test_a_final_solve_at_large_C_gets_the_newton_steps_it_needs(tmp_path):
    # positive, correlated features at C = 1000: Newton's method on S needs more than the
    # 100 steps of newton_hinge's default, and a phase cut there leaves dual CD a point it
    # cannot polish (the run would end approximate). Final solves take up to
    # FINAL_NEWTON_STEPS, and the stop certifies every row. On the path taken here (seed 1,
    # the checks admitting the most violating): this problem is at the edge, and other paths
    # still end approximate, whatever FINAL_NEWTON_STEPS (2,000 alike): seeds 1-4, 1 of 4
    # with either order and whole scans, 1 / 3 of 4 with sampled checks (most violating /
    # uniform sample; bench-log 2026-11-29, session 48)
    from ooc_learn.solvers.ibcd import solve as ibcd_solve

    assert ibcd_solve.FINAL_NEWTON_STEPS > 100
    X, y = problem(np.random.default_rng(2), n=4000, d=200, flip=0.0)
    X = np.abs(X)
    C = 1000.0
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            res = solve_ibcd(store, C=C, n=100, init_sample=500, seed=1, admit="worst")
        assert res.stats["S_converged"] and res.stats["newton_solves"] >= 1
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C)
        assert viol < 0.1, viol


def test_solves_of_S_on_the_way_by_newton_steps_reach_the_same_certified_solution(
        tmp_path, monkeypatch):
    # quick_newton_steps (the default): a solve of S on the way takes a few Newton steps on
    # a wider smoothing and a few dual CD passes instead of quick_iters passes (here on any
    # S, not only where a pass over S reads QUICK_MIN_BYTES); the exact stop still certifies
    # every row of the store, at the objective dual CD's way reaches
    from ooc_learn.solvers.ibcd import solve as ibcd_solve

    monkeypatch.setattr(ibcd_solve, "QUICK_MIN_BYTES", 0)
    X, y = problem(np.random.default_rng(1), n=3000)
    C, eps = 1.0, 0.01
    kw = dict(C=C, n=200, eps=eps, init_sample=500, seed=1)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        quick = solve_ibcd(store, **kw)
        passes = solve_ibcd(store, **kw, quick_newton_steps=0)
        for res in (quick, passes):
            assert res.stats["converged"] and res.stats["S_converged"]
            assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C) < eps
    assert quick.stats["newton_solves"] > passes.stats["newton_solves"] >= 1
    assert quick.stats["objective"] == pytest.approx(passes.stats["objective"], rel=1e-3)


def test_cli_warning_is_one_line_of_the_command_and_in_json(tmp_path, capsys):
    # the same approximate solve from ooc-train: "ooc-train: warning: ...", not Python's
    # file:line and source echo; --json lists it
    X, y = problem(np.random.default_rng(1), n=3000)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True).close()
    argv = [str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--eps", "1e-4", "--quiet",
            "--seed", "1"]
    assert train_main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("ooc-train: warning: IBCD's dual CD") and "approximate" in err
    assert "RuntimeWarning" not in err and ".py:" not in err
    assert train_main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["warnings"]) == 1 and "approximate" in out["warnings"][0]


def test_ibcd_primal_tron_blocks_match_dual_cd_on_sqhinge(tmp_path, rng):
    X, y = problem(rng, n=2000, d=10)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=2, build_index=True) as store:
        primal = solve_ibcd(store, loss="sqhinge", C=0.5, n=200, init_sample=300,
                            block_solver="primal", eps=0.01)
        dual = solve_ibcd(store, loss="sqhinge", C=0.5, n=200, init_sample=300, eps=0.01)
        Xa, ya, _ = store.read_range(0, store.n_samples)

        def primal_obj(w):
            m = ya * (Xa @ w[:-1] + w[-1])
            return 0.5 * w @ w + 0.5 * (np.maximum(0, 1 - m) ** 2).sum()

        assert primal_obj(primal.w) == pytest.approx(primal_obj(dual.w), rel=1e-3)


def test_ibcd_primal_stops_by_liblinears_class_weighted_rule(tmp_path):
    # LIBLINEAR's -s 2 rule |grad f| <= 0.01 min(pos, neg) / l |grad f(0)|: with a tenth of
    # the rows positive, TRON on S stops ten times tighter than at 0.01 |grad f(0)|. The
    # objective is within 2e-5 of TRON's to 1e-8 on all rows (measured 1.5e-6; without the
    # class factor 2.8e-4)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 20)).astype(np.float32) + 0.5
    z = X @ rng.normal(size=20)
    y = np.where(z > np.quantile(z, 0.9), 1.0, -1.0)
    y[rng.random(4000) < 0.02] *= -1
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        res = solve_ibcd(store, loss="sqhinge", C=1.0, n=200, init_sample=500, seed=1,
                         block_solver="primal")
        Xa, ya, _ = store.read_range(0, store.n_samples)
    ref = solve_tron(Xa, ya.astype(float), C=1.0, eps=1e-8)

    def primal(w):
        m = ya * (Xa @ w[:-1] + w[-1])
        return 0.5 * w @ w + (np.maximum(0, 1 - m) ** 2).sum()

    assert primal(res.w) == pytest.approx(primal(ref.w), rel=2e-5)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_ibcd_sqhinge_dual_switches_to_tron_where_dual_cd_stalls(tmp_path, rng, sparse,
                                                                  capfd):
    # LIBLINEAR's -s 1 policy on S: a full solve of S whose dual CD has not converged in
    # dual_switch_iters passes finishes by TRON, and S is solved by TRON from then on (the
    # switch happens once). C = 4 with 5 % flipped labels: 3 passes do not converge. The
    # answer is LIBLINEAR -s 2's (the primal on all rows, TRON to |grad| <= 0.01 |grad_0|):
    # objectives within 1e-3 relative, predictions on >= 99.5 % of rows
    liblinear = pytest.importorskip("liblinear.liblinearutil")
    X, y = problem(rng, n=3000, sparse=sparse)
    C = 4.0
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True,
                       layout="csr" if sparse else "dense") as store:
        res = solve_ibcd(store, loss="sqhinge", C=C, n=200, eps=0.01, init_sample=300, seed=1,
                         dual_switch_iters=3)
        Xa, ya, _ = store.read_range(0, store.n_samples)
    assert res.stats["switched_to_primal"] == 1 and res.stats["S_converged"]
    ya = ya.astype(float)
    m = liblinear.train(ya, Xa if sparse else Xa.astype(np.float64), f"-s 2 -c {C} -B 1 -q")
    w_lib, b_lib = m.get_decfun()
    w_lib = np.r_[np.asarray(w_lib), b_lib] * (1.0 if m.get_labels()[0] == 1 else -1.0)
    d = Xa.shape[1]

    def margins(w):
        return ya * (np.asarray(Xa @ w[:d]).ravel() + w[d])

    def primal(w):
        return 0.5 * w @ w + C * (np.maximum(0, 1 - margins(w)) ** 2).sum()

    assert primal(res.w) == pytest.approx(primal(w_lib), rel=1e-3)
    assert np.mean(np.sign(margins(res.w)) == np.sign(margins(w_lib))) >= 0.995


def test_ibcd_reads_a_fraction_of_a_separable_store(tmp_path, rng):
    X, y = problem(rng, n=6000, d=10, flip=0.0)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True) as store:
        res = solve_ibcd(store, C=1.0, n=100, init_sample=300, seed=0)
        # few support vectors: IBCD computes far fewer margins than dual CD over all rows
        # (which visits every row every epoch) and reads each row at most twice (the index's
        # leaf reads and the active set's gathers go through separate caches)
        Xa, ya, _ = store.read_range(0, store.n_samples)
        ref = solve_dcd(Xa, ya.astype(float), C=1.0, eps=0.1)
        assert res.stats["n_sv"] < 0.1 * store.n_samples
        # 0.54 on this store (0.43 under the dealing before ingest dealt rows as it parsed);
        # over ingest seeds 0-7 the ratio spreads over 0.29-0.76 under either dealing
        assert res.stats["rows_examined"] < 0.6 * ref.stats.visits, (
            res.stats["rows_examined"], ref.stats.visits)
        assert res.stats["rows_read"] <= 2 * store.n_samples


def test_queries_read_leaves_not_whole_blocks_the_cap_would_hold(tmp_path, rng):
    # uncapped, the store's policy would load any block whole; a query wants a few leaves of
    # it, so IBCD's reader reads the leaves: loading whole blocks made an uncapped run read
    # the store once whatever it needed (generated benchmark store, s = 1, sampled rule:
    # 0.31-0.49 of it per outer iteration, against 0.10-0.14)
    from ooc_learn.solvers.ibcd.rows import RowSource
    from ooc_learn.storage.store import open_store

    X, y = problem(rng, n=6000, d=10)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True).close()
    with open_store(tmp_path / "s") as st:
        Xa, ya, _ = st.read_range(0, st.n_samples)
        assert st.block_offsets[2] < 2100 < 2150 <= st.block_offsets[3] <= 3000
        assert st.reads_whole_block(2) and not st.block_is_cached(2)
        src = RowSource(st)
        r0 = st.rows_read
        XL, yL, _ = src.read_range(2100, 2150)
        assert st.rows_read - r0 == 50 and not st.block_is_cached(2)
        np.testing.assert_array_equal(XL, Xa[2100:2150])
        # a cached block serves them without reading
        st.read_block(3)
        r0 = st.rows_read
        XL, yL, _ = src.read_range(3000, 3100)
        XP, yP = src.read_rows(np.array([3001, 3050]))
        assert st.rows_read == r0
        np.testing.assert_array_equal(XL, Xa[3000:3100])
        np.testing.assert_array_equal(XP, Xa[[3001, 3050]])
        np.testing.assert_array_equal(yP, ya[[3001, 3050]])


@pytest.mark.parametrize("sparse", [False, True])
def test_the_rows_a_query_returns_join_S_without_a_read(tmp_path, rng, monkeypatch, sparse):
    # the query hands its rows' values over as it verified them: none is read again, not
    # even a row of a leaf the forest had cached before (the fetch that took the rows from
    # the store again)
    from ooc_learn.solvers.ibcd.inner import InnerLoop
    from ooc_learn.storage.store import open_store

    # 20000 rows: the forest has leaves in its row cache that the blocks cached did not
    # cover (the fetch read 47 rows again here, 133 on CSR)
    X, y = problem(rng, n=20000, d=30, sparse=sparse, flip=0.1)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True).close()
    taken, reads = [], []
    take_rows = InnerLoop.take_rows

    def counting(self, found):
        r0 = self.st.store.rows_read
        m_old = take_rows(self, found)
        taken.append(len(found.rows))
        reads.append(self.st.store.rows_read - r0)
        return m_old

    monkeypatch.setattr(InnerLoop, "take_rows", counting)
    with open_store(tmp_path / "s") as store:
        res = solve_ibcd(store, C=1.0, n=300, init_sample=1000)
        assert sum(taken) > 150 and reads == [0] * len(reads)
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=1.0) < 0.2


def test_ibcd_under_a_cap_does_not_depend_on_what_the_caches_hold(tmp_path, rng):
    # the cap sizes w_0's sample (here below init_sample); the same seed gives the same w
    # whether the store's block cache is empty or full when training starts (the sample was
    # once sized from the free part of the cap, and warm caches gave another sample)
    from ooc_learn.storage.store import open_store

    X, y = problem(rng, n=3000, d=20, flip=0.1)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True).close()
    ws = []
    for warm in (False, True):
        with open_store(tmp_path / "s", memory="400K") as store:
            if warm:
                for b in range(store.n_blocks):
                    store.read_block(b)
                assert store.budget.used > 150_000
            res = solve_ibcd(store, C=0.1, n=100, eps=0.01, init_sample=2000, seed=3)
            ws.append(res.w)
    np.testing.assert_array_equal(ws[0], ws[1])
    # part of the cap held by a buffer no eviction frees: the sample the cap sizes (775 rows,
    # 205 kB reserved) does not fit, it shrinks to what is left instead of failing (the rest
    # of the run fits), and the answer is still optimal
    with open_store(tmp_path / "s", memory="400K") as store:
        store.budget.reserve(90_000, "a caller's buffer")
        res = solve_ibcd(store, C=0.1, n=100, eps=0.01, init_sample=2000, seed=3)
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=0.1) < 0.02


def truncated_objective(X, y, w, C, s, loss="hinge"):
    """Objective (2) over all rows: L(z) capped at L(-s), L the hinge or its square."""
    d = X.shape[1]
    m = y * (np.asarray(X @ w[:d]).ravel() + w[d])
    p = 2 if loss == "sqhinge" else 1
    return 0.5 * w @ w + C * np.minimum(np.maximum(0, 1 - m) ** p, (1 + s) ** p).sum()


def test_truncation_lowers_objective_2_on_outliers(tmp_path, rng):
    X, y = problem(rng, n=3000, d=10, flip=0.0)
    y[:150] *= -1  # flipped-label outliers
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=3, build_index=True) as store:
        Xa, ya, _ = store.read_range(0, store.n_samples)
        objs = []
        convex = solve_ibcd(store, C=1.0, s=None, n=200, init_sample=500)
        trunc = solve_ibcd(store, C=1.0, s=1.0, n=200, init_sample=500, max_outer=20,
                           on_outer=lambda e: objs.append(e))
        f_convex = truncated_objective(Xa, ya, convex.w, 1.0, 1.0)
        f_trunc = truncated_objective(Xa, ya, trunc.w, 1.0, 1.0)
        assert f_trunc < f_convex
        assert trunc.stats["outer_iterations"] >= 2


def test_train_cli_json_predict_and_model_roundtrip(tmp_path, rng, capsys):
    X, y = problem(rng, n=2000, d=8)
    Xt, yt = X[1500:], y[1500:]
    ingest_arrays(X[:1500], y[:1500], tmp_path / "tr", build_index=True).close()
    ingest_arrays(Xt, yt, tmp_path / "te").close()
    rc = train_main([str(tmp_path / "tr"), "-o", str(tmp_path / "m.npz"), "--test",
                     str(tmp_path / "te"), "--json", "--quiet", "--C", "0.5"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("model", "solver", "seconds", "objective", "n_sv", "outer_iterations",
                "rows_read", "bytes_read", "peak_rss_bytes", "test_accuracy"):
        assert key in out, key
    model = load_model(tmp_path / "m.npz")
    assert model.meta["C"] == 0.5 and model.meta["solver"] == "ibcd"
    acc = np.mean(model.predict(Xt) == yt)
    assert out["test_accuracy"] == pytest.approx(acc)
    assert acc > 0.85
    assert predict_main([str(tmp_path / "m.npz"), str(tmp_path / "te"), "-o",
                         str(tmp_path / "p.csv"), "--json", "--quiet"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["accuracy"] == pytest.approx(acc)
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "row_id,label,decision" and len(lines) == 501


@pytest.mark.parametrize("solver", ["dcd", "bm", "pegasos"])
def test_baseline_solvers_from_train(tmp_path, rng, solver):
    X, y = problem(rng, n=1500, d=8, flip=0.0)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=3) as store:
        model = train(store, solver=solver, C=1.0, epochs=5)
        assert model.score(store) > 0.9


def test_bad_flags_and_mismatch_exit_2(tmp_path, rng):
    X, y = problem(rng, n=300, d=5)
    ingest_arrays(X, y, tmp_path / "s", build_index=True).close()
    ingest_arrays(X[:, :3], y, tmp_path / "narrow").close()
    r = subprocess.run(TRAIN + [str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--C",
                                "-1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--C" in r.stderr and "not > 0" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run(TRAIN + [str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"),
                                "--truncate", "1", "--solver", "dcd"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "IBCD" in r.stderr
    # regression's solver and losses on a classification store: the hint says where they fit
    for flags in (["--solver", "exact"], ["--loss", "epsilon_insensitive"]):
        r = subprocess.run(TRAIN + [str(tmp_path / "s"), "-o", str(tmp_path / "m.npz")] + flags,
                           capture_output=True, text=True)
        assert r.returncode == 2 and "--task regression" in r.stderr
    r = subprocess.run(TRAIN + [str(tmp_path / "nostore"), "-o", str(tmp_path / "m.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "No store" in r.stderr
    assert not (tmp_path / "m.npz").exists()
    ingest_arrays(X, y, tmp_path / "noidx").close()
    r = subprocess.run(TRAIN + [str(tmp_path / "noidx"), "-o", str(tmp_path / "m.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "ooc-index" in r.stderr
    # a model refuses a store with another feature count
    train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--quiet"])
    r = subprocess.run(TRAIN + [str(tmp_path / "s"), "-o", str(tmp_path / "m2.npz"), "--test",
                                str(tmp_path / "narrow"), "--quiet", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "features" in r.stdout
    # refused before any training: no model written, no training figures
    assert not (tmp_path / "m2.npz").exists() and "seconds" not in r.stdout
    # a test set of another task, before any work too
    ingest_arrays(X, np.arange(300) % 3, tmp_path / "three", task="multiclass").close()
    r = subprocess.run(TRAIN + [str(tmp_path / "s"), "-o", str(tmp_path / "m2.npz"), "--test",
                                str(tmp_path / "three"), "--quiet"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "multiclass task" in r.stderr
    assert not (tmp_path / "m2.npz").exists()


def test_ibcd_on_a_regression_store_is_refused(tmp_path, rng):
    X = rng.normal(size=(100, 3)).astype(np.float32)
    with ingest_arrays(X, rng.normal(size=100), tmp_path / "r") as store:
        with pytest.raises(ParameterError, match="regression"):
            train(store, solver="ibcd")
        with pytest.raises(ParameterError, match="classification loss"):
            train(store, loss="hinge")


def test_sampled_stopping_rule_reads_less_and_stays_close(tmp_path, rng):
    # the rule where it is meant to be used: the ramp loss's outer loop, whose convex
    # problems it ends without the certifying scans
    X, y = problem(rng, n=6000, d=10, flip=0.02)
    # on some stores of this problem the rule stops at its first query, 7-15 % above the
    # exact objective (ingest seeds 0-49: 2 stores under the old dealing, 7 under the
    # dealing as ingest parses; seed 0 is one of the 7); seed 3 is a store where it does not
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True, seed=3) as store:
        exact = train(store, C=1.0, s=1.0, block_size=100, init_sample=300)
        # |N| / n_e < 0.05, n_e the instances a query traversed (pivots included)
        fast = train(store, C=1.0, s=1.0, block_size=100, init_sample=300, sample_eps=0.05)
        se, sf = exact.meta["stats"], fast.meta["stats"]
        assert sf.get("stopped_by_sample_rule", 0) >= 1 and sf["full_checks"] < se["full_checks"]
        # seeds 0-2 of this problem: 0.77-0.85
        assert sf["rows_examined"] < 0.9 * se["rows_examined"]
        # approximate, not wrong: objective (2) over ALL rows within 1 % of the exact one's
        Xa, ya, _ = store.read_range(0, store.n_samples)

        def objective(m):
            w = np.r_[m.coef_, m.intercept_]
            return truncated_objective(Xa, ya, w, 1.0, 1.0)

        assert objective(fast) == pytest.approx(objective(exact), rel=0.01)
        with pytest.raises(ParameterError, match="sample_eps"):
            train(store, sample_eps=1.5)


def gap_problem(n=20000, d=20):
    """Rows with a margin gap (|w.x| > |w|) and 1 % flipped labels, like the benchmark's
    generated store: separable but for the flips, few rows matter."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=d)
    Z = rng.normal(size=(5 * n, d)).astype(np.float32)
    keep = np.abs(Z @ w) > np.linalg.norm(w)
    X = Z[keep][:n]
    y = np.where(X @ w > 0, 1.0, -1.0)
    y[rng.random(n) < 0.01] *= -1
    return X, y


GAP_KW = dict(loss="sqhinge", block_solver="primal", C=1.0, s=1.0, n=200, init_sample=1000)


def gap_objective(X, y, w):
    return truncated_objective(X, y, w, GAP_KW["C"], GAP_KW["s"], loss=GAP_KW["loss"])


def test_relaxation_stops_when_the_outlier_set_settles(tmp_path):
    # eq. 5's loop ends when OUT(w_t) == OUT(w_{t-1}): no row of S became an outlier and no
    # outlier at w_{t-1} joined S. Rows that were never outliers may still join (the sampled
    # rule leaves some near the margin each time): here 220 do in the last outer iteration,
    # which a stop on "no row joined S" would have gone on from (to max_outer, as both
    # benchmark stores did at s = 1)
    X, y = gap_problem()
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        res = solve_ibcd(store, sample_eps=0.05, **GAP_KW)
        exact = solve_ibcd(store, **GAP_KW)
    log = res.stats["outer_log"]
    assert res.stats["converged"] and len(log) < 10
    assert all(e["came_back"] <= e["added"] for e in log)
    assert log[-1]["came_back"] == log[-1]["removed"] == 0 < log[-1]["added"]
    assert exact.stats["converged"]
    assert res.stats["stop_reason"].startswith("the outlier set settled")
    assert "sampled rule" in res.stats["stop_reason"]
    assert "sampled rule" not in exact.stats["stop_reason"]
    with ingest_arrays(X, y, tmp_path / "c", n_blocks=4, build_index=True) as store:
        convex = solve_ibcd(store, **dict(GAP_KW, s=None), max_outer=1)
        capped = solve_ibcd(store, **GAP_KW, max_outer=1)
    assert convex.stats["stop_reason"].startswith("certified")
    assert not capped.stats["converged"] and capped.stats["stop_reason"].startswith("max_outer")
    assert (gap_objective(X, y, res.w)
            == pytest.approx(gap_objective(X, y, exact.w), rel=0.01))


def test_sampled_rule_settles_the_outer_loop_within_sample_eps(tmp_path):
    # with the sampled rule, each convex problem is left with fresh violators below
    # sample_eps of the rows a query examined, and a few rows near the cap go on changing
    # side from one outer iteration to the next (the 1 GiB benchmark ran to max_outer 10,
    # 127-338 rows a time against 8-11k support vectors). The loop ends at the first outer
    # iteration where fewer rows changed side than sample_eps of the support vectors; the
    # iterations that follow moved objective (2) by less than 0.1 % on these problems
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8000, 10)).astype(np.float32)
    y = np.where(X @ rng.normal(size=10) + 0.2 > 0, 1.0, -1.0)
    y[rng.random(8000) < 0.2] *= -1
    kw = dict(C=1.0, s=1.0, n=100, init_sample=300)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True) as store:
        res = solve_ibcd(store, sample_eps=0.05, **kw)
        exact = solve_ibcd(store, **kw)
    changed = [e["removed"] + e["came_back"] for e in res.stats["outer_log"]]
    n_sv = [e["n_sv"] for e in res.stats["outer_log"]]
    assert res.stats["converged"] and "rows changing side" in res.stats["stop_reason"]
    # it stopped where the rule first held, with rows still changing side (the exact
    # fixed point would have gone on)
    assert 0 < changed[-1] < 0.05 * n_sv[-1]
    assert all(c >= 0.05 * m for c, m in zip(changed[1:-1], n_sv[1:-1]))
    assert len(changed) < exact.stats["outer_iterations"]
    assert (truncated_objective(X, y, res.w, 1.0, 1.0)
            == pytest.approx(truncated_objective(X, y, exact.w, 1.0, 1.0), rel=0.01))


def test_sampled_stop_is_judged_at_the_w_it_returns(tmp_path):
    # an outer iteration starts by pruning S's inactive rows, and the solve of what is left
    # moves w off the answer the next query was judged at: stopping on that query's
    # |N| / n_e < eps left objective (2) at 12.9x the exact stop's in one seed of these ten
    # (within 0.15 % in the others). The rule is asked again at the solution of S (to
    # quick_iters passes, which these small problems converge within; the solve goes on to
    # max_iters only once the rule held there). Seeds 0-9 now: 10 sampled stops, 15
    # rechecks, all within 0.7 % (the same with the full solve before each recheck)
    X, y = gap_problem()
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        exact = gap_objective(X, y, solve_ibcd(store, **GAP_KW).w)
        stops = rechecks = 0
        for seed in range(10):
            res = solve_ibcd(store, sample_eps=0.05, seed=seed, **GAP_KW)
            stops += res.stats["stopped_by_sample_rule"]
            rechecks += res.stats["sample_rule_rechecks"]
            assert gap_objective(X, y, res.w) == pytest.approx(exact, rel=0.02), seed
    assert stops >= 5 and rechecks >= 5


def test_sampled_rule_counts_the_pivots_a_query_traversed(tmp_path, rng, monkeypatch):
    # the paper's n_e is the number of instances a query traversed: the rows it examined
    # and the pivot rows whose margins ranked partitions; counting only the former, a query
    # that scored many pivots to find a few fresh rows would not stop the loop
    from ooc_learn.index.forest import Forest
    seen = []
    query = Forest.query

    def recording(self, *a, **kw):
        found = query(self, *a, **kw)
        seen.append((len(found.rows), found.n_examined, self.last_query["pivots_scored"]))
        return found

    monkeypatch.setattr(Forest, "query", recording)
    X, y = problem(rng, n=6000, d=40, flip=0.02)
    eps = 0.05
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True,
                       leaf_size=4) as store:
        m = train(store, C=1.0, block_size=100, init_sample=300, sample_eps=eps, s=1.0)
    st = m.meta["stats"]
    # each stop by the rule came after a query with |N| / (examined + pivots) < eps ...
    stops = [(k, n_e, piv) for k, n_e, piv in seen if k / max(1, n_e + piv) < eps]
    assert 1 <= st.get("stopped_by_sample_rule", 0) <= len(stops)
    # ... and some where the rows examined alone would have gone on
    assert any(n_e and k / n_e >= eps for k, n_e, piv in stops)


@pytest.mark.parametrize("cost_model", [False, True, "skip-full"],
                         ids=["index", "cost-model", "skip-full"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_ibcd_where_violators_are_dense(tmp_path, rng, sparse, cost_model):
    # 30 % flipped labels and the squared hinge: nearly every row is a support vector. With
    # the index alone, it finds violators densely and the queries double in size
    # (dense_query); with the cost model, a scan finds them cheaper and takes over.
    # "skip-full": quick solves of one pass leave a spread above most violations, so checks
    # that still find |S| / 2 violators admit them without the full solve (once a full solve
    # has converged). Every way the answer is the full problem's optimum (in-memory dual CD
    # to 1e-6 relative)
    tuning = {"cost_model": bool(cost_model)}
    if cost_model == "skip-full":  # (the most violating admitted: the csr case's uniform
        tuning["quick_iters"] = 1  # sample converges before a check finds |S| / 2)
        tuning["admit"] = "worst"
    X, y = problem(rng, sparse=sparse, flip=0.3)
    C = 0.1
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True,
                       layout="csr" if sparse else "dense") as store:
        res = solve_ibcd(store, C=C, n=50, eps=0.01, init_sample=100, seed=1, loss="sqhinge",
                         **tuning)
        if cost_model == "skip-full":
            assert res.stats["full_solves_skipped"] >= 1
        elif cost_model:
            assert res.stats["queries_slow"] + res.stats["scans_preferred"] >= 1
            assert res.stats["queries"] <= 3
        else:
            assert res.stats["queries_grown"] >= 1
        Xa, ya, _ = store.read_range(0, store.n_samples)
        ya = ya.astype(float)
        ref = solve_dcd(Xa, ya, C=C, eps=0.01, loss="sqhinge", max_iter=5000)
        d = Xa.shape[1]

        def primal(w):
            m = ya * (np.asarray(Xa @ w[:d]).ravel() + w[d])
            return 0.5 * w @ w + C * (np.maximum(0, 1 - m) ** 2).sum()

        assert primal(res.w) == pytest.approx(primal(ref.w), rel=1e-6)


def test_sampled_rule_keeps_asking_the_index_where_a_scan_would_read_the_store(tmp_path):
    # with the sampled rule, a query cut at its read limit that found fewer than n/2 rows
    # hands over to the scan check only where the scan reads no more of the store than a
    # query may (the blocks are cached): under a cap it would read every row, and the index
    # keeps being asked until the rule stops (Fashion-MNIST L1 at the 1/10 cap: 6-8x the
    # store read in 2 seeds of 3 before). The price is the rule's own approximation, which
    # the scans hid: objective (2) here 5-8 % above the exact stop's under the cap, against
    # 0.01 % with the store cached
    from ooc_learn.storage.store import open_store

    X, y = problem(np.random.default_rng(0), n=6000, d=20, flip=0.1)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=6, build_index=True).close()
    # (the checks admit the most violating: uncapped, their uniform sample ends each inner
    # loop by a scan before the rule stops one)
    kw = dict(C=0.1, n=100, eps=0.01, init_sample=1000, seed=0, s=1.0, admit="worst")
    objectives = {}
    for memory in ("600K", None):
        with open_store(tmp_path / "s", memory=memory) as store:
            res = solve_ibcd(store, sample_eps=0.05, **kw)
            st = res.stats
            assert st["queries_cut"] >= 3 and st["stopped_by_sample_rule"] >= 1
            if memory:
                assert st["full_checks"] == 0 and st["rows_read"] < 4 * store.n_samples
            else:
                assert st["full_checks"] >= 3
            Xa, ya, _ = store.read_range(0, store.n_samples)
            objectives[memory] = truncated_objective(Xa, ya, res.w, 0.1, 1.0)
            if memory is None:
                exact = solve_ibcd(store, **kw)
                objectives["exact"] = truncated_objective(Xa, ya, exact.w, 0.1, 1.0)
    assert objectives[None] == pytest.approx(objectives["exact"], rel=1e-3)
    assert objectives["exact"] < objectives["600K"] < 1.1 * objectives["exact"]


def test_fresh_rows_the_cap_cannot_hold_join_in_part(tmp_path, rng, monkeypatch):
    # a query's rows need 2 copies in memory until S holds them; where the cap cannot hold
    # them all, as many as it can (halving, down to 64 rows) join and a later query or check
    # finds the others: the answer is still optimal (a 1.02M-row run at --memory 224M once
    # stopped with exit 2 after 110 s for 11 kB)
    from ooc_learn.storage.store import open_store

    X, y = problem(rng, n=3000, d=20, flip=0.1)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True).close()
    with open_store(tmp_path / "s", memory="64M") as store:
        budget, cut_at = store.budget, 2 * 100 * 4 * 20
        take = budget.try_reserve

        def squeezed(nbytes, *, evict=True, fit_rss=False):  # the fetch's reservation only
            caller = sys._getframe(1)
            if (caller.f_code.co_name == "reserve_shrinking" and nbytes > cut_at
                    and caller.f_locals.get("what") == "IBCD fresh rows"):
                return False
            return take(nbytes, evict=evict, fit_rss=fit_rss)

        monkeypatch.setattr(budget, "try_reserve", squeezed)
        res = solve_ibcd(store, C=0.1, n=400, eps=0.01, init_sample=500, seed=3)
        assert res.stats["fetches_cut"] > 0
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=0.1) < 0.02


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_a_truncated_start_solves_its_whole_sample_in_pieces_under_a_cap(tmp_path, rng,
                                                                         sparse):
    # w_0 of the truncated loss picks the local optimum, so its sample is init_sample rows
    # whatever the cap: under a cap that holds a fraction of them, solved by chunking, it is
    # the in-memory solution of the same sample (dual CD to 1e-3 both ways). The convex loss
    # keeps the sample the cap holds, and so does the sampled rule's run where the sample's
    # passes would read more than a tenth of the store
    from ooc_learn.solvers.dcd import solve_dcd
    from ooc_learn.solvers.ibcd.config import IBCDConfig
    from ooc_learn.solvers.ibcd.start import PIECE_PASSES, sample_row_bytes, sample_start
    from ooc_learn.storage.store import open_store

    # separable: the sample's support vectors (about 100 dense, 300 CSR) fit the cap (m0
    # rows) beside a piece
    m0_cap, n_sample = (700 if sparse else 300), 1000
    n = 10 * PIECE_PASSES * n_sample
    X, y = problem(rng, n=n, d=20, sparse=sparse, flip=0.0)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4,
                  layout="csr" if sparse else "dense").close()
    held = (0, 0, None)
    with open_store(tmp_path / "s") as st:
        Xa, ya, _ = st.read_range(0, st.n_samples)
        cap = 4 * m0_cap * sample_row_bytes(st)
    Xa = np.asarray(Xa.toarray() if sparse else Xa, float)
    for truncated, init_sample, sample_eps in [
            (True, n_sample, 0.05), (True, n_sample + 1, 0.0),   # pieces
            (False, n_sample, 0.0), (True, n_sample + 1, 0.05)]:  # the sample the cap holds
        cfg = IBCDConfig(C=1.0, eps=1e-3, init_sample=init_sample, init_iters=5000,
                         s=1.0 if truncated else None, sample_eps=sample_eps)
        with open_store(tmp_path / "s", memory=cap) as st:
            m0, (w, rows, Xs, ys, alpha) = sample_start(st, cfg, np.random.default_rng(5),
                                                         held)
            r0 = st.rows_read
        assert m0 == m0_cap
        assert np.all(np.diff(rows) > 0) and np.all(alpha > 0)
        # the sample as drawn (sample_start's draw)
        pieces = truncated and (init_sample == n_sample or sample_eps == 0)
        # (n_sample + 1 rows read 5 times are more than a tenth of the n rows)
        sample = np.sort(np.random.default_rng(5).choice(
            n, init_sample if pieces else m0, replace=False))
        assert np.isin(rows, sample).all()
        ref = solve_dcd(Xa[sample], ya[sample].astype(float), C=1.0, eps=1e-3, max_iter=5000,
                        warn=False)
        Xb = np.hstack([Xa[sample], np.ones((sample.size, 1))])
        yb = ya[sample].astype(float)

        def primal(v):
            return 0.5 * v @ v + np.maximum(0.0, 1.0 - yb * (Xb @ v)).sum()

        assert primal(w) == pytest.approx(primal(ref.w), rel=1e-3)
        # w is the support vectors' own sum
        Xr = np.hstack([np.asarray(Xs.toarray() if sparse else Xs, float),
                        np.ones((rows.size, 1))])
        np.testing.assert_allclose(w, Xr.T @ (alpha * ys), rtol=1e-6, atol=1e-8)
        if pieces:
            assert r0 >= init_sample  # every row of the sample was read


@pytest.mark.parametrize("admit", ["random", "worst"])
def test_either_admission_of_a_checks_violators_reaches_the_optimum(tmp_path, rng, monkeypatch,
                                                                     admit):
    # checks that find more violators than they may admit (30 % flipped labels, a quarter
    # of |S| a check): a uniform sample of them joins S, or the most violating; either way
    # the certified answer is the full problem's optimum
    from ooc_learn.solvers.ibcd import check as ibcd_check

    seen = []
    scan = ibcd_check.scan_rows

    def spy(*a, **k):
        got = scan(*a, **k)
        seen.append((len(got[0].rows), got[0].n_viol, k.get("rng") is not None))
        return got

    monkeypatch.setattr(ibcd_check, "scan_rows", spy)
    X, y = problem(rng, flip=0.3)
    C, eps = 0.1, 0.01
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        res = solve_ibcd(store, C=C, n=50, eps=eps, init_sample=100, seed=1, admit=admit,
                         check_growth=0.25, cost_model=True, visit_cost=1e12)
        assert any(0 < k < v for k, v, _ in seen)  # some check admitted a part
        assert all(r == (admit == "random") for _, _, r in seen)
        assert full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C) < 2 * eps
        assert_hinge_optimum(store, res.w, C, eps)
