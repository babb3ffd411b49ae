"""Kernel blocks for sparse RLS: k(X_A, X_B) in float64 for dense or CSR rows.

The RBF block is computed as ``exp(-gamma * (|a|^2 + |b|^2 - 2 a.b))`` with the cross term from
one BLAS GEMM (or one sparse product) and the squared norms in float64; the exponent is taken in
a fused numba kernel (:mod:`._kernels`) so that no m x n temporary is made besides the result.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.arrays import row_sqnorms
from ooc_learn.storage.errors import ParameterError

from . import _kernels

__all__ = ["KernelSpec", "kernel_block", "kernel_diag"]

KERNELS = ("rbf", "linear", "poly")


class KernelSpec:
    """A kernel name and its parameters, checked once.

    ``gamma=None`` means ``1 / n_features`` (fixed when the data's width is known).
    """

    def __init__(self, kernel: str = "rbf", gamma=None, degree: int = 3, coef0: float = 1.0,
                 owner: str = "SparseRLS"):
        if kernel not in KERNELS:
            raise ParameterError(
                f"The 'kernel' parameter of {owner} must be one of {KERNELS}. "
                f"Got {kernel!r} instead.", "Pick 'rbf', 'linear' or 'poly'.")
        if gamma is not None and not (np.isfinite(gamma) and gamma > 0):
            raise ParameterError(
                f"The 'gamma' parameter of {owner} must be > 0 or None. Got {gamma!r} instead.",
                "None uses 1 / n_features.")
        if kernel == "poly":
            if int(degree) != degree or degree < 1:
                raise ParameterError(
                    f"The 'degree' parameter of {owner} must be an integer >= 1. "
                    f"Got {degree!r} instead.")
            if not np.isfinite(coef0):
                raise ParameterError(
                    f"The 'coef0' parameter of {owner} must be finite. Got {coef0!r} instead.")
        self.kernel, self.gamma, self.degree, self.coef0 = kernel, gamma, int(degree), float(coef0)

    def resolved_gamma(self, n_features: int) -> float:
        return float(self.gamma) if self.gamma is not None else 1.0 / max(int(n_features), 1)


def _as64(X):
    """Float64 view/copy of a block: dense ndarray or CSR (kept sparse)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        return X if X.dtype == np.float64 else X.astype(np.float64)
    return np.ascontiguousarray(X, dtype=np.float64)


# _cross takes XA's rows in float64 a slice at a time, so that copy stays about this size
# whatever the caller's chunk: the callers reserve the (rows, n) result and their own
# temporaries, and the copy grows with a row's stored values (the features of a dense row,
# the entries of a CSR row), not with n (whole, a 8,388-row chunk of 784 features was 53 MB
# beside the reservations: sparse RLS's LOO under --memory 768M peaked at 787 MiB under a
# memory watcher; bench-log, 2026-11-27)
CROSS_SLICE_BYTES = 4 << 20


def _cross(XA, XB) -> np.ndarray:
    """Dense float64 ``XA @ XB.T`` for any mix of dense / CSR operands."""
    B = _as64(XB)
    m = XA.shape[0]
    out = np.empty((m, XB.shape[0]), dtype=np.float64)
    stored = XA.nnz / max(m, 1) if sp.issparse(XA) else XA.shape[1]  # values a row
    step = max(1, int(CROSS_SLICE_BYTES // (8 * max(stored, 1))))
    for a in range(0, m, step):
        A = _as64(XA[a:a + step])
        if sp.issparse(A) and sp.issparse(B):
            out[a:a + step] = (A @ B.T).toarray()
        elif sp.issparse(A):
            out[a:a + step] = A @ B.T
        elif sp.issparse(B):
            out[a:a + step] = (B @ A.T).T
        else:
            np.matmul(A, B.T, out=out[a:a + step])
    return out


def kernel_block(XA, XB, spec: KernelSpec, gamma: float, *, sqA=None, sqB=None) -> np.ndarray:
    """The kernel block ``K[i, j] = k(XA[i], XB[j])`` as a float64 C-contiguous array.

    Parameters
    ----------
    XA, XB : ndarray or scipy.sparse.csr_matrix
        Rows (dense float32/float64 or CSR).
    spec : KernelSpec
    gamma : float
        The resolved gamma (``spec.resolved_gamma(d)``).
    sqA, sqB : ndarray, optional
        Float64 squared row norms (RBF only), computed when not given.

    Examples
    --------
    >>> import numpy as np
    >>> K = kernel_block(np.eye(2), np.eye(2), KernelSpec("rbf"), 0.5)
    >>> bool(np.isclose(K[0, 1], np.exp(-1.0)))
    True
    """
    G = _cross(XA, XB)
    if spec.kernel == "linear":
        return G
    if spec.kernel == "poly":
        _kernels.poly_inplace(G, gamma, spec.coef0, spec.degree)
        return G
    sqA = row_sqnorms(XA) if sqA is None else np.asarray(sqA, dtype=np.float64)
    sqB = row_sqnorms(XB) if sqB is None else np.asarray(sqB, dtype=np.float64)
    _kernels.rbf_inplace(G, sqA, sqB, gamma)
    return G


def kernel_diag(X, spec: KernelSpec, gamma: float, *, sq=None) -> np.ndarray:
    """``k(x_i, x_i)`` for every row (float64)."""
    if spec.kernel == "rbf":
        return np.ones(X.shape[0], dtype=np.float64)
    sq = row_sqnorms(X) if sq is None else np.asarray(sq, dtype=np.float64)
    if spec.kernel == "linear":
        return sq
    return (gamma * sq + spec.coef0) ** spec.degree
