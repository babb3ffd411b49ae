"""Incremental learners for TreeCV (the update/copy/score protocol)."""

from .base import IncrementalLearner, SaveRevertLearner
from .linear import ExactLeastSquares, LeastSquaresSGD, Pegasos
from .sklearn_adapter import SklearnPartialFit

__all__ = ["IncrementalLearner", "SaveRevertLearner", "Pegasos", "LeastSquaresSGD",
           "ExactLeastSquares", "SklearnPartialFit"]
