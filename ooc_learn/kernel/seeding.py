"""Alpha seeding: initial alphas for the next SVM from the previous one (Wen et al., AAAI 2017).

Round h+1 of k-fold CV trains on  S u T  where the previous round trained on  S u R:  R (the
next test fold) leaves, T (the previous test fold) enters, the shared rows S keep their alpha.
Every seeder returns a new global alpha vector with alpha_R = 0 that is feasible
(0 <= alpha <= C, y'alpha = 0); SMO then finishes to the eps-KKT point, so CV results equal a
cold start's. The seeders:

* ``sir`` - Single Instance Replacement (Wen et al. section 3.3, Algorithm 3): each support
  vector of R hands its alpha to the most similar unused row of T with its label.
* ``mir`` - Multiple Instance Replacement (section 3.2, eqs. 13-18): alpha_T from the
  least-squares solution that keeps the optimality indicators of the shared rows.
* ``ato`` - Adjusting alpha Towards Optimum (section 3.1, eqs. 7-11): the multiple
  incremental-decremental path of Karasuyama & Takeuchi (NIPS 2009).
* ``avg`` / ``top`` - the LOO seeders of DeCoste & Wagstaff (2000) and Lee et al. (2004),
  applied to each removed row in turn (supplementary material of Wen et al.).

After SIR and MIR the equality y'alpha = 0 is restored by clipping to [0, C] and a uniform
shift alpha_t <- clip(alpha_t - y_t * delta) over the free alphas of T (MIR's adjustment).

What limits SIR and MIR (measured, scripts/bench_svm_cv.py data, 1000-row subsets, k = 10):
both keep alpha_S, but the optimal alpha of the shared rows moves by 8-38 % (L1, relative)
between consecutive rounds. Even an oracle that keeps alpha_S and gives T its exact optimal
alphas needs 0.57-0.89x cold start's SMO iterations on rounds 1..k-1 (SIR: 0.58-0.89x);
optimal alpha_S with alpha_T = 0 needs 0.08-0.50x. The replacement rule barely matters
(dropping R's alphas and letting T enter at 0 is within 0.03 of SIR except on a9a), and
neither does seeding from the full-data solution, a Newton step on the free rows after SIR
(0.54-0.83x with box line search, 0.51-1.31x clipped), or shrinking. SMO's iterations below
a pair gap of 0.1 are the same from a seed as from zero; only ATO (exact path, no SMO left)
removes them, at a path cost that exceeds the SMO work it saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .smo import KernelMatrix

__all__ = ["SeedContext", "SEEDERS", "restore_equality", "remove_avg", "remove_top"]


@dataclass
class SeedContext:
    """What a seeder may read: the previous round's solution and the three row sets."""

    km: KernelMatrix
    y: np.ndarray          # +-1, global
    alpha: np.ndarray      # previous round's alphas (global; 0 outside its training set)
    G: np.ndarray          # Q alpha - 1 on S u R (training) and on T (from its test decisions)
    rho: float             # previous round's rho (decision = sum a y K - rho)
    S: np.ndarray
    R: np.ndarray
    T: np.ndarray
    C: float
    rng: np.random.Generator
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- equality repair


def _shift_sum(a, yy, C, delta):
    return float(np.dot(yy, np.clip(a - yy * delta, 0.0, C)))


