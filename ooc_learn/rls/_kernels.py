"""Numba kernels for sparse RLS: fused element-wise kernel transforms of a Gram block.

Pure functions over arrays and scalars; the cross products come from BLAS in the caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def rbf_inplace(G, sqA, sqB, gamma):
    """Turn ``G = A @ B.T`` into ``exp(-gamma * max(|a|^2 + |b|^2 - 2 G, 0))`` in place."""
    n, m = G.shape
    for i in range(n):
        a = sqA[i]
        for j in range(m):
            d = a + sqB[j] - 2.0 * G[i, j]
            if d < 0.0:
                d = 0.0
            G[i, j] = np.exp(-gamma * d)


@njit(cache=True, nogil=True)
def poly_inplace(G, gamma, coef0, degree):
    """Turn ``G = A @ B.T`` into ``(gamma * G + coef0) ** degree`` in place."""
    n, m = G.shape
    for i in range(n):
        for j in range(m):
            G[i, j] = (gamma * G[i, j] + coef0) ** degree


@njit(cache=True, nogil=True)
def add_shift(K, rows, cols, delta):
    """``K[rows[t], cols[t]] += delta`` for each pair (the diagonal shift of K on basis rows)."""
    for t in range(rows.shape[0]):
        K[rows[t], cols[t]] += delta
