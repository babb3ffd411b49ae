"""A first run's kernels, compiled before the work in helper processes, where ``--memory``
caps the command.

numba compiles a kernel on its first call, in the calling process, and keeps what it compiled
resident there: a fresh checkout's ``ooc-train --memory 224M`` on the issue-23 store (10x
setting, 320 MiB cgroup) peaked at 244 MiB and took 305 s, against 211 MiB and 128-148 s once
the kernels were in numba's cache (session 45). So on a first run under a cap the command
(still small: its parser and numpy, ~30 MiB) first runs helpers and waits: the same command
with the same options on the first rows of its own input, in a temporary folder, without the
cap. Their kernels land in numba's cache, and the command loads them from there. A helper
compiling all of ``ooc-train``'s kernels reaches ~340 MiB (numba keeps each), so each stops
once its RSS passes the cap less the command's RSS, and the next goes on from the cache (the
10x run above: 13 helpers, then 213.9 MiB and 198 s).

The helper's input keeps what decides the kernels' types (the store's layout, label kind and
task; the source's format) and is small: ``HEAD_ROWS`` rows of the store's first
``HEAD_FEATURES`` features (:mod:`ooc_learn.cli.warmup`) (so that Newton's rule, 8 (d + 1) rows of the active set, is met
and its kernels compile too), or a source's first ``HEAD_LINES`` lines. Where the input cannot
be cut so (standard input, idx, .npz, a sharded store) nothing is run, and the command
compiles as before. Kernels that run only at scale (Newton's, the capped search's leaf scan,
the active set's compaction, a large .npy's direct read) are not reached on the head: the
helper compiles them by signature first (``ooc_learn._jit.AT_SCALE``). The helpers write into a folder the command removes after each.

This module is the command's side (:func:`warm_up_first`); it runs before numba is imported
and imports nothing heavy (numba's import alone is ~65 MiB of the command's RSS, which the
helpers' share of the cap would lose). The helper's side is :mod:`ooc_learn.cli.warmup`, run
as ``python -m ooc_learn.cli.warmup PROG ARGV_JSON FOLDER``.
"""

from __future__ import annotations


# The kernels whose first compilation dominates a command's first run (seconds each on a
# 2-core machine): while any of them has no code in numba's cache, the command says so
FIRST_RUN_KERNELS = {
    "ooc-ingest": (("ooc_learn.storage._parse_kernels", "parse_libsvm"),
                   ("ooc_learn.index._build_kernels", "build_tree_kernel")),
    "ooc-index": (("ooc_learn.index._build_kernels", "build_tree_kernel"),),
    "ooc-train": (("ooc_learn.index._search_kernels", "bbf_run"),
                  ("ooc_learn.solvers._kernels", "dcd_solve")),
}



def numba_cache_dir(source: str) -> str:
    """Where numba caches the kernels of the module file ``source``, as its cache locators
    decide (``numba.core.caching``): under ``NUMBA_CACHE_DIR`` where set; else the module's
    ``__pycache__`` where this user can write it; else numba's user-wide cache folder. Both
    of the latter name the module's folder by its name and the SHA-1 of its path."""
    import hashlib
    import os

    folder = os.path.dirname(os.path.abspath(source))
    sub = f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.path.join(os.environ["NUMBA_CACHE_DIR"], sub)
    tree = os.path.join(folder, "__pycache__")
    if os.access(tree if os.path.isdir(tree) else folder, os.W_OK):
        return tree
    user = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(user, "numba", sub)


def kernel_files_cached(kernels) -> bool:
    """Whether numba's cache files of these ``(module, name)`` kernels exist and are newer
    than their sources, told without importing them (numba itself and the kernel modules
    take ~80 MiB: this runs before a capped command decides to warm up). Where a source
    cannot be found: True (nothing is done then)."""
    import importlib.util
    import os
    import sys

    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    for module, name in kernels:
        package, _, leaf = module.rpartition(".")
        try:  # imports the package's parents only, not the package (nor numba)
            where = importlib.util.find_spec(package).submodule_search_locations
            src = next(os.path.join(d, leaf + ".py") for d in where
                       if os.path.exists(os.path.join(d, leaf + ".py")))
        except (ImportError, AttributeError, TypeError, StopIteration, ValueError):
            return True
        cache = numba_cache_dir(src)
        try:
            found = [f for f in os.listdir(cache)
                     if f.startswith(f"{leaf}.{name}-") and f.endswith(f".{tag}.nbi")]
            if not found or min(os.path.getmtime(os.path.join(cache, f)) for f in found) \
                    < os.path.getmtime(src):
                return False
        except OSError:
            return False
    return True


