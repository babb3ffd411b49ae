"""Standard k-fold CV of an incremental learner: k models, each trained from scratch.

The reference TreeCV is compared with (Joulani et al. 2015, sec. 5 "standard method"). Folds and
row-order conventions are TreeCV's (:mod:`ooc_learn.cv.folds`): model i is fed every position
outside fold i in position order (or, ``randomized``, in one uniformly random order), then
scored on fold i. Work: (k - 1) n row updates.
"""

from __future__ import annotations

import time

from .learner_run import CVRun
from .result import CVResult

__all__ = ["kfold_cv"]


def kfold_cv(data, learner, k, randomized: bool = False, seed=0, metric=None, memory=None,
             *, shuffle: bool = False, _block_rows: int | None = None) -> CVResult:
    """Standard k-fold (or leave-one-out) CV estimate: one fresh model per fold.

    Parameters are those of :func:`~ooc_learn.cv.treecv.tree_cv` (same folds for the same
    ``data``, ``k``, ``shuffle`` and ``seed``).

    Examples
    --------
    >>> import numpy as np
    >>> from ooc_learn.learners import ExactLeastSquares
    >>> X = np.random.default_rng(0).normal(size=(100, 3)); y = X @ [1.0, 2.0, 3.0]
    >>> r = kfold_cv((X, y), ExactLeastSquares(1e-8), k=5)
    >>> r.stats["updates"]
    400
    """
    t0 = time.perf_counter()
    run = CVRun(data, learner, k, metric=metric, randomized=randomized, seed=seed,
                memory=memory, shuffle=shuffle, caller="kfold_cv", block_rows=_block_rows)
    try:
        b, n = run.bounds, run.source.n
        for i in range(run.k):
            model = run.new_model()
            model = run.feed(model, [(0, b[i]), (b[i + 1], n)])
            run.leaf(i, model)
            run.drop(model)
    finally:
        run.close()
    result = run.result("standard-randomized" if run.randomized else "standard")
    result.stats["seconds"] = time.perf_counter() - t0
    return result
