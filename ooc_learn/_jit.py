"""Which kernels a command compiles ahead, and the helper process that compiles them.

The process-wide part (numba's set-up before the budget measures it, the registry of helpers
and the wait before a kernel's first call) is :mod:`ooc_learn.storage.jit`, below every layer
with kernels.
"""

from __future__ import annotations

# whether numba's cache holds a kernel: told from its files, where numba's locators put them
from ooc_learn._warmup import KERNEL_MODULES as MODULES
from ooc_learn._warmup import kernel_files_cached as kernels_cached
from ooc_learn.storage.jit import PENDING, track_helper


def _array(dtype: str, ndim: int = 1):
    from numba.core import types

    return types.Array(getattr(types, "boolean" if dtype == "bool" else dtype), ndim, "C")


def _signature(kernel: str) -> tuple:
    """The argument types the commands call ``kernel`` with (the same for dense and CSR stores).

    A helper process compiles these ahead; ``tests/test_jit.py`` checks them against what a
    real ingest and train compile, so a change of a kernel's arguments fails there, not here.
    """
    from numba.core import types as t

    A1, A2 = _array, (lambda dtype: _array(dtype, 2))
    f64, i64, b1 = t.float64, t.int64, t.boolean
    rows = (A2("float32"), A1("int64"), A1("int32"), A1("float32"))  # kernel_args(X), no flag
    query = t.Tuple((A1("float64"), f64, A1("float64"), f64, b1, f64, f64, f64, b1, f64, f64))
    picks = t.Tuple((A1("int64"), A1("int64"), A1("uint8"), A1("uint8"), A1("int32"), b1,
                     A1("int64"), i64, i64, b1, b1))
    values = t.Tuple((A2("float32"), A1("int64"), A1("int32"), A1("float32"), A1("float32"),
                      A1("float64")))                                     # IBCD's
    if kernel == "build_tree_kernel":
        return (A2("float32"), A1("int64"), A1("int32"), A1("float32"), t.boolean,
                A1("float32"), t.int64, t.int64, t.int64, A2("float32"))
    if kernel == "bbf_run":  # its bundles are plain tuples (index/kernel_args.py)
        return (A1("float64"), A2("int64"), i64, query, picks, values,
                t.Tuple((A1("int64"), A1("int32"), A1("int64"), A1("int64"), A1("int64"),
                         A1("int64"), A1("int32"), A1("int64"), A1("int64"), A1("bool"),
                         A1("int64"), A1("float32"), A1("float32"), A1("float32"))),  # NodeArrays
                t.Tuple((A1("int32"), A1("int64"), A1("int32"), A1("int64"), A1("int32"), b1,
                         f64)),                                                   # RowSlots
                t.ListType(t.Tuple((A2("float32"), A1("int64"), A1("int32"), A1("float32"),
                                    A1("float32")))),                             # row list
                t.Tuple((i64, f64, f64)),                                         # Stops
                A1("int64"), A1("int64"))
    if kernel == "scan_leaf":
        return (*rows, b1, A1("float32"), i64, i64, i64, query, picks, values)
    if kernel == "rows_tdot":
        return (*rows, b1, f64, A1("int64"), A1("float64"), A1("float64"))
    if kernel == "seen_rehash":
        return (A1("int64"), A1("int64"))
    if kernel == "compact_dense":
        return (A2("float32"), A1("int64"))
    if kernel == "compact_csr":
        return (A1("int64"), A1("int32"), A1("float32"), A1("int64"))
    if kernel == "dense_row_stats":
        return (A2("float32"), A1("float64"))
    raise KeyError(kernel)


