"""TreeCV: k-fold and leave-one-out CV of incremental learners at O(log k) training passes.

Algorithm 1 of Joulani, Gyorgy & Szepesvari, "Fast Cross-Validation for Incremental Learning"
(IJCAI 2015)::

    TREECV(s, e, f):  # f is trained on every chunk except s..e
        if s == e: score f on chunk s
        else: m = floor((s + e) / 2)
              TREECV(s, m,     f updated with chunks m+1..e)
              TREECV(m + 1, e, f updated with chunks s..m)

Chunks are contiguous ranges of row positions (:mod:`ooc_learn.cv.folds`): whole on-disk blocks
when k <= n_blocks, pieces of one block otherwise. Each training phase streams its range block by
block. Once the held-out range lies inside one block (always for in-memory arrays), the rest of
that subtree runs in :func:`ooc_learn.cv._kernels.tree_block` after one block load, for the
learners whose model is a flat numba state (Pegasos, LeastSquaresSGD, ExactLeastSquares).

Memory (sec. 4.1): the left branch works on a copy (or a ``save`` token) and the right branch
reuses the parent's model in place, so at most ceil(log2 k) + 2 models are alive at once; each
is reserved from the run's :class:`~ooc_learn.storage.budget.MemoryBudget`.
Running time (Corollary 4): about (1 + c) log2(2k) single training passes.
"""

from __future__ import annotations

import time

import numpy as np

from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import ParameterError

from .folds import StoreSource
from .learner_run import CVRun, is_flat
from .result import CVResult

__all__ = ["tree_cv"]


def _tree(run: CVRun, s: int, e: int, model) -> None:
    """Algorithm 1 from (s, e, f_{s..e}); the right branch is a loop (tail call)."""
    learner, bounds = run.learner, run.bounds
    save_revert = hasattr(learner, "save") and hasattr(learner, "revert")
    while True:
        if s == e:
            run.leaf(s, model)
            return
        if is_flat(learner) and run.in_one_block(s, e):
            run.kernel_subtree(s, e, model)
            return
        m = (s + e) // 2
        if save_revert:
            token = learner.save(model)
            model = run.feed(model, [(bounds[m + 1], bounds[e + 1])])
            _tree(run, s, m, model)
            model = learner.revert(model, token)
        else:
            child = run.copy(model)
            child = run.feed(child, [(bounds[m + 1], bounds[e + 1])])
            _tree(run, s, m, child)
            run.drop(child)
        model = run.feed(model, [(bounds[s], bounds[m + 1])])
        s = m + 1


# -- subtrees as parallel tasks (paper sec. 4.1) --------------------------------------------


def subtree_plan(k: int, depth: int) -> list:
    """The subtrees ``depth`` levels below the root, as ``(s, e, feed)``.

    ``feed`` lists the fold ranges ``(a, b)`` (inclusive) that the recursion trains the model
    of subtree s..e on, in its order. Fed to a fresh model they rebuild f_{s..e} (exactly,
    randomized orders aside), so each subtree is a task of its own: two subtrees split the
    sequential work in halves; 2^depth of them repeat part of the top levels' training
    (each feeds 1 - 2^-depth of the rows instead of depth / 2^depth of them).
    """
    plan = []

    def walk(s, e, feed, level):
        if s == e or level >= depth:
            plan.append((s, e, feed))
            return
        m = (s + e) // 2
        walk(s, m, feed + [(m + 1, e)], level + 1)
        walk(m + 1, e, feed + [(s, m)], level + 1)

    walk(0, k - 1, [], 0)
    return plan


def run_subtree(source, budget, ctx: dict, s: int, e: int, feed, seed: int) -> dict:
    """One task of :func:`subtree_plan`, in a process of the local pool or on a Dask worker:
    f_{s..e} built from a fresh model by ``feed``, then Algorithm 1 on folds s..e. Returns
    the folds' losses, predictions and counters for the caller to merge."""
    run = CVRun.for_subtree(source, budget, ctx, seed)
    try:
        model = run.new_model()
        for a, b in feed:
            model = run.feed(model, [(run.bounds[a], run.bounds[b + 1])])
        _tree(run, s, e, model)
        run.drop(model)
    finally:
        run.close()
    ids = np.flatnonzero(run.folds >= 0)
    return dict(s=s, e=e, fold_loss=run.fold_loss[s:e + 1], ids=ids, folds=run.folds[ids],
                pred=None if run.pred is None else run.pred[ids], updates=run.updates,
                max_alive=run.max_alive, rows_read=source.rows_read,
                kernel_subtrees=run.kernel_subtrees, blockwise_phases=run.blockwise_phases)


