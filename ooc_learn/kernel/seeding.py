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

What limits SIR and MIR: both keep alpha_S, but the optimal alpha of the shared rows moves
between consecutive rounds, so the seed's error is in alpha_S, not in how T enters; the
replacement rule for T matters little. SMO's iterations below a pair gap of 0.1 are the same
from a seed as from zero; only ATO (exact path, no SMO left) removes them, at a path cost
that exceeds the SMO work it saves (scripts/bench_svm_cv.py measures the seeders).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _kernels as K
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
    solution where A'A is singular (an SVD, as ``lstsq`` does, costs several times more);
    the pseudo-inverse itself if the factorisation still fails."""
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
    """DeCoste & Wagstaff: spread alpha_r evenly over the free alphas of ``pool``, in place
    (:func:`._kernels.spread_avg`; y'alpha unchanged). Returns the amount that found no
    room."""
    pool = np.asarray(pool, dtype=np.int64)
    return float(K.spread_avg(a, np.asarray(y, dtype=np.float64), float(C), int(r), pool,
                              np.empty(pool.size, np.int64)))


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


# ----------------------------------------------------------------------------- ATO
# ATO seeding: the multiple incremental-decremental path (Wen et al. 2017, section 3.1).
#
# Following Karasuyama & Takeuchi (NIPS 2009): with step eta in [0, 1] the entering rows move
# by  d alpha_T = eta (C - alpha_T)  and the leaving rows by  d alpha_R = -eta alpha_R  (eq. 7);
# the free rows M of the shared set adjust so that their margins stay at 1 and y'alpha stays 0,
#
#     [ 0    y_M' ] [d b      ]       [ y_T' d alpha_T + y_R' d alpha_R        ]
#     [ y_M  Q_MM ] [d alpha_M]  = -  [ Q_MT d alpha_T + Q_MR d alpha_R        ]     (eq. 10)
#
# (pseudo-inverse when singular), and the margins of all rows move linearly in eta (eq. 11).
# eta is the largest step before a set changes: a free alpha reaches 0 or C, a bounded row of S
# or an entering row of T reaches margin 1. The row that triggered the event changes set and the
# next step starts; at eta = 1 every alpha_R is 0, R is empty and SMO finishes. A path longer
# than ``max_steps`` stops early (``ato_truncated``), drops R and restores y'alpha = 0.

O_SET, I_SET, M_SET, T_SET, R_SET, GONE = 0, 1, 2, 3, 4, 5


def _direction(Kb, y_cols, y_u, state_cols, a_cols, m_idx, C):
    """Solve eq. (10) for one unit of eta; returns (phi over cols, phi_b)."""
    st = state_cols
    phi = np.zeros(st.size)
    phi[st == T_SET] = C - a_cols[st == T_SET]
    phi[st == R_SET] = -a_cols[st == R_SET]
    mov = st != M_SET
    nm = m_idx.size
    Mc = np.flatnonzero(st == M_SET)
    yM = y_cols[Mc]
    rhs = np.empty(nm + 1)
    rhs[0] = -np.dot(y_cols[mov], phi[mov])
    # rows of Kb for the free rows: Kb is (|U|, |cols|); m_idx are their positions in U
    KMc = Kb[m_idx][:, mov]
    rhs[1:] = -(yM * (KMc @ (y_cols[mov] * phi[mov])))
    A = np.empty((nm + 1, nm + 1))
    A[0, 0] = 0.0
    A[0, 1:] = yM
    A[1:, 0] = yM
    A[1:, 1:] = (yM[:, None] * yM[None, :]) * Kb[m_idx][:, Mc]
    try:
        sol = np.linalg.solve(A, rhs)
    except np.linalg.LinAlgError:
        sol = np.linalg.lstsq(A, rhs, rcond=None)[0]
    phi[Mc] = sol[1:]
    return phi, sol[0]


def _step_size(phi, gam, st_cols, a_cols, st_u, m_u, C):
    """Largest eta <= 1 before a set changes; returns (eta, kind, index)."""
    best, kind, where = 1.0, "end", -1
    with np.errstate(divide="ignore", invalid="ignore"):
        Mc = st_cols == M_SET
        up = np.where(Mc & (phi > 1e-12), (C - a_cols) / phi, np.inf)
        dn = np.where(Mc & (phi < -1e-12), -a_cols / phi, np.inf)
        o = np.where((st_u == O_SET) & (gam < -1e-12), (m_u - 1.0) / -gam, np.inf)
        i = np.where((st_u == I_SET) & (gam > 1e-12), (1.0 - m_u) / gam, np.inf)
        t = np.where((st_u == T_SET) & (gam > 1e-12), (1.0 - m_u) / gam, np.inf)
    for arr, name in ((up, "col"), (dn, "col"), (o, "row"), (i, "row"), (t, "row")):
        if arr.size:
            k = int(np.argmin(arr))
            if arr[k] < best:
                best, kind, where = max(float(arr[k]), 0.0), name, k
    return best, kind, where


def seed_ato(ctx: SeedContext, max_steps: int | None = None) -> np.ndarray:
    """Adjusting alpha Towards Optimum along the path of eqs. 7-11 (the ATO section above)."""
    km, y, C = ctx.km, ctx.y, ctx.C
    S, R, T = ctx.S, ctx.R, ctx.T
    a = ctx.alpha.copy()
    b = -ctx.rho
    U = np.concatenate([S, R, T])
    m_u = ctx.G[U] + 1.0 + y[U] * b          # margins y_i f(x_i)
    st_u = np.full(U.size, O_SET)
    aU = a[U]
    st_u[(aU >= C)] = I_SET
    st_u[(aU > 0) & (aU < C)] = M_SET
    nS, nR = S.size, R.size
    st_u[nS:nS + nR] = np.where(aU[nS:nS + nR] > 0, R_SET, GONE)
    tpart = st_u[nS + nR:]
    tpart[:] = np.where(m_u[nS + nR:] < 1.0, T_SET, O_SET)
    steps = 0
    cap = max_steps if max_steps is not None else 2 * (R.size + T.size) + 50
    colcache: dict[int, np.ndarray] = {}
    while np.any(st_u == R_SET) or np.any(st_u == T_SET):
        if steps >= cap:
            ctx.info["ato_truncated"] = ctx.info.get("ato_truncated", 0) + 1
            break
        cpos = np.flatnonzero((st_u == M_SET) | (st_u == T_SET) | (st_u == R_SET))
        cols = U[cpos]
        for g in cols:
            if int(g) not in colcache:
                colcache[int(g)] = km.column(g)[U]
        Kb = np.column_stack([colcache[int(g)] for g in cols])
        st_cols, a_cols = st_u[cpos], a[cols]
        m_idx = cpos[st_cols == M_SET]
        phi, phi_b = _direction(Kb, y[cols], y[U], st_cols, a_cols, m_idx, C)
        gam = y[U] * (Kb @ (y[cols] * phi) + phi_b)
        eta, kind, k = _step_size(phi, gam, st_cols, a_cols, st_u, m_u, C)
        a[cols] = np.clip(a_cols + eta * phi, 0.0, C)
        b += eta * phi_b
        m_u += eta * gam
        steps += 1
        if kind == "end":
            a[U[st_u == R_SET]] = 0.0
            st_u[st_u == R_SET] = GONE
            a[U[st_u == T_SET]] = C
            st_u[st_u == T_SET] = I_SET
            break
        if kind == "col":
            p = cpos[k]
            st_u[p] = I_SET if phi[k] > 0 else O_SET
            a[U[p]] = C if phi[k] > 0 else 0.0
        else:
            st_u[k] = M_SET
    ctx.info["ato_steps"] = ctx.info.get("ato_steps", 0) + steps
    a[R] = 0.0
    restore_equality(a, y, C, np.concatenate([S, T]), np.concatenate([S, T]))
    return a


SEEDERS = {"sir": seed_sir, "mir": seed_mir, "ato": seed_ato, "avg": seed_avg,
           "top": seed_top}
