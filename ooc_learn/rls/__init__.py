"""Sparse regularized least squares with fast hold-out, k-fold and LOO CV.

Pahikkala, Suominen, Boberg, "Efficient cross-validation for kernelized least-squares
regression with sparse basis expansions", Machine Learning 87 (2012).

>>> from ooc_learn.rls import SparseRLS                        # doctest: +SKIP
>>> model = SparseRLS(kernel="rbf", n_basis=500).fit(X, y)       # doctest: +SKIP
>>> best, curve, model, lams = model.select_lambda(np.logspace(-4, 2, 20))  # doctest: +SKIP
"""

from .cawley_talbot import cawley_talbot_loo
from .crossval import LambdaSelection
from .kfold_predict import make_folds
from .model import SparseRLS

__all__ = ["SparseRLS", "LambdaSelection", "make_folds", "cawley_talbot_loo"]
