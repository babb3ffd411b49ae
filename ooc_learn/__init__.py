"""ooc-learn: out-of-core learning with exact, fast cross-validation under one memory cap.

Data are ingested once into a block store (HDF5) with a metric-forest index (LMDB); learners
stream blocks under a configurable memory cap.

>>> import ooc_learn                                        # doctest: +SKIP
>>> store = ooc_learn.ingest(["train.svm"], "train.store")  # doctest: +SKIP
>>> store.n_samples, store.n_blocks                         # doctest: +SKIP

Public names are imported lazily so that ``import ooc_learn.storage`` stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (never a submodule of the same name: importing one
# binds it on the package, over the name; tests/test_packaging.py checks)
_EXPORTS = {
    "MemoryBudget": "ooc_learn.storage.budget",
    "OOCError": "ooc_learn.storage.errors",
    "UsageError": "ooc_learn.storage.errors",
    "ParameterError": "ooc_learn.storage.errors",
    "IngestError": "ooc_learn.storage.errors",
    "NonFiniteError": "ooc_learn.storage.errors",
    "StoreFormatError": "ooc_learn.storage.errors",
    "StoreExistsError": "ooc_learn.storage.errors",
    "BudgetExceededError": "ooc_learn.storage.errors",
    "IndexStateError": "ooc_learn.storage.errors",
    "ModelMismatchError": "ooc_learn.storage.errors",
    "ClosedError": "ooc_learn.storage.errors",
    "ingest": "ooc_learn.api",
    "ingest_arrays": "ooc_learn.api",
    "open_store": "ooc_learn.storage.store",
    "Store": "ooc_learn.storage.store",
    "CVResult": "ooc_learn.cv.result",
    "train": "ooc_learn.training",
    "LinearModel": "ooc_learn.model",
    "load_model": "ooc_learn.model",
    "tree_cv": "ooc_learn.cv.treecv",
    "kfold_cv": "ooc_learn.cv.kfold",
    "linear_cv": "ooc_learn.cv.linear",
    "linear_cv_grid": "ooc_learn.cv.linear",
    "linear_c_search": "ooc_learn.cv.c_search",
    "Pegasos": "ooc_learn.learners",
    "LeastSquaresSGD": "ooc_learn.learners",
    "ExactLeastSquares": "ooc_learn.learners",
    "SklearnPartialFit": "ooc_learn.learners",
    "OneVsRest": "ooc_learn.learners",
    "svm_cv": "ooc_learn.kernel.cv",
    "loo_error": "ooc_learn.kernel.loo",
    "LOOResult": "ooc_learn.kernel.loo",
    # the scikit-learn estimators (importing one imports scikit-learn); the sparse RLS solver
    # itself, without scikit-learn, is ooc_learn.rls.SparseRLS
    "SparseRLS": "ooc_learn.sklearn",
    "LinearSVC": "ooc_learn.sklearn",
    "LinearSVR": "ooc_learn.sklearn",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ooc_learn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
