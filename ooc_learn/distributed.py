"""Model selection on a Dask cluster (``dask.distributed``): the folds of a cross-validation,
TreeCV's subtrees and the one-vs-rest classes of a multiclass store, each a task on a worker.

What is shipped to a worker is the store's **path** and plain parameters, never data: each
task opens the store read-only (the path must be visible to the workers: one machine, or a
shared file system), reads only what its fold or class needs, and returns small results (a
fold's scores, log and its rows' decision values; a class's model). The driver merges them as
the local code does, so a run on the cluster gives the local run's answer:

- CV folds (:func:`ooc_learn.cv.fold_runs.cv_folds`): cut into tasks of consecutive folds
  at a run of consecutive Cs (:func:`ooc_learn.cv.linear_folds.fold_tasks`: a run of folds
  at every C per worker thread, the folds left over cut into runs of Cs), each fold of a
  task warm-started from the one before (the first from scratch) and warm along C, as
  ``n_jobs`` = that many runs them locally in threads (identical fold scores for the same
  folds and seeds); IBCD folds too, since each worker is its own process. With more worker
  threads than folds, each fold's Cs are cut into runs (within the solver's tolerance of
  the local run);
- one-vs-rest classes (:func:`ooc_learn.training.train_classes`,
  :func:`ooc_learn.cv.one_vs_rest.cv_classes`): merged in class order, as one class at a time;
- TreeCV (:func:`ooc_learn.cv.treecv.tree_subtrees`): the subtrees log2(worker threads)
  levels down, each rebuilding its model from its path of fold ranges, as ``n_jobs`` does
  locally.

This module is the cluster's plumbing (clients, a worker's budget and open stores, the tasks'
gathering); each task lives beside the code it runs, which imports this module, never the
other way round.

The tasks of a worker work under one memory cap for the whole worker process (as
``--memory`` is for a command): ``PAUSE_MARGIN`` of the share of the worker's memory limit at
which Dask pauses the worker (``distributed.worker.memory.pause``, 80 % by default), its
fixed part (the interpreter, Dask, numba, h5py) charged first. It is shared by its threads
and, across tasks, by the store's block cache. (It was half the limit besides the fixed part:
below ~1 GB of limit the budget's caches then took the worker past the pause, and a paused
worker that holds its memory never runs the next task.) A worker without a limit uses the
default cap. A task whose worker
dies is run again on another (``RETRIES``), with the same answer since tasks only read.

Dask is the optional extra ``[dask]`` (``pip install -e ".[dask]"``), imported only when a
client is asked for. ``ooc-train --workers N`` starts a local cluster of N worker processes
for the run; ``--scheduler ADDRESS`` uses an existing one.
"""

from __future__ import annotations

import contextlib

from ooc_learn.storage.errors import ParameterError

__all__ = ["make_client", "n_workers", "task_budget", "keep_open", "shipped_path",
           "stores_seen", "check_store_visible", "gather", "result", "check_open"]

