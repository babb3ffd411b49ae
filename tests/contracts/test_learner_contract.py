"""The contract every TreeCV learner must pass (``ooc_learn.learners.base``).

A new learner is added as one line of ``LEARNERS``; it must then pass every test here, on
dense and CSR input. What TreeCV relies on, and so what is checked:

* it is an ``IncrementalLearner`` (the runtime-checkable protocol);
* ``copy`` is independent: updating the copy leaves the original bit-identical, and vice versa;
* ``update(model, X, y, order)`` equals ``update(model, X[order], y[order])``, and rows outside
  ``order`` are not used;
* ``update`` leaves ``X``, ``y`` and ``order`` as they were;
* ``score`` is the sum of ``losses``, so it adds over disjoint rows (fold scores of unequal
  folds average correctly);
* ``nbytes`` is at least the bytes of the model's arrays (what the memory budget is charged);
* ``save`` / ``update`` / ``revert`` restores the exact model (learners that implement
  ``SaveRevertLearner`` only);
* the same inputs give the identical model (no hidden randomness);
* an unknown metric name is refused with ``ParameterError``.
"""
import copy
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import SGDClassifier, SGDRegressor

from ooc_learn.learners import (ExactLeastSquares, IncrementalLearner, LeastSquaresSGD,
                                OneVsRest, Pegasos, SaveRevertLearner, SklearnPartialFit)
from ooc_learn.storage.errors import ParameterError

# ---------------------------------------------------------------------------------------------
# THE TABLE: every learner, as (factory, task). Add a new learner here, in one line.
LEARNERS = {
    "pegasos": (lambda: Pegasos(lam=1e-2), "binary"),
    "pegasos-projected": (lambda: Pegasos(lam=1e-2, project=True), "binary"),
    "lsq-sgd": (lambda: LeastSquaresSGD(), "regression"),
    "exact-ls": (lambda: ExactLeastSquares(ridge=1e-3), "regression"),
    "sklearn-sgd-classifier": (lambda: SklearnPartialFit(SGDClassifier(random_state=0),
                                                         classes=[-1.0, 1.0]), "binary"),
    "sklearn-sgd-regressor": (lambda: SklearnPartialFit(SGDRegressor(random_state=0)),
                              "regression"),
    "pegasos-one-vs-rest": (lambda: OneVsRest(Pegasos(lam=1e-2), [0, 1, 2]), "multiclass"),
}
# ---------------------------------------------------------------------------------------------

N, D = 80, 6


@pytest.fixture(params=sorted(LEARNERS))
def learner_case(request):
    factory, task = LEARNERS[request.param]
    return factory(), task


@pytest.fixture(params=["dense", "csr"])
def layout(request):
    return request.param


def _data(task, layout, seed=3):
    """n x d float32 rows with an all-zero row and a duplicate; +-1 labels, classes 0, 1, 2
    or real targets."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)).astype(np.float32)
    X[rng.random((N, D)) < 0.3] = 0.0
    X[5] = 0.0
    X[9] = X[8]
    w = rng.standard_normal(D)
    y = X.astype(np.float64) @ w + 0.1 * rng.standard_normal(N)
    if task == "binary":
        y = np.where(y > 0, 1.0, -1.0)
    elif task == "multiclass":
        y = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3])).astype(np.float64)
    else:
        y = (y - y.min()) / (y.max() - y.min())  # in [0, 1], as LeastSquaresSGD's paper setting
    return (sp.csr_matrix(X) if layout == "csr" else X), y


def _fit(learner, X, y, order=None):
    # n_samples is the whole data set's size (LeastSquaresSGD's step depends on it)
    return learner.update(learner.init(D, N), X, y, order)


def _state(model) -> bytes:
    """The model's complete state as bytes: equal bytes, identical model."""
    return pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)


