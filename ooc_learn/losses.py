"""Margin losses of linear classifiers and their truncated versions (IBCD paper, §2).

Every loss is a function of the margin ``z = y * w^T x`` (labels ``y`` in {-1, +1}). One
interface serves every solver:

* primal pieces, elementwise over margins: :meth:`Loss.value`, :meth:`Loss.grad` (dL/dz),
  :meth:`Loss.hess` (the generalized second derivative d2L/dz2), :meth:`Loss.hess_vec`
  (``hess(z) * u``); TRON assembles the primal gradient ``w + C X^T (y * grad(z))``, the
  Hessian-vector product ``u + C X^T (hess(z) * (X u))`` and the diagonal preconditioner
  ``1 + C sum_i hess(z_i) x_ij^2`` (:meth:`Loss.diag_precond`) from them;
* dual pieces of the L2-regularised problem ``min_w 1/2 |w|^2 + C sum_i L(z_i)``
  (Hsieh et al. 2008, eq. 4): the dual is ``min_a 1/2 a^T (Q + D) a - e^T a`` subject to
  ``0 <= a_i <= U``, with :meth:`Loss.dual_upper` (U = C for the hinge, inf for the squared
  hinge) and :meth:`Loss.dual_diag` (D_ii = 0 for the hinge, 1/(2C) for the squared hinge);
  :meth:`Loss.dual_from_margin` maps a primal margin to the optimal dual value ``-C L'(z)``.

The truncated loss ``R_s(z) = min(L(z), 1 + s)`` (IBCD paper eq. 2) caps the loss of
outliers, the rows with ``z < L^-1(1 + s)``: ``z < -s`` for the hinge, ``z < 1 - sqrt(1 + s)``
for the squared hinge; the index's query keeps rows by the same threshold. It is not convex;
:mod:`ooc_learn.solvers.relax` minimises it by the relaxation of eq. (5), which only ever
needs the convex base loss on the non-outliers.

>>> import numpy as np
>>> from ooc_learn.losses import get_loss
>>> get_loss("hinge").value(np.array([-1.0, 0.5, 2.0]))
array([2. , 0.5, 0. ])
>>> get_loss("sqhinge", s=1.0).value(np.array([-3.0, 0.0]))
array([2., 1.])
"""

from __future__ import annotations

import math

import numpy as np

from ooc_learn.storage.errors import ParameterError

__all__ = ["Loss", "Hinge", "SquaredHinge", "TruncatedLoss", "get_loss", "outlier_margin",
           "LOSS_NAMES"]

LOSS_NAMES = ("hinge", "sqhinge")
_ALIASES = {"hinge": "hinge", "l1": "hinge", "sqhinge": "sqhinge", "squared_hinge": "sqhinge",
            "l2": "sqhinge"}


