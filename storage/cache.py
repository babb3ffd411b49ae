"""A least-recently-used cache whose entries are paid for from a :class:`MemoryBudget`.

Used for store blocks, index nodes and kernel columns. Each entry's size is reserved from the
budget when it is inserted; when the budget runs short (here or in any other component), the
cache gives back its least recently used entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

from .budget import MemoryBudget

__all__ = ["LRUCache"]


class LRUCache:
    """LRU cache bounded by a byte budget.

    Parameters
    ----------
    budget : MemoryBudget
        Where entry sizes are reserved.
    max_bytes : int, optional
        A further bound on this cache alone (default: the whole budget).
    name : str
        Used in error messages and statistics.

    Examples
    --------
    >>> from ooc_learn.storage.budget import MemoryBudget
    >>> c = LRUCache(MemoryBudget("1K"))
    >>> c.get_or_load("a", lambda: (b"x" * 3, 600))
    b'xxx'
    >>> c.nbytes
    600
    """

    def __init__(self, budget: MemoryBudget, max_bytes: int | None = None, name: str = "cache"):
        self.budget = budget
        self._listeners: list[tuple[Callable, Callable]] = []
        self.max_bytes = budget.limit if max_bytes is None else int(max_bytes)
        self.name = name
        self._entries: "OrderedDict[Hashable, tuple[object, int]]" = OrderedDict()
        self._bytes = 0
        # the budget's own lock: an insert reserves (cache, then budget) while a reservation
        # elsewhere evicts (budget, then cache); with two locks, two threads sharing the
        # budget (one-vs-rest classes) could each hold one and wait for the other
        self._lock = budget._lock
        self._loading: dict = {}  # key -> Event set when the thread loading it is done
        self.hits = 0
        self.misses = 0
        budget.register_evictor(self._evict)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def get(self, key, default=None):
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return default
            self._entries.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key, value, nbytes: int) -> bool:
        """Insert; return False (and keep nothing) when the entry cannot fit even when empty."""
        nbytes = int(nbytes)
        with self._lock:
            self.pop(key)
            if nbytes > self.max_bytes:
                return False
            self._fit(nbytes)
            if not self.budget.try_reserve(nbytes):
                return False
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            for on_put, _ in self._listeners:
                on_put(key, value)
            return True

    def get_or_load(self, key, load: Callable[[], tuple[object, int]], expect: int = 0):
        """Return the cached value or ``load()``'s ``(value, nbytes)``, caching it if it fits.
        A key another thread is loading now is waited for, not loaded twice (classes in
        threads share one store's block cache and ask for the same blocks together).

        ``expect``: what the value will take, where the caller knows (a store block). Room is
        made for it before ``load`` runs (the least recently used entries evicted, the bytes
        reserved until the value is put), so the value and the entries it replaces are not
        held at once: TreeCV at 1 GiB (`--memory 768M`) had peaked at 789-805 MiB while a
        65 MB block was read beside a full cache (bench-log, 2026-11-27)."""
        while True:
            with self._lock:
                item = self._entries.get(key)
                if item is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return item[0]
                busy = self._loading.get(key)
                if busy is None:
                    self.misses += 1
                    self._loading[key] = busy = threading.Event()
                    break
            busy.wait()
            with self._lock:
                if key not in self._entries:  # it did not fit: load it here, uncached
                    self.misses += 1
                    break
        try:
            held = self._make_room(int(expect))
            try:
                value, nbytes = load()
            finally:
                self.budget.release(held)
            self.put(key, value, nbytes)
        finally:
            with self._lock:
                if self._loading.get(key) is busy:
                    del self._loading[key]
            busy.set()
        return value

    def _make_room(self, nbytes: int) -> int:
        """Evict and reserve for a value of ``nbytes`` about to be loaded; returns the bytes
        reserved (0 where the cap has no room for them even when the cache is empty: the
        load then goes on, as without a hint)."""
        if nbytes <= 0 or nbytes > self.max_bytes:
            return 0
        self._fit(nbytes)
        return nbytes if self.budget.try_reserve(nbytes) else 0

    def _fit(self, nbytes: int) -> None:
        """Evict the least recently used entries until ``nbytes`` more fit the cache's bound."""
        with self._lock:
            if self._bytes + nbytes > self.max_bytes:
                self._evict(self._bytes + nbytes - self.max_bytes)

    def pop(self, key):
        with self._lock:
            item = self._entries.pop(key, None)
            if item is None:
                return None
            self._bytes -= item[1]
            self.budget.release(item[1])
            self._dropped(key, item[0])
            return item[0]

    def _evict(self, need: int) -> int:
        freed = 0
        with self._lock:
            while self._entries and freed < need:
                key, (value, nbytes) = self._entries.popitem(last=False)
                self._bytes -= nbytes
                self.budget.release(nbytes)
                freed += nbytes
                self._dropped(key, value)
        return freed

    def clear(self) -> None:
        """Drop every entry, their memory returned to the budget at once, not entry by entry
        (closing an index drops many entries)."""
        with self._lock:
            self.budget.release(self._bytes)
            self._bytes = 0
            if self._listeners:
                for key, (value, _) in self._entries.items():
                    self._dropped(key, value)
            self._entries.clear()

    def close(self) -> None:
        """Release every entry and detach from the budget. Closing twice is fine."""
        self.clear()
        self.budget.unregister_evictor(self._evict)

    def listen(self, on_put: Callable, on_drop: Callable) -> None:
        """Call ``on_put(key, value)`` for every entry held now and each one stored from now
        on, and ``on_drop(key, value)`` for each that leaves (evicted, popped, replaced or
        cleared). A component that mirrors entries elsewhere (the index search's row lists)
        so holds no reference the budget no longer pays for."""
        with self._lock:
            self._listeners.append((on_put, on_drop))
            for key, (value, _) in self._entries.items():
                on_put(key, value)

    def unlisten(self, on_put: Callable, on_drop: Callable) -> None:
        with self._lock:
            if (on_put, on_drop) in self._listeners:
                self._listeners.remove((on_put, on_drop))

    def _dropped(self, key, value) -> None:
        for _, on_drop in self._listeners:
            on_drop(key, value)

    def stats(self) -> dict:
        return {"name": self.name, "entries": len(self._entries), "bytes": self._bytes,
                "hits": self.hits, "misses": self.misses}
