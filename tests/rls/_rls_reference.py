"""The slow, obviously-correct reference for the sparse RLS tests (brute-force refits)."""

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from ooc_learn.rls.kernel import kernel_block


def brute_predict(model, X, Y, train_rows, basis_rows, lam, pred_rows, K=None):
    """Sparse RLS trained from scratch on ``train_rows`` with basis ``basis_rows`` (eq. 12),
    with the model's kernel and its diagonal shift K~ = K + delta I on training rows."""
    if K is None:
        K = shifted_kernel(model, X)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    # min ||y - K_LT^T a||^2 + lam a^T K_LL a as the augmented least-squares problem in
    # b = C^T a (K_LL = C C^T): [R^T; sqrt(lam) I] b ~ [y; 0] with R = C^-1 K_LT. Solving it by
    # QR (lstsq) avoids squaring the condition number as the normal equations P a = K y do.
    C = np.linalg.cholesky(K[np.ix_(basis_rows, basis_rows)])
    R = scipy.linalg.solve_triangular(C, K[np.ix_(basis_rows, train_rows)], lower=True)
    nb = len(basis_rows)
    A = np.vstack([R.T, np.sqrt(lam) * np.eye(nb)])
    rhs = np.vstack([Y[train_rows], np.zeros((nb, Y.shape[1]))])
    b = scipy.linalg.lstsq(A, rhs)[0]
    a = scipy.linalg.solve_triangular(C.T, b, lower=False)
    return K[np.ix_(pred_rows, basis_rows)] @ a

def shifted_kernel(model, X):
    """The training kernel matrix K~ = K + delta I the model was fitted with."""
    K = kernel_block(X, X, model.spec, model.gamma_)
    K[np.diag_indices(X.shape[0])] += model.delta_
    return K


def make_data(rng, m=240, d=4, v=1, sparse=False):
    X = rng.normal(size=(m, d))
    if sparse:
        X[rng.random(size=X.shape) < 0.5] = 0.0
    cols = [np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.normal(size=m)]
    for j in range(1, v):
        cols.append(X[:, j % d] ** 2 - 0.3 * X[:, 0] + 0.1 * rng.normal(size=m))
    Y = np.stack(cols, axis=1)
    Xin = sp.csr_matrix(X.astype(np.float32)) if sparse else X
    return Xin, X if not sparse else X.astype(np.float32).astype(np.float64), Y
