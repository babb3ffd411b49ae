"""Cross-validation: TreeCV, standard k-fold, and the shared result type."""

from .kfold import kfold_cv
from .result import CVResult
from .treecv import tree_cv

__all__ = ["CVResult", "tree_cv", "kfold_cv"]
