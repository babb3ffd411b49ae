"""scikit-learn estimators over the engine: :class:`LinearSVC`, :class:`LinearSVR` and
:class:`SparseRLS` (also ``ooc_learn.SparseRLS``).

They follow scikit-learn's conventions (``get_params`` / ``set_params``, ``fit`` returning
the estimator, ``coef_``, ``intercept_``, ``classes_``, ``n_features_in_``, ``score``), so
they go into a ``Pipeline``, ``GridSearchCV`` or ``cross_val_score`` as any estimator does,
and they pass ``sklearn.utils.estimator_checks.check_estimator``.

``fit`` takes either

- in-memory data ``fit(X, y)`` (a dense array or a scipy sparse matrix): the rows are
  ingested into a temporary store (with its index for IBCD) under ``memory`` and trained there,
  exactly as ``ooc-ingest`` then ``ooc-train`` would (the same store for the same rows and
  seed where the buffer holds them, so the same model as the CLI's), the folder removed when
  ``fit`` returns. A memory-mapped ``.npy`` (``np.load(path, mmap_mode="r")``) larger than
  the buffer is read from its file by row position, not through its mapping, and checked
  for NaN / Inf block by block as it is read (scikit-learn's check would touch every page of
  the mapping); or
- a store ``fit(store)`` (a :class:`~ooc_learn.Store` or the path of one) with ``y`` left
  out: the labels are the store's, and the data never need to fit in memory.

``predict`` / ``decision_function`` / ``score`` take arrays (as scikit-learn does); the
streaming scorers of a store are on the :class:`~ooc_learn.LinearModel` in ``model_``.

Nothing here is saved with pickle by ooc-learn; ``model_.save(path)`` writes the fitted model
as npz or HDF5 (``ooc-predict`` reads it). The estimators themselves pickle as any
scikit-learn estimator does (GridSearchCV's workers need that).

>>> import numpy as np
>>> from ooc_learn.sklearn import LinearSVC
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 4)); y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
>>> clf = LinearSVC(C=1.0).fit(X, y)
>>> clf.classes_.tolist(), clf.coef_.shape
(['no', 'yes'], (1, 4))
>>> bool(clf.score(X, y) > 0.95)
True
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

__all__ = ["LinearSVC", "LinearSVR", "SparseRLS"]

_LOSSES = {"hinge": "hinge", "squared_hinge": "sqhinge", "sqhinge": "sqhinge"}


def _validate_fit(estimator, X, y, **kwargs):
    """``validate_data`` of ``fit(X, y)``. The rows of a memory-mapped file are checked for
    NaN and Inf by the ingest as it reads them, a block at a time (a
    :class:`~ooc_learn.NonFiniteError`, which is a ``ValueError``): scikit-learn's check
    would touch every page of the mapping, the whole file in the process's RSS."""
    from ooc_learn.storage.ingest_direct import file_mapping

    mapped = isinstance(X, np.ndarray) and file_mapping(X) is not None
    return validate_data(estimator, X, y, accept_sparse="csr", ensure_all_finite=not mapped,
                         **kwargs)


def _r2(y, pred) -> float:
    from sklearn.metrics import r2_score

    return float(r2_score(np.asarray(y, dtype=np.float64), pred))


def _is_store_like(X) -> bool:
    """A Store, or the path of a store folder (any other path is refused: see
    :func:`~ooc_learn.storage.store.is_store_path`)."""
    from ooc_learn.storage.store import Store, is_store_path

    return isinstance(X, Store) or is_store_path(X)


def _on_store(X, memory, fn):
    """``fn(store)`` with ``X`` a Store, or a store's path opened for the call."""
    from ooc_learn.storage.store import open_data

    store, opened = open_data(X, memory)
    try:
        return fn(store)
    finally:
        if opened:
            store.close()


