"""Choosing lambda by cross-validation of a fitted :class:`SparseRLS`.

The model is read through its public, read-only side: the fitted factors (``Q_``, ``eigvals_``,
``chol_``, ``V_``, ``A_``, ``z0_``, ``KyR_``, ``Y_``), its row cache (``row_cache_kind``,
``row_cache_``), its budget and rows (``budget_``, ``source_``) and its row methods
(``u_rows``, ``rt_rows``, ``iter_u_chunks``, ``iter_rt_chunks``, ``kernel_rows``). The CV
modules import nothing of the model's; :mod:`.model` calls them.

The three ways of Section 6.4 to treat held-out rows that are basis vectors (E = H & B):

* ``remove``: E leaves the basis (basis L = B \\ E) and its rows leave training (Prop. 1);
* ``keep``: E stays in the basis *and* in training; only H \\ E is held out (Corollary 2 with
  H \\ E); the rows of E are still predicted, by that same model;
* ``keep_no_loss``: E stays in the basis but every row of H leaves training (Corollary 2);
* ``skip`` (LOO only, the paper's option ii): basis rows get NaN.

The three kinds of CV, each in its module: hold-out of a set of rows
(:mod:`.holdout_predict`), k-fold (:mod:`.kfold_predict`, with the Cholesky route for few
lambdas in :mod:`.kfold_chol`) and leave-one-out (:mod:`.loo_predict`); the formulas
themselves are :mod:`.holdout`'s. This module chooses lambda by one of them
(:func:`select_lambda_model`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .checks import check_lambdas
from .kfold_predict import kfold_path_model
from .loo_predict import loo_path_model

__all__ = ["LambdaSelection", "select_lambda_model", "METRICS"]


METRICS = ("mse", "mae", "error")


class LambdaSelection(NamedTuple):
    """Result of :meth:`SparseRLS.select_lambda`."""

    best_lambda: float
    curve: np.ndarray          # CV score per lambda (lower is better)
    model: object              # the SparseRLS, switched to best_lambda
    lambdas: np.ndarray


def _score(pred: np.ndarray, Y: np.ndarray, metric: str) -> np.ndarray:
    """Score per lambda over the rows with finite predictions; pred (c, m, v), Y (m, v)."""
    ok = np.isfinite(pred).all(axis=(0, 2))
    if not ok.any():
        raise ParameterError("No row has a CV prediction to score (every row skipped).")
    P, T = pred[:, ok], Y[ok][None]
    if metric == "mse":
        return ((P - T) ** 2).mean(axis=(1, 2))
    if metric == "mae":
        return np.abs(P - T).mean(axis=(1, 2))
    if P.shape[2] == 1:
        return (np.sign(P[..., 0]) != np.sign(T[..., 0])).mean(axis=1)
    return (P.argmax(axis=2) != T.argmax(axis=2)).mean(axis=1)


def select_lambda_model(model, lams, cv, metric: str, basis_mode: str) -> LambdaSelection:
    """Choose lambda by LOO (``cv="loo"``) or k-fold CV (``cv=k`` or folds); refit is O(n^2)."""
    owner = "SparseRLS.select_lambda"
    if metric not in METRICS:
        raise ParameterError(f"The 'metric' parameter of {owner} must be one of {METRICS}. "
                             f"Got {metric!r} instead.")
    lams = check_lambdas(lams, owner)
    if isinstance(cv, str):
        if cv != "loo":
            raise ParameterError(f"The 'cv' parameter of {owner} must be 'loo', an int k or "
                                 f"folds. Got {cv!r} instead.")
        pred = loo_path_model(model, lams, basis_mode)
    else:
        pred = kfold_path_model(model, cv, lams, basis_mode)
    curve = _score(pred, model.Y_, metric)
    best = float(lams[int(np.argmin(curve))])
    model.set_lambda(best)
    return LambdaSelection(best, curve, model, lams)
