"""The search for C by K-fold cross-validation along a path of Cs, LIBLINEAR ``-C``'s way:
:func:`linear_c_search`, and its stopping rule.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .fold_task import FoldTask
from .folds import check_k
from .linear import check_fold_count, check_task, linear_cv_grid
from .linear_folds import fold_plan
from .result import CVResult

__all__ = ["linear_c_search"]


def _path(C_min: float, C_max: float, factor: float) -> list[float]:
    """The Cs of the search: C_min times powers of ``factor`` up to C_max (rounding
    forgiven)."""
    out, C = [], float(C_min)
    while C <= C_max * (1 + 1e-12):
        out.append(C)
        C *= factor
    return out


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
    regression stores (least squares where the exact solver is the one training would run:
    every C of the path from its one pass, the stop applied after; else dual CD's path)."""
    from ooc_learn.storage.store import open_data

    if not (isinstance(factor, (int, float)) and factor > 1):
        raise ParameterError(f"The 'factor' of linear_c_search must be > 1. Got {factor!r}.",
                             "LIBLINEAR doubles C: 2.")
    if not (isinstance(patience, int) and patience >= 1):
        raise ParameterError(f"The 'patience' of linear_c_search must be an int >= 1. Got "
                             f"{patience!r}.", "Try 3.")
    st, opened = open_data(store, memory)
    try:
        check_task(st, "linear_c_search")
        n, d = st.n_samples, st.n_features
        if isinstance(k, str) and k.lower() == "loo":  # one solve per row and C
            raise ParameterError(
                "The C search cross-validates K folds, not leave-one-out.",
                "Least squares has its exact leave-one-out at a list of C in two passes: "
                "--cv loo --C 0.01,0.1,1,10 (linear_cv_grid(store, 'loo', Cs))."
                if st.task == "regression" else "Use --cv K, e.g. --cv 5.")
        k = check_k(k, n, "linear_c_search", loo=False)
        check_fold_count(st, k)
        regression = st.task == "regression"
        if C_min is None:
            top = float(np.max(st.sqnorms())) + bias * bias if n else 1.0
            C_min = 2.0 ** math.floor(math.log2(1.0 / (2 * n * max(top, 1e-300))))
        if not (isinstance(C_min, (int, float)) and 0 < C_min <= C_max):
            raise ParameterError(f"C_min must be in (0, C_max = {C_max:g}]. Got {C_min!r}.",
                                 "Leave it out for LIBLINEAR's start.")
        stop = _SearchStop(regression, patience, min_delta)
        path = _path(C_min, C_max, factor)
        if regression:
            from ooc_learn.training import regression_solver

            loss_r = "squared_epsilon_insensitive" if loss is None else loss
            if regression_solver(st, solver, loss_r, epsilon) == "exact":
                # least squares: the exact solver's one pass scores every C of the path,
                # the model the command trains (dual CD's scores had stood in for it)
                out = []
                for result in linear_cv_grid(st, k, path, solver="exact", loss=loss_r,
                                             bias=bias, seed=seed, on_fold=on_fold,
                                             caller="linear_c_search"):
                    out.append(result)
                    if stop(result.estimate):
                        break
                return out
        if st.task == "multiclass":
            # one-vs-rest at each C of the path, the folds of each C from scratch
            out = []
            for C in path:
                out += linear_cv_grid(st, k, [C], solver=solver, loss=loss, s=s, bias=bias,
                                      eps=eps, max_outer=max_outer, block_size=block_size,
                                      block_solver=block_solver, init_sample=init_sample,
                                      sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                                      on_fold=on_fold, caller="linear_c_search")
                if stop(out[-1].estimate):
                    break
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
            out = []
            for C in path:
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
