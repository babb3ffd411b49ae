"""Every fold of a linear SVM cross-validation at every C: :func:`cross_validate`, the folds
one after another, in threads, or as tasks on a Dask cluster.

Folds outside, Cs inside: fold i at C_1 starts from fold i-1 at C_1 and fold i at C_j from
fold i at C_(j-1), so two warm states live at once, not one per fold. With ``n_jobs`` > 1 or
a Dask client the (fold, C) pairs are cut into tasks of consecutive folds at a run of Cs
(:func:`~.linear_folds.fold_tasks`) that go side by side, each warm within itself; the Dask
task (:func:`cv_folds`) sits here beside the thread that runs the same folds locally.
"""

from __future__ import annotations

import time

import numpy as np

from .fold_task import FoldTask, fold_path
from .linear_folds import fold_plan, fold_tasks
from .result import CVResult

__all__ = ["cross_validate", "cv_folds"]


def cross_validate(st, k, *, task, warm_start, on_fold, n_jobs=1,
                    client=None) -> list[CVResult]:
    """One CVResult per C of ``task.Cs`` (ascending). Folds outside, Cs inside: fold i at C_j
    starts from fold i at C_(j-1) (alpha <= C_(j-1) < C_j is feasible, LIBLINEAR -C's path),
    fold i at C_1 from fold i-1 at C_1; so two states live at once, not one per fold.
    Regression (SVR's dual: beta signed, no labels in w): each C's folds stop relative to
    the first violation of that C's first solve. ``n_jobs`` > 1 (the dual CD solvers): the
    (fold, C) pairs are cut into tasks (:func:`~.linear_folds.fold_tasks`: runs of
    consecutive folds at every C, and the folds left over cut into runs of Cs, so that the
    threads share the solves evenly), run by that many threads (the kernels release the
    GIL); within a task each fold starts from the one before and each C from the one
    before, the first from scratch; one state per running task. ``client`` (a
    ``dask.distributed.Client``): the same tasks for the cluster's worker threads, each a
    task on the cluster, every solver (IBCD too: a worker is its own process); the same
    answer as ``n_jobs`` = that many. Where the cluster has more worker threads than folds,
    each fold's Cs are cut into runs (as many as the threads hold): the same folds, each C's
    solutions within the solver's tolerance of the local run's."""
    t0 = time.perf_counter()
    n = st.n_samples
    rows0, bytes0 = st.rows_read, st.bytes_read
    dual, Cs = task.dual, task.Cs
    jobs = threads = max(1, min(int(n_jobs), k)) if dual else 1
    m = len(Cs)
    if client is not None:
        from ooc_learn.distributed import n_workers

        threads = n_workers(client)
        jobs = max(1, min(threads, k))
    tasks = fold_tasks(k, m, threads)
    # per row and C: its decision value (float64); per row: its fold (int32); the dual
    # solvers' warm alpha (float64) twice (fold i-1 at C_1, and the C path) and w, or one
    # per running fold
    per_row = 5 * n + 8 * m * n + (16 * jobs * n if dual and client is None else 0)
    with st.budget.reservation(per_row + 3 * jobs * task.state_bytes, "cross-validation "
                               "state (each row's fold and decision values, the warm "
                               "starts)"):
        folds, contiguous = fold_plan(st.block_offsets, k, task.seed)
        decision = np.empty((m, n), dtype=np.float64)
        references = {}  # regression: each C's stopping reference, from its first solve
        fold_scores = np.empty((m, k))
        logs = [[None] * k for _ in range(m)]

        def run(ids, cs):
            """Folds ``ids`` in turn at the Cs ``cs`` (a slice), each warm-started from the
            one before (the first from scratch)."""
            head, sub = None, task.at(cs)
            for i in ids:
                head = fold_path(sub, folds, contiguous, int(i), head,
                                 warm_start=warm_start, decision=decision[cs],
                                 fold_scores=fold_scores[cs], logs=logs[cs],
                                 references=references, on_fold=on_fold)

        remote = (0, 0)  # rows and bytes the workers read (their own handles of the store)
        if client is not None:  # each task on the cluster
            remote = cv_folds(client, st, task, k, warm_start, tasks, folds, decision,
                              fold_scores, logs, on_fold)
        elif len(tasks) == 1:
            run(*tasks[0])
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                for f in [pool.submit(run, ids, cs) for ids, cs in tasks]:
                    f.result()
        sizes = np.bincount(folds, minlength=k)
        method = f"{task.solver}-warm" if warm_start else task.solver
        out = [task.result(C, fold_scores[j], sizes, folds, decision[j], logs[j], method,
                           warm_start=warm_start, jobs=jobs) for j, C in enumerate(Cs)]
        if m == 1:
            out[0].stats.update(rows_read=st.rows_read - rows0 + remote[0],
                                bytes_read=st.bytes_read - bytes0 + remote[1],
                                seconds=time.perf_counter() - t0)
    return out


def _chain_task(path, positive, k, ids, Cs, params, warm_start):
    """On a worker: folds ``ids`` in turn at each of ``Cs`` (each from the one before, the
    first from scratch), as a thread of the local run does them."""
    from ooc_learn.distributed import keep_open, task_budget
    from ooc_learn.storage.store import open_store

    keep_open(path)
    with open_store(path, memory=task_budget(), positive=positive) as st:
        task = FoldTask(st, Cs, **params)
        folds, contiguous = fold_plan(st.block_offsets, k, task.seed)
        m, n = len(Cs), st.n_samples
        with st.budget.reservation(8 * m * n + 21 * n, "a run of folds' decision values "
                                   "and warm starts"):
            decision = np.empty((m, n))
            scores = np.empty((m, k))
            logs = [[None] * k for _ in range(m)]
            head = None
            for i in ids:
                head = fold_path(task, folds, contiguous, i, head, warm_start=warm_start,
                                  decision=decision, fold_scores=scores, logs=logs,
                                  references={})
            return [{"fold": i, "scores": scores[:, i].copy(),
                     "logs": [logs[j][i] for j in range(m)],
                     "decision": decision[:, np.flatnonzero(folds == i)].copy(),
                     # the task's reads, once (the local run counts its own handle's)
                     "rows_read": st.rows_read if i == ids[0] else 0,
                     "bytes_read": st.bytes_read if i == ids[0] else 0} for i in ids]


def cv_folds(client, st, task, k: int, warm_start: bool, tasks, folds, decision, fold_scores,
             logs, on_fold=None) -> None:
    """The ``tasks`` (:func:`~.linear_folds.fold_tasks`: folds and a slice of ``task.Cs``)
    as tasks on the Dask cluster of ``client``; their results written into the arrays as
    the local run's threads write them. Returns the rows and bytes the tasks read."""
    from ooc_learn.distributed import gather, shipped_path

    path = shipped_path(client, st.path)
    args = [(path, st.positive, k, ids, task.Cs[cs], task.params, warm_start)
            for ids, cs in tasks]
    rows = nbytes = 0
    for (_, cs), outs in zip(tasks, gather(client, _chain_task, args)):
        for out in outs:
            rows += out.get("rows_read", 0)
            nbytes += out.get("bytes_read", 0)
            i = out["fold"]
            fold_scores[cs, i] = out["scores"]
            decision[cs, np.flatnonzero(folds == i)] = out["decision"]
            for j, entry in zip(range(len(task.Cs))[cs], out["logs"]):
                logs[j][i] = entry
                if on_fold is not None:
                    on_fold(entry)
    return rows, nbytes