_WORKER = {}


def _init_worker(ctx):
    _WORKER.clear()
    _WORKER.update(ctx)


def _pool_subtree(s, e, feed, seed):
    """A subtree task in a process of the local pool (forked: arrays are shared, a store is
    reopened by its path under 1/n_jobs of the cap)."""
    ctx = _WORKER
    if ctx["source"] is not None:
        return run_subtree(ctx["source"], MemoryBudget(ctx["limit"]), ctx, s, e, feed, seed)
    from ooc_learn.storage.store import open_store

    with open_store(ctx["store_path"], memory=ctx["limit"], positive=ctx["positive"]) as st:
        return run_subtree(StoreSource(st), st.budget, ctx, s, e, feed, seed)


def _subtree_task(path, positive, ctx, s, e, feed, seed):
    """On a Dask worker: TreeCV's subtree s..e, its model rebuilt from ``feed``."""
    from ooc_learn.distributed import keep_open, task_budget
    from ooc_learn.storage.store import open_store

    keep_open(path)
    with open_store(path, memory=task_budget(), positive=positive) as st:
        return run_subtree(StoreSource(st), st.budget, ctx, s, e, feed, seed)


def tree_subtrees(client, st, ctx: dict, plan, seeds):
    """Yield the results of TreeCV's subtrees ``plan`` (:func:`subtree_plan`), each a task on
    the Dask cluster of ``client``; ``ctx`` holds the learner, metric, k and fold bounds (what
    is shipped besides the store's path: a few numbers and the learner's parameters)."""
    from ooc_learn.distributed import gather, shipped_path

    path = shipped_path(client, st.path)
    args = [(path, getattr(st, "positive", None), ctx, s, e, feed, seed)
            for (s, e, feed), seed in zip(plan, seeds)]
    yield from gather(client, _subtree_task, args)


