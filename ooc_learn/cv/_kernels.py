"""TreeCV below one block: Algorithm 1 of Joulani et al. (2015) as an in-memory numba loop.

The recursion is unrolled onto an explicit stack. Frame ``lvl`` holds the hold-out range
(s, e) and the model f_{s..e} in ``states[lvl]``. Stage 0: copy it to ``states[lvl+1]``, train the
copy on chunks m+1..e and push (s, m). Stage 1 (after the left subtree): train ``states[lvl]``
itself on chunks s..m and turn the frame into (m+1, e) -- a tail call, so the right branch needs
no copy and the stack never holds more than ceil(log2 k) + 1 models.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ooc_learn.learners._kernels import (LSQ_HEAD, LSQSGD, PEG_HEAD, PEGASOS, decision_range,
                                         row_dot, update_range, update_rows, weights_into)


@njit(cache=True, nogil=True)
def _decision_one(kind, state, d, Xd, indptr, indices, data, is_csr, i):
    # x_i . w straight from the state, without writing w (a LOO leaf scores one row)
    if kind == PEGASOS:
        return state[1] * row_dot(state, PEG_HEAD, Xd, indptr, indices, data, is_csr, i)
    # LSQSGD with N > 0: w = (P + beta v) / N
    return (row_dot(state, LSQ_HEAD + d, Xd, indptr, indices, data, is_csr, i)
            + state[2] * row_dot(state, LSQ_HEAD, Xd, indptr, indices, data, is_csr, i)
            ) / state[0]


@njit(cache=True, nogil=True)
def _train(kind, state, d, Xd, indptr, indices, data, is_csr, y, start, stop, randomized, buf):
    if randomized:
        m = stop - start
        for r in range(m):
            buf[r] = start + r
        sub = buf[:m]
        np.random.shuffle(sub)
        update_rows(kind, state, d, Xd, indptr, indices, data, is_csr, y, sub)
    else:
        update_range(kind, state, d, Xd, indptr, indices, data, is_csr, y, start, stop)


@njit(cache=True, nogil=True)
def tree_block(kind, d, states, Xd, indptr, indices, data, is_csr, y, bounds, randomized, seed,
               out):
    """Run TreeCV on folds ``bounds`` (row offsets into X, y) from the model ``states[0]``.

    ``states[0]`` must hold f trained on every row outside ``bounds[0]:bounds[-1]``; it is
    overwritten. ``out`` receives, for each row, the decision value of the model that held
    its fold out. Returns ``(updates, max_models)``: rows fed and peak live model count.
    """
    nf = bounds.shape[0] - 1
    depth = states.shape[0]
    S = np.empty(depth, dtype=np.int64)
    E = np.empty(depth, dtype=np.int64)
    ST = np.zeros(depth, dtype=np.int64)
    buf = np.empty(bounds[nf] - bounds[0], dtype=np.int64)
    w = np.empty(d)
    if randomized:
        np.random.seed(seed)
    S[0] = 0
    E[0] = nf - 1
    top = 0
    updates = 0
    max_models = 1
    while top >= 0:
        s = S[top]
        e = E[top]
        if s == e:
            if bounds[s + 1] - bounds[s] == 1 and (
                    kind == PEGASOS or (kind == LSQSGD and states[top, 0] > 0.0)):
                out[bounds[s] - bounds[0]] = _decision_one(kind, states[top], d, Xd, indptr,
                                                           indices, data, is_csr, bounds[s])
            else:
                weights_into(kind, states[top], d, w)
                decision_range(w, Xd, indptr, indices, data, is_csr, bounds[s], bounds[s + 1],
                               out, bounds[s] - bounds[0])
            top -= 1
            continue
        m = (s + e) // 2
        if ST[top] == 0:
            states[top + 1, :] = states[top, :]
            _train(kind, states[top + 1], d, Xd, indptr, indices, data, is_csr, y,
                   bounds[m + 1], bounds[e + 1], randomized, buf)
            updates += bounds[e + 1] - bounds[m + 1]
            ST[top] = 1
            top += 1
            S[top] = s
            E[top] = m
            ST[top] = 0
            if top + 1 > max_models:
                max_models = top + 1
        else:
            _train(kind, states[top], d, Xd, indptr, indices, data, is_csr, y,
                   bounds[s], bounds[m + 1], randomized, buf)
            updates += bounds[m + 1] - bounds[s]
            S[top] = m + 1
            ST[top] = 0
    return updates, max_models


def stack_depth(n_folds: int) -> int:
    """Rows of ``states`` that :func:`tree_block` needs for ``n_folds`` folds."""
    return int(np.ceil(np.log2(max(n_folds, 1)))) + 1 if n_folds > 1 else 1
