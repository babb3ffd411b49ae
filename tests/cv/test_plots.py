"""ooc-train --plot: a C search's and a training run's pictures, and the refusals before any
work (a name matplotlib cannot write, matplotlib missing)."""

import json
import os

import numpy as np
import pytest
from sklearn.datasets import make_classification

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import train_main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def store(tmp_path):
    X, y = make_classification(n_samples=800, n_features=10, random_state=0)
    ingest_arrays(X.astype(np.float32), y, tmp_path / "s", build_index=True).close()
    return tmp_path / "s"


def test_cv_and_training_plots(store, tmp_path, capsys):
    cv = tmp_path / "cv.png"
    assert train_main([str(store), "--cv", "3", "--C", "0.1,1,10", "--plot", str(cv),
                       "--quiet", "--json"]) == 0
    assert cv.read_bytes()[:8] == PNG and cv.stat().st_size > 5000
    assert json.loads(capsys.readouterr().out)["best_C"] in (0.1, 1.0, 10.0)
    run = tmp_path / "train.svg"
    assert train_main([str(store), "-o", str(tmp_path / "m.npz"), "--truncate", "1",
                       "--test", str(store), "--plot", str(run), "--quiet"]) == 0
    svg = run.read_text()
    assert "<svg" in svg and "test error" in svg and "rows read" in svg
    assert not list(tmp_path.glob(".*ooc-tmp*"))  # written through a temporary sibling
    # least squares' leave-one-out lists no fold scores (one a row): the curve alone
    X, y = make_classification(n_samples=300, n_features=5, random_state=1)
    ingest_arrays(X.astype(np.float32), X[:, 0] + y, tmp_path / "r",
                  task="regression").close()
    loo = tmp_path / "loo.svg"
    assert train_main([str(tmp_path / "r"), "--cv", "loo", "--C", "0.1,1", "--plot",
                       str(loo), "--quiet"]) == 0
    assert "leave-one-out" in loo.read_text()


def test_plot_refusals_come_before_the_work(store, tmp_path, capsys, without_module):
    assert train_main([str(store), "-o", str(tmp_path / "m.npz"), "--plot",
                       str(tmp_path / "p.txt"), "--quiet"]) == 2
    assert "must end in .png" in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()
    without_module("matplotlib")
    assert train_main([str(store), "-o", str(tmp_path / "m.npz"), "--plot",
                       str(tmp_path / "p.png"), "--quiet"]) == 2
    assert "ooc-learn[plot]" in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()


def test_a_plot_never_takes_the_models_file_a_users_file_or_a_folder(store, tmp_path,
                                                                      capsys):
    # `-o same.png --plot same.png` lost one of them (exit 0); --plot wrote over a user's
    # thesis.pdf; --plot out.png where out.png is a folder failed after training (exit 1)
    model = tmp_path / "m.npz"
    same = tmp_path / "same.png"
    thesis = tmp_path / "thesis.pdf"
    thesis.write_text("my thesis")
    (tmp_path / "out.png").mkdir()
    for plot, out, said in ((same, same, "is the model's -o too"),
                            (thesis, model, "is not an ooc-learn plot file"),
                            (tmp_path / "out.png", model, "is not a plot file"),
                            (str(tmp_path / "dir.png") + os.sep, model, "names a folder")):
        assert train_main([str(store), "-o", str(out), "--plot", str(plot), "--quiet"]) == 2
        assert said in capsys.readouterr().err
        assert not model.exists() and not same.exists()
    assert thesis.read_text() == "my thesis"
    # a plot of ours is replaced by the next run's
    run = tmp_path / "run.pdf"
    for _ in range(2):
        assert train_main([str(store), "-o", str(model), "--test", str(store), "--plot",
                           str(run), "--quiet"]) == 0
    assert run.read_bytes().startswith(b"%PDF")
