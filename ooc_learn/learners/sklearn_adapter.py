"""Adapter: any scikit-learn estimator with ``partial_fit`` as an incremental learner."""

from __future__ import annotations

import copy as _copy
import pickle

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .base import Metric, check_metric

__all__ = ["SklearnPartialFit"]


class SklearnPartialFit:
    """Wrap a scikit-learn estimator that has ``partial_fit``; models are fitted clones.

    ``update`` calls ``partial_fit`` once per block with the rows in the given order; ``copy``
    is ``copy.deepcopy``. Predictions are ``estimator.predict`` (labels for classifiers), so
    the ``"error"`` metric is ``pred != y`` and ``"squared"`` / ``"absolute"`` compare values.
    TreeCV with this adapter runs its recursion in Python (one ``partial_fit`` per block piece).

    Parameters
    ----------
    estimator : scikit-learn estimator
        Unfitted template with ``partial_fit``; cloned for each model.
    classes : array-like, optional
        All class labels, passed to the first ``partial_fit`` of classifiers (required by
        scikit-learn because a training phase may not see every class).

    Examples
    --------
    >>> from sklearn.naive_bayes import GaussianNB                  # doctest: +SKIP
    >>> learner = SklearnPartialFit(GaussianNB(), classes=[0, 1])   # doctest: +SKIP
    """

    metrics = ("error", "squared", "absolute")

    def __init__(self, estimator, classes=None):
        if not hasattr(estimator, "partial_fit"):
            raise ParameterError(
                f"The 'estimator' parameter of SklearnPartialFit must have a partial_fit "
                f"method. Got {type(estimator).__name__} instead.",
                "Use an incremental estimator such as SGDClassifier, SGDRegressor, "
                "GaussianNB, MultinomialNB or Perceptron.")
        self.estimator = estimator
        self.classes = None if classes is None else np.asarray(classes)
        from sklearn.base import is_classifier

        self.is_classifier = bool(is_classifier(estimator))
        if self.is_classifier and self.classes is None:
            raise ParameterError(
                "The 'classes' parameter of SklearnPartialFit is required for classifiers. "
                "Got None instead.",
                "Pass every label, e.g. classes=np.unique(y): a training phase may miss some.")
        self.default_metric = "error" if self.is_classifier else "squared"

    def init(self, n_features: int, n_samples: int = 1):
        from sklearn.base import clone
        return _SkModel(clone(self.estimator))

    def update(self, model, X, y, order: np.ndarray | None = None):
        """One ``partial_fit`` call with the rows of ``X`` (in ``order`` if given)."""
        if order is not None:
            X = X[order]
            y = np.asarray(y)[order]
        if X.shape[0] == 0:
            return model
        if self.is_classifier and not model.fitted:
            model.estimator.partial_fit(X, y, classes=self.classes)
        else:
            model.estimator.partial_fit(X, y)
        model.fitted = True
        return model

    def copy(self, model):
        return _copy.deepcopy(model)

    def predict(self, model, X) -> np.ndarray:
        return np.asarray(model.estimator.predict(X))

    def losses(self, y, pred, metric: Metric) -> np.ndarray:
        y = np.asarray(y)
        if callable(metric):
            return np.asarray(metric(y, pred), dtype=np.float64)
        if metric == "error":
            return (np.asarray(pred) != y).astype(np.float64)
        diff = np.asarray(pred, dtype=np.float64) - y.astype(np.float64)
        return diff * diff if metric == "squared" else np.abs(diff)

    def score(self, model, X, y, metric: Metric | None = None) -> float:
        metric = check_metric(self, metric, "SklearnPartialFit.score")
        return float(self.losses(y, self.predict(model, X), metric).sum())

    def nbytes(self, model) -> int:
        # the pickled size is what a deep copy holds, up to Python object overhead
        return len(pickle.dumps(model.estimator, protocol=pickle.HIGHEST_PROTOCOL))

    def __repr__(self):
        return f"SklearnPartialFit({self.estimator!r})"


class _SkModel:
    """A fitted (or not yet fitted) clone of the template estimator."""

    __slots__ = ("estimator", "fitted")

    def __init__(self, estimator):
        self.estimator = estimator
        self.fitted = False
