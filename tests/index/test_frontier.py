"""The query's search state: the budgeted frontier, pivot rows as candidates, the mask."""

import numpy as np
import pytest
from _forest_helpers import blobs, brute_force, make_indexed

from ooc_learn.index import forest as forest_mod
from ooc_learn.index.search_config import SearchConfig
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import BudgetExceededError


@pytest.mark.parametrize("pivots", ["none", "reached", "qualifying"])
@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("width", [2, 10])
def test_exact_with_and_without_pivot_candidates(tmp_path, data_rng, pivots, csr, width):
    X, y = blobs(data_rng, n=1500, d=6, csr=csr)   # zero rows and duplicates included
    store, _ = make_indexed(X, y, tmp_path, n_blocks=3, width=width, leaf_size=2)
    w = np.append(data_rng.normal(size=6), 0.3)
    ref = brute_force(store, w)
    with store.forest(search=SearchConfig(pivot_candidates=pivots)) as f:
        rows, n_e = f.query(w, n=None)
        q = f.last_query
        # every row examined once (a pivot row examined is not scanned again), none repeated
        assert np.array_equal(np.sort(rows), ref) and n_e == 1500
        assert (q["pivots_examined"] > 0) == (pivots != "none")
        # the frontier outgrew its first 256 entries: growth keeps every entry
        assert q["frontier_peak"] > 256
        assert q["frontier_bytes"] >= q["frontier_peak"] * forest_mod.FRONTIER_ENTRY_BYTES
        for n in (1, 10, 100):
            rows, n_e = f.query(w, n=n, seed=n)
            assert len(np.unique(rows)) == len(rows) == min(n, len(ref)) <= n_e
            assert np.isin(rows, ref).all()
        # shrinking: a shrunk pivot row is not examined again either
        f.shrink(threshold=0.5)
        f.query(w, n=None, s=1.0)
        rows, n_e = f.query(w, n=None, s=1.0)
        assert np.array_equal(np.sort(rows), ref) and n_e == 1500 - f.n_shrunk


def test_frontier_is_paid_from_the_budget_and_released(tmp_path, data_rng):
    X, y = blobs(data_rng, n=3000, d=6)
    budget = MemoryBudget("8M")
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=2, budget=budget)
    w = data_rng.normal(size=6)
    seen = []
    real = budget.reserve

    def spy(nbytes, what="buffer", **kw):
        seen.append((what, nbytes))
        return real(nbytes, what, **kw)

    with store.forest() as f:
        budget.reserve = spy
        rows, _ = f.query(w, n=None)
        frontier = [nb for what, nb in seen if what == "index search frontier"]
        assert frontier and max(frontier) >= f.last_query["frontier_peak"] * 64
        # everything the search reserved is back once the query returns
        cached = f.cache.nbytes + f.node_cache.nbytes
        assert budget.used == cached + f.map_window_bytes
        assert budget.peak >= cached + f.map_window_bytes + max(frontier)


def test_a_frontier_the_cap_cannot_hold_names_memory(tmp_path, data_rng):
    X, y = blobs(data_rng, n=2000, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=1, width=4, leaf_size=2, budget="64M")
    w = data_rng.normal(size=6)
    with store.forest(cache_bytes=1) as f:
        budget = f.budget
        before = budget.used
        # leave 20 KB free: the first 256 entries fit (16 KB), the growth to 512 does not
        budget.reserve(budget.available - (20 << 10), "test filler")
        with pytest.raises(BudgetExceededError, match="index search frontier") as err:
            f.query(w, n=None)
        assert "--memory" in err.value.hint
        budget.release(budget.used - before)
        assert budget.used == before
        rows, _ = f.query(w, n=None)   # with room again, it answers
        assert np.array_equal(np.sort(rows), brute_force(store, w))


def test_a_bounded_query_stops_where_the_cap_ends(tmp_path, data_rng):
    # bounded=True (IBCD's queries): the frontier takes what the cap gives and the search
    # stops there, flagged, instead of raising; what it returns is still verified
    X, y = blobs(data_rng, n=2000, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=1, width=4, leaf_size=2, budget="64M")
    w = data_rng.normal(size=6)
    ref = brute_force(store, w)
    with store.forest(cache_bytes=1) as f:
        budget = f.budget
        before = budget.used
        filler = budget.available - (20 << 10)
        budget.reserve(filler, "test filler")
        rows, n_e = f.query(w, n=None, bounded=True)
        q = f.last_query
        assert q["truncated"] and len(rows) < len(ref)
        assert np.isin(rows, ref).all() and len(np.unique(rows)) == len(rows) <= n_e
        assert q["frontier_bytes"] <= 20 << 10
        assert budget.used == before + filler  # the stopped search released its frontier
        budget.release(filler)
        assert budget.used == before
        rows, _ = f.query(w, n=None, bounded=True)   # with room, the same query is exact
        assert not f.last_query["truncated"]
        assert np.array_equal(np.sort(rows), ref)


def test_a_caller_kept_mask_is_used_as_is(tmp_path, data_rng):
    X, y = blobs(data_rng, n=1200, d=6)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=8)
    w = data_rng.normal(size=6)
    with store.forest() as f:
        mask = np.zeros(1200, bool)
        assert np.shares_memory(f._exclusion(mask)[0], mask)
        m8 = np.zeros(1200, np.uint8)
        assert f._exclusion(m8)[0] is m8 and f._exclusion(m8)[1] == 0
        first, _ = f.query(w, n=50, exclude=mask)
        # the caller updates its mask between queries (IBCD's active set): no copy is kept
        mask[first] = True
        m8[first] = 1
        second, _ = f.query(w, n=50, exclude=mask)
        assert not np.isin(second, first).any()
        assert np.array_equal(f.query(w, n=50, exclude=m8)[0], second)
        assert np.array_equal(f.query(w, n=50, exclude=first)[0], second)
        # rows as positions still work; a mask of the wrong length is still an error
        rest, _ = f.query(w, n=None, exclude=list(first))
        assert np.array_equal(np.sort(np.concatenate([rest, first])), brute_force(store, w))