def _array_bytes(obj, depth=0, seen=None) -> int:
    """Bytes of the numpy arrays a model holds (walking attributes and containers)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes if obj.dtype != object else 0
    if isinstance(obj, dict):
        return sum(_array_bytes(v, depth + 1, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_array_bytes(v, depth + 1, seen) for v in obj)
    fields = dict(getattr(obj, "__dict__", {}))
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            fields[name] = getattr(obj, name)
    return sum(_array_bytes(v, depth + 1, seen) for v in fields.values())


def test_is_an_incremental_learner(learner_case):
    learner, _ = learner_case
    assert isinstance(learner, IncrementalLearner)
    assert learner.default_metric in learner.metrics


def test_copy_is_independent(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    # the second batch contradicts the first, so an update that leaks shows in predictions
    y2 = {"binary": -y, "multiclass": (y + 1) % 3}.get(task, 1.0 - y)
    model = _fit(learner, X[:40], y[:40])
    before, before_state = learner.predict(model, X), _state(model)

    dup = learner.copy(model)
    learner.update(dup, X, y2)
    # updating the copy left the original as it was
    assert np.array_equal(learner.predict(model, X), before)
    assert _state(model) == before_state
    # the check has teeth: the update did change the copy
    assert not np.array_equal(learner.predict(dup, X), before)

    dup = learner.copy(model)
    dup_before, dup_state = learner.predict(dup, X), _state(dup)
    learner.update(model, X, y2)
    # and updating the original leaves the copy
    assert np.array_equal(learner.predict(dup, X), dup_before)
    assert _state(dup) == dup_state


def test_update_with_order_equals_update_of_reordered_rows(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    order = np.random.default_rng(11).permutation(N)[:N - 15]  # a shuffled proper subset
    via_order = _fit(learner, X, y, order)
    via_rows = _fit(learner, X[order], y[order])
    assert np.array_equal(learner.predict(via_order, X), learner.predict(via_rows, X))
    assert _state(via_order) == _state(via_rows)
    # rows outside ``order`` are not fed: the model differs from one fed every row
    assert not np.array_equal(learner.predict(via_order, X),
                              learner.predict(_fit(learner, X, y), X))


def test_update_leaves_its_inputs_untouched(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    order = np.arange(N)[::-1].copy()
    X0, y0, order0 = copy.deepcopy(X), y.copy(), order.copy()
    _fit(learner, X, y, order)
    if sp.issparse(X):
        assert (X != X0).nnz == 0 and np.array_equal(X.indptr, X0.indptr)
    else:
        assert np.array_equal(X, X0)
    assert np.array_equal(y, y0) and np.array_equal(order, order0)


def test_score_is_the_sum_of_row_losses(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    model = _fit(learner, X[:50], y[:50])
    a, b = np.arange(0, 30), np.arange(30, N)  # disjoint, unequal parts of the rows
    for metric in learner.metrics:
        total = learner.score(model, X, y, metric)
        per_row = learner.losses(y, learner.predict(model, X), metric)
        assert per_row.shape == (N,)
        assert total == pytest.approx(per_row.sum(), rel=1e-12, abs=1e-12)
        parts = learner.score(model, X[a], y[a], metric) + learner.score(model, X[b], y[b], metric)
        # 1e-6, not 1e-12: scikit-learn keeps float32 coefficients for float32 rows, and BLAS
        # rounds a batch's float32 products differently from its parts' (~1e-7 relative)
        assert total == pytest.approx(parts, rel=1e-6, abs=1e-9)
    assert learner.score(model, X, y) == learner.score(model, X, y, learner.default_metric)
    # a callable metric is a per-row loss too
    absolute = learner.score(model, X, y, lambda yy, f: np.abs(f - yy))
    assert absolute == pytest.approx(np.abs(learner.predict(model, X) - y).sum(), rel=1e-12)


def test_nbytes_covers_the_model_arrays(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    model = _fit(learner, X, y)
    held = _array_bytes(model)
    assert held > 0
    assert learner.nbytes(model) >= held


def test_save_update_revert_restores_the_exact_model(learner_case, layout):
    learner, task = learner_case
    if not isinstance(learner, SaveRevertLearner):
        pytest.skip(f"{type(learner).__name__} branches by copy (no save/revert)")
    X, y = _data(task, layout)
    model = _fit(learner, X[:40], y[:40])
    before, before_state = learner.predict(model, X), _state(model)
    token = learner.save(model)
    model = learner.update(model, X[40:], y[40:])
    assert not np.array_equal(learner.predict(model, X), before)
    model = learner.revert(model, token)
    assert np.array_equal(learner.predict(model, X), before)
    assert _state(model) == before_state


def test_same_inputs_give_the_identical_model(learner_case, layout):
    learner, task = learner_case
    X, y = _data(task, layout)
    order = np.random.default_rng(5).permutation(N)
    first = _fit(learner, X, y, order)
    again = _fit(learner, X, y, order)
    assert _state(first) == _state(again)
    assert np.array_equal(learner.predict(first, X), learner.predict(again, X))


def test_unknown_metric_is_refused(learner_case):
    learner, task = learner_case
    X, y = _data(task, "dense")
    model = _fit(learner, X, y)
    with pytest.raises(ParameterError, match="metric"):
        learner.score(model, X, y, "no-such-metric")
