"""SMO for the C-SVM dual with a kernel-column LRU cache under the memory cap.

Solves  min_a 1/2 a'Qa - e'a  s.t.  0 <= a_i <= C,  y'a = 0,  Q_ij = y_i y_j K(x_i, x_j),
by sequential minimal optimisation with the second-order working-set selection of Fan, Chen
& Lin (JMLR 2005, WSS 2) and LIBSVM's shrinking (Chang & Lin 2011, section 5). Stopping rule:
the maximal violating pair gap m(a) - M(a) < eps (eps = 1e-3 by default).

Kernel columns are whole columns over all rows of the input and are cached by row id in a
float64 slot array whose byte size is reserved from a :class:`MemoryBudget`; so a column
computed for one CV round or LOO row serves all later ones. Warm starts take a feasible
alpha together with its gradient; callers that change only a few alphas update the gradient
with the changed alphas' columns (:meth:`KernelMatrix.add_columns`), never from scratch.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.arrays import kernel_args, row_sqnorms
from ooc_learn.storage.budget import MemoryBudget, format_size
from ooc_learn.storage.errors import BudgetExceededError

from . import _kernels as K
from ._inputs import KERNELS, check_kernel_params, prepare_inputs, prepare_X, resolve_gamma

# below this many rows the kernel matrix's exp pass runs in the calling thread: two threads
# take 0.31 ms at 128 rows (one: 0.08), 0.56 at 256 (0.47), 1.25 at 512 (2.03)
THREADED_FILL_ROWS = 320

__all__ = ["KernelMatrix", "SVMModel", "train_svm"]

_NO_PHASES = np.zeros(0, dtype=np.int64)  # smo_solve records no phase iterations



class KernelMatrix:
    """Kernel columns of one data set, cached (LRU) under a memory budget.

    Parameters
    ----------
    X : float32 ndarray (n, d) or float32 CSR matrix
        Rows, already validated (see ``_inputs.prepare_X``).
    kernel : {"linear", "rbf", "poly"}
    gamma, degree, coef0 : kernel parameters (K = exp(-gamma |x-x'|^2) or (gamma x'x' + coef0)^degree).
    budget : MemoryBudget
        The cache's bytes (and O(n) working arrays) are reserved from it.
    cache_bytes : int, optional
        Cap on the cache alone; default: what the budget has free, up to the full matrix.
    """

    def __init__(self, X, kernel: str, gamma: float, degree: int, coef0: float,
                 budget: MemoryBudget, cache_bytes: int | None = None):
        self.n = n = X.shape[0]
        self.budget = budget
        self.work_bytes = 16 * 8 * n + 8 * X.shape[1]
        budget.reserve(self.work_bytes, "kernel SVM working arrays")
        col = 8 * n
        cap = budget.available if cache_bytes is None else min(int(cache_bytes), budget.available)
        slots = int(min(n, cap // col))
        if slots < 2:
            budget.release(self.work_bytes)
            raise BudgetExceededError(
                f"The kernel column cache needs at least 2 columns ({format_size(2 * col)}) "
                f"but only {format_size(cap)} is available.",
                f"Raise --memory (or OOC_MEMORY) to at least "
                f"{format_size(budget.cap_needed(2 * col + self.work_bytes), up=True)}.")
        self.cache_bytes = slots * col
        budget.reserve(self.cache_bytes, "kernel column cache")
        Xd, indptr, indices, data = kernel_args(X)[:4]
        self.sqnorms = row_sqnorms(X)
        self.kd = (Xd, indptr, indices, data, self.sqnorms, np.zeros(X.shape[1]),
                   int(KERNELS[kernel]), float(gamma), float(coef0), int(degree))
        self.kc = (np.empty((slots, n)), np.full(n, -1, dtype=np.int32),
                   np.full(slots, -1, dtype=np.int32), np.zeros(slots, dtype=np.int64),
                   np.zeros(8, dtype=np.int64))
        self.diag = np.empty(n)
        K.kernel_diag(self.kd, self.diag)
        self.X = X
        self.kernel, self.gamma, self.degree, self.coef0 = kernel, gamma, degree, coef0
        self._closed = False
        if slots == n:
            self._fill()

    def _fill(self) -> None:
        """Every column at once, where the cache holds them all: one matrix product (BLAS)
        instead of a column at a time in numba (several times faster per column on dense
        rows; docs/bench-log.md). Every later request is a hit, the seeders' columns too."""
        cdata, slot_of, row_of, stamp, cnt = self.kc
        n, X = self.n, self.X
        if sp.issparse(X):
            X64 = X.astype(np.float64)
            (X64 @ X64.T).toarray(out=cdata)
        else:
            with self.budget.reservation(8 * X.size, "kernel matrix: rows in float64"):
                X64 = X.astype(np.float64)
                np.matmul(X64, X64.T, out=cdata)
        del X64
        if self.kernel != "linear":  # one pass in numba, rows split over two threads
            args = (self.sqnorms, int(KERNELS[self.kernel]), float(self.gamma),
                    float(self.coef0), int(self.degree))
            if n < THREADED_FILL_ROWS:  # starting the threads costs more than the pass
                K.gram_to_kernel(cdata, 0, n, *args)
            else:
                from concurrent.futures import ThreadPoolExecutor

                half = n // 2
                with ThreadPoolExecutor(2) as pool:
                    for f in [pool.submit(K.gram_to_kernel, cdata, 0, half, *args),
                              pool.submit(K.gram_to_kernel, cdata, half, n, *args)]:
                        f.result()
        rows = np.arange(n, dtype=np.int32)
        slot_of[:] = rows
        row_of[:] = rows
        stamp[:] = 0
        cnt[5] = n
        cnt[2] += n
        cnt[3] += n * n

    @property
    def n_slots(self) -> int:
        return self.kc[0].shape[0]

    def column(self, g: int) -> np.ndarray:
        """A copy of column g (K(x_g, x_j) for all j)."""
        return K.get_col(self.kd, self.kc, np.int64(g)).copy()

    def block(self, cols, rows) -> np.ndarray:
        """K[rows][:, cols] as a dense (len(rows), len(cols)) array, built from columns."""
        out = np.empty((len(rows), len(cols)))
        K.gather_block(self.kd, self.kc, np.asarray(cols, dtype=np.int64),
                       np.asarray(rows, dtype=np.int64), out)
        return out

    def add_columns(self, cols, weights, rows, out) -> None:
        """out[rows] += sum_j weights_j K(x_cols_j, x_rows)."""
        K.add_columns(self.kd, self.kc, np.asarray(cols, dtype=np.int64),
                      np.asarray(weights, dtype=np.float64),
                      np.asarray(rows, dtype=np.int64), out)

    def counters(self) -> dict:
        cnt = self.kc[4]
        return {"kernel_evaluations": int(cnt[3]), "kernel_columns_computed": int(cnt[2]),
                "kernel_columns_requested": int(cnt[4]), "cache_hits": int(cnt[1])}

    def close(self) -> None:
        if not self._closed:
            self.budget.release(self.cache_bytes + self.work_bytes)
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def default_max_iter(l: int) -> int:
    return max(10_000_000, 100 * l)


def solve(km: KernelMatrix, train, y, alpha, G, C: float, eps: float, *, shrinking=True,
          max_iter=None, caller="SMO", phase=None):
    """Run SMO in place on the rows ``train``; returns (rho, iterations).

    ``alpha`` (length n, feasible) and ``G`` (Q alpha - 1 on ``train``) are updated in place.
    A run that hits ``max_iter`` warns, naming the parameter to change. ``phase`` (optional
    int64 array) receives the iterations at which the pair gap first fell below 1, 0.1, ...
    """
    train = np.asarray(train, dtype=np.int64)
    mi = default_max_iter(len(train)) if max_iter is None else int(max_iter)
    phase = _NO_PHASES if phase is None else phase
    rho, it, ok = K.smo_solve(km.kd, km.kc, km.diag, train, y, alpha, G, float(C), float(eps),
                              bool(shrinking), mi, phase)
    if not ok:
        warnings.warn(f"{caller}: SMO stopped after {it} iterations without reaching the "
                      f"eps-KKT tolerance; raise max_iter or tol, or scale the features.",
                      RuntimeWarning, stacklevel=3)
    return float(rho), int(it)


def move_alpha(km: KernelMatrix, y, delta, G, train) -> int:
    """Update the SMO gradient ``G`` on ``train`` for alpha moving by ``delta``, from the
    changed alphas' kernel columns only: G_i += y_i sum_j K_ij y_j delta_j. Returns how many
    alphas changed."""
    changed = np.flatnonzero(delta)
    acc = np.zeros(km.n)
    km.add_columns(changed, delta[changed] * y[changed], train, acc)
    G[train] += y[train] * acc[train]
    return int(changed.size)


def decision_on(km: KernelMatrix, sv, coef, rows, rho: float) -> np.ndarray:
    """Decision values sum_j coef_j K(x_j, x_rows) - rho from the support vectors' columns."""
    out = np.zeros(km.n)
    km.add_columns(sv, coef, rows, out)
    return out[np.asarray(rows, dtype=np.int64)] - rho


@dataclass
class SVMModel:
    """A trained binary kernel SVM.

    ``decision_function(X) = sum_i dual_coef_i K(sv_i, x) - rho``; ``predict`` maps > 0 to
    ``classes[1]``.
    """

    support: np.ndarray
    dual_coef: np.ndarray
    rho: float
    classes: np.ndarray
    X_sv: object
    kernel: str
    gamma: float
    degree: int
    coef0: float
    alpha: np.ndarray
    objective: float
    stats: dict = field(default_factory=dict)

    def decision_function(self, X) -> np.ndarray:
        X = prepare_X(X)
        A, B = self.X_sv, X
        if sp.issparse(A) != sp.issparse(B):
            B = sp.csr_matrix(B) if sp.issparse(A) else np.asarray(B.toarray(), np.float32)
            B = prepare_X(B)
        Ka = np.empty((B.shape[0], A.shape[0]))
        width = max(A.shape[1], B.shape[1])
        args_b = kernel_args(B)[:4] + (row_sqnorms(B),)
        args_a = kernel_args(A)[:4] + (row_sqnorms(A),)
        K.cross_kernel(*args_b, *args_a, int(KERNELS[self.kernel]), float(self.gamma),
                       float(self.coef0), int(self.degree), np.zeros(width), Ka)
        return Ka @ self.dual_coef - self.rho

    def predict(self, X) -> np.ndarray:
        return np.where(self.decision_function(X) > 0, self.classes[1], self.classes[0])


def train_svm(X, y=None, *, kernel: str = "rbf", C: float = 1.0, gamma=None, degree: int = 3,
              coef0: float = 0.0, tol: float = 1e-3, shrinking: bool = True, alpha0=None,
              memory=None, cache_bytes: int | None = None, max_iter: int | None = None
              ) -> SVMModel:
    """Train a binary C-SVM by SMO (LIBSVM's method).

    Parameters
    ----------
    X, y : arrays (dense or CSR) or a Store (then y may be None)
    kernel, C, gamma, degree, coef0 : as in LIBSVM (gamma None = 1 / n_features)
    tol : eps of the eps-KKT stopping rule
    alpha0 : optional feasible warm start (length n; 0 <= alpha0 <= C, y'alpha0 = 0)
    memory : None, size string, bytes or MemoryBudget; the kernel cache reserves from it

    Examples
    --------
    >>> from sklearn.datasets import load_breast_cancer
    >>> X, y = load_breast_cancer(return_X_y=True)
    >>> m = train_svm(X / X.max(0), y, C=1.0, gamma=0.5)
    >>> round(float((m.predict(X / X.max(0)) == y).mean()), 2) >= 0.9
    True
    """
    caller = "train_svm"
    kernel, C, gamma, degree, coef0, tol = check_kernel_params(caller, kernel, C, gamma,
                                                               degree, coef0, tol)
    budget = MemoryBudget.coerce(memory)
    X, ypm, classes, sbytes, sbudget = prepare_inputs(X, y, caller)
    try:
        gamma = resolve_gamma(gamma, X)
        n = X.shape[0]
        t0 = time.perf_counter()
        with KernelMatrix(X, kernel, gamma, degree, coef0, budget, cache_bytes) as km:
            train = np.arange(n, dtype=np.int64)
            alpha = np.zeros(n)
            G = -np.ones(n)
            if alpha0 is not None:
                alpha = _check_alpha0(alpha0, ypm, C)
                nz = np.flatnonzero(alpha)
                km.add_columns(nz, alpha[nz] * ypm[nz], train, G_u := np.zeros(n))
                G = ypm * G_u - 1.0
            rho, it = solve(km, train, ypm, alpha, G, C, tol, shrinking=shrinking,
                            max_iter=max_iter, caller=caller)
            stats = {"iterations": it, "seconds": time.perf_counter() - t0, **km.counters()}
        sv = np.flatnonzero(alpha > 0)
        obj = float(0.5 * np.dot(alpha, G - 1.0))
        return SVMModel(support=sv, dual_coef=alpha[sv] * ypm[sv], rho=rho, classes=classes,
                        X_sv=X[sv], kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                        alpha=alpha, objective=obj, stats=stats)
    finally:
        if sbudget is not None:
            sbudget.release(sbytes)


def _check_alpha0(alpha0, y, C):
    from ooc_learn.storage.errors import ParameterError

    a = np.asarray(alpha0, dtype=np.float64).copy()
    if a.shape != y.shape or not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > C \
            or abs(float(a @ y)) > 1e-8 * max(1.0, C * len(a)):
        raise ParameterError(
            "The 'alpha0' parameter of train_svm must be a feasible dual point "
            "(0 <= alpha0 <= C, sum alpha0 * y = 0, one value per row). Got an infeasible "
            "vector instead.", "Pass alpha from a previous solve with the same C and labels.")
    return a
