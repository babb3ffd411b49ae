"""Per-row numba kernels of the incremental learners.

Every numba learner keeps its whole model in one flat float64 ``state`` vector, so that copying
a model is one ``memcpy`` and a stack of saved models is one 2-D array (TreeCV keeps one row per
level of its recursion). The first slots hold scalars, the rest hold vectors:

- Pegasos  ``[t, a, vsq, lam, project, v(d)]``: w = a * v (scaled representation, so the
  shrink step (1 - 1/t) w costs O(1)); ``vsq`` = ||v||^2 for the projection.
- LSQSGD   ``[N, a, beta, vsq, alpha, radius, v(d), P(d)]``: iterate w = a * v, running sum of
  the iterates S = P + beta * v (kept lazily so a sparse row costs O(nnz)).
- Exact LS ``[count, ridge, G(d*d), b(d)]``: sufficient statistics G = sum x x^T, b = sum y x.

Rows are read from dense float32 ``Xd`` (n, d) or from CSR arrays (``indptr`` int64,
``indices`` int32, ``data`` float32); ``is_csr`` says which, and the other is a placeholder.
``order`` lists the rows to feed, in feeding order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._prefetch import PREFETCH_AHEAD, prefetch_row

# learner kinds: the only place these codes are defined
PEGASOS = 0
LSQSGD = 1
EXACT_LS = 2

PEG_HEAD = 5
LSQ_HEAD = 6
EXACT_HEAD = 2

_RENORM_LOW = 1e-6
_RENORM_HIGH = 1e6
_LSQ_RENORM = 1e-2


@njit(cache=True, nogil=True)
def row_dot(w, off, Xd, indptr, indices, data, is_csr, i):
    """x_i . w[off:off+d]."""
    s = 0.0
    if is_csr:
        for p in range(indptr[i], indptr[i + 1]):
            s += w[off + indices[p]] * data[p]
    else:
        for j in range(Xd.shape[1]):
            s += w[off + j] * Xd[i, j]
    return s


@njit(cache=True, nogil=True)
def _peg_renorm(state, d):
    # also recompute ||v||^2 exactly: the incremental update drifts by rounding
    a = state[1]
    vsq = 0.0
    for j in range(d):
        state[PEG_HEAD + j] *= a
        vsq += state[PEG_HEAD + j] * state[PEG_HEAD + j]
    state[2] = vsq
    state[1] = 1.0


@njit(cache=True, nogil=True)
def _pegasos_row(state, d, Xd, indptr, indices, data, is_csr, i, yi):
    # Pegasos step (Shalev-Shwartz et al. 2011, Fig. 1, batch size 1):
    # eta = 1/(lam t); w <- (1 - eta lam) w + eta y x  [if y w.x < 1]; optional projection.
    t = state[0] + 1.0
    state[0] = t
    lam = state[3]
    margin = yi * state[1] * row_dot(state, PEG_HEAD, Xd, indptr, indices, data, is_csr, i)
    if t == 1.0:
        # the shrink factor 1 - 1/t is exactly 0: the first step forgets w
        for j in range(d):
            state[PEG_HEAD + j] = 0.0
        state[1] = 1.0
        state[2] = 0.0
    else:
        state[1] *= 1.0 - 1.0 / t
    if margin < 1.0:
        c = yi / (lam * t) / state[1]
        vsq = state[2]
        if is_csr:
            for p in range(indptr[i], indptr[i + 1]):
                k = PEG_HEAD + indices[p]
                old = state[k]
                new = old + c * data[p]
                state[k] = new
                vsq += new * new - old * old
        else:
            for j in range(d):
                k = PEG_HEAD + j
                old = state[k]
                new = old + c * Xd[i, j]
                state[k] = new
                vsq += new * new - old * old
        state[2] = max(vsq, 0.0)
    if state[4] != 0.0:
        wsq = state[1] * state[1] * state[2]
        if wsq * lam > 1.0:
            state[1] *= 1.0 / np.sqrt(lam * wsq)
    if state[1] < _RENORM_LOW or state[1] > _RENORM_HIGH:
        _peg_renorm(state, d)


@njit(cache=True, nogil=True)
def _lsq_renorm(state, d):
    # fold beta * v into P first, so P + beta v never cancels large terms
    a = state[1]
    beta = state[2]
    v0 = LSQ_HEAD
    p0 = LSQ_HEAD + d
    vsq = 0.0
    for j in range(d):
        state[p0 + j] += beta * state[v0 + j]
        state[v0 + j] *= a
        vsq += state[v0 + j] * state[v0 + j]
    state[2] = 0.0
    state[3] = vsq
    state[1] = 1.0


@njit(cache=True, nogil=True)
def _lsq_row(state, d, Xd, indptr, indices, data, is_csr, i, yi):
    # Robust SA (Nemirovski et al. 2009, sec. 2.2) on 0.5 (w.x - y)^2 over ||w|| <= radius:
    # the average takes the iterate w_t before step t; w <- Proj(w - alpha (w.x - y) x).
    a = state[1]
    state[0] += 1.0
    state[2] += a
    beta = state[2]
    alpha = state[4]
    g = a * row_dot(state, LSQ_HEAD, Xd, indptr, indices, data, is_csr, i) - yi
    c = -alpha * g / a
    v0 = LSQ_HEAD
    p0 = LSQ_HEAD + d
    vsq = state[3]
    if is_csr:
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            delta = c * data[p]
            old = state[v0 + j]
            new = old + delta
            state[v0 + j] = new
            state[p0 + j] -= beta * delta
            vsq += new * new - old * old
    else:
        for j in range(d):
            delta = c * Xd[i, j]
            old = state[v0 + j]
            new = old + delta
            state[v0 + j] = new
            state[p0 + j] -= beta * delta
            vsq += new * new - old * old
    vsq = max(vsq, 0.0)
    state[3] = vsq
    radius = state[5]
    wsq = a * a * vsq
    if wsq > radius * radius:
        state[1] = a * radius / np.sqrt(wsq)
    # S = P + beta v cancels about beta |v| / |S| <= (max past a) / a digits: fold it
    # into P once the scale has dropped 100x, keeping the average accurate to ~1e-14
    if state[1] < _LSQ_RENORM:
        _lsq_renorm(state, d)


@njit(cache=True, nogil=True)
def _exact_row(state, d, Xd, indptr, indices, data, is_csr, i, yi):
    state[0] += 1.0
    g0 = EXACT_HEAD
    b0 = EXACT_HEAD + d * d
    if is_csr:
        for p in range(indptr[i], indptr[i + 1]):
            jp = indices[p]
            xp = np.float64(data[p])
            state[b0 + jp] += yi * xp
            for q in range(indptr[i], indptr[i + 1]):
                state[g0 + jp * d + indices[q]] += xp * data[q]
    else:
        for j in range(d):
            xj = np.float64(Xd[i, j])
            if xj == 0.0:
                continue
            state[b0 + j] += yi * xj
            row = g0 + j * d
            for q in range(d):
                state[row + q] += xj * Xd[i, q]


@njit(cache=True, nogil=True)
def _update_row(kind, state, d, Xd, indptr, indices, data, is_csr, i, yi):
    """Feed row i to the learner ``kind`` (the one dispatch every feeding loop shares)."""
    if kind == PEGASOS:
        _pegasos_row(state, d, Xd, indptr, indices, data, is_csr, i, yi)
    elif kind == LSQSGD:
        _lsq_row(state, d, Xd, indptr, indices, data, is_csr, i, yi)
    else:
        _exact_row(state, d, Xd, indptr, indices, data, is_csr, i, yi)


@njit(cache=True, nogil=True)
def update_rows(kind, state, d, Xd, indptr, indices, data, is_csr, y, order):
    """Feed rows ``order[0], order[1], ...`` to the model in ``state`` (in place)."""
    m = order.shape[0]
    for r in range(m):
        i = order[r]
        if r + PREFETCH_AHEAD < m:  # a shuffled order: ask for the row ahead
            prefetch_row(Xd, indptr, indices, data, is_csr, order[r + PREFETCH_AHEAD])
        _update_row(kind, state, d, Xd, indptr, indices, data, is_csr, i, np.float64(y[i]))


@njit(cache=True, nogil=True)
def update_range(kind, state, d, Xd, indptr, indices, data, is_csr, y, start, stop):
    """Feed rows ``start .. stop-1`` in their order (no index array needed)."""
    for i in range(start, stop):
        _update_row(kind, state, d, Xd, indptr, indices, data, is_csr, i, np.float64(y[i]))


@njit(cache=True, nogil=True)
def weights_into(kind, state, d, w):
    """Write the linear model the state stands for into ``w`` (float64, length d)."""
    if kind == PEGASOS:
        a = state[1]
        for j in range(d):
            w[j] = a * state[PEG_HEAD + j]
    elif kind == LSQSGD:
        n = state[0]
        if n == 0.0:
            a = state[1]
            for j in range(d):
                w[j] = a * state[LSQ_HEAD + j]
        else:
            beta = state[2]
            for j in range(d):
                w[j] = (state[LSQ_HEAD + d + j] + beta * state[LSQ_HEAD + j]) / n
    else:
        ridge = state[1]
        G = state[EXACT_HEAD:EXACT_HEAD + d * d].copy().reshape((d, d))
        b = state[EXACT_HEAD + d * d:EXACT_HEAD + d * d + d].copy()
        if ridge > 0.0:
            for j in range(d):
                G[j, j] += ridge
            w[:] = np.linalg.solve(G, b)
        else:
            w[:] = np.linalg.lstsq(G, b)[0]


@njit(cache=True, nogil=True)
def weights(kind, state, d):
    """The linear model the state stands for (float64, length d)."""
    w = np.zeros(d)
    weights_into(kind, state, d, w)
    return w


@njit(cache=True, nogil=True)
def decision_range(w, Xd, indptr, indices, data, is_csr, start, stop, out, out_off):
    """out[out_off + i - start] = x_i . w for rows start .. stop-1."""
    for i in range(start, stop):
        out[out_off + i - start] = row_dot(w, 0, Xd, indptr, indices, data, is_csr, i)
