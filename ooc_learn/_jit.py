"""Set numba's compiler up before a process budget measures its fixed part."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def _plus_one(x):
    return x + 1


def start_jit() -> None:
    """Load one cached kernel.

    numba's first kernel, compiled or loaded from the cache, sets up its typing and code
    generation: about 60 MiB (numba's lowering registries, llvmlite's code pages), the same for
    every command. Done before ``MemoryBudget.for_process`` reads the RSS, it is measured
    rather than guessed, and only the command's own kernels load later.
    """
    _plus_one(1)
