"""PEGASOS: primal estimated sub-gradient solver (Shalev-Shwartz, Singer, Srebro, ICML 2007).

Objective (the SVM primal scaled by 1/(C n), lambda = 1/(C n))::

    min_w  lambda/2 |w|^2 + 1/n sum_i L(y_i w^T x_i)

Update (Algorithm "Pegasos" with k = 1, §2 of the paper) at step t, for the row i_t::

    eta_t = 1 / (lambda t)
    w <- (1 - eta_t lambda) w - eta_t L'(y w^T x) y x      (hinge: -L' = 1 if y w^T x < 1)
    w <- min(1, r / |w|) w                                  (optional projection)

with ``r = 1/sqrt(lambda)`` for the hinge (the paper's ball) and ``sqrt(2/lambda)`` for the
squared hinge (|w*|^2 <= 2 P(0) / lambda). Rows are visited in a fresh random order each
pass (sampling without replacement); the step counter t runs on across passes and blocks.
Stopping rule: a fixed number of passes (``epochs``); online methods have no cheap
optimality test. ``w = scale * v`` makes the shrink O(1) per step.

Bias: an augmented constant feature of value ``bias`` (regularized), as in the other solvers.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from ooc_learn.losses import Loss, TruncatedLoss, get_loss
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.errors import OOCError, ParameterError

from . import _kernels as K
from ._common import as_rows, check_labels, check_positive, seed_state

__all__ = ["PegasosState", "PegasosResult", "pegasos_pass", "solve_pegasos",
           "solve_pegasos_streamed"]


class PegasosState:
    """The running iterate ``w = scale * v`` and the step counter ``t`` (starts at 1)."""

    def __init__(self, n_features: int, *, C: float, n_samples: int, loss: Loss | str,
                 bias: float = 1.0, project: bool = True):
        where = "PegasosState"
        check_positive(C, "C", where, hint="C is the SVM cost; try 1.")
        check_positive(n_samples, "n_samples", where, integer=True)
        check_positive(bias, "bias", where, allow_zero=True, hint="Use 1 or 0.")
        loss = get_loss(loss)
        if isinstance(loss, TruncatedLoss):
            raise ParameterError("The 'loss' parameter of PegasosState must be convex "
                                 f"(hinge or sqhinge). Got {loss!r} instead.")
        self.squared = loss.name == "sqhinge"
        self.lam = 1.0 / (float(C) * int(n_samples))
        self.radius = (math.sqrt((2.0 if self.squared else 1.0) / self.lam) if project
                       else 0.0)
        self.bias = float(bias)
        self.v = np.zeros(int(n_features) + 1)
        self.scale = 1.0
        self.t = 1
        self.updates = 0
        self.rows_seen = 0

    @property
    def w(self) -> np.ndarray:
        """The current weights (``d`` features and the bias weight last)."""
        return self.scale * self.v


class PegasosResult(NamedTuple):
    w: np.ndarray
    steps: int             #: sub-gradient steps taken (rows visited)
    updates: int           #: steps with a non-zero loss gradient
    epochs: int
    rows_read: int


def pegasos_pass(state: PegasosState, X, y, rows=None, *, rng=None) -> int:
    """One pass over ``rows`` of in-memory ``X`` in a random order; returns the updates."""
    args = kernel_args(X)
    n = X.shape[0]
    if X.shape[1] + 1 != state.v.shape[0]:
        raise ParameterError(f"X has {X.shape[1]} features; the PEGASOS state was made for "
                             f"{state.v.shape[0] - 1}.")
    yf = check_labels(y, n, "pegasos_pass")
    index = as_rows(rows, n, "pegasos_pass")
    scale, t, upd = K.pegasos_pass(*args, state.bias, yf, index, state.v, state.scale,
                                   state.t, state.lam, state.squared, state.radius,
                                   seed_state(rng))
    if not math.isfinite(scale) or not np.all(np.isfinite(state.v)):
        raise OOCError(f"PEGASOS diverged at step {t}.",
                       "Scale the features (e.g. to [0, 1]) or keep the projection on.")
    state.scale, state.t = float(scale), int(t)
    state.updates += int(upd)
    state.rows_seen += index.shape[0]
    return int(upd)


def solve_pegasos(X, y, *, loss: Loss | str = "hinge", C: float = 1.0, bias: float = 1.0,
                  epochs: int = 1, project: bool = True, seed=0) -> PegasosResult:
    """PEGASOS on in-memory rows for ``epochs`` passes.

    >>> import numpy as np
    >>> X = np.array([[1.0], [-1.0]] * 50, dtype=np.float32); y = np.tile([1.0, -1.0], 50)
    >>> res = solve_pegasos(X, y, C=1.0, epochs=5)
    >>> bool(res.w[0] > 0)
    True
    """
    check_positive(epochs, "epochs", "solve_pegasos", integer=True, hint="Try 1 to 10.")
    n, d = X.shape
    state = PegasosState(d, C=C, n_samples=max(n, 1), loss=loss, bias=bias, project=project)
    gen = np.random.default_rng(seed)
    for _ in range(int(epochs)):
        pegasos_pass(state, X, y, rng=gen)
    return PegasosResult(state.w, state.t - 1, state.updates, int(epochs), state.rows_seen)


def solve_pegasos_streamed(read_block: Callable[[int], tuple], block_offsets,
                           n_features: int, *, loss: Loss | str = "hinge", C: float = 1.0,
                           bias: float = 1.0, epochs: int = 1, project: bool = True,
                           seed=0) -> PegasosResult:
    """PEGASOS streaming blocks (``--solver pegasos``): each pass visits the blocks in a random
    order and each block's rows in a random order; only one block is in memory at a time.

    ``read_block(b) -> (X_b, y_b, ...)``; with a store pass ``store.read_block`` and
    ``store.block_offsets``.
    """
    check_positive(epochs, "epochs", "solve_pegasos_streamed", integer=True,
                   hint="Try 1 to 10.")
    off = np.asarray(block_offsets, dtype=np.int64)
    n = int(off[-1])
    state = PegasosState(n_features, C=C, n_samples=max(n, 1), loss=loss, bias=bias,
                         project=project)
    gen = np.random.default_rng(seed)
    for _ in range(int(epochs)):
        for b in gen.permutation(off.shape[0] - 1):
            if off[b + 1] == off[b]:
                continue
            Xb, yb = read_block(int(b))[:2]
            pegasos_pass(state, Xb, yb, rng=gen)
    return PegasosResult(state.w, state.t - 1, state.updates, int(epochs), state.rows_seen)
