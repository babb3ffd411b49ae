"""Hold-out, k-fold and LOO cross-validation of a fitted :class:`SparseRLS`.

The three ways of Section 6.4 to treat held-out rows that are basis vectors (E = H & B):

* ``remove``: E leaves the basis (basis L = B \\ E) and its rows leave training (Prop. 1);
* ``keep``: E stays in the basis *and* in training; only H \\ E is held out (Corollary 2 with
  H \\ E); the rows of E are still predicted, by that same model;
* ``keep_no_loss``: E stays in the basis but every row of H leaves training (Corollary 2);
* ``skip`` (LOO only, the paper's option ii): basis rows get NaN.

Removing E needs only U_H, y_H and the rows Q_E (see :mod:`.holdout`), so once U is cached a
fold costs no reads of X at all. k-fold folds on the n side of the SMW identity work in R
coordinates whenever U itself is not cached (the fit caches R^T rows, or nothing): the fold's
Gram R_H R_H^T by one dsyrk, no rotation by V (:func:`_holdout_from_gram`); the |H| side is
charged for forming U_H = R_H^T V. A fold whose rows do not fit the memory budget is streamed:
pass 1 accumulates the fold's Gram chunk by chunk, the n-side weights are solved, pass 2 forms
the rows again and predicts (:func:`.holdout.n_side_weights`, :func:`_fold_in_r_coords`).
Single-lambda k-fold therefore costs O(min(|H|^2 n, |H| n^2)) per fold beyond the fold's own
rows (Corollary 4).

For one (or a few) lambdas P^-1 = C^-T (A + lam I)^-1 C^-1 is factored by Cholesky factors
instead of the eigenvectors when R^T rows (not U) are at hand (:func:`_kfold_chol`): the |H|
side with one Cholesky of A + lam I shared by all folds (no U_H rotation), or the n side with
the hold-in matrix A - R_H R_H^T factored directly and the a_E = 0 constraint as a range-space
projection (no n x n projection of the hold-in matrix); likewise the one-lambda LOO takes its
hat diagonal from the Cholesky factor (:func:`_loo_rows_chol`: one triangular solve over the
rows, m n^2, where the lambda path rotates U = R^T V, 2 m n^2). Same formulas (Proposition 1,
Corollaries 2-4), another factorisation of the same P^-1.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import NamedTuple

import numpy as np
import scipy.linalg as la
from scipy.linalg import lapack
from scipy.linalg.blas import dsyrk

from ooc_learn.storage.errors import ParameterError

from .holdout import (choose_strategy, gram_weights, holdout_path, lam_tilde,
                      loo_basis_remove_path, loo_rows_path, mirror_upper, n_side_weights,
                      strategy_costs)
from .model import BASIS_MODES_HOLDOUT, BASIS_MODES_LOO, check_lambdas

__all__ = ["LambdaSelection", "holdout_path_model", "kfold_path_model", "loo_path_model",
           "select_lambda_model", "make_folds"]

METRICS = ("mse", "mae", "error")
# The per-fold paths do work the flop model leaves out (the n side: forming (C^-T)_E, its QR,
# mirroring and copying n x n matrices per fold; the U-coordinate |H| side: Python and
# temporaries per lambda), the |H| side in Cholesky coordinates does not: measured on the
# benchmark sets (bench_rls, one lambda, 10 folds, n = 500..2000) it is as fast as the general
# path at 1.33x its estimated flops and up to 1.8x faster at about equal estimates.
SMALL_CHOL_WEIGHT = 1.5
# "small" / "n" forces the side of every fold in _kfold_chol (tests); None: by flops
FORCE_CHOL_SIDE = None


class LambdaSelection(NamedTuple):
    """Result of :meth:`SparseRLS.select_lambda`."""

    best_lambda: float
    curve: np.ndarray          # CV score per lambda (lower is better)
    model: object              # the SparseRLS, switched to best_lambda
    lambdas: np.ndarray


def _check_mode(mode: str, allowed, owner: str) -> None:
    if mode not in allowed:
        raise ParameterError(f"The 'basis_mode' parameter of {owner} must be one of {allowed}. "
                             f"Got {mode!r} instead.")


def _check_rows(H, m: int, owner: str) -> np.ndarray:
    H = np.asarray(H)
    if H.dtype == bool:
        if H.shape != (m,):
            raise ParameterError(f"A boolean hold-out mask for {owner} must have length {m}.")
        H = np.flatnonzero(H)
    H = np.atleast_1d(H)
    if H.ndim != 1 or H.size == 0 or not np.issubdtype(H.dtype, np.integer):
        raise ParameterError(f"The 'H' parameter of {owner} must be a non-empty 1-d array of "
                             f"row positions or a boolean mask. Got {H!r} instead.")
    if H.min() < 0 or H.max() >= m:
        raise ParameterError(f"The 'H' parameter of {owner} must hold row positions in "
                             f"[0, {m}). Got {int(H.min())}..{int(H.max())} instead.")
    if np.unique(H).size != H.size:
        raise ParameterError(f"The 'H' parameter of {owner} must not repeat a row.")
    if H.size >= m:
        raise ParameterError(f"The hold-out set of {owner} covers all {m} training rows, so "
                             f"nothing is left to train on.", "Hold out fewer rows.")
    return H.astype(np.int64)


def _ut_piece(model, rows):
    """U rows of ``rows`` (cached, or formed from the rows on the fly)."""
    return model.u_rows(rows)[0]


def _n_side_strategy(h, n, e, c, v) -> str:
    """The cheapest of the n-side strategies (chol / eig / tri) by the flop model."""
    costs = strategy_costs(h, n, e, c, v)
    costs.pop("small")
    return min(costs, key=costs.get)


def _holdout_one(model, H, lams, mode, stats):
    """Predictions (c, |H|, v) for one hold-out set."""
    c, Y, Q, Lam, z0 = lams.size, model._Y, model.Q_, model.eigvals_, model._z0
    n, v = Q.shape[0], Y.shape[1]
    out = np.empty((c, H.size, v))
    hE, Ecols = model.basis_hits(H)
    Hp, xrows, QE = H, None, None
    if mode == "keep" and hE.size:
        mask = np.ones(H.size, dtype=bool)
        mask[hE] = False
        Hp, xrows = H[mask], H[hE]
        if Hp.size == 0:       # nothing held out that is not kept: the full model predicts
            UE, _ = model.u_rows(xrows)
            lt = lam_tilde(Lam, lams)
            out[:, hE] = np.einsum("hn,cn,nv->chv", UE, lt, z0, optimize=True)
            return out
    elif mode == "remove" and hE.size:
        QE = Q[Ecols]
    zbase = z0
    h = Hp.size
    budget = model._budget
    strategy = choose_strategy(h, n, 0 if QE is None else QE.shape[0], c, v)
    # U_H and its copies (3 h n), the h x h or n x n work (I - J and its factor; S, the
    # hold-in matrix, its symmetrised / projected copies and an eigensolver's workspace),
    # the predictions and their copy (2 c h v)
    need = 8 * (3 * h * n + (4 * h * h if strategy == "small" else 6 * n * n)
                + 2 * c * H.size * v + 3 * c * n * v)
    if budget.try_reserve(need):
        try:
            Ut = _ut_piece(model, Hp)
            Ux = None if xrows is None else model.u_rows(xrows)[0]
            zt = zbase - Ut.T @ Y[Hp]
            f, fx, strategy = holdout_path(Ut, zt, Lam, lams, QE=QE, Ux=Ux, strategy=strategy)
        finally:
            budget.release(need)
    else:                       # stream the fold: n-side weights from S and U~^T y_H
        work = 8 * (6 * n * n + 2 * c * H.size * v + 3 * c * n * v)
        # and a chunk's U rows from X: kernel rows, R^T rows, U rows, the previous chunk's
        with budget.reservation(work, "hold-out n x n work and predictions"), \
                model.row_chunk(h, 8 * (4 * n + 2 * v)) as step:
            S, Uty = np.zeros((n, n)), np.zeros((n, v))
            for a in range(0, h, step):
                Ut = _ut_piece(model, Hp[a:a + step])
                S += Ut.T @ Ut
                Uty += Ut.T @ Y[Hp[a:a + step]]
            del Ut
            e = 0 if QE is None else QE.shape[0]
            strategy = _n_side_strategy(h, n, e, c, v)
            W = n_side_weights(S, zbase - Uty, Lam, lams, QE=QE, strategy=strategy)
            del S
            f = np.empty((c, h, v))
            for a in range(0, h, step):
                Ut = _ut_piece(model, Hp[a:a + step])
                f[:, a:a + step] = np.einsum("hn,cnv->chv", Ut, W, optimize=True)
            fx = (None if xrows is None else
                  np.einsum("hn,cnv->chv", model.u_rows(xrows)[0], W, optimize=True))
        strategy += "-streamed"
    stats[strategy] += 1
    if xrows is None:
        return f
    mask = np.ones(H.size, dtype=bool)
    mask[hE] = False
    out[:, mask] = f
    out[:, hE] = fx
    return out


def holdout_path_model(model, H, lams, basis_mode: str) -> np.ndarray:
    """Hold-out predictions (c, |H|, v) of a fitted model for rows ``H``."""
    owner = "SparseRLS.holdout_predict"
    _check_mode(basis_mode, BASIS_MODES_HOLDOUT, owner)
    lams = check_lambdas(lams, owner)
    model._check_fitted()
    H = _check_rows(H, model._Y.shape[0], owner)
    t0, stats = time.perf_counter(), Counter()
    f = _holdout_one(model, H, lams, basis_mode, stats)
    model.cv_stats_ = {"method": "holdout", "strategies": dict(stats),
                       "seconds": time.perf_counter() - t0}
    return f


def make_folds(folds, m: int, *, seed=0, block_offsets=None) -> list[np.ndarray]:
    """Fold row arrays from an int k, a length-m label array (-1: in no fold) or a list.

    An int k on a Store with at least k blocks groups whole blocks (contiguous block ids);
    otherwise rows are permuted with ``seed``.
    """
    owner = "SparseRLS.kfold_predict"
    if isinstance(folds, (int, np.integer)):
        k = int(folds)
        if not 2 <= k <= m:
            raise ParameterError(f"The 'folds' parameter of {owner} must be between 2 and the "
                                 f"number of samples ({m}). Got {k} instead.")
        if block_offsets is not None and k <= len(block_offsets) - 1:
            groups = np.array_split(np.arange(len(block_offsets) - 1), k)
            return [np.arange(block_offsets[g[0]], block_offsets[g[-1] + 1]) for g in groups]
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return [np.sort(f) for f in np.array_split(rng.permutation(m), k)]
    if isinstance(folds, (list, tuple)):
        out = [np.asarray(f, dtype=np.int64).ravel() for f in folds]
        allrows = np.concatenate(out) if out else np.empty(0, np.int64)
        if np.unique(allrows).size != allrows.size:
            raise ParameterError(f"The folds of {owner} must be disjoint.")
        return out
    lab = np.asarray(folds)
    if lab.shape != (m,) or not np.issubdtype(lab.dtype, np.integer):
        raise ParameterError(f"The 'folds' parameter of {owner} must be an int, a list of row "
                             f"arrays or an integer label per row (length {m}).")
    return [np.flatnonzero(lab == g) for g in np.unique(lab[lab >= 0])]


def kfold_path_model(model, folds, lams, basis_mode: str) -> np.ndarray:
    """k-fold predictions (c, m, v): every row predicted by the model of its own fold."""
    owner = "SparseRLS.kfold_predict"
    _check_mode(basis_mode, BASIS_MODES_HOLDOUT, owner)
    lams = check_lambdas(lams, owner)
    model._check_fitted()
    m, v = model._Y.shape
    src = model._source
    fold_list = make_folds(folds, m, seed=model.seed,
                           block_offsets=src.block_offsets if src.is_store else None)
    t0, stats = time.perf_counter(), Counter()
    pre = getattr(model, "_fold_grams", None)
    if pre is not None and not _same_folds(pre[0], fold_list):
        pre = None
    # the predictions, the fold row lists and their checked copies
    with model._budget.reservation(8 * lams.size * m * v + 16 * m, "k-fold predictions"):
        out = np.full((lams.size, m, v), np.nan)
        fold_list = [_check_rows(H, m, owner) for H in fold_list]
        done = _kfold_chol(model, fold_list, lams, basis_mode, pre, stats, out)
        for g, H in enumerate(fold_list):
            if done[g]:
                continue
            if pre is None or not _gram_pays(model, H, lams.size, v):
                if _rcoords_pay(model, H, lams.size, v):
                    out[:, H] = _fold_in_r_coords(model, H, lams, basis_mode, stats)
                    continue
                out[:, H] = _holdout_one(model, H, lams, basis_mode, stats)
            else:
                rows = 0 if model._ucache is None else 8 * model.Q_.shape[0] * H.size
                with model._budget.reservation(rows + _fold_work_bytes(model, H, lams.size, v),
                                               "k-fold n x n work and predictions"):
                    out[:, H] = _holdout_from_gram(model, H, pre[1][g], pre[2][g], lams,
                                                   basis_mode, stats)
    model.cv_stats_ = {"method": f"{len(fold_list)}-fold", "strategies": dict(stats),
                       "seconds": time.perf_counter() - t0}
    return out


def _general_fold_cost(model, H, c: int, v: int) -> float:
    """Estimated flops of the per-fold path :func:`kfold_path_model` takes otherwise without
    fit-time fold Grams (the cheaper SMW side; the |H| side pays the U_H rotation)."""
    n, h = model.Q_.shape[0], H.size
    costs = strategy_costs(h, n, model.basis_hits(H)[0].size, c, v)
    u_cached = model._ucache is not None and model._ucache_is_u
    small = costs.pop("small") + (0.0 if u_cached else 2.0 * h * n * n)
    return min(small, min(costs.values()))


def _chol_fold_costs(n: int, h: int, e: int, c: int, v: int) -> tuple:
    """Estimated flops of one fold in :func:`_kfold_chol`, (|H| side, n side), for |H| = h rows
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
    """(side per fold, total estimated flops) of :func:`_kfold_chol`: the shared Cholesky
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



def _kfold_chol(model, fold_list, lams, mode, pre, stats, out) -> list:
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
    if (model._ucache is not None and model._ucache_is_u) or pre is not None:
        return done             # U cached: the U-coordinate |H| side; fit-time fold Grams
    Y, C = model._Y, model._C
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
    if not model._budget.try_reserve(need):
        return done
    try:
        Ls = [_chol_shifted(model._AR, lam) for lam in lams] if "small" in sides else []
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
        model._budget.release(need)
    return done


def _chol_shifted(A: np.ndarray, lam: float):
    """The lower Cholesky factor of A + lam I (A untouched), None when it is not
    numerically positive definite."""
    Ap = A.copy(order="F")
    Ap[np.diag_indices(A.shape[0])] += lam
    try:
        return la.cholesky(Ap, lower=True, overwrite_a=True, check_finite=False)
    except la.LinAlgError:
        return None


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
    """One n-side fold of :func:`_kfold_chol`: predictions (c, |H|, v), None if a hold-in
    matrix + lam I is not numerically positive definite."""
    Y = model._Y
    held, keep_rows, keep_cols, Ecols = _split_held(model, H, mode)
    RT = model.rt_rows(held)                    # (h, n): R_H^T
    RH = RT.T                                   # F-ordered view, n x h
    M = dsyrk(-1.0, RH, beta=1.0, c=model._AR.copy(order="F"), trans=0, lower=0,
             overwrite_c=1)                     # upper triangle of A - R_H R_H^T
    bt = model._KyR - RH @ Y[held]
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
            out[k, keep_rows] = model._C[keep_cols] @ w   # R^T rows of E are rows of C
    return out


def _small_chol_fold(model, H, Ls, Cinv, mode):
    """One |H|-side fold of :func:`_kfold_chol`: predictions (c, |H|, v)."""
    Y = model._Y
    v = Y.shape[1]
    held, keep_rows, keep_cols, Ecols = _split_held(model, H, mode)
    RT = model.rt_rows(held)                    # (h, n): R_H^T
    RH = RT.T                                   # F-ordered view, n x h
    bt = model._KyR - RH @ Y[held]
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
        out[k, keep_rows] = model._C[keep_cols] @ w   # R^T rows of E are rows of C
        out[k, np.setdiff1d(np.arange(H.size), keep_rows)] = f
    return out


def _spd_solve_upper(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Solve with a symmetric positive definite A given by its upper triangle."""
    try:
        cf = la.cho_factor(A, lower=False, overwrite_a=False, check_finite=False)
        return la.cho_solve(cf, B, check_finite=False)
    except la.LinAlgError:
        return la.solve(mirror_upper(A), B, assume_a="sym", check_finite=False)


