"""The IBCD active set: resident and spilled to disk (§4.2) hold the same rows."""

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.api import ingest_arrays
from ooc_learn.solvers.ibcd.active_set import ActiveSet
from ooc_learn.solvers.ibcd import solve_ibcd
from ooc_learn.solvers.ibcd.config import IBCDConfig
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import BudgetExceededError

from test_ibcd import full_kkt_violation, problem


def _rows(rng, k, d, sparse):
    if sparse:
        return sp.random(k, d, density=0.2, random_state=rng.integers(1 << 30), format="csr",
                         dtype=np.float32)
    return rng.normal(size=(k, d)).astype(np.float32)


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_spilled_set_reads_back_exactly_what_was_added(tmp_path, rng, sparse):
    d = 30
    S = ActiveSet(d, sparse, MemoryBudget("64M"), spill_dir=tmp_path)
    parts = [_rows(rng, k, d, sparse) for k in (700, 50, 400)]
    ref = np.vstack([_dense(p) for p in parts])
    S.add(np.arange(700), parts[0], np.ones(700), np.zeros(700), np.full(700, 0.5))
    S.spill()
    assert S.spilled and list(tmp_path.iterdir())
    S.add(np.arange(700, 750), parts[1], -np.ones(50), np.zeros(50))
    S.add(np.arange(750, 1150), parts[2], np.ones(400), np.zeros(400))
    assert S.m == 1150
    np.testing.assert_array_equal(_dense(S.read(0, S.m)), ref)
    pos = rng.permutation(S.m)[:300]
    np.testing.assert_array_equal(_dense(S.take(pos)), ref[pos])
    got = np.vstack([_dense(X) for _, _, X in S.windows()])
    np.testing.assert_array_equal(got, ref)
    assert S.state()[2][:700].tolist() == [0.5] * 700
    # keep: rows compacted in order, state moves with them
    mask = rng.random(S.m) < 0.4
    S.keep(mask)
    np.testing.assert_array_equal(_dense(S.read(0, S.m)), ref[mask])
    np.testing.assert_array_equal(S.rows[: S.m], np.flatnonzero(mask))
    S.release()
    assert not list(tmp_path.iterdir()), "the spill folder must be removed"