def _shift_rows(alpha, y, C, rows, target) -> bool:
    """alpha_t <- clip(alpha_t - y_t delta, 0, C) on rows with sum_t y_t alpha_t = target."""
    if rows.size == 0:
        return abs(target) <= 1e-12
    a, yy = alpha[rows], y[rows]
    bps = np.unique(np.concatenate([a * yy, (a - C) * yy]))
    hi, lo = _shift_sum(a, yy, C, bps[0]), _shift_sum(a, yy, C, bps[-1])
    scale = 1e-12 * max(1.0, C * rows.size)
    if target > hi + scale or target < lo - scale:
        return False
    # h(delta) is non-increasing and linear between breakpoints: bisect on the breakpoints
    i0, i1 = 0, bps.size - 1
    while i1 - i0 > 1:
        mid = (i0 + i1) // 2
        if _shift_sum(a, yy, C, bps[mid]) >= target:
            i0 = mid
        else:
            i1 = mid
    h0, h1 = _shift_sum(a, yy, C, bps[i0]), _shift_sum(a, yy, C, bps[i1])
    if h0 - h1 <= 0:
        delta = bps[i0]
    else:
        delta = bps[i0] + (h0 - min(max(target, h1), h0)) * (bps[i1] - bps[i0]) / (h0 - h1)
    alpha[rows] = np.clip(a - yy * delta, 0.0, C)
    return True


def restore_equality(alpha, y, C, train, prefer) -> None:
    """Clip alpha to [0, C] on ``train`` and make y'alpha = 0 there by a uniform shift.

    The shift runs over the free alphas of ``prefer`` (e.g. T), then all of ``prefer``, then
    all of ``train``; the first set that can absorb the imbalance is used.
    """
    alpha[train] = np.clip(alpha[train], 0.0, C)
    total = float(np.dot(alpha[train], y[train]))
    if abs(total) <= 1e-13 * max(1.0, C * train.size):
        return
    free = prefer[(alpha[prefer] > 0) & (alpha[prefer] < C)]
    for rows in (free, prefer, train):
        target = float(np.dot(alpha[rows], y[rows])) - total
        if _shift_rows(alpha, y, C, rows, target):
            return
    raise AssertionError("y'alpha = 0 cannot be restored; the training set lacks a class")


# ----------------------------------------------------------------------------- SIR, MIR


def seed_sir(ctx: SeedContext) -> np.ndarray:
    """Single Instance Replacement (Wen et al. Algorithm 3)."""
    a_old, y, T = ctx.alpha, ctx.y, ctx.T
    a = a_old.copy()
    used = np.zeros(T.size, dtype=bool)
    yT = y[T]
    random_picks = 0
    for r in ctx.R[a_old[ctx.R] > 0]:
        kT = ctx.km.column(r)[T]
        cand = ~used & (yT == y[r])
        if cand.any():
            idx = np.flatnonzero(cand)
            k = idx[np.argmax(kT[idx])]
        else:
            free = np.flatnonzero(~used)
            k = ctx.rng.choice(free) if free.size else ctx.rng.integers(T.size)
            random_picks += 1
        a[T[k]] += a_old[r]
        used[k] = True
    a[ctx.R] = 0.0
    restore_equality(a, y, ctx.C, np.concatenate([ctx.S, T]), T)
    ctx.info["random_picks"] = ctx.info.get("random_picks", 0) + random_picks
    return a


def _least_squares(AtA, Atb) -> np.ndarray:
    """The least-squares solution of eq. (18) from its normal equations: Cholesky with a
    ridge of 1e-10 of the mean diagonal, which stands in for the pseudo-inverse's minimum-norm
    solution where A'A is singular (an SVD, as ``lstsq``, cost 10-25x more: 25 ms a round
    for 500 entering rows); the pseudo-inverse itself if the factorisation still fails."""
    import scipy.linalg

    m = AtA.shape[0]
    if m == 0:
        return np.zeros(0)
    ridge = 1e-10 * max(float(np.trace(AtA)) / m, 1e-300)
    try:
        c = scipy.linalg.cho_factor(AtA + ridge * np.eye(m), check_finite=False)
        return scipy.linalg.cho_solve(c, Atb, check_finite=False)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(AtA, Atb, rcond=None)[0]


