"""The budgeted frontier of one best-bin-first query, and the set of rows seen as pivots.

The arrays live here, paid from the memory budget while a query runs; the heap and hash-set
operations on them are numba kernels (:mod:`~ooc_learn.index._frontier_kernels`).
"""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.budget import MemoryBudget

from ._frontier_kernels import FRONTIER_WIDTH, seen_rehash

__all__ = ["Frontier", "FRONTIER_ENTRY_BYTES", "SEEN_SLOT_BYTES", "FRONTIER_MIN", "SEEN_MIN"]

FRONTIER_ENTRY_BYTES = 8 * (1 + FRONTIER_WIDTH)  # a float64 priority and the int64 fields
SEEN_SLOT_BYTES = 8   # one int64 slot of the set of rows examined as pivots
FRONTIER_MIN = 256    # entries of the first frontier
SEEN_MIN = 1024       # slots of the first set


class Frontier:
    """The best-bin-first frontier of one query, and the set of rows examined as pivots.

    The frontier is a binary min-heap over two parallel arrays (``pri``, ``ent``: a float64
    priority and FRONTIER_WIDTH int64 fields an entry, ``size`` of them in use); the set
    ``seen`` is an open-addressing int64 table kept at most half full. Both grow by doubling,
    reserving the new arrays from the budget before allocating them (the old ones are
    released once copied), so a search's memory is counted; a growth the cap cannot hold
    raises :class:`BudgetExceededError` naming ``--memory``, or with ``soft`` takes what fits
    (the frontier) or declines (:meth:`ensure` returns False). :meth:`release` returns
    everything.
    """

    def __init__(self, budget: MemoryBudget, soft: bool = False):
        self.budget = budget
        self.soft = soft
        self.size = self.peak = self.reserved = self.peak_bytes = 0
        self.pri = np.zeros(0, np.float64)
        self.ent = np.zeros((0, FRONTIER_WIDTH), np.int64)
        self.seen = np.zeros(0, np.int64)

    def _reserve(self, nbytes: int) -> bool:
        """Pay ``nbytes`` from the budget: the ``--memory`` error when it cannot, or False
        with ``soft``."""
        if self.soft:
            if not self.budget.try_reserve(nbytes):
                return False
        else:
            self.budget.reserve(nbytes, "index search frontier")
        self.reserved += nbytes
        self.peak_bytes = max(self.peak_bytes, self.reserved)
        return True

    def _free(self, nbytes: int) -> None:
        self.budget.release(nbytes)
        self.reserved -= nbytes

    def ensure(self, push: int, seen_items: int) -> bool:
        """Room for ``push`` more entries and a set holding ``seen_items`` rows; False (with
        ``soft`` only) when the cap holds no such room: the search stops there."""
        need = self.size + push
        self.peak = max(self.peak, need)
        cap = self.pri.shape[0]
        if need > cap:
            new = max(2 * cap, need, FRONTIER_MIN)
            # soft: as much of the doubling as the cap gives, halving the surplus each time
            while not self._reserve(new * FRONTIER_ENTRY_BYTES):
                if new == need:
                    return False
                new = need + (new - need) // 2
            pri = np.empty(new, np.float64)
            ent = np.empty((new, FRONTIER_WIDTH), np.int64)
            pri[:self.size] = self.pri[:self.size]
            ent[:self.size] = self.ent[:self.size]
            self.pri, self.ent = pri, ent
            self._free(cap * FRONTIER_ENTRY_BYTES)
        cap = self.seen.shape[0]
        if 2 * seen_items > cap:
            new = max(2 * cap, SEEN_MIN)
            while new < 2 * seen_items:
                new *= 2
            # the open-addressing table needs a power of two at least half empty
            if not self._reserve(new * SEEN_SLOT_BYTES):
                return False
            seen = np.full(new, -1, np.int64)
            if cap:
                seen_rehash(self.seen, seen)
            self.seen = seen
            self._free(cap * SEEN_SLOT_BYTES)
        return True

    def release(self) -> None:
        self.pri = np.zeros(0, np.float64)
        self.ent = np.zeros((0, FRONTIER_WIDTH), np.int64)
        self.seen = np.zeros(0, np.int64)
        self.size = 0
        self._free(self.reserved)
