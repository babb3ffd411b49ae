"""Model selection on a Dask cluster (``dask.distributed``): the folds of a cross-validation
and the one-vs-rest classes of a multiclass store, each a task on a worker.

What is shipped to a worker is the store's **path** and plain parameters, never data: each
task opens the store read-only (the path must be visible to the workers: one machine, or a
shared file system), reads only what its fold or class needs, and returns small results (a
fold's scores, log and its rows' decision values; a class's model). The driver merges them as
the local code does, so a run on the cluster gives the local run's answer:

- CV folds: each from scratch at the first C and warm along C, as ``n_jobs`` > 1 runs them
  locally (identical fold scores for the same folds and seeds); IBCD folds too, since each
  worker is its own process;
- one-vs-rest classes (training and CV): merged in class order, as one class at a time.

Each task works under a memory cap from its worker: the worker's memory limit (Dask's
``memory_limit``) shared by its threads, of which the task claims ``TASK_SHARE`` (Dask
spills, pauses and restarts workers from 60-95 % of the limit, and the worker process
itself takes its part); a worker without a limit uses the default cap. A task whose worker
dies is run again on another (``RETRIES``), with the same answer since tasks only read.

Dask is the optional extra ``[dask]`` (``pip install -e ".[dask]"``), imported only when a
client is asked for. ``ooc-train --workers N`` starts a local cluster of N worker processes
for the run; ``--scheduler ADDRESS`` uses an existing one.
"""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.errors import ParameterError

__all__ = ["make_client", "n_workers", "task_budget", "cv_folds", "cv_classes",
           "train_classes"]

# a task's share of its worker's memory limit per thread (see the module docstring)
TASK_SHARE = 0.5
# how often a task whose worker died is run again
RETRIES = 2


def _dask():
    try:
        from dask import distributed
    except ImportError:
        raise ParameterError("Running on Dask needs dask.distributed, which is not installed.",
                             "Install the dask extra: pip install 'ooc-learn[dask]' (or pip "
                             "install 'dask[distributed]').") from None
    return distributed


def make_client(scheduler: str | None = None, workers: int | None = None, memory=None):
    """``(client, cluster)``: a client of the scheduler at ``scheduler``, or of a local
    cluster of ``workers`` worker processes (one thread each) started here, each limited to
    ``memory`` (a size: the worker process's memory limit; default: Dask's share of RAM).
    ``cluster`` is None for an existing scheduler; close both when done."""
    distributed = _dask()
    if scheduler is not None:
        try:
            return distributed.Client(scheduler, timeout="20s"), None
        except OSError as exc:
            raise ParameterError(f"No Dask scheduler answers at {scheduler} ({exc}).",
                                 "Start one (dask scheduler), check the address, or use "
                                 "--workers N for a local cluster.") from None
    from ooc_learn.storage.budget import parse_size

    limit = "auto" if memory is None else parse_size(memory)
    cluster = distributed.LocalCluster(n_workers=int(workers), threads_per_worker=1,
                                       processes=True, memory_limit=limit,
                                       dashboard_address=":0")  # any free port
    return distributed.Client(cluster), cluster


def n_workers(client) -> int:
    """Worker threads the client's cluster has now (at least 1)."""
    info = client.scheduler_info()
    return max(1, sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()))


def task_budget():
    """The memory budget of a task on this worker: ``TASK_SHARE`` of the worker's memory
    limit per thread (the default cap where the worker has none)."""
    from ooc_learn.storage.budget import MemoryBudget

    try:
        from dask.distributed import get_worker

        worker = get_worker()
        limit = worker.memory_manager.memory_limit
        threads = max(1, worker.state.nthreads)
    except (ImportError, ValueError, AttributeError):
        limit, threads = None, 1
    if not limit:
        return MemoryBudget(None)
    return MemoryBudget(max(32 << 20, int(TASK_SHARE * limit / threads)))


def _gather(client, fn, args_list):
    """Run ``fn(*args)`` for each of ``args_list`` as tasks; yield the results in order."""
    futures = [client.submit(fn, *args, pure=False, retries=RETRIES) for args in args_list]
    try:
        for f in futures:
            yield f.result()
    finally:
        for f in futures:
            f.cancel()


# ---------------------------------------------------------------- cross-validation folds
def _fold_task(path, positive, k, i, Cs, params, warm_start):
    """On a worker: fold i at every C, from scratch at the first C."""
    from ooc_learn.cv.linear import _FoldTask, _fold_path, fold_plan
    from ooc_learn.storage.store import open_store

    with open_store(path, memory=task_budget(), positive=positive) as st:
        task = _FoldTask(st, Cs, **params)
        folds, contiguous = fold_plan(st.block_offsets, k, task.seed)
        m, n = len(Cs), st.n_samples
        rows = np.flatnonzero(folds == i)
        with st.budget.reservation(8 * m * n + 5 * n, "a fold's decision values"):
            decision = np.empty((m, n))
            scores = np.empty((m, k))
            logs = [[None] * k for _ in range(m)]
            _fold_path(task, folds, contiguous, i, None, warm_start=warm_start,
                       decision=decision, fold_scores=scores, logs=logs, references={})
            return {"scores": scores[:, i].copy(), "logs": [logs[j][i] for j in range(m)],
                    "decision": decision[:, rows].copy()}


def cv_folds(client, st, task, k: int, warm_start: bool, folds, decision, fold_scores, logs,
             on_fold=None) -> None:
    """The folds of ``task`` on ``st`` as tasks; their results written into the arrays as
    the local :func:`~ooc_learn.cv.linear._fold_path` writes them."""
    args = [(str(st.path), st.positive, k, i, task.Cs, task.params, warm_start)
            for i in range(k)]
    for i, out in enumerate(_gather(client, _fold_task, args)):
        rows = np.flatnonzero(folds == i)
        fold_scores[:, i] = out["scores"]
        decision[:, rows] = out["decision"]
        for j, entry in enumerate(out["logs"]):
            logs[j][i] = entry
            if on_fold is not None:
                on_fold(entry)


# ---------------------------------------------------------------- one-vs-rest classes
def _class_cv_task(path, c, k, Cs, params, warm_start):
    """On a worker: the CV of class c against the rest, its folds one after another."""
    from ooc_learn.cv.linear import _cross_validate, _FoldTask
    from ooc_learn.storage.store import open_store

    with open_store(path, memory=task_budget(), positive=c) as view:
        results = _cross_validate(view, k, task=_FoldTask(view, Cs, **params),
                                  warm_start=warm_start, on_fold=None)
        return results, view.rows_read


def cv_classes(client, st, task, k: int, classes, warm_start: bool):
    """Yield ``(results, rows_read)`` of each class's CV, in class order."""
    args = [(str(st.path), float(c), k, task.Cs, task.params, warm_start) for c in classes]
    yield from _gather(client, _class_cv_task, args)


def _train_class_task(path, c, params):
    """On a worker: the model of class c against the rest."""
    from ooc_learn.storage.store import open_store
    from ooc_learn.training import train

    with open_store(path, memory=task_budget(), positive=c) as view:
        m = train(view, **params)
    return m, dict(m.meta["stats"], **{"class": c})


def train_classes(client, st, classes, params: dict) -> list:
    """``[(model, stats)]`` of each class against the rest, in class order."""
    plain = {k: v for k, v in params.items() if k not in ("on_outer", "n_jobs", "memory")}
    return list(_gather(client, _train_class_task,
                        [(str(st.path), c, plain) for c in classes]))
