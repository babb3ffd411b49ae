"""Hold-out predictions of a fitted :class:`~.model.SparseRLS` for one set of rows H
(Proposition 1, Corollary 2): :func:`holdout_path_model`, and :func:`holdout_fold`, the one
fold that k-fold CV falls back on.

Removing E = H & B needs only U_H, y_H and the rows Q_E (see :mod:`.holdout`), so once U is
cached a fold costs no reads of X at all. The cheaper side of the SMW identity is picked by
the flop model (:func:`~.holdout.choose_strategy`); a fold whose U rows and n x n work do not
fit the memory budget is streamed: its n-side weights from U_H^T U_H accumulated chunk by
chunk, then its rows formed again to predict.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from .checks import BASIS_MODES_HOLDOUT, check_basis_mode, check_lambdas, check_rows
from .holdout import choose_strategy, holdout_path, lam_tilde, n_side_weights, strategy_costs

__all__ = ["holdout_path_model", "holdout_fold", "n_side_strategy"]


def _ut_piece(model, rows):
    """U rows of ``rows`` (cached, or formed from the rows on the fly)."""
    return model.u_rows(rows)[0]


def n_side_strategy(h, n, e, c, v) -> str:
    """The cheapest of the n-side strategies (chol / eig / tri) by the flop model."""
    costs = strategy_costs(h, n, e, c, v)
    costs.pop("small")
    return min(costs, key=costs.get)


def holdout_fold(model, H, lams, mode, stats):
    """Predictions (c, |H|, v) for one hold-out set."""
    c, Y, Q, Lam, z0 = lams.size, model.Y_, model.Q_, model.eigvals_, model.z0_
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
    budget = model.budget_
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
            strategy = n_side_strategy(h, n, e, c, v)
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
    check_basis_mode(basis_mode, BASIS_MODES_HOLDOUT, owner)
    lams = check_lambdas(lams, owner)
    model.check_fitted()
    H = check_rows(H, model.Y_.shape[0], owner)
    t0, stats = time.perf_counter(), Counter()
    f = holdout_fold(model, H, lams, basis_mode, stats)
    model.cv_stats_ = {"method": "holdout", "strategies": dict(stats),
                       "seconds": time.perf_counter() - t0}
    return f
