"""Where IBCD starts (§3.1): w_0 from a random sample's solution, or a previous solution."""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import ParameterError

from .. import _kernels as K
from ..dcd import solve_dcd
from .rows import row_sqn

__all__ = ["sample_row_bytes", "sample_start", "start_from_warm"]


def sample_row_bytes(store) -> int:
    """What a row of w_0's sample holds while it is solved: the row and its dual state
    (IBCD reserves twice this per sampled row: the rows and the copy S takes)."""
    return max(1, store.estimated_bytes(1)) + 40


def sample_start(store, cfg, rng, holdout, *, solve: bool = True):
    """Size w_0's sample from the cap and, with ``solve``, solve it by dual CD (§3.1).

    Returns ``(m0, start)``: the sample's size (also the chunk a warm start reads at a time)
    and ``(w_0, rows, X, y, alpha)`` of the sample's support vectors, which start S (None
    without ``solve``).

    The sample, its dual CD state and a copy must fit the cap: it is sized from the cap, not
    from what is free now (the free part depends on what the caches happen to hold, and w_0
    from another sample size takes another path). Cache entries are evicted for it; only
    what cannot be (a cap nearly full of buffers) shrinks it further.
    """
    a, z, mask = holdout
    row_bytes = sample_row_bytes(store)
    n_train = store.n_samples - (z - a if mask is None else int(mask.sum()))
    m0 = int(min(cfg.init_sample, n_train, max(100, store.budget.limit // (4 * row_bytes))))
    if not store.budget.try_reserve(2 * m0 * row_bytes):
        m0 = int(max(100, min(m0, store.budget.available // (2 * row_bytes))))
        store.budget.reserve(2 * m0 * row_bytes, "IBCD initial sample")
    try:
        return m0, (_solve_sample(store, cfg, rng, m0, holdout) if solve else None)
    finally:
        store.budget.release(2 * m0 * row_bytes)


def _solve_sample(store, cfg, rng, m0, holdout):
    a, z, mask = holdout
    if mask is None:
        sample = rng.choice(store.n_samples - (z - a), m0, replace=False)
        sample[sample >= a] += z - a  # the held-out rows are skipped
    else:
        sample = rng.choice(np.flatnonzero(~mask), m0, replace=False)
    sample.sort()
    Xs, ys, _ = store.gather(sample, whole_blocks=False)
    ys = ys.astype(np.float64)
    # init_iters passes: w_0 only starts the search, so no warning when they end it
    res0 = solve_dcd(Xs, ys, loss=cfg.loss, C=cfg.C, bias=cfg.bias, eps=cfg.eps,
                     max_iter=cfg.init_iters, seed=int(rng.integers(1 << 31)), warn=False)
    sv = np.flatnonzero(res0.alpha > 0)
    return res0.w.copy(), sample[sv], Xs[sv], ys[sv], res0.alpha[sv]


def start_from_warm(store, S, warm, chunk: int, holdout, bias) -> np.ndarray:
    """S from a previous solution's support vectors outside ``holdout``, read ``chunk`` rows
    at a time (each paid from the budget while it is copied into S); returns their
    w = sum alpha_i y_i [x_i, bias]."""
    row_bytes = sample_row_bytes(store)
    rows, alpha = (np.asarray(v) for v in warm)
    order = np.argsort(rows, kind="stable")
    rows, alpha = rows.astype(np.int64)[order], alpha.astype(np.float64)[order]
    if rows.shape != alpha.shape or (rows.size and (np.any(np.diff(rows) <= 0)
                                                    or rows[0] < 0
                                                    or rows[-1] >= store.n_samples)):
        raise ParameterError("The 'warm' parameter of solve_ibcd must be (rows, alpha): "
                             "distinct store rows and one alpha each.",
                             "Pass a previous result's (sv_rows, sv_alpha).")
    a, z, mask = holdout
    keep = (((rows < a) | (rows >= z)) if mask is None else ~mask[rows]) & (alpha > 0)
    rows, alpha = rows[keep], alpha[keep]
    w = np.zeros(store.n_features + 1)
    for i in range(0, rows.size, chunk):
        r, al = rows[i:i + chunk], alpha[i:i + chunk]
        with store.budget.reservation(2 * r.size * row_bytes, "IBCD warm start"):
            X, y, _ = store.gather(r, whole_blocks=False)
            y = y.astype(np.float64)
            K.rebuild_w(*kernel_args(X), float(bias), y, np.arange(r.size, dtype=np.int64),
                        al, w)
            S.add(r, X, y, row_sqn(X), al)
            del X, y
    return w