@pytest.mark.parametrize("width", [256, 65536])
def test_a_coded_stores_rows_spill_as_codes_and_read_back_the_same(tmp_path, rng, width,
                                                                   monkeypatch):
    """Rows of a store with value codes spill as those codes (a quarter or half of the
    bytes), a piece at a time, and come back as the same float32 rows through every read."""
    from ooc_learn.storage.value_codes import RowCodes

    monkeypatch.setattr(RowCodes, "PIECE", 4096)  # several pieces a read
    d = 37
    values = rng.permutation(width // 2).astype(np.float32) / 7  # the store's values
    table = np.zeros(width, np.float32)
    table[:values.size] = values
    ref = values[rng.integers(0, values.size, (1500, d))]
    budget = MemoryBudget("64M")
    S = ActiveSet(d, False, budget, spill_dir=tmp_path, value_table=table)
    S.add(np.arange(900), ref[:900], np.ones(900), np.zeros(900))
    S.spill()
    S.add(np.arange(900, 1500), ref[900:], np.ones(600), np.zeros(600))
    (folder,) = tmp_path.iterdir()
    item = 1 if width == 256 else 2
    assert (folder / "X.bin").stat().st_size == 1500 * d * item
    np.testing.assert_array_equal(S.read(0, S.m), ref)
    np.testing.assert_array_equal(S.read(450, 1210), ref[450:1210])
    pos = rng.permutation(S.m)[:300]
    np.testing.assert_array_equal(S.take(pos), ref[pos])
    mask = rng.random(S.m) < 0.5
    S.keep(mask)
    np.testing.assert_array_equal(S.read(0, S.m), ref[mask])
    S.release()
    assert budget.used == 0 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_resident_keep_compacts_in_place_without_a_copy(rng, sparse):
    d = 25
    budget = MemoryBudget("64M")
    S = ActiveSet(d, sparse, budget)
    X = _rows(rng, 900, d, sparse)
    ref = _dense(X)
    S.add(np.arange(900) * 3, X, np.where(rng.random(900) < 0.5, 1.0, -1.0),
          (ref.astype(np.float64) ** 2).sum(1), rng.random(900))
    y0, a0 = S.y[:900].copy(), S.alpha[:900].copy()
    buf = S.data if sparse else S.Xbuf
    used = budget.used
    for _ in range(3):  # repeated compactions, the first row dropped or kept
        mask = rng.random(S.m) < 0.6
        before_rows = S.rows[: S.m].copy()
        S.keep(mask)
        keep = np.flatnonzero(mask)
        np.testing.assert_array_equal(S.rows[: S.m], before_rows[keep])
        idx = S.rows[: S.m] // 3
        np.testing.assert_array_equal(_dense(S.X), ref[idx])
        np.testing.assert_array_equal(S.y[: S.m], y0[idx])
        np.testing.assert_array_equal(S.alpha[: S.m], a0[idx])
    # the same buffers, nothing more reserved
    assert (S.data if sparse else S.Xbuf) is buf and budget.used == used
    S.keep(np.zeros(S.m, bool))
    assert S.m == 0 and S.nnz == 0


def test_keep_brings_a_small_spilled_set_back_into_memory(tmp_path, rng):
    S = ActiveSet(10, False, MemoryBudget("16M"), spill_dir=tmp_path)
    X = _rows(rng, 2000, 10, False)
    S.add(np.arange(2000), X, np.ones(2000), np.zeros(2000))
    S.spill()
    S.keep(np.arange(2000) < 100)
    assert not S.spilled
    np.testing.assert_array_equal(S.X, X[:100])
    S.release()


def test_fits_respects_the_resident_share(rng):
    budget = MemoryBudget("1M")
    S = ActiveSet(100, False, budget, resident_share=0.5)
    # 1,500 dense rows of 100 floats (~650 KB with state) exceed half of the 1 MB cap
    assert S.fits(1000)
    assert not S.fits(1500)
    S.release()


def test_a_small_set_under_a_small_cap_takes_a_small_share(rng):
    # S's first capacity: 1024 rows, or what 1/8 of the cap holds where that is fewer (1024
    # rows of 600 features once took 2.5 MB of a 3 MB cap for 338 rows, and the check that
    # followed could not have its 64 rows)
    budget = MemoryBudget("3M")
    S = ActiveSet(600, False, budget)
    S.add(np.arange(50), _rows(rng, 50, 600, False), np.ones(50), np.zeros(50))
    assert S._cap_rows >= 50 and budget.used <= budget.limit // 8
    # growing keeps S's rows and reserves as it goes
    S.add(np.arange(50, 400), _rows(rng, 350, 600, False), np.ones(350), np.zeros(350))
    assert S.m == 400 and budget.used == S._reserved < budget.limit // 2
    S.release()
    assert budget.used == 0


def test_adding_what_fits_never_reallocates(rng):
    # beyond its resident share (the cap's working share shrank since S grew), _caps_for
    # gives the need + 1/16: a capacity that already holds the rows must not be traded for
    # that smaller one (an add that fits() said would fit reserved a copy of S and failed a
    # 1 MB cap mid-run)
    budget = MemoryBudget("1M")
    S = ActiveSet(100, False, budget, resident_share=0.5)
    k = 1
    while S.fits(k + 100):
        k += 100
    S.add(np.arange(k), _rows(rng, k, 100, False), np.ones(k), np.zeros(k))
    S.keep(np.arange(k) % 2 == 0)  # rows left S (a prune): the capacity stays
    budget.limit = budget.limit * 3 // 4  # as a process budget's RSS lesson shrinks it
    cap, reserved = S._cap_rows, S._reserved
    assert S.fits(10)
    S.add(np.arange(10) + k, _rows(rng, 10, 100, False), np.ones(10), np.zeros(10))
    assert S._cap_rows == cap and S._reserved == reserved == budget.used
    S.release()


def test_growth_copies_one_array_at_a_time(tmp_path, rng):
    # a spilled S's state (40 bytes a row) grows by half: with every old and new array held at
    # once a growth needs old + new bytes, one array at a time new + the largest old array
    probe = ActiveSet(10, False, MemoryBudget("1G"))
    c1 = probe._caps_for(20_000, 0)[0]
    probe._cap_rows = c1
    c2 = probe._caps_for(c1 + 1, 0)[0]
    probe.release()
    old, new = 40 * c1, 40 * c2
    largest_old = 8 * (c1 + 1)  # indptr
    budget = MemoryBudget(new + largest_old + 64)
    assert old + new > budget.limit
    S = ActiveSet(10, False, budget, spill_dir=tmp_path)
    S.add(np.arange(10), _rows(rng, 10, 10, False), np.ones(10), np.zeros(10))
    S.spill()
    k = c1 - S.m
    S.add(np.arange(k) + 10, _rows(rng, k, 10, False), np.ones(k), np.zeros(k))
    assert S._cap_rows == c1 and S.m == c1
    S.add(np.array([-1]), _rows(rng, 1, 10, False), np.ones(1), np.zeros(1))
    assert S._cap_rows == c2 and budget.used == S._reserved == new
    np.testing.assert_array_equal(S.rows[: S.m], np.r_[np.arange(c1), -1])
    S.release()
    assert budget.used == 0


def test_a_growth_that_no_longer_fits_spills_instead_of_stopping(tmp_path, rng):
    # fits() said yes, then something else took the room before add(): S spills (section
    # 4.2) and keeps every row, rather than raising mid-run
    d = 50
    budget = MemoryBudget("4M")
    S = ActiveSet(d, False, budget, spill_dir=tmp_path)
    X = rng.normal(size=(6000, d)).astype(np.float32)
    S.add(np.arange(3000), X[:3000], np.ones(3000), np.zeros(3000))
    assert S.fits(3000) and not S.spilled
    budget.reserve(budget.available - (64 << 10), "a buffer of the step")
    S.add(np.arange(3000, 6000), X[3000:], -np.ones(3000), np.zeros(3000))
    assert S.spilled and S.m == 6000
    np.testing.assert_array_equal(S.read(0, S.m), X)
    S.release()


def test_spilling_refused_gives_a_clear_error(tmp_path, rng):
    S = ActiveSet(10, False, MemoryBudget("1M"), can_spill=False)
    S.add(np.arange(10), _rows(rng, 10, 10, False), np.ones(10), np.zeros(10))
    with pytest.raises(BudgetExceededError, match="memory"):
        S.spill()
    S.release()


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_ibcd_with_a_spilled_active_set_is_optimal_on_all_rows(tmp_path, rng, sparse):
    # many support vectors (25 % flipped labels) and almost no share of the cap for S:
    # S spills early, and the answer must still satisfy the KKT conditions on every row
    X, y = problem(rng, n=4000, sparse=sparse, flip=0.25)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True, leaf_size=50,
                       layout="csr" if sparse else "dense") as store:
        # no row frozen at alpha = C: they would leave S room enough not to spill
        res = solve_ibcd(store, C=0.1, n=200, eps=0.01, init_sample=500, seed=1,
                         spill_dir=tmp_path, resident_share=1e-6, freeze_margin=np.inf)
        assert res.stats["spills"] >= 1 and res.stats["rows_read_back"] > 0
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=0.1)
        assert res.stats["S_converged"] and viol < 0.02, viol
        resident = solve_ibcd(store, C=0.1, n=200, eps=0.01, init_sample=500, seed=1,
                              freeze_margin=np.inf)
        assert resident.stats["spills"] == 0
        assert res.stats["objective"] == pytest.approx(resident.stats["objective"], rel=1e-3)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ooc-ibcd-spill-")]


