"""One memory cap per run, shared by every cache and buffer.

A :class:`MemoryBudget` is created once per run (CLI ``--memory 512M``, environment
``OOC_MEMORY``, default 25 % of physical RAM) and handed down. Components reserve bytes before
they allocate and release them when they free. A reservation that does not fit raises
:class:`BudgetExceededError` naming the flag to raise, unless the caller asks to evict first
(caches register an evictor that frees least-recently-used entries).

Two ways to make one:

- ``MemoryBudget(limit)`` (the Python API): ``limit`` is what the engine's buffers may take on
  top of whatever the calling process already holds. The promise: peak RSS of a run <= RSS of
  the same run on a tiny input + the limit.
- ``MemoryBudget.for_process(cap)`` (every CLI command): ``cap`` is the whole process. The fixed
  part (interpreter, numpy, numba with its loaded kernels, h5py, lmdb) is charged first, as the
  RSS when the budget is made plus an allowance for the compiled kernels that load later; the
  buffers get the rest (``limit``). A cap whose rest is below a working minimum is refused up
  front. The promise users test from outside, in a memory cgroup: peak RSS <= the cap.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import Callable

from .errors import BudgetExceededError, ParameterError
from .resources import current_rss_bytes, peak_rss_bytes
from .stop import check_stop

__all__ = ["MemoryBudget", "parse_size", "format_size", "default_memory_bytes",
           "current_rss_bytes", "LATE_LOAD_BYTES", "late_load_bytes", "MIN_WORKING_BYTES"]

# What a command's process takes after its budget is made that does not grow with the data:
# its own numba kernels as they load from the cache, with the pages of LLVM that loading them
# faults back in (numba's compiler itself is set up, and its set-up pages handed back, before
# the fixed part is measured: see storage.jit and resources.release_compiler_pages), h5py's
# and lmdb's handles. Each part bounds, with room to spare, a command's peak RSS minus its RSS
# when the budget was made; reading a text file adds the parsers' part.
LATE_LOAD_PARTS = {"base": 16 << 20, "solvers": 14 << 20, "parsers": 20 << 20}
# ... all of them: the allowance when nothing says which load
LATE_LOAD_BYTES = sum(LATE_LOAD_PARTS.values())


def late_load_bytes(*, solvers: bool = True, parsers: bool = True) -> int:
    """The allowance for what a command loads after its fixed part is measured."""
    return (LATE_LOAD_PARTS["base"] + solvers * LATE_LOAD_PARTS["solvers"]
            + parsers * LATE_LOAD_PARTS["parsers"])


# The least a run needs beyond the fixed part: w and a few blocks of rows
MIN_WORKING_BYTES = 8 << 20
# A process budget reads its RSS at most this often (seconds; a reading is one small read of
# /proc/self/statm)
RSS_PERIOD = 0.005
# ... and keeps this much of the cap free of it, or 1/RSS_HEADROOM_SHARE of the cap where that
# is more: the temporaries of one step (a block's margins, a fetch's parts, a selection's
# copy) that are made without a reservation, which grow with the chunks and so with the cap
# (8 MiB alone let the IBCD exact stop's peak reach 769 MiB under --memory 768M in 1 of 4
# runs; bench-log 2026-11-27)
RSS_HEADROOM = 8 << 20
RSS_HEADROOM_SHARE = 64
# the RSS's lesson (see MemoryBudget._learn_fixed) falls by half in this many seconds once the
# RSS no longer shows it
LESSON_HALF_LIFE = 2.0

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def holds_rows(limit: int, n_samples: int, n_features: int) -> bool:
    """Whether a cap of ``limit`` bytes holds ``n_samples`` rows of ``n_features`` at the
    index search's first estimate of a row (4 (d + 3) bytes): where it does, the search runs
    its compiled loop (``index.view``); a capped first run's warm-up asks the same before
    numba is loaded (``ooc_learn._warmup``)."""
    return limit >= n_samples * 4.0 * (n_features + 3)


def parse_size(text, *, what: str = "--memory") -> int:
    """Parse ``'512M'``, ``'2G'``, ``'1.5GiB'``, ``'1048576'`` (bytes) into a byte count.

    >>> parse_size("64M")
    67108864
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise ParameterError(
                f"The {what} value must be a size such as 512M, 2G or a byte count. "
                f"Got {text!r} instead.")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ParameterError(f"The {what} value must be > 0. Got {text!r} instead.")
    return value


