"""Baseline: the O(m n^2)-per-lambda LOO of sparse RLS (Cawley & Talbot 2004).

Objective per lambda: a = P^-1 K_B y with P = K_B K_B^T + lam K_BB (same model as
:class:`SparseRLS`, same diagonal shift). LOO residuals from the hat matrix
H = K_B^T P^-1 K_B:  f_i = (yhat_i - h_ii y_i) / (1 - h_ii). With K_BB = C C^T and R = C^-1 K_B,
H = R^T (R R^T + lam I)^-1 R, so h_ii are the squared column norms of L^-1 R for the Cholesky
factor R R^T + lam I = L L^T. Basis vectors stay in the basis (the setting the
baseline is defined for, Pahikkala et al. 2012, Section 6.1), so it matches
``SparseRLS.loo_predict(basis_mode="keep_no_loss")``. Every lambda costs a Cholesky (n^3/3) and a
triangular solve over all rows (m n^2); only the kernel, R (and, with ``reuse_gram``, R R^T)
are shared across lambdas. Used for benchmarks and as a reference in tests.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la

from ooc_learn.storage.arrays import row_sqnorms

from .checks import check_lambdas
from .kernel import KernelSpec, kernel_block
from .source import as_label_matrix

__all__ = ["cawley_talbot_loo"]


def cawley_talbot_loo(X, y, lams, *, basis, kernel: str = "rbf", gamma=None, degree: int = 3,
                      coef0: float = 1.0, jitter: float = 1e-8,
                      reuse_gram: bool = True) -> np.ndarray:
    """LOO predictions (c, m[, v]) of sparse RLS by the Cawley-Talbot hat-matrix formula.

    Parameters
    ----------
    X : ndarray or CSR (m, d); y : (m,) or (m, v); lams : lambdas (> 0);
    basis : basis row positions; kernel, gamma, degree, coef0, jitter : as in SparseRLS.
    reuse_gram : compute K_B K_B^T once for all lambdas (otherwise once per lambda).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 2)); y = X[:, 0]
    >>> cawley_talbot_loo(X, y, [0.1, 1.0], basis=np.arange(10)).shape
    (2, 50)
    """
    lams = check_lambdas(lams, "cawley_talbot_loo")
    spec = KernelSpec(kernel, gamma, degree, coef0, owner="cawley_talbot_loo")
    m = X.shape[0]
    Y, vector = as_label_matrix(y, m, "cawley_talbot_loo")
    basis = np.asarray(basis, dtype=np.int64)
    g = spec.resolved_gamma(X.shape[1])
    XB = X[basis]
    sqB = row_sqnorms(XB)
    KB = kernel_block(XB, X, spec, g, sqA=sqB)               # n x m
    KBB = KB[:, basis].copy()
    delta = jitter * (float(np.diag(KBB).mean()) if np.diag(KBB).mean() > 0 else 1.0)
    n = basis.size
    KB[np.arange(n), basis] += delta
    KBB[np.diag_indices(n)] += delta
    # P = C (R R^T + lam I) C^T with K_BB = C C^T and R = C^-1 K_B, so the hat matrix is
    # R^T (R R^T + lam I)^-1 R: the same O(m n^2)-per-lambda algorithm, without the squared
    # condition number of forming P from K_B K_B^T.
    C = la.cholesky(KBB, lower=True, check_finite=False)
    R = la.solve_triangular(C, KB, lower=True, check_finite=False)
    del KB
    Ry = R @ Y
    G = R @ R.T if reuse_gram else None
    out = np.empty((lams.size, m, Y.shape[1]))
    for k, lam in enumerate(lams):
        P = (G if G is not None else R @ R.T).copy()
        P[np.diag_indices(n)] += lam
        L = la.cholesky(P, lower=True, check_finite=False)
        a = la.cho_solve((L, True), Ry, check_finite=False)
        Z = la.solve_triangular(L, R, lower=True, check_finite=False)
        h = np.einsum("ij,ij->j", Z, Z)
        yhat = R.T @ a
        out[k] = (yhat - h[:, None] * Y) / (1.0 - h)[:, None]
    return out[..., 0] if vector else out
