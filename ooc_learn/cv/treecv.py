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

import functools
import os
import time

import numpy as np

from ooc_learn.storage.budget import MemoryBudget, default_memory_bytes
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.store import stack_rows

from ..learners.base import check_metric, kernel_arrays
from ._kernels import stack_depth, tree_block
from .folds import check_k, make_source
from .result import CVResult

__all__ = ["tree_cv"]


def _is_flat(learner) -> bool:
    return getattr(learner, "kernel_kind", -1) >= 0


@functools.lru_cache(maxsize=8)
def _default_cap(env: str | None) -> int:
    # default_memory_bytes() asks psutil for the RAM size (~0.1 ms): once per OOC_MEMORY value
    return default_memory_bytes()


def _budget(memory) -> MemoryBudget:
    if memory is None:
        return MemoryBudget(_default_cap(os.environ.get("OOC_MEMORY")))
    return MemoryBudget.coerce(memory)


def _metric_name(metric) -> str:
    return metric if isinstance(metric, str) else getattr(metric, "__name__", "custom")


class CVRun:
    """What one CV run shares: the source, folds, budget, feeding, scoring and counters."""

    def __init__(self, data, learner, k, *, metric, randomized, seed, memory, shuffle,
                 caller, block_rows=None):
        self.bar = None  # tree_cv(progress=True): a tqdm bar over the folds scored
        for name in ("init", "update", "predict", "losses"):
            if not callable(getattr(learner, name, None)):
                raise ParameterError(
                    f"The 'learner' parameter of {caller} must implement the incremental "
                    f"learner protocol (init, update, copy, predict, losses, score). "
                    f"{type(learner).__name__} has no {name}().",
                    "Use Pegasos, LeastSquaresSGD, ExactLeastSquares or wrap a scikit-learn "
                    "estimator with SklearnPartialFit.")
        self.metric = check_metric(learner, metric, caller)
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.source = make_source(data, perm_seed=self.rng if shuffle else None,
                                  block_rows=block_rows, caller=caller)
        self.k = check_k(k, self.source.n, caller)
        if memory is None and self.source.is_store:
            self.budget = data.budget
        else:
            self.budget = _budget(memory)
        self.learner = learner
        self.randomized = bool(randomized)
        self.bounds = self.source.fold_bounds(self.k)
        self._start()
        self.store_rows0 = getattr(data, "rows_read", 0) if self.source.is_store else 0

    @classmethod
    def for_subtree(cls, source, budget, ctx: dict, seed: int) -> "CVRun":
        """The run of one subtree task (:func:`run_subtree`): the caller's learner, metric,
        folds and bounds (``ctx``) on ``source`` under ``budget``, with its own counters."""
        run = cls.__new__(cls)
        run.bar, run.source, run.budget = None, source, budget
        run.metric, run.k, run.learner = ctx["metric"], ctx["k"], ctx["learner"]
        run.randomized, run.bounds = ctx["randomized"], ctx["bounds"]
        run.rng = np.random.default_rng(seed)
        if source.is_store:
            source.fold_bounds(run.k)  # the same positions as the caller's (dealt blocks)
        source.rows_read = 0
        run._start()
        return run

    def _start(self) -> None:
        """The run's results and counters, empty."""
        self.fold_loss = np.zeros(self.k)
        self.folds = np.full(self.source.n, -1, dtype=np.int64)
        self.pred = None
        self.updates = 0
        self.alive = 0
        self.max_alive = 0
        self.reserved = 0
        self.kernel_subtrees = 0
        self.blockwise_phases = 0
        self.t0 = time.perf_counter()
        self._y64 = None

    # -- models and the budget ---------------------------------------------------------
    def new_model(self):
        model = self.learner.init(self.source.d, self.source.n)
        self._hold(model)
        return model

    def copy(self, model):
        self._hold(model)
        return self.learner.copy(model)

    def _hold(self, model):
        nb = int(self.learner.nbytes(model))
        self.budget.reserve(nb, "TreeCV model copy")
        self.reserved += nb
        self.alive += 1
        self.max_alive = max(self.max_alive, self.alive)
        return nb

    def drop(self, model):
        nb = int(self.learner.nbytes(model))
        self.budget.release(nb)
        self.reserved -= nb
        self.alive -= 1

    def close(self):
        self.budget.release(self.reserved)
        self.reserved = 0

    # -- training ----------------------------------------------------------------------
    def feed(self, model, ranges):
        """Train ``model`` on position ranges, in order or (randomized) in a random order."""
        ranges = [(int(a), int(b)) for a, b in ranges if b > a]
        total = sum(b - a for a, b in ranges)
        if total == 0:
            return model
        self.updates += total
        src, learner = self.source, self.learner
        if not src.is_store:
            idx = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])
            if self.randomized:
                idx = idx[self.rng.permutation(idx.size)]
            src.rows_read += total
            return learner.update(model, src.X, src.y, order=idx)
        if not self.randomized:
            for a, b in ranges:
                for X, y, _ in src.pieces(a, b):
                    model = learner.update(model, X, y)
            return model
        need = int(total * src.row_bytes())
        if need <= self.budget.available // 2:
            # the whole phase fits: a uniformly random order over all its rows (paper sec. 5)
            with self.budget.reservation(need, "randomized TreeCV training phase"):
                parts = [p for a, b in ranges for p in src.pieces(a, b)]
                X, y = stack_rows([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
                return learner.update(model, X, y, order=self.rng.permutation(total))
        # larger than the cap: blocks in random order, rows in random order within each
        self.blockwise_phases += 1
        segs = [(a0, b0) for a, b in ranges for a0, b0 in _block_segments(src, a, b)]
        for j in self.rng.permutation(len(segs)):
            X, y, _ = src.load(*segs[j])
            model = learner.update(model, X, y, order=self.rng.permutation(X.shape[0]))
        return model

    # -- scoring -----------------------------------------------------------------------
    def _record(self, ids, pred):
        if self.pred is None:
            dtype = pred.dtype if pred.dtype.kind in "biuf" else object
            self.pred = np.zeros(self.source.n, dtype=np.float64 if dtype != object else object)
        self.pred[ids] = pred

    def leaf(self, i, model):
        """Score the model that held fold ``i`` out on fold ``i``."""
        for X, y, ids in self.source.pieces(self.bounds[i], self.bounds[i + 1]):
            pred = np.asarray(self.learner.predict(model, X))
            self.fold_loss[i] += float(self.learner.losses(y, pred, self.metric).sum())
            self.folds[ids] = i
            self._record(ids, pred)
        if self.bar is not None:
            self.bar.update(1)

    def y64(self):
        if self._y64 is None:
            self._y64 = np.ascontiguousarray(self.source.y, dtype=np.float64)
        return self._y64

    def kernel_subtree(self, s, e, model):
        """Folds s..e (inside one block) in one numba call, starting from f_{s..e}."""
        a, b = int(self.bounds[s]), int(self.bounds[e + 1])
        src = self.source
        if src.is_store:
            X, y, ids = src.load(a, b)
            off = a
            yk = np.ascontiguousarray(y, dtype=np.float64)
        else:
            X, y, ids, off, yk = src.X, src.y, src.ids, 0, self.y64()
            src.rows_read += b - a
        depth = stack_depth(e - s + 1)
        nb = depth * int(model.nbytes)
        with self.budget.reservation(nb, "TreeCV in-block model stack"):
            states = np.empty((depth, model.shape[0]))
            states[0] = model
            rel = np.ascontiguousarray(self.bounds[s:e + 2] - off, dtype=np.int64)
            out = np.empty(b - a)
            seed = int(self.rng.integers(2**31 - 1)) if self.randomized else 0
            Xd, indptr, indices, data, is_csr = kernel_arrays(X)
            upd, mm = tree_block(self.learner.kernel_kind, self.learner.n_features_of(model),
                                 states, Xd, indptr, indices, data, is_csr, yk, rel,
                                 self.randomized, seed, out)
        self.updates += int(upd)
        self.kernel_subtrees += 1
        self.max_alive = max(self.max_alive, self.alive + int(mm))
        ys = y[a - off:b - off]
        losses = self.learner.losses(ys, out, self.metric)
        self.fold_loss[s:e + 1] += np.add.reduceat(losses, rel[:-1] - rel[0])
        row_ids = ids[a - off:b - off]
        self.folds[row_ids] = np.repeat(np.arange(s, e + 1), np.diff(rel))
        self._record(row_ids, out)
        if self.bar is not None:
            self.bar.update(e - s + 1)

    def in_one_block(self, s, e) -> bool:
        a, b = self.bounds[s], self.bounds[e + 1] - 1
        offs = self.source.block_offsets
        return np.searchsorted(offs, a, side="right") == np.searchsorted(offs, b, side="right")

    # -- result ------------------------------------------------------------------------
    def result(self, method: str) -> CVResult:
        sizes = np.diff(self.bounds)
        fold_scores = self.fold_loss / sizes
        stats = {"k": self.k, "n": int(self.source.n), "updates": int(self.updates),
                 "models_saved_max": int(self.max_alive), "rows_read": int(self.source.rows_read),
                 "seconds": time.perf_counter() - self.t0}
        if self.source.is_store:
            # rows that came from disk (the rest were hits in the store's block cache)
            stats["store_rows_read"] = int(self.source.store.rows_read - self.store_rows0)
        if self.kernel_subtrees:
            stats["kernel_subtrees"] = self.kernel_subtrees
        if self.blockwise_phases:
            stats["blockwise_randomized_phases"] = self.blockwise_phases
        return CVResult(estimate=float(fold_scores.mean()), fold_scores=fold_scores,
                        metric=_metric_name(self.metric), method=method, folds=self.folds,
                        predictions=self.pred, stats=stats)


def _block_segments(src, a, b):
    offs = src.block_offsets
    blk = int(np.searchsorted(offs, a, side="right") - 1)
    while a < b:
        end = min(b, int(offs[blk + 1]))
        if end > a:
            yield a, end
        a = end
        blk += 1


def _tree(run: CVRun, s: int, e: int, model) -> None:
    """Algorithm 1 from (s, e, f_{s..e}); the right branch is a loop (tail call)."""
    learner, bounds = run.learner, run.bounds
    save_revert = hasattr(learner, "save") and hasattr(learner, "revert")
    while True:
        if s == e:
            run.leaf(s, model)
            return
        if _is_flat(learner) and run.in_one_block(s, e):
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

    from .folds import StoreSource

    with open_store(ctx["store_path"], memory=ctx["limit"], positive=ctx["positive"]) as st:
        return run_subtree(StoreSource(st), st.budget, ctx, s, e, feed, seed)


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
        from ooc_learn.distributed import tree_subtrees

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
