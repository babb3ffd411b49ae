"""The LIBSVM index base is decided once, at the training store's ingest: --test and
ooc-predict files are read with it (a stray "0:" shifted every feature of one file, 57 %
accuracy with exit 0), and a test file that contradicts it is refused with its file:line."""

import json

import numpy as np
from sklearn.datasets import dump_svmlight_file

from ooc_learn.cli import ingest_main, predict_main, train_main


def data(n, seed):
    rng = np.random.default_rng(seed)
    X = np.abs(rng.normal(size=(n, 12))) + 0.1  # every entry written: a shift moves them all
    w = np.linspace(-2, 2, 12)
    y = np.where(X @ w - np.median(X @ w) > 0, 1.0, -1.0)
    return X, y


def test_a_stray_zero_in_the_train_file_does_not_shift_the_test_file(tmp_path, capsys):
    X, y = data(800, 0)
    train = tmp_path / "train.svm"
    dump_svmlight_file(X, y, str(train), zero_based=False)  # 1-based, indices 1..12
    lines = train.read_text().splitlines()
    lines[5] += " 0:1"  # one stray "0:": the store is read as 0-based (13 features)
    train.write_text("\n".join(lines) + "\n")
    Xt, yt = data(400, 1)
    test = tmp_path / "test.svm"
    dump_svmlight_file(Xt, yt, str(test), zero_based=False)  # 1-based, no zero
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(train), "-o", str(store), "--quiet"]) == 0
    capsys.readouterr()
    assert train_main([str(store), "-o", str(model), "--quiet", "--json", "--test",
                       str(test)]) == 0
    acc = json.loads(capsys.readouterr().out)["test_accuracy"]
    assert acc > 0.9  # the test file read with the store's base: the same columns
    assert predict_main([str(model), str(test), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == acc


def test_a_test_file_that_contradicts_the_stores_base_is_refused(tmp_path, capsys):
    X, y = data(300, 0)
    train, test = tmp_path / "train.svm", tmp_path / "test.svm"
    dump_svmlight_file(X, y, str(train), zero_based=False)
    dump_svmlight_file(X[:50], y[:50], str(test), zero_based=True)  # has index 0
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(train), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    assert predict_main([str(model), str(test), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Feature index 0" in err and f"{test}, line 1" in err and "1-based" in err


def test_a_test_file_with_other_features_than_the_model_is_read_as_liblinear_does(tmp_path,
                                                                                   capsys):
    # a9a.t has 122 features, a9a 123: a model of either scores the other. A feature the
    # model lacks has no weight in it (left out, with a warning, as LIBLINEAR's predict);
    # a feature the file lacks is 0
    from ooc_learn.model import load_model

    X, y = data(600, 2)
    train, wide, narrow = tmp_path / "train.svm", tmp_path / "wide.svm", tmp_path / "n.svm"
    dump_svmlight_file(X, y, str(train), zero_based=False)  # 12 features
    Xw = np.c_[X[:200], np.ones(200)]  # a 13th feature
    dump_svmlight_file(Xw, y[:200], str(wide), zero_based=False)
    Xn = X[:200].copy()
    Xn[:, -2:] = 0.0  # its largest index is 10
    dump_svmlight_file(Xn, y[:200], str(narrow), zero_based=False)
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(train), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    m = load_model(model)
    for path, rows in ((wide, X[:200]), (narrow, Xn)):
        out = tmp_path / "p.csv"
        assert predict_main([str(model), str(path), "--quiet", "-o", str(out)]) == 0
        err = capsys.readouterr().err
        assert ("13 features, the model 12" in err) == (path == wide)
        got = np.loadtxt(out, delimiter=",", skiprows=1)
        np.testing.assert_allclose(got[:, 2], m.decision_function(rows.astype(np.float32)),
                                   rtol=1e-5, atol=1e-6)
    assert train_main([str(store), "-o", str(model), "--quiet", "--test", str(wide)]) == 0
    assert "left out, as LIBLINEAR's predict does" in capsys.readouterr().err


def test_a_libsvm_file_scored_by_a_model_of_a_csv_is_read_by_its_own_base(tmp_path, capsys):
    # a CSV's columns have no index base: its store had recorded "0-based", and a standard
    # 1-based LIBSVM file scored against its model was read so, every feature moved one
    # column over (breast-cancer: 93.28 % against 96.64 %, exit 0, a warning of "31
    # features")
    X, y = data(600, 3)
    head = ",".join([f"f{i}" for i in range(12)] + ["label"])
    csv, test_csv, test_svm = tmp_path / "t.csv", tmp_path / "v.csv", tmp_path / "v.svm"
    np.savetxt(csv, np.c_[X[:400], y[:400]], delimiter=",", header=head, comments="")
    np.savetxt(test_csv, np.c_[X[400:], y[400:]], delimiter=",", header=head, comments="")
    dump_svmlight_file(X[400:], y[400:], str(test_svm), zero_based=False)  # 1-based
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(csv), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    scores = []
    for path in (test_csv, test_svm):
        assert predict_main([str(model), str(path), "--quiet", "--json"]) == 0
        out = capsys.readouterr()
        assert "features" not in out.err  # no "has 13 features, the model 12"
        scores.append(json.loads(out.out)["accuracy"])
    assert scores[0] > 0.9 and scores[1] == scores[0]


def test_labels_the_model_never_learned_are_named_when_scored(tmp_path, capsys):
    # a 10-class model scoring a +-1 file said "accuracy 1.68 %" and dropped the -1 rows
    # from its confusion matrix; a +-1 model scoring digits' 0..9 took every label but 1 as
    # -1: both without a word
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    yb = np.where(y > 4, 1, -1)
    files = {}
    for name, labels in (("multi", y), ("bin", yb)):
        for part, rows in (("train", slice(0, 1200)), ("test", slice(1200, None))):
            files[name, part] = tmp_path / f"{name}.{part}.svm"
            dump_svmlight_file(X[rows], labels[rows], str(files[name, part]),
                               zero_based=False)
        store, model = tmp_path / f"{name}.store", tmp_path / f"{name}.npz"
        assert ingest_main([str(files[name, "train"]), "-o", str(store), "--quiet"]) == 0
        assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    for model, test, said in (("multi", "bin", "(-1)"), ("bin", "multi", "(0, 2, 3, 4")):
        assert predict_main([str(tmp_path / f"{model}.npz"), str(files[test, "test"]),
                             "--quiet", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert any("not the model's classes " + said in w for w in out["warnings"]), out
    for model in ("multi", "bin"):  # its own kind of labels: no warning
        assert predict_main([str(tmp_path / f"{model}.npz"), str(files[model, "test"]),
                             "--quiet", "--json"]) == 0
        assert "warnings" not in json.loads(capsys.readouterr().out)


def test_a_npy_of_the_models_features_alone_is_predicted(tmp_path, capsys):
    # np.save(f, X_test) of the model's width: its first column had been taken for labels
    # (9 features and a wrong score, exit 0), and --no-labels was refused for .npy; a file
    # of other width got a hint naming --n-features, which ooc-predict does not have
    X, y = data(300, 4)
    np.save(tmp_path / "train.npy", np.c_[y, X])
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(tmp_path / "train.npy"), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    np.save(tmp_path / "X.npy", X[:50])
    np.save(tmp_path / "yX.npy", np.c_[y[:50], X[:50]])
    np.save(tmp_path / "wide.npy", np.c_[y[:50], X[:50], X[:50]])
    from ooc_learn.model import load_model

    want = load_model(model).decision_function(X[:50].astype(np.float32))
    for extra in ([], ["--no-labels"]):
        out = tmp_path / "p.csv"
        assert predict_main([str(model), str(tmp_path / "X.npy"), "--quiet", "-o", str(out)]
                            + extra) == 0
        got = np.loadtxt(out, delimiter=",", skiprows=1)
        np.testing.assert_allclose(got[:, 2], want, rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert predict_main([str(model), str(tmp_path / "yX.npy"), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] > 0.9
    assert predict_main([str(model), str(tmp_path / "wide.npy"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "25 columns" in err and "--n-features" not in err
    # to be scored (--test) the rows need their labels
    assert train_main([str(store), "-o", str(tmp_path / "m2.npz"), "--quiet", "--test",
                       str(tmp_path / "X.npy")]) == 2
    assert "a score needs the label too" in capsys.readouterr().err
    # a .npz (X and y) of another width is named as the model's mismatch
    np.savez(tmp_path / "w.npz", X=np.c_[X[:50], X[:50]], y=y[:50])
    assert predict_main([str(model), str(tmp_path / "w.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "The model has 12 features" in err and "--n-features" not in err