def test_a_spilled_S_is_solved_by_newton_steps_over_its_file(tmp_path, rng, monkeypatch):
    # a spilled S of the hinge is solved by Newton's method read window by window (final
    # solves to convergence, solves on the way by a few steps on the wider smoothing: here
    # on any S, not only past QUICK_MIN_BYTES), its rounds polishing the dual point: the
    # answer satisfies the KKT conditions on every row, at the objective of the spilled
    # run without Newton's method. (Its solves on the way end on a working-set round, which
    # once returned 0, converged, while S was not: a stop rested on one, and the answer
    # came with the warning that it is approximate.)
    from ooc_learn.solvers import hinge_newton
    from ooc_learn.solvers.ibcd import solve as ibcd_solve

    monkeypatch.setattr(ibcd_solve, "QUICK_MIN_BYTES", 0)
    widths = []
    windows = hinge_newton.newton_hinge_windows

    def counted(*a, **kw):
        widths.append(kw.get("h", hinge_newton.DEFAULT_H))
        return windows(*a, **kw)

    monkeypatch.setattr(hinge_newton, "newton_hinge_windows", counted)
    X, y = problem(rng, n=4000, flip=0.25)
    kw = dict(C=0.1, n=200, eps=0.01, init_sample=500, seed=1, spill_dir=tmp_path,
              resident_share=1e-6, freeze_margin=np.inf)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True,
                       leaf_size=50) as store:
        res = solve_ibcd(store, **kw)
        assert res.stats["spills"] >= 1
        assert hinge_newton.DEFAULT_H in widths and ibcd_solve.QUICK_H in widths
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=0.1)
        assert res.stats["S_converged"] and viol < 0.02, viol
        n_calls = len(widths)
        rounds = solve_ibcd(store, **kw, newton=False)
        assert len(widths) == n_calls and rounds.stats["spills"] >= 1
    assert res.stats["objective"] == pytest.approx(rounds.stats["objective"], rel=1e-3)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_rows_frozen_at_C_leave_S_and_the_answer_is_optimal_on_all_rows(tmp_path, rng,
                                                                         sparse):
    # a dual-dense problem (25 % flipped labels): most support vectors sit at alpha = C far
    # inside the margin. Frozen there, they leave S; the checks' scans bring back those
    # whose alpha would fall, so the answer satisfies the KKT conditions on every row and
    # has the objective of the run that keeps them all in S
    X, y = problem(rng, n=4000, sparse=sparse, flip=0.25)
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True, leaf_size=50,
                       layout="csr" if sparse else "dense") as store:
        res = solve_ibcd(store, C=0.1, n=200, eps=0.01, init_sample=500, seed=1,
                         freeze_margin=0.2)
        kept = solve_ibcd(store, C=0.1, n=200, eps=0.01, init_sample=500, seed=1,
                          freeze_margin=np.inf)
        s = res.stats
        assert s["frozen"] > 0 and s["frozen_rows"] > 0 and kept.stats["frozen"] == 0
        # ... and the checks brought some back (their alpha had to fall)
        assert s["thawed"] > 0
        # S holds fewer rows than the support vectors: the frozen ones are outside it
        assert s["active_set"] + s["frozen_rows"] >= s["n_sv"] > s["active_set"]
        assert s["n_sv"] == res.sv_rows.size == np.unique(res.sv_rows).size
        assert np.all(res.sv_alpha[-s["frozen_rows"]:] == pytest.approx(0.1))
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=0.1)
        assert s["S_converged"] and viol < 0.02, viol
        assert s["objective"] == pytest.approx(kept.stats["objective"], rel=1e-3)
        # w is the sum over the support vectors, the frozen ones included (eq. 8)
        Xs, ys, _ = store.gather(res.sv_rows)
        Xs = Xs.toarray() if sparse else Xs
        w = (res.sv_alpha * ys) @ np.c_[Xs, np.ones(len(ys))]
        assert np.allclose(w, res.w, atol=1e-5 * np.abs(res.w).max())
        # S's rows here are far below the CPU's cache: its rows at alpha = 0 stay (24-48 %
        # of S at the stop); past prune_bytes they leave after every solve, and the answer
        # is as optimal
        assert s["active_set"] - (s["n_sv"] - s["frozen_rows"]) > 0.1 * s["active_set"]
        pruned = solve_ibcd(store, C=0.1, n=200, eps=0.01, init_sample=500, seed=1,
                            freeze_margin=0.2, prune_bytes=0)
        p = pruned.stats
        assert p["active_set"] - (p["n_sv"] - p["frozen_rows"]) <= 0.05 * p["active_set"]
        assert p["pruned"] > s["pruned"] and p["active_set"] < s["active_set"]
        viol = full_kkt_violation(store, pruned.w, pruned.sv_rows, pruned.sv_alpha, C=0.1)
        assert p["S_converged"] and viol < 0.02, viol
        assert p["objective"] == pytest.approx(kept.stats["objective"], rel=1e-3)