def _rcoords_pay(model, H, c: int, v: int) -> bool:
    """Whether a fold is best done on the n side in R coordinates, from the cached R^T rows
    (saves converting the cache to U = R^T V, an m n^2 GEMM) or, with nothing cached, from
    R^T rows formed chunk by chunk (saves the U rotation and the U_H^T U_H GEMM of the
    general streamed path): the n side must be the cheapest."""
    if model._ucache is not None and model._ucache_is_u:
        return False
    n, h = model.Q_.shape[0], H.size
    costs = strategy_costs(h, n, model.basis_hits(H)[0].size, c, v)
    small = costs.pop("small") + 2.0 * h * n * n    # the |H| side needs U_H = R_H^T V first
    return min(costs.values()) < small


def _gram_pays(model, H, c: int, v: int) -> bool:
    """Whether the fit-time Gram of a fold beats the general path (estimated flops): it saves
    the |H| n^2 product of the fold's Gram; the |H| side it competes with needs U_H, a
    rotation R_H^T V of 2 |H| n^2 unless U itself is cached."""
    n, h = model.Q_.shape[0], H.size
    e = model.basis_hits(H)[0].size
    costs = strategy_costs(h, n, e, c, v)
    u_cached = model._ucache is not None and model._ucache_is_u
    small = costs.pop("small") + (0.0 if u_cached else 2.0 * h * n * n)
    nside = min(costs.values())
    return nside - h * n * n < min(small, nside)


