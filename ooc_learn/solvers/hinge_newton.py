"""The hinge SVM on rows in memory by Newton's method on a smoothed hinge, then dual CD.

Problem (13) of the IBCD paper on a set S of rows whose other rows' alpha are fixed (their
part of w is ``v``)::

    primal  min_u  1/2 |u|^2 - v^T u + C sum_{i in S} max(0, 1 - z_i^T u),   z_i = y_i [x_i, bias]
    dual    max_a  sum a - 1/2 |v + Z^T a|^2,   0 <= a_i <= C

Dual CD (Hsieh et al. 2008) moves one alpha at a time by at most (1 - z_i^T w) / |z_i|^2.
Where S holds tens of thousands of correlated rows near the margin in a few hundred
dimensions (IBCD's S on image data) it needs thousands of passes: most rows end at a bound
but get there in steps of 1 / |z_i|^2 of C, and at an optimum at most d + 1 of them are
strictly inside (0, C). The primal has only d + 1 unknowns.

Method (Chapelle 2007, "Training a support vector machine in the primal", §4: the hinge
replaced by a Huber-like loss of width h, solved by Newton's method): the smoothed loss is

    L_h(m) = 0 (m >= 1 + h),  (1 + h - m)^2 / (4 h) (|1 - m| < h),  1 - m (m <= 1 - h),

whose generalized Hessian is ``I + C / (2 h) Z_B^T Z_B`` over the band ``B = {|1 - m| < h}``
(constant in m, so H follows the band's changes by rank-one updates; Cholesky in d + 1).
Each step takes the exact minimiser along the Newton direction (phi is piecewise quadratic).
At a stationary point ``u = v + Z^T a`` with ``a_i = C c_i``, ``c_i = -L_h'(m_i)`` in [0, 1]:
a feasible dual point whose gap is at most ``C h |B| / 8``. That ``a`` (and ``w = v + Z^T a``
recomputed from it) is handed to dual CD, which polishes it to LIBLINEAR's projected-gradient
rule in a few passes: few rows are left free, and shrinking sets the others aside.

Stopping rule of the Newton phase: the Newton decrement ``g^T H^-1 g <= tol * C * |S|``, a full
step that leaves the band and the rows below it unchanged (the piece's exact minimiser), a
step shorter than 1e-9, or ``max_newton`` steps.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.linalg as sla
from scipy.linalg.blas import dsyrk as _syrk

from ooc_learn.storage.arrays import kernel_args

from . import _kernels as K
from ._common import margins

__all__ = ["MAX_FEATURES", "MIN_ROWS_PER_FEATURE", "NewtonStats", "applies", "load_kernels",
           "newton_hinge", "newton_hinge_bytes", "newton_hinge_windows"]

# the smoothing width, in units of the margin 1 (warm from IBCD's w, 17-67 steps on the
# issue-23 store's S; 0.03-0.3 took fewer but left dual CD a point it did not finish in
# 1,000 passes, and continuation from wider widths took longer; bench-log 2026-11-27,
# session 36)
DEFAULT_H = 0.01
# band rows gathered at a time into float64 for the Hessian (and, spilled, read back)
_CHUNK = 256
# what the BLAS's packing buffers touch on its first call (dsyrk, Cholesky: 6-7 MiB at
# d = 784), with room to spare: a run at the cap went 1 MiB over it without
_BLAS_BUFFERS = 16 << 20
# H is rebuilt from the band instead of updated when more rows change than this share of it,
# where the updates would pass over more rows than the rebuild (and every _REBUILD steps: the
# updates' rounding accumulates). At 0.5, 257 of an exact-stop run's 424 steps rebuilt H
# (bench-log 2026-11-28, session 41)
_UPDATE_SHARE = 1.0
# ... and, for rows read back from a spilled S, rebuilt by a traversal of S's file where more
# than this share of S's rows changed weight (one sequential pass then reads less than taking
# those rows back one window read at a time)
_TRAVERSE_SHARE = 0.5
_REBUILD = 16
# the widest data the Newton phase takes, in features (its H is (d + 1)^2 float64: 128 MiB
# at 4,096, a dense embedding's common width; there IBCD on 75k rows of Fashion-MNIST
# features certified in 217-269 s, where dual CD alone stopped approximate in 147 s,
# bench-log 2026-11-28)
MAX_FEATURES = 4096
# the fewest rows per unknown for which the Newton phase runs (see applies)
MIN_ROWS_PER_FEATURE = 8


class NewtonStats(NamedTuple):
    """What the Newton phase did."""

    iterations: int        #: Newton steps taken
    band: int              #: rows in the band at the end
    converged: bool        #: stopped by the decrement or the exact-piece rule
    changed: int           #: alphas that changed from the ones passed in


def newton_hinge_bytes(n: int, d: int, read_row_bytes: int = 0) -> int:
    """The working memory of :func:`newton_hinge` for ``n`` rows of ``d`` features: H, its
    factor and a rebuild's fresh H, a chunk of band rows (twice: BLAS packs it), sixteen
    float64 arrays of n (margins, their step, the weights before and after, index lists and
    temporaries), and the BLAS's buffers on its first call. Measured from outside the
    solve (a poller of VmRSS): 26 MiB at 61,815 rows of 784 features, against 40 MiB here.
    :func:`newton_hinge_windows` also holds a chunk of rows read back, of
    ``read_row_bytes`` each (its windows are the caller's to pay for)."""
    return (3 * 8 * (d + 1) ** 2 + 2 * 8 * _CHUNK * (d + 1) + 16 * 8 * n
            + _CHUNK * read_row_bytes + _BLAS_BUFFERS)


def newton_hinge(X, y, alpha, w, *, C: float, bias: float, h: float = DEFAULT_H,
                 max_newton: int = 100, tol: float = 1e-8) -> NewtonStats:
    """Solve the smoothed problem on the rows of ``X`` from ``(alpha, w)`` and write its dual
    point in place: ``alpha`` becomes ``C c(m)`` and ``w`` moves by ``Z^T (alpha_new -
    alpha_old)`` (so ``w - Z^T alpha``, the fixed rows' part v, is kept).

    Parameters
    ----------
    X : dense float32 array or CSR matrix, (n, d)
    y : labels in {-1, +1}, float64 (n,)
    alpha : float64 (n,), in [0, C], written in place
    w : float64 (d + 1,), equal to v + Z^T alpha, written in place
    C, bias : the SVM's C and the bias feature's value
    h : the smoothing width (a fraction of the margin)
    max_newton : Newton steps at most
    tol : the decrement's stop, relative to C |S|

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5)).astype(np.float32)
    >>> y = np.sign(X[:, 0] + 0.3 * rng.normal(size=200))
    >>> alpha, w = np.zeros(200), np.zeros(6)
    >>> newton_hinge(X, y, alpha, w, C=1.0, bias=1.0).converged
    True
    """
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite values: see the end
        return _newton_hinge(X, y, alpha, w, C=C, bias=bias, h=h, max_newton=max_newton,
                             tol=tol)


def _newton_hinge(X, y, alpha, w, *, C: float, bias: float, h: float, max_newton: int,
                  tol: float) -> NewtonStats:
    Xd, ip, ix, dt, sparse = kernel_args(X)
    n = y.shape[0]
    d1 = w.shape[0]
    bias = float(bias)
    rows = np.arange(n, dtype=np.int64)
    yz = np.ascontiguousarray(y, dtype=np.float64)
    # q = u - v = Z^T alpha: the S part of w (v, the fixed rows' part, never moves)
    q = np.zeros(d1)
    K.rows_tdot(Xd, ip, ix, dt, sparse, bias, rows, alpha * yz, q)
    u = np.array(w, dtype=np.float64)
    m = margins(X, yz, u, bias)
    dm = np.empty(n)
    scale = C / (2.0 * h)
    H = _Hessian(Xd, ip, ix, dt, sparse, bias, d1, scale)
    c = _weights(m, h)
    zc = np.zeros(d1)  # Z^T c, followed by the rows whose c changes
    K.rows_tdot(Xd, ip, ix, dt, sparse, bias, rows, c * yz, zc)
    it, converged = 0, False
    while it < max_newton:
        band = np.flatnonzero((c > 0.0) & (c < 1.0))
        H.follow(band)
        g = q - C * zc
        s = H.solve(g)
        if s is None:  # H lost its definiteness to rounding: the dual point at this u
            break
        dec = float(g @ s)
        it += 1
        if not math.isfinite(dec) or dec <= tol * C * max(n, 1):
            converged = math.isfinite(dec)
            break
        K.rows_dot(Xd, ip, ix, dt, sparse, bias, rows, s, dm)
        dm *= yz
        t, c_new, same_pieces = _step(m, dm, s, u, q, c, h, C)
        if H.rebuilt:  # the sum is refreshed with H: the updates' rounding accumulates
            zc[:] = 0.0
            K.rows_tdot(Xd, ip, ix, dt, sparse, bias, rows, c_new * yz, zc)
        else:
            moved = np.flatnonzero(c_new != c)
            K.rows_tdot(Xd, ip, ix, dt, sparse, bias, moved, (c_new - c)[moved] * yz[moved], zc)
        c = c_new
        if t == 1.0 and same_pieces:
            converged = True  # the step minimised the quadratic piece it stayed on
            break
        if t < 1e-9:
            break
    # the dual point at the last u (margins recomputed: the updates drift)
    m = margins(X, yz, u, bias)
    new_alpha = C * _weights(m, h)
    delta = new_alpha - alpha
    moved = np.flatnonzero(delta)
    dw = np.zeros(d1)
    K.rows_tdot(Xd, ip, ix, dt, sparse, bias, moved, delta[moved] * yz[moved], dw)
    return _write_dual(new_alpha, dw, alpha, w, C, it, converged)


def _write_dual(new_alpha, dw, alpha, w, C, it, converged) -> NewtonStats:
    """alpha becomes the smoothed solve's dual point and w moves by ``dw`` = Z^T (its
    change); where they overflowed, both stay as they came (dual CD takes over, and says
    so)."""
    if not (np.isfinite(new_alpha).all() and np.isfinite(dw).all()):
        return NewtonStats(it, 0, False, 0)
    changed = int(np.count_nonzero(new_alpha != alpha))
    w += dw
    alpha[:] = new_alpha
    band_now = int(((new_alpha > 0.0) & (new_alpha < C)).sum())
    return NewtonStats(it, band_now, converged, changed)


def newton_hinge_windows(windows, take, y, alpha, w, *, C: float, bias: float,
                         h: float = DEFAULT_H, max_newton: int = 100,
                         tol: float = 1e-8) -> NewtonStats:
    """:func:`newton_hinge` on rows that are read, not held (IBCD's S spilled to disk):
    ``windows()`` yields ``(a, b, X)`` covering the rows in order, ``take(pos)`` returns the
    rows at positions ``pos`` (float32 or CSR). Each Newton step is one traversal (the
    step's margins) and a read of the rows whose weight changed (H and Z^T c follow them);
    H is refactored at every step and rebuilt by a traversal every _REBUILD steps or where
    more than _TRAVERSE_SHARE of the rows changed weight. The same method and stopping rules as
    :func:`newton_hinge`, whose docstring gives them; ``alpha`` and ``w`` are written in
    place likewise."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _newton_windows(windows, take, y, alpha, w, C=C, bias=float(bias), h=h,
                               max_newton=max_newton, tol=tol)


def _newton_windows(windows, take, y, alpha, w, *, C, bias, h, max_newton, tol):
    n, d1 = y.shape[0], w.shape[0]
    yz = np.ascontiguousarray(y, dtype=np.float64)
    scale = C / (2.0 * h)
    u = np.array(w, dtype=np.float64)
    m, c, dm = np.empty(n), np.empty(n), np.empty(n)
    q = np.zeros(d1)  # Z^T alpha: u - v (v, the fixed rows' part, never moves)

    def start(a, b, X):  # in the same traversal: q, the margins and the weights
        K.rows_tdot(*kernel_args(X), bias, _all(b - a), alpha[a:b] * yz[a:b], q)
        m[a:b] = margins(X, yz[a:b], u, bias)
        K.huber_weights(m[a:b], h, c[a:b])

    H, zc = _band_pass(windows, yz, c, bias, d1, scale, start)
    it, converged, since_build = 0, False, 0
    while it < max_newton:
        g = q - C * zc
        factor = _factor(H)
        if factor is None:  # as in newton_hinge: the dual point at this u
            break
        s = sla.cho_solve(factor, g, check_finite=False)
        dec = float(g @ s)
        it += 1
        if not math.isfinite(dec) or dec <= tol * C * max(n, 1):
            converged = math.isfinite(dec)
            break
        for a, b, X in windows():
            K.rows_dot(*kernel_args(X), bias, _all(b - a), s, dm[a:b])
        dm *= yz
        t, c_new, same_pieces = _step(m, dm, s, u, q, c, h, C)
        moved = np.flatnonzero(c_new != c)
        since_build += 1
        if since_build >= _REBUILD or moved.size > _TRAVERSE_SHARE * n:
            H, zc = _band_pass(windows, yz, c_new, bias, d1, scale)
            since_build = 0
        else:
            H = _follow_moved(take, moved, yz, c, c_new, bias, scale, H, zc)
        c = c_new
        if t == 1.0 and same_pieces:
            converged = True
            break
        if t < 1e-9:
            break
    # the dual point at the last u, margins recomputed (the updates drift): one traversal
    new_alpha = np.empty(n)
    dw = np.zeros(d1)
    for a, b, X in windows():
        new_alpha[a:b] = C * _weights(margins(X, yz[a:b], u, bias), h)
        K.rows_tdot(*kernel_args(X), bias, _all(b - a),
                    (new_alpha[a:b] - alpha[a:b]) * yz[a:b], dw)
    return _write_dual(new_alpha, dw, alpha, w, C, it, converged)


def _all(k: int) -> np.ndarray:
    return np.arange(k, dtype=np.int64)


def _band_pass(windows, yz, c, bias, d1, scale, first=None):
    """One traversal: H = I + scale * sum over the band of z z^T (upper triangle) and
    Z^T c; ``first(a, b, X)``, if given, runs on each window before (it may set c there)."""
    H = np.eye(d1)
    zc = np.zeros(d1)
    for a, b, X in windows():
        if first is not None:
            first(a, b, X)
        args, cw = kernel_args(X), c[a:b]
        K.rows_tdot(*args, bias, _all(b - a), cw * yz[a:b], zc)
        H = _syrk_rows(H, args, bias, np.flatnonzero((cw > 0.0) & (cw < 1.0)), scale, d1)
    return H, zc


def _follow_moved(take, moved, yz, c, c_new, bias, scale, H, zc):
    """Z^T c (in place) and H follow the rows whose weight changed, read back _CHUNK at a
    time; returns H."""
    for a in range(0, moved.size, _CHUNK):
        part = moved[a:a + _CHUNK]
        args = kernel_args(take(part))
        loc = _all(part.size)
        K.rows_tdot(*args, bias, loc, (c_new[part] - c[part]) * yz[part], zc)
        was = (c[part] > 0.0) & (c[part] < 1.0)
        now = (c_new[part] > 0.0) & (c_new[part] < 1.0)
        H = _syrk_rows(H, args, bias, loc[now & ~was], scale, H.shape[0])
        H = _syrk_rows(H, args, bias, loc[was & ~now], -scale, H.shape[0])
    return H


def _syrk_rows(H, args, bias, rows, weight, d1):
    """H + weight * sum over ``rows`` of [x, bias][x, bias]^T (upper triangle), _CHUNK rows
    at a time."""
    Xd, ip, ix, dt, sparse = args
    for a in range(0, rows.size, _CHUNK):
        part = rows[a:a + _CHUNK]
        G = np.empty((part.size, d1))
        K.rows_dense(Xd, ip, ix, dt, sparse, bias, part, G)
        # dsyrk on G^T (Fortran order d1 x k): H = weight G^T G + H, upper triangle
        H = _syrk(weight, G.T, beta=1.0, c=H, trans=0, lower=0, overwrite_c=1)
    return H


def _step(m, dm, s, u, q, c, h, C):
    """The step along -s to the exact minimiser t of phi (piecewise quadratic): u, q = u - v
    and the margins m move by it in place. Returns t, the new weights and whether every
    row stayed on its piece of the loss."""
    # phi'(t) = t |s|^2 - (u - v)^T s + C sum c(m - t dm) dm
    t = K.huber_line_search(m, dm, h, C, float(s @ s), float(q @ s), 1e-10)
    u -= t * s
    q -= t * s
    m -= t * dm
    c_new = _weights(m, h)
    return t, c_new, np.array_equal(_pattern(c_new), _pattern(c))


def _weights(m, h):
    """c_i = -L_h'(m_i) in [0, 1]: alpha_i / C at a stationary point."""
    out = np.empty_like(m)
    K.huber_weights(m, h, out)
    return out


def _pattern(c):
    """Which piece each row's loss is on: 0 above the band, 1 in it, 2 below."""
    return (c > 0.0).astype(np.int8) + (c >= 1.0)


class _Hessian:
    """H = I + scale * sum over the band of [x, bias][x, bias]^T (upper triangle), followed by
    rank-one updates as rows enter and leave the band and rebuilt every _REBUILD steps or
    where more than _UPDATE_SHARE of the band changed. Solves by the Cholesky factor of H,
    factored again whenever H changed (a factorisation at d = 784 takes ~5 ms, as long as one
    product H v over a band of ~3,000 rows: conjugate gradients preconditioned by the last
    factor, 10 steps at most, failed in 160 of 167 tries in an exact-stop run, 6.5 s of its
    78 s; bench-log 2026-11-28, session 41)."""

    def __init__(self, Xd, ip, ix, dt, sparse, bias, d1, scale):
        self.args = (Xd, ip, ix, dt, sparse, bias)
        self.d1, self.scale = d1, scale
        self.H = None
        self.band = np.empty(0, np.int64)
        self.since_build = 0
        self.factor = None  # H's Cholesky factor; None once H moved since it was factored
        self.rebuilt = False  # the last follow() rebuilt H

    def follow(self, band) -> None:
        enter = np.setdiff1d(band, self.band, assume_unique=True)
        leave = np.setdiff1d(self.band, band, assume_unique=True)
        self.rebuilt = (self.H is None or self.since_build >= _REBUILD
                        or enter.size + leave.size > _UPDATE_SHARE * max(1, band.size))
        if self.rebuilt:
            self._build(band)
        elif enter.size or leave.size:
            self._add(enter, self.scale)
            self._add(leave, -self.scale)
            self.since_build += 1
            self.factor = None
        self.band = band

    def solve(self, g):
        """H^-1 g, or None where H is not numerically positive definite even rebuilt from
        its band (a C so large, ~1e14 and up, that the identity is lost beside C/(2h) Z^T Z
        in float64): Newton's method stops there and dual CD goes on."""
        if self.factor is None:
            self.factor = _factor(self.H)
            if self.factor is None and self.since_build:
                self._build(self.band)  # the rank-one updates' rounding: H from its band
                self.factor = _factor(self.H)
            if self.factor is None:
                return None
        return sla.cho_solve(self.factor, g, check_finite=False)

    def _build(self, band) -> None:
        """H afresh: I + scale * the band's rows."""
        self.H = np.eye(self.d1)
        self._add(band, self.scale)
        self.since_build = 0
        self.factor = None

    def _add(self, rows, weight) -> None:
        """H += weight * sum over ``rows`` of [x, bias][x, bias]^T, upper triangle, by chunks."""
        *args, bias = self.args
        self.H = _syrk_rows(self.H, args, bias, rows, weight, self.d1)


def _factor(H):
    """H's Cholesky factor, or None where H is not (numerically) positive definite."""
    try:
        return sla.cho_factor(H, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None


def applies(d: int, n: int | None = None) -> bool:
    """Whether the Newton phase pays on ``n`` rows (any n where None) of ``d`` features: its
    Hessian small enough (d at most MAX_FEATURES; wider data are mostly sparse text, where
    dual CD needs few passes), and at least MIN_ROWS_PER_FEATURE (d + 1) rows (below
    that, dual CD's passes are cheap against the factorisations of H: Fashion-MNIST class 1,
    S of ~440 rows, took 2.23 s with Newton in every final solve against 0.55 s without;
    IBCD then turns to Newton only where dual CD stalls, whatever the rows)."""
    return d <= MAX_FEATURES and (n is None or n >= MIN_ROWS_PER_FEATURE * (d + 1))


def load_kernels() -> None:
    """Load this module's kernels now, on one-row inputs of the types the solve passes.

    Loading a kernel from numba's cache faults much of LLVM's library back in (tens of MB,
    handed back by ``release_compiler_pages`` when the budget runs short). IBCD calls this
    at its start, while the cap has room: at its first final solve, with S grown to its
    share, the load had taken a run under ``--memory 768M`` to 791 MiB of RSS."""
    X = np.zeros((1, 1), np.float32)
    out = np.empty((1, 2))
    K.rows_dense(*kernel_args(X), 1.0, np.zeros(1, np.int64), out)
    one = np.zeros(1)
    K.huber_line_search(one, one, DEFAULT_H, 1.0, 1.0, 0.0, 1e-10)
    K.huber_weights(one, DEFAULT_H, one)
