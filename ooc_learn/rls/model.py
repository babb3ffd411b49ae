"""Sparse regularized least squares (subset of regressors) with fast cross-validation.

Objective (Pahikkala et al. 2012, eq. 11): with basis rows B (n of the m training rows),

    a = argmin_a  || y - K_B^T a ||^2 + lam * a^T K_BB a  =  P^-1 K_B y,
    P = K_B K_B^T + lam K_BB                                        (eqs. 12-13)

solved once in O(m n^2) through the eigen-reformulation of Section 4 (eqs. 14-17):
K_BB = C C^T (Cholesky), C^-1 K_B K_B^T C^-T = V Lam V^T, Q = C^-T V, P^-1 = Q (Lam + lam)^-1 Q^T.
After that ``set_lambda`` costs O(n^2 v) and the hold-out / k-fold / LOO predictions of
Section 5 (Proposition 1, Corollaries 2-5; see :mod:`.holdout`) reuse Q, Lam, z0 = Q^T K_B y and
U = K_B^T Q. There is no iteration, hence no stopping rule: the solution is exact up to rounding.

Positive definiteness (the paper assumes K strictly PD and shifts it by 1e-7 I in its
experiments, Sections 6.2 and 6.4): we train with K~ = K + delta I on the training rows, i.e.
delta is added to K_BB's diagonal and to K_B at each basis row's own column, with
delta = jitter * mean(diag K_BB) (default jitter 1e-8). This makes K_BB invertible when basis
rows are duplicated or when a linear kernel has n > d, and every hold-out formula stays exact
for the shifted kernel. Predictions for new points use the unshifted k(x, x_B).

K_B is formed chunk by chunk (array slices, or the blocks of a Store), so m may exceed memory
while the n x n and n x v matrices stay in memory; U = K_B^T Q is cached (m x n) only when the
memory budget allows and is otherwise recomputed from the rows chunk by chunk.

Memory: a fitted model holds its n x n, n x v and m x v matrices reserved on the budget for as
long as it lives (:meth:`SparseRLS.close`, a refit or garbage collection give them back), so
later work (CV folds, chunk temporaries) is sized against what is really free; the training
pass reserves its eigensolver workspace and row-chunk temporaries, and the chunk size shrinks
to the free budget.

The fitted factors and the training rows (as kernel, R^T and U rows, cached or formed) that
the cross-validation reads are the base class's, :class:`~.fitted.FittedRLS`.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp
from scipy.linalg.blas import dsyrk

from ooc_learn.storage.arrays import row_sqnorms
from ooc_learn.storage.arrays import matrix_nbytes
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import ParameterError, UsageError

from .checks import check_lambda, check_lambdas
from .crossval import select_lambda_model
from .fitted import FittedRLS
from .holdout import mirror_upper
from .holdout_predict import holdout_path_model
from .kernel import CROSS_SLICE_BYTES, KernelSpec, kernel_block
from .kfold_predict import kfold_path_model, make_folds
from .loo_predict import loo_path_model
from .source import as_label_matrix, make_source

__all__ = ["SparseRLS"]

log = logging.getLogger(__name__)


# see SparseRLS.fit: BLAS/LAPACK memory that appears on first use, charged to a process budget
LIBRARY_BYTES = 48 << 20


class _RowsNotKept:
    """The training rows of a copied model: every use says to fit again."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UsageError("This SparseRLS is a copy (pickled or deep-copied): its training rows "
                         "are not kept, so it predicts but cannot cross-validate.",
                         "Fit it again on the rows (or store) to get hold-out or LOO figures.")


def _slice_bytes(sparse: bool) -> int:
    """The float64 copy of rows that one cross product holds (``kernel._cross`` converts
    CROSS_SLICE_BYTES of them at a time); CSR rows copy their column indices too."""
    return CROSS_SLICE_BYTES * (3 if sparse else 2) // 2