def _iter_rt(model, H):
    """(start, stop, R^T rows of H[start:stop]): one piece from the cache, or chunks formed
    from X within the budget (the fold never needs its |H| x n rows at once): a chunk's
    kernel rows and R^T rows while the caller still holds the previous chunk's (3 x 8 n
    bytes a row, reserved)."""
    if model._ucache is not None:
        yield 0, H.size, model.rt_rows(H)
        return
    n = model.Q_.shape[0]
    with model.row_chunk(H.size, 8 * (3 * n + 2 * model._Y.shape[1])) as step:
        for a in range(0, H.size, step):
            yield a, min(a + step, H.size), model.rt_rows(H[a:a + step])


def _fold_work_bytes(model, H, c: int, v: int) -> int:
    """Bytes of one fold's n x n work in :func:`_holdout_from_gram` beside its rows: its Gram
    S_R, the hold-in matrix A - S_R, its symmetrised / projected copy, an eigensolver's or
    reduction's output and workspace (6 n^2), the a_E = 0 blocks (n x |E|), the weights and
    the fold's (c, |H|, v) predictions."""
    n = model.Q_.shape[0]
    e = model.basis_hits(H)[0].size
    return 8 * (6 * n * n + 3 * n * e + 3 * c * n * v + 2 * n * v + c * H.size * v)


