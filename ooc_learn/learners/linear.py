"""Linear incremental learners whose model is one flat float64 state vector (numba kernels).

Because the model is a plain array, ``copy`` is one memcpy and TreeCV can run whole subtrees of
its recursion inside a numba kernel (``ooc_learn.cv._kernels``).
"""

from __future__ import annotations

import math

import numpy as np

from ooc_learn.storage.errors import ParameterError

from . import _kernels as K
from .base import Metric, check_metric, kernel_arrays, row_losses

__all__ = ["Pegasos", "LeastSquaresSGD", "ExactLeastSquares"]


class _FlatStateLearner:
    """Shared plumbing: the model is ``state`` (float64); kernels read ``kernel_kind``."""

    kernel_kind: int = -1
    default_metric = "squared"
    metrics: tuple = ("squared", "absolute")

    def n_features_of(self, model: np.ndarray) -> int:
        return self._d_of(model)

    def _d_of(self, model: np.ndarray) -> int:
        raise NotImplementedError

    def update(self, model: np.ndarray, X, y, order: np.ndarray | None = None) -> np.ndarray:
        """Feed the rows of ``X`` (all in order, or ``order``) into ``model`` in place."""
        d = self._d_of(model)
        Xd, indptr, indices, data, is_csr = kernel_arrays(X)
        if X.shape[1] != d:
            raise ParameterError(
                f"X has {X.shape[1]} features but the model was initialised with {d}.",
                "Use the same feature count for every block.")
        y = np.ascontiguousarray(y, dtype=np.float64)
        if order is None:
            K.update_range(self.kernel_kind, model, d, Xd, indptr, indices, data, is_csr, y,
                           0, X.shape[0])
        else:
            K.update_rows(self.kernel_kind, model, d, Xd, indptr, indices, data, is_csr, y,
                          np.ascontiguousarray(order, dtype=np.int64))
        return model

    def copy(self, model: np.ndarray) -> np.ndarray:
        return model.copy()

    def coef(self, model: np.ndarray) -> np.ndarray:
        """The weight vector w of the linear predictor f(x) = w . x."""
        return K.weights(self.kernel_kind, model, self._d_of(model))

    def predict(self, model: np.ndarray, X) -> np.ndarray:
        """Decision values f(x) = w . x."""
        w = self.coef(model)
        Xd, indptr, indices, data, is_csr = kernel_arrays(X)
        out = np.empty(X.shape[0])
        K.decision_range(w, Xd, indptr, indices, data, is_csr, 0, X.shape[0], out, 0)
        return out

    def losses(self, y, pred, metric: Metric) -> np.ndarray:
        return row_losses(y, pred, metric)

    def score(self, model: np.ndarray, X, y, metric: Metric | None = None) -> float:
        """Sum of per-row losses (``metric``, default ``default_metric``)."""
        metric = check_metric(self, metric, type(self).__name__ + ".score")
        return float(self.losses(y, self.predict(model, X), metric).sum())

    def nbytes(self, model: np.ndarray) -> int:
        return int(model.nbytes)

    def init_nbytes(self, n_features: int, n_samples: int = 1) -> int:
        """What ``init(n_features, n_samples)``'s model will take, known before it is made
        (a CV run's budget refuses a model wider than its cap instead of allocating it)."""
        return 8 * self._state_len(int(n_features))

    def _state_len(self, d: int) -> int:
        raise NotImplementedError

    def _check_init(self, n_features, n_samples):
        if int(n_features) < 1:
            raise ParameterError(
                f"The 'n_features' parameter of {type(self).__name__}.init must be >= 1. "
                f"Got {n_features!r} instead.", "The data must have at least one column.")
        if int(n_samples) < 1:
            raise ParameterError(
                f"The 'n_samples' parameter of {type(self).__name__}.init must be >= 1. "
                f"Got {n_samples!r} instead.", "Pass the size of the whole data set.")


class Pegasos(_FlatStateLearner):
    """PEGASOS, one pass, last iterate (Shalev-Shwartz et al. 2011, Fig. 1 with k = 1).

    Objective: min_w lam/2 ||w||^2 + (1/n) sum_i max(0, 1 - y_i w.x_i), y in {-1, +1}
    (TreeCV and k-fold CV on a multiclass store train one model per class:
    :class:`~.one_vs_rest.OneVsRest`).
    Step t (one row): eta = 1/(lam t); w <- (1 - eta lam) w + eta y x if y w.x < 1, then the
    optional projection onto the ball of radius 1/sqrt(lam). Stopping rule: one pass over the
    rows fed (the setting of Joulani et al. 2015, sec. 5). No bias term: append a constant
    column to learn one.

    Parameters
    ----------
    lam : float
        Regularisation lambda > 0 (the TreeCV paper uses 1e-6).
    project : bool
        Apply the optional projection step of the Pegasos paper. Off by default: at the
        TreeCV paper's lam = 1e-6 the ball of radius 1000 is far smaller than the iterates'
        natural norm, so projecting every step lets the last few rows dominate the model.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32); y = np.array([1.0, -1.0])
    >>> p = Pegasos(0.1); m = p.update(p.init(2, 2), X, y)
    >>> np.sign(p.predict(m, X)).tolist()
    [1.0, -1.0]
    """

    kernel_kind = K.PEGASOS
    binary_labels = True  # on other labels, CV runs it one-vs-rest (``one_vs_rest``)
    default_metric = "error"
    metrics = ("error", "hinge", "squared")

    def __init__(self, lam: float = 1e-6, project: bool = False):
        if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam > 0):
            raise ParameterError(
                f"The 'lam' parameter of Pegasos must be > 0. Got {lam!r} instead.",
                "The TreeCV paper uses lam=1e-6 on features scaled to unit variance.")
        self.lam = float(lam)
        self.project = bool(project)

    def init(self, n_features: int, n_samples: int = 1) -> np.ndarray:
        self._check_init(n_features, n_samples)
        state = np.zeros(self._state_len(int(n_features)))
        state[1] = 1.0
        state[3] = self.lam
        state[4] = 1.0 if self.project else 0.0
        return state

    def _state_len(self, d):
        return K.PEG_HEAD + d

    def _d_of(self, model):
        return model.shape[0] - K.PEG_HEAD

    def __repr__(self):
        return f"Pegasos(lam={self.lam!r}, project={self.project!r})"