class SparseRLS(FittedRLS):
    """Sparse RLS with a random (seeded) or explicit basis and exact fast CV.

    Parameters
    ----------
    kernel : {"rbf", "linear", "poly"}
    gamma : float or None
        RBF / poly scale; None means 1 / n_features.
    degree, coef0 : poly kernel ``(gamma <x, z> + coef0) ** degree``.
    n_basis : int
        Number of basis rows drawn uniformly without replacement (ignored if ``basis`` given).
    basis : array of int, optional
        Explicit basis row positions (unique).
    lam : float
        Regularisation parameter (> 0); change it later with :meth:`set_lambda`.
    jitter : float
        Relative diagonal shift delta = jitter * mean(diag K_BB) added to K on the training rows.
    seed : int or numpy.random.Generator
        Randomness of the basis draw and of random folds.
    memory : None, size string, bytes or MemoryBudget
        The memory cap (a Store's own budget is used when fitting a Store and memory is None).
    cache_u : bool
        Keep U = K_B^T Q (m x n float64) in memory when the budget allows.
    folds : int, labels or list of row arrays, optional
        Folds known at fit time: the training pass then also accumulates each fold's hold-out
        Gram matrix R_H R_H^T (k n^2 memory), so ``kfold_predict`` with these folds skips the
        O(|H| n^2) product per fold and k-fold CV costs little more than one training.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 3)); y = np.sin(X[:, 0])
    >>> model = SparseRLS(n_basis=40, lam=0.1).fit(X, y)
    >>> loo = model.loo_predict()               # exact LOO predictions, O(m n)
    >>> loo.shape
    (200,)
    """

    def __init__(self, kernel: str = "rbf", gamma=None, degree: int = 3, coef0: float = 1.0,
                 n_basis: int = 100, basis=None, lam: float = 1.0, jitter: float = 1e-8,
                 seed=0, memory=None, cache_u: bool = True, folds=None):
        self.spec = KernelSpec(kernel, gamma, degree, coef0)
        if basis is None and (int(n_basis) != n_basis or n_basis < 1):
            raise ParameterError(
                f"The 'n_basis' parameter of SparseRLS must be an integer >= 1. "
                f"Got {n_basis!r} instead.")
        if not (np.isfinite(jitter) and jitter >= 0):
            raise ParameterError(
                f"The 'jitter' parameter of SparseRLS must be >= 0. Got {jitter!r} instead.")
        self.kernel, self.gamma, self.degree, self.coef0 = kernel, gamma, degree, coef0
        self.n_basis = int(n_basis) if basis is None else len(np.atleast_1d(basis))
        self.basis = None if basis is None else np.atleast_1d(np.asarray(basis))
        self.lam = check_lambda(lam, "SparseRLS")
        self.jitter = float(jitter)
        self.seed = seed
        self.memory = memory
        self.cache_u = bool(cache_u)
        self.folds = folds
        self.stats_ = {}
        self._fitted = False
        self._ucache = None
        self._ucache_bytes = 0
        self._ucache_is_u = False
        self._rt_rows_served = 0
        self._state_bytes = 0
        self._fold_grams_bytes = 0

    # -- memory held for the model's lifetime ---------------------------------------------------
    def close(self) -> None:
        """Give the model's reserved bytes (its matrices, the U cache, fit-time fold Grams)
        back to the memory budget. The model stays usable only through a new ``fit``."""
        self.release_cache()
        budget = getattr(self, "_budget", None)
        if budget is not None:
            budget.release(self._fold_grams_bytes + self._state_bytes)
        self._fold_grams_bytes = self._state_bytes = 0
        self._fold_grams = None
        if self._fitted:
            self._fitted = False
            for name in ("_C", "_V", "Q_", "_AR", "_Y", "X_basis_", "_Ky", "_z0", "_KyR",
                         "coef_"):
                self.__dict__.pop(name, None)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- copies (pickle, copy.deepcopy: scikit-learn's GridSearchCV workers) ------------------
    def __getstate__(self) -> dict:
        """A copy keeps what ``predict`` and ``set_lambda`` need, not the training rows (an
        array copy of them, or an open store), the budget's account (locks and evictors) or
        the U cache: cross-validating a copy asks to fit again."""
        state = self.__dict__.copy()
        if isinstance(state.get("memory"), MemoryBudget):
            state["memory"] = state["memory"].cap
        state.update(_budget=None, _ucache=None, _ucache_bytes=0, _ucache_is_u=False,
                     _state_bytes=0, _fold_grams=None, _fold_grams_bytes=0)
        if self._fitted:
            state.update(_source=_RowsNotKept(), _Y=_RowsNotKept())
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._fitted:
            self._budget = MemoryBudget.coerce(self.memory)

    @property
    def KBB_(self) -> np.ndarray:
        """The shifted basis kernel matrix K_BB + delta I, recomputed from its Cholesky factor
        (not kept: n x n bytes)."""
        self.check_fitted()
        return self._C @ self._C.T

    @staticmethod
    def _state_nbytes(n: int, v: int, m: int) -> int:
        """Bytes a fitted model keeps: C, V, Q, A (n x n), K_B y, z0, C^-1 K_B y, coef (n x v),
        the labels (m x v), eigenvalues, squared norms and basis ids (n each)."""
        return 8 * (4 * n * n + 4 * n * v + m * v + 6 * n)

    @staticmethod
    def _train_work(n: int, chunk: int, arrays: int = 1, row_copy: float = 0.0,
                    sparse: bool = False) -> int:
        """Bytes of the training pass's temporaries: the n x n K_BB before its Cholesky factor,
        a chunk's kernel rows, turned into its R rows in place (``arrays`` = 1 chunk x n; 2
        with fit-time folds, whose R columns are copied out per fold) beside the float64
        copy of the chunk's rows that the cross product takes (``row_copy`` doubles a row, at
        most a slice of :func:`_slice_bytes`), and the divide-and-conquer eigensolver's
        workspace (1 + 6 n + 2 n^2 doubles, 3 + 5 n ints)."""
        copy = min(8 * chunk * row_copy, _slice_bytes(sparse))
        return int(max(8 * n * n, 8 * chunk * arrays * n + copy, 8 * (2 * n * n + 12 * n + 8)))

    @staticmethod
    def _row_copy_doubles(X, d: int) -> float:
        """Doubles a row takes in the float64 copy ``kernel_block`` makes of a chunk: d for
        dense rows, 1.5 per stored value for CSR (data and indices)."""
        if sp.issparse(X):
            return 1.5 * X.nnz / max(1, X.shape[0])
        if getattr(X, "layout", "dense") == "csr":
            return 1.5 * X.nnz / max(1, X.n_samples)
        return float(d)

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, X, y=None) -> "SparseRLS":
        """Fit on arrays (dense or CSR) with labels ``y`` (vector or (m, v) matrix), or on a
        Store (labels from the store, or ``y`` aligned with the store's row positions)."""
        t0 = time.perf_counter()
        self.close()
        n_chunk = max(256, (1 << 22) // max(self.n_basis, 1))
        src = make_source(X, n_chunk)
        m, d = src.n_samples, src.n_features
        if self.basis is None and self.n_basis > m:
            raise ParameterError(
                f"The 'n_basis' parameter of SparseRLS must be <= the number of samples ({m}). "
                f"Got {self.n_basis} instead.", "Use fewer basis vectors or more data.")
        if y is None:
            if not src.is_store:
                raise ParameterError("The 'y' parameter of SparseRLS.fit is required for arrays.")
            y = src.labels()
        Y, self._vector_y = as_label_matrix(y, m)
        src.check_finite()
        basis = self._draw_basis(m)
        store_budget = getattr(getattr(X, "budget", None), "limit", None)
        self._budget = (X.budget if (src.is_store and self.memory is None and store_budget)
                        else MemoryBudget.coerce(self.memory))
        n, v = basis.size, Y.shape[1]
        budget = self._budget
        state = self._state_nbytes(n, v, m)
        if budget.fixed:
            # a process budget (the whole process under the cap) also carries what BLAS and
            # LAPACK map and allocate on first use: their buffers and code pages, which stay
            # resident as long as the process does
            state += LIBRARY_BYTES
        budget.reserve(state, "sparse RLS model (n x n, n x v and m x v matrices)")
        self._state_bytes = state
        # row chunks of the training pass (and of later passes over the rows, which cut
        # them to their own needs): one chunk x n float64 (two with folds) beside a slice's
        # float64 copy, shrunk to the free budget (at least 16 rows)
        fold_of, grams = self._start_fold_grams(src, n, v)     # reserved before the chunks
        arrays = 1 if self.folds is None else 2
        sparse = bool(sp.issparse(X) or getattr(X, "layout", "dense") == "csr")
        row_copy = self._row_copy_doubles(X, d)
        room = budget.available - 8 * n * n
        # the rows' copy whole, or a slice of it beside larger chunks: the larger count
        chunk = max(room // (8 * (arrays * n + row_copy)),
                    (room - _slice_bytes(sparse)) // (8 * arrays * n))
        chunk = int(min(n_chunk, max(16, chunk)))
        if chunk < n_chunk and chunk < m:
            src = make_source(X, chunk)
        self._source, self._Y, self.basis_ = src, Y, basis
        self._bsorted_order = np.argsort(basis, kind="stable")
        self._bsorted = basis[self._bsorted_order]
        self.gamma_ = self.spec.resolved_gamma(d)
        self.n_features_in_ = d
        work = self._train_work(n, min(chunk, m), arrays, row_copy, sparse)
        with budget.reservation(work, "sparse RLS training work (eigensolver, row chunks)"):
            self.X_basis_ = src.take(basis)
            xb = matrix_nbytes(self.X_basis_)
            budget.reserve(xb, "sparse RLS basis rows")
            self._state_bytes += xb
            self._sqB = row_sqnorms(self.X_basis_)
            KBB = kernel_block(self.X_basis_, self.X_basis_, self.spec, self.gamma_,
                               sqA=self._sqB, sqB=self._sqB)
            diag = np.diag(KBB).copy()
            self.delta_ = self.jitter * (float(diag.mean()) if diag.mean() > 0 else 1.0)
            KBB[np.diag_indices(n)] += self.delta_
            self._C = self._cholesky(KBB)
            del KBB
            A, Ky = self._accumulate(src, Y, n, v, fold_of, grams)
            del fold_of
            self._decompose(A, Ky)
        self._fitted = True
        self.set_lambda(self.lam)
        self.stats_.update(fit_seconds=time.perf_counter() - t0, n_samples=m, n_basis=n,
                           n_outputs=v, rows_read=int(src.rows_read))
        return self

    def _draw_basis(self, m: int) -> np.ndarray:
        if self.basis is None:
            rng = (self.seed if isinstance(self.seed, np.random.Generator)
                   else np.random.default_rng(self.seed))
            return np.sort(rng.choice(m, size=self.n_basis, replace=False)).astype(np.int64)
        b = self.basis
        if b.size == 0 or not np.issubdtype(b.dtype, np.integer):
            raise ParameterError("The 'basis' parameter of SparseRLS must be a non-empty array "
                                 f"of row positions. Got {b!r} instead.")
        if b.min() < 0 or b.max() >= m:
            raise ParameterError(f"The 'basis' parameter of SparseRLS must hold row positions "
                                 f"in [0, {m}). Got {int(b.min())}..{int(b.max())} instead.")
        if np.unique(b).size != b.size:
            raise ParameterError("The 'basis' parameter of SparseRLS must not repeat a row.",
                                 "Pass each basis row once (duplicate *rows* are fine).")
        return b.astype(np.int64)

    def _accumulate(self, src, Y, n: int, v: int, fold_of, grams):
        """One pass over the rows: A = R R^T with R = C^-1 K_B (eq. 15) and K_B y.

        Forming R chunk by chunk (a triangular solve) before the product keeps the rounding
        error of A at eps * sqrt(cond K_BB) instead of the eps * cond K_BB of C^-1 (K_B K_B^T)
        C^-T, and makes U = R^T V consistent with Lam (U^T U = Lam to working precision).
        The R^T rows are cached when the budget allows (they become U after the eigensolve).
        """
        m = src.n_samples
        A = np.zeros((n, n), order="F")
        Ky = np.zeros((n, v))
        self._ucache = None
        if self.cache_u and self._budget.try_reserve(8 * m * n):
            self._ucache_bytes = 8 * m * n
            self._ucache = np.empty((m, n))
        self._ucache_is_u = False
        self._rt_rows_served = 0
        kev = 0
        for j in range(len(src.offsets) - 1):
            a, b = int(src.offsets[j]), int(src.offsets[j + 1])
            Kc = self.kernel_rows(src.chunk(j), np.arange(a, b))
            kev += Kc.size
            Ky += Kc.T @ Y[a:b]
            # R's columns in place of the kernel rows (K^T is Fortran-ordered: no copy)
            Rc = la.solve_triangular(self._C, Kc.T, lower=True, check_finite=False,
                                     overwrite_b=True)
            del Kc
            if fold_of is None:
                A = dsyrk(1.0, Rc, beta=1.0, c=A, trans=0, lower=0, overwrite_c=1)
            else:               # A = sum of the folds' Grams (+ rows in no fold)
                lab = fold_of[a:b]
                for g in np.unique(lab):
                    sel = lab == g
                    Rg = Rc[:, sel]
                    if g < 0:
                        A = dsyrk(1.0, Rg, beta=1.0, c=A, trans=0, lower=0, overwrite_c=1)
                    else:
                        grams[0][g] = dsyrk(1.0, Rg, beta=1.0, c=grams[0][g], trans=0,
                                            lower=0, overwrite_c=1)
                        grams[1][g] += Rg @ Y[a:b][sel]
            if self._ucache is not None:
                self._ucache[a:b] = Rc.T
            del Rc  # before the next chunk's kernel rows
        if fold_of is not None:
            self._budget.release(8 * m)     # the caller drops fold_of
            for g in range(len(grams[0])):
                mirror_upper(grams[0][g])
                A += grams[0][g]
            self._fold_grams = (self._fold_list, grams[0], grams[1])
        A = mirror_upper(A)
        self.stats_ = {"kernel_evaluations": kev + n * n}
        return A, Ky

    def _start_fold_grams(self, src, n: int, v: int):
        """Fold label per row and zeroed per-fold (R_H R_H^T, R_H y_H) when ``folds`` is set."""
        self._fold_grams = None
        if self.folds is None:
            return None, None
        m = src.n_samples
        blocks = src.block_offsets if src.is_store else None
        self._fold_list = make_folds(self.folds, m, seed=self.seed, block_offsets=blocks)
        k = len(self._fold_list)
        held = 8 * k * n * (n + v) + 8 * sum(f.size for f in self._fold_list)
        self._budget.reserve(held, "per-fold Gram matrices and fold rows")
        self._fold_grams_bytes = held
        self._budget.reserve(8 * m, "fold label per row")     # released after the pass
        fold_of = np.full(m, -1, dtype=np.int64)
        for g, rows in enumerate(self._fold_list):
            fold_of[rows] = g
        grams = ([np.zeros((n, n), order="F") for _ in range(k)],
                 [np.zeros((n, v)) for _ in range(k)])
        return fold_of, grams

    def _cholesky(self, KBB):
        try:
            return la.cholesky(KBB, lower=True, check_finite=False)
        except la.LinAlgError:
            raise UsageError(
                f"The basis kernel matrix K_BB is not positive definite even after a diagonal "
                f"shift of {self.delta_:.3g}.", "Raise SparseRLS(jitter=...) e.g. to 1e-6.") from None

    def _decompose(self, A, Ky) -> None:
        Lam, V = la.eigh(A, driver="evd", check_finite=False)     # divide and conquer
        np.maximum(Lam, 0.0, out=Lam)            # a Gram matrix: negatives are rounding
        self.eigvals_ = Lam
        self._V = V
        self.Q_ = la.solve_triangular(self._C.T, V, lower=False, check_finite=False)
        self._Ky = Ky
        self._z0 = self.Q_.T @ Ky
        self._AR = A            # R R^T (eigh leaves it intact): the hold-in Gram of k-fold CV
        self._KyR = V @ self._z0  # C^-1 K_B y                     in R coordinates

    # -- model ---------------------------------------------------------------------------------
    def check_fitted(self) -> None:
        """Raise :class:`UsageError` unless :meth:`fit` was called."""
        if not self._fitted:
            raise UsageError("This SparseRLS is not fitted yet.", "Call fit(X, y) first.")

    def set_lambda(self, lam: float) -> "SparseRLS":
        """Switch to another lambda in O(n^2 v): a = Q (Lam + lam)^-1 Q^T K_B y (eq. 17)."""
        lam = check_lambda(lam, "SparseRLS.set_lambda")
        self.check_fitted()
        self.lam = lam
        self.coef_ = self.Q_ @ (self._z0 / (self.eigvals_ + lam)[:, None])
        return self

    def coef_path(self, lams) -> np.ndarray:
        """Coefficients for every lambda: shape (c, n, v)."""
        lams = check_lambdas(lams, "SparseRLS.coef_path")
        self.check_fitted()
        Lt = 1.0 / (self.eigvals_[None, :] + lams[:, None])
        return np.einsum("ij,cj,jv->civ", self.Q_, Lt, self._z0, optimize=True)

    def predict(self, X) -> np.ndarray:
        """f(x) = k(x, X_B) a for new rows (unshifted kernel); chunked over rows."""
        self.check_fitted()
        src = make_source(X, max(256, (1 << 22) // self.basis_.size))
        if src.n_features != self.n_features_in_:
            from ooc_learn.storage.errors import ModelMismatchError
            raise ModelMismatchError(
                f"X has {src.n_features} features but this SparseRLS was fitted with "
                f"{self.n_features_in_}.", "Predict on rows with the training feature layout.")
        n, v = self.basis_.size, self.coef_.shape[1]
        with self._budget.reservation(8 * src.n_samples * v, "sparse RLS predictions"):
            out = np.empty((src.n_samples, v))
            for a, b, K in self._iter_chunks(src, 8 * (2 * n + v), lambda Xr, rows: kernel_block(
                    Xr, self.X_basis_, self.spec, self.gamma_, sqB=self._sqB)):
                out[a:b] = K @ self.coef_
        return out[:, 0] if self._vector_y else out

    # -- cross-validation (:mod:`.crossval` and the modules it names) -------------------------
    def holdout_predict(self, H, basis_mode: str = "remove") -> np.ndarray:
        """Predictions for rows H from the model trained without them (Proposition 1)."""
        return self.holdout_predict_path(H, [self.lam], basis_mode)[0]

    def holdout_predict_path(self, H, lams, basis_mode: str = "remove") -> np.ndarray:
        """:meth:`holdout_predict` for every lambda: shape (c, |H|[, v])."""
        return self._squeeze(holdout_path_model(self, H, lams, basis_mode))

    def kfold_predict(self, folds=10, basis_mode: str = "remove") -> np.ndarray:
        """Per-row predictions of the fold model that held the row out (NaN: in no fold)."""
        return self.kfold_predict_path(folds, [self.lam], basis_mode)[0]

    def kfold_predict_path(self, folds, lams, basis_mode: str = "remove") -> np.ndarray:
        """:meth:`kfold_predict` for every lambda: shape (c, m[, v])."""
        return self._squeeze(kfold_path_model(self, folds, lams, basis_mode))

    def loo_predict(self, basis_mode: str = "remove") -> np.ndarray:
        """Leave-one-out predictions of every training row in O(m n)."""
        return self.loo_predict_path([self.lam], basis_mode)[0]

    def loo_predict_path(self, lams, basis_mode: str = "remove") -> np.ndarray:
        """:meth:`loo_predict` for every lambda: shape (c, m[, v])."""
        return self._squeeze(loo_path_model(self, lams, basis_mode))

    def select_lambda(self, lams, cv="loo", metric: str = "mse", basis_mode: str = "remove"):
        """Pick lambda by LOO or k-fold CV; returns ``LambdaSelection(best_lambda, curve,
        model, lambdas)`` with this model switched to the best lambda."""
        return select_lambda_model(self, lams, cv, metric, basis_mode)

    def _squeeze(self, arr: np.ndarray) -> np.ndarray:
        return arr[..., 0] if self._vector_y else arr
