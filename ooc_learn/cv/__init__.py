"""Cross-validation: TreeCV, standard k-fold, the linear SVM / regression folds of a store
(``linear_cv``), and the shared result type."""

from .kfold import kfold_cv
from .c_search import linear_c_search
from .linear import linear_cv, linear_cv_grid
from .result import CVResult
from .treecv import tree_cv

__all__ = ["CVResult", "tree_cv", "kfold_cv", "linear_cv", "linear_cv_grid", "linear_c_search"]
