"""numba's compiler in this process: set up before a process budget measures its fixed part,
and the helper processes that compile kernels ahead (``ooc_learn._jit.compile_ahead``), waited
for just before a kernel's first call.

The lowest layer with kernels, so that storage, the index and the solvers all wait here; which
kernels a command compiles ahead, and how, is the command's business (``ooc_learn._jit``).
"""

from __future__ import annotations

from numba import njit

__all__ = ["start_jit", "PENDING", "track_helper", "await_kernel", "stop_helpers"]


@njit(cache=True)
def _plus_one(x):
    return x + 1


def start_jit() -> None:
    """Load one cached kernel.

    numba's first kernel, compiled or loaded from the cache, sets up its typing and code
    generation (numba's lowering registries, llvmlite's code pages), the same for every
    command. Done before ``MemoryBudget.for_process`` reads the RSS, it is measured
    rather than guessed, and only the command's own kernels load later.
    """
    _plus_one(1)


PENDING: dict = {}  # kernel name -> the helper process compiling it


def track_helper(proc, kernels) -> None:
    """Remember ``proc`` as the helper compiling ``kernels``; it is stopped at exit if it
    still runs then (nothing outlives the command)."""
    if not PENDING:
        import atexit

        atexit.register(stop_helpers)
    for k in kernels:
        PENDING[k] = proc


def await_kernel(kernel: str, timeout: float = 300.0) -> None:
    """Wait for the helper compiling ``kernel``, if one is (a dictionary lookup otherwise).

    If the helper failed or is too slow, the kernel simply compiles here on its first call.
    """
    proc = PENDING.pop(kernel, None)
    if proc is None:
        return
    import subprocess

    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_helpers() -> None:
    """Stop every helper still running."""
    for proc in set(PENDING.values()):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    PENDING.clear()
