"""One-vs-rest from one multiclass store: the store read as one class against the rest,
training, saving, ooc-predict's confusion matrix, and cross-validation.

Reference: LIBLINEAR -s 3 -B 1 (its multiclass rule is one-vs-rest, one model per class) on
scikit-learn's bundled digits; CV against refitting per fold.
"""

import json

import numpy as np
import pytest
from liblinear.liblinearutil import parameter, problem, train as ll_train
from sklearn.datasets import load_digits
from sklearn.metrics import confusion_matrix

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import predict_main, train_main
from ooc_learn.cv.folds import store_fold_bounds
from ooc_learn.cv.linear import linear_cv
from ooc_learn.model import load_model
from ooc_learn.solvers.dcd import solve_dcd
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.store import open_store
from ooc_learn.training import train


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    keep = y < 4  # four classes keep the suite quick
    return (X[keep] / 16.0).astype(np.float32), y[keep].astype(np.float64)


@pytest.fixture
def store(tmp_path, digits):
    X, y = digits
    ingest_arrays(X, y, tmp_path / "mc", n_blocks=5, task="multiclass",
                  build_index=True).close()
    return tmp_path / "mc"


def test_store_reads_one_class_against_the_rest(store):
    with open_store(store) as raw, open_store(store, positive=2) as view:
        assert raw.task == "multiclass" and view.task == "binary"
        y = raw.labels()
        want = np.where(y == 2, 1.0, -1.0)
        assert np.array_equal(view.labels(), want)
        assert np.array_equal(np.concatenate([b[1] for b in view.iter_blocks()]), want)
        rows = np.array([3, 50, 51, 400, 401, 700])
        assert np.array_equal(view.gather(rows, whole_blocks=False)[1], want[rows])
        assert np.array_equal(view.read_rows(rows)[1], want[rows])
        assert np.array_equal(view.read_range(10, 90)[1], want[10:90])
        assert view.verify() == []
    with pytest.raises(ParameterError, match="not a class"):
        open_store(store, positive=7)


def test_one_vs_rest_matches_liblinear(store, digits):
    X, y = digits
    m = train(store, solver="dcd", C=0.5, eps=1e-4, max_outer=1000)
    assert m.multiclass and m.coef_.shape == (4, 64) and list(m.classes_) == [0, 1, 2, 3]
    ll = ll_train(problem(y, X.astype(np.float64)), parameter("-s 3 -c 0.5 -B 1 -e 1e-4 -q"))
    labels = ll.get_labels()
    for k, c in enumerate(m.classes_):
        j = labels.index(int(c))
        w = np.array([ll.get_decfun_coef(f + 1, j) for f in range(64)])
        b = ll.get_decfun_bias(j)
        assert np.abs(X @ m.coef_[k] + m.intercept_[k] - (X @ w + b)).max() < 0.05
    ibcd = train(store, C=0.5)  # the default solver, one class at a time over the index
    with open_store(store) as st:
        assert ibcd.score(st) == pytest.approx(m.score(st), abs=0.01)
        assert m.score(st) == pytest.approx(np.mean(m.predict(X) == y))