def test_frozen_rows_do_not_churn_where_quick_solves_leave_S_far_from_eps(tmp_path):
    # positive, correlated features at C = 1000: the quick solves on the way leave S a wide
    # spread, and rows frozen at alpha = C then cross y w^T x = 1 and back. Brought back
    # each time (by eps, after every solve), 2,000 rows thawed 15,818 times in 1.5 s
    # (session 42); held to the quick solve's spread until a full solve, a tenth of the
    # rows come back (seeds 1-3: 203-215 thaws with the checks' uniform sample of their
    # violators, 143-185 admitting the most violating), and the stop still certifies every
    # row
    X, y = problem(np.random.default_rng(2), n=2000, d=30, flip=0.0)
    X = np.abs(X)
    C = 1000.0
    with ingest_arrays(X, y, tmp_path / "s", n_blocks=4, build_index=True) as store:
        res = solve_ibcd(store, C=C, n=100, init_sample=500, seed=1)
        s = res.stats
        assert s["frozen"] > 0 and s["thawed"] < 0.2 * store.n_samples, s["thawed"]
        viol = full_kkt_violation(store, res.w, res.sv_rows, res.sv_alpha, C=C)
        assert s["S_converged"] and viol < IBCDConfig().eps, viol


def test_spilling_removes_the_folders_of_killed_runs_only(tmp_path, rng):
    # a run killed while spilled cannot remove its folder; the next spill beside it removes
    # the folders whose process is gone, and keeps a live process's and any it cannot read
    import os
    import subprocess
    import sys

    from ooc_learn.solvers.ibcd.active_set import SPILL_PREFIX

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"{SPILL_PREFIX}{int(done.stdout)}-abc123"
    live = tmp_path / f"{SPILL_PREFIX}{os.getpid()}-def456"
    odd = tmp_path / f"{SPILL_PREFIX}notapid"
    for p in (dead, live, odd):
        p.mkdir()
        (p / "X.bin").write_bytes(b"\0" * 64)
    S = ActiveSet(5, False, MemoryBudget("16M"), spill_dir=tmp_path)
    S.add(np.arange(10), _rows(rng, 10, 5, False), np.ones(10), np.zeros(10))
    S.spill()
    assert not dead.exists() and live.exists() and odd.exists()
    own = [p for p in tmp_path.iterdir() if p not in (live, odd)]
    assert len(own) == 1 and own[0].name.startswith(f"{SPILL_PREFIX}{os.getpid()}-")
    S.release()
    assert not own[0].exists()