# the tasks' cap: this share of the memory at which Dask pauses the worker (see the module
# docstring)
PAUSE_MARGIN = 0.9
# how often a task whose worker died is run again
RETRIES = 2
# seconds a wait for a task's result lasts between looks at a stop asked (Ctrl-C)
STOP_POLL = 0.2


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise ParameterError("Running on Dask needs dask.distributed, which is not installed.",
                             "Install the dask extra: pip install 'ooc-learn[dask]' (or pip "
                             "install 'dask[distributed]').") from None
    return distributed


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while a local cluster starts its processes, which keep that (an ignored
    signal stays ignored across exec, and Python then leaves it so): a terminal's Ctrl-C
    reaches every process of its group, and the workers died of it mid-task (tracebacks,
    tasks lost) while the command waited on them for ever. The command stops them as it
    closes the cluster. (Blocking SIGINT instead, which would keep a Ctrl-C given meanwhile,
    does not reach the workers: distributed starts them from its own thread.) A Ctrl-C in
    the second or two the cluster takes to start is lost."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def make_client(scheduler: str | None = None, workers: int | None = None, memory=None, *,
                prog: str | None = None, quiet_logs: bool = False):
    """``(client, cluster)``: a client of the scheduler at ``scheduler``, or of a local
    cluster of ``workers`` worker processes (one thread each) started here, each limited to
    ``memory`` (a size: the worker process's memory limit; default: Dask's share of RAM).
    ``cluster`` is None for an existing scheduler; close both when done.

    ``prog`` (a command's local cluster, whose workers write to its terminal): a warning a
    task raises is the line ``prog: warning: ...``, as the command's own. ``quiet_logs``:
    Dask's workers log errors only (their warnings at a Ctrl-C, a task cancelled, were lines
    of noise)."""
    distributed = _dask()
    if scheduler is not None:
        import re

        port = re.search(r":(\d+)/?$", str(scheduler))
        if port and not 0 < int(port.group(1)) < 65536:  # else a 20 s wait to say nothing
            raise ParameterError(f"--scheduler {scheduler}: the port {port.group(1)} is not "
                                 "one (1 to 65535).", "Give the address `dask scheduler` "
                                 "prints, e.g. tcp://HOST:8786.")
        try:
            return distributed.Client(scheduler, timeout="20s"), None
        except OSError as exc:
            raise ParameterError(f"No Dask scheduler answers at {scheduler} ({exc}).",
                                 "Start one (dask scheduler), check the address, or use "
                                 "--workers N for a local cluster.") from None
        except (ValueError, TypeError) as exc:  # not an address ("nonsense": no port)
            raise ParameterError(f"--scheduler {scheduler} is not a Dask scheduler's address "
                                 f"({exc}).", "Give it as tcp://HOST:PORT (the address "
                                 "`dask scheduler` prints), or use --workers N.") from None
    from ooc_learn.storage.budget import parse_size

    import logging

    limit = "auto" if memory is None else parse_size(memory)
    with _sigint_ignored():  # the workers inherit it: a terminal's Ctrl-C is the command's
        cluster = distributed.LocalCluster(n_workers=int(workers), threads_per_worker=1,
                                           processes=True, memory_limit=limit,
                                           dashboard_address=":0",  # any free port
                                           silence_logs=logging.ERROR if quiet_logs
                                           else logging.WARNING)
    client = distributed.Client(cluster)
    if prog is not None:
        client.register_plugin(_warning_lines(prog))
    return client, cluster


def _warning_lines(prog: str):
    """A worker plugin: warnings print as ``prog: warning: message`` on the worker's
    stderr (see :func:`make_client`); a worker the nanny restarts gets it too."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WarningLines(WorkerPlugin):
        name = "ooc-learn-warning-lines"

        def setup(self, worker):
            import warnings

            from ooc_learn._warnings import warning_line

            warnings.showwarning = warning_line(prog)

    return WarningLines()


def check_open(client) -> None:
    """Refuse a client that was closed (its calls ended in "RuntimeError: IOLoop is
    closed")."""
    if getattr(client, "status", None) in ("closing", "closed"):
        raise ParameterError("The Dask client is closed.",
                             "Pass an open Client (client=Client(...)), or client=None to "
                             "run here.")


def n_workers(client) -> int:
    """Worker threads the client's cluster has now (at least 1)."""
    check_open(client)
    info = client.scheduler_info()
    return max(1, sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()))


_WORKER_BUDGET: dict = {}  # pid -> this worker process's budget


