"""The checks of sparse RLS's parameters shared by the model and its cross-validation: a
lambda, a list of lambdas, a basis mode and a set of held-out rows, each refused with a
:class:`~ooc_learn.storage.errors.ParameterError` naming its owner.
"""

from __future__ import annotations

import numpy as np

from ooc_learn.storage.errors import ParameterError

__all__ = ["BASIS_MODES_HOLDOUT", "BASIS_MODES_LOO", "check_lambda", "check_lambdas",
           "check_basis_mode", "check_rows"]


# the ways of treating held-out basis rows (Section 6.4; see :mod:`.crossval`)
BASIS_MODES_HOLDOUT = ("remove", "keep", "keep_no_loss")
BASIS_MODES_LOO = ("remove", "keep", "keep_no_loss", "skip")


def check_lambda(lam, owner: str) -> float:
    """A finite lambda > 0, or ParameterError."""
    try:
        val = float(lam)
    except (TypeError, ValueError):
        val = float("nan")
    if not (np.isfinite(val) and val > 0):
        raise ParameterError(f"The 'lam' parameter of {owner} must be > 0. Got {lam!r} instead.",
                             "Use a positive regularisation strength such as 1.0.")
    return val


def check_lambdas(lams, owner: str) -> np.ndarray:
    """A non-empty 1-d float array of lambdas > 0, or ParameterError naming ``owner``."""
    arr = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ParameterError(f"The 'lams' parameter of {owner} must be a non-empty 1-d list.")
    bad = ~(np.isfinite(arr) & (arr > 0))
    if bad.any():
        raise ParameterError(f"The 'lams' parameter of {owner} must hold values > 0. "
                             f"Got {arr[bad][0]!r} instead.", "Use e.g. np.logspace(-6, 3, 20).")
    return arr


def check_basis_mode(mode: str, allowed, owner: str) -> None:
    """Refuse a basis mode not in ``allowed``."""
    if mode not in allowed:
        raise ParameterError(f"The 'basis_mode' parameter of {owner} must be one of {allowed}. "
                             f"Got {mode!r} instead.")


def check_rows(H, m: int, owner: str) -> np.ndarray:
    """The held-out rows ``H`` (positions or a boolean mask of the m rows) as int64
    positions, refused when empty, out of range, repeated or covering every row."""
    H = np.asarray(H)
    if H.dtype == bool:
        if H.shape != (m,):
            raise ParameterError(f"A boolean hold-out mask for {owner} must have length {m}.")
        H = np.flatnonzero(H)
    H = np.atleast_1d(H)
    if H.ndim != 1 or H.size == 0 or not np.issubdtype(H.dtype, np.integer):
        raise ParameterError(f"The 'H' parameter of {owner} must be a non-empty 1-d array of "
                             f"row positions or a boolean mask. Got {H!r} instead.")
    if H.min() < 0 or H.max() >= m:
        raise ParameterError(f"The 'H' parameter of {owner} must hold row positions in "
                             f"[0, {m}). Got {int(H.min())}..{int(H.max())} instead.")
    if np.unique(H).size != H.size:
        raise ParameterError(f"The 'H' parameter of {owner} must not repeat a row.")
    if H.size >= m:
        raise ParameterError(f"The hold-out set of {owner} covers all {m} training rows, so "
                             f"nothing is left to train on.", "Hold out fewer rows.")
    return H.astype(np.int64)
