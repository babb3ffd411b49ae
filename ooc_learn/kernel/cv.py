"""k-fold cross-validation of a kernel SVM with alpha seeding (Wen et al., AAAI 2017).

Rounds run in fold order. Round h trains on every fold but h with SMO (see ``smo``) and keeps
the decision values of fold h. Round h+1 trains on  S u T  (T = fold h enters, R = fold h+1
leaves); with ``seeding`` it starts from alphas built from round h's solution (``seeding``
module), and the gradient is updated from the alphas that changed only:

    G_i <- G_i + y_i sum_{j: d alpha_j != 0} d alpha_j y_j K(x_i, x_j),   i in S u T,

where G on T comes free from round h's decision values on its test fold. Because every round
ends at the same eps-KKT point as a cold start, the estimate equals cold-start CV's.
"""

from __future__ import annotations

import time

import numpy as np

from ooc_learn.cv.result import CVResult
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import ParameterError, UsageError

from ._inputs import (check_choice, check_int, check_kernel_params, is_open_store, prepare_inputs,
                      resolve_gamma)
from .seeding import SEEDERS, SeedContext
from .smo import KernelMatrix, decision_on, move_alpha, solve

__all__ = ["svm_cv", "make_folds"]

SEEDINGS = (None, "ato", "mir", "sir", "avg", "top")