def task_budget():
    """The memory budget of the tasks on this worker, one per worker process and shared by
    its tasks, so that they share its store's block cache too (a class task reads the
    blocks the previous class on this worker left cached, so one-vs-rest reads each block
    about once per worker, not once per class). A cap for the whole process below Dask's
    pause threshold (see the module docstring); the default cap where the worker has no
    memory limit."""
    import os

    from ooc_learn.storage.budget import MemoryBudget, format_size
    from ooc_learn.storage.errors import BudgetExceededError

    budget = _WORKER_BUDGET.get(os.getpid())
    if budget is not None:
        return budget
    try:
        from dask import config
        from dask.distributed import get_worker

        limit = get_worker().memory_manager.memory_limit
        pause = config.get("distributed.worker.memory.pause", 0.8) or 1.0
    except (ImportError, ValueError, AttributeError):
        limit = None
    if limit:
        cap = int(PAUSE_MARGIN * min(1.0, float(pause)) * limit)
        try:
            budget = MemoryBudget.for_process(cap)
        except BudgetExceededError as exc:
            raise BudgetExceededError(
                f"The Dask worker's memory limit {format_size(limit)} leaves its tasks "
                f"{format_size(cap)} below the pause threshold: {exc.args[0]}",
                "Start the workers with a larger memory limit (dask worker --memory-limit, "
                "LocalCluster(memory_limit=...)).") from None
    else:
        budget = MemoryBudget(None)
    _WORKER_BUDGET.clear()
    _WORKER_BUDGET[os.getpid()] = budget
    return budget


_KEPT: dict = {}  # (pid, store path) -> a Store kept open on this worker
KEEP_STORES = 4


def keep_open(path):
    """Keep the store at ``path`` open on this worker between tasks (the last
    ``KEEP_STORES``), so that its block cache, shared by the views under the worker's
    budget, outlives each task: the next class or fold reads the blocks the last one left.
    The cache gives them back under pressure like any other. Returns that store (a task may
    keep what it opened on it, e.g. an index, while it stays open)."""
    import os

    from ooc_learn.storage.store import open_store

    key = (os.getpid(), os.path.realpath(path))
    st = _KEPT.pop(key, None)
    if st is None or st.closed:
        st = open_store(path, memory=task_budget())
    _KEPT[key] = st  # the most recent last
    while len(_KEPT) > KEEP_STORES:
        _KEPT.pop(next(iter(_KEPT))).close()
    return st


def _data_files_exist(paths) -> list[bool]:
    import os

    from ooc_learn.storage.format import DATA_FILE

    return [os.path.isfile(os.path.join(p, DATA_FILE)) for p in paths]


def stores_seen(client, paths) -> dict:
    """``{path: the addresses of the workers that see a store there}``, asked of every
    worker at once (one round trip for all the paths)."""
    paths = [str(p) for p in paths]
    seen = client.run(_data_files_exist, paths)
    return {p: {addr for addr, ok in seen.items() if ok[i]} for i, p in enumerate(paths)}


def check_store_visible(client, path) -> None:
    """Refuse, before any task, a store that some worker cannot see at ``path`` (tasks open
    the store by its path: one machine, or a file system the workers share)."""
    check_open(client)
    path = str(path)
    addrs = set(client.scheduler_info()["workers"])
    blind = sorted(addrs - stores_seen(client, [path])[path])
    seen = addrs
    if blind:
        raise ParameterError(
            f"The store {path} is not visible to {len(blind)} of the cluster's "
            f"{len(seen)} workers ({', '.join(blind[:3])}{' ...' if len(blind) > 3 else ''}).",
            "Put the store on a file system every worker mounts at the same path, or run "
            "with --workers N (a local cluster).")


def shipped_path(client, path) -> str:
    """The store's path as the tasks get it: absolute (a worker's working folder is its
    own), and checked to be visible to every worker."""
    import os

    path = os.path.abspath(str(path))
    check_store_visible(client, path)
    return path


def result(future):
    """``future.result()``, waited for a moment at a time so that a stop asked meanwhile
    (Ctrl-C, SIGTERM: :mod:`~ooc_learn.storage.stop`) is honoured: a command waiting on a
    task of a cluster whose workers had died of the same Ctrl-C waited for ever."""
    from ooc_learn.storage.stop import check_stop

    while True:
        check_stop()
        try:
            return future.result(timeout=STOP_POLL)
        except TimeoutError:  # distributed's TimeoutError is this one
            continue


def gather(client, fn, args_list):
    """Run ``fn(*args)`` for each of ``args_list`` as tasks (each retried ``RETRIES`` times
    on another worker if its worker dies); yield the results in order."""
    futures = [client.submit(fn, *args, pure=False, retries=RETRIES) for args in args_list]
    try:
        for f in futures:
            yield result(f)
    finally:
        for f in futures:
            f.cancel()
