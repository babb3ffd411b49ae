"""K-fold cross-validation of the linear SVM ``ooc-train`` trains, out of core:
:func:`linear_cv` and :func:`linear_cv_grid`, the entry points.

Each fold trains the same solver (IBCD, streamed dual CD or block minimisation) with the same
loss, C, bias, truncation and memory cap as ``ooc-train`` would, on the store's rows minus one
fold, and scores it on that fold. The parts, each in its own module:

- the folds of a store and a fold's rows (:mod:`.linear_folds`);
- what a fold solves, warm-started from the fold before and along the Cs (:mod:`.fold_task`);
- every fold at every C, in turn, in threads or on a Dask cluster (:mod:`.fold_runs`);
- a multiclass store, one class against the rest at a time (:mod:`.one_vs_rest`);
- the search for C along a path (:mod:`.c_search`).

Least squares is cross-validated here, from one pass: a Gram matrix per fold.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.labels import check_two_classes

from .fold_runs import cross_validate
from .fold_task import FoldTask, check_cost
from .folds import check_k
from .linear_folds import decision_values, fold_plan, fold_rows, fold_span
from .one_vs_rest import cross_validate_ovr
from .result import CVResult

__all__ = ["linear_cv", "linear_cv_grid", "check_task"]


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
        Folds, 2 <= k <= max(rows / 2, blocks) (each fold is a full solve). Leave-one-out of
        a linear SVM this way would be n solves: use TreeCV of an incremental learner, or the
        kernel SVM's exact LOO, for that; least squares (a regression store, solver
        "exact") takes ``k="loo"`` in closed form.
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
    a Gram matrix per fold (any number of C from the same pass); ``k="loo"``: its exact
    leave-one-out from two passes (:func:`_loo_exact`), the only LOO offered here.
    """
    from ooc_learn.storage.store import open_data
    from ooc_learn.training import regression_solver

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
        check_task(st, caller)
        exact = st.task == "regression" and regression_solver(
            st, solver, "squared_epsilon_insensitive" if loss is None else loss,
            epsilon) == "exact"
        if isinstance(k, str) and k.lower() == "loo":
            if exact:  # closed form: two passes for every C
                for C in Cs:
                    check_cost(C, caller)
                return _loo_exact(st, Cs, bias=bias)
            what = "SVR" if st.task == "regression" else "linear SVM"
            raise ParameterError(
                f"Leave-one-out of the {what} would train one model per row.",
                "Use --cv K with K folds, or TreeCV (--cv-method tree) for leave-one-out"
                + (" (least squares, --solver exact, has an exact one in two passes)."
                   if st.task == "regression" else "."))
        k = check_k(k, st.n_samples, caller, loo=False)  # least squares' LOO is above
        check_fold_count(st, k)
        if exact:
            for C in Cs:  # the checks of train_regression, before any work
                check_cost(C, caller)
            return _cross_validate_exact(st, k, Cs=Cs, bias=bias, on_fold=on_fold, seed=seed)
        task = FoldTask(st, Cs, solver=solver, loss=loss, s=s, bias=bias, eps=eps,
                         max_outer=max_outer, block_size=block_size,
                         block_solver=block_solver, init_sample=init_sample,
                         sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                         epsilon=epsilon, caller=caller)
        if st.task == "multiclass":
            return cross_validate_ovr(st, k, task=task, warm_start=warm_start,
                                       on_fold=on_fold, n_jobs=n_jobs, client=client)
        return cross_validate(st, k, task=task, warm_start=warm_start, on_fold=on_fold,
                               n_jobs=n_jobs, client=client)
    finally:
        if opened:
            st.close()


