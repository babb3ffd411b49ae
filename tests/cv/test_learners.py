"""Incremental learners: numba kernels against slow, obviously-correct Python references."""

import copy

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.learners import (ExactLeastSquares, IncrementalLearner, LeastSquaresSGD, Pegasos,
                                SklearnPartialFit)
from ooc_learn.storage.errors import ParameterError


def _data(rng, n=120, d=6, sparse=False, binary=False):
    X = rng.standard_normal((n, d)).astype(np.float32)
    X[rng.random((n, d)) < 0.4] = 0.0
    X[3] = 0.0  # an all-zero row
    X[7] = X[6]  # a duplicate
    w = rng.standard_normal(d)
    y = X.astype(np.float64) @ w + 0.1 * rng.standard_normal(n)
    if binary:
        y = np.where(y > 0, 1.0, -1.0)
    return (sp.csr_matrix(X) if sparse else X), y


def pegasos_reference(X, y, lam, project):
    """Shalev-Shwartz et al. 2011, Fig. 1, k = 1, rows in the given order, explicit w."""
    X = X.toarray() if sp.issparse(X) else X
    w = np.zeros(X.shape[1])
    for t, (x, yi) in enumerate(zip(X.astype(np.float64), y), start=1):
        eta = 1.0 / (lam * t)
        hit = yi * (w @ x) < 1
        w = (1 - eta * lam) * w + (eta * yi * x if hit else 0.0)
        if project:
            w *= min(1.0, (1 / np.sqrt(lam)) / max(np.linalg.norm(w), 1e-300))
    return w


def lsq_reference(X, y, alpha, radius):
    """Nemirovski et al. 2009 robust SA, constant step, average of w_1..w_N, projection."""
    X = X.toarray() if sp.issparse(X) else X
    w = np.zeros(X.shape[1])
    total = np.zeros_like(w)
    for x, yi in zip(X.astype(np.float64), y):
        total += w
        w = w - alpha * (w @ x - yi) * x
        nrm = np.linalg.norm(w)
        if nrm > radius:
            w *= radius / nrm
    return total / len(y)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("project,lam", [(True, 0.05), (False, 0.05), (True, 2.0)])
