"""LinearModel: predictions on arrays and stores, pickle-free save/load, mismatch errors."""
import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.model import LinearModel, encode_labels, load_model
from ooc_learn.solvers.dcd import solve_dcd
from ooc_learn.storage.errors import ModelMismatchError, ParameterError, UsageError
from solver_data import DATASETS


def trained(classes=("benign", "malignant")):
    X, y = DATASETS["breast_cancer"]()
    labels = np.where(y > 0, classes[1], classes[0])
    y_pm, cls = encode_labels(labels)
    res = solve_dcd(X, y_pm, C=1.0)
    model = LinearModel.from_weights(res.w, bias=1.0, classes=cls, solver="dcd", loss="hinge",
                                     C=1.0, s=None, store="abc123", stats=res.stats)
    return model, X, labels, res


def test_decision_and_predict_follow_the_weights(layout):
    model, X, labels, res = trained()
    Xl = sp.csr_matrix(X) if layout == "csr" else X
    dv = model.decision_function(Xl)
    np.testing.assert_allclose(dv, X.astype(np.float64) @ res.w[:-1] + res.w[-1], rtol=1e-6,
                               atol=1e-9)
    assert model.coef_.shape == (X.shape[1],) and model.intercept_ == res.w[-1]
    pred = model.predict(Xl)
    np.testing.assert_array_equal(pred, np.where(dv > 0, "malignant", "benign"))
    assert model.score(Xl, labels) == pytest.approx(np.mean(pred == labels))
    assert model.score(Xl, labels) > 0.97


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
@pytest.mark.parametrize("classes", [("benign", "malignant"), (0, 1), (-1.0, 1.0)])
def test_save_load_round_trip_without_pickle(tmp_path, suffix, classes):
    model, X, labels, res = trained(classes)
    path = model.save(tmp_path / f"m{suffix}")
    back = load_model(path)
    np.testing.assert_array_equal(back.coef_, model.coef_)
    assert back.intercept_ == model.intercept_
    np.testing.assert_array_equal(back.classes_, model.classes_)
    np.testing.assert_array_equal(back.predict(X), model.predict(X))
    assert back.meta["solver"] == "dcd" and back.meta["C"] == 1.0 and back.meta["bias"] == 1.0
    assert back.meta["store"] == "abc123"
    assert back.meta["stats"]["epochs"] == res.stats.epochs
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:     # every member loads without pickle
            assert all(f[k].dtype.kind != "O" for k in f.files)


def test_model_on_a_store_matches_arrays(tmp_path):
    from ooc_learn.storage.ingest import ingest_arrays

    X, y = DATASETS["sparse"]()
    res = solve_dcd(X, y, C=1.0)
    store = ingest_arrays(X, y, tmp_path / "s", n_blocks=4, memory="64M")
    try:
        model = LinearModel.from_weights(res.w, classes=LinearModel.classes_from_label_map(
            store.label_map))
        Xs, ys, ids = store.read_range(0, store.n_samples)
        np.testing.assert_allclose(model.decision_function(store), model.decision_function(Xs))
        assert model.score(store) == pytest.approx(model.score(Xs, ys))
        assert model.score(store) == pytest.approx(np.mean(np.sign(X @ res.w[:-1] + res.w[-1]) == y))
        bad = LinearModel(np.zeros(store.n_features + 1))
        with pytest.raises(ModelMismatchError, match=f"trained on {store.n_features + 1} features; "
                                                     f"the data have {store.n_features}"):
            bad.score(store)
    finally:
        store.close()


def test_mismatch_and_bad_files(tmp_path):
    model, X, labels, _ = trained()
    with pytest.raises(ModelMismatchError, match="trained on 30 features; the data have 29"):
        model.predict(X[:, :29])
    with pytest.raises(ModelMismatchError, match="labels \\['cat'\\] the model does not know"):
        model.score(X[:2], np.array(["cat", "benign"]))
    # any name: .h5 / .hdf5 hold HDF5, any other the npz format, under the name as given
    for name in ("m.model", "svm-c1", "m.pkl"):
        assert model.save(tmp_path / name) == tmp_path / name
        assert (tmp_path / name).read_bytes()[:2] == b"PK"
        np.testing.assert_array_equal(load_model(tmp_path / name).predict(X), model.predict(X))
    model.save(tmp_path / "m.hdf5")
    (tmp_path / "renamed").write_bytes((tmp_path / "m.hdf5").read_bytes())
    np.testing.assert_array_equal(load_model(tmp_path / "renamed").predict(X), model.predict(X))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="is not an ooc-learn model file"):
        load_model(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", coef=np.zeros(3), intercept=0.0, classes=np.array([0, 1]),
             meta=np.array('{"format": "something-else"}'))
    with pytest.raises(UsageError, match="is not an ooc-learn linear model"):
        load_model(tmp_path / "other.npz")
    with pytest.raises(UsageError, match="No model file at"):
        load_model(tmp_path / "missing.npz")
    with pytest.raises(ParameterError, match="Got 3 distinct labels"):
        encode_labels(np.array([0, 1, 2]))


