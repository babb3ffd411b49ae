"""MemoryBudget, size parsing, OOC_MEMORY and LRU eviction across caches."""

import re
import subprocess
import sys

import pytest

from ooc_learn.storage.budget import MemoryBudget, default_memory_bytes, parse_size
from ooc_learn.storage.cache import LRUCache
from ooc_learn.storage.errors import BudgetExceededError, ParameterError


@pytest.mark.parametrize("text,expected", [("512M", 512 << 20), ("2G", 2 << 30),
                                           ("1.5GiB", 3 << 29), ("64k", 64 << 10),
                                           ("1048576", 1 << 20), (4096, 4096)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-5M", "0", "1X", ""])
def test_bad_sizes_name_the_flag(bad):
    with pytest.raises(ParameterError, match="--memory"):
        parse_size(bad)


def test_oocmemory_environment_sets_the_default(monkeypatch):
    monkeypatch.setenv("OOC_MEMORY", "300M")
    assert default_memory_bytes() == 300 << 20 and MemoryBudget().limit == 300 << 20
    monkeypatch.setenv("OOC_MEMORY", "nonsense")
    with pytest.raises(ParameterError, match="OOC_MEMORY"):
        MemoryBudget()
    monkeypatch.delenv("OOC_MEMORY")
    assert default_memory_bytes() >= 64 << 20


def test_a_reservation_evicts_other_caches_before_failing():
    budget = MemoryBudget(1000)
    a, b = LRUCache(budget, name="a"), LRUCache(budget, name="b")
    assert a.put("x", "X", 400) and b.put("y", "Y", 400)
    budget.reserve(500, "solver buffer")  # evicts the least recently used entries first
    assert budget.used <= budget.limit and len(a) + len(b) == 1
    with pytest.raises(BudgetExceededError, match="solver buffer"):
        budget.reserve(900, "solver buffer")
    budget.release(500)
    with budget.reservation(600, "scratch"):
        assert budget.used >= 600
    a.close(), b.close()
    assert budget.used == 0 and budget.peak <= budget.limit


def test_a_shortfall_of_a_few_bytes_reads_as_one_and_the_fix_is_enough():
    # 3.6M cap, 1.4M free, 1.4M + 100 bytes asked: rounded to 0.1M the message read "needs
    # 1.4M but only 1.4M ... is free", and told to raise --memory "to at least 3.6M", the cap
    limit, free = int(3.6 * 2**20), int(1.4 * 2**20)
    budget = MemoryBudget(limit)
    budget.reserve(limit - free, "S")
    with pytest.raises(BudgetExceededError) as exc:
        budget.reserve(free + 100, "IBCD active set")
    msg = str(exc.value)
    assert f"{free + 100:,} bytes but only {free:,} of the 3.6M" in msg
    raise_to = re.search(r"at least (\S+),", msg).group(1)
    assert parse_size(raise_to) >= limit + 100 and raise_to == "3.7M"


def test_cache_hits_and_entries_larger_than_the_cache():
    cache = LRUCache(MemoryBudget(1000), max_bytes=300)
    loads = []
    for key in ("p", "q", "p"):
        cache.get_or_load(key, lambda k=key: (loads.append(k) or k, 100))
    assert loads == ["p", "q"] and cache.hits == 1
    assert cache.put("big", "B", 301) is False and "big" not in cache


@pytest.mark.parametrize("bound", ["budget", "cache"])
def test_a_load_of_known_size_makes_room_before_it_reads(bound):
    # a store block's size is known before it is read: the entries it replaces go first, so
    # the new block and the old ones are never held at once (TreeCV's peak over the cap),
    # whether the budget or the cache's own bound is what is full
    budget = MemoryBudget(1000 if bound == "budget" else 10_000)
    cache = LRUCache(budget, max_bytes=None if bound == "budget" else 900)
    for key in ("a", "b", "c"):
        cache.get_or_load(key, lambda k=key: (k, 300), expect=300)
    seen = {}

    def load():
        seen.update(entries=len(cache), used=budget.used, held=cache.nbytes)
        return "d", 300

    assert cache.get_or_load("d", load, expect=300) == "d"
    assert seen["entries"] == 2 and "a" not in cache  # the oldest went before the read
    assert seen["held"] + 300 <= 900 and seen["used"] <= budget.limit
    assert len(cache) == 3 and budget.used == cache.nbytes == 900  # the hold is let go
    seen.clear()
    cache.get_or_load("e", load)  # no size given: the read comes first, as before
    assert seen["entries"] == 3


def test_listeners_see_every_entry_come_and_go():
    budget = MemoryBudget("1K")
    c = LRUCache(budget, max_bytes=600)
    c.put("old", "o", 100)
    seen = []
    put = lambda k, v: seen.append(("put", k, v))    # noqa: E731
    drop = lambda k, v: seen.append(("drop", k, v))  # noqa: E731
    c.listen(put, drop)
    assert seen == [("put", "old", "o")]  # what the cache held already
    c.put("a", "A", 300)
    c.put("b", "B", 300)                  # over max_bytes: the oldest leaves first
    c.put("a", "A2", 100)                 # replaced: the old value leaves
    c.pop("b")
    budget.reserve(1000, "pressure")      # the budget's evictor takes the rest
    assert seen[1:] == [("put", "a", "A"), ("drop", "old", "o"), ("put", "b", "B"),
                        ("drop", "a", "A"), ("put", "a", "A2"), ("drop", "b", "B"),
                        ("drop", "a", "A2")]
    budget.release(1000)
    c.put("c", "C", 10)
    c.unlisten(put, drop)
    c.clear()
    assert seen[-1] == ("put", "c", "C") and len(c) == 0


# ---- a process budget: --memory is the whole process ----------------------------------

def test_a_process_budget_charges_the_fixed_part_and_refuses_a_cap_below_it():
    from ooc_learn.storage.budget import MIN_WORKING_BYTES, _load_libraries, current_rss_bytes

    _load_libraries()  # for_process does it first, and hands LLVM's set-up pages back
    rss = current_rss_bytes()
    b = MemoryBudget.for_process(rss + (200 << 20), late_load=50 << 20)
    assert b.cap == rss + (200 << 20)
    # (a few pages may have left the RSS since the reading)
    assert b.fixed >= rss + (50 << 20) - (2 << 20) and b.limit == b.cap - b.fixed
    with pytest.raises(BudgetExceededError, match="fixed part") as ei:
        MemoryBudget.for_process(rss + (10 << 20), late_load=50 << 20)
    # the hint names a cap that covers the fixed part and the working minimum
    wanted = parse_size(ei.value.hint.split("at least ")[1].rstrip("."))
    assert wanted >= rss + (50 << 20) + MIN_WORKING_BYTES


def test_a_command_refuses_a_cap_below_the_peak_its_start_took(monkeypatch):
    # numba's set-up peaks above what the process keeps: a cap that covers the fixed part
    # but not that peak would be broken before any data is read
    import ooc_learn.storage.budget as B

    B._load_libraries()
    rss = B.current_rss_bytes()
    cap = rss + (20 << 20) + B.MIN_WORKING_BYTES + (4 << 20)  # fits the fixed part
    monkeypatch.setattr(B, "peak_rss_bytes", lambda: cap + (30 << 20))
    assert MemoryBudget.for_process(cap, late_load=20 << 20).start_peak == 0  # not asked
    with pytest.raises(BudgetExceededError, match="start already took") as ei:
        MemoryBudget.for_process(cap, late_load=20 << 20, start_peak=True)
    assert parse_size(ei.value.hint.split("at least ")[1].rstrip(".")) >= cap + (30 << 20)
    b = MemoryBudget.for_process(cap + (40 << 20), late_load=20 << 20, start_peak=True)
    assert b.start_peak == cap + (30 << 20)


def test_a_process_budget_lets_real_rss_press_the_caches(monkeypatch):
    import ooc_learn.storage.budget as B

    b = MemoryBudget.for_process(B.current_rss_bytes() + (400 << 20), late_load=0)
    limit = b.limit
    assert b.try_reserve(1 << 20, evict=False)          # the account and the RSS both agree
    b.release(1 << 20)
    # temporaries the account does not know of: the process's RSS is near the cap
    monkeypatch.setattr(B, "current_rss_bytes", lambda: b.cap - (2 << 20))
    b._rss_at = -float("inf")
    assert b.available < (1 << 20)
    assert not b.try_reserve(4 << 20, evict=False)      # an optional buffer is refused
    freed = []
    b.register_evictor(lambda need: freed.append(need) or 0)
    assert b.try_reserve(4 << 20)                       # a needed one evicts first, then is
    assert freed and freed[0] >= (4 << 20) - (2 << 20)  # granted where the account has room
    with pytest.raises(BudgetExceededError, match="--memory"):
        b.reserve(limit, "everything")                  # the account still refuses


def test_a_release_shows_in_the_rss_room_only_once_a_reading_shows_it(monkeypatch):
    import ooc_learn.storage.budget as B

    clock = [B.time.monotonic()]  # no periodic reading unless the clock moves
    monkeypatch.setattr(B.time, "monotonic", lambda: clock[0])
    b = MemoryBudget.for_process(B.current_rss_bytes() + (400 << 20), late_load=0)
    state = b.limit - (100 << 20) - b.rss_headroom
    b.reserve(state, "the run's state")
    rss = [b.fixed + state]                             # the RSS holds what the account says
    monkeypatch.setattr(B, "current_rss_bytes", lambda: rss[0])
    b._rss_at = -float("inf")
    assert b.available == 100 << 20
    assert b.try_reserve(50 << 20, evict=False)
    rss[0] += 50 << 20                                  # the buffer is made
    b.release(50 << 20)                                 # released, but a caller still holds it
    assert b.available == 50 << 20                      # not credited before a reading
    # a reservation the room refuses reads the RSS again first: still held, so refused...
    assert not b.try_reserve(60 << 20, evict=False)
    rss[0] -= 50 << 20                                  # ...once let go (and the lesson the
    clock[0] += 20 * B.LESSON_HALF_LIFE                 # reading took has faded), granted
    assert b.try_reserve(60 << 20, evict=False)
    b.release(60 << 20 + state)


def test_a_reservation_that_must_fit_the_rss_is_refused_where_only_the_account_has_room(
        monkeypatch):
    import ooc_learn.storage.budget as B

    b = MemoryBudget.for_process(B.current_rss_bytes() + (400 << 20), late_load=0)
    monkeypatch.setattr(B, "current_rss_bytes", lambda: b.cap - (2 << 20))
    b._rss_at = -float("inf")
    assert not b.try_reserve(4 << 20, fit_rss=True)     # a chunk that may halve
    assert b.try_reserve(4 << 20)                       # one that must be had: the account


def test_a_process_budget_moves_what_the_rss_holds_beyond_its_account_to_the_fixed_part(
        monkeypatch):
    import ooc_learn.storage.budget as B

    clock = [B.time.monotonic()]  # the lesson's decay follows this clock only
    monkeypatch.setattr(B.time, "monotonic", lambda: clock[0])
    rss = B.current_rss_bytes()
    b = MemoryBudget.for_process(rss + (300 << 20), late_load=10 << 20)
    fixed, limit = b.fixed, b.limit
    b.reserve(50 << 20, "rows")
    # a kernel that loaded late and a temporary: 40 MiB beyond fixed part + reservations
    monkeypatch.setattr(B, "current_rss_bytes", lambda: fixed + (50 << 20) + (40 << 20))
    b._rss_at = -float("inf")
    assert b.available <= limit - (50 << 20) - (40 << 20)
    assert b.fixed == fixed + (40 << 20) and b.limit == limit - (40 << 20)
    assert b.cap == fixed + limit                       # the cap itself never moves
    # caches give way to the lesson; a reservation that must be had is still granted within
    # the working share as first charged, and refused beyond it
    freed = []
    b.register_evictor(lambda need: freed.append(need) or 0)
    assert not b.try_reserve(limit - (80 << 20), evict=False)
    assert b.try_reserve(limit - (80 << 20)) and freed
    assert not b.try_reserve(40 << 20)
    b.release(limit - (80 << 20))
    # once the RSS no longer shows it, the lesson falls by half every LESSON_HALF_LIFE
    # seconds (a transient is not a fixed part), and never below what the RSS shows
    monkeypatch.setattr(B, "current_rss_bytes", lambda: fixed + (50 << 20) + (10 << 20))
    clock[0] += B.LESSON_HALF_LIFE
    b._rss_at = -float("inf")
    b.available
    assert b.fixed == pytest.approx(fixed + (20 << 20), abs=1 << 12) and b.cap == fixed + limit
    clock[0] += 10 * B.LESSON_HALF_LIFE
    b._rss_at = -float("inf")
    b.available
    assert b.fixed == fixed + (10 << 20) and b.limit == limit - (10 << 20)
    # the working share never falls below the minimum a run needs
    monkeypatch.setattr(B, "current_rss_bytes", lambda: b.cap * 2)
    b._rss_at = -float("inf")
    b.available
    assert b.limit == B.MIN_WORKING_BYTES and b.cap == fixed + limit


def test_an_api_budget_ignores_the_process_rss():
    b = MemoryBudget("1M")
    assert b.fixed == 0 and b.cap == b.limit == 1 << 20 and b.available == 1 << 20


_PAGE_OUT = """
import numpy as np
from ooc_learn.storage.jit import start_jit
from ooc_learn.storage.budget import current_rss_bytes
from ooc_learn.storage.resources import release_compiler_pages
start_jit()
before = current_rss_bytes()
freed = release_compiler_pages()
after = current_rss_bytes()
from numba import njit
@njit(cache=False)
def twice(x):
    return 2 * x
print(before, after, freed, twice(np.arange(3)).sum())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT is Linux's")
def test_the_compilers_set_up_pages_are_handed_back_and_numba_still_compiles():
    # a fresh interpreter: numba's set-up pages are resident only in a process that just
    # made them
    out = subprocess.run([sys.executable, "-c", _PAGE_OUT], capture_output=True, text=True,
                         check=True).stdout.split()
    before, after, freed, total = (int(x) for x in out)
    if freed == 0:
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux < 5.4)")
    assert before - after >= 20 << 20  # ~60 MiB of LLVM's code pages on Linux x86-64
    assert freed == pytest.approx(before - after, abs=4 << 20)
    assert total == 6  # compiling a new kernel afterwards faults what it needs back in


def test_reserve_shrinking_halves_to_what_fits_and_refuses_below_its_floor():
    """A buffer that may shrink: k halves until the budget grants it, down to the floor,
    where the reservation must be had (the cap's error)."""
    budget = MemoryBudget("1M")
    k = budget.reserve_shrinking(1 << 20, lambda j: 8 * j, 16, "test chunk")
    assert 8 * k <= (1 << 20) < 16 * k          # the largest halving that fits
    assert budget.used == 8 * k
    budget.release(8 * k)
    budget.reserve(budget.available - 100)
    with pytest.raises(BudgetExceededError, match="test chunk"):
        budget.reserve_shrinking(1000, lambda j: 8 * j, 16, "test chunk")  # 16 rows: 128 bytes
    # a buffer the caller can do without: nothing reserved below the floor, None returned
    used = budget.used
    assert budget.reserve_shrinking(1000, lambda j: 8 * j, 16, must=False) is None
    assert budget.used == used
    assert budget.reserve_shrinking(1000, lambda j: 8 * j, 8, must=False) == 8
    assert budget.used == used + 64


def test_the_rss_reading_follows_allocations_and_a_forked_child_reads_its_own():
    """current_rss_bytes keeps /proc/self/statm open (re-read with pread): a forked child,
    whose inherited descriptor would read its parent, reopens it."""
    import os

    import numpy as np

    from ooc_learn.storage.resources import current_rss_bytes

    before = current_rss_bytes()
    x = np.ones(16 << 20 >> 3)  # 16 MiB, touched
    grown = current_rss_bytes() - before
    assert 15 << 20 <= grown <= 20 << 20
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: 32 MiB more than the parent, read as its own
        try:
            base = current_rss_bytes()
            y = np.ones(32 << 20 >> 3)
            os.write(w, str(current_rss_bytes() - base + 0 * int(y[0])).encode())
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 64))
    os.waitpid(pid, 0)
    os.close(r)
    assert 31 << 20 <= child <= 40 << 20
    assert current_rss_bytes() - before < 24 << 20  # not the child's pages
    del x
