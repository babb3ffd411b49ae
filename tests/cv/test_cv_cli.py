"""ooc-train --cv and ooc-index from the command line."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ooc_learn.api import ingest_arrays
from ooc_learn.cli import index_main, train_main
from ooc_learn.cv import kfold_cv
from ooc_learn.index.forest import open_forest
from ooc_learn.learners import ExactLeastSquares
from ooc_learn.storage.store import open_store

TRAIN = [sys.executable, "-c",
         "import sys; from ooc_learn.cli import train_main; sys.exit(train_main())"]


def test_cv_flag_gives_the_library_estimate(tmp_path, rng, capsys):
    X = rng.normal(size=(400, 5)).astype(np.float32)
    y = np.where(X @ rng.normal(size=5) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=4).close()
    for method in ("tree", "standard"):
        assert train_main([str(tmp_path / "s"), "--cv", "4", "--cv-method", method,
                           "--learner", "exact-ls", "--json", "--quiet"]) == 0
        out = json.loads(capsys.readouterr().out)
        with open_store(tmp_path / "s") as store:
            ref = kfold_cv(store, ExactLeastSquares(ridge=1e-6), 4)
        # ExactLeastSquares is order independent: TreeCV equals standard CV
        assert out["estimate"] == pytest.approx(ref.estimate, rel=1e-9)
        assert out["k"] == 4 and out["cv_method"] == method


def test_flags_treecv_does_not_use_are_refused_not_dropped(tmp_path, rng, capsys):
    # --truncate was ignored by TreeCV's learners without a word; --lam's refusal named
    # "the None SVM"
    X = rng.normal(size=(100, 3)).astype(np.float32)
    ingest_arrays(X, np.sign(X[:, 0]) + (X[:, 0] == 0), tmp_path / "s").close()
    capsys.readouterr()
    assert train_main([str(tmp_path / "s"), "--cv", "4", "--cv-method", "tree", "--truncate",
                       "1", "--quiet"]) == 2
    assert "--truncate" in capsys.readouterr().err
    assert train_main([str(tmp_path / "s"), "--cv", "4", "--lam", "0.1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the ibcd SVM" in err and "None" not in err, err
    # --spill-dir was checked only where a spill happened
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "missing", tmp_path / "file"):
        assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"),
                           "--spill-dir", str(bad), "--quiet"]) == 2
        assert "--spill-dir" in capsys.readouterr().err
    assert not (tmp_path / "m.npz").exists()


def test_bad_cv_value_exits_2(tmp_path, rng):
    X = rng.normal(size=(50, 3)).astype(np.float32)
    ingest_arrays(X, np.sign(X[:, 0]) + (X[:, 0] == 0), tmp_path / "s").close()
    for bad in ("ten", "1", "51"):
        r = subprocess.run(TRAIN + [str(tmp_path / "s"), "--cv", bad], capture_output=True,
                           text=True)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_ooc_index_adds_an_index_and_refuses_twice(tmp_path, rng, capsys):
    X = rng.normal(size=(600, 6)).astype(np.float32)
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "s", n_blocks=3).close()
    with open_store(tmp_path / "s") as s:
        before = dict(zip(s.row_ids(), s.labels()))
    assert index_main([str(tmp_path / "s"), "--quiet", "--json"]) == 0
    with open_store(tmp_path / "s") as s:
        assert s.has_index
        # the new index answers a query as a scan does: rows with -1 <= y (x^T w + b) < 1
        w = np.ones(7)
        Xs, ys = s.read_range(0, s.n_samples)[:2]
        z = np.asarray(ys, np.float64) * (np.asarray(Xs, np.float64) @ w[:6] + w[6])
        want = np.flatnonzero((z < 1.0) & (z >= -1.0))
        with open_forest(s) as forest:
            got = np.sort(forest.query(w, n=None)[0])
        assert want.size > 0 and np.array_equal(got, want)
        # rows were reordered within blocks, none lost or changed
        assert dict(zip(s.row_ids(), s.labels())) == before
    capsys.readouterr()
    assert index_main([str(tmp_path / "s"), "--quiet"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert index_main([str(tmp_path / "s"), "--quiet", "--overwrite"]) == 0
