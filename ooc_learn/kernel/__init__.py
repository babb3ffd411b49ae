"""Kernel SVM: SMO, alpha-seeded k-fold CV and exact leave-one-out.

>>> from ooc_learn.kernel import svm_cv, loo_error, train_svm   # doctest: +SKIP
"""

from .cv import make_folds, svm_cv
from .smo import KernelMatrix, SVMModel, train_svm

__all__ = ["svm_cv", "make_folds", "train_svm", "SVMModel", "KernelMatrix", "loo_error",
           "LOOResult"]


def __getattr__(name):
    if name in ("loo_error", "LOOResult"):
        from . import loo

        return getattr(loo, name)
    raise AttributeError(f"module 'ooc_learn.kernel' has no attribute {name!r}")