def _fold_gram(model, H, pieces=None):
    """S_R = R_H R_H^T (dsyrk, |H| n^2 flops) and R_H y_H of one fold, from ``pieces``
    ((start, stop, R^T rows) covering H; default :func:`_iter_rt`)."""
    n, Y = model.Q_.shape[0], model._Y
    SR, RY = np.zeros((n, n), order="F"), np.zeros((n, Y.shape[1]))
    for a, b, RT in (_iter_rt(model, H) if pieces is None else pieces):
        SR = dsyrk(1.0, RT.T, beta=1.0, c=SR, trans=0, lower=0, overwrite_c=1)
        RY += RT.T @ Y[H[a:b]]
    return mirror_upper(SR), RY


def _fold_in_r_coords(model, H, lams, mode, stats):
    """One fold on the n side in R coordinates: its Gram R_H R_H^T, then
    :func:`_holdout_from_gram`. Without a cache the fold's R^T rows are formed from X once
    and kept when they fit the budget together with the fold's n x n work and predictions,
    else formed chunk by chunk for the Gram and the predictions come from kernel rows
    (K~_H C^-T W, no triangular solve)."""
    n, v = model.Q_.shape[0], model._Y.shape[1]
    work = _fold_work_bytes(model, H, lams.size, v)
    if model._ucache is None:
        step = max(64, (1 << 22) // n)
        # the rows + one chunk's kernel rows and R^T rows while formed + the fold's work
        need = 8 * n * (H.size + 2 * min(step, H.size)) + work
        if not model._budget.try_reserve(need):
            with model._budget.reservation(work, "k-fold n x n work and predictions"):
                SR, RY = _fold_gram(model, H)
                return _holdout_from_gram(model, H, SR, RY, lams, mode, stats,
                                          tag="-r-streamed")
        try:
            RT = np.empty((H.size, n))
            for a in range(0, H.size, step):
                RT[a:a + step] = model.rt_rows(H[a:a + step])
            SR, RY = _fold_gram(model, H, [(0, H.size, RT)])
            return _holdout_from_gram(model, H, SR, RY, lams, mode, stats, tag="-r", RT=RT)
        finally:
            model._budget.release(need)
    with model._budget.reservation(8 * n * H.size + work, "k-fold rows and n x n work"):
        RT = model.rt_rows(H)
        SR, RY = _fold_gram(model, H, [(0, H.size, RT)])
        return _holdout_from_gram(model, H, SR, RY, lams, mode, stats, tag="-r", RT=RT)


def _same_folds(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(np.sort(x), np.sort(y)) for x, y in zip(a, b))


def _holdout_from_gram(model, H, SR, RY, lams, mode, stats, tag="-gram", RT=None):
    """One fold from its hold-out Gram SR = R_H R_H^T and RY = R_H y_H, R = C^-1 K~_B (right
    side of eq. 36 in R coordinates, where the training Gram is A = R R^T = V Lam V^T):
    the hold-in Gram is A - SR and z~ becomes C^-1 K_B y - RY, so no rotation into Q
    coordinates (no V^T SR V, no U = R^T V) is needed; a_E = 0 reads (C^-T)_E w = 0.
    Predictions are R_H^T W (O(|H| n c v)) when R^T rows are cached.
    SR comes from the training pass (fit-time folds) or from the fold's R^T rows (``RT``
    when the caller holds them)."""
    V, Q, Y = model._V, model.Q_, model._Y
    n, v, c = Q.shape[0], Y.shape[1], lams.size
    M = model._AR - SR
    b = model._KyR - RY
    hE, Ecols = model.basis_hits(H)
    GE = None
    if hE.size and mode == "remove":
        GE = Q[Ecols] @ V.T                                 # rows E of C^-T
    elif hE.size and mode == "keep":       # E stays in training: add its rows back
        RE = model._C[Ecols]                               # R^T rows of E: C^-1 C C^T e_j
        M += RE.T @ RE
        b += RE.T @ Y[H[hE]]
    e = 0 if GE is None else GE.shape[0]
    strategy = _n_side_strategy(H.size, n, e, c, v)
    W = gram_weights(M, b, lams, QE=GE, strategy=strategy)
    stats[strategy + tag] += 1
    if RT is not None:
        return np.einsum("hn,cnv->chv", RT, W, optimize=True)
    if model._ucache is not None and model._ucache_is_u:
        UH = model._ucache[H]
        return np.einsum("hn,cnv->chv", UH, np.einsum("ji,cjv->civ", V, W), optimize=True)
    if model._ucache is None:
        return _predict_from_x(model, H, W)
    f = np.empty((c, H.size, v))
    for a, b, RT in _iter_rt(model, H):                   # rows of R^T
        f[:, a:b] = np.einsum("hn,cnv->chv", RT, W, optimize=True)
    return f


def _predict_from_x(model, H, W):
    """R_H^T W = K~_HB (C^-T W) with no R^T or U rows at hand: the weights go to basis
    coordinates once (n^2 c v), then each chunk of H costs its kernel rows and |H| n c v, not
    the n^2-per-row triangular solve that forming R_H^T would."""
    n, c, v = W.shape[1], W.shape[0], W.shape[2]
    Wf = np.ascontiguousarray(W.transpose(1, 0, 2)).reshape(n, c * v)
    Abasis = la.solve_triangular(model._C, Wf, trans="T", lower=True, check_finite=False)
    f = np.empty((c, H.size, v))
    # a chunk's kernel rows (the previous chunk's still held) and K @ Abasis
    with model.row_chunk(H.size, 8 * (2 * n + 2 * c * v)) as step:
        for a in range(0, H.size, step):
            rows = H[a:a + step]
            K = model._kernel_rows(model._source.take(rows), rows)
            model.stats_["kernel_evaluations"] = (model.stats_.get("kernel_evaluations", 0)
                                                  + K.size)
            f[:, a:a + rows.size] = (K @ Abasis).reshape(rows.size, c, v).transpose(1, 0, 2)
    return f


def loo_path_model(model, lams, basis_mode: str) -> np.ndarray:
    """LOO predictions (c, m, v) in O(m n c v) after training (Corollary 3)."""
    owner = "SparseRLS.loo_predict"
    _check_mode(basis_mode, BASIS_MODES_LOO, owner)
    lams = check_lambdas(lams, owner)
    model._check_fitted()
    m, v = model._Y.shape
    t0 = time.perf_counter()
    lt = lam_tilde(model.eigvals_, lams)
    Y, z0, Q, B = model._Y, model._z0, model.Q_, model.basis_
    n, c = Q.shape[0], lams.size
    with model._budget.reservation(8 * c * m * v, "LOO predictions"):
        out = np.empty((c, m, v))
        u_cached = model._ucache is not None and model._ucache_is_u
        strategy = "eig"
        if c == 1 and not u_cached and _loo_rows_chol(model, float(lams[0]), out[0]):
            strategy = "chol"
        else:
            # loo_rows_path's temporaries a row: U * U, the hat diagonal, yhat and f (c v)
            for a, b, U in model.iter_u_chunks(extra=8 * (n + 3 * c * v + 2 * c)):
                out[:, a:b] = loo_rows_path(U, Y[a:b], lt, z0)
        # U rows of the basis rows (n^2), one n x n product at a time and (n, c, v) terms
        with model._budget.reservation(8 * (2 * n * n + 8 * n * c * v), "LOO of basis rows"):
            if basis_mode in ("remove", "keep"):
                UB = model._C @ model._V           # U rows of the basis rows: K~_BB Q = C V
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
    n, v = model._C.shape[0], model._Y.shape[1]
    if not model._budget.try_reserve(8 * n * n):           # the factor L
        return False
    try:
        L = _chol_shifted(model._AR, lam)
        if L is None:
            return False
        w = la.cho_solve((L, True), model._KyR, check_finite=False)
        Y = model._Y
        # a chunk's X = L^-1 R^T and, formed from X, its kernel rows and R^T rows (the
        # previous chunk's still held), and the (rows, v) terms
        cached = model._ucache is not None and not model._ucache_is_u
        for a, b, RT in _iter_rt_all(model, 8 * ((1 if cached else 3) * n + 4 * v)):
            X = la.solve_triangular(L, RT.T, lower=True, check_finite=False)
            h = np.einsum("ij,ij->j", X, X)
            del X
            out[a:b] = (RT @ w - h[:, None] * Y[a:b]) / (1.0 - h)[:, None]
        return True
    finally:
        model._budget.release(8 * n * n)


def _iter_rt_all(model, per_row: int):
    """(start, stop, R^T rows) covering all rows in order: cached R^T rows in chunks, or
    formed from the source's chunks; ``per_row`` bytes a row reserved for the chunk."""
    if model._ucache is not None and not model._ucache_is_u:
        def cached():
            m = model._ucache.shape[0]
            with model.row_chunk(m, per_row, model._u_step()) as step:
                for a in range(0, m, step):
                    yield a, min(a + step, m), model._ucache[a:a + step]
        return cached()
    return model._iter_formed(model._rt_from_x, per_row)


def _score(pred: np.ndarray, Y: np.ndarray, metric: str) -> np.ndarray:
    """Score per lambda over the rows with finite predictions; pred (c, m, v), Y (m, v)."""
    ok = np.isfinite(pred).all(axis=(0, 2))
    if not ok.any():
        raise ParameterError("No row has a CV prediction to score (every row skipped).")
    P, T = pred[:, ok], Y[ok][None]
    if metric == "mse":
        return ((P - T) ** 2).mean(axis=(1, 2))
    if metric == "mae":
        return np.abs(P - T).mean(axis=(1, 2))
    if P.shape[2] == 1:
        return (np.sign(P[..., 0]) != np.sign(T[..., 0])).mean(axis=1)
    return (P.argmax(axis=2) != T.argmax(axis=2)).mean(axis=1)


def select_lambda_model(model, lams, cv, metric: str, basis_mode: str) -> LambdaSelection:
    """Choose lambda by LOO (``cv="loo"``) or k-fold CV (``cv=k`` or folds); refit is O(n^2)."""
    owner = "SparseRLS.select_lambda"
    if metric not in METRICS:
        raise ParameterError(f"The 'metric' parameter of {owner} must be one of {METRICS}. "
                             f"Got {metric!r} instead.")
    lams = check_lambdas(lams, owner)
    if isinstance(cv, str):
        if cv != "loo":
            raise ParameterError(f"The 'cv' parameter of {owner} must be 'loo', an int k or "
                                 f"folds. Got {cv!r} instead.")
        pred = loo_path_model(model, lams, basis_mode)
    else:
        pred = kfold_path_model(model, cv, lams, basis_mode)
    curve = _score(pred, model._Y, metric)
    best = float(lams[int(np.argmin(curve))])
    model.set_lambda(best)
    return LambdaSelection(best, curve, model, lams)