# the commands that warm up on a first run under a cap
WARM_UP = ("ooc-ingest", "ooc-index", "ooc-train")
WARM_UP_TIMEOUT = 900.0  # seconds in all; past it the helper is stopped and the command compiles
WARM_UP_ROUNDS = 24  # helpers at most (each compiles until its RSS reaches its share)
# the helper's exit status when its RSS reached its share: a fresh one goes on from the cache
AGAIN = 75


def cached_kernel_count() -> int:
    """numba index files in the caches of the package's modules (a helper that added none
    made no progress)."""
    import importlib.util
    import os

    import ooc_learn

    dirs = list(ooc_learn.__path__)
    for package in ("ooc_learn.storage", "ooc_learn.index"):  # their own folders (package-dir)
        dirs += importlib.util.find_spec(package).submodule_search_locations
    caches = set()
    for top in dirs:
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if any(f.endswith(".py") for f in files):
                caches.add(numba_cache_dir(os.path.join(dirpath, "x.py")))
    count = 0
    for cache in caches:
        try:
            count += sum(f.endswith(".nbi") for f in os.listdir(cache))
        except OSError:
            pass
    return count


def warm_up_first(prog: str, argv, args, stop=None, *, cap: int | None = None) -> bool:
    """On a first run of ``prog`` under ``--memory`` (its main kernels not in numba's cache),
    run it first on the head of its input in helper processes (:mod:`ooc_learn.cli.warmup`)
    and wait, so that its kernels load from the cache within the cap. numba's compiler keeps
    what it compiled resident (a helper compiling all of ``ooc-train``'s kernels reached ~340
    MiB), so each helper stops once its RSS reaches the cap less this process's RSS
    (``cap``, bytes; exit ``AGAIN``) and the next goes on from the cache, until one ends
    (``WARM_UP_ROUNDS`` at most): the command and its helper stay within ``--memory``
    together. Where a helper added no kernel (one kernel needs more than the share: the
    index search's ~250 MiB), a last one runs without the limit, before this process holds
    any data. Returns whether the warm-up ran to
    its end. Not with Dask (``--workers``, ``--scheduler``: the workers compile their own),
    nor with ``OOC_WARMUP=0``; ``stop`` (the command's signal state) ends the wait."""
    import json
    import os
    import shutil
    import sys
    import tempfile
    import time

    if (prog not in WARM_UP or os.environ.get("OOC_WARMUP", "1") == "0"
            or getattr(args, "workers", None) is not None
            or getattr(args, "scheduler", None) is not None
            or kernel_files_cached(FIRST_RUN_KERNELS[prog])):
        return False
    if not getattr(args, "quiet", False):
        print(f"{prog}: compiling kernels first, on the head of the input in a helper "
              "process (first run only, before any work: later runs load them from numba's "
              "cache)...", file=sys.stderr, flush=True)
    env = dict(os.environ, OOC_WARMUP="0", OOC_COMPILE_AHEAD="0")
    env.pop("OOC_MEMORY", None)
    if cap is not None:
        from ooc_learn.storage.resources import current_rss_bytes

        env["OOC_WARMUP_RSS"] = str(max(0, cap - (current_rss_bytes() or 0)))
    end = time.monotonic() + WARM_UP_TIMEOUT
    done = cached_kernel_count()

    def run_once():
        folder = tempfile.mkdtemp(prefix="ooc-warmup-")
        try:
            return _run_helper([sys.executable, "-m", "ooc_learn.cli.warmup", prog,
                                json.dumps(list(argv)), folder], env, end, stop)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    for _ in range(WARM_UP_ROUNDS):
        rc = run_once()
        if rc != AGAIN:
            return rc == 0
        now = cached_kernel_count()
        if now <= done:
            # the share holds no kernel more: one last helper without it, while this process
            # is still small (compiled here, the kernel would join the data under the cap:
            # the 10x setting's index search took over 10 minutes so, at 256 MiB under 224M)
            env.pop("OOC_WARMUP_RSS", None)
            return run_once() == 0
        done = now
    return False


def _run_helper(cmd, env, end: float, stop) -> int | None:
    """Run one helper to its end and return its exit status; None where it could not start
    or was stopped (``end`` passed, or a signal came)."""
    import subprocess
    import time

    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None
    while proc.poll() is None:
        if time.monotonic() > end or (stop is not None and stop.signum is not None):
            proc.kill()
            proc.wait()
            return None
        try:
            proc.wait(0.2)
        except subprocess.TimeoutExpired:
            pass
    return proc.returncode
