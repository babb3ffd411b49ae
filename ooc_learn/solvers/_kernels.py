"""Numba kernels of the linear solvers: dual CD, primal pieces for TRON, PEGASOS.

Pure functions over arrays and scalars. Rows are read either from a dense float32 matrix
``Xd`` (``sparse = False``) or from the CSR arrays ``indptr`` (int64), ``indices`` (int32),
``data`` (float32) (``sparse = True``); the unused representation is passed as an empty
array. Every kernel works on the rows listed in an index array, so the same code serves a
whole data set, an active set, a block, or the inliers of a truncated problem.

The weight vector ``w`` has ``d + 1`` entries: ``w[d]`` multiplies the constant augmented
feature of value ``bias`` (LIBLINEAR's ``-B``); ``bias = 0`` means no intercept.

Randomness comes from a splitmix64 state (one uint64 in a 1-element array) that the caller
seeds from a ``np.random.Generator``, so results are reproducible and independent of numba's
global generator.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._prefetch import PREFETCH_AHEAD, prefetch_row

# reassociation lets LLVM vectorise the row dot products; no other fast-math flag: the kernels
# compare against +-inf (shrinking bounds, the unbounded alpha of the squared hinge), which
# 'ninf' would let the compiler assume away
_REASSOC = {"reassoc", "contract"}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def next_u64(state):
    """splitmix64: advance ``state[0]`` and return a well-mixed 64-bit value."""
    z = state[0] + _GOLDEN
    state[0] = z
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def randbelow(state, k):
    """Uniform integer in ``[0, k)`` (k >= 1); the modulo bias is below 2^-40 for k < 2^24."""
    return np.int64(next_u64(state) % np.uint64(k))


@njit(cache=True, nogil=True)
def shuffle_prefix(index, m, state):
    """Fisher-Yates shuffle of ``index[:m]`` in place (LIBLINEAR's per-pass permutation)."""
    for i in range(m - 1):
        j = i + randbelow(state, m - i)
        t = index[i]
        index[i] = index[j]
        index[j] = t


@njit(cache=True, nogil=True, inline="always")
def row_dot(Xd, indptr, indices, data, sparse, bias, i, w):
    """``x_i^T w[:d] + bias * w[d]`` in float64."""
    d = w.shape[0] - 1
    acc = bias * w[d]
    if sparse:
        for p in range(indptr[i], indptr[i + 1]):
            acc += data[p] * w[indices[p]]
    else:
        for j in range(d):
            acc += Xd[i, j] * w[j]
    return acc


@njit(cache=True, nogil=True, inline="always")
def row_axpy(Xd, indptr, indices, data, sparse, bias, i, a, w):
    """``w += a * [x_i, bias]``."""
    d = w.shape[0] - 1
    w[d] += a * bias
    if sparse:
        for p in range(indptr[i], indptr[i + 1]):
            w[indices[p]] += a * data[p]
    else:
        for j in range(d):
            w[j] += a * Xd[i, j]


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def row_sqnorms(Xd, indptr, indices, data, sparse, n):
    """Squared norms of rows ``0..n-1`` (without the bias feature), float64."""
    out = np.zeros(n, dtype=np.float64)
    for i in range(n):
        acc = 0.0
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                acc += np.float64(data[p]) * data[p]
        else:
            for j in range(Xd.shape[1]):
                acc += np.float64(Xd[i, j]) * Xd[i, j]
        out[i] = acc
    return out


# --------------------------------------------------------------------------------------------
# Dual coordinate descent (Hsieh et al. 2008, Algorithm 3 with shrinking)
# --------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_REASSOC)
def dcd_epoch(Xd, indptr, indices, data, sparse, bias, y, sqn, index, active_size, alpha, w,
              upper, diag, pgmax_old, pgmin_old, shrinking, state):
    """One pass of dual CD over ``index[:active_size]`` in a fresh random order.

    ``alpha``, ``y`` and ``sqn`` (squared row norms) are indexed by row position in X;
    ``index`` holds the positions of the rows of the sub-problem and is permuted in place;
    rows shrunk in this pass are swapped behind the returned active size. ``w`` is updated
    in place. Returns ``(active_size, pgmax_new, pgmin_new, n_updates, n_visits)``.
    """
    pgmax_new = -np.inf
    pgmin_new = np.inf
    n_updates = 0
    n_visits = 0
    shuffle_prefix(index, active_size, state)
    b2 = bias * bias
    d = w.shape[0] - 1
    s = 0
    while s < active_size:
        i = index[s]
        if s + PREFETCH_AHEAD < active_size:
            prefetch_row(Xd, indptr, indices, data, sparse, index[s + PREFETCH_AHEAD])
        yi = 1.0 if y[i] > 0 else -1.0
        n_visits += 1
        # x_i^T w written out here: through row_dot the visit costs more
        acc = bias * w[d]
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                acc += data[p] * w[indices[p]]
        else:
            for j in range(d):
                acc += Xd[i, j] * w[j]
        G = yi * acc - 1.0 + diag * alpha[i]
        PG = 0.0
        if alpha[i] == 0.0:
            if shrinking and G > pgmax_old:
                active_size -= 1
                t = index[s]
                index[s] = index[active_size]
                index[active_size] = t
                continue
            elif G < 0.0:
                PG = G
        elif alpha[i] == upper:
            if shrinking and G < pgmin_old:
                active_size -= 1
                t = index[s]
                index[s] = index[active_size]
                index[active_size] = t
                continue
            elif G > 0.0:
                PG = G
        else:
            PG = G
        if PG > pgmax_new:
            pgmax_new = PG
        if PG < pgmin_new:
            pgmin_new = PG
        if abs(PG) > 1.0e-12:
            qd = sqn[i] + b2 + diag
            a_old = alpha[i]
            if qd > 0.0:
                a_new = min(max(a_old - G / qd, 0.0), upper)
            else:
                # an all-zero row without bias under the hinge: the objective is linear in it
                a_new = upper if G < 0.0 else 0.0
            alpha[i] = a_new
            c = (a_new - a_old) * yi  # w += c [x_i, bias], written out like the dot
            w[d] += c * bias
            if sparse:
                for p in range(indptr[i], indptr[i + 1]):
                    w[indices[p]] += c * data[p]
            else:
                for j in range(d):
                    w[j] += c * Xd[i, j]
            n_updates += 1
        s += 1
    return active_size, pgmax_new, pgmin_new, n_updates, n_visits


@njit(cache=True, nogil=True)
def dcd_solve(Xd, indptr, indices, data, sparse, bias, y, sqn, index, alpha, w, upper, diag,
              eps, relative, max_iter, shrinking, state):
    """LIBLINEAR's outer loop of dual CD on the rows in ``index`` (warm start from alpha, w).

    Stops when ``PGmax - PGmin <= eps`` over a pass of the whole (unshrunk) sub-problem; when
    only the shrunk problem meets it, every row is restored and the check repeats, as in
    LIBLINEAR. With ``relative`` the threshold is ``eps`` times the range of the first pass.
    Returns ``(epochs, n_updates, n_visits, pgmax, pgmin, converged)``.
    """
    m = index.shape[0]
    active_size = m
    pgmax_old = np.inf
    pgmin_old = -np.inf
    n_updates = 0
    n_visits = 0
    pgmax_new = 0.0
    pgmin_new = 0.0
    tol = eps
    epochs = 0
    converged = False
    while epochs < max_iter:
        active_size, pgmax_new, pgmin_new, u, v = dcd_epoch(
            Xd, indptr, indices, data, sparse, bias, y, sqn, index, active_size, alpha, w,
            upper, diag, pgmax_old, pgmin_old, shrinking, state)
        n_updates += u
        n_visits += v
        epochs += 1
        if active_size == 0:
            pgmax_new = 0.0
            pgmin_new = 0.0
        if relative and epochs == 1:
            tol = eps * max(pgmax_new - pgmin_new, 1e-300)
        if pgmax_new - pgmin_new <= tol:
            if active_size == m:
                converged = True
                break
            active_size = m
            pgmax_old = np.inf
            pgmin_old = -np.inf
            continue
        pgmax_old = pgmax_new if pgmax_new > 0.0 else np.inf
        pgmin_old = pgmin_new if pgmin_new < 0.0 else -np.inf
    return epochs, n_updates, n_visits, pgmax_new, pgmin_new, converged


# --------------------------------------------------------------------------------------------
# Dual coordinate descent for linear SVR (Ho & Lin 2012, LIBLINEAR -s 12 / -s 13)
# --------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_REASSOC)
def svr_epoch(Xd, indptr, indices, data, sparse, bias, y, sqn, index, active_size, beta, w,
              upper, diag, p, gmax_old, shrinking, state):
    """One pass of dual CD for SVR over ``index[:active_size]`` in a fresh random order.

    The dual ``min 1/2 beta^T (Q + D) beta - y^T beta + p |beta|_1``, ``-U <= beta <= U``,
    ``w = sum beta_i [x_i, bias]`` (L1 loss: U = C, D = 0; L2 loss: U = inf, D = 1/(2C)).
    Each step takes the Newton step of the one-variable problem at beta_i (the |.| term's
    two sides, G +- p), clipped to the box. Shrinking as LIBLINEAR's solve_l2r_l1l2_svr: a
    variable at 0 whose both one-sided gradients lie beyond the last pass's largest violation,
    or at a bound with its gradient pushing outward beyond it, leaves the pass. Returns
    ``(active_size, gmax_new, gnorm1_new, n_updates, n_visits)`` (the largest and the summed
    violation of the optimality conditions over the visited rows).
    """
    gmax_new = 0.0
    gnorm1 = 0.0
    n_updates = 0
    n_visits = 0
    shuffle_prefix(index, active_size, state)
    b2 = bias * bias
    nf = w.shape[0] - 1  # (d is the step below)
    s = 0
    while s < active_size:
        i = index[s]
        if s + PREFETCH_AHEAD < active_size:
            prefetch_row(Xd, indptr, indices, data, sparse, index[s + PREFETCH_AHEAD])
        n_visits += 1
        acc = bias * w[nf]  # x_i^T w written out, as in dcd_epoch
        if sparse:
            for q in range(indptr[i], indptr[i + 1]):
                acc += data[q] * w[indices[q]]
        else:
            for j in range(nf):
                acc += Xd[i, j] * w[j]
        G = acc - y[i] + diag * beta[i]
        Gp = G + p
        Gn = G - p
        H = sqn[i] + b2 + diag
        b = beta[i]
        shrink = False
        violation = 0.0
        if b == 0.0:
            if Gp < 0.0:
                violation = -Gp
            elif Gn > 0.0:
                violation = Gn
            elif Gp > gmax_old and Gn < -gmax_old:
                shrink = True
        elif b >= upper:
            if Gp > 0.0:
                violation = Gp
            elif Gp < -gmax_old:
                shrink = True
        elif b <= -upper:
            if Gn < 0.0:
                violation = -Gn
            elif Gn > gmax_old:
                shrink = True
        elif b > 0.0:
            violation = abs(Gp)
        else:
            violation = abs(Gn)
        if shrink and shrinking:
            active_size -= 1
            t = index[s]
            index[s] = index[active_size]
            index[active_size] = t
            continue
        if violation > gmax_new:
            gmax_new = violation
        gnorm1 += violation
        s += 1
        if H <= 0.0:
            continue  # an all-zero row without bias: nothing to move
        if Gp < H * b:
            d = -Gp / H
        elif Gn > H * b:
            d = -Gn / H
        else:
            d = -b
        if abs(d) < 1.0e-12:
            continue
        b_new = min(max(b + d, -upper), upper)
        if b_new != b:
            beta[i] = b_new
            c = b_new - b
            w[nf] += c * bias
            if sparse:
                for q in range(indptr[i], indptr[i + 1]):
                    w[indices[q]] += c * data[q]
            else:
                for j in range(nf):
                    w[j] += c * Xd[i, j]
            n_updates += 1
    return active_size, gmax_new, gnorm1, n_updates, n_visits


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def rebuild_w(Xd, indptr, indices, data, sparse, bias, y, rows, alpha, w):
    """``w += sum_{i in rows} alpha_i y_i [x_i, bias]`` (eq. 8 of the IBCD paper)."""
    for k in range(rows.shape[0]):
        i = rows[k]
        if alpha[i] != 0.0:
            yi = 1.0 if y[i] > 0 else -1.0
            row_axpy(Xd, indptr, indices, data, sparse, bias, i, alpha[i] * yi, w)


# --------------------------------------------------------------------------------------------
# Primal pieces (TRON on eq. 16)
# --------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_REASSOC)
def rows_dot(Xd, indptr, indices, data, sparse, bias, rows, w, out):
    """``out[k] = [x_{rows[k]}, bias]^T w``."""
    for k in range(rows.shape[0]):
        out[k] = row_dot(Xd, indptr, indices, data, sparse, bias, rows[k], w)


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def rows_tdot(Xd, indptr, indices, data, sparse, bias, rows, coef, out):
    """``out += sum_k coef[k] [x_{rows[k]}, bias]`` (skips zero coefficients)."""
    for k in range(rows.shape[0]):
        if coef[k] != 0.0:
            row_axpy(Xd, indptr, indices, data, sparse, bias, rows[k], coef[k], out)


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def rows_col_sqsum(Xd, indptr, indices, data, sparse, bias, rows, weight, out):
    """``out[j] += sum_k weight[k] x_{rows[k], j}^2`` (the bias column included)."""
    d = out.shape[0] - 1
    for k in range(rows.shape[0]):
        c = weight[k]
        if c == 0.0:
            continue
        i = rows[k]
        out[d] += c * bias * bias
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                out[indices[p]] += c * np.float64(data[p]) * data[p]
        else:
            for j in range(d):
                out[j] += c * np.float64(Xd[i, j]) * Xd[i, j]


@njit(cache=True, nogil=True)
def rows_dense(Xd, indptr, indices, data, sparse, bias, rows, out):
    """``out[k] = [x_{rows[k]}, bias]`` in float64 (``out`` is ``len(rows) x (d + 1)``)."""
    d = out.shape[1] - 1
    for k in range(rows.shape[0]):
        i = rows[k]
        if sparse:
            for j in range(d):
                out[k, j] = 0.0
            for p in range(indptr[i], indptr[i + 1]):
                out[k, indices[p]] = data[p]
        else:
            for j in range(d):
                out[k, j] = Xd[i, j]
        out[k, d] = bias


# --------------------------------------------------------------------------------------------
# The smoothed hinge's Newton step (hinge_newton.py)
# --------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def huber_weight(m, h):
    """The smoothed hinge's -dL/dm: 1 below 1 - h, 0 above 1 + h, linear between."""
    c = (1.0 + h - m) / (2.0 * h)
    return 1.0 if c >= 1.0 else (0.0 if c <= 0.0 else c)


@njit(cache=True, nogil=True)
def huber_weights(m, h, out):
    """``out[i]`` = :func:`huber_weight` of ``m[i]``."""
    for i in range(m.shape[0]):
        out[i] = huber_weight(m[i], h)


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def huber_slope(m, dm, h, C, t, ss, us):
    """phi'(t) for phi(t) = f(u - t s): ``t |s|^2 - (u - v)^T s + C sum c(m - t dm) dm``
    (``ss`` = |s|^2, ``us`` = (u - v)^T s, ``c`` = :func:`huber_weight`)."""
    acc = 0.0
    for i in range(m.shape[0]):
        if dm[i] != 0.0:
            acc += huber_weight(m[i] - t * dm[i], h) * dm[i]
    return t * ss - us + C * acc


@njit(cache=True, nogil=True)
def huber_line_search(m, dm, h, C, ss, us, tol):
    """The step t in (0, 1] minimising phi (convex, piecewise quadratic): 1 where phi'(1)
    <= 0, else phi''s root by bisection to ``tol`` (returned from above, where phi' > 0)."""
    if huber_slope(m, dm, h, C, 1.0, ss, us) <= 0.0:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if huber_slope(m, dm, h, C, mid, ss, us) > 0.0:
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------------------------
# PEGASOS (Shalev-Shwartz, Singer, Srebro 2007), w = scale * v
# --------------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, fastmath=_REASSOC)
def pegasos_pass(Xd, indptr, indices, data, sparse, bias, y, index, v, scale, t, lam,
                 squared, radius, state):
    """One pass of PEGASOS over ``index`` (shuffled in place), continuing at step ``t``.

    Step t: ``eta = 1/(lam t)``, ``w <- (1 - eta lam) w + eta (-L'(z)) y x`` for the hinge
    (``squared = False``) or the squared hinge, then projection onto ``|w| <= radius``
    (``radius <= 0``: none). ``w = scale * v`` makes the shrink O(1).
    Returns ``(scale, t, n_updates)``.
    """
    m = index.shape[0]
    shuffle_prefix(index, m, state)
    n_updates = 0
    # |v|^2, maintained incrementally for the projection
    vv = 0.0
    for j in range(v.shape[0]):
        vv += v[j] * v[j]
    b2 = bias * bias
    for k in range(m):
        i = index[k]
        if k + PREFETCH_AHEAD < m:
            prefetch_row(Xd, indptr, indices, data, sparse, index[k + PREFETCH_AHEAD])
        yi = 1.0 if y[i] > 0 else -1.0
        eta = 1.0 / (lam * t)
        z = yi * scale * row_dot(Xd, indptr, indices, data, sparse, bias, i, v)
        shrink = 1.0 - eta * lam
        if shrink <= 0.0:
            # first step: the old iterate is forgotten entirely
            for j in range(v.shape[0]):
                v[j] = 0.0
            vv = 0.0
            scale = 1.0
        else:
            scale *= shrink
        if z < 1.0:
            g = 2.0 * (1.0 - z) if squared else 1.0
            a = eta * g * yi / scale
            xv = row_dot(Xd, indptr, indices, data, sparse, bias, i, v)
            if sparse:
                xx = b2
                for p in range(indptr[i], indptr[i + 1]):
                    xx += np.float64(data[p]) * data[p]
            else:
                xx = b2
                for j in range(Xd.shape[1]):
                    xx += np.float64(Xd[i, j]) * Xd[i, j]
            vv += 2.0 * a * xv + a * a * xx
            row_axpy(Xd, indptr, indices, data, sparse, bias, i, a, v)
            n_updates += 1
        if radius > 0.0:
            norm = scale * np.sqrt(max(vv, 0.0))
            if norm > radius:
                scale *= radius / norm
        if scale < 1e-9:
            for j in range(v.shape[0]):
                v[j] *= scale
            vv *= scale * scale
            scale = 1.0
        t += 1
    return scale, t, n_updates


@njit(cache=True, nogil=True, fastmath=_REASSOC)
def cocoa_epoch(Xd, indptr, indices, data, sparse, bias, y, sqn, index, alpha, w_loc, dw,
                sigma, upper, diag, state):
    """One pass of CoCoA+'s local dual CD (Ma et al. 2015, adding, sigma' = sigma) over the
    rows ``index`` in a fresh random order: coordinate i of the local sub-problem has the
    gradient ``y_i x_i^T w_loc - 1 + diag alpha_i`` and the curvature
    ``sigma (|x_i|^2 + bias^2) + diag``, where ``w_loc = w + sigma dw`` is the round's w seen
    with this worker's own change; ``alpha``, ``w_loc`` and ``dw`` (the change of
    ``w = sum_i alpha_i y_i [x_i, bias]``) are updated in place. Returns the updates made."""
    shuffle_prefix(index, index.shape[0], state)
    b2 = bias * bias
    d = w_loc.shape[0] - 1
    n_updates = 0
    m = index.shape[0]
    for s in range(m):
        i = index[s]
        if s + PREFETCH_AHEAD < m:
            prefetch_row(Xd, indptr, indices, data, sparse, index[s + PREFETCH_AHEAD])
        yi = 1.0 if y[i] > 0 else -1.0
        acc = bias * w_loc[d]
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                acc += data[p] * w_loc[indices[p]]
        else:
            for j in range(d):
                acc += Xd[i, j] * w_loc[j]
        G = yi * acc - 1.0 + diag * alpha[i]
        qd = sigma * (sqn[i] + b2) + diag
        a_old = alpha[i]
        if qd > 0.0:
            a_new = min(max(a_old - G / qd, 0.0), upper)
        else:
            a_new = upper if G < 0.0 else 0.0
        if a_new == a_old:
            continue
        alpha[i] = a_new
        c = (a_new - a_old) * yi
        dw[d] += c * bias
        w_loc[d] += sigma * c * bias
        if sparse:
            for p in range(indptr[i], indptr[i + 1]):
                dw[indices[p]] += c * data[p]
                w_loc[indices[p]] += sigma * c * data[p]
        else:
            for j in range(d):
                dw[j] += c * Xd[i, j]
                w_loc[j] += sigma * c * Xd[i, j]
        n_updates += 1
    return n_updates
