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

Whether a run is a first run is told by its own main kernels (:func:`first_run_kernels`):
an IBCD run under a cap that does not hold the store runs the index search in Python and never
calls its compiled loop, so its helpers run the head's search in Python too (the compiled
loop alone took ~250 MiB to compile: in the 320 MiB cgroup the last helper thrashed for
minutes over a kernel the command never called).

The helper's input keeps what decides the kernels' types (the store's layout, label kind and
task; the source's format) and is small: ``HEAD_ROWS`` rows of the store's first
``HEAD_FEATURES`` features (:mod:`ooc_learn.cli.warmup`), or a source's first ``HEAD_LINES``
lines. Where the input cannot be cut so (standard input, idx, .npz, a sharded store) nothing
is run, and the command compiles as before. Kernels that run only at scale (Newton's, the
capped search's leaf scan, the active set's compaction, a large .npy's direct read) are not
reached on the head: the helper compiles them by signature first
(``ooc_learn._jit.AT_SCALE``). The helpers write into a folder the command removes after each.

This module is the command's side (:func:`warm_up_first`); it runs before numba is imported
and imports nothing heavy (numba's import alone is ~65 MiB of the command's RSS, which the
helpers' share of the cap would lose). The helper's side is :mod:`ooc_learn.cli.warmup`, run
as ``python -m ooc_learn.cli.warmup PROG ARGV_JSON FOLDER``.
"""

from __future__ import annotations


# Where the kernels named here live (numba's cache files are told by module and name)
KERNEL_MODULES = {
    "bbf_run": "ooc_learn.index._search_kernels",       # the compiled search loop
    "scan_leaf": "ooc_learn.index._search_kernels",     # a leaf's rows, the loop in Python
    "seen_rehash": "ooc_learn.index._frontier_kernels",
    "build_tree_kernel": "ooc_learn.index._build_kernels",
    "dcd_solve": "ooc_learn.solvers._kernels",
    "dcd_epoch": "ooc_learn.solvers._kernels",          # a pass over blocks
    "pegasos_pass": "ooc_learn.solvers._kernels",
    "cocoa_epoch": "ooc_learn.solvers._kernels",
    "svr_epoch": "ooc_learn.solvers._kernels",
    "decision_range": "ooc_learn.learners._kernels",    # the incremental learners' scores
    "rows_tdot": "ooc_learn.solvers._kernels",
    "compact_dense": "ooc_learn.solvers.ibcd.active_set",
    "compact_csr": "ooc_learn.solvers.ibcd.active_set",
    "parse_libsvm": "ooc_learn.storage._parse_kernels",
    "parse_csv": "ooc_learn.storage._parse_kernels",
    "dense_row_stats": "ooc_learn.storage._parse_kernels",
    "_fail": "ooc_learn.storage._parse_kernels",         # compiled as the parsers load
    "_plus_one": "ooc_learn.storage.jit",               # numba's set-up (start_jit)
}


def _kernel(name: str) -> tuple[str, str]:
    return KERNEL_MODULES[name], name


# The kernels whose first compilation dominates a run (seconds each on a 2-core machine):
# while one of a run's (first_run_kernels) has no code in numba's cache, the run is a first run
_SEARCH, _LEAF_SCAN = _kernel("bbf_run"), _kernel("scan_leaf")
_DUAL_CD, _DCD_EPOCH, _TREE = _kernel("dcd_solve"), _kernel("dcd_epoch"), _kernel(
    "build_tree_kernel")
_SOLVER_KERNELS = {  # ooc-train's other solvers (IBCD, dcd, regression: first_run_kernels)
    "bm": (_DCD_EPOCH, _DUAL_CD),
    "pegasos": (_kernel("pegasos_pass"),),
    "cocoa": (_kernel("cocoa_epoch"),),
}
_PARSERS = {"libsvm": _kernel("parse_libsvm"), "csv": _kernel("parse_csv")}


def _store_meta(path) -> dict | None:
    """A plain store's ``meta.json`` (n_samples, n_features, task), or None."""
    import json
    import os

    from ooc_learn.storage.format import FORMAT_NAME, META_FILE

    try:
        with open(os.path.join(path, META_FILE)) as fh:
            meta = json.load(fh)
        return meta if meta.get("format") == FORMAT_NAME else None
    except (OSError, TypeError, ValueError, AttributeError):
        return None


def _text_format(path: str) -> str | None:
    """"libsvm" or "csv" for a text source, told from its first data line (without the
    parsers' module, which loads numba); None for arrays and what cannot be read."""
    import bz2
    import gzip
    import lzma
    import re

    if path == "-" or path.endswith((".npy", ".npz")) or "ubyte" in path or ".idx" in path:
        return None
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(
        path[path.rfind("."):], open)
    try:
        with opener(path, "rb") as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError, ValueError, lzma.LZMAError):
        return None
    for line in head.splitlines()[:-1] or head.splitlines():
        line = line.strip()
        if line and not line.startswith(b"#"):
            return "libsvm" if re.search(rb"(^|\s)\d+:\S", line) else "csv"
    return None


def first_run_kernels(prog: str, args=None, cap: int | None = None) -> tuple:
    """The main kernels of this run of ``prog`` (``(module, name)`` pairs), by what decides
    them: an ingest's or a prediction's source format, the index, ooc-train's solver, task
    and CV method, and for IBCD the index search's loop: compiled where the cap (``cap``
    bytes, or the default ``--memory``) holds the store's rows (``storage.budget.holds_rows``),
    in Python otherwise. A run whose kernels are all in numba's cache is not a first run (an
    IBCD run under a cap that does not hold the store never calls the compiled loop:
    requiring it, every such run would have warmed up again)."""
    if prog == "ooc-index":
        return (_TREE,)
    if prog == "ooc-predict":  # numba's set-up and a store's reader, or a text's parser
        data = str(getattr(args, "data", ""))
        fmt = None if _store_meta(data) is not None else _text_format(data)
        return (_kernel("_plus_one"), _kernel("_fail")) + (
            (_PARSERS[fmt],) if fmt in _PARSERS else ())
    if prog == "ooc-ingest":
        fmt = getattr(args, "format", "auto")
        formats = ({fmt} if fmt in _PARSERS else
                   {_text_format(str(s)) for s in getattr(args, "sources", ())})
        index = () if getattr(args, "no_index", False) else (_TREE,)
        return tuple(_PARSERS[f] for f in sorted(formats - {None})) + index
    if prog != "ooc-train":
        return ()
    if getattr(args, "cv", None) is not None and (
            getattr(args, "learner", None) is not None
            or getattr(args, "cv_method", None) in ("tree", "standard")
            or getattr(args, "solver", None) == "pegasos"):  # CV of an incremental learner
        return (_kernel("decision_range"),)
    meta = _store_meta(getattr(args, "store", None))
    solver = getattr(args, "solver", None)
    if meta is not None and meta.get("task") == "regression":
        return (_kernel("svr_epoch"),) if solver == "dcd" else ()
    if solver == "dcd":  # one block: LIBLINEAR's whole loop in one call; else pass by pass
        return (_DUAL_CD if meta is not None and meta.get("n_blocks") == 1 else _DCD_EPOCH,)
    if solver not in (None, "ibcd"):
        return _SOLVER_KERNELS.get(solver, ())
    from ooc_learn.storage.budget import default_memory_bytes, holds_rows

    held = meta is None or holds_rows(default_memory_bytes() if cap is None else cap,
                                      int(meta["n_samples"]), int(meta["n_features"]))
    return (_SEARCH if held else _LEAF_SCAN, _DUAL_CD)


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


def searches_index(args) -> bool:
    """Whether this ``ooc-train`` run searches the store's index (IBCD's queries)."""
    return bool({_SEARCH, _LEAF_SCAN} & set(first_run_kernels("ooc-train", args)))


# the commands that warm up on a first run under a cap
WARM_UP = ("ooc-ingest", "ooc-index", "ooc-train", "ooc-predict")
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


def warm_up_first(prog: str, argv, args, stop=None, *, cap: int | None = None,
                  kernels=None) -> bool:
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
    nor with ``OOC_WARMUP=0``; ``stop`` (the command's signal state) ends the wait;
    ``kernels``: the run's :func:`first_run_kernels` where the caller has them."""
    import json
    import os
    import shutil
    import sys
    import tempfile
    import time

    if (prog not in WARM_UP or os.environ.get("OOC_WARMUP", "1") == "0"
            or getattr(args, "workers", None) is not None
            or getattr(args, "scheduler", None) is not None):
        return False
    kernels = first_run_kernels(prog, args, cap) if kernels is None else kernels
    if kernel_files_cached(kernels):
        return False
    if not getattr(args, "quiet", False):
        print(f"{prog}: compiling kernels first, on the head of the input in a helper "
              "process (first run only, before any work: later runs load them from numba's "
              "cache)...", file=sys.stderr, flush=True)
    env = dict(os.environ, OOC_WARMUP="0", OOC_COMPILE_AHEAD="0")
    env.pop("OOC_MEMORY", None)
    if _LEAF_SCAN in kernels:
        # the command's search runs in Python (the cap does not hold the store's rows): so
        # does the head's, which the cap would hold (the compiled loop, ~250 MiB to compile,
        # is never called)
        env["OOC_WARMUP_SEARCH_LOOP"] = "python"
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
