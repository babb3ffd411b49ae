"""Incremental learners for TreeCV (the update/copy/score protocol)."""

from .base import IncrementalLearner, SaveRevertLearner
from .linear import ExactLeastSquares, LeastSquaresSGD, Pegasos
from .one_vs_rest import OneVsRest
from .sklearn_adapter import SklearnPartialFit

__all__ = ["IncrementalLearner", "SaveRevertLearner", "Pegasos", "LeastSquaresSGD",
           "ExactLeastSquares", "OneVsRest", "SklearnPartialFit"]
