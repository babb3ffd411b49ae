"""A learner of +1 / -1 labels over more classes: one model per class (one-vs-rest).

TreeCV and k-fold CV of a binary learner (``binary_labels``, e.g. :class:`~.linear.Pegasos`)
on a multiclass store, or on labels other than +1 / -1, wrap it here (:func:`for_labels`), as
``train`` trains one model per class of a multiclass store: otherwise the class codes 0..k-1
would be fed to the hinge loss as if they were signs, and the estimate would mean nothing.
"""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.errors import ParameterError

from .base import check_metric, row_losses

__all__ = ["OneVsRest", "for_labels"]

#: the most distinct integer labels of arrays taken as classes (one model each)
MAX_CLASSES = 1000


class OneVsRest:
    """One copy of a binary learner per class: class c's model is fed +1 for its rows and
    -1 for the others; the prediction is the class whose model gives the largest decision
    value, and the ``error`` metric counts the rows whose class it misses.

    Parameters
    ----------
    learner : IncrementalLearner
        A learner of +1 / -1 labels whose ``predict`` returns decision values.
    classes : array-like
        The label values, one model each (sorted).

    Examples
    --------
    >>> import numpy as np
    >>> from ooc_learn.learners import Pegasos
    >>> X = np.eye(3, dtype=np.float32); y = np.array([0.0, 1.0, 2.0])
    >>> ovr = OneVsRest(Pegasos(0.1), [0, 1, 2])
    >>> m = ovr.update(ovr.init(3, 3), X, y)
    >>> ovr.predict(m, X).tolist()
    [0.0, 1.0, 2.0]
    """

    default_metric = "error"
    metrics = ("error",)

    def __init__(self, learner, classes):
        self.learner = learner
        self.classes = np.unique(np.asarray(classes, dtype=np.float64))
        if self.classes.size < 2:
            raise ParameterError(f"One-vs-rest needs two classes or more. Got "
                                 f"{self.classes.tolist()}.", "Check the labels.")
        self._y = None     # the labels last mapped (held, so that its id is not reused) ...
        self._signs = None  # ... and their +1 / -1 per class

    def __getstate__(self):  # shipped to a subtree's process or Dask task: not the cache
        return {"learner": self.learner, "classes": self.classes, "_y": None, "_signs": None}

    def signs(self, y) -> list:
        """Each class's +1 / -1 labels of ``y`` (the last ``y`` asked for is remembered)."""
        if y is not self._y:
            y64 = np.asarray(y, dtype=np.float64)
            self._y = y
            self._signs = [np.where(y64 == c, 1.0, -1.0) for c in self.classes]
        return self._signs

    def init(self, n_features: int, n_samples: int) -> list:
        return [self.learner.init(n_features, n_samples) for _ in self.classes]

    def update(self, models: list, X, y, order=None) -> list:
        signs = self.signs(y)
        return [self.learner.update(m, X, s, order=order) for m, s in zip(models, signs)]

    def copy(self, models: list) -> list:
        return [self.learner.copy(m) for m in models]

    def predict(self, models: list, X) -> np.ndarray:
        dec = np.column_stack([np.asarray(self.learner.predict(m, X), dtype=np.float64)
                               for m in models])
        return self.classes[np.argmax(dec, axis=1)]

    def losses(self, y, pred, metric) -> np.ndarray:
        metric = check_metric(self, metric, "OneVsRest.losses")
        if callable(metric):
            return row_losses(y, pred, metric)
        # "error": the class missed (base's "error" reads the sign of a decision value)
        return (np.asarray(pred, dtype=np.float64) != np.asarray(y, dtype=np.float64)
                ).astype(np.float64)

    def score(self, models: list, X, y, metric=None) -> float:
        metric = check_metric(self, metric, "OneVsRest.score")
        return float(self.losses(y, self.predict(models, X), metric).sum())

    def nbytes(self, models: list) -> int:
        return int(sum(self.learner.nbytes(m) for m in models))

    def init_nbytes(self, n_features: int, n_samples: int) -> int | None:
        """The models ``init`` makes, before they are made (None where the learner cannot
        say)."""
        size = getattr(self.learner, "init_nbytes", None)
        return None if size is None else len(self.classes) * int(size(n_features, n_samples))

    def __repr__(self):
        return f"OneVsRest({self.learner!r}, classes={self.classes.tolist()})"


def for_labels(learner, source):
    """``learner`` as the CV run should drive it on ``source``: wrapped in
    :class:`OneVsRest` where it learns +1 / -1 labels (``binary_labels``) and the source's
    labels are others (a multiclass store's classes, or arrays labelled otherwise)."""
    _check_classes(learner, source)
    if not getattr(learner, "binary_labels", False):
        return learner
    name = type(learner).__name__
    if source.is_store:
        store = source.store
        if store.task == "regression":
            raise ParameterError(
                f"{name} learns classes; {store.path} holds a regression task.",
                "Cross-validate a regression learner (--learner lsqsgd or exact-ls: "
                "LeastSquaresSGD, ExactLeastSquares).")
        if store.task != "multiclass":
            return learner  # binary: +1 / -1 as stored (or as a class view reads them)
        return OneVsRest(learner, store.metadata["label_map"]["classes"])
    if np.asarray(source.y).dtype.kind in "USO":  # class names: numpy's cast had failed
        raise ParameterError(
            f"{name} learns from numeric labels; the labels of these arrays are class "
            "names.", "Code them as integers first (np.unique(y, return_inverse=True)[1]), "
            "or ingest the arrays into a store (ingest_arrays keeps the names) and "
            "cross-validate the store.")
    values = np.unique(np.asarray(source.y, dtype=np.float64))
    if np.isin(values, (-1.0, 1.0)).all():
        return learner
    if not np.all(values == np.round(values)) or values.size > MAX_CLASSES:
        raise ParameterError(
            f"{name} learns classes; the labels are {values.size} distinct values"
            + ("" if np.all(values == np.round(values)) else ", not all integers") + ".",
            "Cross-validate a regression learner (LeastSquaresSGD, ExactLeastSquares), or "
            "pass class labels.")
    return OneVsRest(learner, values)


def _check_classes(learner, source) -> None:
    """Refuse a classifier whose ``classes`` (``SklearnPartialFit``'s) miss the labels the
    store holds: +1 / -1 (binary), or the class codes of a multiclass store, whose names
    ``ooc-info`` shows (scikit-learn's own error did not say what to pass)."""
    classes = getattr(learner, "classes", None)
    if not getattr(learner, "is_classifier", False) or classes is None or not source.is_store:
        return
    store = source.store
    if store.task == "binary":
        want = [-1.0, 1.0]
    elif store.task == "multiclass":
        want = [float(c) for c in store.metadata["label_map"]["classes"]]
    else:
        return
    try:
        have = set(np.asarray(classes, dtype=np.float64).tolist())
    except (TypeError, ValueError):
        have = set()
    if set(want) <= have:
        return
    names = store.label_map.get("names")
    shown = ", ".join(f"{v:g}" for v in want)
    raise ParameterError(
        f"{store.path} holds the labels {shown}"
        + (f" (for the classes {', '.join(map(str, names))})" if names else "")
        + f"; the learner's classes are {list(np.asarray(classes).tolist())}.",
        f"Pass classes=[{shown}] (the store's labels, not the names).")
