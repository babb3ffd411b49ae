"""Shared plumbing of the linear solvers: parameter checks and kernel argument packing."""

from __future__ import annotations

import math

import numpy as np

from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import ParameterError



def check_positive(value, name: str, where: str, *, allow_zero: bool = False,
                   integer: bool = False, hint: str = "") -> float:
    """Raise the project's ParameterError unless ``value`` is a finite number > 0 (or >= 0)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
        if integer and ok:
            ok = float(value) == int(value)
    if not ok:
        rel = ">= 0" if allow_zero else "> 0"
        kind = "an integer " if integer else ""
        raise ParameterError(
            f"The '{name}' parameter of {where} must be {kind}{rel}. Got {value!r} instead.",
            hint)
    return int(value) if integer else float(value)


def check_labels(y, n: int, where: str) -> np.ndarray:
    """Labels as float64 in {-1, +1}; anything else is a ParameterError."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise ParameterError(f"y of {where} must be 1-d with one label per row of X "
                             f"({n}). Got shape {y.shape} instead.")
    yf = y.astype(np.float64)
    if n and not np.all((yf == 1.0) | (yf == -1.0)):
        bad = np.unique(yf[(yf != 1.0) & (yf != -1.0)])[:5]
        raise ParameterError(
            f"y of {where} must hold labels -1 and +1. Got {bad.tolist()} among them.",
            "Map two classes to -1/+1 first (LinearModel.encode_labels does it).")
    return yf


def as_rows(rows, n: int, where: str) -> np.ndarray:
    """Row positions as an int64 array (all rows when ``rows`` is None), range-checked."""
    if rows is None:
        return np.arange(n, dtype=np.int64)
    r = np.asarray(rows)
    if r.dtype == bool:
        if r.shape != (n,):
            raise ParameterError(f"A boolean 'rows' mask of {where} needs {n} entries. "
                                 f"Got {r.shape} instead.")
        return np.flatnonzero(r).astype(np.int64)
    r = np.ascontiguousarray(r, dtype=np.int64).ravel()
    if r.size and (r.min() < 0 or r.max() >= n):
        raise ParameterError(f"The 'rows' of {where} must lie in [0, {n}). "
                             f"Got values in [{r.min()}, {r.max()}] instead.")
    return r.copy()


def seed_state(rng) -> np.ndarray:
    """A splitmix64 state for the kernels drawn from a seed or a ``np.random.Generator``."""
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return np.array([gen.integers(0, 2**63, dtype=np.int64)], dtype=np.uint64)


def margins(X, y, w, bias) -> np.ndarray:
    """y_i [x_i, bias]^T w in float64, without the float64 copy of X that X @ w would make."""
    from . import _kernels as K

    Xd, ip, ix, dt, sparse = kernel_args(X)
    out = np.empty(X.shape[0])
    K.rows_dot(Xd, ip, ix, dt, sparse, float(bias), np.arange(X.shape[0], dtype=np.int64),
               np.ascontiguousarray(w, dtype=np.float64), out)
    return y * out


def rows_in_order(parts, size: int):
    """``(X, y)`` of ``size`` rows assembled from parts ``(positions, X, y)``: dense rows are
    written once into place, CSR parts stacked and then permuted."""
    from ooc_learn.storage.arrays import stack_rows

    y = np.empty(size, parts[0][2].dtype)
    for p, _, yp in parts:
        y[p] = yp
    if isinstance(parts[0][1], np.ndarray):
        X = np.empty((size,) + parts[0][1].shape[1:], parts[0][1].dtype)
        for p, Xp, _ in parts:
            X[p] = Xp
        return X, y
    pos = np.concatenate([p[0] for p in parts])
    inv = np.empty_like(pos)
    inv[pos] = np.arange(pos.size)
    return stack_rows([p[1] for p in parts])[inv], y