def check_fold_count(st, k: int) -> None:
    """Refuse folds of a row or two: each is a full solve."""
    n = st.n_samples
    most = max(2, n // 2, st.n_blocks)
    if k > most:
        raise ParameterError(
            f"{k} folds of {n} rows leave about {n / k:.1f} rows a fold; each fold is a "
            "full SVM solve.", f"Use k <= {most}, or TreeCV (--cv-method tree) for many "
            "folds.")


def check_task(st, caller: str) -> None:
    """Refuse a store whose task the linear CV does not cross-validate."""
    if st.task not in ("binary", "multiclass", "regression"):
        raise ParameterError(f"{caller} cross-validates binary, multiclass and regression "
                             f"stores; {st.path} holds a {st.task} task.",
                             "Re-ingest it with --task.")
    check_two_classes(st)


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
            a, z, holdout = fold_span(folds, contiguous, i)
            f0 = time.perf_counter()
            W = [solve_normal_equations(Gt - G[i], bt - b[i], C) for C in Cs]
            for X, y, pos in fold_rows(st, a, z, None if contiguous else holdout):
                yf = np.asarray(y, dtype=np.float64)
                for j, w in enumerate(W):
                    dv = decision_values(X, w, bias)
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


def _loo_exact(st, Cs, *, bias) -> list[CVResult]:
    """Leave-one-out of least squares at every C, exactly, in two passes over the store.

    With A = G + I / (2C) (``solve_normal_equations``; x augmented by the bias), leaving row
    i out changes its prediction by the Sherman-Morrison formula: its LOO residual is
    r_i / (1 - h_i), with r_i = y_i - x_i^T w the residual of the model on all rows and
    h_i = x_i^T A^-1 x_i. The first pass builds G and b; with G = V diag(s) V^T, the second
    takes P = Xa V a chunk at a time, and for each C h = sum_j P_ij^2 / (s_j + 1/(2C)) and
    x^T w = P (V^T b / (s + 1/(2C))). ``fold_scores`` are the rows' absolute LOO residuals.
    """
    from ooc_learn.solvers.least_squares import CHUNK_ROWS, fold_grams, gram_bytes

    t0 = time.perf_counter()
    n, d, m = st.n_samples, st.n_features, len(Cs)
    rows0, bytes0 = st.rows_read, st.bytes_read
    step = CHUNK_ROWS if st.layout == "dense" else 8 * CHUNK_ROWS
    with st.budget.reservation(gram_bytes(d, 2) + 8 * (d + 1) ** 2 + n + 8 * (m + 1) * n
                               + 8 * step * (d + 1) * 3,
                               f"leave-one-out of least squares ((d+1)^2 matrices of {d:,} "
                               f"features, each row's prediction)",
                               hint="or cross-validate K folds (--cv K)"):
        G, b = fold_grams(st, np.zeros(n, np.int8), 1, bias=bias)
        s, V = np.linalg.eigh(G[0])
        del G
        s = np.maximum(s, 0.0)  # G is positive semi-definite: no rounding below 0
        c = V.T @ b[0]
        inv = [1.0 / (s + 0.5 / C) for C in Cs]  # A^-1 = V diag(inv) V^T
        loo, y_all = np.empty((m, n)), np.empty(n)
        for X, y, pos in fold_rows(st, 0, n):  # by the store's read policy, as scoring
            y_all[pos] = y
            for a in range(0, pos.size, step):
                P = np.asarray(X[a:a + step] @ V[:d]) + bias * V[d]  # Xa V
                P2, yc, at = P * P, y_all[pos[a:a + step]], pos[a:a + step]
                for j in range(m):
                    loo[j, at] = yc - (yc - P @ (c * inv[j])) / (1.0 - P2 @ inv[j])
            del X, y  # before the next part is read (see fold_grams)
    total = time.perf_counter() - t0
    out = []
    for j, C in enumerate(Cs):
        res = np.abs(y_all - loo[j])
        out.append(CVResult(
            estimate=math.sqrt(float(res @ res) / n), fold_scores=res, metric="rmse",
            method="exact", folds=np.arange(n), predictions=loo[j],
            stats={"k": n, "n": n, "loo": True, "solver": "exact", "C": C,
                   "warm_start": False, "seconds": total / m,
                   "rows_read": (st.rows_read - rows0) // m, "folds": []}))
    if m == 1:
        out[0].stats.update(rows_read=st.rows_read - rows0, bytes_read=st.bytes_read - bytes0,
                            seconds=total)
    return out
