"""ATO seeding: the multiple incremental-decremental path (Wen et al. 2017, section 3.1).

Following Karasuyama & Takeuchi (NIPS 2009): with step eta in [0, 1] the entering rows move
by  d alpha_T = eta (C - alpha_T)  and the leaving rows by  d alpha_R = -eta alpha_R  (eq. 7);
the free rows M of the shared set adjust so that their margins stay at 1 and y'alpha stays 0,

    [ 0    y_M' ] [d b      ]       [ y_T' d alpha_T + y_R' d alpha_R        ]
    [ y_M  Q_MM ] [d alpha_M]  = -  [ Q_MT d alpha_T + Q_MR d alpha_R        ]     (eq. 10)

(pseudo-inverse when singular), and the margins of all rows move linearly in eta (eq. 11).
eta is the largest step before a set changes: a free alpha reaches 0 or C, a bounded row of S
or an entering row of T reaches margin 1. The row that triggered the event changes set and the
next step starts; at eta = 1 every alpha_R is 0, R is empty and SMO finishes. A path longer
than ``max_steps`` stops early (``ato_truncated``), drops R and restores y'alpha = 0.
"""

from __future__ import annotations

import numpy as np

from .seeding import SeedContext, restore_equality

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
    """Adjusting alpha Towards Optimum; see the module docstring."""
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
