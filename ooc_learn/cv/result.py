"""The result every cross-validation method returns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ooc_learn._json import jsonable

__all__ = ["CVResult"]


@dataclass(repr=False)
class CVResult:
    """A cross-validation estimate with the work it took.

    Attributes
    ----------
    estimate : float
        The CV estimate (mean per-row loss, error rate or accuracy: ``metric`` says which).
    fold_scores : ndarray of shape (k,)
        The score of each fold on its own held-out rows.
    metric : str
        What ``estimate`` and ``fold_scores`` measure, e.g. ``"accuracy"``, ``"hinge"``,
        ``"squared"``.
    method : str
        Which CV method produced it, e.g. ``"tree"``, ``"standard"``, ``"smo-sir"``.
    folds : ndarray of shape (n,), optional
        The fold of each row (indexed by row id / row position of the input).
    predictions : ndarray, optional
        Per-row predictions or decision values from the model that held the row out.
    stats : dict
        The work done: ``updates``, ``rows_read``, ``smo_iterations``, ``kernel_evaluations``,
        ``seconds`` ... whichever apply, so speed-ups can be shown, not claimed.
    """

    estimate: float
    fold_scores: np.ndarray
    metric: str = "loss"
    method: str = ""
    folds: np.ndarray | None = None
    predictions: np.ndarray | None = None
    stats: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return len(self.fold_scores)

    def __repr__(self) -> str:
        # the per-row arrays by their shapes: a notebook shows the result, not 100k numbers
        return (f"CVResult({self.metric}={self.estimate:.6g}, method={self.method!r}, "
                f"k={self.k}; stats: {', '.join(map(str, self.stats))})")

    def summary(self) -> str:
        fs = np.asarray(self.fold_scores, dtype=float)
        lines = [f"{self.method or 'CV'}: {self.k} folds, {self.metric} = {self.estimate:.6g}"
                 + (f" (fold std {fs.std():.3g})" if fs.size > 1 else "")]
        for key, value in self.stats.items():
            if isinstance(value, float):
                lines.append(f"  {key}: {value:.4g}")
            elif isinstance(value, (list, tuple, dict)) and len(value) > 4:
                lines.append(f"  {key}: {len(value)} entries (to_dict() has them)")
            else:
                lines.append(f"  {key}: {value}")
        return "\n".join(lines)

    __str__ = summary

    def to_dict(self, *, per_row: bool = False) -> dict:
        """A JSON-ready dict; per-row arrays (``folds``, ``predictions``) only if asked."""
        out = {"estimate": float(self.estimate), "metric": self.metric, "method": self.method,
               "k": self.k, "fold_scores": jsonable(np.asarray(self.fold_scores)),
               "stats": jsonable(self.stats)}
        if per_row:
            out["folds"] = jsonable(self.folds)
            out["predictions"] = jsonable(self.predictions)
        return out

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(**kwargs))