def make_folds(n: int, k: int, seed=0) -> np.ndarray:
    """Random fold ids 0..k-1 of (almost) equal sizes from a seed or a Generator."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    folds = np.empty(n, dtype=np.int64)
    folds[rng.permutation(n)] = np.arange(n) % k
    return folds


def _check_folds(folds, n, caller):
    folds = np.asarray(folds).ravel()
    if folds.shape[0] != n or folds.dtype.kind not in "iu":
        raise ParameterError(f"The 'folds' parameter of {caller} must be an integer array with "
                             f"one fold id per row ({n} rows). Got "
                             f"{folds.shape[0]} values of dtype {folds.dtype} instead.",
                             "Pass e.g. make_folds(n, k, seed).")
    ids, inv = np.unique(folds, return_inverse=True)
    if ids.size < 2:
        raise ParameterError(f"The 'folds' parameter of {caller} must name at least 2 folds. "
                             f"Got {ids.size} instead.", "Use k >= 2.")
    return inv.astype(np.int64), ids.size


def _validate(caller, kernel, C, gamma, degree, coef0, k, folds, seeding, tol, X):
    params = check_kernel_params(caller, kernel, C, gamma, degree, coef0, tol)
    check_choice(seeding, "seeding", caller, SEEDINGS)
    if folds is None:
        k = check_int(k, "k", caller, 2, "Use k = 10 (or n for leave-one-out).")
        n = int(X.n_samples) if is_open_store(X) else int(np.shape(X)[0])
        if k > n:
            raise ParameterError(f"The 'k' parameter of {caller} must be <= the number of rows "
                                 f"({n}). Got {k} instead.", "Use k <= n_samples.")
    return params, k


def svm_cv(X, y=None, kernel: str = "rbf", C: float = 1.0, gamma=None, degree: int = 3,
           coef0: float = 0.0, k: int = 10, folds=None, seeding: str | None = "sir",
           tol: float = 1e-3, seed=0, memory=None, shrinking: bool = True,
           cache_bytes: int | None = None, progress: bool = False) -> CVResult:
    """k-fold CV accuracy of a C-SVM, each round alpha-seeded from the previous one.

    Parameters
    ----------
    X, y : dense array or CSR matrix and labels (two classes), or a Store (y optional)
    kernel, C, gamma, degree, coef0 : SVM parameters (gamma None = 1 / n_features)
    k : number of random folds (ignored when ``folds`` is given)
    folds : optional fold id per row
    seeding : None (cold start), "sir", "mir", "ato", "avg" or "top"
    tol : eps of the eps-KKT stopping rule of SMO
    seed : seed or Generator for the folds and SIR's random picks
    memory : memory cap (the kernel cache reserves from it)
    progress : a tqdm bar on stderr over the folds

    Returns
    -------
    CVResult with estimate = accuracy, fold_scores, folds, predictions (decision value of each
    row from the model that held it out) and stats (smo_iterations, fold_iterations,
    kernel_evaluations, init_seconds, train_seconds, ...).

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> res = svm_cv(X / X.max(0), y, C=10.0, gamma=0.5, k=5, seeding="sir")
    >>> 0.9 < res.estimate <= 1.0
    True
    """
    caller = "svm_cv"
    (kernel, C, gamma, degree, coef0, tol), k = _validate(caller, kernel, C, gamma, degree,
                                                          coef0, k, folds, seeding, tol, X)
    budget = MemoryBudget.coerce(memory if memory is not None or not is_open_store(X)
                                 else X.budget)
    Xp, ypm, classes, sbytes, sbudget = prepare_inputs(X, y, caller)
    try:
        n = Xp.shape[0]
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        if folds is None:
            folds = make_folds(n, k, rng)
        folds, k = _check_folds(folds, n, caller)
        for h in range(k):
            if np.unique(ypm[folds != h]).size < 2:
                raise UsageError(f"{caller}: the training set of fold {h} holds one class only.",
                                 "Use fewer folds or stratified folds.")
        gamma = resolve_gamma(gamma, Xp)
        with KernelMatrix(Xp, kernel, gamma, degree, coef0, budget, cache_bytes) as km:
            res = _run_rounds(km, ypm, folds, k, C, tol, seeding, rng, shrinking, progress)
        res.stats.update({"kernel": kernel, "C": C, "gamma": gamma, "k": k,
                          "seeding": seeding or "none", "classes": classes.tolist()})
        return res
    finally:
        if sbudget is not None:
            sbudget.release(sbytes)


def _run_rounds(km, y, folds, k, C, tol, seeding, rng, shrinking,
                progress: bool = False) -> CVResult:
    from tqdm.auto import tqdm

    n = km.n
    alpha, G = np.zeros(n), np.zeros(n)
    pred = np.zeros(n)
    fold_rows = [np.flatnonzero(folds == h) for h in range(k)]
    fold_scores = np.zeros(k)
    iters = np.zeros(k, dtype=np.int64)
    phases = np.zeros((k, 3), dtype=np.int64)
    init_s = train_s = pred_s = 0.0
    changed_total = 0
    rho = 0.0
    info: dict = {}
    t_all = time.perf_counter()
    for h in tqdm(range(k), desc="svm_cv", unit="fold", disable=not progress, leave=False):
        test = fold_rows[h]
        train = np.flatnonzero(folds != h)
        t0 = time.perf_counter()
        if h == 0 or seeding is None:
            alpha[:] = 0.0
            G[train] = -1.0
        else:
            T, R = fold_rows[h - 1], test
            S = np.flatnonzero((folds != h) & (folds != h - 1))
            ctx = SeedContext(km, y, alpha, G, rho, S, R, T, C, rng, info)
            new = SEEDERS[seeding](ctx)
            changed_total += _apply_change(km, y, alpha, new, G, train)
        t1 = time.perf_counter()
        rho, it = solve(km, train, y, alpha, G, C, tol, shrinking=shrinking,
                        caller=f"svm_cv fold {h}", phase=phases[h])
        t2 = time.perf_counter()
        sv = train[alpha[train] > 0]
        dec = decision_on(km, sv, alpha[sv] * y[sv], test, rho)
        pred[test] = dec
        G[test] = y[test] * (dec + rho) - 1.0   # the gradient T will have when it enters
        fold_scores[h] = float(np.mean(np.where(dec > 0, 1.0, -1.0) == y[test]))
        iters[h] = it
        init_s += t1 - t0
        train_s += t2 - t1
        pred_s += time.perf_counter() - t2
    correct = np.where(pred > 0, 1.0, -1.0) == y
    # iterations spent per phase: until the pair gap < 1, then < 0.1, < 0.01, < tol
    marks = np.where(phases < 0, 0, phases)
    marks = np.maximum.accumulate(np.column_stack([marks, iters]), axis=1)
    phase_iters = np.diff(np.column_stack([np.zeros(k, np.int64), marks]), axis=1)
    stats = {"smo_iterations": int(iters.sum()), "fold_iterations": iters.tolist(),
             "phase_iterations": phase_iters.sum(axis=0).tolist(),
             "fold_phase_iterations": phase_iters.tolist(),
             "init_seconds": init_s, "train_seconds": train_s, "predict_seconds": pred_s,
             "seconds": time.perf_counter() - t_all, "seed_changed_alphas": changed_total,
             "cache_columns": km.n_slots, **km.counters(), **info}
    return CVResult(estimate=float(correct.mean()), fold_scores=fold_scores, metric="accuracy",
                    method=f"smo-{seeding or 'cold'}", folds=folds, predictions=pred,
                    stats=stats)


def _apply_change(km, y, alpha, new, G, train) -> int:
    """Set alpha <- new and update G on ``train`` from the changed alphas' columns only."""
    changed = move_alpha(km, y, new - alpha, G, train)
    alpha[:] = new
    return changed