def test_model_file_and_predict_confusion_matrix(store, tmp_path, capsys, digits):
    X, y = digits
    path = tmp_path / "m.h5"
    assert train_main([str(store), "-o", str(path), "--solver", "dcd", "--quiet", "--json",
                       "--test", str(store)]) == 0
    out = json.loads(capsys.readouterr().out)
    m = load_model(path)
    assert m.multiclass and out["classes"] == [0.0, 1.0, 2.0, 3.0]
    assert out["test_accuracy"] == pytest.approx(np.mean(m.predict(X) == y))
    assert predict_main([str(path), str(store), "--json", "--quiet"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert np.array_equal(pred["confusion_matrix"], confusion_matrix(y, m.predict(X)))
    assert pred["accuracy"] == pytest.approx(out["test_accuracy"])
    npz = tmp_path / "m.npz"
    m.save(npz)
    back = load_model(npz)
    assert np.array_equal(back.coef_, m.coef_) and np.array_equal(back.intercept_, m.intercept_)


def test_multiclass_cv_matches_refitting_per_fold(store):
    with open_store(store) as st:
        Xs, ys, _ = st.read_range(0, st.n_samples)
        Xs, ys = np.asarray(Xs), np.asarray(ys, dtype=np.float64)
        bounds = store_fold_bounds(st.block_offsets, 5)
    res = linear_cv(store, 5, solver="dcd", C=0.5, eps=1e-6, max_outer=1000)
    assert res.metric == "accuracy" and res.stats["classes"] == [0.0, 1.0, 2.0, 3.0]
    pred = np.empty(len(ys))
    for i in range(5):
        a, z = bounds[i], bounds[i + 1]
        tr = np.r_[0:a, z:len(ys)]
        scores = []
        for c in range(4):
            w = solve_dcd(Xs[tr], np.where(ys[tr] == c, 1.0, -1.0), C=0.5, eps=1e-9,
                          max_iter=10**6).w
            scores.append(Xs[a:z] @ w[:-1] + w[-1])
        pred[a:z] = np.argmax(scores, axis=0)
    assert np.mean(res.predictions != pred) <= 0.005  # ties at the margin only
    assert res.estimate == pytest.approx(np.mean(pred == ys), abs=0.005)
    assert np.array_equal(res.predictions[res.predictions == pred],
                          pred[res.predictions == pred])


def test_c_search_on_a_multiclass_store(store):
    from ooc_learn.cv.c_search import linear_c_search

    path = linear_c_search(store, 3, solver="dcd", C_min=0.01, C_max=1.0, patience=2)
    Cs = [r.stats["C"] for r in path]
    assert Cs[0] == 0.01 and all(b == 2 * a for a, b in zip(Cs, Cs[1:]))
    r = path[len(path) // 2]
    assert r.stats["classes"] == [0.0, 1.0, 2.0, 3.0]
    assert r.estimate == pytest.approx(linear_cv(store, 3, solver="dcd", C=r.stats["C"]).estimate)


@pytest.mark.parametrize("solver", ["dcd", "ibcd"])
def test_classes_in_threads_give_the_same_model(store, solver):
    # IBCD's classes share the index's one LMDB environment (a second open in one process
    # is refused) while each keeps its own forest state
    one = train(store, solver=solver, C=0.5)
    two = train(store, solver=solver, C=0.5, n_jobs=2)
    assert two.meta["stats"]["jobs"] == 2 and one.meta["stats"]["jobs"] == 1
    assert np.array_equal(one.coef_, two.coef_) and np.array_equal(one.intercept_,
                                                                   two.intercept_)


@pytest.mark.parametrize("solver", ["dcd", "ibcd"])
def test_cv_of_classes_in_threads_gives_the_same_estimate(store, solver, capsys):
    one = linear_cv(store, 3, solver=solver, C=0.5)
    two = linear_cv(store, 3, solver=solver, C=0.5, n_jobs=2)
    assert one.stats["jobs"] == 1 and two.stats["jobs"] == 2
    assert two.estimate == one.estimate
    np.testing.assert_array_equal(two.predictions, one.predictions)
    np.testing.assert_array_equal(two.fold_scores, one.fold_scores)
    assert [e["class"] for e in two.stats["per_class"]] == [0.0, 1.0, 2.0, 3.0]
    # the CLI takes --jobs for the classes of a multiclass store, whatever the solver
    assert train_main([str(store), "--cv", "3", "--C", "0.5", "--solver", solver,
                       "--jobs", "2", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["estimate"] == pytest.approx(one.estimate)


def test_pegasos_one_vs_rest_reports_no_support_vectors(store, tmp_path, capsys):
    # PEGASOS counts none: the multiclass summary says nothing of them (it said 0)
    assert train_main([str(store), "-o", str(tmp_path / "p.npz"), "--solver", "pegasos",
                       "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["n_sv"] is None
    assert train_main([str(store), "-o", str(tmp_path / "p.npz"), "--solver", "pegasos"]) == 0
    assert "support vectors" not in capsys.readouterr().out


def test_predictions_to_stdout_with_the_summary_on_stderr(store, tmp_path, capsys):
    model = tmp_path / "m.npz"
    assert train_main([str(store), "-o", str(model), "--solver", "dcd", "--quiet"]) == 0
    capsys.readouterr()
    assert predict_main([str(model), str(store), "-o", str(tmp_path / "p.csv")]) == 0
    capsys.readouterr()
    assert predict_main([str(model), str(store), "-o", "-"]) == 0
    got = capsys.readouterr()
    assert got.out == (tmp_path / "p.csv").read_text()  # stdout: the CSV alone
    assert "accuracy" in got.err and "confusion matrix" in got.err
    # classes as the source wrote them (0..3), not as floats
    labels = {line.split(",")[1] for line in got.out.splitlines()[1:]}
    assert labels and labels <= {"0", "1", "2", "3"}
    assert predict_main([str(model), str(store), "-o", "-", "--quiet"]) == 0
    got = capsys.readouterr()
    assert got.out == (tmp_path / "p.csv").read_text() and "accuracy" not in got.err
    # --json writes stdout too: refused before any work, naming both
    assert predict_main([str(model), str(store), "-o", "-", "--json"]) == 2
    err = capsys.readouterr().err
    assert "-o -" in err and "--json" in err


def test_each_class_trains_as_its_own_binary_store(store, digits, tmp_path):
    """IBCD on the one-vs-rest view of class c equals IBCD on a binary store of the same rows
    labelled c vs rest: the index search reads the shared block cache's stored labels
    (0..3) mapped to +1 / -1 for its class."""
    X, y = digits
    for c in (1, 3):
        path = tmp_path / f"bin{c}"
        ingest_arrays(X, np.where(y == c, 1.0, -1.0), path, n_blocks=5,
                      build_index=True).close()
        with open_store(path) as st:
            want = train(st, C=0.5, eps=1e-3)
        with open_store(store, positive=c) as view:
            got = train(view, C=0.5, eps=1e-3)
        np.testing.assert_allclose(got.coef_, want.coef_, rtol=0, atol=1e-6)