def _tree_parallel(run: CVRun, data, n_tasks: int, client=None) -> None:
    """The subtrees ceil(log2 n_tasks) levels down as parallel tasks (:func:`subtree_plan`):
    processes of a local pool, or tasks on a Dask cluster (``client``: each opens the store
    by its path on its worker). The non-randomized result equals the sequential one."""
    depth = int(np.ceil(np.log2(n_tasks)))
    plan = subtree_plan(run.k, depth)
    seeds = [int(run.rng.integers(2**31 - 1)) for _ in plan]
    ctx = dict(metric=run.metric, k=run.k, learner=run.learner, randomized=run.randomized,
               bounds=run.bounds)
    if client is not None:
        results = tree_subtrees(client, data, ctx, plan, seeds)
        _merge_subtrees(run, results)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx.update(source=None if run.source.is_store else run.source,
                   store_path=str(data.path) if run.source.is_store else None,
                   positive=getattr(data, "positive", None),
                   limit=max(1, run.budget.limit // n_tasks))
        with ProcessPoolExecutor(n_tasks, mp_context=mp.get_context("fork"),
                                 initializer=_init_worker, initargs=(ctx,)) as pool:
            futures = [pool.submit(_pool_subtree, s, e, feed, seed)
                       for (s, e, feed), seed in zip(plan, seeds)]
            _merge_subtrees(run, (f.result() for f in as_completed(futures)))
    run.n_jobs = n_tasks


def _merge_subtrees(run: CVRun, results) -> None:
    for r in results:
        run.fold_loss[r["s"]:r["e"] + 1] += r["fold_loss"]
        run.folds[r["ids"]] = r["folds"]
        if r["pred"] is not None:
            run._record(r["ids"], r["pred"])
        run.updates += r["updates"]
        run.max_alive += r["max_alive"]  # the tasks run at once
        run.source.rows_read += r["rows_read"]
        run.kernel_subtrees += r["kernel_subtrees"]
        run.blockwise_phases += r["blockwise_phases"]
        if run.bar is not None:
            run.bar.update(r["e"] - r["s"] + 1)


def tree_cv(data, learner, k, randomized: bool = False, seed=0, metric=None, memory=None,
            n_jobs: int = 1, *, shuffle: bool = False, progress: bool = False,
            client=None, _block_rows: int | None = None) -> CVResult:
    """k-fold (or leave-one-out) CV estimate of an incremental learner by TreeCV.

    Parameters
    ----------
    data : Store or (X, y)
        A store (folds follow its blocks) or arrays (dense or scipy sparse).
    learner : IncrementalLearner
        E.g. ``Pegasos(1e-6)``, ``LeastSquaresSGD()``, ``ExactLeastSquares()``,
        ``SklearnPartialFit(est, classes=...)``.
    k : int or "loo"
        Number of folds, 2 <= k <= n; ``"loo"`` (or n) is leave-one-out.
    randomized : bool
        Feed every training phase in a random order (paper sec. 5).
    seed : int or numpy.random.Generator
        Source of every random choice (``randomized`` orders, ``shuffle``).
    metric : str or callable, optional
        Per-row loss; default the learner's (``"error"`` for Pegasos, ``"squared"`` for the
        least-squares learners). A callable gets ``(y, pred)`` and returns per-row losses.
    memory : None, size or MemoryBudget
        Cap for saved models and buffers (default: the store's budget).
    n_jobs : int
        Processes for the top of the tree (sec. 4.1): its subtrees ceil(log2 n_jobs) levels
        down run in parallel, each rebuilding its model from its path; 1 runs everything here.
    client : dask.distributed.Client, optional
        Run those subtrees as tasks on a Dask cluster instead, one per worker thread (a store
        only: each task opens it by its path, which every worker must see). The same
        answer as ``n_jobs`` = that many (and as ``n_jobs=1`` unless ``randomized``).
    shuffle : bool
        Permute array rows (by ``seed``) before cutting folds. Stores are already shuffled
        (rows into blocks at ingest; inside an indexed block that holds several folds, its
        leaf-ordered rows are taken in a fixed random order).
    progress : bool
        A tqdm bar on stderr over the folds scored (with ``n_jobs`` > 1, the folds of the
        part of the tree this process walks).

    Returns
    -------
    CVResult
        ``estimate`` = mean of the per-fold mean losses; ``stats`` has ``updates``,
        ``models_saved_max``, ``rows_read``, ``seconds``.

    Examples
    --------
    >>> import numpy as np
    >>> from ooc_learn.learners import ExactLeastSquares
    >>> X = np.random.default_rng(0).normal(size=(100, 3)); y = X @ [1.0, 2.0, 3.0]
    >>> r = tree_cv((X, y), ExactLeastSquares(1e-8), k=5)
    >>> r.estimate < 1e-6, r.stats["updates"]
    (True, 240)
    """
    t0 = time.perf_counter()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs < 1:
        raise ParameterError(f"The 'n_jobs' parameter of tree_cv must be an int >= 1. Got "
                             f"{n_jobs!r} instead.", "Use n_jobs=1 to run in this process.")
    run = CVRun(data, learner, k, metric=metric, randomized=randomized, seed=seed,
                memory=memory, shuffle=shuffle, caller="tree_cv", block_rows=_block_rows)
    if progress:
        from tqdm.auto import tqdm

        run.bar = tqdm(total=run.k, desc="tree_cv", unit="fold", leave=False)
    try:
        if client is not None:
            if not run.source.is_store:
                raise ParameterError("tree_cv on a Dask cluster (client=) runs on a store: "
                                     "its tasks open it by path; arrays are not shipped.",
                                     "Ingest the arrays (ooc_learn.ingest_arrays) first, or "
                                     "use n_jobs for local processes.")
            from ooc_learn.distributed import n_workers

            _tree_parallel(run, data, max(2, n_workers(client)), client)
        elif n_jobs > 1:
            _tree_parallel(run, data, int(n_jobs))
        else:
            model = run.new_model()
            _tree(run, 0, run.k - 1, model)
            run.drop(model)
    finally:
        if run.bar is not None:
            run.bar.close()
        run.close()
    result = run.result("tree-randomized" if run.randomized else "tree")
    result.stats["seconds"] = time.perf_counter() - t0
    return result
