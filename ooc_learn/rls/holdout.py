"""Hold-out, k-fold and LOO predictions of sparse RLS (Pahikkala et al. 2012, Section 5).

Notation (DESIGN.md, "Sparse RLS CV"): basis B (n rows), K_BB = C C^T, C^-1 K_B K_B^T C^-T =
V diag(Lam) V^T, Q = C^-T V, so that P^-1 = Q diag(1 / (Lam + lam)) Q^T. For all m training
rows the model caches z0 = Q^T K_B y (n x v) and, per row i, u_i = (K_B^T Q)_i (the matrix U).

Holding out rows H with E = H & B removed from the basis (L = B \\ E), Proposition 1 gives

    U~ = U_H - K_HE Q_E                       (= K_HL Q_L)
    z~ = z0 - Q_E^T (K_B y)_E - U~^T y_H      (= Q_L^T (K_LH' y_H'))
    Lam~' = Lam~ - Lam~ Q_E^T (Q_E Lam~ Q_E^T)^-1 Q_E Lam~       (so K_HL W K_LH = U~ Lam~' U~^T)
    J = U~ Lam~' U~^T,  r = U~ Lam~' z~,  f_H = (I - J)^-1 r                (eq. 26)

Because Lam~' Q_E^T = 0, the corrections K_HE Q_E and Q_E^T (K_B y)_E vanish under Lam~': we use
U~ -> U_H and z~ -> z0 - U_H^T y_H. The result is the same in exact arithmetic, needs no kernel
values K_HE (so no reads of X_H once U is cached) and, above all, does not cancel the large
entries of Q_E, which grow like 1 / sqrt(lambda_min(K_BB)): with the paper's Ũ the error grows
with cond(K_BB); this way it stays at the level of the keep modes. Lam~' itself is applied as
Lam~^(1/2) Pi Lam~^(1/2), Pi the orthogonal projector off range(Lam~^(1/2) Q_E^T), for the same
reason. With E empty (Corollary 2) there is no projector.

Both sides of the SMW identity are implemented (eq. 36): the |H| side solves an |H| x |H|
system per lambda; the n side works with the hold-in Gram matrix in Q coordinates,
Lam - U_H^T U_H (projected on null(Q_E) when E is not empty, because a_E = 0 there), either by
one Cholesky per lambda or, for long lambda grids, by one eigendecomposition per fold after which
each lambda costs O(n^2 v + |H| n v). A flop model picks the cheapest, so one hold-out costs
O(min(|H|^2 n, |H| n^2)) as in the paper.

All functions are pure: arrays in, arrays out, float64.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la
from scipy.linalg import lapack
from scipy.linalg.blas import dsyr2k as syr2k
from scipy.linalg.blas import dsyrk as syrk

__all__ = ["lam_tilde", "mirror_upper", "holdout_path", "n_side_weights", "gram_weights",
           "loo_rows_path", "loo_basis_remove_path", "choose_strategy", "chol_shifted"]

STRATEGIES = ("small", "chol", "eig", "tri")


def lam_tilde(Lam: np.ndarray, lams: np.ndarray) -> np.ndarray:
    """``1 / (Lam + lam)`` for every lambda: shape (c, n)."""
    return 1.0 / (Lam[None, :] + np.asarray(lams, dtype=np.float64)[:, None])


def mirror_upper(A: np.ndarray, block: int = 64) -> np.ndarray:
    """Copy the upper triangle of the square ``A`` onto its lower triangle in place (the
    output convention of dsyrk / dsyr2k with lower=0) and return ``A``: a blocked copy with
    no n x n temporaries (np.triu(A) + np.triu(A, 1).T makes three)."""
    n = A.shape[0]
    for j in range(0, n, block):
        k = min(j + block, n)
        A[k:, j:k] = A[j:k, k:].T
        D = A[j:k, j:k]
        D[...] = np.triu(D) + np.triu(D, 1).T
    return A


def strategy_costs(h: int, n: int, e: int, c: int, v: int) -> dict:
    """Estimated flops of each strategy (see :func:`choose_strategy`)."""
    small = c * (h * h * n + h ** 3 / 3.0 + h * n * (v + e))
    proj = 4.0 * n * n * e
    chol = h * n * n + proj + c * (n ** 3 / 3.0 + n * n * v + h * n * v)
    eig = h * n * n + proj + 10.0 * n ** 3 + c * (n * n * v + h * n * v)
    tri = h * n * n + proj + 2.0 * n ** 3 + c * (4.0 * n * n * v + h * n * v)
    return {"small": small, "chol": chol, "eig": eig, "tri": tri}


def choose_strategy(h: int, n: int, e: int, c: int, v: int) -> str:
    """The cheapest way (estimated flops) to hold out h rows for c lambdas.

    ``small``: the |H| x |H| system per lambda (left side of eq. 36);
    ``chol``: the n x n hold-in system per lambda (right side of eq. 36);
    ``eig``: one n x n eigendecomposition, then O(|H| n v) per lambda;
    ``tri``: one Householder tridiagonal reduction (4/3 n^3, a fraction of ``eig``), then a
    tridiagonal solve and two reflector sweeps, O(n^2 v + |H| n v), per lambda.
    """
    costs = strategy_costs(h, n, e, c, v)
    return min(costs, key=costs.get)


def _orth_basis(QE: np.ndarray) -> np.ndarray:
    """Orthonormal basis (n x |E|) of range(Q_E^T); Q is invertible so Q_E^T has full rank."""
    Y, _ = la.qr(QE.T, mode="economic")
    return Y


def _project(M: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """``Pi M Pi`` for the projector Pi = I - Y Y^T onto null(Q_E) (M symmetric).

    Pi M Pi = M - Y G^T - G Y^T with G = M Y - Y (Y^T M Y) / 2: one GEMM and one rank-2e
    symmetric update (dsyr2k, upper triangle, mirrored)."""
    MY = M @ Y
    G = MY - 0.5 * (Y @ (Y.T @ MY))
    out = syr2k(-1.0, Y, G, beta=1.0, c=np.asfortranarray(M), trans=0, lower=0)
    return mirror_upper(out)


def chol_shifted(A: np.ndarray, lam: float):
    """The lower Cholesky factor of A + lam I (A untouched), None when it is not
    numerically positive definite."""
    Ap = A.copy(order="F")
    Ap[np.diag_indices(A.shape[0])] += lam
    try:
        return la.cholesky(Ap, lower=True, overwrite_a=True, check_finite=False)
    except la.LinAlgError:
        return None


def _spd_solve(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    try:
        cf = la.cho_factor(A, lower=True, check_finite=False)
    except la.LinAlgError:
        # Positive definite in exact arithmetic (Schur complement of a PD matrix); a failure
        # means lambda is below the rounding level of the cached matrices.
        return la.solve(A, B, assume_a="sym", check_finite=False)
    return la.cho_solve(cf, B, check_finite=False)


def holdout_path(Ut: np.ndarray, zt: np.ndarray, Lam: np.ndarray, lams, *, QE=None, Ux=None,
                 strategy: str = "auto"):
    """Hold-out predictions for one hold-out set and every lambda (Proposition 1, eq. 26).

    Parameters
    ----------
    Ut : ndarray (h, n)
        U_H, the U rows of the held-out rows.
    zt : ndarray (n, v)
        z0 - U_H^T y_H.
    Lam : ndarray (n,)
        Eigenvalues of C^-1 K_B K_B^T C^-T.
    lams : array (c,)
        Regularisation parameters (> 0).
    QE : ndarray (|E|, n), optional
        Rows of Q of the removed basis vectors (constraint a_E = 0).
    Ux : ndarray (t, n), optional
        U rows of extra training rows to predict with the same hold-out model (only without
        QE; used for the ``keep`` mode, whose held-out basis rows stay in training).

    Returns
    -------
    f : ndarray (c, h, v), fx : ndarray (c, t, v) or None, strategy : str
    """
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    h, n = Ut.shape
    v = zt.shape[1]
    e = 0 if QE is None else QE.shape[0]
    if strategy == "auto":
        strategy = choose_strategy(h, n, e, lams.size, v)
    if strategy == "small":
        f, fx = _small_side(Ut, zt, Lam, lams, QE, Ux)
    else:
        f, fx = _n_side(Ut, zt, Lam, lams, QE, Ux, strategy)
    return f, fx, strategy


def _small_side(Ut, zt, Lam, lams, QE, Ux):
    h = Ut.shape[0]
    c, v = lams.size, zt.shape[1]
    f = np.empty((c, h, v))
    fx = None if Ux is None else np.empty((c, Ux.shape[0], v))
    eye = np.eye(h)
    for k, lt in enumerate(lam_tilde(Lam, lams)):
        s = np.sqrt(lt)
        A = Ut * s                                        # U Lam~^(1/2)
        if QE is not None:
            # Lam~' = Lam~^(1/2) Pi Lam~^(1/2), Pi the projector off range(Lam~^(1/2) Q_E^T):
            # the paper's Lam~ - D M^-1 D^T without cancelling Q_E's large entries
            Y = _orth_basis(QE * s)
            A = A - (A @ Y) @ Y.T
        IJ = mirror_upper(syrk(-1.0, A, beta=1.0, c=eye, trans=0, lower=0))   # I - A A^T
        r = A @ (s[:, None] * zt)
        f[k] = _spd_solve(IJ, r)
        if fx is not None:
            # model weights in Q coordinates: w = Lam~ (z~ + U~^T f_H)  (SMW, left side)
            fx[k] = Ux @ (lt[:, None] * (zt + Ut.T @ f[k]))
    return f, fx


def n_side_weights(S: np.ndarray, zt: np.ndarray, Lam: np.ndarray, lams, *, QE=None,
                   strategy: str = "eig") -> np.ndarray:
    """Hold-out model weights in Q coordinates for every lambda (right side of eq. 36).

    With S = U~^T U~ the hold-in Gram matrix is M = Lam - S; the weights are
    w = (Pi M Pi + lam I)^-1 Pi z~, Pi the projector on null(Q_E) (identity without QE), and
    the hold-out predictions are U~ w. Only S and z~ are needed, so a hold-out set too large
    for memory can be accumulated chunk by chunk.

    Returns W of shape (c, n, v).
    """
    M = -S
    M[np.diag_indices(S.shape[0])] += Lam
    return gram_weights(M, zt, lams, QE=QE, strategy=strategy)


def gram_weights(M: np.ndarray, b: np.ndarray, lams, *, QE=None,
                 strategy: str = "eig") -> np.ndarray:
    """w = (Pi M Pi + lam I)^-1 Pi b for every lambda, M the (symmetric PSD) hold-in Gram matrix
    in any orthonormal-invariant coordinates and QE the rows of the constraint a_E = 0 in the
    same coordinates (Pi the projector on their null space). M is overwritten. (c, n, v)."""
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    n = M.shape[0]
    if QE is not None and QE.shape[0]:
        Y = _orth_basis(QE)
        M = _project(M, Y)
        b = b - Y @ (Y.T @ b)
    else:
        M = 0.5 * (M + M.T)
    W = np.empty((lams.size, n, b.shape[1]))
    if strategy == "tri":
        return _tri_weights(M, b, lams, W)
    if strategy == "eig":
        theta, Z = la.eigh(M, driver="evd", check_finite=False)
        np.maximum(theta, 0.0, out=theta)        # a Gram matrix: negatives are rounding
        Zb = Z.T @ b
        for k, lam in enumerate(lams):
            W[k] = Z @ (Zb / (theta + lam)[:, None])
        return W
    for k, lam in enumerate(lams):
        A = M.copy()
        A[np.diag_indices(n)] += lam
        W[k] = _spd_solve(A, b)
    return W


def _tri_weights(M, b, lams, W):
    """Shifted solves through one tridiagonal reduction M = Z T Z^T (LAPACK dsytrd): per lambda
    a positive definite tridiagonal solve (dptsv) between two sweeps of Householder reflectors."""
    n, v = b.shape
    c = lams.size
    if n < 3:
        return gram_weights(M, b, lams, strategy="eig")
    lwork = int(lapack.dsytrd_lwork(n, lower=1)[0])
    a, d, e, tau, info = lapack.dsytrd(M, lower=1, lwork=max(lwork, 1), overwrite_a=1)
    if info != 0:
        return gram_weights(M, b, lams, strategy="eig")
    # reflector i: H_i = I - tau_i w w^T, w = (0_{i+1}, 1, a[i+2:, i]); Z = H_0 H_1 ... H_{n-2}
    refl = np.asfortranarray(a)            # column i holds w_i below row i+1 (unit at i+1)
    x = np.array(b, dtype=np.float64, order="F", copy=True)
    for i in range(n - 1):                 # x <- Z^T b = H_{n-2} ... H_0 b
        w = refl[i + 1:, i].copy()
        w[0] = 1.0
        x[i + 1:] -= np.outer(tau[i] * w, w @ x[i + 1:])
    X = np.empty((n, c * v))
    for k, lam in enumerate(lams):
        dk = d + lam
        _, _, xk, info = lapack.dptsv(dk, e.copy(), x.copy())
        if info != 0:                      # rounding made T + lam I indefinite: banded LU
            ab = np.zeros((3, n))
            ab[0, 1:], ab[1], ab[2, :-1] = e, dk, e
            xk = la.solve_banded((1, 1), ab, x, check_finite=False)
        X[:, k * v:(k + 1) * v] = xk
    for i in range(n - 2, -1, -1):         # X <- Z X = H_0 ... H_{n-2} X
        w = refl[i + 1:, i].copy()
        w[0] = 1.0
        X[i + 1:] -= np.outer(tau[i] * w, w @ X[i + 1:])
    W[:] = X.reshape(n, c, v).transpose(1, 0, 2)
    return W


def _n_side(Ut, zt, Lam, lams, QE, Ux, strategy):
    W = n_side_weights(Ut.T @ Ut, zt, Lam, lams, QE=QE, strategy=strategy)
    f = np.einsum("hn,cnv->chv", Ut, W, optimize=True)
    fx = None if Ux is None else np.einsum("hn,cnv->chv", Ux, W, optimize=True)
    return f, fx


def _stack_lt_z(lt: np.ndarray, z0: np.ndarray) -> np.ndarray:
    """(n, c*v) matrix whose column (k, j) is lt[k] * z0[:, j]."""
    c, n = lt.shape
    return (lt.T[:, :, None] * z0[:, None, :]).reshape(n, c * z0.shape[1])


def loo_rows_path(Uc: np.ndarray, yc: np.ndarray, lt: np.ndarray, z0: np.ndarray):
    """LOO predictions of rows that are not removed from the basis (Corollary 2, |H| = 1).

    f_i = (yhat_i - h_i y_i) / (1 - h_i) with h_i = u_i Lam~ u_i^T and yhat_i = u_i Lam~ z0:
    two GEMMs over all lambdas at once, O(rows * n * c * (v + 1)).

    Returns an array (c, rows, v).
    """
    c = lt.shape[0]
    rows, v = yc.shape
    hdiag = (Uc * Uc) @ lt.T                                   # (rows, c)
    yhat = (Uc @ _stack_lt_z(lt, z0)).reshape(rows, c, v)
    f = (yhat - hdiag[:, :, None] * yc[:, None, :]) / (1.0 - hdiag)[:, :, None]
    return np.ascontiguousarray(f.transpose(1, 0, 2))


def loo_basis_remove_path(UB: np.ndarray, Q: np.ndarray, yB: np.ndarray, lt: np.ndarray,
                          z0: np.ndarray):
    """LOO predictions of the basis rows, each removed from the basis (E = H = {i}).

    Proposition 1 with scalars, in the U_H form of this module: with a1 = u Lam~ u^T,
    a2 = u Lam~ q^T, a3 = q Lam~ q^T (u = u_i, q = q_i its row of Q), J = a1 - a2^2 / a3 and
    r = t1 - (a2 / a3) t2 with t1 = u Lam~ z0 - a1 y_i, t2 = q Lam~ z0 - a2 y_i; f_i = r / (1 - J).
    O(n^2 c (v + 1)) for all n basis rows.

    Parameters: UB (n, n) U rows of the basis rows in basis order; Q (n, n); yB (n, v) labels of
    the basis rows. Returns (c, n, v).
    """
    c = lt.shape[0]
    n, v = yB.shape
    a1 = (UB * UB) @ lt.T
    a2 = (UB * Q) @ lt.T
    a3 = (Q * Q) @ lt.T
    Z = _stack_lt_z(lt, z0)
    uz = (UB @ Z).reshape(n, c, v)
    qz = (Q @ Z).reshape(n, c, v)
    a1, a2, a3 = a1[:, :, None], a2[:, :, None], a3[:, :, None]
    yy = yB[:, None, :]
    t1 = uz - a1 * yy
    t2 = qz - a2 * yy
    ratio = a2 / a3
    r = t1 - ratio * t2
    J = a1 - ratio * a2
    return np.ascontiguousarray((r / (1.0 - J)).transpose(1, 0, 2))