class LeastSquaresSGD(_FlatStateLearner):
    """Least-squares SGD: robust stochastic approximation (Nemirovski et al. 2009, sec. 2.2).

    Objective: min_{||w|| <= radius} E[(w.x - y)^2] / 2. Step t: w <- Proj(w - alpha (w.x - y) x)
    with a constant step alpha; the model is the average of the iterates w_1 .. w_N (w_t taken
    before step t). Stopping rule: one pass over the rows fed. Joulani et al. 2015, sec. 5:
    radius 1 and alpha = n^-1/2 with n the size of the whole data set, targets scaled to [0, 1].

    Parameters
    ----------
    step : float, optional
        Constant step alpha; ``None`` means n^-1/2 (n passed to ``init``).
    radius : float
        Radius of the l2 ball the iterates are projected onto.
    """

    kernel_kind = K.LSQSGD

    def __init__(self, step: float | None = None, radius: float = 1.0):
        if step is not None and not (isinstance(step, (int, float)) and math.isfinite(step)
                                     and step > 0):
            raise ParameterError(
                f"The 'step' parameter of LeastSquaresSGD must be > 0 or None. "
                f"Got {step!r} instead.", "None uses the paper's step n^-1/2.")
        if not (isinstance(radius, (int, float)) and math.isfinite(radius) and radius > 0):
            raise ParameterError(
                f"The 'radius' parameter of LeastSquaresSGD must be > 0. Got {radius!r} instead.",
                "The paper constrains w to the unit ball (radius=1).")
        self.step = None if step is None else float(step)
        self.radius = float(radius)

    def init(self, n_features: int, n_samples: int) -> np.ndarray:
        self._check_init(n_features, n_samples)
        d = int(n_features)
        state = np.zeros(self._state_len(d))
        state[1] = 1.0
        state[4] = self.step if self.step is not None else 1.0 / math.sqrt(int(n_samples))
        state[5] = self.radius
        return state

    def _state_len(self, d):
        return K.LSQ_HEAD + 2 * d

    def _d_of(self, model):
        return (model.shape[0] - K.LSQ_HEAD) // 2

    def __repr__(self):
        return f"LeastSquaresSGD(step={self.step!r}, radius={self.radius!r})"


class ExactLeastSquares(_FlatStateLearner):
    """Ridge least squares from sufficient statistics (order independent, so TreeCV is exact).

    Objective: min_w sum_i (w.x_i - y_i)^2 + ridge ||w||^2, solved exactly from
    G = sum x x^T and b = sum y x: w = (G + ridge I)^-1 b (minimum-norm least squares when
    ridge = 0). No stopping rule: the solve is direct. Joulani et al. 2015, sec. 3.1: a learner
    that gives the same model whether data come in batch or incrementally has TreeCV = k-CV.
    Memory: d^2 + d floats per model. No intercept: append a constant column for one.
    """

    kernel_kind = K.EXACT_LS

    def __init__(self, ridge: float = 1e-6):
        if not (isinstance(ridge, (int, float)) and math.isfinite(ridge) and ridge >= 0):
            raise ParameterError(
                f"The 'ridge' parameter of ExactLeastSquares must be >= 0. Got {ridge!r} "
                f"instead.", "Use a small positive ridge (e.g. 1e-6) for a unique solution.")
        self.ridge = float(ridge)

    def init(self, n_features: int, n_samples: int = 1) -> np.ndarray:
        self._check_init(n_features, n_samples)
        d = int(n_features)
        state = np.zeros(self._state_len(d))
        state[1] = self.ridge
        return state

    def _state_len(self, d):
        return K.EXACT_HEAD + d * d + d

    def _d_of(self, model):
        n = model.shape[0] - K.EXACT_HEAD
        d = int((math.isqrt(4 * n + 1) - 1) // 2)
        return d

    def __repr__(self):
        return f"ExactLeastSquares(ridge={self.ridge!r})"
