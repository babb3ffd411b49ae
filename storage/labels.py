"""Labels: the class names of text labels, the labels seen while parsing, the task they decide.

A text label column (class names such as ``setosa``) is parsed into codes by
:class:`LabelNames`; :class:`LabelTracker` keeps the distinct label values of pass 1 (up to a
bound); :func:`decide_task` turns both into the store's task (binary, multiclass, regression),
its label map and the function that maps raw labels to stored ones.
"""

from __future__ import annotations

import numpy as np

from .errors import IngestError, ParameterError

__all__ = ["LabelNames", "LabelTracker", "decide_task", "MULTICLASS_MAX_CLASSES"]

#: auto task: integer labels with at most this many distinct values are classes
MULTICLASS_MAX_CLASSES = 20
#: the most distinct label values tracked before a source is taken as regression
_MAX_TRACKED_LABELS = 4096


class LabelNames:
    """Class names of text labels (a CSV label column such as ``setosa``), each given a code
    0, 1, ... as it is first met; the parser stores the code as the row's label. ``fixed``:
    the names are given (the training store's, for test data) and another name is refused."""

    def __init__(self, names=(), *, fixed: bool = False):
        self.codes: dict[str, int] = {str(n): i for i, n in enumerate(names)}
        self.fixed = fixed

    @property
    def names(self) -> list[str]:
        return sorted(self.codes, key=self.codes.__getitem__)

    def __len__(self) -> int:
        return len(self.codes)

    def code(self, name: str) -> int | None:
        c = self.codes.get(name)
        if c is None and not self.fixed:
            c = self.codes[name] = len(self.codes)
        return c


class LabelTracker:
    def __init__(self):
        self.values: set = set()
        self.overflow = False
        self.integral = True

    def add(self, labels: np.ndarray) -> None:
        if labels.size == 0:
            return
        if self.integral and not np.all(labels == np.round(labels)):
            self.integral = False
        if not self.overflow:
            self.values.update(np.unique(labels).tolist())
            if len(self.values) > _MAX_TRACKED_LABELS:
                self.overflow = True
                self.values = set()


def decide_task(tracker: LabelTracker, task: str, positive_label, where: str = "the sources",
                 names=None):
    """Return (task, label_map, mapper) where mapper turns raw labels into stored ones.
    ``where`` names the sources in a refusal; ``names`` (a :class:`LabelNames`) the class
    names of text labels, whose codes the raw labels are."""
    if names is not None and len(names):
        return _decide_named(names, task, positive_label, where)
    values = sorted(tracker.values)
    if positive_label is not None:
        try:
            positive_label = float(positive_label)
        except (TypeError, ValueError):
            raise IngestError(f"--positive-label {positive_label} is not a label of "
                              f"{where}: its labels are numbers.",
                              "Pass one of the numeric labels.") from None
        if tracker.overflow or positive_label not in tracker.values:
            seen = ("more than {:d} distinct values: a regression target?".format(
                _MAX_TRACKED_LABELS) if tracker.overflow else
                f"{', '.join(f'{v:g}' for v in values[:10])}{' ...' if len(values) > 10 else ''}")
            raise IngestError(
                f"The positive label {positive_label:g} (--positive-label, or the model's "
                f"when scoring) does not occur in the labels of {where} (seen: {seen}).",
                "Pass a label that occurs in the data; a file to score must hold the "
                "training data's labels in the training label column.")
        if task in ("auto", "binary"):
            pos = float(positive_label)
            rest = [v for v in values if v != pos]
            return ("binary", {"positive": pos, "negative": rest, "one_vs_rest": len(rest) > 1},
                    lambda lab: np.where(lab == pos, 1.0, -1.0))
    if task == "auto":
        if not tracker.overflow and len(values) == 2:
            task = "binary"
        elif not tracker.overflow and len(values) == 1 and values[0] in (-1.0, 1.0):
            task = "binary"
        elif not tracker.overflow and len(values) == 1:
            raise IngestError(
                f"Every row of {where} has the label {values[0]:g}: one class, or a constant "
                f"target, where a model needs two classes or more, or a varying target.",
                "Check the label column (--label-column) and the file; pass --task binary if "
                "it holds one class of a binary task (a test set, say), or --task regression.")
        elif (not tracker.overflow and tracker.integral
              and 2 < len(values) <= MULTICLASS_MAX_CLASSES):
            task = "multiclass"
        elif tracker.integral:
            # a class per value, or a count to predict: either is a guess
            many = (f"more than {_MAX_TRACKED_LABELS:,}" if tracker.overflow
                    else f"{len(values)}")
            raise IngestError(
                f"The labels of {where} are {many} distinct integers "
                f"({', '.join(f'{v:g}' for v in values[:8])}{' ...' if len(values) > 8 else ''}"
                f"): a class per value, or a number to predict?",
                f"Pass --task multiclass (one class per value; more than "
                f"{MULTICLASS_MAX_CLASSES} is fine when asked for) or --task regression "
                "(in Python: task=).")
        else:
            task = "regression"
    if task == "binary":
        if tracker.overflow or len(values) > 2:
            raise IngestError(
                f"--task binary needs at most two distinct labels; the sources have "
                f"{'many' if tracker.overflow else len(values)}.",
                "Pick the positive class with --positive-label (one-vs-rest) or use "
                "--task multiclass / regression.")
        if len(values) == 1:
            # one class of a binary task (a test set, say): scored against a model, never
            # trained on (:func:`check_two_classes`)
            pos = values[0]
            neg = -1.0 if pos == 1.0 else None
            return ("binary", {"positive": pos, "negative": neg, "one_class": pos},
                    lambda lab: np.where(lab == pos, 1.0, -1.0))
        neg, pos = values
        return ("binary", {"positive": pos, "negative": neg},
                lambda lab: np.where(lab == pos, 1.0, -1.0))
    if task == "multiclass":
        if tracker.overflow or not tracker.integral:
            raise IngestError("--task multiclass needs integer labels.",
                              "Use --task regression for real-valued targets.")
        return "multiclass", {"classes": values}, lambda lab: lab
    return "regression", {}, lambda lab: lab


