"""One-vs-rest cross-validation of a linear SVM on a multiclass store: each class against the
rest on the same folds (:func:`~.fold_runs.cross_validate` on the store read as that binary
task), in class order, in threads, or each class a task on a Dask cluster
(:func:`cv_classes`); a row's prediction is the class whose model, trained without the row's
fold, gives it the largest value.
"""

from __future__ import annotations

import time

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .fold_runs import cross_validate
from .fold_task import FoldTask
from .result import CVResult

__all__ = ["cross_validate_ovr", "cv_classes"]


def cross_validate_ovr(st, k, *, task, n_jobs=1, client=None, **params) -> list[CVResult]:
    """One-vs-rest CV of a multiclass store: each class against the rest on the same folds
    (the store read as that binary task), a row's prediction the class whose model, trained
    without the row's fold, gives it the largest value. Only the running best value and class
    per row and C are kept across classes. ``n_jobs`` > 1: up to that many classes at once in
    threads (each with its folds in turn; every solver: IBCD's forests share the index's
    LMDB environment), as many as the free budget holds two of each one's state for; the
    classes are merged in class order, so the result is the same as one at a time.
    ``client``: each class is a task on the Dask cluster (its folds one after another in
    the worker, as one class at a time here), merged in class order likewise."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from ooc_learn.storage.store import open_store
    from ooc_learn.training import concurrent_jobs, solver_state_bytes

    t0 = time.perf_counter()
    classes = np.asarray(st.label_map.get("classes") or [], dtype=np.float64)
    if classes.size < 2:
        raise ParameterError(f"The multiclass store {st.path} lists no classes.",
                             "Re-ingest it with --task multiclass.")
    Cs = task.Cs
    n, m = st.n_samples, len(Cs)
    rows0 = st.rows_read
    with st.budget.reservation(10 * m * n + 4 * n, "one-vs-rest cross-validation (each "
                               "row's best value and class per C, its label)"):
        best = np.full((m, n), -np.inf)
        best_k = np.zeros((m, n), dtype=np.int16)
        per_class = [[] for _ in range(m)]
        rows_read = 0

        def one(c):
            with open_store(st.path, memory=st.budget, positive=c) as view:
                results = cross_validate(view, k, task=task.on(view),
                                          n_jobs=1 if jobs > 1 else n_jobs, **params)
                return results, view.rows_read

        # a running class: its fold labels and decision values, its results' predictions,
        # the dual solvers' warm starts, three model states, and what its solver holds
        each = (5 * n + 16 * m * n + (16 * n if task.dual else 0) + 3 * task.state_bytes
                + solver_state_bytes(st, task.solver, task.block_solver, task.init_sample))
        jobs = concurrent_jobs(st.budget, n_jobs, classes.size, each)
        if client is not None:
            from ooc_learn.distributed import n_workers

            jobs = n_workers(client)
        folds = None

        def merge(ci, results, read):
            nonlocal rows_read, folds
            rows_read += read
            for j, r in enumerate(results):
                better = r.predictions > best[j]
                best[j][better] = r.predictions[better]
                best_k[j][better] = ci
                per_class[j].append({"class": float(classes[ci]), "estimate": r.estimate,
                                     "seconds": r.stats["seconds"],
                                     "rows_read": r.stats["rows_read"]})
            folds = results[0].folds

        if client is not None:
            for ci, (results, read) in enumerate(cv_classes(client, st, task, k, classes,
                                                            params["warm_start"])):
                merge(ci, results, read)
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                running = deque()  # at most `jobs` classes alive, merged in class order
                for ci, c in enumerate(classes):
                    running.append((ci, pool.submit(one, c)))
                    if len(running) >= jobs:
                        ci0, fut = running.popleft()
                        merge(ci0, *fut.result())
                while running:
                    ci0, fut = running.popleft()
                    merge(ci0, *fut.result())
        y = np.asarray(st.labels(), dtype=np.float64)
        sizes = np.bincount(folds)
        out = []
        for j, C in enumerate(Cs):
            right = classes[best_k[j]] == y
            fold_scores = np.bincount(folds, weights=right, minlength=sizes.size) / sizes
            out.append(CVResult(
                estimate=float(right.mean()), fold_scores=fold_scores, metric="accuracy",
                method=f"{task.solver}-one-vs-rest", folds=folds,
                predictions=classes[best_k[j]],
                stats={"k": len(fold_scores), "n": n, "solver": task.solver, "C": C,
                       "classes": classes.tolist(), "warm_start": params["warm_start"],
                       "jobs": jobs,
                       "seconds": sum(e["seconds"] for e in per_class[j]),
                       "rows_read": sum(e["rows_read"] for e in per_class[j]),
                       "per_class": per_class[j], "folds": []}))
        if m == 1:
            out[0].stats.update(seconds=time.perf_counter() - t0,
                                rows_read=rows_read + st.rows_read - rows0)
    return out


def _class_cv_task(path, c, k, Cs, params, warm_start):
    """On a worker: the CV of class c against the rest, its folds one after another."""
    from ooc_learn.distributed import keep_open, task_budget
    from ooc_learn.storage.store import open_store

    keep_open(path)
    with open_store(path, memory=task_budget(), positive=c) as view:
        results = cross_validate(view, k, task=FoldTask(view, Cs, **params),
                                  warm_start=warm_start, on_fold=None)
        return results, view.rows_read


def cv_classes(client, st, task, k: int, classes, warm_start: bool):
    """Yield ``(results, rows_read)`` of each class's CV, each a task on the Dask cluster of
    ``client``, in class order."""
    from ooc_learn.distributed import gather, shipped_path

    path = shipped_path(client, st.path)
    args = [(path, float(c), k, task.Cs, task.params, warm_start) for c in classes]
    yield from gather(client, _class_cv_task, args)
