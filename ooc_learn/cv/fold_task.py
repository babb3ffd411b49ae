"""What one fold of the linear SVM's cross-validation solves: :class:`FoldTask` (the solver,
its parameters and the score of a fold) and :func:`fold_path` (one fold along the Cs).

Folds are solved one after the other, each warm-started from the previous fold's solution:
between fold i-1 and fold i only the rows of those two folds change hands (fold i's rows
leave, fold i-1's join), so the dual solution of fold i-1 with fold i's rows taken out is
close to fold i's (the warm start of the alpha-seeding CV of kernel SVMs, applied to the
linear dual). For the dual CD solvers the state is alpha over all rows and w: fold i's rows
have their alpha zeroed and their contribution subtracted from w
(:func:`~ooc_learn.solvers.dcd_streamed.drop_rows`). For IBCD it is the previous fold's
support vectors and their alpha outside fold i, which start S in place of w_0's random sample.
Along the Cs, fold i at C_j starts from fold i at C_(j-1) (alpha <= C_(j-1) < C_j is
feasible: LIBLINEAR -C's path).
"""

from __future__ import annotations

import math
import time

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .linear_folds import decision_values, fold_rows, fold_span
from .result import CVResult

__all__ = ["LINEAR_CV_SOLVERS", "FoldTask", "fold_path", "check_cost"]


LINEAR_CV_SOLVERS = ("ibcd", "dcd", "bm")


def check_cost(C, caller: str) -> None:
    """Refuse a cost C that is not a finite number > 0."""
    if not (isinstance(C, (int, float)) and C > 0 and math.isfinite(C)):
        raise ParameterError(f"The Cs of {caller} must be > 0. Got {C!r}.",
                             "C is the cost; try 1.")


class FoldTask:
    """What every fold of a CV run solves and how it is scored: the solver and its
    parameters (checked before any work), resolved from the store's task; :meth:`solve`
    trains fold i at C from a warm start and scores it."""

    def __init__(self, st, Cs, *, solver, loss, s, bias, eps, max_outer, block_size,
                 block_solver, init_sample, sample_eps, seed, spill_dir, epsilon, caller):
        from ooc_learn.training import (check_params, model_state_bytes, regression_solver,
                                        run_solver, train_regression)

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
                check_cost(C, caller)
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
                check_params(self.solver, loss, C, s, bias, eps, max_outer, block_size)
            if epsilon != 0.0:
                raise ParameterError("epsilon is the insensitive zone of regression; "
                                     f"{st.path} holds a {st.task} task.", "Drop --epsilon.")
            params = dict(solver=self.solver, loss=loss, s=s, eps=eps, max_outer=max_outer,
                          block_size=block_size, block_solver=block_solver,
                          init_sample=init_sample, sample_eps=sample_eps, seed=seed,
                          spill_dir=spill_dir, epochs=1, on_outer=None, bias=bias)

            def run(st_, *, C, holdout, warm, reference=None):
                return run_solver(st_, C=C, holdout=holdout, warm=warm, **params)
            self.run = run
            self.state_bytes = model_state_bytes(self.solver, block_solver, st.n_features)
        self.dual = self.solver in ("dcd", "bm")

    def on(self, st):
        """The same task on another view of the store (one class against the rest)."""
        return self._with(st=st)

    def at(self, cs: slice):
        """The same task at the Cs ``cs`` (a slice of ``Cs``) only."""
        return self._with(Cs=self.Cs[cs])

    def _with(self, **changes):
        other = object.__new__(FoldTask)
        other.__dict__.update(self.__dict__, **changes)
        return other

    def solve(self, folds, contiguous, i, C, warm, decision, reference=None):
        """Fold i at C from ``warm``: ``(stats, score, entry)``; its rows' decision values
        go into ``decision``. The dual solvers update ``warm`` in place."""
        st = self.st
        f0, fr0 = time.perf_counter(), st.rows_read
        a, z, holdout = fold_span(folds, contiguous, i)
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


def fold_path(task, folds, contiguous: bool, i: int, head, *, warm_start: bool, decision,
               fold_scores, logs, references: dict, on_fold=None):
    """Fold i at every C of ``task`` (ascending): its scores, log entries and its rows'
    decision values go into ``fold_scores[:, i]``, ``logs[j][i]`` and ``decision``. ``head``:
    fold i-1 at C_1 (None: from scratch). Returns fold i at C_1, the next fold's head."""
    from ooc_learn.solvers.dcd_streamed import drop_rows

    st, dual, regression = task.st, task.dual, task.regression
    n, d = st.n_samples, st.n_features
    if dual and warm_start and head is not None:
        a, z, holdout = fold_span(folds, contiguous, i)
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


def _score_fold(st, w, bias, a, z, mask, size, regression, decision) -> float:
    """The fold's accuracy (regression: RMSE) of the model w; its rows' decision values go
    into ``decision`` (indexed by store row)."""
    right = sse = 0.0
    for X, y, pos in fold_rows(st, a, z, mask):
        dv = decision_values(X, w, bias)
        decision[pos] = dv
        if regression:
            r = np.asarray(y, dtype=np.float64) - dv
            sse += float(r @ r)
        else:
            right += int(np.count_nonzero((dv > 0) == (np.asarray(y) > 0)))
    return math.sqrt(sse / size) if regression else right / size
