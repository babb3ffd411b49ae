"""TreeCV (Joulani et al. 2015, Algorithm 1) against standard k-fold CV and brute force."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.cv.folds import array_fold_bounds, store_fold_bounds
from ooc_learn.cv.kfold import kfold_cv
from ooc_learn.cv.treecv import tree_cv
from ooc_learn.learners import ExactLeastSquares, LeastSquaresSGD, Pegasos, SklearnPartialFit
from ooc_learn.storage.errors import BudgetExceededError, ParameterError

from _treecv_reference import brute_force_scores, tree_updates

KS = [2, 3, 5, 10, 17, "loo"]


def _regression(rng, n=97, d=5, sparse=False):
    X = rng.standard_normal((n, d)).astype(np.float32)
    X[rng.random((n, d)) < 0.3] = 0.0
    X[4] = 0.0
    X[9] = X[8]
    y = X.astype(np.float64) @ rng.standard_normal(d) + 0.5 * rng.standard_normal(n)
    return (sp.csr_matrix(X) if sparse else X), y


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("block_rows", [None, 10])
def test_exact_least_squares_tree_equals_standard(rng, sparse, k, block_rows):
    X, y = _regression(rng, sparse=sparse)
    lrn = ExactLeastSquares(0.5)
    t = tree_cv((X, y), lrn, k, _block_rows=block_rows)
    s = kfold_cv((X, y), lrn, k)
    kk = len(y) if k == "loo" else k
    bounds = array_fold_bounds(len(y), kk)
    # order independent learner: TreeCV is exact (paper sec. 3.1); 1e-10 as the issue asks
    np.testing.assert_allclose(t.fold_scores, s.fold_scores, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t.fold_scores, brute_force_scores(X, y, bounds, 0.5),
                               rtol=1e-9, atol=1e-12)
    assert t.estimate == pytest.approx(s.estimate, rel=1e-10)
    np.testing.assert_array_equal(t.folds, np.repeat(np.arange(kk), np.diff(bounds)))
    np.testing.assert_array_equal(t.folds, s.folds)
    np.testing.assert_allclose(t.predictions, s.predictions, rtol=1e-9, atol=1e-12)
    sizes = list(np.diff(bounds))
    assert t.stats["updates"] == tree_updates(sizes)
    assert t.stats["updates"] <= len(y) * math.ceil(math.log2(kk))
    assert s.stats["updates"] == (kk - 1) * len(y)


def test_randomized_exact_is_still_exact(rng):
    X, y = _regression(rng)
    lrn = ExactLeastSquares(0.5)
    for k in (5, "loo"):
        t = tree_cv((X, y), lrn, k, randomized=True, seed=3)
        t2 = tree_cv((X, y), lrn, k, randomized=True, seed=3, _block_rows=7)
        s = kfold_cv((X, y), lrn, k, randomized=True, seed=4)
        np.testing.assert_allclose(t.fold_scores, s.fold_scores, rtol=1e-10)
        np.testing.assert_allclose(t2.fold_scores, s.fold_scores, rtol=1e-10)


def test_shuffle_permutes_rows_before_folding(rng):
    X, y = _regression(rng)
    t = tree_cv((X, y), ExactLeastSquares(0.5), 4, shuffle=True, seed=11)
    perm = np.random.default_rng(11).permutation(len(y))
    bounds = array_fold_bounds(len(y), 4)
    np.testing.assert_allclose(t.fold_scores,
                               brute_force_scores(X[perm], y[perm], bounds, 0.5), rtol=1e-9)
    expect = np.empty(len(y), int)
    expect[perm] = np.repeat(np.arange(4), np.diff(bounds))
    np.testing.assert_array_equal(t.folds, expect)  # folds are indexed by original row


class Recorder:
    """A Python learner whose model is the list of rows it was fed (to check the tree order)."""

    default_metric = "squared"
    metrics = ("squared",)

    def init(self, n_features, n_samples):
        return []

    def update(self, model, X, y, order=None):
        rows = X[:, 0] if order is None else X[order, 0]
        model.extend(int(r) for r in rows)
        return model

    def copy(self, model):
        return list(model)

    def predict(self, model, X):
        self.seen[int(X[0, 0])] = list(model)
        return np.zeros(X.shape[0])

    def losses(self, y, pred, metric):
        return np.zeros(len(y))

    def nbytes(self, model):
        return 8 * (len(model) + 1)


class SaveRevertRecorder(Recorder):
    def save(self, model):
        return len(model)

    def revert(self, model, token):
        del model[token:]
        return model


@pytest.mark.parametrize("cls", [Recorder, SaveRevertRecorder])
def test_training_order_is_algorithm_1(cls):
    # Figure 1 of the paper: LOOCV on z1..z4; the model testing z1 learned z3, z4, then z2
    lrn = cls()
    lrn.seen = {}
    X = np.arange(4, dtype=np.float32).reshape(-1, 1)
    tree_cv((X, np.zeros(4)), lrn, "loo")
    assert lrn.seen == {0: [2, 3, 1], 1: [2, 3, 0], 2: [0, 1, 3], 3: [0, 1, 2]}
    lrn.seen = {}
    X = np.arange(23, dtype=np.float32).reshape(-1, 1)
    r = tree_cv((X, np.zeros(23)), lrn, 7)
    bounds = array_fold_bounds(23, 7)
    for i in range(7):
        held = set(range(bounds[i], bounds[i + 1]))
        fed = lrn.seen[bounds[i]]
        assert sorted(fed) == sorted(set(range(23)) - held)
    assert r.stats["updates"] == tree_updates(list(np.diff(bounds)))


@pytest.mark.parametrize("k", [2, 8, 100, 1000])
def test_saved_models_stay_logarithmic(rng, k):
    X = rng.standard_normal((1000, 3)).astype(np.float32)
    y = np.where(rng.random(1000) < 0.5, 1.0, -1.0)
    bound = math.ceil(math.log2(k)) + 2
    for block_rows in (None, 64):  # in one numba call / Python recursion over 16 blocks
        r = tree_cv((X, y), Pegasos(0.01), k, _block_rows=block_rows)
        assert 2 <= r.stats["models_saved_max"] <= bound
    lrn = Recorder()
    lrn.seen = {}
    r = tree_cv((np.arange(1000, dtype=np.float32).reshape(-1, 1), y), lrn, k)
    assert r.stats["models_saved_max"] <= math.ceil(math.log2(k)) + 1


def test_pegasos_and_lsqsgd_close_to_standard_over_seeds():
    # paper Table 2: TreeCV and standard CV agree within a few standard deviations
    rng = np.random.default_rng(7)
    n, d = 1200, 8
    X = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d)
    yc = np.where(X @ w + 0.8 * rng.standard_normal(n) > 0, 1.0, -1.0)
    yr = X @ w / 10 + 0.05 * rng.standard_normal(n)
    for lrn, y in ((Pegasos(1e-3), yc), (LeastSquaresSGD(), yr)):
        tree, std = [], []
        for seed in range(12):
            tree.append(tree_cv((X, y), lrn, 10, randomized=True, seed=seed, shuffle=True)
                        .estimate)
            std.append(kfold_cv((X, y), lrn, 10, randomized=True, seed=seed, shuffle=True)
                       .estimate)
        tree, std = np.array(tree), np.array(std)
        spread = np.sqrt(tree.var(ddof=1) / len(tree) + std.var(ddof=1) / len(std))
        assert abs(tree.mean() - std.mean()) < 4 * spread + 1e-3 * abs(std.mean())


def test_sklearn_adapter_equals_sklearn_cross_validation(rng):
    from sklearn.model_selection import KFold, cross_val_score
    from sklearn.naive_bayes import MultinomialNB

    X = rng.poisson(2.0, size=(150, 6)).astype(np.float64)
    y = (X[:, 0] + X[:, 1] + rng.integers(0, 3, 150) > 5).astype(int)
    for k in (3, 7):
        acc = cross_val_score(MultinomialNB(), X, y, cv=KFold(k))
        ad = SklearnPartialFit(MultinomialNB(), classes=[0, 1])
        r = tree_cv((sp.csr_matrix(X), y), ad, k, _block_rows=20)
        # counts are sums of integers: order independent, hence exactly equal
        np.testing.assert_allclose(r.fold_scores, 1 - acc, rtol=0, atol=1e-12)
        assert r.metric == "error"


def test_callable_metric_and_predictions(rng):
    X, y = _regression(rng)
    r = tree_cv((X, y), ExactLeastSquares(0.5), 5,
                metric=lambda yt, f: np.abs(f - yt) ** 3)
    bounds = array_fold_bounds(len(y), 5)
    manual = [np.mean(np.abs(r.predictions[a:b] - y[a:b]) ** 3)
              for a, b in zip(bounds[:-1], bounds[1:])]
    np.testing.assert_allclose(r.fold_scores, manual, rtol=1e-12)
    assert r.metric == "<lambda>"


@pytest.mark.parametrize("k,match", [
    (1, "'k' parameter of tree_cv must be >= 2. Got 1"),
    (0, "must be >= 2"),
    (98, "must be <= the number of rows \\(97\\). Got 98"),
    ("all", "must be an int >= 2 or 'loo'"),
    (2.5, "must be an int >= 2 or 'loo'"),
    (True, "must be an int >= 2 or 'loo'"),
])
def test_bad_k(rng, k, match):
    X, y = _regression(rng)
    with pytest.raises(ParameterError, match=match):
        tree_cv((X, y), ExactLeastSquares(), k)
    with pytest.raises(ParameterError, match=match.replace("tree_cv", "kfold_cv")):
        kfold_cv((X, y), ExactLeastSquares(), k)


def test_bad_inputs(rng):
    X, y = _regression(rng)
    with pytest.raises(ParameterError, match="'metric' parameter of tree_cv"):
        tree_cv((X, y), ExactLeastSquares(), 3, metric="error")
    with pytest.raises(ParameterError, match="'data' parameter of tree_cv"):
        tree_cv(X, ExactLeastSquares(), 3)
    with pytest.raises(ParameterError, match="y must be 1-D with one label per row"):
        tree_cv((X, y[:-1]), ExactLeastSquares(), 3)
    with pytest.raises(ParameterError, match="'learner' parameter of tree_cv"):
        tree_cv((X, y), object(), 3)
    with pytest.raises(ParameterError, match="'n_jobs' parameter of tree_cv"):
        tree_cv((X, y), ExactLeastSquares(), 3, n_jobs=0)


def test_store_folds_with_empty_blocks_are_refused():
    with pytest.raises(ParameterError, match="fold 1 would hold no rows"):
        store_fold_bounds(np.array([0, 5, 5, 9]), 3)
    b = store_fold_bounds(np.array([0, 5, 5, 9]), 9)
    assert list(np.diff(b)) == [1] * 9


def test_store_fold_bounds_follow_blocks():
    offs = np.array([0, 30, 61, 90, 120])
    np.testing.assert_array_equal(store_fold_bounds(offs, 2), [0, 61, 120])
    np.testing.assert_array_equal(store_fold_bounds(offs, 4), offs)
    b = store_fold_bounds(offs, 10)
    assert set(offs) <= set(b)  # no fold straddles a block boundary
    assert len(b) == 11 and np.all(np.diff(b) > 0)


def test_memory_cap_too_small(rng):
    X, y = _regression(rng, d=40)
    with pytest.raises(BudgetExceededError, match="TreeCV"):
        tree_cv((X, y), ExactLeastSquares(), 8, memory=20000)


def test_parallel_branches_equal_sequential(rng):
    X = rng.standard_normal((600, 4)).astype(np.float32)
    y = np.where(X[:, 0] + 0.5 * rng.standard_normal(600) > 0, 1.0, -1.0)
    seq = tree_cv((X, y), Pegasos(0.01), 10)
    par = tree_cv((X, y), Pegasos(0.01), 10, n_jobs=2)
    np.testing.assert_array_equal(par.fold_scores, seq.fold_scores)
    np.testing.assert_array_equal(par.folds, seq.folds)
    assert par.stats["updates"] == seq.stats["updates"]


def test_tree_cv_progress_bar_goes_to_stderr_and_changes_nothing(capsys):
    import numpy as np

    from ooc_learn.cv.treecv import tree_cv
    from ooc_learn.learners import ExactLeastSquares

    X = np.random.default_rng(0).normal(size=(200, 3))
    y = X @ [1.0, 2.0, 3.0]
    quiet = tree_cv((X, y), ExactLeastSquares(1e-8), k=10)
    shown = tree_cv((X, y), ExactLeastSquares(1e-8), k=10, progress=True)
    assert shown.estimate == quiet.estimate and "tree_cv" in capsys.readouterr().err


def _three_classes(rng, n=900):
    centers = np.array([[3.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 3.0, 0]])
    y = rng.integers(0, 3, n).astype(np.float64)
    X = (centers[y.astype(int)] + rng.standard_normal((n, 4))).astype(np.float32)
    return X, y


def test_pegasos_on_class_labels_trains_one_model_per_class(rng):
    """Labels 0, 1, 2 are not signs: CV of Pegasos runs one model per class (one-vs-rest,
    the class of the largest decision value). k-fold equals the same models built by hand;
    TreeCV lands near it, in parallel equals itself sequential."""
    from ooc_learn.learners import OneVsRest

    X, y = _three_classes(rng)
    lrn = Pegasos(1e-3)
    std = kfold_cv((X, y), lrn, 5)
    assert std.stats["one_vs_rest_classes"] == [0.0, 1.0, 2.0]
    bounds = array_fold_bounds(len(y), 5)
    for i in range(5):
        train = np.r_[0:bounds[i], bounds[i + 1]:len(y)]
        dec = []
        for c in (0.0, 1.0, 2.0):
            m = lrn.update(lrn.init(4, len(y)), X, np.where(y == c, 1.0, -1.0), order=train)
            dec.append(lrn.predict(m, X[bounds[i]:bounds[i + 1]]))
        pred = np.argmax(np.column_stack(dec), axis=1)
        assert std.fold_scores[i] == np.mean(pred != y[bounds[i]:bounds[i + 1]])
    assert std.estimate < 0.1  # well-separated blobs; chance is 2/3
    tree = tree_cv((X, y), lrn, 5)
    assert abs(tree.estimate - std.estimate) < 0.05
    # the subtrees in one numba call a class (one block) = the Python recursion over blocks
    assert tree.stats["kernel_subtrees"] == 1
    python = tree_cv((X, y), lrn, 5, _block_rows=50)
    assert "kernel_subtrees" not in python.stats
    np.testing.assert_array_equal(python.fold_scores, tree.fold_scores)
    np.testing.assert_array_equal(python.predictions, tree.predictions)
    for k in (20, "loo"):  # and with folds inside blocks, both ways
        np.testing.assert_array_equal(tree_cv((X, y), lrn, k).predictions,
                                      tree_cv((X, y), lrn, k, _block_rows=64).predictions)
    np.testing.assert_array_equal(tree_cv((X, y), lrn, 5, n_jobs=2).fold_scores,
                                  tree.fold_scores)
    assert set(np.unique(tree.predictions)) <= {0.0, 1.0, 2.0}
    # a notebook shows the figures, not the 900 per-row values
    assert repr(tree).startswith(f"CVResult(error={tree.estimate:.6g}, method='tree', k=5")
    assert len(repr(tree)) < 200
    # +1 / -1 labels stay one model; OneVsRest by hand gives the k-fold above
    yb = np.where(y == 1, 1.0, -1.0)
    assert "one_vs_rest_classes" not in kfold_cv((X, yb), lrn, 5).stats
    assert kfold_cv((X, y), OneVsRest(lrn, [0, 1, 2]), 5).estimate == std.estimate
    with pytest.raises(ParameterError, match="metric"):
        kfold_cv((X, y), lrn, 5, metric="hinge")
    # real targets are not classes: refused, naming the regression learners
    with pytest.raises(ParameterError, match="learns classes") as exc:
        tree_cv((X, y + 0.5), lrn, 5)
    assert "LeastSquaresSGD" in exc.value.hint


def test_pegasos_treecv_of_a_multiclass_store_and_its_class_view(tmp_path, rng, capsys):
    import json

    from ooc_learn.api import ingest_arrays
    from ooc_learn.cli import train_main
    from ooc_learn.storage.store import open_store

    X, y = _three_classes(rng, 1500)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=3, task="multiclass").close()
    assert train_main([str(tmp_path / "s"), "--cv", "5", "--cv-method", "tree", "--solver",
                       "pegasos", "--lam", "1e-3", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"] < 0.1 and out["stats"]["one_vs_rest_classes"] == [0.0, 1.0, 2.0]
    with open_store(tmp_path / "s", positive=2) as view:  # one class: +1 / -1, one model
        r = tree_cv(view, Pegasos(1e-3), 5)
    assert "one_vs_rest_classes" not in r.stats and r.estimate < 0.1
    # a scikit-learn classifier's classes are the store's labels: names are refused, saying
    # which to pass (scikit-learn's "classes should include all valid labels" did not)
    from sklearn.linear_model import SGDClassifier

    from ooc_learn.learners import SklearnPartialFit

    words = np.array(["a", "b", "c"])[y.astype(int)]
    ingest_arrays(X, words, tmp_path / "w").close()
    with open_store(tmp_path / "w") as st:
        with pytest.raises(ParameterError, match="holds the labels 0, 1, 2") as exc:
            tree_cv(st, SklearnPartialFit(SGDClassifier(), classes=["a", "b", "c"]), 5)
        assert "classes=[0, 1, 2]" in exc.value.hint
        assert tree_cv(st, SklearnPartialFit(SGDClassifier(random_state=0),
                                             classes=[0, 1, 2]), 5).estimate < 0.2
    ingest_arrays(X, X[:, 0] * 2.0, tmp_path / "r", task="regression").close()
    assert train_main([str(tmp_path / "r"), "--cv", "5", "--cv-method", "tree",
                       "--quiet"]) == 2
    assert "holds a regression task" in capsys.readouterr().err


def test_nan_or_inf_in_arrays_is_refused_by_both_cv_methods():
    # tree_cv of Pegasos returned an estimate over NaN features; kfold_cv of exact least
    # squares raised numpy's LinAlgError
    from ooc_learn.storage.errors import NonFiniteError

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = np.sign(X[:, 0])
    bad_X = X.copy()
    bad_X[7, 1] = np.nan
    bad_y = y.copy()
    bad_y[9] = np.inf
    for cv in (tree_cv, kfold_cv):
        for learner in (Pegasos(1e-3), ExactLeastSquares(1e-3)):
            with pytest.raises(NonFiniteError, match="Row 7 of X"):
                cv((bad_X, y), learner, 5)
            with pytest.raises(NonFiniteError, match="Label 9 of y"):
                cv((X, bad_y), learner, 5)
        with pytest.raises(NonFiniteError, match="float32's range"):
            cv((np.where(X > 2, 1e50, X), y), ExactLeastSquares(1e-3), 5)


def test_class_names_in_arrays_are_refused_with_the_way_to_code_them():
    # a raw ValueError ("could not convert string to float") from the one-vs-rest wrapper
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    with pytest.raises(ParameterError, match="class names") as exc:
        tree_cv((X, np.where(X[:, 0] > 0, "a", "b")), Pegasos(1e-3), 5)
    assert "return_inverse" in exc.value.hint
