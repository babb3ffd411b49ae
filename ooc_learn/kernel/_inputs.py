"""Parameter checks and input preparation shared by the kernel-SVM entry points.

Parameters are checked before any data are read, with one message template. Inputs are a
dense array, a scipy sparse matrix or a :class:`~ooc_learn.storage.store.Store`; a store is
gathered into memory when its rows fit under the store's memory cap.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.budget import MemoryBudget, format_size
from ooc_learn.storage.errors import BudgetExceededError, ParameterError, UsageError

KERNELS = {"linear": 0, "rbf": 1, "poly": 2}


def _fail(name, caller, rule, value, hint):
    raise ParameterError(f"The {name!r} parameter of {caller} must be {rule}. "
                         f"Got {value!r} instead.", hint)


def check_positive(value, name, caller, hint=""):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)) or value <= 0:
        _fail(name, caller, "a finite number > 0", value, hint)
    return float(value)


def check_choice(value, name, caller, choices):
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        _fail(name, caller, f"one of {shown}", value, "Pick one of the listed values.")
    return value


def check_int(value, name, caller, low, hint=""):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        _fail(name, caller, f"an integer >= {low}", value, hint)
    return int(value)


def check_kernel_params(caller, kernel, C, gamma, degree, coef0, tol):
    """Validate the common kernel-SVM parameters; returns them normalised."""
    check_choice(kernel, "kernel", caller, tuple(KERNELS))
    C = check_positive(C, "C", caller, "C is the box bound of the dual; try values such as "
                                       "0.1, 1, 10.")
    if gamma is not None and gamma not in ("scale", "auto"):
        gamma = check_positive(gamma, "gamma", caller,
                               "Pass a float > 0, 'scale', 'auto' or None (1/n_features).")
    degree = check_int(degree, "degree", caller, 1, "Polynomial degree, e.g. 2 or 3.")
    if isinstance(coef0, bool) or not isinstance(coef0, numbers.Real) \
            or not math.isfinite(float(coef0)):
        _fail("coef0", caller, "a finite number", coef0, "e.g. 0 or 1.")
    tol = check_positive(tol, "tol", caller, "The eps-KKT tolerance; LIBSVM uses 1e-3.")
    return kernel, C, gamma, degree, float(coef0), tol


def resolve_gamma(gamma, X) -> float:
    d = X.shape[1]
    if gamma is None or gamma == "auto":
        return 1.0 / max(d, 1)
    if gamma == "scale":
        if sp.issparse(X):
            mean = np.asarray(X.mean()).item()
            var = np.asarray(X.multiply(X).mean()).item() - mean * mean
        else:
            var = float(np.asarray(X, dtype=np.float64).var())
        return 1.0 / (d * var) if var > 0 else 1.0
    return float(gamma)


def is_open_store(X) -> bool:
    """Whether ``X`` reads rows like an open :class:`~ooc_learn.storage.store.Store`."""
    return hasattr(X, "read_range") and hasattr(X, "n_samples") and hasattr(X, "budget")


def gather_store(store, caller):
    """Read every row of a store, reserving its bytes from the store's memory cap.

    Returns (X, y, nbytes reserved). Raises :class:`BudgetExceededError` naming the cap needed.
    """
    n, d = int(store.n_samples), int(store.n_features)
    if hasattr(store, "estimated_bytes"):
        need = int(store.estimated_bytes())
    elif getattr(store, "layout", "dense") == "csr":
        need = int(getattr(store, "nnz", n * d)) * 8 + (n + 1) * 8 + n * 12
    else:
        need = n * d * 4 + n * 12
    budget: MemoryBudget = store.budget
    if not budget.try_reserve(need):
        raise BudgetExceededError(
            f"{caller} gathers all {n} rows of the store into memory ({format_size(need)}), "
            f"but only {format_size(budget.available)} of the {format_size(budget.cap)} "
            f"memory cap is free.",
            f"Raise --memory (or OOC_MEMORY) to at least "
            f"{format_size(budget.cap_needed(need), up=True)}, or use a subset of rows.")
    X, y, _ = store.read_range(0, n)
    return X, np.asarray(y), need


def prepare_X(X):
    """float32 C-contiguous dense array or canonical float32 CSR; rejects non-finite values."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float32)
        X.sum_duplicates()
        X.sort_indices()
        if not np.all(np.isfinite(X.data)):
            bad = int(np.searchsorted(X.indptr, np.flatnonzero(~np.isfinite(X.data))[0],
                                      side="right") - 1)
            raise UsageError(f"X contains NaN or infinity (first at row {bad}).",
                             "Remove or impute non-finite values before training.")
        X.indptr = X.indptr.astype(np.int64)
        X.indices = X.indices.astype(np.int32)
        return X
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float32))
    if X.ndim != 2:
        raise UsageError(f"X must be 2-dimensional. Got shape {X.shape} instead.",
                         "Reshape a single feature with X.reshape(-1, 1).")
    finite = np.isfinite(X)
    if not finite.all():
        bad = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise UsageError(f"X contains NaN or infinity (first at row {bad}).",
                         "Remove or impute non-finite values before training.")
    return X


def prepare_y(y, n, caller):
    """Binary labels -> float64 +-1 and the two original classes (classes[1] maps to +1)."""
    y = np.asarray(y).ravel()
    if y.shape[0] != n:
        raise UsageError(f"{caller}: X has {n} rows but y has {y.shape[0]} labels.",
                         "Pass one label per row.")
    if y.dtype.kind in "fc" and not np.all(np.isfinite(y)):
        raise UsageError(f"{caller}: y contains NaN or infinity.", "Drop unlabeled rows.")
    classes = np.unique(y)
    if classes.shape[0] != 2:
        what = "only one class" if classes.shape[0] == 1 else f"{classes.shape[0]} classes"
        raise UsageError(f"{caller} needs exactly two classes in y; got {what}.",
                         "Binary classification only: map labels to two classes "
                         "(e.g. one class vs the rest).")
    ypm = np.where(y == classes[1], 1.0, -1.0)
    return ypm, classes


def prepare_inputs(X, y, caller):
    """Gather a store or convert arrays; returns (X, y_pm, classes, store_bytes, budget)."""
    store_bytes, store_budget = 0, None
    if is_open_store(X):
        store_budget = X.budget
        X, y_store, store_bytes = gather_store(X, caller)
        if y is None:
            y = y_store
    if y is None:
        raise UsageError(f"{caller} needs labels y.", "Pass y, or a Store that holds labels.")
    try:
        X = prepare_X(X)
        ypm, classes = prepare_y(y, X.shape[0], caller)
    except Exception:
        if store_budget is not None:
            store_budget.release(store_bytes)
        raise
    return X, ypm, classes, store_bytes, store_budget
