"""The incremental-learner protocol TreeCV and standard k-fold CV drive, and shared helpers.

A learner is a stateless policy object; the *model* it returns from ``init`` carries the state.
``update`` feeds rows in the given order; ``copy`` (or ``save``/``revert``) lets TreeCV branch;
``score`` returns the *sum* of per-row losses so fold scores average correctly over unequal folds.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Union, runtime_checkable

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.errors import ParameterError

__all__ = ["IncrementalLearner", "SaveRevertLearner", "Metric", "row_losses", "kernel_arrays",
           "check_metric"]

Metric = Union[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]

_METRICS = {
    # misclassification of +-1 labels by the sign of a decision value (0 counts as -1)
    "error": lambda y, f: (np.where(f > 0, 1.0, -1.0) != y).astype(np.float64),
    "hinge": lambda y, f: np.maximum(0.0, 1.0 - y * f),
    "squared": lambda y, f: (f - y) ** 2,
    "absolute": lambda y, f: np.abs(f - y),
}


@runtime_checkable
class IncrementalLearner(Protocol):
    """What TreeCV needs from a learner (Joulani et al. 2015, sec. 2: L(f, Z') -> f').

    ``default_metric`` names the loss ``score`` uses when none is given; ``metrics`` lists the
    named losses it understands (a callable ``metric(y, pred) -> per-row losses`` also works).
    """

    default_metric: str
    metrics: tuple

    def init(self, n_features: int, n_samples: int) -> Any:
        """A model trained on nothing (``n_samples``: size of the whole data set)."""

    def update(self, model: Any, X, y: np.ndarray, order: np.ndarray | None = None) -> Any:
        """Feed rows of ``X`` (``order`` gives which and in what order); return the model."""

    def copy(self, model: Any) -> Any:
        """An independent copy that later updates of either leave the other untouched."""

    def predict(self, model: Any, X) -> np.ndarray:
        """Per-row predictions the metric is computed from (decision values or labels)."""

    def losses(self, y: np.ndarray, pred: np.ndarray, metric: Metric) -> np.ndarray:
        """Per-row losses of predictions ``pred`` against ``y``."""

    def score(self, model: Any, X, y: np.ndarray, metric: Metric | None = None) -> float:
        """Sum of per-row losses of ``model`` on ``(X, y)``."""

    def nbytes(self, model: Any) -> int:
        """Memory one model takes (what a saved copy costs against the memory budget).

        A learner may also say ``init_nbytes(n_features, n_samples)``: what ``init``'s
        model will take, asked before it is made, so that a model wider than the cap is
        refused rather than allocated."""


@runtime_checkable
class SaveRevertLearner(Protocol):
    """Optional alternative to ``copy`` (paper sec. 4.1): record changes, then undo them."""

    def save(self, model: Any) -> Any:
        """Start recording; return a token."""

    def revert(self, model: Any, token: Any) -> Any:
        """Undo every change made since ``save`` returned ``token``; return the model."""


def check_metric(learner, metric: Metric | None, caller: str) -> Metric:
    """Resolve ``None`` to the learner's default and reject unknown names."""
    if metric is None:
        return learner.default_metric
    if callable(metric):
        return metric
    if not isinstance(metric, str) or metric not in learner.metrics:
        raise ParameterError(
            f"The 'metric' parameter of {caller} must be one of {list(learner.metrics)} or a "
            f"callable. Got {metric!r} instead.",
            "Pass metric=None for the learner's default, or a function "
            "metric(y, pred) -> per-row losses.")
    return metric


def row_losses(y: np.ndarray, f: np.ndarray, metric: Metric) -> np.ndarray:
    """Per-row losses for a named metric or a callable ``metric(y, f)``."""
    y = np.asarray(y, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    if callable(metric):
        out = np.asarray(metric(y, f), dtype=np.float64)
        if out.shape != y.shape:
            raise ParameterError(
                f"A metric callable must return one loss per row ({y.shape[0]}). "
                f"Got shape {out.shape} instead.",
                "Return an array of per-row losses, not their mean.")
        return out
    return _METRICS[metric](y, f)


def kernel_arrays(X):
    """``(Xd, indptr, indices, data, is_csr)`` with the dtypes the numba kernels take.

    Dense input becomes C-contiguous float32; sparse input becomes CSR with int64 ``indptr``,
    int32 ``indices`` and float32 ``data``. The unused side is an empty placeholder.
    """
    if sp.issparse(X):
        X = X.tocsr() if X.format != "csr" else X
        if not X.has_canonical_format:
            X = X.copy()
            X.sum_duplicates()
        return (_EMPTY_2D, np.asarray(X.indptr, dtype=np.int64),
                np.asarray(X.indices, dtype=np.int32), np.asarray(X.data, dtype=np.float32),
                True)
    Xd = np.ascontiguousarray(X, dtype=np.float32)
    if Xd.ndim != 2:
        raise ParameterError(
            f"X must be a 2-D array or a scipy sparse matrix. Got {Xd.ndim} dimensions instead.",
            "Reshape a single row with X.reshape(1, -1).")
    return Xd, _EMPTY_INDPTR, _EMPTY_INDICES, _EMPTY_DATA, False


_EMPTY_2D = np.zeros((0, 0), dtype=np.float32)
_EMPTY_INDPTR = np.zeros(1, dtype=np.int64)
_EMPTY_INDICES = np.zeros(0, dtype=np.int32)
_EMPTY_DATA = np.zeros(0, dtype=np.float32)
