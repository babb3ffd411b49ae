"""K-fold cross-validation of the linear SVM ``ooc-train`` trains, out of core.

Each fold trains the same solver (IBCD, streamed dual CD or block minimisation) with the same
loss, C, bias, truncation and memory cap as ``ooc-train`` would, on the store's rows minus one
fold, and scores it on that fold. Where the store has at least k blocks, a fold is a group of
whole blocks (:func:`~ooc_learn.cv.folds.store_fold_bounds`): ingest shuffled the rows into
blocks, so a fold is a random part of the rows, and holding one out skips its blocks. Where
a block must hold several folds, its rows go to them at random (:func:`fold_plan`), not as
contiguous ranges: an indexed store keeps each block's rows in the metric tree's leaf order,
so a range is a cluster of similar rows (ijcnn1, one block, 5 contiguous folds: CV accuracy
89.3 % against LIBLINEAR's 92.4 %; random within the block: the same as LIBLINEAR's).

Folds are solved one after the other, each warm-started from the previous fold's solution:
between fold i-1 and fold i only the rows of those two folds change hands (fold i's rows
leave, fold i-1's join), so the dual solution of fold i-1 with fold i's rows taken out is
close to fold i's (the warm start of the alpha-seeding CV of kernel SVMs, applied to the
linear dual). For the dual CD solvers the state is alpha over all rows and w: fold i's rows
have their alpha zeroed and their contribution subtracted from w
(:func:`~ooc_learn.solvers.dcd.drop_rows`). For IBCD it is the previous fold's support vectors
and their alpha outside fold i, which start S in place of w_0's random sample.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .folds import check_k, store_fold_bounds
from .result import CVResult

__all__ = ["linear_cv", "linear_cv_grid", "linear_c_search", "fold_plan", "fold_chains",
           "fold_path", "cross_validate", "FoldTask", "LINEAR_CV_SOLVERS"]

LINEAR_CV_SOLVERS = ("ibcd", "dcd", "bm")


def linear_cv(store, k, *, solver: str | None = None, loss: str | None = None, C: float = 1.0,
           s: float | None = None, bias: float = 1.0, eps: float = 0.1, max_outer: int = 10,
           block_size: int = 1000, block_solver: str = "dual", init_sample: int = 10000,
           sample_eps: float = 0.0, seed: int = 0, memory=None, spill_dir=None,
           warm_start: bool = True, on_fold=None, epsilon: float = 0.0,
           n_jobs: int = 1, client=None) -> CVResult:
    """K-fold CV accuracy of a linear SVM on a binary store (see the module docstring).

    Parameters
    ----------
    store : Store or path
    k : int
        Folds (2 <= k <= rows). Leave-one-out of a linear SVM this way would be n solves: use
        TreeCV of an incremental learner, or the kernel SVM's exact LOO, for that.
    solver, loss, C, s, bias, eps, max_outer, block_size, block_solver, init_sample,
    sample_eps, seed, memory, spill_dir
        As for :func:`ooc_learn.train` (``solver`` one of ``"ibcd"``, ``"dcd"``, ``"bm"``).
    warm_start : bool
        Start each fold from the previous fold's solution (default); False solves every
        fold from scratch (the reference the warm start is measured against).
    n_jobs : int
        The dual CD solvers (dcd, bm, SVR): run this many folds at once in threads (each
        from scratch, warm along a list of C); IBCD and least squares run one at a time.
    on_fold : callable, optional
        ``on_fold(info)`` after each fold, ``info`` the fold's entry of ``stats["folds"]``.
    client : dask.distributed.Client, optional
        Run the folds (a multiclass store: the classes) as tasks on this Dask cluster: each
        opens the store by its path (which the workers must see) and reads only what its
        fold needs, under a cap from its worker's memory limit. Folds then start from
        scratch at the first C, as with ``n_jobs``; the results equal that local run's.

    Returns
    -------
    CVResult
        ``estimate`` the accuracy over all rows (each scored by the model that held it out),
        ``fold_scores`` each fold's accuracy, ``folds`` / ``predictions`` the fold and the
        decision value of each row (store row order), and in ``stats`` per fold: rows,
        accuracy, seconds, rows read, outer iterations, objective, support vectors.

    Examples
    --------
    >>> res = linear_cv("train.store", 5, solver="ibcd", C=1.0)   # doctest: +SKIP
    >>> res.estimate, res.fold_scores                          # doctest: +SKIP
    """
    return linear_cv_grid(store, k, [C], solver=solver, loss=loss, s=s, bias=bias, eps=eps,
                       max_outer=max_outer, block_size=block_size, block_solver=block_solver,
                       init_sample=init_sample, sample_eps=sample_eps, seed=seed,
                       memory=memory, spill_dir=spill_dir, warm_start=warm_start,
                       on_fold=on_fold, epsilon=epsilon, n_jobs=n_jobs, client=client,
                       caller="linear_cv")[0]


def linear_cv_grid(store, k, Cs, *, solver: str | None = None, loss: str | None = None,
                s: float | None = None, bias: float = 1.0, eps: float = 0.1,
                max_outer: int = 10, block_size: int = 1000, block_solver: str = "dual",
                init_sample: int = 10000, sample_eps: float = 0.0, seed: int = 0,
                memory=None, spill_dir=None, warm_start: bool = True, on_fold=None,
                epsilon: float = 0.0, n_jobs: int = 1, client=None,
                caller: str = "linear_cv_grid") -> list[CVResult]:
    """:func:`linear_cv` at each C of ``Cs``, one :class:`CVResult` each, in ascending C.

    The same folds serve every C; fold i at each C is warm-started from fold i at the next
    smaller C (the regularization path of LIBLINEAR's ``-C``), and fold i at the smallest C
    from fold i-1 there. The result of each C holds its own seconds and rows read.

    A multiclass store is cross-validated one-vs-rest (accuracy of the class of the largest
    value); a regression store by the RMSE of least squares or SVR (``loss``, ``epsilon``:
    as :func:`ooc_learn.train`), least squares by the normal equations from one pass with
    a Gram matrix per fold (any number of C from the same pass).
    """
    from ooc_learn.training import open_data, regression_solver

    Cs = sorted(float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else c
                for c in _as_list(Cs, caller))
    if len(set(Cs)) != len(Cs):
        raise ParameterError(f"The Cs of {caller} must differ. Got {Cs!r}.",
                             "List each C once.")
    if not (isinstance(sample_eps, (int, float)) and 0 <= sample_eps < 1):
        raise ParameterError(f"The 'sample_eps' parameter of {caller} must be in [0, 1). Got "
                             f"{sample_eps!r} instead.", "0 disables the sampled rule.")
    if not (isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs >= 1):
        raise ParameterError(f"The 'n_jobs' parameter of {caller} must be an int >= 1. Got "
                             f"{n_jobs!r} instead.", "1 runs the folds one after another.")
    st, opened = open_data(store, memory)
    try:
        _check_task(st, caller)
        if isinstance(k, str) and k.lower() == "loo":
            raise ParameterError(
                "Leave-one-out of the linear SVM would train one model per row.",
                "Use --cv K with K folds, or TreeCV (--cv-method tree) for leave-one-out.")
        n = st.n_samples
        k = check_k(k, n, caller)
        if k > max(n // 2, st.n_blocks):
            raise ParameterError(
                f"{k} folds of {n} rows leave about {n / k:.1f} rows a fold; each fold is a "
                "full SVM solve.", "Use k <= 20, or TreeCV (--cv-method tree) for many folds.")
        if st.task == "regression" and regression_solver(
                st, solver, "squared_epsilon_insensitive" if loss is None else loss,
                epsilon) == "exact":
            for C in Cs:  # the checks of train_regression, before any work
                _check_cost(C, caller)
            return _cross_validate_exact(st, k, Cs=Cs, bias=bias, on_fold=on_fold, seed=seed)
        task = FoldTask(st, Cs, solver=solver, loss=loss, s=s, bias=bias, eps=eps,
                         max_outer=max_outer, block_size=block_size,
                         block_solver=block_solver, init_sample=init_sample,
                         sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                         epsilon=epsilon, caller=caller)
        if st.task == "multiclass":
            return _cross_validate_ovr(st, k, task=task, warm_start=warm_start,
                                       on_fold=on_fold, n_jobs=n_jobs, client=client)
        return cross_validate(st, k, task=task, warm_start=warm_start, on_fold=on_fold,
                               n_jobs=n_jobs, client=client)
    finally:
        if opened:
            st.close()


def _check_cost(C, caller: str) -> None:
    if not (isinstance(C, (int, float)) and C > 0 and math.isfinite(C)):
        raise ParameterError(f"The Cs of {caller} must be > 0. Got {C!r}.",
                             "C is the cost; try 1.")


class FoldTask:
    """What every fold of a CV run solves and how it is scored: the solver and its
    parameters (checked before any work), resolved from the store's task; :meth:`solve`
    trains fold i at C from a warm start and scores it."""

    def __init__(self, st, Cs, *, solver, loss, s, bias, eps, max_outer, block_size,
                 block_solver, init_sample, sample_eps, seed, spill_dir, epsilon, caller):
        from ooc_learn.training import (_check, _model_state_bytes, _run, regression_solver,
                                        train_regression)

        # what rebuilds this task on another view or in a Dask worker (plain values only)
        self.params = dict(solver=solver, loss=loss, s=s, bias=bias, eps=eps,
                           max_outer=max_outer, block_size=block_size,
                           block_solver=block_solver, init_sample=init_sample,
                           sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                           epsilon=epsilon, caller=caller)
        self.st, self.Cs, self.bias, self.seed = st, list(Cs), bias, seed
        self.block_solver, self.init_sample = block_solver, init_sample
        self.regression = st.task == "regression"
        self.metric = "rmse" if self.regression else "accuracy"
        if self.regression:
            for C in Cs:
                _check_cost(C, caller)
            loss = "squared_epsilon_insensitive" if loss is None else loss
            self.solver = regression_solver(st, "dcd" if solver in (None, "exact") else solver,
                                            loss, epsilon)

            def run(st_, *, C, holdout, warm, reference=None):
                return train_regression(st_, solver="dcd", loss=loss, C=C, epsilon=epsilon,
                                        bias=bias, eps=eps, max_outer=max_outer, seed=seed,
                                        holdout=holdout, warm=warm, s=s, stats_only=True,
                                        reference=reference)
            self.run = run
            self.state_bytes = 16 * (st.n_features + 1)
        else:
            self.solver = "ibcd" if solver is None else solver
            loss = "hinge" if loss is None else loss
            if self.solver not in LINEAR_CV_SOLVERS:
                raise ParameterError(
                    f"The 'solver' parameter of {caller} must be one of "
                    f"{', '.join(LINEAR_CV_SOLVERS)}. Got {self.solver!r} instead.",
                    "PEGASOS and the other incremental learners are cross-validated by "
                    "tree_cv.")
            for C in Cs:
                _check(self.solver, loss, C, s, bias, eps, max_outer, block_size)
            if epsilon != 0.0:
                raise ParameterError("epsilon is the insensitive zone of regression; "
                                     f"{st.path} holds a {st.task} task.", "Drop --epsilon.")
            params = dict(solver=self.solver, loss=loss, s=s, eps=eps, max_outer=max_outer,
                          block_size=block_size, block_solver=block_solver,
                          init_sample=init_sample, sample_eps=sample_eps, seed=seed,
                          spill_dir=spill_dir, epochs=1, on_outer=None, bias=bias)

            def run(st_, *, C, holdout, warm, reference=None):
                return _run(st_, C=C, holdout=holdout, warm=warm, **params)
            self.run = run
            self.state_bytes = _model_state_bytes(self.solver, block_solver, st.n_features)
        self.dual = self.solver in ("dcd", "bm")

    def on(self, st):
        """The same task on another view of the store (one class against the rest)."""
        other = object.__new__(FoldTask)
        other.__dict__.update(self.__dict__, st=st)
        return other

    def solve(self, folds, contiguous, i, C, warm, decision, reference=None):
        """Fold i at C from ``warm``: ``(stats, score, entry)``; its rows' decision values
        go into ``decision``. The dual solvers update ``warm`` in place."""
        st = self.st
        f0, fr0 = time.perf_counter(), st.rows_read
        a, z, holdout = _fold(folds, contiguous, i)
        mask = None if contiguous else holdout
        size = int(z - a) if contiguous else int(mask.sum())
        stats = self.run(st, C=C, holdout=holdout, warm=warm, reference=reference)
        score = _score_fold(st, np.array(stats["w"], dtype=np.float64), self.bias, a, z, mask,
                            size, self.regression, decision)
        entry = {"fold": i, "C": C, "rows": size, self.metric: score,
                 "seconds": time.perf_counter() - f0, "rows_read": st.rows_read - fr0,
                 "outer_iterations": stats.get("outer_iterations"),
                 "objective": stats.get("objective"), "n_sv": stats.get("n_sv")}
        return stats, score, entry

    def result(self, C, scores, sizes, folds, decision, logs, method, **stats):
        """The CVResult of one C from its fold scores (RMSE: over all rows, not averaged)."""
        n = int(sizes.sum())
        estimate = (math.sqrt((scores ** 2 * sizes).sum() / n) if self.regression
                    else float((scores * sizes).sum() / n))
        base = {"k": len(scores), "n": n, "solver": self.solver, "C": C,
                "rows_read": int(sum(e["rows_read"] for e in logs)),
                "seconds": float(sum(e["seconds"] for e in logs))}
        return CVResult(estimate=estimate, fold_scores=scores, metric=self.metric,
                        method=method, folds=folds, predictions=decision,
                        stats=dict(base, **stats, folds=logs))


def _check_task(st, caller: str) -> None:
    if st.task not in ("binary", "multiclass", "regression"):
        raise ParameterError(f"{caller} cross-validates binary, multiclass and regression "
                             f"stores; {st.path} holds a {st.task} task.",
                             "Re-ingest it with --task.")


def _as_list(Cs, caller):
    try:
        Cs = list(Cs)
    except TypeError:
        raise ParameterError(f"The 'Cs' parameter of {caller} must be a list of costs. Got "
                             f"{Cs!r} instead.", "Pass e.g. [0.01, 0.1, 1, 10].") from None
    if not Cs:
        raise ParameterError(f"The 'Cs' parameter of {caller} is empty.",
                             "Pass e.g. [0.01, 0.1, 1, 10].")
    return Cs


def fold_plan(block_offsets, k: int, seed: int = 0):
    """``(folds, contiguous)``: the fold of each store row (int32) and whether every fold is
    a contiguous range (k <= blocks: whole blocks). Otherwise each block's rows are dealt to
    its folds (sizes as :func:`~ooc_learn.cv.folds.store_fold_bounds`) in a random order."""
    bounds = store_fold_bounds(block_offsets, k)
    folds = np.repeat(np.arange(k, dtype=np.int32), np.diff(bounds))
    off = np.asarray(block_offsets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    contiguous = True
    for b in range(off.size - 1):
        lo, hi = int(off[b]), int(off[b + 1])
        if hi > lo and folds[lo] != folds[hi - 1]:
            folds[lo:hi] = rng.permutation(folds[lo:hi])
            contiguous = False
    return folds, contiguous


def _fold(folds, contiguous: bool, i: int):
    """``(start, stop, holdout)`` of fold i: its span and a range or a row mask."""
    if contiguous:
        idx = np.flatnonzero(folds == i)
        a, z = int(idx[0]), int(idx[-1]) + 1
        return a, z, (a, z)
    mask = folds == i
    idx = np.flatnonzero(mask)
    return int(idx[0]), int(idx[-1]) + 1, mask


def fold_path(task, folds, contiguous: bool, i: int, head, *, warm_start: bool, decision,
               fold_scores, logs, references: dict, on_fold=None):
    """Fold i at every C of ``task`` (ascending): its scores, log entries and its rows'
    decision values go into ``fold_scores[:, i]``, ``logs[j][i]`` and ``decision``. ``head``:
    fold i-1 at C_1 (None: from scratch). Returns fold i at C_1, the next fold's head."""
    from ooc_learn.solvers.dcd import drop_rows

    st, dual, regression = task.st, task.dual, task.regression
    n, d = st.n_samples, st.n_features
    if dual and warm_start and head is not None:
        a, z, holdout = _fold(folds, contiguous, i)
        drop_rows(st.read_range, a, z, head[0], head[1], task.bias, signed=regression,
                  mask=None if contiguous else holdout, block_offsets=st.block_offsets)
    if dual and warm_start and head is None:
        head = (np.zeros(n), np.zeros(d + 1))
    warm = head if warm_start else None
    for j, C in enumerate(task.Cs):
        if dual and warm_start and j == 1:
            # the C path goes on from a copy: head stays fold i at C_1 for fold i+1
            warm = (head[0].copy(), head[1].copy())
        stats, fold_scores[j, i], logs[j][i] = task.solve(
            folds, contiguous, i, C, warm, decision[j], references.get(C))
        if regression and C not in references and "reference" in stats:
            references[C] = stats["reference"]
        if warm_start and not dual:
            warm = stats["warm"]
            if j == 0:
                head = warm
        if on_fold is not None:
            on_fold(logs[j][i])
    return head if warm_start else None


def cross_validate(st, k, *, task, warm_start, on_fold, n_jobs=1,
                    client=None) -> list[CVResult]:
    """One CVResult per C of ``task.Cs`` (ascending). Folds outside, Cs inside: fold i at C_j
    starts from fold i at C_(j-1) (alpha <= C_(j-1) < C_j is feasible, LIBLINEAR -C's path),
    fold i at C_1 from fold i-1 at C_1; so two states live at once, not one per fold.
    Regression (SVR's dual: beta signed, no labels in w): each C's folds stop relative to
    the first violation of that C's first solve. ``n_jobs`` > 1 (the dual CD solvers): the
    folds are cut into that many runs of consecutive folds (:func:`fold_chains`), run in
    threads (the kernels release the GIL); within a run each fold starts from the one before,
    the first from scratch; one state per run. ``client`` (a ``dask.distributed.Client``):
    the same runs, one per worker thread, each a task on the cluster, every solver (IBCD too:
    a worker is its own process); the same answer as ``n_jobs`` = that many."""
    t0 = time.perf_counter()
    n = st.n_samples
    rows0, bytes0 = st.rows_read, st.bytes_read
    dual, Cs = task.dual, task.Cs
    jobs = max(1, min(int(n_jobs), k)) if dual else 1
    if client is not None:
        from ooc_learn.distributed import n_workers

        jobs = max(1, min(n_workers(client), k))
    m = len(Cs)
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

        def chain(ids):
            """Folds ``ids`` in turn, each warm-started from the one before (the first from
            scratch)."""
            head = None
            for i in ids:
                head = fold_path(task, folds, contiguous, int(i), head,
                                  warm_start=warm_start, decision=decision,
                                  fold_scores=fold_scores, logs=logs, references=references,
                                  on_fold=on_fold)

        chains = fold_chains(k, jobs)
        if client is not None:  # each chain of folds a task on the cluster
            from ooc_learn.distributed import cv_folds

            cv_folds(client, st, task, k, warm_start, chains, folds, decision, fold_scores,
                     logs, on_fold)
        elif jobs == 1:
            chain(chains[0])
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                for f in [pool.submit(chain, ids) for ids in chains]:
                    f.result()
        sizes = np.bincount(folds, minlength=k)
        method = f"{task.solver}-warm" if warm_start else task.solver
        out = [task.result(C, fold_scores[j], sizes, folds, decision[j], logs[j], method,
                           warm_start=warm_start, jobs=jobs) for j, C in enumerate(Cs)]
        if m == 1:
            out[0].stats.update(rows_read=st.rows_read - rows0,
                                bytes_read=st.bytes_read - bytes0,
                                seconds=time.perf_counter() - t0)
    return out


def fold_chains(k: int, jobs: int) -> list[list[int]]:
    """The folds 0..k-1 cut into ``jobs`` runs of consecutive folds (sizes differing by at
    most one), run side by side; within a run each fold starts from the one before, as all
    of them do one after another (``jobs`` = 1). 5 folds, 2 runs: [0, 1, 2], [3, 4]."""
    return [list(map(int, ids)) for ids in np.array_split(np.arange(k), max(1, min(jobs, k)))]


def _cross_validate_exact(st, k, *, Cs, bias, on_fold, seed=0) -> list[CVResult]:
    """Least squares, every fold and every C from one pass: a Gram matrix per fold
    (:func:`~ooc_learn.solvers.least_squares.fold_grams`); fold f's model solves with the
    sum of the others'. A second pass scores each fold's rows."""
    from ooc_learn.solvers.least_squares import (fold_grams, gram_bytes,
                                                 solve_normal_equations)

    t0 = time.perf_counter()
    n, d, m = st.n_samples, st.n_features, len(Cs)
    rows0, bytes0 = st.rows_read, st.bytes_read
    with st.budget.reservation(gram_bytes(d, k + 1) + 5 * n + 8 * m * n,
                               f"normal equations of {k} folds ((d+1)^2 Gram matrices of "
                               f"{d:,} features, each row's fold and predictions)",
                               hint="or cross-validate with --solver dcd (no Gram matrix)"):
        folds, contiguous = fold_plan(st.block_offsets, k, seed)
        sizes = np.bincount(folds, minlength=k)
        G, b = fold_grams(st, folds, k, bias=bias)
        Gt, bt = G.sum(axis=0), b.sum(axis=0)
        decision = np.empty((m, n))
        sse = np.zeros((m, k))
        logs = [[] for _ in range(m)]
        for i in range(k):
            a, z, holdout = _fold(folds, contiguous, i)
            f0 = time.perf_counter()
            W = [solve_normal_equations(Gt - G[i], bt - b[i], C) for C in Cs]
            for X, y, pos in _pieces(st, a, z, None if contiguous else holdout):
                yf = np.asarray(y, dtype=np.float64)
                for j, w in enumerate(W):
                    dv = _decision(X, w, bias)
                    decision[j, pos] = dv
                    sse[j, i] += float((yf - dv) @ (yf - dv))
            for j, C in enumerate(Cs):
                entry = {"fold": i, "C": C, "rows": int(sizes[i]),
                         "rmse": math.sqrt(sse[j, i] / sizes[i]),
                         "seconds": (time.perf_counter() - f0) / m, "outer_iterations": 1}
                logs[j].append(entry)
                if on_fold is not None:
                    on_fold(entry)
    total = time.perf_counter() - t0
    out = []
    for j, C in enumerate(Cs):
        out.append(CVResult(
            estimate=math.sqrt(sse[j].sum() / n), fold_scores=np.sqrt(sse[j] / sizes),
            metric="rmse", method="exact", folds=folds, predictions=decision[j],
            stats={"k": k, "n": n, "solver": "exact", "C": C, "warm_start": False,
                   "seconds": total / m, "rows_read": (st.rows_read - rows0) // m,
                   "folds": logs[j]}))
    if m == 1:
        out[0].stats.update(rows_read=st.rows_read - rows0, bytes_read=st.bytes_read - bytes0,
                            seconds=total)
    return out


def _cross_validate_ovr(st, k, *, task, n_jobs=1, client=None, **params) -> list[CVResult]:
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
            from ooc_learn.distributed import cv_classes

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


def _score_fold(st, w, bias, a, z, mask, size, regression, decision) -> float:
    """The fold's accuracy (regression: RMSE) of the model w; its rows' decision values go
    into ``decision`` (indexed by store row)."""
    right = sse = 0.0
    for X, y, pos in _pieces(st, a, z, mask):
        dv = _decision(X, w, bias)
        decision[pos] = dv
        if regression:
            r = np.asarray(y, dtype=np.float64) - dv
            sse += float(r @ r)
        else:
            right += int(np.count_nonzero((dv > 0) == (np.asarray(y) > 0)))
    return math.sqrt(sse / size) if regression else right / size


def linear_c_search(store, k, *, C_min: float | None = None, C_max: float = 1024.0,
                 factor: float = 2.0, patience: int = 3, min_delta: float = 1e-3,
                 solver: str | None = None,
                 loss: str | None = None, s: float | None = None, bias: float = 1.0,
                 eps: float = 0.1, max_outer: int = 10, block_size: int = 1000,
                 block_solver: str = "dual", init_sample: int = 10000,
                 sample_eps: float = 0.0, seed: int = 0, memory=None, spill_dir=None,
                 epsilon: float = 0.0, on_fold=None) -> list[CVResult]:
    """Search C by K-fold CV along a path (LIBLINEAR ``-C``'s way): from ``C_min`` (default
    LIBLINEAR's start for the L2 loss, 1 / (2 n max |x_i|^2) rounded down to a power of 2)
    multiply C by ``factor`` until ``C_max`` or until the CV score has not improved by more
    than ``min_delta`` (accuracy; regression: relative RMSE) for ``patience`` values in a row
    (counted from the first C that beats the smallest C's score: below it every model is the
    trivial one). Fold i at each C starts from fold i at the previous C (the
    dual solution stays feasible as C grows), so K solutions are kept (the dual solvers: K
    alpha vectors, paid from the budget). Returns one :class:`CVResult` per C tried, in
    order; the best is the most accurate (regression: the lowest RMSE), the smallest C of
    equals. Binary, multiclass (one-vs-rest at each C, without the warm start along C) and
    regression stores (least squares by the dual: use :func:`linear_cv_grid` for the exact
    solver's one-pass grid)."""
    from ooc_learn.training import open_data

    if not (isinstance(factor, (int, float)) and factor > 1):
        raise ParameterError(f"The 'factor' of linear_c_search must be > 1. Got {factor!r}.",
                             "LIBLINEAR doubles C: 2.")
    if not (isinstance(patience, int) and patience >= 1):
        raise ParameterError(f"The 'patience' of linear_c_search must be an int >= 1. Got "
                             f"{patience!r}.", "Try 3.")
    st, opened = open_data(store, memory)
    try:
        _check_task(st, "linear_c_search")
        n, d = st.n_samples, st.n_features
        k = check_k(k, n, "linear_c_search")
        regression = st.task == "regression"
        if C_min is None:
            top = float(np.max(st.sqnorms())) + bias * bias if n else 1.0
            C_min = 2.0 ** math.floor(math.log2(1.0 / (2 * n * max(top, 1e-300))))
        if not (isinstance(C_min, (int, float)) and 0 < C_min <= C_max):
            raise ParameterError(f"C_min must be in (0, C_max = {C_max:g}]. Got {C_min!r}.",
                                 "Leave it out for LIBLINEAR's start.")
        stop = _SearchStop(regression, patience, min_delta)
        if st.task == "multiclass":
            # one-vs-rest at each C of the path, the folds of each C from scratch
            out, C = [], float(C_min)
            while C <= C_max * (1 + 1e-12):
                out += linear_cv_grid(st, k, [C], solver=solver, loss=loss, s=s, bias=bias,
                                      eps=eps, max_outer=max_outer, block_size=block_size,
                                      block_solver=block_solver, init_sample=init_sample,
                                      sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                                      on_fold=on_fold, caller="linear_c_search")
                if stop(out[-1].estimate):
                    break
                C *= factor
            return out
        task = FoldTask(st, [C_min], solver=solver, loss=loss, s=s, bias=bias, eps=eps,
                         max_outer=max_outer, block_size=block_size,
                         block_solver=block_solver, init_sample=init_sample,
                         sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                         epsilon=epsilon, caller="linear_c_search")
        # a fold's warm start: the dual solvers' alpha and w, IBCD's support vectors
        state = (8 * n + 8 * (d + 1)) if task.dual else 16 * n
        with st.budget.reservation(k * state + 12 * n, f"the C search's {k} warm starts and "
                                   "each row's fold and decision value"):
            folds, contiguous = fold_plan(st.block_offsets, k, seed)
            sizes = np.bincount(folds, minlength=k)
            states = [None] * k
            out, C = [], float(C_min)
            while C <= C_max * (1 + 1e-12):
                t0, r0 = time.perf_counter(), st.rows_read
                decision = np.empty(n)
                scores, log = np.empty(k), []
                for i in range(k):
                    warm = states[i]
                    if task.dual and warm is None:
                        warm = (np.zeros(n), np.zeros(d + 1))
                    stats, scores[i], entry = task.solve(folds, contiguous, i, C, warm,
                                                         decision)
                    states[i] = warm if task.dual else stats["warm"]
                    log.append(entry)
                    if on_fold is not None:
                        on_fold(entry)
                out.append(task.result(C, scores, sizes, folds, decision, log,
                                       f"{task.solver}-c-search", warm_start=True,
                                       seconds=time.perf_counter() - t0,
                                       rows_read=st.rows_read - r0))
                if stop(out[-1].estimate):
                    break
                C *= factor
        return out
    finally:
        if opened:
            st.close()


class _SearchStop:
    """The C search's stopping rule: called with each C's CV score, True once the score has
    not gained more than ``min_delta`` (regression: relatively, lower is better) for
    ``patience`` Cs in a row. The smallest Cs give the trivial model (every row the
    majority class, or the mean) whatever C: patience counts from the first C that beats
    the first score."""

    def __init__(self, regression: bool, patience: int, min_delta: float):
        self.regression, self.patience, self.min_delta = regression, patience, min_delta
        self.best, self.since, self.calls, self.moved = None, 0, 0, False

    def __call__(self, score: float) -> bool:
        self.calls += 1
        best = self.best
        if self.regression:
            gained = best is None or score < best * (1 - self.min_delta)
            record = best is None or score < best
        else:
            gained = best is None or score > best + self.min_delta
            record = best is None or score > best
        self.moved = self.moved or (self.calls > 1 and gained)
        self.since = 0 if gained else self.since + int(self.moved)
        if record:
            self.best = score
        return self.since >= self.patience


def _pieces(st, a: int, z: int, mask=None):
    """``(X, y, positions)`` for the store rows a:z (those of ``mask`` among them), one
    block's part at a time."""
    off = np.asarray(st.block_offsets, dtype=np.int64)
    b = int(np.searchsorted(off, a, side="right") - 1)
    lo = a
    while lo < z:
        hi = min(z, int(off[b + 1]))
        if mask is None:
            X, y = st.read_range(lo, hi, ids=False)[:2]
            yield X, y, np.arange(lo, hi)
        else:
            sel = np.flatnonzero(mask[lo:hi])
            if sel.size:
                s0, s1 = lo + int(sel[0]), lo + int(sel[-1]) + 1
                X, y = st.read_range(s0, s1, ids=False)[:2]
                local = sel - (s0 - lo)
                yield X[local], np.asarray(y)[local], lo + sel
        lo, b = hi, b + 1


def _decision(X, w, bias) -> np.ndarray:
    return np.asarray(X @ w[:-1]).ravel() + w[-1] * bias