def test_a_model_scores_a_store_by_its_path_and_refuses_other_paths(tmp_path):
    # found by a new-user run: m.predict("heart.store") said "X must be 2-d", m.score(path)
    # asked for y, and m.save("s.store") (a folder) raised a raw IsADirectoryError
    from ooc_learn.api import ingest_arrays
    from ooc_learn.storage.store import open_store
    from ooc_learn.training import train

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    y = np.sign(X[:, 0] + 0.3 * rng.normal(size=200))
    ingest_arrays(X, y, tmp_path / "s", build_index=True).close()
    with open_store(tmp_path / "s") as st:
        m = train(st)
        by_store = m.decision_function(st), m.predict(st), m.score(st)
    for path in (tmp_path / "s", str(tmp_path / "s")):
        np.testing.assert_array_equal(m.decision_function(path), by_store[0])
        np.testing.assert_array_equal(m.predict(path), by_store[1])
        assert m.score(path) == by_store[2]
    with pytest.raises(ParameterError, match="No ooc-learn store at"):
        m.predict(tmp_path / "nope.store")
    with pytest.raises(UsageError, match="is a folder"):
        m.save(tmp_path / "s")
    assert open_store(tmp_path / "s").n_samples == 200  # untouched


def test_a_model_of_class_names_predicts_and_scores_names(tmp_path):
    # found by a new-user run: predict gave the codes 0/1 and score(X, names) refused the
    # names the store was ingested with
    from ooc_learn.api import ingest_arrays
    from ooc_learn.training import train

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 2)).astype(np.float32)
    y = np.where(X[:, 0] + 0.2 * rng.normal(size=200) > 0, "dog", "cat")
    with ingest_arrays(X, y, tmp_path / "s", build_index=True) as st:
        m = train(st)
        on_store = m.score(st)
    assert m.class_names == ["cat", "dog"] and m.classes_.tolist() == [0.0, 1.0]
    pred = m.predict(X)
    assert set(pred.tolist()) <= {"cat", "dog"}
    assert m.score(X, y) == pytest.approx(np.mean(pred == y)) == pytest.approx(on_store)
    assert m.score(X, (y == "dog").astype(float)) == m.score(X, y)  # the codes still score
    with pytest.raises(ModelMismatchError, match="'cow'"):
        m.score(X[:3], ["cat", "dog", "cow"])
    assert load_model(m.save(tmp_path / "m.npz")).predict(X[:5]).tolist() == pred[:5].tolist()


def test_rows_of_nan_or_text_are_refused_not_given_a_class():
    # NaN's decision value is NaN, and NaN > 0 is False: predict said -1 for a row of NaN;
    # text rows ended in numpy's UFuncTypeError
    from ooc_learn.storage.errors import NonFiniteError

    m = LinearModel.from_weights(np.array([1.0, -2.0, 0.5, 0.1]), bias=1.0,
                                 classes=[-1.0, 1.0])
    X = np.ones((3, 3))
    X[2, 1] = np.nan
    for bad in (X, sp.csr_matrix(X), np.where(X == 1, np.inf, 0.0)):
        with pytest.raises(NonFiniteError, match="Row 2 of X|Row 0 of X"):
            m.predict(bad)
    with pytest.raises(ParameterError, match="must hold numbers"):
        m.decision_function(np.array([["a", "b", "c"]]))
    np.testing.assert_allclose(m.decision_function(np.array([[1, 2, 3]], dtype=object)),
                               m.decision_function(np.array([[1.0, 2.0, 3.0]])))
    assert m.predict(np.ones((2, 3), dtype=np.int64)).tolist() == [-1.0, -1.0]
