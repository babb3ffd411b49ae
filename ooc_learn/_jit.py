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


# The kernels whose first compilation dominates a command's first run (seconds each on a
# 2-core machine): while any of them has no code in numba's cache, the command says so
FIRST_RUN_KERNELS = {
    "ooc-ingest": (("ooc_learn.storage._parse_kernels", "parse_libsvm"),
                   ("ooc_learn.index._kernels", "build_tree_kernel")),
    "ooc-index": (("ooc_learn.index._kernels", "build_tree_kernel"),),
    "ooc-train": (("ooc_learn.index._kernels", "bbf_run"),
                  ("ooc_learn.solvers._kernels", "dcd_solve")),
}


def kernels_cached(kernels) -> bool:
    """Whether numba's cache holds code of these ``(module, name)`` kernels for their current
    source (True where that cannot be told: nothing is said then)."""
    import importlib

    for module, name in kernels:
        try:
            dispatcher = getattr(importlib.import_module(module), name)
            if not dispatcher._cache._cache_file._load_index():  # {} when absent or stale
                return False
        except Exception:  # numba's internals moved: assume cached
            return True
    return True


def announce_first_run(prog: str) -> bool:
    """Print "compiling kernels (first run only)" on stderr when ``prog``'s main kernels are
    not in numba's cache; return whether it did."""
    import sys

    kernels = FIRST_RUN_KERNELS.get(prog)
    if not kernels or kernels_cached(kernels):
        return False
    print(f"{prog}: compiling kernels (first run only: later runs load them from numba's "
          f"cache)...", file=sys.stderr, flush=True)
    return True
