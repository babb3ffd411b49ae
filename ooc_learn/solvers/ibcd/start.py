"""Where IBCD starts (§3.1): w_0 from a random sample's solution, or a previous solution."""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.arrays import kernel_args, stack_rows
from ooc_learn.storage.errors import ParameterError

from .. import _kernels as K
from .._common import margins
from ..dcd import solve_dcd
from .rows import row_sqn

__all__ = ["sample_row_bytes", "sample_start", "start_from_warm"]

# passes of a sample solved in pieces (the first reads every row, the others its violators)
PIECE_PASSES = 5


def sample_row_bytes(store) -> int:
    """What a row of w_0's sample holds while it is solved: the row and its dual state
    (IBCD reserves twice this per sampled row: the rows and the copy S takes)."""
    return max(1, store.estimated_bytes(1)) + 40


def sample_start(store, cfg, rng, holdout, *, solve: bool = True):
    """Size what w_0's sample may hold at once from the cap and, with ``solve``, solve the
    sample by dual CD (§3.1). Returns ``(m0, start)``: the rows held at once (also the chunk
    a warm start reads at a time) and ``(w_0, rows, X, y, alpha)`` of the sample's support
    vectors, which start S (None without ``solve``).

    What the cap holds, ``m0`` rows with their dual CD state and a copy, is sized from the
    cap, not from what is free now (the free part depends on what the caches happen to hold,
    and w_0 from another sample size takes another path); cache entries are evicted for it,
    and only what cannot be (a cap nearly full of buffers) shrinks it further. With the
    convex loss the sample is at most ``m0`` rows: w_0 only starts the search for the one
    optimum. With the truncated loss, w_0 picks the local optimum the outer iterations reach,
    so the sample is ``init_sample`` rows whatever the cap, solved in pieces where it holds
    fewer (:func:`_solve_in_pieces`), unless the sampled rule stops the run and reading the
    sample PIECE_PASSES times would read more than a tenth of the store (a sample that is a
    large part of a small store: that rule reads about that much in all, where the exact stop
    reads the store at least once an outer iteration); measured in ``docs/bench-log.md``,
    2026-11-27.
    """
    a, z, mask = holdout
    row_bytes = sample_row_bytes(store)
    n_train = store.n_samples - (z - a if mask is None else int(mask.sum()))
    m_all = int(min(cfg.init_sample, n_train))
    m0 = int(min(m_all, max(100, store.budget.limit // (4 * row_bytes))))
    if not store.budget.try_reserve(2 * m0 * row_bytes):
        m0 = int(max(100, min(m0, store.budget.available // (2 * row_bytes))))
        store.budget.reserve(2 * m0 * row_bytes, "IBCD initial sample")
    # the exact stop reads the store once an outer iteration at the least; the sampled rule
    # may read a tenth of it in all
    if not cfg.truncated or (cfg.sample_eps > 0 and PIECE_PASSES * m_all > n_train // 10):
        m_all = m0
    try:
        return m0, (_solve_sample(store, cfg, rng, m0, m_all, holdout) if solve else None)
    finally:
        store.budget.release(2 * m0 * row_bytes)


def _solve_sample(store, cfg, rng, m0, m_all, holdout):
    a, z, mask = holdout
    if mask is None:
        sample = rng.choice(store.n_samples - (z - a), m_all, replace=False)
        sample[sample >= a] += z - a  # the held-out rows are skipped
    else:
        sample = rng.choice(np.flatnonzero(~mask), m_all, replace=False)
    seed = int(rng.integers(1 << 31))
    # a sample the cap holds is one piece, solved once
    return _solve_in_pieces(store, cfg, sample, m0, seed,
                            max_passes=PIECE_PASSES if m_all > m0 else 1)


def _solve_in_pieces(store, cfg, sample, m0, seed, max_passes: int = PIECE_PASSES):
    """The sample's problem, ``m0`` rows at once, by chunking (Osuna et al. 1997; a sample
    of at most ``m0`` rows is one piece): the support vectors so far plus the next piece of
    the sample are
    solved by dual CD (their alphas the warm start), piece after piece; passes after the
    first add only the rows of each piece that violate at the current w, until a pass adds
    none (the sample's own solution, to dual CD's eps) or after ``max_passes``. A piece takes
    what the support vectors leave of ``m0``; the passes end early where that is less than a
    quarter of it. Returns ``(w_0, rows, X, y, alpha)`` of the support vectors, the rows in
    store order. (init_iters passes a solve: w_0 only starts the search, so no warning when
    they end it.)"""
    rows = np.empty(0, np.int64)
    X = y = alpha = w = None
    sample = np.sort(sample)
    for p in range(max_passes):
        added, pos = 0, 0
        while pos < sample.size and m0 - rows.size >= max(1, m0 // 4):
            room = m0 - rows.size
            if p == 0:
                part = sample[pos:pos + room]
                pos += part.size
                Xp, yp, _ = store.gather(part, whole_blocks=False)
            else:  # the rows outside the solution that violate at w, up to the room
                part, Xp, yp, pos = _violators(store, cfg, sample, pos, rows, w, room)
                if not part.size:
                    continue
            Xc = Xp if X is None else stack_rows([X, Xp])
            yc = yp.astype(np.float64) if y is None else np.concatenate([y, yp])
            a0 = None if alpha is None else np.concatenate([alpha, np.zeros(part.size)])
            rc = part if X is None else np.concatenate([rows, part])
            added += part.size
            del X, Xp
            res = solve_dcd(Xc, yc, loss=cfg.loss, C=cfg.C, bias=cfg.bias, eps=cfg.eps,
                            max_iter=cfg.init_iters, alpha0=a0, seed=seed, warn=False)
            sv = np.flatnonzero(res.alpha > 0)
            rows, X, y, alpha, w = rc[sv], Xc[sv], yc[sv], res.alpha[sv], res.w
            del Xc
        if p and not added:
            break
    order = np.argsort(rows, kind="stable")
    return w.copy(), rows[order], X[order], y[order], alpha[order]


def _violators(store, cfg, sample, pos, held, w, room):
    """From ``sample[pos:]`` on, read in runs of ``room`` rows, the rows not in ``held``
    whose margin at ``w`` is below 1 - eps (their alpha = 0 violates the optimality
    conditions by more than dual CD's tolerance), up to ``room`` of them. Returns ``(rows, X,
    y, next_pos)``."""
    while pos < sample.size:
        part = sample[pos:pos + room]
        part = part[~np.isin(part, held)]
        pos += room
        if not part.size:
            continue
        Xp, yp, _ = store.gather(part, whole_blocks=False)
        v = np.flatnonzero(margins(Xp, yp.astype(np.float64), w, cfg.bias) < 1.0 - cfg.eps)
        if v.size:
            return part[v], Xp[v], yp[v], pos
    return np.empty(0, np.int64), None, None, pos


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
