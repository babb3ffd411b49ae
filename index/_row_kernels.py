"""Numba kernels over rows in either layout: dot products, the metric's cos², margins.

Every kernel that reads rows takes both layouts through the same arguments: a dense float32
matrix ``X`` (n, d) and the three CSR arrays (``indptr`` int64, ``indices`` int32, ``data``
float32) with a flag ``is_csr``; the unused layout is passed as empty arrays
(:func:`~ooc_learn.storage.arrays.kernel_args`). The metric is the angle in the degree-2 embedding
V (IBCD paper §3.2, §4.1): V(â)ᵀV(b̂) = (âᵀb̂)², so d(a, b) = arccos((âᵀb̂)²), computed from
one dot product and the stored squared norms; V(x) is never formed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["dot_dense", "dots_dense", "dot_csr", "dot_rows", "cos2_rows", "margin", "margins2",
           "row_sqnorm", "copy_row", "brute_force_margins"]


@njit(cache=True, nogil=True, fastmath=True)
def dot_dense(X, a, b):
    # float32 with fastmath lets LLVM vectorise the sum (4x faster than float64 here); the
    # result only picks the nearest pivot, where rounding can at most flip a near-tie
    acc = np.float32(0.0)
    for k in range(X.shape[1]):
        acc += X[a, k] * X[b, k]
    return np.float64(acc)


@njit(cache=True, nogil=True, fastmath=True)
def dots_dense(x, P, k, acc):
    """acc[j] = xᵀP[j] for the k pivot rows (float32 sums, see dot_dense)."""
    for j in range(k):
        s = np.float32(0.0)
        for t in range(x.shape[0]):
            s += x[t] * P[j, t]
        acc[j] = s


@njit(cache=True, nogil=True)
def dot_csr(indptr, indices, data, a, b):
    """xₐᵀx_b by merging the ascending column indices of two CSR rows."""
    acc = 0.0
    i, ie = indptr[a], indptr[a + 1]
    j, je = indptr[b], indptr[b + 1]
    while i < ie and j < je:
        ci, cj = indices[i], indices[j]
        if ci == cj:
            acc += np.float64(data[i]) * np.float64(data[j])
            i += 1
            j += 1
        elif ci < cj:
            i += 1
        else:
            j += 1
    return acc


@njit(cache=True, nogil=True)
def dot_rows(X, indptr, indices, data, is_csr, a, b):
    if is_csr:
        return dot_csr(indptr, indices, data, a, b)
    return dot_dense(X, a, b)


@njit(cache=True, nogil=True)
def cos2_rows(X, indptr, indices, data, is_csr, sqnorm, a, b):
    """(âᵀb̂)² = V(â)ᵀV(b̂); 0 when either row is zero (a zero row is at angle π/2 to all)."""
    den = np.float64(sqnorm[a]) * np.float64(sqnorm[b])
    if den <= 0.0:
        return 0.0
    dot = dot_rows(X, indptr, indices, data, is_csr, a, b)
    c = dot * dot / den
    return 1.0 if c > 1.0 else c


# Reassociation lets LLVM vectorise the margins' sums (about 2x faster on 784 features; it
# needs 'nsz' too). The last bits of a margin may differ from a sequential sum's: a row within
# rounding of a threshold of eq. 10 can go either way, and IBCD's own margins (the solvers'
# kernels) decide what it does with it.
_VEC = {"reassoc", "contract", "nsz"}


@njit(cache=True, nogil=True, fastmath=_VEC)
def margin(X, indptr, indices, data, is_csr, i, w, b):
    """wᵀxᵢ + b."""
    acc = b
    if is_csr:
        for t in range(indptr[i], indptr[i + 1]):
            acc += np.float64(data[t]) * w[indices[t]]
    else:
        for j in range(X.shape[1]):
            acc += np.float64(X[i, j]) * w[j]
    return acc


@njit(cache=True, nogil=True, fastmath=_VEC)
def margins2(X, indptr, indices, data, is_csr, i, w, b, wt, bt):
    """:func:`margin` at w and at wₜ in one pass over the row."""
    acc, act = b, bt
    if is_csr:
        for t in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[t])
            acc += v * w[indices[t]]
            act += v * wt[indices[t]]
    else:
        for j in range(X.shape[1]):
            v = np.float64(X[i, j])
            acc += v * w[j]
            act += v * wt[j]
    return acc, act


# The sum of ``ooc_learn.solvers._kernels.row_sqnorms``, term for term and with its flags: the
# norms a query hands back are the bits the solvers would compute (tests/index/test_found.py)
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def row_sqnorm(X, indptr, indices, data, is_csr, i):
    """‖xᵢ‖², accumulated in float64."""
    acc = 0.0
    if is_csr:
        for p in range(indptr[i], indptr[i + 1]):
            acc += np.float64(data[p]) * data[p]
    else:
        for j in range(X.shape[1]):
            acc += np.float64(X[i, j]) * X[i, j]
    return acc


@njit(cache=True, nogil=True)
def copy_row(X, indptr, indices, data, is_csr, i, yi, r, out_X, out_ptr, out_ind, out_dat,
             out_y, out_sqn):
    """Copy row i (label ``yi``) into row r of the buffers (row r − 1 copied already, CSR),
    with its squared norm (:func:`row_sqnorm`, read from the copy: the layout the solvers'
    kernel reads)."""
    if is_csr:
        a, z = indptr[i], indptr[i + 1]
        p = out_ptr[r] - a
        for t in range(a, z):
            out_ind[p + t] = indices[t]
            out_dat[p + t] = data[t]
        out_ptr[r + 1] = out_ptr[r] + z - a
    else:
        for j in range(X.shape[1]):
            out_X[r, j] = X[i, j]
    out_y[r] = yi
    out_sqn[r] = row_sqnorm(out_X, out_ptr, out_ind, out_dat, is_csr, r)


@njit(cache=True, nogil=True)
def brute_force_margins(X, indptr, indices, data, is_csr, y, w, b):
    """y·(wᵀx + b) for every row, float64 (reference scans and benchmarks)."""
    n = y.shape[0]
    out = np.empty(n, np.float64)
    for i in range(n):
        out[i] = np.float64(y[i]) * margin(X, indptr, indices, data, is_csr, i, w, b)
    return out
