"""k-fold predictions of a fitted :class:`~.model.SparseRLS`: every row predicted by the model
of its own fold (Corollary 4), :func:`kfold_path_model`, and the folds, :func:`make_folds`.

Each fold takes the cheapest of three routes, by estimated flops: the Cholesky route for one
or a few lambdas (:mod:`.kfold_chol`); the fold's Gram given at fit time (``folds=`` of the
model); or the n side of the SMW identity in R coordinates whenever U itself is not cached
(the fit caches R^T rows, or nothing): the fold's Gram R_H R_H^T by one dsyrk, no rotation by
V (:func:`_holdout_from_gram`), where the |H| side is charged for forming U_H = R_H^T V;
otherwise the general hold-out of one fold (:func:`~.holdout_predict.holdout_fold`). A fold
whose rows do not fit the memory budget is streamed: pass 1 accumulates the fold's Gram chunk
by chunk, the n-side weights are solved, pass 2 forms the rows again and predicts
(:func:`.holdout.n_side_weights`, :func:`_fold_in_r_coords`). Single-lambda k-fold therefore
costs O(min(|H|^2 n, |H| n^2)) per fold beyond the fold's own rows (Corollary 4).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import scipy.linalg as la
from scipy.linalg.blas import dsyrk

from ooc_learn.storage.errors import ParameterError

from .checks import BASIS_MODES_HOLDOUT, check_basis_mode, check_lambdas, check_rows
from .holdout import gram_weights, mirror_upper, strategy_costs
from .holdout_predict import holdout_fold, n_side_strategy
from .kfold_chol import kfold_chol

__all__ = ["make_folds", "kfold_path_model"]


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
    check_basis_mode(basis_mode, BASIS_MODES_HOLDOUT, owner)
    lams = check_lambdas(lams, owner)
    model.check_fitted()
    m, v = model.Y_.shape
    src = model.source_
    fold_list = make_folds(folds, m, seed=model.seed,
                           block_offsets=src.block_offsets if src.is_store else None)
    t0, stats = time.perf_counter(), Counter()
    pre = model.fold_grams_
    if pre is not None and not _same_folds(pre[0], fold_list):
        pre = None
    # the predictions, the fold row lists and their checked copies
    with model.budget_.reservation(8 * lams.size * m * v + 16 * m, "k-fold predictions"):
        out = np.full((lams.size, m, v), np.nan)
        fold_list = [check_rows(H, m, owner) for H in fold_list]
        done = kfold_chol(model, fold_list, lams, basis_mode, pre, stats, out)
        for g, H in enumerate(fold_list):
            if done[g]:
                continue
            if pre is None or not _gram_pays(model, H, lams.size, v):
                if _rcoords_pay(model, H, lams.size, v):
                    out[:, H] = _fold_in_r_coords(model, H, lams, basis_mode, stats)
                    continue
                out[:, H] = holdout_fold(model, H, lams, basis_mode, stats)
            else:
                rows = 0 if model.row_cache_kind is None else 8 * model.Q_.shape[0] * H.size
                with model.budget_.reservation(rows + _fold_work_bytes(model, H, lams.size, v),
                                               "k-fold n x n work and predictions"):
                    out[:, H] = _holdout_from_gram(model, H, pre[1][g], pre[2][g], lams,
                                                   basis_mode, stats)
    model.cv_stats_ = {"method": f"{len(fold_list)}-fold", "strategies": dict(stats),
                       "seconds": time.perf_counter() - t0}
    return out


def _rcoords_pay(model, H, c: int, v: int) -> bool:
    """Whether a fold is best done on the n side in R coordinates, from the cached R^T rows
    (saves converting the cache to U = R^T V, an m n^2 GEMM) or, with nothing cached, from
    R^T rows formed chunk by chunk (saves the U rotation and the U_H^T U_H GEMM of the
    general streamed path): the n side must be the cheapest."""
    if model.row_cache_kind == "u":
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
    u_cached = model.row_cache_kind == "u"
    small = costs.pop("small") + (0.0 if u_cached else 2.0 * h * n * n)
    nside = min(costs.values())
    return nside - h * n * n < min(small, nside)


def _iter_rt(model, H):
    """(start, stop, R^T rows of H[start:stop]): one piece from the cache, or chunks formed
    from X within the budget (the fold never needs its |H| x n rows at once): a chunk's
    kernel rows and R^T rows while the caller still holds the previous chunk's (3 x 8 n
    bytes a row, reserved)."""
    if model.row_cache_kind is not None:
        yield 0, H.size, model.rt_rows(H)
        return
    n = model.Q_.shape[0]
    with model.row_chunk(H.size, 8 * (3 * n + 2 * model.Y_.shape[1])) as step:
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
    n, Y = model.Q_.shape[0], model.Y_
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
    n, v = model.Q_.shape[0], model.Y_.shape[1]
    work = _fold_work_bytes(model, H, lams.size, v)
    if model.row_cache_kind is None:
        step = max(64, (1 << 22) // n)
        # the rows + one chunk's kernel rows and R^T rows while formed + the fold's work
        need = 8 * n * (H.size + 2 * min(step, H.size)) + work
        if not model.budget_.try_reserve(need):
            with model.budget_.reservation(work, "k-fold n x n work and predictions"):
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
            model.budget_.release(need)
    with model.budget_.reservation(8 * n * H.size + work, "k-fold rows and n x n work"):
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
    V, Q, Y = model.V_, model.Q_, model.Y_
    n, v, c = Q.shape[0], Y.shape[1], lams.size
    M = model.A_ - SR
    b = model.KyR_ - RY
    hE, Ecols = model.basis_hits(H)
    GE = None
    if hE.size and mode == "remove":
        GE = Q[Ecols] @ V.T                                 # rows E of C^-T
    elif hE.size and mode == "keep":       # E stays in training: add its rows back
        RE = model.chol_[Ecols]                               # R^T rows of E: C^-1 C C^T e_j
        M += RE.T @ RE
        b += RE.T @ Y[H[hE]]
    e = 0 if GE is None else GE.shape[0]
    strategy = n_side_strategy(H.size, n, e, c, v)
    W = gram_weights(M, b, lams, QE=GE, strategy=strategy)
    stats[strategy + tag] += 1
    if RT is not None:
        return np.einsum("hn,cnv->chv", RT, W, optimize=True)
    if model.row_cache_kind == "u":
        UH = model.row_cache_[H]
        return np.einsum("hn,cnv->chv", UH, np.einsum("ji,cjv->civ", V, W), optimize=True)
    if model.row_cache_kind is None:
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
    Abasis = la.solve_triangular(model.chol_, Wf, trans="T", lower=True, check_finite=False)
    f = np.empty((c, H.size, v))
    # a chunk's kernel rows (the previous chunk's still held) and K @ Abasis
    with model.row_chunk(H.size, 8 * (2 * n + 2 * c * v)) as step:
        for a in range(0, H.size, step):
            rows = H[a:a + step]
            K = model.kernel_rows(model.source_.take(rows), rows)
            model.stats_["kernel_evaluations"] = (model.stats_.get("kernel_evaluations", 0)
                                                  + K.size)
            f[:, a:a + rows.size] = (K @ Abasis).reshape(rows.size, c, v).transpose(1, 0, 2)
    return f