def _decide_named(names, task: str, positive_label, where: str):
    """Text labels (class names): classes 0..k-1 in sorted name order (scikit-learn's
    ``classes_`` order); two names are binary, the later one +1; ``positive_label`` (a name)
    makes that class +1 against the rest. The label map keeps the names."""
    ordered = sorted(names.codes)
    remap = np.empty(len(ordered), np.float64)
    for rank, name in enumerate(ordered):
        remap[names.codes[name]] = rank
    k = len(ordered)
    if task == "regression":
        raise IngestError(f"The labels of {where} are class names ({', '.join(ordered[:5])}"
                          f"{' ...' if k > 5 else ''}), not numbers to predict.",
                          "Use --task auto, binary or multiclass.")
    if positive_label is not None:
        pos = str(positive_label)
        if pos not in names.codes:
            raise IngestError(f"--positive-label {pos} is not one of the class names of "
                              f"{where} ({', '.join(ordered[:10])}{' ...' if k > 10 else ''}).",
                              "Pass one of the class names.")
        rank = float(ordered.index(pos))
        return ("binary", {"positive": 1.0, "negative": 0.0, "names": ["rest", pos],
                           "one_vs_rest": True},
                lambda lab: np.where(remap[lab.astype(np.int64)] == rank, 1.0, -1.0))
    if task == "binary" or (task == "auto" and k <= 2):
        if k > 2:
            raise IngestError(f"--task binary needs at most two classes; {where} name {k}.",
                              "Use --task multiclass or --positive-label NAME.")
        return ("binary", {"positive": float(k - 1), "negative": 0.0 if k == 2 else None,
                           "names": ordered},
                lambda lab: np.where(remap[lab.astype(np.int64)] == k - 1, 1.0, -1.0))
    return ("multiclass", {"classes": [float(c) for c in range(k)], "names": ordered},
            lambda lab: remap[lab.astype(np.int64)])


def check_two_classes(store) -> None:
    """Refuse to train on (or cross-validate) a binary store whose rows hold one class: a
    classifier of one class scores 100 % on it and means nothing."""
    one = store.label_map.get("one_class")
    if store.task == "binary" and one is not None:
        raise ParameterError(
            f"Every row of {store.path} has the label {float(one):g}: a classifier needs "
            "rows of both classes.",
            "Train on data holding both classes (check the label column); a store of one "
            "class serves as a test set (ooc-predict, --test).")
