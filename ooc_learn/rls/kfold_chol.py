"""k-fold CV of sparse RLS with P^-1 factored by Cholesky factors instead of the eigenvectors,
for one or a few lambdas: :func:`kfold_chol`.

In R coordinates (R = C^-1 K~_B, A = R R^T) P^-1 = C^-T (A + lam I)^-1 C^-1. When R^T rows
(not U) are at hand, the |H| side takes one Cholesky of A + lam I shared by all folds (no U_H
rotation), and the n side factors the hold-in matrix A - R_H R_H^T directly, with the
a_E = 0 constraint as a range-space projection (no n x n projection of the hold-in matrix).
Same formulas (Proposition 1, Corollaries 2-4), another factorisation of the same P^-1. The
side of each fold and the route itself are chosen by estimated flops against the general
path's (:data:`SMALL_CHOL_WEIGHT`).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as la
from scipy.linalg import lapack
from scipy.linalg.blas import dsyrk

from .holdout import chol_shifted, mirror_upper, strategy_costs

__all__ = ["kfold_chol", "SMALL_CHOL_WEIGHT", "FORCE_CHOL_SIDE"]


# The per-fold paths do work the flop model leaves out (the n side: forming (C^-T)_E, its QR,
# mirroring and copying n x n matrices per fold; the U-coordinate |H| side: Python and
# temporaries per lambda), the |H| side in Cholesky coordinates does not: the Cholesky route
# is taken while its estimated flops stay below SMALL_CHOL_WEIGHT times the general path's.
SMALL_CHOL_WEIGHT = 1.5
# "small" / "n" forces the side of every fold in kfold_chol (tests); None: by flops
FORCE_CHOL_SIDE = None


def _general_fold_cost(model, H, c: int, v: int) -> float:
    """Estimated flops of the per-fold path :func:`~.kfold_predict.kfold_path_model` takes
    otherwise without fit-time fold Grams (the cheaper SMW side; the |H| side pays the U_H
    rotation)."""
    n, h = model.Q_.shape[0], H.size
    costs = strategy_costs(h, n, model.basis_hits(H)[0].size, c, v)
    u_cached = model.row_cache_kind == "u"
    small = costs.pop("small") + (0.0 if u_cached else 2.0 * h * n * n)
    return min(small, min(costs.values()))


def _chol_fold_costs(n: int, h: int, e: int, c: int, v: int) -> tuple:
    """Estimated flops of one fold in :func:`kfold_chol`, (|H| side, n side), for |H| = h rows
    leaving training and e removed basis rows. |H| side per lambda: X_H = L^-1 R_H (h n^2),
    I - X_H^T X_H (h^2 n), its Cholesky (h^3 / 3), the a_E = 0 projection (n^2 e + 2 n e^2 +
    2 n e h + h^2 e). n side: the Gram (h n^2) once, per lambda the Cholesky of the hold-in
    matrix (n^3 / 3), the constraint (n^2 e + 2 n e^2) and the solves and predictions."""
    small = c * (h * n * n + h * h * n + h ** 3 / 3.0 + h * n * v
                 + n * n * e + 2.0 * n * e * e + 2.0 * n * e * h + h * h * e)
    nside = h * n * n + c * (n ** 3 / 3.0 + n * n * e + 2.0 * n * e * e + 2.0 * n * n * v
                             + h * n * v)
    return small, nside


def _chol_plan(n: int, hs, es, c: int, v: int):
    """(side per fold, total estimated flops) of :func:`kfold_chol`: the shared Cholesky
    factors of A + lam I (c n^3 / 3) are charged when a fold takes the |H| side, C^-1 (n^3 / 3)
    when basis rows are removed. ``FORCE_CHOL_SIDE`` ("small" / "n") overrides (tests)."""
    sides, total = [], 0.0
    for h, e in zip(hs, es):
        small, nside = _chol_fold_costs(n, h, e, c, v)
        side = FORCE_CHOL_SIDE or ("small" if small < nside else "n")
        sides.append(side)
        total += small if side == "small" else nside
    total += (c * n ** 3 / 3.0 if "small" in sides else 0.0) + (n ** 3 / 3.0 if any(es) else 0.0)
    return sides, total


def kfold_chol(model, fold_list, lams, mode, pre, stats, out) -> list:
    """k-fold CV with P^-1 factored by Cholesky factors instead of the eigenvectors (few lambdas).

    In R coordinates (R = C^-1 K~_B, A = R R^T = V Lam V^T) P^-1 = C^-T (A + lam I)^-1 C^-1, and
    the constraint a_E = 0 of a removed basis subset reads G_E w = 0 with G_E = (C^-T)_E, i.e.
    w orthogonal to the columns E of C^-1. Both sides of eq. 36 (Proposition 1):

    * ``small-chol``, the |H| side: with A + lam I = L L^T (one factor per lambda, shared by all
      folds) and X_H = L^-1 R_H the paper's J = K_HL W K_LH is X_H^T Pi X_H and
      r = X_H^T Pi L^-1 z~ (z~ = C^-1 K_B y - R_H y_H), f_H = (I - J)^-1 r; Pi projects off
      range(L^-1 (C^-1)_E) (the L-coordinate form of :mod:`.holdout`'s Lam~^(1/2) Pi
      Lam~^(1/2)). Per fold |H| n^2 + |H|^2 n: no U_H = R_H^T V rotation (2 |H| n^2).
    * ``chol-rs``, the n side: the hold-in matrix M = A - R_H R_H^T by one dsyrk onto a copy of
      A, M + lam I = U^T U, and the constraint by the range-space step in U coordinates:
      w = U^-1 Pi_Z U^-T z~, Pi_Z the projector off range(U^-T (C^-1)_E) (orthonormalised),
      i.e. n^2 |E| per fold instead of forming (C^-T)_E (2 n^2 |E|) and projecting M
      (4 n^2 |E|); upper triangles only, no n x n mirror or copy besides A's.

    The side is picked per fold by flops; the whole k-fold goes this way when that beats the
    per-fold general path (``SMALL_CHOL_WEIGHT``) and R^T rows are cached or formed from X.
    With U itself cached the U-coordinate |H| side is the same computation (A is diagonal
    there), and folds given at fit time keep their Grams (the n side without the |H| n^2
    product, and without forming R_H when nothing is cached). Returns, per fold, whether it
    was done (predictions written into ``out``)."""
    k = len(fold_list)
    done = [False] * k
    if model.row_cache_kind == "u" or pre is not None:
        return done             # U cached: the U-coordinate |H| side; fit-time fold Grams
    Y, C = model.Y_, model.chol_
    n, v, c = C.shape[0], Y.shape[1], lams.size
    hs, es = [], []
    for H in fold_list:
        hE = model.basis_hits(H)[0]
        hs.append(H.size - (hE.size if mode == "keep" else 0))
        es.append(hE.size if mode == "remove" else 0)
    if min(hs) == 0:
        return done
    sides, total = _chol_plan(n, hs, es, c, v)
    general = sum(_general_fold_cost(model, H, c, v) for H in fold_list)
    if total >= SMALL_CHOL_WEIGHT * general and FORCE_CHOL_SIDE is None:
        return done
    hmax, emax = max(hs), max(es)
    # shared factors (c L's, C^-1), a hold-in copy and its per-lambda copy (n side), R_H^T
    # with its kernel rows while formed and X_H = L^-1 R_H (3 h n), I - J and its factor,
    # the constraint's n x e blocks and the fold's predictions
    need = 8 * (((c if "small" in sides else 0) + (1 if any(es) else 0) + 2) * n * n
                + 3 * hmax * n + 2 * hmax * hmax + 3 * n * emax + 2 * c * hmax * v
                + 2 * n * v)
    if not model.budget_.try_reserve(need):
        return done
    try:
        Ls = [chol_shifted(model.A_, lam) for lam in lams] if "small" in sides else []
        if any(L is None for L in Ls):      # lam below the rounding level of A: general path
            return done
        Cinv = None
        if any(es):
            Cinv, info = lapack.dtrtri(C, lower=1)
            if info != 0:
                return done
        for g, H in enumerate(fold_list):
            if sides[g] == "small":
                out[:, H] = _small_chol_fold(model, H, Ls, Cinv, mode)
                stats["small-chol"] += 1
            else:
                f = _nside_chol_fold(model, H, lams, Cinv, mode)
                if f is None:               # not numerically PD: the general path
                    continue
                out[:, H] = f
                stats["chol-rs"] += 1
            done[g] = True
    finally:
        model.budget_.release(need)
    return done


def _split_held(model, H, mode):
    """(rows leaving training, positions in H of basis rows kept in training or None, their
    basis columns, basis columns removed by the constraint a_E = 0) of one fold."""
    hE, Ecols = model.basis_hits(H)
    none = Ecols[:0]
    if mode == "keep" and hE.size:
        mask = np.ones(H.size, dtype=bool)
        mask[hE] = False
        return H[mask], hE, Ecols, none
    return H, None, none, (Ecols if mode == "remove" else none)


def _nside_chol_fold(model, H, lams, Cinv, mode):
    """One n-side fold of :func:`kfold_chol`: predictions (c, |H|, v), None if a hold-in
    matrix + lam I is not numerically positive definite."""
    Y = model.Y_
    held, keep_rows, keep_cols, Ecols = _split_held(model, H, mode)
    RT = model.rt_rows(held)                    # (h, n): R_H^T
    RH = RT.T                                   # F-ordered view, n x h
    M = dsyrk(-1.0, RH, beta=1.0, c=model.A_.copy(order="F"), trans=0, lower=0,
             overwrite_c=1)                     # upper triangle of A - R_H R_H^T
    bt = model.KyR_ - RH @ Y[held]
    n = M.shape[0]
    out = np.empty((lams.size, H.size, Y.shape[1]))
    rest = None if keep_rows is None else np.setdiff1d(np.arange(H.size), keep_rows)
    for k, lam in enumerate(lams):
        Mk = M if k == lams.size - 1 else M.copy(order="F")
        Mk[np.diag_indices(n)] += lam
        Uf, info = lapack.dpotrf(Mk, lower=0, clean=0, overwrite_a=1)
        if info != 0:
            return None
        beta = la.solve_triangular(Uf, bt, trans="T", lower=False, check_finite=False)
        if Ecols.size:
            Z = la.solve_triangular(Uf, Cinv[:, Ecols], trans="T", lower=False,
                                    check_finite=False)
            Zq, _ = la.qr(Z, mode="economic", overwrite_a=True, check_finite=False)
            beta -= Zq @ (Zq.T @ beta)
        w = la.solve_triangular(Uf, beta, lower=False, check_finite=False)
        if keep_rows is None:
            out[k] = RT @ w
        else:
            out[k, rest] = RT @ w
            out[k, keep_rows] = model.chol_[keep_cols] @ w   # R^T rows of E are rows of C
    return out


def _small_chol_fold(model, H, Ls, Cinv, mode):
    """One |H|-side fold of :func:`kfold_chol`: predictions (c, |H|, v)."""
    Y = model.Y_
    v = Y.shape[1]
    held, keep_rows, keep_cols, Ecols = _split_held(model, H, mode)
    RT = model.rt_rows(held)                    # (h, n): R_H^T
    RH = RT.T                                   # F-ordered view, n x h
    bt = model.KyR_ - RH @ Y[held]
    h = held.size
    out = np.empty((len(Ls), H.size, v))
    for k, L in enumerate(Ls):
        X = la.solve_triangular(L, RH, lower=True, check_finite=False)
        lb = la.solve_triangular(L, bt, lower=True, check_finite=False)
        IJ = dsyrk(-1.0, X, beta=1.0, c=np.eye(h, order="F"), trans=1, lower=0, overwrite_c=1)
        r = X.T @ lb
        if Ecols.size:
            G = la.solve_triangular(L, Cinv[:, Ecols], lower=True, check_finite=False)
            Z, _ = la.qr(G, mode="economic", overwrite_a=True, check_finite=False)
            W = Z.T @ X                         # (e, h): J = X^T X - W^T W
            IJ = dsyrk(1.0, W, beta=1.0, c=IJ, trans=1, lower=0, overwrite_c=1)
            r -= W.T @ (Z.T @ lb)
        f = _spd_solve_upper(IJ, r)
        if keep_rows is None:
            out[k] = f
            continue
        w = la.solve_triangular(L, lb + X @ f, trans="T", lower=True, check_finite=False)
        out[k, keep_rows] = model.chol_[keep_cols] @ w   # R^T rows of E are rows of C
        out[k, np.setdiff1d(np.arange(H.size), keep_rows)] = f
    return out


def _spd_solve_upper(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve with a symmetric positive definite A given by its upper triangle."""
    try:
        cf = la.cho_factor(A, lower=False, overwrite_a=False, check_finite=False)
        return la.cho_solve(cf, B, check_finite=False)
    except la.LinAlgError:
        return la.solve(mirror_upper(A), B, assume_a="sym", check_finite=False)
