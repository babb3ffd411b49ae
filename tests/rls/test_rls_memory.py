"""The budget's reservations cover what sparse RLS really allocates (issue 7: at 1M rows,
n = 1000 and a 1G cap the 10-fold path peaked 76 MiB over idle + cap because the model's
n x n matrices, the folds' n x n work and their predictions were not reserved).

Cheap check instead of an RSS run: numpy reports its buffers to tracemalloc, so the traced
peak of each call (above what was allocated before it) must stay within the budget's peak
reservation over the same call, and the arrays a fitted model keeps within what it holds
reserved."""

import tracemalloc

import numpy as np
import pytest

from ooc_learn.rls import SparseRLS
from ooc_learn.storage.budget import MemoryBudget

M, D, NB = 3000, 3, 200
LAMS = np.logspace(-3, 1, 20)
SLACK = 64 << 10          # index arrays, Python objects


def _traced(fn, budget):
    """(result, traced peak above the start, budget peak reservation above the start)."""
    used0 = budget.used
    budget._peak = used0
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    out = fn()
    return out, tracemalloc.get_traced_memory()[1] - base, budget.peak - used0


@pytest.fixture
def traced():
    SparseRLS(n_basis=5).fit(np.random.default_rng(1).normal(size=(20, 2)), np.ones(20))  # JIT
    tracemalloc.start()
    yield _traced
    tracemalloc.stop()


CALLS = {
    "kfold20": lambda mdl, X: mdl.kfold_predict_path(10, LAMS, "remove"),
    "kfold1": lambda mdl, X: mdl.kfold_predict(10, "remove"),
    "kfold_keep": lambda mdl, X: mdl.kfold_predict_path(3, LAMS[:2], "keep"),
    "loo20": lambda mdl, X: mdl.loo_predict_path(LAMS, "remove"),
    "loo1": lambda mdl, X: mdl.loo_predict("remove"),
    "holdout": lambda mdl, X: mdl.holdout_predict_path(np.arange(0, M, 2), LAMS, "remove"),
    "predict": lambda mdl, X: mdl.predict(X),
}


@pytest.mark.parametrize("cap, cache_u, folds, tags", [
    ("1G", True, None, None),
    ("12M", False, None, "-r"),               # a 10-fold's rows kept (formed once)
    ("4M", False, None, "-r-streamed"),       # folds streamed chunk by chunk
    ("12M", False, 10, "-gram"),              # fit-time fold Grams
], ids=["U cached", "fold rows kept", "folds streamed", "fit-time folds"])
def test_reservations_cover_allocations(rng, traced, cap, cache_u, folds, tags):
    X = rng.normal(size=(M, D))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=M)
    budget = MemoryBudget(cap)
    model = SparseRLS(n_basis=NB, lam=0.5, seed=1, memory=budget, cache_u=cache_u, folds=folds)
    before = tracemalloc.get_traced_memory()[0]
    _, got, reserved = traced(lambda: model.fit(X, y), budget)
    assert got <= reserved + SLACK, ("fit", got, reserved)
    held = tracemalloc.get_traced_memory()[0] - before
    assert budget.used >= 4 * NB * NB * 8          # C, V, Q, A stay reserved
    assert held <= budget.used + SLACK, ("held after fit", held, budget.used)
    for name, call in CALLS.items():
        _, got, reserved = traced(lambda: call(model, X), budget)
        assert got <= reserved + SLACK, (name, got, reserved)
        if name == "kfold20" and tags:
            strategies = set(model.cv_stats_["strategies"])
            assert all(t.endswith(tags) for t in strategies), strategies
    model.close()
    assert budget.used == 0                         # close() gives everything back


def test_close_and_refit_give_the_reservation_back(rng):
    X = rng.normal(size=(500, 2))
    y = X[:, 0]
    budget = MemoryBudget("64M")
    model = SparseRLS(n_basis=50, memory=budget, folds=5).fit(X, y)
    held = budget.used
    assert held >= 8 * (4 * 50 * 50 + 5 * 50 * 50)        # model matrices + fold Grams
    model.fit(X, y)
    assert budget.used == held                             # a refit does not add up
    model.close()
    assert budget.used == 0
    with pytest.raises(Exception, match="not fitted"):
        model.loo_predict()
    SparseRLS(n_basis=50, memory=budget).fit(X, y)         # dropped at once: gc releases
    assert budget.used == 0


def test_a_pass_chunk_evicts_cached_blocks_before_it_shrinks(rng):
    """A pass's row chunk takes its full size where cached blocks can make room (a fit
    that filled the block cache had cut the LOO pass at 1g to half-size chunks), halves
    only where nothing can be evicted, and refuses below 16 rows."""
    from ooc_learn.storage.errors import BudgetExceededError

    X = rng.normal(size=(2000, 3))
    budget = MemoryBudget("8M")
    model = SparseRLS(n_basis=50, memory=budget).fit(X, X[:, 0])
    cap = max(256, (1 << 22) // 50)
    per_row = 8 * 50
    base = budget.used
    cached = [budget.available - 100 * per_row]   # a block cache holding nearly all the room
    budget.reserve(cached[0])

    def evict(need):
        freed, cached[0] = cached[0], 0
        budget.release(freed)
        return freed

    budget.register_evictor(evict)
    with model.row_chunk(10 ** 6, per_row) as step:
        fits = min(cap, (budget.cap - base) // per_row)
        assert cached[0] == 0 and fits >= step > fits // 2   # the cache made room
    assert budget.used == base
    budget.unregister_evictor(evict)
    pinned = budget.available - 100 * per_row     # nothing to evict now
    budget.reserve(pinned)
    with model.row_chunk(10 ** 6, per_row) as step:
        assert 16 <= step <= 100                   # halved to what the budget grants
    with pytest.raises(BudgetExceededError):
        with model.row_chunk(10 ** 6, budget.available):  # not even 16 rows
            pass
    budget.release(pinned)
    assert budget.used == base
    model.close()