class Loss:
    """A convex margin loss ``L(z)``, non-increasing in ``z``, zero for ``z >= 1``."""

    name = "loss"
    #: True when the primal has a (generalized) Hessian TRON can use
    smooth = False

    def value(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def grad(self, z: np.ndarray) -> np.ndarray:
        """dL/dz (a subgradient where L has a kink)."""
        raise NotImplementedError

    def hess(self, z: np.ndarray) -> np.ndarray:
        """Generalized second derivative d2L/dz2 (0 almost everywhere for the hinge)."""
        raise NotImplementedError

    def hess_vec(self, z: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Elementwise ``hess(z) * u``: the loss part of a Hessian-vector product."""
        return self.hess(z) * np.asarray(u, dtype=np.float64)

    def diag_precond(self, z: np.ndarray, sq: np.ndarray) -> np.ndarray:
        """Per-row weight ``hess(z_i) * sq_i`` summed into the Jacobi preconditioner.

        ``sq`` holds squared feature values; callers scatter the result onto columns.
        """
        return self.hess(z) * np.asarray(sq, dtype=np.float64)

    # -- dual quantities of min 1/2|w|^2 + C sum L -----------------------------------------
    def dual_upper(self, C: float) -> float:
        """Upper bound U of every dual variable."""
        raise NotImplementedError

    def dual_diag(self, C: float) -> float:
        """Diagonal D_ii added to Q in the dual."""
        raise NotImplementedError

    def dual_from_margin(self, z: np.ndarray, C: float) -> np.ndarray:
        """Optimal dual value ``-C L'(z)`` of a row with margin ``z`` (KKT conditions)."""
        return -C * self.grad(z)

    # -- truncation ---------------------------------------------------------------------------
    def cap(self, s: float) -> float:
        """``1 + s``: the loss a truncated row is charged (the paper's ``R_s(z) = min(L(z),
        1 + s)``; for the hinge this is ``L(-s)``)."""
        return 1.0 + float(s)

    def outlier_margin(self, s: float) -> float:
        """``L^-1(1 + s)``: the smallest margin ``y w^T x`` that is not an outlier of the
        truncation at ``s`` (below it the loss is capped)."""
        raise NotImplementedError

    def base(self) -> "Loss":
        """The convex loss under a truncation (itself for a convex loss)."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Hinge(Loss):
    """L1 loss ``max(0, 1 - z)``."""

    name = "hinge"

    def value(self, z):
        return np.maximum(0.0, 1.0 - np.asarray(z, dtype=np.float64))

    def grad(self, z):
        return np.where(np.asarray(z, dtype=np.float64) < 1.0, -1.0, 0.0)

    def hess(self, z):
        return np.zeros(np.shape(z), dtype=np.float64)

    def dual_upper(self, C):
        return float(C)

    def dual_diag(self, C):
        return 0.0

    def dual_from_margin(self, z, C):
        # the hinge's dual at z == 1 is anywhere in [0, C]; 0 keeps the model dual-sparse
        z = np.asarray(z, dtype=np.float64)
        return np.where(z < 1.0, float(C), 0.0)

    def outlier_margin(self, s):
        return -float(s)  # 1 - z = 1 + s


class SquaredHinge(Loss):
    """L2 loss ``max(0, 1 - z)^2``; its generalized Hessian is ``2 [z < 1]``."""

    name = "sqhinge"
    smooth = True

    def value(self, z):
        return np.maximum(0.0, 1.0 - np.asarray(z, dtype=np.float64)) ** 2

    def grad(self, z):
        return -2.0 * np.maximum(0.0, 1.0 - np.asarray(z, dtype=np.float64))

    def hess(self, z):
        return np.where(np.asarray(z, dtype=np.float64) < 1.0, 2.0, 0.0)

    def dual_upper(self, C):
        return float("inf")

    def dual_diag(self, C):
        return 0.5 / float(C)

    def outlier_margin(self, s):
        return 1.0 - math.sqrt(1.0 + float(s))  # (1 - z)^2 = 1 + s


class TruncatedLoss(Loss):
    """``R_s(z) = min(L(z), 1 + s)`` (IBCD paper, eq. 2): the base loss, capped for the
    outliers ``z < L^-1(1 + s)`` (``-s`` for the hinge, ``1 - sqrt(1 + s)`` for the squared
    hinge; the index's query uses the same threshold).

    Outliers get zero gradient, zero curvature and a zero dual variable, which is what makes
    the truncated problem dual-sparse (IBCD paper §2).
    """

    def __init__(self, base: Loss, s: float):
        s = float(s)
        if not np.isfinite(s) or s < 0:
            raise ParameterError(
                f"The 's' parameter of TruncatedLoss must be >= 0 and finite. Got {s!r} instead.",
                "Use s = 1 (the paper's default) or drop truncation.")
        self._base = base
        self.s = s
        self.name = f"truncated_{base.name}"
        self.smooth = base.smooth

    def base(self) -> Loss:
        return self._base

    def inlier(self, z) -> np.ndarray:
        """Rows charged their real loss: ``z >= L^-1(1 + s)`` (IN(w) of the paper)."""
        return np.asarray(z, dtype=np.float64) >= self._base.outlier_margin(self.s)

    def value(self, z):
        return np.minimum(self._base.value(z), self._base.cap(self.s))

    def grad(self, z):
        return np.where(self.inlier(z), self._base.grad(z), 0.0)

    def hess(self, z):
        return np.where(self.inlier(z), self._base.hess(z), 0.0)

    def dual_upper(self, C):
        return self._base.dual_upper(C)

    def dual_diag(self, C):
        return self._base.dual_diag(C)

    def dual_from_margin(self, z, C):
        return np.where(self.inlier(z), self._base.dual_from_margin(z, C), 0.0)

    def cap(self, s=None):
        return self._base.cap(self.s if s is None else s)

    def outlier_margin(self, s=None):
        return self._base.outlier_margin(self.s if s is None else s)

    def __repr__(self) -> str:
        return f"TruncatedLoss({self._base!r}, s={self.s})"


def get_loss(name: str | Loss, s: float | None = None) -> Loss:
    """The loss called ``name`` ("hinge" or "sqhinge"), truncated at ``s`` unless ``s`` is None.

    >>> get_loss("hinge", s=1.0)
    TruncatedLoss(Hinge(), s=1.0)
    """
    if isinstance(name, Loss):
        loss = name
    else:
        key = _ALIASES.get(str(name).lower())
        if key is None:
            raise ParameterError(
                f"The 'loss' parameter must be one of {', '.join(LOSS_NAMES)}. "
                f"Got {name!r} instead.", "Use 'hinge' (L1-loss SVM) or 'sqhinge' (L2-loss).")
        loss = Hinge() if key == "hinge" else SquaredHinge()
    if s is None:
        return loss
    if isinstance(loss, TruncatedLoss):
        loss = loss.base()
    return TruncatedLoss(loss, s)


def outlier_margin(loss: str, s) -> float:
    """L⁻¹(1+s): the smallest y·wₜᵀx that is not an outlier of the truncated loss (the
    threshold of the index's query, eq. 10).

    Hinge L(z) = max(0, 1−z) gives −s; squared hinge L(z) = max(0, 1−z)² gives 1 − √(1+s);
    ``s=None`` (no truncation) gives −inf.

    >>> outlier_margin("hinge", 1.0), outlier_margin("sqhinge", 3.0)
    (-1.0, -1.0)
    """
    if s is None or (isinstance(s, float) and math.isinf(s)):
        return -math.inf
    if loss not in ("hinge", "sqhinge", "squared_hinge"):
        raise ParameterError(f"The 'loss' parameter of query must be 'hinge' or 'sqhinge'. "
                             f"Got {loss!r} instead.", "Pick the loss the solver truncates.")
    return get_loss(loss).outlier_margin(s)
