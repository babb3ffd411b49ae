"""One cross-validation run of an incremental learner, shared by TreeCV and standard k-fold
CV: :class:`CVRun` holds the row source and its folds, the memory budget the models are
reserved from, the feeding of row ranges to a model (block by block, in position or random
order), the scoring of a fold and the run's counters, and builds the :class:`CVResult`.

How the folds are trained (TreeCV's recursion, or one model per fold) is the caller's:
:mod:`.treecv`, :mod:`.kfold`.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from ooc_learn.storage.arrays import stack_rows
from ooc_learn.storage.budget import MemoryBudget, default_memory_bytes
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.labels import check_two_classes

from ..learners.base import check_metric, kernel_arrays
from ..learners.one_vs_rest import OneVsRest, for_labels
from ._kernels import stack_depth, tree_block
from .folds import check_k, make_source
from .result import CVResult

__all__ = ["CVRun", "is_flat"]


def is_flat(learner) -> bool:
    """Whether the learner's model is a flat numba state, or one per class of such states
    (``OneVsRest``): TreeCV then runs its subtrees in a kernel, class by class."""
    if isinstance(learner, OneVsRest):
        learner = learner.learner
    return getattr(learner, "kernel_kind", -1) >= 0


@functools.lru_cache(maxsize=8)
def _default_cap(env: str | None) -> int:
    # default_memory_bytes() asks psutil for the RAM size on every call: once per OOC_MEMORY value
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
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.source = make_source(data, perm_seed=self.rng if shuffle else None,
                                  block_rows=block_rows, caller=caller)
        if self.source.is_store:
            check_two_classes(data)
        # a learner of +1 / -1 labels on other labels (a multiclass store): a model per class
        learner = for_labels(learner, self.source)
        self.metric = check_metric(learner, metric, caller)
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
        """The run of one subtree task (:func:`~.treecv.run_subtree`): the caller's learner, metric,
        folds and bounds (``ctx``) on ``source`` under ``budget``, with its own counters."""
        run = cls.__new__(cls)
        run.bar, run.source, run.budget = None, source, budget
        run.metric, run.k, run.learner = ctx["metric"], ctx["k"], ctx["learner"]
        run.randomized, run.bounds = ctx["randomized"], ctx["bounds"]
        run.rng = np.random.default_rng(seed)
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
        size = getattr(self.learner, "init_nbytes", None)
        if size is None:
            model = self.learner.init(self.source.d, self.source.n)
            self._hold(model)
            return model
        # reserved before the model is made: one wider than the cap is refused with the
        # figures (exit 2), not allocated (ExactLeastSquares' d^2 floats: 74.5 GiB at
        # d = 100,000, numpy's MemoryError)
        nb = int(size(self.source.d, self.source.n))
        self.budget.reserve(nb, f"model of {self.source.d:,} features ({self.learner!r})",
                            hint="or check the data for a stray large feature index (the "
                                 "store's feature count is its largest index)")
        try:
            model = self.learner.init(self.source.d, self.source.n)
        except BaseException:
            self.budget.release(nb)
            raise
        self._count(nb)
        return model

    def copy(self, model):
        self._hold(model)
        return self.learner.copy(model)

    def _hold(self, model):
        nb = int(self.learner.nbytes(model))
        self.budget.reserve(nb, "TreeCV model copy")
        self._count(nb)
        return nb

    def _count(self, nb: int) -> None:
        """A model of ``nb`` bytes, reserved, is alive."""
        self.reserved += nb
        self.alive += 1
        self.max_alive = max(self.max_alive, self.alive)

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
        """Folds s..e (inside one block) in one numba call, starting from f_{s..e}; one call
        per class for ``OneVsRest`` (the same folds and order, its class's +1 / -1 labels),
        each row then scored by the class of the largest of its held-out decision values."""
        a, b = int(self.bounds[s]), int(self.bounds[e + 1])
        src = self.source
        if src.is_store:
            X, y, ids = src.load(a, b)
            off = a
            yk = np.ascontiguousarray(y, dtype=np.float64)
        else:
            X, y, ids, off, yk = src.X, src.y, src.ids, 0, self.y64()
            src.rows_read += b - a
        ovr = isinstance(self.learner, OneVsRest)
        flat = self.learner.learner if ovr else self.learner
        models = model if ovr else [model]
        signs = self.learner.signs(yk) if ovr else [yk]
        depth = stack_depth(e - s + 1)
        rel = np.ascontiguousarray(self.bounds[s:e + 2] - off, dtype=np.int64)
        seed = int(self.rng.integers(2**31 - 1)) if self.randomized else 0
        Xd, indptr, indices, data, is_csr = kernel_arrays(X)
        outs = []
        for m, yc in zip(models, signs):
            with self.budget.reservation(depth * int(m.nbytes), "TreeCV in-block model stack"):
                states = np.empty((depth, m.shape[0]))
                states[0] = m
                out = np.empty(b - a)
                upd, mm = tree_block(flat.kernel_kind, flat.n_features_of(m), states, Xd,
                                     indptr, indices, data, is_csr, yc, rel, self.randomized,
                                     seed, out)
            outs.append(out)
        out = (self.learner.classes[np.argmax(np.column_stack(outs), axis=1)] if ovr
               else outs[0])
        self.updates += int(upd)  # the rows fed (each class's model is fed the same)
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
        if isinstance(self.learner, OneVsRest):
            stats["one_vs_rest_classes"] = self.learner.classes.tolist()
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