class _SparseInput(BaseEstimator):
    """Every estimator here takes scipy sparse X (scikit-learn's input tag)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class _LinearEstimator(_SparseInput):
    """What the classifier and the regressor share: the two ways in, the fitted attributes."""

    def _bias(self) -> float:
        if self.fit_intercept:
            scaling = float(self.intercept_scaling)
            if not (np.isfinite(scaling) and scaling > 0):
                raise ValueError(f"intercept_scaling must be > 0 (the value of the constant "
                                 f"feature). Got {self.intercept_scaling!r}.")
            return scaling
        return 0.0

    def _fit_store(self, X, y):
        """Train on a store (Store or path); labels from the store."""
        if y is not None:
            raise ValueError("fit(store) takes the labels from the store; leave y out "
                             "(fit(store), not fit(store, y)).")
        from ooc_learn.storage.store import open_data

        store, opened = open_data(X, self.memory)
        try:
            model = self._train(store)
            self.n_features_in_ = store.n_features
        finally:
            if opened:
                store.close()
        return model

    def _fit_arrays(self, X, labels, task: str):
        """Ingest ``X`` with ``labels`` into a temporary store and train there."""
        from ooc_learn.api import ingest_arrays

        with tempfile.TemporaryDirectory(prefix="ooc-fit-", dir=self.temp_dir) as tmp:
            store = ingest_arrays(X, labels, Path(tmp) / "fit.store", task=task,
                                  build_index=self._needs_index(), memory=self.memory,
                                  seed=self.random_state)
            try:
                return self._train(store)
            finally:
                store.close()

    def _needs_index(self) -> bool:
        return False

    def _keep(self, model) -> None:
        self.model_ = model
        stats = model.meta.get("stats", {})
        self.n_iter_ = int(stats.get("outer_iterations", 1))


class LinearSVC(ClassifierMixin, _LinearEstimator):
    """The linear SVM classifier, trained out of core (LIBLINEAR's ``-s 3`` / ``-s 1``).

    Binary labels train one SVM; three or more classes train one against the rest each
    (``decision_function`` one column per class, ``predict`` the largest), as
    scikit-learn's LinearSVC and LIBLINEAR do.

    Parameters
    ----------
    C : float
        The cost (LIBLINEAR's ``-c``); larger fits the training rows harder.
    loss : "hinge" | "squared_hinge"
        The SVM's loss (hinge: LIBLINEAR ``-s 3``, IBCD's default; squared: ``-s 1``).
    solver : "ibcd" | "dcd" | "bm" | "pegasos"
        Indexed block coordinate descent over the store's metric-forest index (default),
        dual CD streaming every block, block minimisation, or PEGASOS.
    truncate : float or None
        IBCD's truncated loss ``min(L(z), 1 + truncate)`` (the paper uses 1; None: the convex
        loss).
    fit_intercept, intercept_scaling : bool, float
        Append a constant feature of value ``intercept_scaling`` (LIBLINEAR's ``-B``); its
        weight is regularised like the others.
    tol : float
        The stopping tolerance (LIBLINEAR's ``-e``, a projected-gradient spread).
    max_outer : int
        IBCD's outer iterations; dcd's epochs are 100 times it.
    block_size, sample_eps : int, float
        IBCD's rows asked of the index per step, and its sampled stopping rule (0: exact).
    memory : None, size string ("512M") or bytes
        The memory cap of a fit (None: the default cap of the machine).
    n_jobs : int
        Classes trained at once in threads (one-vs-rest).
    random_state : int
        Seeds the store's block shuffle, the index and the solvers.
    temp_dir : path, optional
        Where ``fit(X, y)`` writes its temporary store (default: the system's temp folder).

    Attributes
    ----------
    classes_ : ndarray
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_features_in_ : int
    n_iter_ : int
        Outer iterations of the (last) class's solver.
    model_ : LinearModel
        The engine's model: ``save``, streaming ``predict`` / ``score`` of a store.
    """

    def __init__(self, C=1.0, *, loss="hinge", solver="ibcd", truncate=None,
                 fit_intercept=True, intercept_scaling=1.0, tol=0.1, max_outer=10,
                 block_size=1000, sample_eps=0.0, memory=None, n_jobs=1, random_state=0,
                 temp_dir=None):
        self.C = C
        self.loss = loss
        self.solver = solver
        self.truncate = truncate
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.tol = tol
        self.max_outer = max_outer
        self.block_size = block_size
        self.sample_eps = sample_eps
        self.memory = memory
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.temp_dir = temp_dir

    def _needs_index(self) -> bool:
        return self.solver in (None, "ibcd")  # None: train's default, IBCD

    def _train(self, store):
        from ooc_learn.training import train

        if self.loss not in _LOSSES:
            raise ValueError(f"loss must be 'hinge' or 'squared_hinge'. Got {self.loss!r}.")
        if store.task not in ("binary", "multiclass"):
            raise ValueError(f"LinearSVC trains classification stores; {store.path} holds a "
                             f"{store.task} task (use LinearSVR).")
        return train(store, solver=self.solver, loss=_LOSSES[self.loss], C=self.C,
                     s=self.truncate, bias=self._bias(), eps=self.tol,
                     max_outer=self.max_outer, block_size=self.block_size,
                     sample_eps=self.sample_eps, seed=self.random_state, n_jobs=self.n_jobs)

    def fit(self, X, y=None):
        """Fit on ``(X, y)`` arrays or a sparse matrix, or on a store (``y`` left out)."""
        if _is_store_like(X):
            model = self._fit_store(X, y)
            names = model.meta.get("label_map", {}).get("names")
            self.classes_ = (np.asarray(names)[np.asarray(model.classes_, np.intp)] if names
                             else np.asarray(model.classes_))
        else:
            X, y = _validate_fit(self, X, y, dtype=[np.float64, np.float32])
            check_classification_targets(y)
            self.classes_, codes = np.unique(y, return_inverse=True)
            k = self.classes_.shape[0]
            if k < 2:
                raise ValueError(f"LinearSVC needs samples of at least 2 classes; the data "
                                 f"hold one class: {self.classes_[0]!r}.")
            if k == 2:
                model = self._fit_arrays(X, np.where(codes == 1, 1.0, -1.0), "binary")
            else:
                model = self._fit_arrays(X, codes.astype(np.float64), "multiclass")
        self._keep(model)
        coef = np.asarray(model.coef_, dtype=np.float64)
        self.coef_ = coef.reshape(-1, coef.shape[-1])
        self.intercept_ = np.atleast_1d(np.asarray(model.intercept_, dtype=np.float64))
        return self

    def decision_function(self, X):
        """Signed distances to the hyperplane: (n,) for two classes, (n, n_classes) else
        (``X`` a store: its rows in store order, streamed)."""
        check_is_fitted(self)
        if _is_store_like(X):
            return _on_store(X, self.memory, self.model_.decision_function)
        X = validate_data(self, X, accept_sparse="csr", reset=False,
                          dtype=[np.float64, np.float32])
        scores = np.asarray(X @ self.coef_.T, dtype=np.float64) + self.intercept_
        return scores.ravel() if scores.shape[1] == 1 else scores

    def score(self, X, y=None, sample_weight=None):
        """Mean accuracy on ``(X, y)``, or on a store (``y`` left out: its labels)."""
        if _is_store_like(X) and y is None and sample_weight is None:
            check_is_fitted(self)
            return _on_store(X, self.memory, self.model_.score)
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """The class of each row: ``classes_[1]`` where the decision value is > 0 (two
        classes), else the class of the largest value."""
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(np.intp)]
        return self.classes_[np.argmax(scores, axis=1)]

class LinearSVR(RegressorMixin, _LinearEstimator):
    """Linear support vector regression, trained out of core (LIBLINEAR's ``-s 13`` /
    ``-s 11``; least squares by the normal equations where the loss is squared and
    ``epsilon`` is 0 and the Gram matrix fits the cap).

    Parameters
    ----------
    epsilon : float
        The insensitive zone's half-width (LIBLINEAR's ``-p``).
    C : float
        The cost.
    loss : "epsilon_insensitive" | "squared_epsilon_insensitive"
    solver : None | "dcd" | "exact"
        Dual CD for SVR (LIBLINEAR -s 12 / 13), or the normal equations (least squares
        only); None picks as ``ooc-train`` does.
    tol : float
        The stopping tolerance, relative to the start's violation (LIBLINEAR's ``-e`` for
        SVR). The default is scikit-learn's LinearSVR's, 1e-4, not LIBLINEAR's 0.1: on
        scikit-learn's diabetes set, 0.1 stopped 1.15 % above the optimum (R^2 -0.48
        against -0.28), in about as long.
    fit_intercept, intercept_scaling, max_outer, memory, random_state, temp_dir :
        As :class:`LinearSVC`.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    n_features_in_, n_iter_, model_ : as :class:`LinearSVC`
    """

    def __init__(self, *, epsilon=0.0, C=1.0, loss="epsilon_insensitive", solver=None,
                 fit_intercept=True, intercept_scaling=1.0, tol=1e-4, max_outer=10,
                 memory=None, random_state=0, temp_dir=None):
        self.epsilon = epsilon
        self.C = C
        self.loss = loss
        self.solver = solver
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.tol = tol
        self.max_outer = max_outer
        self.memory = memory
        self.random_state = random_state
        self.temp_dir = temp_dir

    def _train(self, store):
        from ooc_learn.training import train

        if self.loss not in ("epsilon_insensitive", "squared_epsilon_insensitive"):
            raise ValueError("loss must be 'epsilon_insensitive' or "
                             f"'squared_epsilon_insensitive'. Got {self.loss!r}.")
        if store.task != "regression":
            raise ValueError(f"LinearSVR trains regression stores; {store.path} holds a "
                             f"{store.task} task (use LinearSVC).")
        return train(store, solver=self.solver, loss=self.loss, C=self.C,
                     epsilon=self.epsilon, bias=self._bias(), eps=self.tol,
                     max_outer=self.max_outer, seed=self.random_state)

    def fit(self, X, y=None):
        """Fit on ``(X, y)`` arrays or a sparse matrix, or on a store (``y`` left out)."""
        if _is_store_like(X):
            model = self._fit_store(X, y)
        else:
            X, y = _validate_fit(self, X, y, y_numeric=True, dtype=[np.float64, np.float32])
            model = self._fit_arrays(X, np.asarray(y, dtype=np.float64), "regression")
        self._keep(model)
        self.coef_ = np.asarray(model.coef_, dtype=np.float64).ravel()
        self.intercept_ = np.atleast_1d(np.asarray(model.intercept_, dtype=np.float64))
        return self

    def predict(self, X):
        """``X @ coef_ + intercept_`` (``X`` a store: its rows in store order, streamed)."""
        check_is_fitted(self)
        if _is_store_like(X):
            return _on_store(X, self.memory, self.model_.decision_function)
        X = validate_data(self, X, accept_sparse="csr", reset=False,
                          dtype=[np.float64, np.float32])
        return np.asarray(X @ self.coef_, dtype=np.float64).ravel() + self.intercept_[0]

    def score(self, X, y=None, sample_weight=None):
        """R² on ``(X, y)``, or on a store (``y`` left out: its targets, streamed)."""
        if _is_store_like(X) and y is None and sample_weight is None:
            from ooc_learn.model import regression_errors

            check_is_fitted(self)
            return _on_store(X, self.memory,
                             lambda st: regression_errors(self.model_, st)["r2"])
        return super().score(X, y, sample_weight=sample_weight)


class SparseRLS(RegressorMixin, _SparseInput):
    """Sparse regularised least squares (subset of regressors) with exact fast hold-out,
    k-fold and leave-one-out CV (Pahikkala et al. 2012), as a scikit-learn regressor.

    The solver is :class:`ooc_learn.rls.SparseRLS` (kept in ``model_``); this class adds
    scikit-learn's conventions: parameters stored as given and checked in ``fit``,
    ``random_state``, input validation, ``score`` (R²). Its CV methods (``loo_predict``,
    ``kfold_predict``, ``holdout_predict``, their ``_path`` forms, ``select_lambda``,
    ``set_lambda``, ``coef_path``) are the solver's, on the rows of the last ``fit``.

    Parameters
    ----------
    kernel, gamma, degree, coef0 : the kernel ("rbf", "linear" or "poly"); gamma None is
        1 / n_features.
    n_basis : int
        Basis rows drawn uniformly without replacement; all rows when there are fewer.
    basis : array of int, optional
        Explicit basis row positions.
    lam : float
        The regularisation parameter (> 0).
    jitter, cache_u, folds, memory : as the solver's (see :class:`ooc_learn.rls.SparseRLS`).
    random_state : int
        Seeds the basis draw and random folds.

    Attributes
    ----------
    dual_coef_ : ndarray (n_basis,) or (n_basis, n_targets)
        The basis rows' coefficients a (``predict(x) = k(x, X_B) a``).
    basis_ : ndarray of int
        The basis rows' positions in the training data.
    n_features_in_ : int
    model_ : ooc_learn.rls.SparseRLS

    Examples
    --------
    >>> import numpy as np
    >>> from ooc_learn import SparseRLS
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 3)); y = np.sin(X[:, 0])
    >>> reg = SparseRLS(n_basis=50, lam=0.01).fit(X, y)
    >>> loo = reg.loo_predict()                      # exact leave-one-out, O(m n)
    >>> bool(np.mean((loo - y) ** 2) < 0.05), bool(reg.score(X, y) > 0.9)
    (True, True)
    """

    def __init__(self, kernel="rbf", gamma=None, degree=3, coef0=1.0, n_basis=100,
                 basis=None, lam=1.0, jitter=1e-8, random_state=0, memory=None,
                 cache_u=True, folds=None):
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.n_basis = n_basis
        self.basis = basis
        self.lam = lam
        self.jitter = jitter
        self.random_state = random_state
        self.memory = memory
        self.cache_u = cache_u
        self.folds = folds

    def fit(self, X, y=None):
        """Fit on ``(X, y)`` (dense or sparse; ``y`` a vector or one column per target), or
        on a store (a :class:`~ooc_learn.Store`; labels from it unless ``y`` is given)."""
        from ooc_learn.rls.model import SparseRLS as _Solver
        from ooc_learn.storage.store import Store

        if isinstance(X, (str, Path)) and _is_store_like(X):
            raise ValueError("SparseRLS.fit takes an open store (ooc_learn.open_store(path)): "
                             "its CV methods read the rows again later.")
        if isinstance(X, Store):
            m = X.n_samples
            self.n_features_in_ = X.n_features
        else:
            X, y = validate_data(self, X, y, accept_sparse="csr", y_numeric=True,
                                 multi_output=True, dtype=[np.float64, np.float32])
            m = X.shape[0]
        n_basis = self.n_basis
        if self.basis is None and isinstance(n_basis, (int, np.integer)) and n_basis > m:
            n_basis = m
        old = getattr(self, "model_", None)
        if old is not None:
            old.close()  # its matrices' bytes back to the budget before the new fit
        self.model_ = _Solver(kernel=self.kernel, gamma=self.gamma, degree=self.degree,
                              coef0=self.coef0, n_basis=n_basis, basis=self.basis,
                              lam=self.lam, jitter=self.jitter, seed=self.random_state,
                              memory=self.memory, cache_u=self.cache_u, folds=self.folds)
        self.model_.fit(X, y)
        self._sync()
        return self

    def _sync(self) -> None:
        model = self.model_
        coef = model.coef_
        self.dual_coef_ = coef[:, 0] if model.vector_y_ else coef
        self.basis_ = model.basis_

    def predict(self, X):
        """``k(x, X_B) a`` for each row (chunked under the memory cap; ``X`` may be a
        store)."""
        check_is_fitted(self)
        if _is_store_like(X):
            return _on_store(X, self.memory, self.model_.predict)
        X = validate_data(self, X, accept_sparse="csr", reset=False,
                          dtype=[np.float64, np.float32])
        return self.model_.predict(X)

    def score(self, X, y=None, sample_weight=None):
        """R² on ``(X, y)``, or on a store (``y`` left out: its targets)."""
        if _is_store_like(X) and y is None and sample_weight is None:
            check_is_fitted(self)
            return _on_store(X, self.memory, lambda st: _r2(st.labels(), self.model_.predict(st)))
        return super().score(X, y, sample_weight=sample_weight)

    # -- the solver's fast CV, on the rows of the last fit --------------------------------
    def set_lambda(self, lam):
        """Switch to another lambda in O(n² v) (no refit); ``lam`` is set too."""
        check_is_fitted(self)
        self.model_.set_lambda(lam)
        self.lam = self.model_.lam
        self._sync()
        return self

    def select_lambda(self, lams, cv="loo", metric="mse", basis_mode="remove"):
        """Pick lambda by exact LOO or k-fold CV; this estimator is switched to the best."""
        check_is_fitted(self)
        result = self.model_.select_lambda(lams, cv=cv, metric=metric, basis_mode=basis_mode)
        self.lam = self.model_.lam
        self._sync()
        return result

    def loo_predict(self, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.loo_predict(basis_mode)

    def loo_predict_path(self, lams, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.loo_predict_path(lams, basis_mode)

    def kfold_predict(self, folds=10, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.kfold_predict(folds, basis_mode)

    def kfold_predict_path(self, folds, lams, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.kfold_predict_path(folds, lams, basis_mode)

    def holdout_predict(self, H, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.holdout_predict(H, basis_mode)

    def holdout_predict_path(self, H, lams, basis_mode="remove"):
        check_is_fitted(self)
        return self.model_.holdout_predict_path(H, lams, basis_mode)

    def coef_path(self, lams):
        check_is_fitted(self)
        return self.model_.coef_path(lams)

    def close(self) -> None:
        """Give the fitted matrices' bytes back to the memory budget."""
        model = getattr(self, "model_", None)
        if model is not None:
            model.close()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags
