"""L2-regularized least squares on a store, exactly, from one pass: the normal equations.

The objective is SVR's with the squared loss at epsilon = 0 (:mod:`ooc_learn.solvers.svr`)::

    min_w  1/2 |w|^2 + C sum_i (y_i - w^T [x_i, bias])^2

whose minimizer solves ``(Xa^T Xa + I / (2 C)) w = Xa^T y`` (``Xa`` the rows with the bias
column; the bias weight is regularized like the others, as LIBLINEAR's ``-B`` and our dual
solvers do): scikit-learn's ``Ridge(alpha=1/(2C))`` on the augmented rows. One sequential pass
accumulates ``Xa^T Xa`` ((d+1)^2 float64) and ``Xa^T y``; a Cholesky solve gives w. Where the
Gram matrix fits the cap this beats any iterative solver (one read, exact whatever the
conditioning, where dual CD on badly scaled features needs passes without end); where it
does not, the dual CD SVR solver takes over.

For cross-validation the pass keeps one Gram matrix per fold: fold f's model solves with
the total minus fold f's part, so k folds and any number of C values cost one read.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from ooc_learn.storage.errors import OOCError

__all__ = ["gram_bytes", "fold_grams", "solve_normal_equations"]

# rows converted to float64 at a time (dense): a chunk of 4096 rows of 784 features is 25 MB
CHUNK_ROWS = 4096


def gram_bytes(d: int, parts: int = 1) -> int:
    """Memory of ``parts`` Gram matrices and right-hand sides of d features (+ bias), plus the
    matrix the solve factors."""
    m = int(d) + 1
    return 8 * (parts + 1) * (m * m + m)


def fold_grams(store, folds, k: int, *, bias: float = 1.0):
    """``(G, b)``: ``G[f] = Xa_f^T Xa_f``, ``b[f] = Xa_f^T y_f`` over the rows of each fold
    (``folds``: the fold of each store row, -1 for none), in one pass over the store. ``G`` is
    (k, d+1, d+1), ``b`` (k, d+1); the caller reserves :func:`gram_bytes`."""
    folds = np.asarray(folds)
    d = store.n_features
    G = np.zeros((k, d + 1, d + 1))
    b = np.zeros((k, d + 1))
    off = np.asarray(store.block_offsets, dtype=np.int64)
    step = max(1, CHUNK_ROWS if store.layout == "dense" else 8 * CHUNK_ROWS)
    for blk in range(store.n_blocks):
        lo, hi = int(off[blk]), int(off[blk + 1])
        fb = folds[lo:hi]
        if hi == lo or not (fb >= 0).any():
            continue
        X, y = store.read_block(blk)[:2]
        for f in np.unique(fb[fb >= 0]):
            rows = np.flatnonzero(fb == f)
            for c in range(0, rows.size, step):
                r = rows[c:c + step]
                Xc = X[r]
                yc = np.asarray(y, dtype=np.float64)[r]
                if sp.issparse(Xc):
                    G[f, :d, :d] += (Xc.T @ Xc).toarray()
                    col = np.asarray(Xc.sum(axis=0), dtype=np.float64).ravel()
                else:
                    Xc = np.asarray(Xc, dtype=np.float64)
                    G[f, :d, :d] += Xc.T @ Xc
                    col = Xc.sum(axis=0)
                b[f, :d] += Xc.T @ yc
                G[f, :d, d] += bias * col
                G[f, d, :d] += bias * col
                G[f, d, d] += bias * bias * r.size
                b[f, d] += bias * yc.sum()
        # let the block go before the next is read: the cache evicted it to make that one's
        # room, and a block still held beside the next shows in the RSS as a lesson
        del X, y
    return G, b


def solve_normal_equations(G, b, C: float) -> np.ndarray:
    """w (d + 1) minimizing ``1/2 |w|^2 + C |y - Xa w|^2`` from ``G = Xa^T Xa``,
    ``b = Xa^T y``: ``(G + I / (2C)) w = b`` by Cholesky."""
    A = np.array(G, dtype=np.float64)
    A[np.diag_indices_from(A)] += 0.5 / C
    try:
        return scipy.linalg.solve(A, b, assume_a="pos", check_finite=True)
    except (np.linalg.LinAlgError, ValueError) as exc:
        raise OOCError(f"The normal equations could not be solved ({exc}).",
                       "Check the data for NaN or infinite values, or lower C.") from None