# What a command's helper process compiles while the command compiles the rest: one large
# kernel each, about half of the command's first-run compilation (ingest: the parser here,
# the index's tree builder there; train: dual CD, the node decoder and the row lists here,
# the index search there)
AHEAD = ("build_tree_kernel", "bbf_run")
# What a capped first run's helpers (ooc_learn.cli.warmup) compile by signature before the
# command's run on the head of its input: kernels that run only at scale, so that the head's
# run does not reach them and the command compiled them beside its data (the 10x setting's
# first run peaked 6.6 MiB over its cap so, session 45): Newton's products (S of 8 (d + 1)
# rows), the capped search's leaf scan, the frontier's seen set growing, the active set's
# compaction, and the reading of .npy arrays larger than the ingest buffer (a source, or
# ooc-train's --test)
AT_SCALE = {
    "ooc-train": ("rows_tdot", "scan_leaf", "seen_rehash", "compact_dense", "compact_csr",
                  "dense_row_stats"),
    "ooc-ingest": ("dense_row_stats",),
}
HELPER_ROOM = 1 << 30  # memory free for a helper (it peaks at ~250 MiB) or none is started


def _dispatcher(kernel: str):
    import importlib

    return getattr(importlib.import_module(MODULES[kernel]), kernel)


def compile_ahead(kernels, *, memory_given: bool) -> list[str]:
    """Start one helper process that compiles ``kernels`` into numba's cache, where that is
    worth it: one of them is not in the cache, a second CPU is free for it, the run has no
    memory cap of the user's (the helper's ~250 MiB would be outside it), 1 GiB is free (in
    the machine and in this process's memory cgroup) and
    ``OOC_COMPILE_AHEAD`` is not ``0``. Returns the kernels it compiles.

    Only a first run starts one. The command waits for it
    (:func:`~ooc_learn.storage.jit.await_kernel`) just before its first call of such a kernel,
    which then loads from the cache; a helper still running when the command ends is stopped
    then (nothing outlives the command).
    """
    import os
    import subprocess
    import sys

    if os.environ.get("OOC_COMPILE_AHEAD", "1") == "0" or memory_given:
        return []
    from ooc_learn.storage.measure import memory_headroom_bytes

    room = memory_headroom_bytes()
    if room is not None and room < HELPER_ROOM:
        return []
    try:
        if len(os.sched_getaffinity(0)) < 2:
            return []
    except AttributeError:  # not Linux
        if (os.cpu_count() or 1) < 2:
            return []
    todo = [k for k in kernels if k not in PENDING
            and not kernels_cached(((MODULES[k], k),))]
    if not todo:
        return []
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ooc_learn._jit", *todo],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return []
    track_helper(proc, todo)
    return todo


def _compile(kernels) -> None:
    """The helper's work: compile each kernel for the commands' signature (cached)."""
    for kernel in kernels:
        _dispatcher(kernel).compile(_signature(kernel))


def compile_at_scale(prog: str) -> list[str]:
    """Compile into numba's cache those of ``prog``'s ``AT_SCALE`` kernels it does not hold;
    returns them."""
    todo = [k for k in AT_SCALE.get(prog, ()) if not kernels_cached(((MODULES[k], k),))]
    _compile(todo)
    return todo


def announce_first_run(prog: str, kernels, memory_given: bool = False) -> bool:
    """Print "compiling kernels (first run only)" on stderr when one of this run's main
    ``kernels`` (``_warmup.first_run_kernels``) is not in numba's cache, and under a cap of
    the user's (whose helpers, ``_warmup``, could not compile them within it) that the
    compiler's memory is beyond it; return whether it did. ``ooc-train a9a.store --memory
    200M`` in a fresh checkout peaked at 265 MiB, then at 153 MiB from the cache (session
    44)."""
    import sys

    if not kernels or kernels_cached(kernels):
        return False
    cap = ("; the cap left the helpers no room for them, and numba's compiler takes up to "
           "~110 MiB beyond --memory meanwhile" if memory_given else "")
    print(f"{prog}: compiling kernels (first run only: later runs load them from numba's "
          f"cache{cap})...", file=sys.stderr, flush=True)
    return True


if __name__ == "__main__":  # the helper process of compile_ahead
    import sys

    _compile(sys.argv[1:])
