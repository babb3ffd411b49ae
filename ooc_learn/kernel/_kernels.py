"""Numba kernels for kernel SVM: kernel columns, an LRU column cache, SMO and LOO solvers.

One module of about 700 lines, on purpose: the kernels call each other (SMO and Franc's LOO
solver share the kernel values, the column cache, SMO's working-set selection and pair step),
and numba kernels compose only by calling each other's functions. Split, the shared pieces
would become public names of one kernel module imported by the next, and a reader of the LOO
solver would read three files for one loop. The sections run in the order they build on each
other: kernel values, column cache, SMO pieces, the SMO driver, LOO (Franc et al.).

Everything here is a pure function over arrays and scalars. Two tuples travel together:

``kd`` (kernel data) = ``(Xd, indptr, indices, data, sqn, work, ktype, gamma, coef0, degree)``
    ``Xd`` is a dense float32 (n, d) matrix, or a (0, 0) array when the rows are CSR
    (``indptr`` int64, ``indices`` int32, ``data`` float32; empty when dense). ``sqn`` holds the
    float64 squared row norms, ``work`` a float64 scratch vector of length d.
``kc`` (kernel cache) = ``(cdata, slot_of, row_of, stamp, cnt)``
    ``cdata`` (slots, n) float64 holds whole kernel columns K(x_g, x_0..x_{n-1}) keyed by the
    global row g, so a column computed in one CV round or LOO row serves every later one.
    ``cnt`` counters: 0 clock, 1 hits, 2 columns computed, 3 kernel values computed,
    4 columns requested, 5 slots filled.

SMO variables live in global arrays of length n (``alpha``, ``G``, ``y``); a solve works on the
global row ids listed in ``train``, so no index translation happens between CV rounds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LINEAR, RBF, POLY = 0, 1, 2
TAU = 1e-12
# SMO looks for rows to shrink every SHRINK_PERIOD iterations (LIBSVM: 1000). With the kernel
# columns precomputed an iteration costs O(active rows), so shrinking sooner pays; a seeded
# round, often over before 1000 iterations, gains most (figures: docs/bench-log.md)
SHRINK_PERIOD = 100

# ----------------------------------------------------------------------------- kernel values


@njit(cache=True, nogil=True)
def kernel_value(dot, sa, sb, ktype, gamma, coef0, degree):
    if ktype == LINEAR:
        return dot
    if ktype == RBF:
        d2 = sa + sb - 2.0 * dot
        if d2 < 0.0:
            d2 = 0.0
        return np.exp(-gamma * d2)
    base = gamma * dot + coef0
    out = 1.0
    for _ in range(degree):
        out *= base
    return out


@njit(cache=True, nogil=True)
def gram_to_kernel(M, a, b, sq, ktype, gamma, coef0, degree):
    """Rows a..b of the Gram matrix M (x_i'x_j) turned into kernel values in place."""
    for i in range(a, b):
        si = sq[i]
        for j in range(M.shape[1]):
            M[i, j] = kernel_value(M[i, j], si, sq[j], ktype, gamma, coef0, degree)


@njit(cache=True, nogil=True)
def kernel_column(kd, g, out):
    """out[j] = K(x_g, x_j) for every row j."""
    Xd, indptr, indices, data, sqn, work, ktype, gamma, coef0, degree = kd
    n = sqn.shape[0]
    sg = sqn[g]
    if indptr.shape[0] == 0:
        d = Xd.shape[1]
        for k in range(d):
            work[k] = Xd[g, k]
        for j in range(n):
            acc = 0.0
            for k in range(d):
                acc += work[k] * Xd[j, k]
            out[j] = kernel_value(acc, sg, sqn[j], ktype, gamma, coef0, degree)
        for k in range(d):
            work[k] = 0.0
    else:
        for p in range(indptr[g], indptr[g + 1]):
            work[indices[p]] = data[p]
        for j in range(n):
            acc = 0.0
            for p in range(indptr[j], indptr[j + 1]):
                acc += data[p] * work[indices[p]]
            out[j] = kernel_value(acc, sg, sqn[j], ktype, gamma, coef0, degree)
        for p in range(indptr[g], indptr[g + 1]):
            work[indices[p]] = 0.0


@njit(cache=True, nogil=True)
def kernel_diag(kd, out):
    sqn = kd[4]
    for i in range(sqn.shape[0]):
        out[i] = kernel_value(sqn[i], sqn[i], sqn[i], kd[6], kd[7], kd[8], kd[9])


@njit(cache=True, nogil=True)
def cross_kernel(Xa, pa, ia, da, sqa, Xb, pb, ib, db, sqb, ktype, gamma, coef0, degree,
                 work, out):
    """out[a, b] = K(A_a, B_b) between two row sets (same layout, dense or CSR)."""
    na = sqa.shape[0]
    nb = sqb.shape[0]
    for a in range(na):
        if pa.shape[0] == 0:
            d = Xa.shape[1]
            for b in range(nb):
                acc = 0.0
                for k in range(d):
                    acc += np.float64(Xa[a, k]) * Xb[b, k]
                out[a, b] = kernel_value(acc, sqa[a], sqb[b], ktype, gamma, coef0, degree)
        else:
            for p in range(pa[a], pa[a + 1]):
                work[ia[p]] = da[p]
            for b in range(nb):
                acc = 0.0
                for p in range(pb[b], pb[b + 1]):
                    if ib[p] < work.shape[0]:
                        acc += db[p] * work[ib[p]]
                out[a, b] = kernel_value(acc, sqa[a], sqb[b], ktype, gamma, coef0, degree)
            for p in range(pa[a], pa[a + 1]):
                work[ia[p]] = 0.0


# ----------------------------------------------------------------------------- column cache


@njit(cache=True, nogil=True)
def get_col(kd, kc, g):
    """The kernel column of global row g, from the cache or computed (LRU eviction).

    The returned view stays valid until the next miss evicts its slot; with two or more
    slots the two most recently used columns are never evicted by one further request.
    """
    cdata, slot_of, row_of, stamp, cnt = kc
    cnt[0] += 1
    cnt[4] += 1
    s = slot_of[g]
    if s >= 0:
        stamp[s] = cnt[0]
        cnt[1] += 1
        return cdata[s]
    nslots = cdata.shape[0]
    if cnt[5] < nslots:
        s = cnt[5]
        cnt[5] += 1
    else:
        s = 0
        oldest = stamp[0]
        for t in range(1, nslots):
            if stamp[t] < oldest:
                oldest = stamp[t]
                s = t
        slot_of[row_of[s]] = -1
    row_of[s] = g
    slot_of[g] = s
    stamp[s] = cnt[0]
    kernel_column(kd, g, cdata[s])
    cnt[2] += 1
    cnt[3] += cdata.shape[1]
    return cdata[s]


@njit(cache=True, nogil=True)
def add_columns(kd, kc, cols, weights, rows, out):
    """out[t] += sum_j weights[j] * K(x_cols[j], x_t) for t in rows (one column per j)."""
    for a in range(cols.shape[0]):
        w = weights[a]
        if w == 0.0:
            continue
        col = get_col(kd, kc, cols[a])
        for t in rows:
            out[t] += w * col[t]


@njit(cache=True, nogil=True)
def gather_block(kd, kc, cols, rows, out):
    """out[:, a] = K(x_rows, x_cols[a]) (a dense block built from cached columns)."""
    for a in range(cols.shape[0]):
        col = get_col(kd, kc, cols[a])
        for b in range(rows.shape[0]):
            out[b, a] = col[rows[b]]


# ----------------------------------------------------------------------------- SMO pieces


@njit(cache=True, nogil=True)
def _select_i(act, n_act, y, alpha, G, C):
    """i = argmax_{t in I_up} -y_t G_t (first half of WSS 2 of Fan, Chen & Lin 2005)."""
    gmax = -np.inf
    i = -1
    for k in range(n_act):
        t = act[k]
        if y[t] > 0:
            if alpha[t] < C and -G[t] >= gmax:
                gmax = -G[t]
                i = t
        else:
            if alpha[t] > 0.0 and G[t] >= gmax:
                gmax = G[t]
                i = t
    return i, gmax


@njit(cache=True, nogil=True)
def _select_j(i, coli, gmax, diag, act, n_act, y, alpha, G, C):
    """j minimising the second-order decrease -b_it^2 / a_it over I_low; also M(alpha)."""
    gmax2 = -np.inf
    j = -1
    best = np.inf
    kii = diag[i]
    for k in range(n_act):
        t = act[k]
        if y[t] > 0:
            if alpha[t] <= 0.0:
                continue
            if G[t] >= gmax2:
                gmax2 = G[t]
            gd = gmax + G[t]
        else:
            if alpha[t] >= C:
                continue
            if -G[t] >= gmax2:
                gmax2 = -G[t]
            gd = gmax - G[t]
        if gd > 0.0:
            quad = kii + diag[t] - 2.0 * coli[t]
            if quad <= 0.0:
                quad = TAU
            obj = -(gd * gd) / quad
            if obj <= best:
                best = obj
                j = t
    return j, gmax2


@njit(cache=True, nogil=True)
def _pair_step(i, j, kij, diag, y, alpha, G, C):
    """Solve the two-variable sub-problem analytically and clip to the box (LIBSVM style)."""
    ai = alpha[i]
    aj = alpha[j]
    if y[i] != y[j]:
        quad = diag[i] + diag[j] - 2.0 * kij
        if quad <= 0.0:
            quad = TAU
        delta = (-G[i] - G[j]) / quad
        diff = ai - aj
        ai += delta
        aj += delta
        if diff > 0.0:
            if aj < 0.0:
                aj = 0.0
                ai = diff
        else:
            if ai < 0.0:
                ai = 0.0
                aj = -diff
        if diff > 0.0:
            if ai > C:
                ai = C
                aj = C - diff
        else:
            if aj > C:
                aj = C
                ai = C + diff
    else:
        quad = diag[i] + diag[j] - 2.0 * kij
        if quad <= 0.0:
            quad = TAU
        delta = (G[i] - G[j]) / quad
        s = ai + aj
        ai -= delta
        aj += delta
        if s > C:
            if ai > C:
                ai = C
                aj = s - C
        else:
            if aj < 0.0:
                aj = 0.0
                ai = s
        if s > C:
            if aj > C:
                aj = C
                ai = s - C
        else:
            if ai < 0.0:
                ai = 0.0
                aj = s
    return ai, aj


@njit(cache=True, nogil=True)
def _gbar_update(v, col, new, train, y, alpha, gbar, C):
    was_up = alpha[v] >= C
    is_up = new >= C
    if was_up != is_up:
        w = C * y[v] if is_up else -C * y[v]
        for t in train:
            gbar[t] += w * y[t] * col[t]


@njit(cache=True, nogil=True)
def _apply_pair(i, j, ai, aj, coli, colj, act, n_act, train, y, alpha, G, gbar, gbar_on, C):
    dai = ai - alpha[i]
    daj = aj - alpha[j]
    wi = y[i] * dai
    wj = y[j] * daj
    for k in range(n_act):
        t = act[k]
        G[t] += y[t] * (wi * coli[t] + wj * colj[t])
    if gbar_on:
        _gbar_update(i, coli, ai, train, y, alpha, gbar, C)
        _gbar_update(j, colj, aj, train, y, alpha, gbar, C)
    alpha[i] = ai
    alpha[j] = aj


@njit(cache=True, nogil=True)
def _init_gbar(kd, kc, train, y, alpha, C, gbar):
    for t in train:
        gbar[t] = 0.0
    for v in train:
        if alpha[v] >= C:
            col = get_col(kd, kc, v)
            w = C * y[v]
            for t in train:
                gbar[t] += w * y[t] * col[t]


@njit(cache=True, nogil=True)
def _reconstruct(kd, kc, train, is_act, y, alpha, G, gbar, C):
    """Gradient of shrunk rows from G_bar plus the free support vectors' columns."""
    n_in = 0
    for t in train:
        if not is_act[t]:
            n_in += 1
    if n_in == 0:
        return
    inact = np.empty(n_in, dtype=np.int64)
    k = 0
    for t in train:
        if not is_act[t]:
            inact[k] = t
            G[t] = gbar[t] - 1.0
            k += 1
    for v in train:
        if 0.0 < alpha[v] < C:
            col = get_col(kd, kc, v)
            w = alpha[v] * y[v]
            for t in inact:
                G[t] += w * y[t] * col[t]


@njit(cache=True, nogil=True)
def _be_shrunk(t, gm1, gm2, y, alpha, G, C):
    if alpha[t] >= C:
        if y[t] > 0:
            return -G[t] > gm1
        return -G[t] > gm2
    if alpha[t] <= 0.0:
        if y[t] > 0:
            return G[t] > gm2
        return G[t] > gm1
    return False


@njit(cache=True, nogil=True)
def _shrink(act, n_act, is_act, y, alpha, G, C, gm1, gm2):
    for a in range(n_act):
        t = act[a]
        if _be_shrunk(t, gm1, gm2, y, alpha, G, C):
            is_act[t] = False
    return _compact(act, n_act, is_act)


@njit(cache=True, nogil=True)
def _compact(rows, n_rows, keep):
    """Move the rows of ``rows[:n_rows]`` with ``keep[t]`` to its front, in order; returns
    how many."""
    k = 0
    for a in range(n_rows):
        t = rows[a]
        if keep[t]:
            rows[k] = t
            k += 1
    return k


@njit(cache=True, nogil=True)
def _violations(act, n_act, y, alpha, G, C):
    gm1 = -np.inf
    gm2 = -np.inf
    for a in range(n_act):
        t = act[a]
        if y[t] > 0:
            if alpha[t] < C:
                gm1 = max(gm1, -G[t])
            if alpha[t] > 0.0:
                gm2 = max(gm2, G[t])
        else:
            if alpha[t] > 0.0:
                gm1 = max(gm1, G[t])
            if alpha[t] < C:
                gm2 = max(gm2, -G[t])
    return gm1, gm2


@njit(cache=True, nogil=True)
def compute_rho(train, y, alpha, G, C):
    """rho = -b: mean of y_t G_t over free rows, else the middle of the feasible interval."""
    ub = np.inf
    lb = -np.inf
    nf = 0
    sf = 0.0
    for t in train:
        yg = y[t] * G[t]
        if alpha[t] >= C:
            if y[t] < 0:
                ub = min(ub, yg)
            else:
                lb = max(lb, yg)
        elif alpha[t] <= 0.0:
            if y[t] > 0:
                ub = min(ub, yg)
            else:
                lb = max(lb, yg)
        else:
            nf += 1
            sf += yg
    if nf > 0:
        return sf / nf
    return 0.5 * (ub + lb)


# ----------------------------------------------------------------------------- SMO driver


@njit(cache=True, nogil=True)
def _select(kd, kc, diag, act, n_act, y, alpha, G, C):
    """WSS 2 over the active rows: (i, j, m(a) - M(a), column of i)."""
    i, gmax = _select_i(act, n_act, y, alpha, G, C)
    if i < 0:
        return -1, -1, -np.inf, kc[0][0]
    coli = get_col(kd, kc, i)
    j, gmax2 = _select_j(i, coli, gmax, diag, act, n_act, y, alpha, G, C)
    return i, j, gmax + gmax2, coli


@njit(cache=True, nogil=True)
def smo_solve(kd, kc, diag, train, y, alpha, G, C, eps, shrinking, max_iter, phase):
    """C-SVM dual by SMO with WSS 2 and shrinking; see ``ooc_learn.kernel.smo``.

    ``alpha`` must be feasible and ``G`` = Q alpha - 1 on ``train`` on entry. Returns
    (rho, iterations, converged). ``phase[p]`` (p < len(phase)) receives the iteration at
    which the violating-pair gap (over the active rows) first fell below 10^-p.
    """
    n = y.shape[0]
    l = train.shape[0]
    act = train.copy()
    n_act = l
    is_act = np.zeros(n, dtype=np.bool_)
    for t in train:
        is_act[t] = True
    gbar = np.zeros(n)
    gbar_on = False
    unshrunk = False
    period = min(l, SHRINK_PERIOD)
    counter = period
    it = 0
    converged = False
    for p in range(phase.shape[0]):
        phase[p] = -1
    mark, below = 0, 1.0  # the next phase mark and the gap it waits for (10^-mark)
    while it < max_iter:
        counter -= 1
        if shrinking and counter == 0:
            counter = period
            gm1, gm2 = _violations(act, n_act, y, alpha, G, C)
            if not gbar_on:
                _init_gbar(kd, kc, train, y, alpha, C, gbar)
                gbar_on = True
            if (not unshrunk) and gm1 + gm2 <= eps * 10.0:
                unshrunk = True
                _reconstruct(kd, kc, train, is_act, y, alpha, G, gbar, C)
                act[:] = train
                n_act = l
                is_act[train] = True
            n_act = _shrink(act, n_act, is_act, y, alpha, G, C, gm1, gm2)
        i, j, gap, coli = _select(kd, kc, diag, act, n_act, y, alpha, G, C)
        while mark < phase.shape[0] and gap < below:
            phase[mark] = it
            mark += 1
            below = 10.0 ** (-mark)
        if gap < eps or j < 0:
            if n_act == l:
                converged = True
                break
            # optimal on the shrunk set: restore every row and look again (LIBSVM)
            _reconstruct(kd, kc, train, is_act, y, alpha, G, gbar, C)
            act[:] = train
            n_act = l
            is_act[train] = True
            i, j, gap, coli = _select(kd, kc, diag, act, n_act, y, alpha, G, C)
            if gap < eps or j < 0:
                converged = True
                break
            counter = 1
        colj = get_col(kd, kc, j)
        ai, aj = _pair_step(i, j, coli[j], diag, y, alpha, G, C)
        _apply_pair(i, j, ai, aj, coli, colj, act, n_act, train, y, alpha, G, gbar, gbar_on, C)
        it += 1
    if n_act < l:
        _reconstruct(kd, kc, train, is_act, y, alpha, G, gbar, C)
    return compute_rho(train, y, alpha, G, C), it, converged


# ----------------------------------------------------------------------------- LOO (Franc et al.)


@njit(cache=True, nogil=True)
def spread_avg(a, y, C, r, pool, free):
    """DeCoste & Wagstaff's AVG, in place: alpha_r spread evenly over the free alphas of
    ``pool`` (rows with y_r's label gain, the others lose, so y'alpha is unchanged); what
    clipping leaves is spread again over the rows still free, until no alpha moves (shares
    below the alphas' rounding step move none: the caller repairs y'alpha). ``free`` is
    scratch as long as ``pool``. Returns the amount that found no room."""
    left = a[r]
    a[r] = 0.0
    nf = 0
    for t in pool:
        if 0.0 < a[t] < C:
            free[nf] = t
            nf += 1
    tiny = 1e-14 * max(1.0, C)
    while left > tiny and nf > 0:
        share = left / nf
        moved = 0.0
        kept = 0
        for q in range(nf):
            t = free[q]
            new = a[t] + (share if y[t] == y[r] else -share)
            new = min(max(new, 0.0), C)
            moved += abs(new - a[t])
            a[t] = new
            if 0.0 < new < C:
                free[kept] = t
                kept += 1
        if moved == 0.0:
            break
        left -= moved
        nf = kept
    return max(left, 0.0)


@njit(cache=True, nogil=True)
def loo_seed_avg(y, alpha_full, C, r, a, train, free):
    """The AVG seed of the LOO problem without row r in one call (the per-row numpy calls'
    cost gone): ``train`` gets every row but r, ``a`` the full solution's alphas with
    alpha_r spread over the free ones (:func:`spread_avg`). ``free`` is scratch of length n.
    Returns sum_t y_t a_t over ``train``: 0 but for rounding, unless part of alpha_r found
    no room."""
    n = y.shape[0]
    k = 0
    for t in range(n):
        if t != r:
            train[k] = t
            k += 1
        a[t] = alpha_full[t]
    spread_avg(a, y, C, r, train, free)
    total = 0.0
    for t in train:
        total += a[t] * y[t]
    return total


@njit(cache=True, nogil=True)
def loo_seed_gradient(kd, kc, y, a, alpha_full, G_full, train, changed, acc, G):
    """SMO's gradient at the seed ``a`` from the full solution's: G = G_full, and on
    ``train`` G_i += y_i sum_j K_ij y_j (a_j - alpha_full_j) from the changed alphas'
    columns only (``smo.move_alpha``). ``changed`` and ``acc`` are scratch of length n."""
    n = y.shape[0]
    m = 0
    for j in range(n):
        G[j] = G_full[j]
        acc[j] = 0.0
        d = a[j] - alpha_full[j]
        if d != 0.0:
            changed[m] = j
            m += 1
    for q in range(m):
        j = changed[q]
        w = (a[j] - alpha_full[j]) * y[j]
        col = get_col(kd, kc, j)
        for t in train:
            acc[t] += w * col[t]
    for t in train:
        G[t] += y[t] * acc[t]
    return m


@njit(cache=True, nogil=True)
def _kth_smallest(a, m, k):
    """The k-th smallest of ``a[:m]`` (0-based), reordering ``a[:m]`` in place (Hoare's
    selection; no copy, unlike ``np.partition``)."""
    lo, hi = 0, m - 1
    while lo < hi:
        pivot = a[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return a[k]


@njit(cache=True, nogil=True)
def primal_value(train, y, alpha, G, C, scratch):
    """min over b of F(alpha, b, xi) = 1/2 a'Qa + C sum_t max(0, 1 - y_t f(x_t)); returns (F, b).

    The hinge sum is convex piecewise linear in b with kinks at -y_t G_t; its slope is
    #kinks below b minus #positives, so the P-th smallest kink (P = #positive rows) is a
    minimiser; F there by :func:`primal_at`.
    """
    m = train.shape[0]
    npos = 0
    for a in range(m):
        t = train[a]
        scratch[a] = -y[t] * G[t]
        if y[t] > 0:
            npos += 1
    b = _kth_smallest(scratch, m, npos - 1 if npos > 0 else 0)
    return primal_at(train, y, alpha, G, C, b), b


@njit(cache=True, nogil=True)
def primal_at(train, y, alpha, G, C, b):
    """F(alpha, b, xi) at a given b, xi the hinge losses: one pass, no selection. Any b gives
    a feasible (alpha, b, xi), so F here < H decides as the minimum over b does."""
    quad = 0.0
    hinge = 0.0
    for t in train:
        quad += alpha[t] * (G[t] + 1.0)
        v = -G[t] - y[t] * b
        if v > 0.0:
            hinge += v
    return 0.5 * quad + C * hinge


@njit(cache=True, nogil=True)
def dual_value(train, alpha, G):
    """G(alpha) = sum alpha - 1/2 a'Qa (the dual objective being maximised)."""
    s = 0.0
    for t in train:
        s += alpha[t] * (1.0 - G[t])
    return 0.5 * s


@njit(cache=True, nogil=True)
def beta_init(train, r, colr, y, beta, gp, G):
    """gp = Q' beta for kernel k'(i,j) = k(i,j) - k(r,i) - k(r,j) + k(r,r); returns H(beta).

    Uses u_t = sum_j beta_j y_j k(t, j) = y_t (G_t + 1), valid when beta equals the alpha
    whose gradient is G (the seeded start), so no extra kernel column is needed.
    """
    s = 0.0
    ur = 0.0
    for t in train:
        s += beta[t] * y[t]
        ur += beta[t] * y[t] * colr[t]
    krr = colr[r]
    h = 0.0
    for t in train:
        ut = y[t] * (G[t] + 1.0)
        gp[t] = y[t] * (ut - colr[t] * s - ur + krr * s)
        h += beta[t] * (1.0 - 0.5 * gp[t])
    return h


@njit(cache=True, nogil=True)
def h_curvatures(train, r, colr, diag, out):
    """``out[v] = k'(v, v) = k(v, v) - 2 k(r, v) + k(r, r)``: H's curvature along each
    coordinate, fixed for the removed row r (computed once a solve, not once a step)."""
    krr = colr[r]
    for v in train:
        out[v] = diag[v] - 2.0 * colr[v] + krr


@njit(cache=True, nogil=True, inline="always")
def _beta_move(v, hq, beta, gp, C):
    """The exact maximiser of H(beta) along coordinate v: ``(step, gain)``; ``hq`` from
    :func:`h_curvatures`."""
    grad = 1.0 - gp[v]
    q = hq[v]
    if q > 1e-12:
        d = grad / q
    elif grad > 0.0:
        d = C
    else:
        d = -C
    if d > C - beta[v]:
        d = C - beta[v]
    if d < -beta[v]:
        d = -beta[v]
    return d, d * grad - 0.5 * d * d * max(q, 0.0)


@njit(cache=True, nogil=True, inline="always")
def _beta_apply(v, d, col, r, colr, y, beta, gp):
    """beta_v += d, updating the gradient of H with the column of k(v, .) on every row (in
    order: a loop the compiler vectorises; rows outside the problem are never read)."""
    krr = colr[r]
    w = d * y[v]
    cb = colr[v]
    for t in range(gp.shape[0]):
        gp[t] += w * y[t] * (col[t] - cb - colr[t] + krr)
    beta[v] += d


@njit(cache=True, nogil=True)
def beta_step(kd, kc, hq, rows, n_rows, r, colr, y, beta, gp, C):
    """One coordinate-ascent step on H(beta) over 0 <= beta <= C (no equality constraint)
    along one of ``rows[:n_rows]``, H's gradient kept on every row.

    Picks the coordinate with the largest exact gain; returns the gain (0 when optimal).
    """
    best = 0.0
    bi = -1
    bd = 0.0
    for a in range(n_rows):
        t = rows[a]
        # the gain along t is at most grad^2 / (2 q) (unclipped): most rows are ruled out
        # by that bound without the division of the exact step
        g = 1.0 - gp[t]
        if g * g > 2.0 * best * hq[t] or hq[t] <= 1e-12:
            d, gain = _beta_move(t, hq, beta, gp, C)
            if gain > best:
                best = gain
                bi = t
                bd = d
    if bi < 0:
        return 0.0
    _beta_apply(bi, bd, get_col(kd, kc, bi), r, colr, y, beta, gp)
    return best


@njit(cache=True, nogil=True)
def _beta_pair_moves(i, j, coli, hq, r, colr, y, beta, gp, h_on, C):
    """The exact maximisers of H along i, then along j (:func:`_beta_move`), before either
    is applied: j's gradient after i's step is gp_j + d_i y_i y_j k'(i, j). Returns
    (d_i, d_j, gain); the caller applies both in one pass over the rows."""
    gain = 0.0
    di = 0.0
    if i != r and h_on[i]:
        di, g = _beta_move(i, hq, beta, gp, C)
        if g > 0.0 and di != 0.0:
            gain += g
        else:
            di = 0.0
    dj = 0.0
    if j != r and h_on[j]:
        gpj = gp[j]
        if di != 0.0:  # k'(i, j) = k(i, j) - k(r, i) - k(r, j) + k(r, r)
            gp[j] = gpj + di * y[i] * y[j] * (coli[j] - colr[i] - colr[j] + colr[r])
        dj, g = _beta_move(j, hq, beta, gp, C)
        gp[j] = gpj
        if g > 0.0 and dj != 0.0:
            gain += g
        else:
            dj = 0.0
    return di, dj, gain


# One greedy H step (a kernel column of its own) every H_GREEDY_PERIOD SMO iterations; the two
# coordinates SMO just moved are ascended every iteration for free. A greedy step every
# iteration pays a column each time, the pair alone leaves H slow to rise on RBF kernels; a
# step every few iterations keeps most of both gains (scripts/bench_loo.py measures it).
H_GREEDY_PERIOD = 8
# Once H exceeds the dual (F < H is then possible), F is evaluated every F_CHECK_PERIOD SMO
# iterations: a pass over the rows at the b of the last selection, which one check in
# F_SELECT_EVERY makes again (a selection for the b minimising F: two passes more)
F_CHECK_PERIOD = 8
F_SELECT_EVERY = 4


@njit(cache=True, nogil=True)
def _h_shrink(hact, n_hact, h_on, beta, gp, C):
    """Shrinking for H (LIBSVM's rule, for a box without the equality constraint): drop
    from ``hact[:n_hact]`` each coordinate at a bound whose gradient pushes it out by more
    than the largest violation among them: H no longer moves it (its gradient stays kept).
    Fewer pair steps then move H, and a pair step that does not skips the pass over H's
    gradient."""
    top = 0.0
    for a in range(n_hact):
        t = hact[a]
        g = 1.0 - gp[t]
        if beta[t] <= 0.0:
            v = g
        elif beta[t] >= C:
            v = -g
        else:
            v = abs(g)
        top = max(top, v)
    for a in range(n_hact):
        t = hact[a]
        g = 1.0 - gp[t]
        if (beta[t] <= 0.0 and -g > top) or (beta[t] >= C and g > top):
            h_on[t] = False
    return _compact(hact, n_hact, h_on)


@njit(cache=True, nogil=True)
def _unbiased_at(train, alpha, y, colr):
    """``sum_t alpha_t y_t k(x_t, x_r)``: the decision value at x_r before its bias."""
    u = 0.0
    for t in train:
        u += alpha[t] * y[t] * colr[t]
    return u


@njit(cache=True, nogil=True)
def loo_stopping_solve(kd, kc, diag, train, r, colr, y, alpha, G, beta, gp, C, eps, max_iter,
                       scratch):
    """Algorithm 3 of Franc, Laskov & Mueller (2008): SMO on problem (7) with the F < H stop.

    SMO's steps are :func:`smo_solve`'s, its shrinking included (the pairs are chosen among
    the active rows), but the gradient is kept on every row, since F needs every row's
    margin (a vector update, cheap beside the selections; no reconstruction when rows come
    back). H is ascended along SMO's pair and greedily, among the coordinates H's own
    shrinking (:func:`_h_shrink`) leaves.

    Returns (stopped_by_F_lt_H, decision value at x_r, iterations). The decision uses the b
    at which F < H held when the new condition fired (any b gives a feasible triple), else
    LIBSVM's rho.
    """
    n = y.shape[0]
    l = train.shape[0]
    h = beta_init(train, r, colr, y, beta, gp, G)
    d = dual_value(train, alpha, G)  # kept up to date below, O(1) an iteration
    hq = np.empty(n)
    h_curvatures(train, r, colr, diag, hq)
    krr = colr[r]
    act = train.copy()
    n_act = l
    is_act = np.zeros(n, dtype=np.bool_)
    hact = train.copy()
    n_hact = l
    h_on = np.zeros(n, dtype=np.bool_)
    for t in train:
        is_act[t] = True
        h_on[t] = True
    unshrunk = False
    period = min(l, SHRINK_PERIOD)
    counter = period
    next_f = 0
    f_checks = 0
    b = 0.0
    it = 0
    while it < max_iter:
        counter -= 1
        if counter == 0:
            counter = period
            gm1, gm2 = _violations(act, n_act, y, alpha, G, C)
            if (not unshrunk) and gm1 + gm2 <= eps * 10.0:
                unshrunk = True
                act[:] = train
                n_act = l
                is_act[train] = True
            n_act = _shrink(act, n_act, is_act, y, alpha, G, C, gm1, gm2)
            n_hact = _h_shrink(hact, n_hact, h_on, beta, gp, C)
        i, j, gap, coli = _select(kd, kc, diag, act, n_act, y, alpha, G, C)
        if gap < eps or j < 0:
            if n_act == l:
                break
            # optimal on the shrunk set: every row back (their gradients are current)
            act[:] = train
            n_act = l
            is_act[train] = True
            i, j, gap, coli = _select(kd, kc, diag, act, n_act, y, alpha, G, C)
            if gap < eps or j < 0:
                break
            counter = 1
        colj = get_col(kd, kc, j)
        ai, aj = _pair_step(i, j, coli[j], diag, y, alpha, G, C)
        # the dual's change for alpha moving by (di, dj), from the gradient before the move:
        # D(a + delta) - D(a) = -G'delta - delta'Q delta / 2
        di, dj = ai - alpha[i], aj - alpha[j]
        qij = y[i] * y[j] * coli[j]
        d -= G[i] * di + G[j] * dj + 0.5 * (diag[i] * di * di + diag[j] * dj * dj) \
            + qij * di * dj
        # Step 6: ascend H along the SMO pair's coordinates (their columns are in hand) and,
        # every H_GREEDY_PERIOD iterations, along the coordinate of largest gain (one column)
        bi, bj, gain = _beta_pair_moves(i, j, coli, hq, r, colr, y, beta, gp, h_on, C)
        h += gain
        # both gradients on every row in order (the rows outside ``train``, r alone in LOO,
        # are never read): contiguous loops the compiler vectorises, where ``for t in
        # train`` gathers
        wi, wj = y[i] * di, y[j] * dj
        vi, vj = y[i] * bi, y[j] * bj
        if vi != 0.0 or vj != 0.0:
            # k'(v, t) = k(v, t) - k(r, v) - k(r, t) + k(r, r), its constant parts summed;
            # both gradients in one pass over the columns
            vs, v0 = vi + vj, vi * (krr - colr[i]) + vj * (krr - colr[j])
            for t in range(n):
                a_t, b_t, yt = coli[t], colj[t], y[t]
                G[t] += yt * (wi * a_t + wj * b_t)
                gp[t] += yt * (vi * a_t + vj * b_t - vs * colr[t] + v0)
        else:
            for t in range(n):
                G[t] += y[t] * (wi * coli[t] + wj * colj[t])
        alpha[i] = ai
        alpha[j] = aj
        beta[i] += bi
        beta[j] += bj
        it += 1
        if it % H_GREEDY_PERIOD == 0:
            h += beta_step(kd, kc, hq, hact, n_hact, r, colr, y, beta, gp, C)
        if h > d and it >= next_f:  # F needs a pass: not every iteration
            next_f = it + F_CHECK_PERIOD
            if f_checks % F_SELECT_EVERY == 0:
                f, b = primal_value(train, y, alpha, G, C, scratch)
            else:
                f = primal_at(train, y, alpha, G, C, b)
            f_checks += 1
            if f < h:
                return True, _unbiased_at(train, alpha, y, colr) + b, it
    rho = compute_rho(train, y, alpha, G, C)
    return False, _unbiased_at(train, alpha, y, colr) - rho, it


@njit(cache=True, nogil=True)
def beta_solve(kd, kc, diag, train, r, colr, y, beta, gp, C, tol, max_iter):
    """Coordinate ascent on H(beta) from beta = 0 to convergence (checks max H = min F)."""
    for t in train:
        beta[t] = 0.0
        gp[t] = 0.0
    hq = np.empty(diag.shape[0])
    h_curvatures(train, r, colr, diag, hq)
    h = 0.0
    for _ in range(max_iter):
        g = beta_step(kd, kc, hq, train, train.shape[0], r, colr, y, beta, gp, C)
        h += g
        if g < tol:
            break
    return h