def test_pegasos_equals_reference(rng, sparse, project, lam):
    X, y = _data(rng, sparse=sparse, binary=True)
    p = Pegasos(lam, project=project)
    m = p.update(p.init(X.shape[1], X.shape[0]), X, y)
    np.testing.assert_allclose(p.coef(m), pegasos_reference(X, y, lam, project),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("radius", [1.0, 0.05])
def test_lsqsgd_equals_reference(rng, sparse, radius):
    X, y = _data(rng, sparse=sparse)
    y = y / np.abs(y).max()
    lrn = LeastSquaresSGD(radius=radius)
    m = lrn.update(lrn.init(X.shape[1], X.shape[0]), X, y)
    ref = lsq_reference(X, y, 1 / np.sqrt(X.shape[0]), radius)
    np.testing.assert_allclose(lrn.coef(m), ref, rtol=1e-9, atol=1e-12)


def test_lsqsgd_renormalisation_keeps_the_average(rng):
    # a tiny radius forces a projection every step, driving the scale factor below 1e-6
    X, y = _data(rng, n=400)
    lrn = LeastSquaresSGD(step=0.5, radius=1e-4)
    m = lrn.update(lrn.init(X.shape[1], X.shape[0]), X, y)
    np.testing.assert_allclose(lrn.coef(m), lsq_reference(X, y, 0.5, 1e-4), rtol=1e-8,
                               atol=1e-14)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("ridge", [0.0, 0.3])
def test_exact_least_squares_equals_closed_form(rng, sparse, ridge):
    X, y = _data(rng, sparse=sparse)
    e = ExactLeastSquares(ridge)
    m = e.update(e.init(X.shape[1]), X, y)
    Xd = (X.toarray() if sparse else X).astype(np.float64)
    ref = np.linalg.solve(Xd.T @ Xd + ridge * np.eye(Xd.shape[1]), Xd.T @ y)
    np.testing.assert_allclose(e.coef(m), ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("learner", [Pegasos(0.1), LeastSquaresSGD(), ExactLeastSquares(0.1)])
def test_order_copy_and_blocks(rng, learner):
    X, y = _data(rng, binary=isinstance(learner, Pegasos))
    order = rng.permutation(X.shape[0])
    a = learner.update(learner.init(X.shape[1], X.shape[0]), X, y, order=order)
    b = learner.update(learner.init(X.shape[1], X.shape[0]), X[order], y[order])
    np.testing.assert_array_equal(a, b)
    # feeding in two blocks equals one pass; a copy is independent of its source
    c = learner.update(learner.init(X.shape[1], X.shape[0]), X[:50], y[:50])
    c2 = learner.copy(c)
    learner.update(c, X[50:], y[50:])
    np.testing.assert_array_equal(c, learner.update(learner.init(X.shape[1], X.shape[0]), X, y))
    assert not np.array_equal(c2, c)
    assert isinstance(learner, IncrementalLearner)


def test_score_is_a_sum_of_per_row_losses(rng):
    X, y = _data(rng, binary=True)
    p = Pegasos(0.1)
    m = p.update(p.init(X.shape[1], X.shape[0]), X[:60], y[:60])
    f = X[60:].astype(np.float64) @ p.coef(m)
    assert p.score(m, X[60:], y[60:]) == pytest.approx(np.sum(np.where(f > 0, 1, -1) != y[60:]), abs=0)
    assert p.score(m, X[60:], y[60:], "hinge") == pytest.approx(
        np.maximum(0, 1 - y[60:] * f).sum(), rel=1e-6)
    with pytest.raises(ParameterError, match="'metric' parameter"):
        p.score(m, X, y, metric="auc")


def test_sklearn_adapter_matches_partial_fit(rng):
    from sklearn.naive_bayes import MultinomialNB

    X = rng.integers(0, 5, size=(80, 4)).astype(np.float64)
    y = rng.integers(0, 3, size=80)
    ad = SklearnPartialFit(MultinomialNB(), classes=[0, 1, 2])
    m = ad.update(ad.init(4, 80), X[:40], y[:40])
    m2 = ad.copy(m)
    ad.update(m, X[40:], y[40:])
    ref = MultinomialNB().partial_fit(X[:40], y[:40], classes=[0, 1, 2]).partial_fit(X[40:],
                                                                                      y[40:])
    np.testing.assert_array_equal(ad.predict(m, X), ref.predict(X))
    np.testing.assert_allclose(m.estimator.feature_count_, ref.feature_count_, rtol=0)
    assert m2.estimator.feature_count_.sum() < m.estimator.feature_count_.sum()
    assert ad.score(m, X, y) == np.sum(ref.predict(X) != y)


@pytest.mark.parametrize("make,match", [
    (lambda: Pegasos(0.0), "'lam' parameter of Pegasos must be > 0"),
    (lambda: Pegasos(-1.0), "Got -1.0 instead"),
    (lambda: LeastSquaresSGD(step=-0.1), "'step' parameter of LeastSquaresSGD"),
    (lambda: LeastSquaresSGD(radius=0), "'radius' parameter of LeastSquaresSGD"),
    (lambda: ExactLeastSquares(ridge=-1), "'ridge' parameter of ExactLeastSquares"),
    (lambda: SklearnPartialFit(object()), "must have a partial_fit method"),
])
def test_bad_parameters(make, match):
    with pytest.raises(ParameterError, match=match):
        make()


def test_sklearn_classifier_needs_classes():
    from sklearn.linear_model import SGDClassifier

    with pytest.raises(ParameterError, match="'classes' parameter of SklearnPartialFit"):
        SklearnPartialFit(SGDClassifier())


def test_feature_mismatch(rng):
    p = Pegasos(0.1)
    with pytest.raises(ParameterError, match="X has 3 features but the model"):
        p.update(p.init(4, 10), np.zeros((2, 3), np.float32), np.ones(2))


def test_inputs_not_mutated(rng):
    X, y = _data(rng, binary=True)
    X0, y0 = X.copy(), y.copy()
    p = Pegasos(0.1)
    p.update(p.init(X.shape[1], X.shape[0]), X, y)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
    assert copy.deepcopy(p).lam == p.lam