def seed_mir(ctx: SeedContext) -> np.ndarray:
    """Multiple Instance Replacement: least squares of eqs. (15)-(17), solved by eq. (18).

    For shared rows i: sum_t K_it y_t a_t = df_i + sum_r K_ir y_r a_r, with df_i = -b - f_i for
    free alphas (so they stay on the margin) and 0 for bounded ones; and
    sum_t y_t a_t = sum_r y_r a_r. Normal equations (:func:`_least_squares`).
    """
    km, y, S, R, T, C = ctx.km, ctx.y, ctx.S, ctx.R, ctx.T, ctx.C
    a = ctx.alpha.copy()
    f = y[S] * ctx.G[S]
    free = (a[S] > 0) & (a[S] < C)
    df = np.where(free, ctx.rho - f, 0.0)
    sv_r = R[a[R] > 0]
    w_r = a[sv_r] * y[sv_r]
    acc = np.zeros(km.n)
    km.add_columns(sv_r, w_r, S, acc)
    nbytes = 8 * S.size * T.size + 16 * T.size * T.size
    with km.budget.reservation(nbytes, "MIR kernel block"):
        A = km.block(T, S)           # the rows of eq. (15)-(16); eq. (17) is the row y_T
        A *= y[T][None, :]
        yT = y[T]
        AtA = A.T @ A
        AtA += np.outer(yT, yT)
        Atb = A.T @ (df + acc[S]) + yT * w_r.sum()
        del A
    a_t = _least_squares(AtA, Atb)
    a[R] = 0.0
    a[T] = a_t
    restore_equality(a, y, C, np.concatenate([S, T]), T)
    return a


# ----------------------------------------------------------------------------- AVG, TOP


def remove_avg(a, y, C, r, pool) -> float:
    """DeCoste & Wagstaff: spread alpha_r evenly over the free alphas of ``pool``.

    Rows with y_i = y_r gain, the others lose, so y'alpha is unchanged; clipped amounts are
    spread again over the rows still free. Returns the amount that found no room.
    """
    left = a[r]
    a[r] = 0.0
    free = pool[(a[pool] > 0) & (a[pool] < C)]
    while left > 1e-14 * max(1.0, C) and free.size:
        sgn = np.where(y[free] == y[r], 1.0, -1.0)
        new = np.clip(a[free] + sgn * (left / free.size), 0.0, C)
        left -= float(np.abs(new - a[free]).sum())
        a[free] = new
        free = free[(new > 0) & (new < C)]
    return max(left, 0.0)


def remove_top(a, y, C, r, pool, kcol) -> float:
    """Lee et al.: hand alpha_r to the most similar rows of ``pool`` (largest K(x_r, x_i))."""
    left = a[r]
    a[r] = 0.0
    for i in pool[np.argsort(-kcol[pool], kind="stable")]:
        if left <= 0.0:
            break
        room = C - a[i] if y[i] == y[r] else a[i]
        d = min(room, left)
        if d > 0:
            a[i] += d if y[i] == y[r] else -d
            left -= d
    return max(left, 0.0)


def _seed_loo_style(ctx: SeedContext, top: bool) -> np.ndarray:
    a = ctx.alpha.copy()
    for r in ctx.R[a[ctx.R] > 0]:
        if top:
            remove_top(a, ctx.y, ctx.C, r, ctx.S, ctx.km.column(r))
        else:
            remove_avg(a, ctx.y, ctx.C, r, ctx.S)
    a[ctx.R] = 0.0
    restore_equality(a, ctx.y, ctx.C, np.concatenate([ctx.S, ctx.T]), ctx.S)
    return a


def seed_avg(ctx: SeedContext) -> np.ndarray:
    """AVG for k-fold: each removed support vector of R is spread over S; T enters at 0."""
    return _seed_loo_style(ctx, top=False)


def seed_top(ctx: SeedContext) -> np.ndarray:
    """TOP for k-fold: each removed support vector of R goes to its nearest rows of S."""
    return _seed_loo_style(ctx, top=True)


def _seed_ato(ctx):
    from ._ato import seed_ato

    return seed_ato(ctx)


SEEDERS = {"sir": seed_sir, "mir": seed_mir, "ato": _seed_ato, "avg": seed_avg,
           "top": seed_top}
