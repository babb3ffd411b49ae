"""Leave-one-out predictions of a fitted :class:`~.model.SparseRLS` in O(m n c v) after
training (Corollary 3): :func:`loo_path_model`.

For the lambda path the hat diagonal comes from U = R^T V (the cached rows rotated in place,
2 m n^2 once); for one lambda with R^T rows (not U) at hand it comes from the Cholesky factor
of A + lam I instead (:func:`_loo_rows_chol`: one triangular solve over the rows, m n^2).
"""

from __future__ import annotations

import time

import numpy as np
import scipy.linalg as la

from .checks import BASIS_MODES_LOO, check_basis_mode, check_lambdas
from .holdout import chol_shifted, lam_tilde, loo_basis_remove_path, loo_rows_path

__all__ = ["loo_path_model"]


def loo_path_model(model, lams, basis_mode: str) -> np.ndarray:
    """LOO predictions (c, m, v) in O(m n c v) after training (Corollary 3)."""
    owner = "SparseRLS.loo_predict"
    check_basis_mode(basis_mode, BASIS_MODES_LOO, owner)
    lams = check_lambdas(lams, owner)
    model.check_fitted()
    m, v = model.Y_.shape
    t0 = time.perf_counter()
    lt = lam_tilde(model.eigvals_, lams)
    Y, z0, Q, B = model.Y_, model.z0_, model.Q_, model.basis_
    n, c = Q.shape[0], lams.size
    with model.budget_.reservation(8 * c * m * v, "LOO predictions"):
        out = np.empty((c, m, v))
        u_cached = model.row_cache_kind == "u"
        strategy = "eig"
        if c == 1 and not u_cached and _loo_rows_chol(model, float(lams[0]), out[0]):
            strategy = "chol"
        else:
            # loo_rows_path's temporaries a row: U * U, the hat diagonal, yhat and f (c v)
            for a, b, U in model.iter_u_chunks(extra=8 * (n + 3 * c * v + 2 * c)):
                out[:, a:b] = loo_rows_path(U, Y[a:b], lt, z0)
        # U rows of the basis rows (n^2), one n x n product at a time and (n, c, v) terms
        with model.budget_.reservation(8 * (2 * n * n + 8 * n * c * v), "LOO of basis rows"):
            if basis_mode in ("remove", "keep"):
                UB = model.chol_ @ model.V_           # U rows of the basis rows: K~_BB Q = C V
                if basis_mode == "remove":
                    out[:, B] = loo_basis_remove_path(UB, Q, Y[B], lt, z0)
                else:
                    out[:, B] = np.einsum("hn,cn,nv->chv", UB, lt, z0, optimize=True)
                del UB
            elif basis_mode == "skip":
                out[:, B] = np.nan
    model.cv_stats_ = {"method": "loo", "strategy": strategy,
                       "seconds": time.perf_counter() - t0}
    return out


def _loo_rows_chol(model, lam: float, out) -> bool:
    """Single-lambda LOO of every row as if it were not a basis row (Corollary 3 with
    P^-1 = C^-T (A + lam I)^-1 C^-1 factored by A + lam I = L L^T instead of the eigenvectors):
    h_i = |L^-1 r_i|^2, yhat_i = r_i^T w with w = (A + lam I)^-1 C^-1 K_B y, f_i = (yhat_i -
    h_i y_i) / (1 - h_i). One triangular solve over the R^T rows (m n^2 flops) instead of the
    rotation U = R^T V (2 m n^2) that the lambda path needs; the cached R^T rows stay as they
    are. Writes ``out`` (m, v); False when A + lam I is not numerically positive definite."""
    n, v = model.chol_.shape[0], model.Y_.shape[1]
    if not model.budget_.try_reserve(8 * n * n):           # the factor L
        return False
    try:
        L = chol_shifted(model.A_, lam)
        if L is None:
            return False
        w = la.cho_solve((L, True), model.KyR_, check_finite=False)
        Y = model.Y_
        # a chunk's X = L^-1 R^T and, formed from X, its kernel rows and R^T rows (the
        # previous chunk's still held), and the (rows, v) terms
        cached = model.row_cache_kind == "rt"
        for a, b, RT in model.iter_rt_chunks(8 * ((1 if cached else 3) * n + 4 * v)):
            X = la.solve_triangular(L, RT.T, lower=True, check_finite=False)
            h = np.einsum("ij,ij->j", X, X)
            del X
            out[a:b] = (RT @ w - h[:, None] * Y[a:b]) / (1.0 - h)[:, None]
        return True
    finally:
        model.budget_.release(8 * n * n)