def format_size(n: int, *, up: bool = False) -> str:
    """Human-readable size: ``format_size(3 << 20) == '3.0M'``; ``up``: rounded up to the
    digit shown (a size to raise a limit to must not read as less than what is needed)."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            if not unit:
                return f"{n}B"
            return f"{math.ceil(n * 10) / 10:.1f}{unit}" if up else f"{n:.1f}{unit}"
        n /= 1024.0
    return str(n)  # pragma: no cover


def default_memory_bytes() -> int:
    """``OOC_MEMORY`` if set, else 25 % of physical RAM."""
    env = os.environ.get("OOC_MEMORY")
    if env:
        return parse_size(env, what="OOC_MEMORY")
    try:
        import psutil

        total = psutil.virtual_memory().total
    except Exception:  # pragma: no cover - psutil is a dependency; this is a last resort
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(64 << 20, total // 4)


def _load_libraries() -> None:
    """Import what every command loads and set numba's compiler up (one cached kernel,
    ``storage.jit``), so that a process budget's RSS reading holds them; hand the pages
    of LLVM that only the set-up needed back to the kernel, before it (the import's) and
    after it (the set-up's), which lowers both the start's peak RSS and the RSS it leaves
    (see ``resources.release_compiler_pages``)."""
    import h5py  # noqa: F401
    import lmdb  # noqa: F401
    import numba  # noqa: F401
    import numpy  # noqa: F401
    import scipy.sparse  # noqa: F401

    from .jit import start_jit
    from .resources import release_compiler_pages

    release_compiler_pages()
    start_jit()
    release_compiler_pages()


class MemoryBudget:
    """A byte budget that caches and buffers reserve from.

    Parameters
    ----------
    limit : int, str or None
        The cap in bytes or as a size string; ``None`` takes ``OOC_MEMORY`` or 25 % of RAM.

    Examples
    --------
    >>> b = MemoryBudget("1M")
    >>> b.reserve(1000, "block cache")
    >>> b.used, b.available
    (1000, 1047576)
    >>> b.release(1000)
    """

    def __init__(self, limit=None):
        self.limit = default_memory_bytes() if limit is None else parse_size(limit)
        self.fixed = 0  # the process's fixed part, charged by for_process (not in limit)
        self.start_peak = 0  # for_process(start_peak=True): the peak RSS of the start
        # the working share as first charged (_learn_fixed lowers limit, never this)
        self._grant_limit = self.limit
        self._watch_rss = False  # for_process: reservations must also fit the real RSS
        self._rss, self._rss_at, self._since_rss = 0, -math.inf, 0
        self._skip_learn = False
        self._fixed0 = 0  # the fixed part as measured; fixed = _fixed0 + the RSS's lesson
        self._lesson, self._lesson_at = 0, 0.0
        self._used = 0
        self._peak = 0
        self._lock = threading.RLock()
        self._evictors: list[Callable[[int], int]] = []

    @classmethod
    def coerce(cls, memory) -> "MemoryBudget":
        """Accept a budget, a size or ``None`` (the default cap)."""
        return memory if isinstance(memory, MemoryBudget) else cls(memory)

    @classmethod
    def for_process(cls, cap=None, *, late_load: int = LATE_LOAD_BYTES,
                    minimum: int = MIN_WORKING_BYTES,
                    start_peak: bool = False) -> "MemoryBudget":
        """A budget for a whole process of at most ``cap`` bytes (a CLI command's ``--memory``).

        The fixed part, the RSS now plus ``late_load``, is charged first; ``limit`` is the
        rest, which every cache and buffer shares. Raises :class:`BudgetExceededError` when
        the rest is below ``minimum``, naming the cap to raise to; with ``start_peak`` (a
        command's own process, whose peak RSS so far is its start's) also when the cap is
        below that peak.
        """
        budget = cls(cap)
        cap_bytes = budget.limit
        _load_libraries()
        rss = current_rss_bytes()
        fixed = rss + int(late_load)
        # setting the compiler up took more for a moment than the process keeps (see
        # _load_libraries): a cap below that peak is broken before any data is read
        start = peak_rss_bytes() if start_peak else 0
        least = format_size(max(fixed + minimum, start), up=True)
        if cap_bytes < fixed + minimum:
            raise BudgetExceededError(
                f"The memory cap {format_size(cap_bytes)} does not cover this process's fixed "
                f"part ({format_size(fixed)}: the interpreter, numpy, numba and its compiled "
                f"kernels, h5py) plus the {format_size(minimum)} a run needs at the least.",
                f"Raise --memory (or OOC_MEMORY) to at least {least}.")
        if cap_bytes < start:
            raise BudgetExceededError(
                f"The memory cap {format_size(cap_bytes)} is below the {format_size(start)} "
                f"this process's start already took (numba setting its compiler up, before "
                f"any data).", f"Raise --memory (or OOC_MEMORY) to at least {least}.")
        budget.fixed, budget.limit = fixed, cap_bytes - fixed
        budget.start_peak = start
        budget._fixed0 = fixed
        budget._grant_limit = budget.limit
        budget._watch_rss = bool(rss)  # 0: no reading on this platform
        return budget

    def _rss_room(self) -> float:
        """What the process's real RSS leaves of the cap (a process budget only).

        The reservations are an account of what the engine means to hold; the RSS is what the
        process holds: temporaries, allocator holes and pages of mapped files the account
        does not itemise. Each reservation also has to fit under the cap by the RSS, read at
        most every RSS_PERIOD seconds, plus what was reserved since that reading. What was
        released since is not taken off: a release says the engine is done with a buffer,
        not that its pages are gone (a caller may still hold the array: a chunk loop's last
        chunk while the next is read), so only a new reading shows it. A reservation that
        fails this way reads the RSS again, then evicts caches like one that fails the
        account; one that may not evict (an optional buffer) is refused.
        """
        now = time.monotonic()
        if now - self._rss_at >= RSS_PERIOD:
            self._rss, self._rss_at, self._since_rss = current_rss_bytes(), now, 0
            if self._skip_learn:
                self._skip_learn = False
            else:
                self._learn_fixed()
        return self.cap - self._rss - self._since_rss - self.rss_headroom

    def _learn_fixed(self) -> None:
        """Move what the process holds beyond its account from the working share to the fixed
        part (the *lesson*), down to the working minimum; give it back as the RSS falls.

        The RSS exceeds fixed part + reservations when something the account does not itemise
        (a kernel that loaded late, allocator holes, a temporary) took more than the allowance
        left: the account then plans with the smaller working share, so the caches give way
        instead of the soft grants of :meth:`try_reserve` filling the cap. A reservation that
        must be had is still granted within the working share as first charged once the
        caches are empty: a run does not stop for memory a lesson took.

        The lesson rises at once and falls with a half-life of LESSON_HALF_LIFE seconds to
        what the RSS shows: a transient is not a fixed part, and buffers the account released
        while the RSS still held them do not shrink the working share for the rest of a run.
        """
        now = time.monotonic()
        excess = self._rss - self._fixed0 - self._used
        kept = self._lesson * 0.5 ** ((now - self._lesson_at) / LESSON_HALF_LIFE)
        lesson = round(max(excess, kept, 0))
        lesson = min(lesson, max(0, self._grant_limit - MIN_WORKING_BYTES))
        self._lesson, self._lesson_at = lesson, now
        self.fixed = self._fixed0 + lesson
        self.limit = self._grant_limit - lesson

    def _free_now(self) -> float:
        free = self.limit - self._used
        return min(free, self._rss_room()) if self._watch_rss else free

    @property
    def rss_headroom(self) -> int:
        """What the RSS must leave free of the cap for unreserved temporaries."""
        return max(RSS_HEADROOM, self.cap // RSS_HEADROOM_SHARE)

    @property
    def cap(self) -> int:
        """The whole cap: ``limit`` plus the fixed part a process budget charged first."""
        return self.limit + self.fixed

    def cap_needed(self, nbytes: int) -> int:
        """The cap at which a reservation of ``nbytes`` would fit now."""
        return self.cap + int(nbytes) - self.available

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        return self._peak

    @property
    def available(self) -> int:
        """What a reservation may take now (for a process budget, also what RSS leaves)."""
        return int(self._free_now())

    def register_evictor(self, evict: Callable[[int], int]) -> None:
        """``evict(nbytes)`` frees at least ``nbytes`` if it can and returns what it freed."""
        with self._lock:
            self._evictors.append(evict)

    def unregister_evictor(self, evict: Callable[[int], int]) -> None:
        with self._lock:
            if evict in self._evictors:
                self._evictors.remove(evict)

    def try_reserve(self, nbytes: int, *, evict: bool = True, fit_rss: bool = False) -> bool:
        """Reserve ``nbytes`` if it fits (after evicting cache entries); return success.

        A process budget grants a reservation that evicted what it could where the account
        has room, whatever the RSS (a run does not stop for what temporaries hold for a
        moment); ``fit_rss`` (a buffer whose size the caller may halve: a read chunk) asks
        for room by the RSS as well."""
        check_stop()  # a safe point for SIGINT / SIGTERM (see stop.request_stop)
        nbytes = int(nbytes)
        with self._lock:
            if nbytes > self._free_now() and self._watch_rss:
                self._rss_at = -math.inf  # the reading may predate releases: read it again
            if nbytes > self._free_now() and evict:
                for evictor in list(self._evictors):
                    need = nbytes - self._free_now()
                    if need <= 0:
                        break
                    if evictor(int(need)) and self._watch_rss:
                        # what was freed shows in a new reading, unless the heap still holds
                        # it or a caller still holds a view of it: no lesson for _learn_fixed
                        self._rss_at, self._skip_learn = -math.inf, True
            if nbytes > self._free_now() and self._watch_rss and evict:
                # the caches are empty or what they freed is still in the heap's free
                # lists: hand those pages back and read the RSS again
                from .resources import release_compiler_pages, release_free_heap

                release_free_heap()
                release_compiler_pages(1.0)  # what loading kernels faulted back in
                self._rss_at = -math.inf
            if nbytes > (self._free_now() if not evict or fit_rss
                          else self._grant_limit - self._used):
                # the account refuses; the RSS only presses the caches: a reservation that
                # evicted what it could is granted where the account has room, or a run
                # would stop for memory that temporaries hold for a moment
                return False
            self._used += nbytes
            self._since_rss += nbytes
            self._peak = max(self._peak, self._used)
            return True

    def reserve(self, nbytes: int, what: str = "buffer", *, evict: bool = True,
                hint: str = "or use smaller blocks (--block-rows)") -> None:
        """Reserve ``nbytes`` or raise :class:`BudgetExceededError` naming ``--memory`` and,
        after it, ``hint`` (the other way out)."""
        if not self.try_reserve(nbytes, evict=evict):
            need, free = format_size(int(nbytes)), format_size(self.available)
            if need == free:  # a few bytes short: the rounded sizes would read alike
                need, free = f"{int(nbytes):,} bytes", f"{self.available:,}"
            raise BudgetExceededError(
                f"The {what} needs {need} but only {free} of the {format_size(self.cap)} "
                f"memory cap is free.",
                f"Raise --memory (or OOC_MEMORY) to at least "
                f"{format_size(self.cap_needed(nbytes), up=True)}, {hint}.")

    def reserve_shrinking(self, k: int, nbytes: Callable[[int], int], floor: int,
                          what: str = "buffer", *, must: bool = True) -> int | None:
        """Reserve ``nbytes(k)`` for ``k`` rows of a buffer that may shrink (a read chunk, a
        selection, a pass's chunk), halving ``k`` down to ``floor`` while the account or the
        RSS refuses (``fit_rss``: what the account does not itemise halves the buffer, not
        the cap's margin); at the floor the reservation must be had (:meth:`reserve`'s
        error), or, with ``must=False``, nothing is reserved and None returned. Returns the
        ``k`` reserved: release ``nbytes(k)``."""
        k = int(k)
        while not self.try_reserve(nbytes(k), fit_rss=True):
            if k <= floor:
                if not must:
                    return None
                self.reserve(nbytes(k), what)
                break
            k = max(int(floor), k // 2)
        return k

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._used = max(0, self._used - int(nbytes))

    def reservation(self, nbytes: int, what: str = "buffer", *, hint: str | None = None):
        """Context manager: reserve on entry, release on exit (``hint``: as :meth:`reserve`)."""
        return _Reservation(self, int(nbytes), what, hint)

    def __repr__(self) -> str:
        return (f"MemoryBudget(cap={format_size(self.cap)}, limit={format_size(self.limit)}, "
                f"used={format_size(self._used)}, "
                f"peak={format_size(self._peak)})")


class _Reservation:
    def __init__(self, budget: MemoryBudget, nbytes: int, what: str, hint: str | None = None):
        self.budget, self.nbytes, self.what, self.hint = budget, nbytes, what, hint

    def __enter__(self):
        if self.hint is None:
            self.budget.reserve(self.nbytes, self.what)
        else:
            self.budget.reserve(self.nbytes, self.what, hint=self.hint)
        return self

    def __exit__(self, *exc):
        self.budget.release(self.nbytes)
        return False
