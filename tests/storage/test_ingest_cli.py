"""End-to-end ingest from text sources: the CLI, round trips against scikit-learn, bad input,
SIGKILL at random moments."""

import bz2
import gzip
import json
import lzma
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_breast_cancer, load_diabetes, load_svmlight_file

from ooc_learn.cli import info_main, ingest_main
from ooc_learn.storage.errors import IngestError
from ooc_learn.api import ingest, ingest_arrays
from ooc_learn.storage.store import open_store

INGEST = [sys.executable, "-c",
          "import sys; from ooc_learn.cli import ingest_main; sys.exit(ingest_main())"]


def run_ingest(*args, **kw):
    return subprocess.run(INGEST + [str(a) for a in args], capture_output=True, text=True,
                          timeout=300, **kw)


def stored_as_source_order(store):
    X, y, ids = store.read_range(0, store.n_samples)
    order = np.argsort(ids)
    X = X[order]
    return (X.toarray() if sp.issparse(X) else X), y[order], ids[order]


def write_svm(path, X, y, zero_based, comment=None):
    dump_svmlight_file(X, y, str(path), zero_based=zero_based, comment=comment)


@pytest.mark.parametrize("zero_based", [False, True])
@pytest.mark.parametrize("sparse", [True, False], ids=["csr", "dense"])
def test_libsvm_round_trip_matches_sklearn(tmp_path, rng, zero_based, sparse):
    n, d = 700, 40
    if sparse:
        X = sp.random(n, d, density=0.08, random_state=1, format="csr") * 100
    else:
        X = rng.normal(size=(n, d)) * 10.0 ** rng.integers(-3, 4, size=(n, d))
    X = sp.lil_matrix(X)
    if zero_based:
        X[:, 0] = 1.0  # a zero-based file must show index 0 for "auto" detection
    X = sp.csr_matrix(X)
    y = rng.choice([-1.0, 1.0], n)
    src = tmp_path / "train.svm"
    write_svm(src, X, y, zero_based)
    Xr, yr = load_svmlight_file(str(src))  # the peer's reading (zero_based="auto")
    with ingest([src], tmp_path / "s", n_blocks=3, build_index=False, seed=2) as store:
        Xs, ys, ids = stored_as_source_order(store)
        assert np.array_equal(ids, np.arange(n))
        assert store.n_features == Xr.shape[1]
        np.testing.assert_array_equal(Xs, Xr.toarray().astype(np.float32))
        np.testing.assert_array_equal(ys, yr.astype(np.float32))
        assert store.layout == ("csr" if sparse else "dense")


@pytest.mark.parametrize("loader", [load_breast_cancer, load_diabetes], ids=["breast_cancer", "diabetes"])
def test_bundled_datasets_via_libsvm_and_csv(tmp_path, loader):
    X, y = loader(return_X_y=True)
    svm = tmp_path / "d.svm"
    write_svm(svm, X, y, zero_based=False)
    csv = tmp_path / "d.csv"
    header = ",".join(["target"] + [f"f{j}" for j in range(X.shape[1])])
    np.savetxt(csv, np.column_stack([y, X]), delimiter=",", header=header, comments="",
               fmt="%.17g")
    Xr, yr = load_svmlight_file(str(svm), n_features=X.shape[1])
    # diabetes' targets are 214 distinct integers: classes or a number? The user says
    task = "regression" if loader is load_diabetes else "auto"
    for src, name in ((svm, "svm"), (csv, "csv")):
        with ingest([src], tmp_path / name, build_index=False, n_features=X.shape[1]
                    if name == "svm" else None, task=task) as store:
            Xs, ys, _ = stored_as_source_order(store)
            np.testing.assert_array_equal(Xs, Xr.toarray().astype(np.float32))
            if store.task == "regression":
                np.testing.assert_array_equal(ys, yr.astype(np.float32))
            else:
                assert store.task == "binary"
                np.testing.assert_array_equal(ys, np.where(yr == yr.max(), 1, -1))


@pytest.mark.parametrize("opener,suffix", [(gzip.open, ".gz"), (bz2.open, ".bz2"),
                                           (lzma.open, ".xz")])
def test_compressed_sources_and_several_files(tmp_path, rng, opener, suffix):
    X = sp.random(300, 12, density=0.3, random_state=3, format="csr")
    y = rng.choice([1.0, 2.0], 300)
    plain = tmp_path / "a.svm"
    write_svm(plain, X[:200], y[:200], zero_based=False)
    comp = tmp_path / ("b.svm" + suffix)
    with opener(comp, "wb") as fh:
        dump_svmlight_file(X[200:], y[200:], fh, zero_based=False)
    with ingest([plain, comp], tmp_path / "s", build_index=False, n_features=12) as store:
        Xs, ys, ids = stored_as_source_order(store)
        np.testing.assert_array_equal(Xs, X.toarray().astype(np.float32))
        np.testing.assert_array_equal(ys, np.where(y == 2.0, 1, -1))
        srcs = store.metadata["sources"]
        assert [s["rows"] for s in srcs] == [200, 100]
        assert all(len(s["sha256"]) == 64 for s in srcs)


def test_cli_json_and_info(tmp_path, rng, capsys):
    X = sp.random(500, 30, density=0.1, random_state=0, format="csr")
    y = rng.choice([-1.0, 1.0], 500)
    src = tmp_path / "t.svm"
    write_svm(src, X, y, zero_based=False)
    rc = ingest_main([str(src), "-o", str(tmp_path / "s"), "--json", "--quiet", "--no-index",
                      "--blocks", "4", "--memory", "4G"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("store", "n_samples", "n_features", "n_blocks", "layout", "seconds",
                "bytes_in", "peak_rss_bytes"):
        assert key in out
    assert out["n_samples"] == 500 and out["n_blocks"] == 4
    assert out["bytes_in"] == src.stat().st_size
    assert info_main([str(tmp_path / "s"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_samples"] == 500 and info["metadata"]["sources"][0]["name"] == "t.svm"


BAD_INPUTS = {
    "malformed_token": ("1 1:0.5 3:x\n", r"line 1", "3:x"),
    "missing_colon": ("1 1:0.5\n-1 2:1 7\n", r"line 2", "7"),
    "non_numeric_label": ("1 1:0.5\nyes 2:1\n", r"line 2", "yes"),
    "missing_label": ("1 1:0.5\n2:1 3:1\n", r"line 2", "2:1"),
    "nan_value": ("1 1:0.5\n1 2:nan\n", r"line 2", "nan"),
    "inf_label": ("inf 1:0.5\n", r"line 1", "inf"),
    "negative_index": ("1 1:0.5\n1 -4:1\n", r"line 2", "-4"),
    "huge_index": ("1 1:0.5\n1 99999999999:1\n", r"line 2", "99999999999"),
    "duplicate_index": ("1 1:0.5 1:0.7\n", r"line 1", "1"),
    "empty": ("", r"no data rows", None),
    "only_comments": ("# nothing\n# here\n", r"no data rows", None),
    "layout_change": ("1 1:0.5 2:1\n-1 3:1\n1,2,3\n", r"line 3", None),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_libsvm_input_exit_2_names_line_and_leaves_nothing(tmp_path, case):
    text, where, token = BAD_INPUTS[case]
    src = tmp_path / "bad.svm"
    src.write_text(text)
    r = run_ingest(src, "-o", tmp_path / "s", "--quiet", "--format", "libsvm")
    assert r.returncode == 2, r.stderr
    assert "bad.svm" in r.stderr and re_search(where, r.stderr), r.stderr
    if token:
        assert token in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.svm"]


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


def test_a_delimiter_at_the_end_of_each_line_is_named_as_such(tmp_path, capsys):
    # it was "empty field (missing value)" with a hint to impute
    src = tmp_path / "t.csv"
    src.write_text("a,b,label,\n1,2,1,\n3,4,-1,\n5,6,1,\n")
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "line 2, column 4: the line ends with a delimiter" in err and "s/,$//" in err
    mid = tmp_path / "m.csv"  # a value missing inside the line is still a missing value
    mid.write_text("a,b,label\n1,2,1\n3,,-1\n5,6,1\n")
    assert ingest_main([str(mid), "-o", str(tmp_path / "s"), "--quiet"]) == 2
    assert "line 3, column 2: empty field (missing value)" in capsys.readouterr().err


def test_csv_row_of_wrong_width(tmp_path):
    src = tmp_path / "bad.csv"
    src.write_text("y,a,b\n1,0.5,2\n0,1,2,3\n")
    r = run_ingest(src, "-o", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "bad.csv" in r.stderr and "line 3" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]


def test_sources_of_two_formats_are_refused_and_the_old_store_kept(tmp_path):
    # a LIBSVM file's 1-based columns and +/-1 labels read beside a CSV's columns and
    # class names: a store that looks fine and is wrong
    svm, csv = tmp_path / "a.svm", tmp_path / "b.csv"
    svm.write_text("+1 1:0.5 3:1\n-1 2:1\n")
    csv.write_text("x0,x1,x2,label\n0.5,0,1,cat\n0,1,0,dog\n")
    assert run_ingest(svm, "-o", tmp_path / "s", "--quiet", "--no-index").returncode == 0
    before = (tmp_path / "s" / "data.h5").read_bytes()
    r = run_ingest(svm, csv, "-o", tmp_path / "s", "--quiet", "--no-index", "--overwrite")
    assert r.returncode == 2, r.stderr
    assert "b.csv" in r.stderr and "csv" in r.stderr and "libsvm" in r.stderr, r.stderr
    assert (tmp_path / "s" / "data.h5").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.svm", "b.csv", "s"]


def test_missing_and_unreadable_file(tmp_path):
    r = run_ingest(tmp_path / "nope.svm", "-o", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "nope.svm" in r.stderr
    locked = tmp_path / "locked.svm"
    locked.write_text("1 1:1\n")
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # running as root: permissions do not bite
        pytest.skip("cannot make a file unreadable as root")
    r = run_ingest(locked, "-o", tmp_path / "s", "--quiet")
    assert r.returncode == 2 and "locked.svm" in r.stderr


def test_output_exists_is_refused_and_kept(tmp_path):
    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n")
    assert run_ingest(src, "-o", tmp_path / "s", "--quiet", "--no-index").returncode == 0
    before = (tmp_path / "s" / "data.h5").read_bytes()
    r = run_ingest(src, "-o", tmp_path / "s", "--quiet", "--no-index")
    assert r.returncode == 2 and "--overwrite" in r.stderr
    assert (tmp_path / "s" / "data.h5").read_bytes() == before
    assert run_ingest(src, "-o", tmp_path / "s", "--quiet", "--no-index",
                      "--overwrite").returncode == 0


def test_bad_flag_values_exit_2(tmp_path):
    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n")
    r = run_ingest(src, "-o", tmp_path / "s", "--memory", "lots")
    assert r.returncode == 2 and "--memory" in r.stderr
    r = run_ingest(src, "-o", tmp_path / "s", "--blocks", "0")
    assert r.returncode == 2 and "n_blocks" in r.stderr
    r = run_ingest(src, "-o", tmp_path / "s", "--seed", "-1")  # was numpy's ValueError
    assert r.returncode == 2 and "'seed'" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.svm"]


def test_a_nan_in_a_npy_with_its_labels_beside_names_the_file(tmp_path, capsys):
    # the refusal had named "<arrays>"
    X = np.ones((40, 3))
    X[17, 1] = np.nan
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", np.where(np.arange(40) % 2, 1, -1))
    assert ingest_main([str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"), "-o",
                        str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'X.npy'} (labels {tmp_path / 'y.npy'}): Row 17" in err
    assert "<arrays>" not in err and not (tmp_path / "s").exists()


def test_a_damaged_shard_manifest_is_named(tmp_path, capsys):
    # a garbage shards.json was "not an ooc-learn store (no data.h5 inside)", or, to
    # ooc-predict, "the source is a directory"
    from ooc_learn.cli import check_main, info_main

    X = np.random.default_rng(0).normal(size=(60, 3)).astype(np.float32)
    ingest_arrays(X, np.where(X[:, 0] > 0, 1.0, -1.0), tmp_path / "sh", shards=2).close()
    (tmp_path / "sh" / "shards.json").write_text("garbage{")
    for main in (check_main, info_main):
        assert main([str(tmp_path / "sh"), "--quiet"]) == 2
        assert "shards.json is not valid JSON" in capsys.readouterr().err


def test_csv_options_on_a_libsvm_source_are_refused(tmp_path, capsys):
    # --header and --label-column 2 were taken and ignored for a LIBSVM file
    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n1 1:2\n-1 2:3\n")
    for flags in (["--header"], ["--no-header"], ["--label-column", "2"],
                  ["--delimiter", ";"]):
        assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"] + flags) == 2
        err = capsys.readouterr().err
        assert flags[0] in err and "this one is libsvm" in err and str(src) in err
    assert not (tmp_path / "s").exists()


def test_jobs_below_one_and_a_bad_memory_for_a_model_are_refused(tmp_path, capsys):
    # --jobs 0 / -2 were taken without a word; ooc-info MODEL --memory abc exited 0
    from ooc_learn.cli import train_main

    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n1 1:2\n-1 2:3\n")
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    for jobs in ("0", "-2"):
        with pytest.raises(SystemExit) as e:
            train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--jobs", jobs])
        assert e.value.code == 2 and "--jobs" in capsys.readouterr().err
    assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--quiet"]) == 0
    for bad in ("abc", "0"):
        assert info_main([str(tmp_path / "m.npz"), "--memory", bad]) == 2
        assert "--memory" in capsys.readouterr().err
    assert info_main([str(tmp_path / "m.npz"), "--memory", "1G", "--quiet"]) == 0


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_a_bad_OOC_MEMORY_is_refused_by_every_command(tmp_path, monkeypatch, capsys, value):
    # ooc-train read it first in its first-run check and crashed there (a traceback, exit 1;
    # nothing on stdout under --json); the others refused it
    from ooc_learn.cli import index_main, predict_main, train_main

    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n1 1:2\n-1 2:3\n")
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--quiet"]) == 0
    monkeypatch.setenv("OOC_MEMORY", value)
    capsys.readouterr()
    for main, args in ((ingest_main, [str(src), "-o", str(tmp_path / "s2")]),
                       (train_main, [str(tmp_path / "s"), "-o", str(tmp_path / "m2.npz")]),
                       (predict_main, [str(tmp_path / "m.npz"), str(tmp_path / "s")]),
                       (index_main, [str(tmp_path / "s"), "--overwrite"])):
        assert main(args + ["--quiet", "--json"]) == 2, main
        out = capsys.readouterr()
        assert "OOC_MEMORY" in out.err and "OOC_MEMORY" in json.loads(out.out)["error"]
    assert not (tmp_path / "s2").exists() and not (tmp_path / "m2.npz").exists()


def test_ingest_error_carries_location(tmp_path):
    src = tmp_path / "bad.svm"
    src.write_text("1 1:1\n1 1:1 2:abc\n")
    with pytest.raises(IngestError) as ei:
        ingest([src], tmp_path / "s", build_index=False)
    assert ei.value.line == 2 and ei.value.path.endswith("bad.svm") and ei.value.hint


def test_sigkill_at_random_moments_never_leaves_an_openable_store(tmp_path, rng):
    X = sp.random(60000, 50, density=0.2, random_state=4, format="csr")
    y = rng.choice([-1.0, 1.0], 60000)
    src = tmp_path / "big.svm"
    write_svm(src, X, y, zero_based=False)
    out = tmp_path / "s"
    for delay in (0.3, 0.9, 1.6, 2.5):
        p = subprocess.Popen(INGEST + [str(src), "-o", str(out), "--quiet", "--no-index",
                                       "--blocks", "8", "--overwrite"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():  # finished before the kill: then it must be whole
            with open_store(out) as s:
                assert s.n_samples == 60000
            import shutil

            shutil.rmtree(out)
        leftovers = [q for q in tmp_path.iterdir() if q.name.startswith(".s.ooc-tmp-")]
        for q in leftovers:
            with pytest.raises(Exception):
                open_store(q)
    r = run_ingest(src, "-o", out, "--quiet", "--no-index", "--blocks", "8")
    assert r.returncode == 0, r.stderr
    with open_store(out) as s:
        assert s.n_samples == 60000
    assert not [q for q in tmp_path.iterdir() if q.name.startswith(".s.ooc-tmp-")]


def test_many_distinct_integer_labels_need_a_task(tmp_path, rng, capsys):
    # 26 integer labels (letters) became a regression target: now a refusal naming the
    # file and both ways out, exit 2, nothing written; --task says which
    src = tmp_path / "letters.svm"
    src.write_text("".join(f"{rng.integers(0, 26)} 1:{rng.random():.3f} 2:{rng.random():.3f}\n"
                           for _ in range(400)))
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(src) in err and "26 distinct integers" in err
    assert "--task multiclass" in err and "--task regression" in err
    assert not (tmp_path / "s").exists()
    for task in ("multiclass", "regression"):
        assert ingest_main([str(src), "-o", str(tmp_path / task), "--task", task,
                            "--quiet"]) == 0
        with open_store(tmp_path / task) as store:
            assert store.task == task


def test_one_label_value_is_refused_unless_the_task_is_given(tmp_path, capsys):
    # every row labelled 0 (the wrong label column, a file of one class): it was refused as
    # "1 distinct integers ... a class per value, or a number?"; now it says what it is.
    # +1 / -1 alone stay binary (a test file of one class), as before
    src = tmp_path / "zeros.svm"
    src.write_text("".join(f"0 1:{i % 7 / 7:.3f} 2:0.5\n" for i in range(50)))
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(src) in err and "has the label 0: one class" in err
    assert "--task binary" in err and "--label-column" in err
    assert not (tmp_path / "s").exists()
    assert ingest_main([str(src), "-o", str(tmp_path / "b"), "--task", "binary",
                        "--quiet"]) == 0
    ones = tmp_path / "ones.svm"
    ones.write_text("".join(f"1 1:{i % 7 / 7:.3f}\n" for i in range(50)))
    assert ingest_main([str(ones), "-o", str(tmp_path / "o"), "--quiet"]) == 0
    with open_store(tmp_path / "o") as store:
        assert store.task == "binary"
    assert "serves as a test set" in capsys.readouterr().err


def test_a_store_of_one_class_is_scored_but_not_trained_on(tmp_path, capsys):
    # it trained to a model of one class, "100.00 %" on itself and in CV, exit 0
    from ooc_learn.cli import predict_main, train_main

    rng = np.random.default_rng(5)
    X = rng.random((80, 3))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    both, ones = tmp_path / "both.svm", tmp_path / "ones.svm"
    dump_svmlight_file(X, y, str(both), zero_based=False)
    dump_svmlight_file(X[y > 0], y[y > 0], str(ones), zero_based=False)
    for src, out in ((both, "b"), (ones, "o")):
        assert ingest_main([str(src), "-o", str(tmp_path / out), "--quiet"]) == 0
    assert train_main([str(tmp_path / "b"), "-o", str(tmp_path / "m.npz"), "--quiet"]) == 0
    capsys.readouterr()
    for extra in ([], ["--cv", "2"], ["--cv", "2", "--cv-method", "tree"],
                  ["--cv", "2", "--learner", "pegasos"], ["--cv", "2", "--C-search"]):
        args = [str(tmp_path / "o"), "--quiet"] + (extra or ["-o", str(tmp_path / "x.npz")])
        assert train_main(args) == 2, extra
        err = capsys.readouterr().err
        assert "has the label 1: a classifier needs rows of both classes" in err
    assert not (tmp_path / "x.npz").exists()
    # CoCoA+ (a sharded store, or one cut into shards) refuses it before it asks the cluster
    from ooc_learn.solvers.cocoa import train_cocoa
    from ooc_learn.storage.errors import ParameterError

    assert ingest_main([str(ones), "-o", str(tmp_path / "sh"), "--shards", "2",
                        "--quiet"]) == 0
    for store in (tmp_path / "o", tmp_path / "sh"):
        with pytest.raises(ParameterError, match="a classifier needs rows of both classes"):
            train_cocoa(str(store), client=None)
    capsys.readouterr()
    # as a test set it is scored (the model's accuracy on its positives)
    assert predict_main([str(tmp_path / "m.npz"), str(tmp_path / "o"), "--quiet",
                         "--json"]) == 0
    assert 0.5 < json.loads(capsys.readouterr().out)["accuracy"] <= 1.0


def test_csv_label_column_by_header_name_and_ambiguity(tmp_path, capsys):
    src = tmp_path / "h.csv"
    src.write_text("f1,f2,label\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(60)))
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet", "--no-index"]) == 0
    with open_store(tmp_path / "s") as st:
        assert st.n_features == 2 and st.task == "binary"
    amb = tmp_path / "amb.csv"
    amb.write_text("class,f2,y\n1,2,3\n")
    capsys.readouterr()
    assert ingest_main([str(amb), "-o", str(tmp_path / "a"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "amb.csv" in err and "'class' (column 0)" in err and "--label-column" in err
    assert not (tmp_path / "a").exists()


def test_idx_source_ingests_and_trains(tmp_path, capsys):
    import struct

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 400).astype(np.uint8)
    imgs = (rng.integers(0, 60, (400, 5, 5)) + 60 * y[:, None, None]).astype(np.uint8)
    for name, arr in (("a-images-idx3-ubyte", imgs), ("a-labels-idx1-ubyte", y)):
        (tmp_path / name).write_bytes(struct.pack(">BBBB", 0, 0, 8, arr.ndim)
                                      + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes())
    assert ingest_main([str(tmp_path / "a-images-idx3-ubyte"), "-o", str(tmp_path / "s"),
                        "--quiet"]) == 0
    with open_store(tmp_path / "s") as st:
        assert (st.n_samples, st.n_features, st.task) == (400, 25, "multiclass")
        assert float(st.read_block(0)[0].max()) <= 1.0
        X0 = stored_as_source_order(st)[0]
    # --format idx, which --help lists, reads them the same (it was refused: exit 2)
    assert ingest_main([str(tmp_path / "a-images-idx3-ubyte"), "-o", str(tmp_path / "f"),
                        "--quiet", "--format", "idx"]) == 0
    with open_store(tmp_path / "f") as st:
        np.testing.assert_array_equal(stored_as_source_order(st)[0], X0)


def test_ingest_reads_standard_input(tmp_path):
    text = "".join(f"{1 if i % 3 else -1} 1:{i % 5} 3:{i % 7}\n" for i in range(200))
    out = subprocess.run(INGEST + ["-", "-o", str(tmp_path / "s"), "--json", "--quiet",
                                   "--no-index"],
                         input=text.encode(), capture_output=True)
    assert out.returncode == 0, out.stderr
    with open_store(tmp_path / "s") as st:
        assert st.n_samples == 200 and st.n_features == 3
        assert st.metadata["sources"][0]["name"] == "<stdin>"
    bad = subprocess.run(INGEST + ["-", "-o", str(tmp_path / "b"), "--quiet"],
                         input=b"1 1:2\nfoo 3:1\n", capture_output=True)
    assert bad.returncode == 2 and b"<stdin>, line 2" in bad.stderr
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ooc-stdin-")]


def test_info_of_a_store_and_of_a_model(tmp_path, capsys):
    """ooc-info STORE says what a cap must hold; ooc-info MODEL what was trained, how, and
    the test figures on record (kept in the model file by ooc-train --test)."""
    from ooc_learn.cli import train_main

    X, y = load_breast_cancer(return_X_y=True)
    X = (X / X.max(axis=0)).astype(np.float32)
    np.save(tmp_path / "d.npy", np.c_[y, X].astype(np.float32))
    assert ingest_main([str(tmp_path / "d.npy"), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    capsys.readouterr()
    assert info_main([str(tmp_path / "s"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["memory"]["all_rows_bytes"] >= X.nbytes // 2
    assert info["memory"]["block_bytes"] <= info["memory"]["all_rows_bytes"]
    from ooc_learn.index import DEFAULT_LEAF_SIZE, DEFAULT_WIDTH

    assert info["index"]["state"] == "ok" and info["index"]["n_leaves"] > 0
    assert (info["index"]["leaf_size"], info["index"]["width"]) == (DEFAULT_LEAF_SIZE,
                                                                    DEFAULT_WIDTH)
    assert info_main([str(tmp_path / "s")]) == 0
    assert f"leaf size {DEFAULT_LEAF_SIZE}, " in capsys.readouterr().out
    assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.h5"), "--solver", "dcd",
                       "--C", "2", "--test", str(tmp_path / "d.npy"), "--quiet",
                       "--json"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert info_main([str(tmp_path / "m.h5"), "--json"]) == 0
    model = json.loads(capsys.readouterr().out)
    assert model["format"] == "h5" and model["solver"] == "dcd" and model["C"] == 2.0
    assert model["n_features"] == 30 and model["task"] == "binary"
    assert model["test"]["accuracy"] == trained["test_accuracy"] and model["test"]["rows"] == 569
    assert info_main([str(tmp_path / "m.h5")]) == 0
    text = capsys.readouterr().out
    assert "dcd/hinge C=2" in text and f"accuracy {100 * trained['test_accuracy']:.2f}%" in text
    assert "classes 0, 1\n" in text  # the source's labels 0 / 1, as it wrote them


def test_an_index_that_is_a_file_or_an_empty_folder_is_named_damaged(tmp_path, capsys):
    # index.lmdb replaced by a plain file (or emptied): ooc-info said "index yes", and
    # ooc-check / ooc-train that it was missing
    import shutil

    from ooc_learn.cli import check_main, index_main, train_main

    X, y = load_breast_cancer(return_X_y=True)
    np.save(tmp_path / "d.npy", np.c_[y, X / X.max(axis=0)].astype(np.float32))
    assert ingest_main([str(tmp_path / "d.npy"), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    index = tmp_path / "s" / "index.lmdb"
    for what, spoil in (("a file, not the index's folder", lambda: index.write_text("x")),
                        ("a folder without the index's data.mdb", index.mkdir)):
        shutil.rmtree(index) if index.is_dir() else index.unlink()
        spoil()
        capsys.readouterr()
        assert info_main([str(tmp_path / "s"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["index"] == {"state": "damaged",
                                                                 "reason": what}
        assert info_main([str(tmp_path / "s")]) == 0
        assert f"index        damaged ({what}): rebuild it with ooc-index" in \
            capsys.readouterr().out
        for main, args in ((check_main, []), (train_main, ["-o", str(tmp_path / "m.npz")])):
            assert main([str(tmp_path / "s"), "--quiet", *args]) == 2
            err = capsys.readouterr().err
            assert f"is damaged ({index} is {what})" in err and "--overwrite" in err, err
        assert check_main([str(tmp_path / "s"), "--quiet"]) == 2
        assert index_main([str(tmp_path / "s"), "--overwrite", "--quiet"]) == 0
        assert check_main([str(tmp_path / "s"), "--quiet"]) == 0


def test_class_names_from_ingest_to_predict(tmp_path, capsys):
    """A CSV whose labels are class names: classes in sorted name order, the names in the
    store and the model; --test and ooc-predict read test files with the same codes and
    print the names; a name the training data lack is refused with its line."""
    from ooc_learn.cli import predict_main, train_main

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    names = np.array(["virginica", "setosa", "versicolor"])[np.argmax(X, axis=1)]
    rows = "".join(",".join(f"{v:.3f}" for v in r) + f",{n}\n" for r, n in zip(X, names))
    (tmp_path / "train.csv").write_text("a,b,c,species\n" + rows)
    assert ingest_main([str(tmp_path / "train.csv"), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    with open_store(tmp_path / "s") as st:
        assert st.task == "multiclass"
        assert st.label_map["names"] == ["setosa", "versicolor", "virginica"]
        order = {"setosa": 0, "versicolor": 1, "virginica": 2}
        got = dict(zip(st.row_ids().tolist(), st.labels().tolist()))
        assert [got[i] for i in range(300)] == [order[n] for n in names]
    capsys.readouterr()
    assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--test",
                       str(tmp_path / "train.csv"), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_accuracy"] > 0.9
    assert predict_main([str(tmp_path / "m.npz"), str(tmp_path / "train.csv"), "-o",
                         str(tmp_path / "p.csv"), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["classes"] == ["setosa", "versicolor", "virginica"] and out["accuracy"] > 0.9
    pred = (tmp_path / "p.csv").read_text().splitlines()[1:]
    assert {line.split(",")[1] for line in pred} <= set(order)
    (tmp_path / "odd.csv").write_text("a,b,c,species\n1,2,3,setosa\n1,2,3,iris\n")
    assert predict_main([str(tmp_path / "m.npz"), str(tmp_path / "odd.csv"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "'iris' is not a class" in err
    # two names: binary, the later name +1; --positive-label takes a name
    assert ingest_main([str(tmp_path / "train.csv"), "-o", str(tmp_path / "p"), "--quiet",
                        "--positive-label", "setosa"]) == 0
    with open_store(tmp_path / "p") as st:
        assert st.task == "binary" and st.label_map["names"] == ["rest", "setosa"]
        assert (st.labels() == 1).sum() == (names == "setosa").sum()


def test_ingest_arrays_takes_string_labels(tmp_path):
    from ooc_learn.api import ingest_arrays

    X = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array(["b", "a", "c", "a", "b", "c"])
    with ingest_arrays(X, y, tmp_path / "s") as st:
        assert st.task == "multiclass" and st.label_map["names"] == ["a", "b", "c"]
        got = dict(zip(st.row_ids().tolist(), st.labels().tolist()))
        assert [got[i] for i in range(6)] == [1, 0, 2, 0, 1, 2]


@pytest.mark.parametrize("text", ["1 1:0.5\n1 2:nan\n", "inf 1:0.5\n"])
def test_a_non_finite_value_or_label_in_text_is_a_value_error_too(tmp_path, text):
    """NonFiniteError: an IngestError (exit 2, the line named) that is also a ValueError,
    whatever the source (text here; arrays and .npy files in test_ingest_direct)."""
    from ooc_learn import NonFiniteError
    from ooc_learn.api import ingest

    src = tmp_path / "bad.svm"
    src.write_text(text)
    with pytest.raises(NonFiniteError, match="line") as ei:
        ingest([src], tmp_path / "s", format="libsvm")
    assert isinstance(ei.value, ValueError) and ei.value.line is not None


def test_features_and_labels_in_two_npy_files_and_npz_member_names(tmp_path, capsys):
    # X.npy with y.npy beside it (numpy's usual pair) took X's first column as the label,
    # silently; --labels names the labels' file. An .npz of data / target or of np.savez's
    # positional arr_0 / arr_1 is read as X / y
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    y = np.where(X[:, 2] > 0, 3, 7)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "dt.npz", data=X, target=y)
    np.savez(tmp_path / "pos.npz", X, y)
    for argv in ([str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy")],
                 [str(tmp_path / "dt.npz")], [str(tmp_path / "pos.npz")]):
        out = tmp_path / "s"
        assert ingest_main(argv + ["-o", str(out), "--quiet", "--overwrite"]) == 0
        with open_store(out) as st:
            Xs, ys, ids = st.read_range(0, st.n_samples)
            assert st.n_features == 6 and st.task == "binary"
            assert np.array_equal(np.asarray(Xs)[np.argsort(ids)], X)
            assert np.array_equal(np.asarray(ys)[np.argsort(ids)], np.where(y == 7, 1.0, -1.0))
    capsys.readouterr()
    # X.npy alone, y.npy beside it: the first column is the label, and a warning says so
    assert ingest_main([str(tmp_path / "X.npy"), "-o", str(tmp_path / "s"), "--quiet",
                        "--overwrite"]) == 0
    assert "--labels" in capsys.readouterr().err
    np.save(tmp_path / "short.npy", y[:10])
    assert ingest_main([str(tmp_path / "X.npy"), "--labels", str(tmp_path / "short.npy"),
                        "-o", str(tmp_path / "t"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "10 labels" in err and "400 rows" in err and not (tmp_path / "t").exists()
    assert ingest_main([str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"),
                        "--label-column", "0", "-o", str(tmp_path / "t"), "--quiet"]) == 2
    capsys.readouterr()
    (tmp_path / "y.txt").write_text("\n".join(map(str, y)))
    assert ingest_main([str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.txt"),
                        "-o", str(tmp_path / "t"), "--quiet"]) == 2
    assert "not a .npy array" in capsys.readouterr().err  # not numpy's word of pickles


def test_a_csv_headers_names_guard_the_columns_of_scoring_and_of_more_sources(tmp_path,
                                                                               capsys):
    # a test CSV with the training columns in another order, or other columns, was scored
    # by position, silently wrong; the header's names now travel with the store and model
    from ooc_learn.cli import predict_main, train_main

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 3))
    y = np.where(X[:, 0] - X[:, 2] > 0, "yes", "no")

    def write(path, names, cols):
        with open(path, "w") as fh:
            fh.write(",".join(names + ["label"]) + "\n")
            for row, lab in zip(X[:, cols], y):
                fh.write(",".join(f"{v:.5f}" for v in row) + f",{lab}\n")

    write(tmp_path / "train.csv", ["a", "b", "c"], [0, 1, 2])
    write(tmp_path / "same.csv", ["a", "b", "c"], [0, 1, 2])
    write(tmp_path / "swapped.csv", ["c", "b", "a"], [2, 1, 0])
    write(tmp_path / "other.csv", ["a", "b", "d"], [0, 1, 2])
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(tmp_path / "train.csv"), "-o", str(store), "--quiet"]) == 0
    with open_store(store) as st:
        assert st.metadata["feature_names"] == ["a", "b", "c"]
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    assert predict_main([str(model), str(tmp_path / "same.csv"), "--quiet"]) == 0
    capsys.readouterr()
    assert predict_main([str(model), str(tmp_path / "swapped.csv"), "--quiet"]) == 2
    assert "in another order" in capsys.readouterr().err
    assert predict_main([str(model), str(tmp_path / "other.csv"), "--quiet"]) == 2
    assert "column 3 is 'd' there and 'c' in training" in capsys.readouterr().err
    assert train_main([str(store), "-o", str(model), "--quiet", "--test",
                       str(tmp_path / "swapped.csv")]) == 2
    # two sources of one store: the same header, or refused naming the column
    assert ingest_main([str(tmp_path / "train.csv"), str(tmp_path / "swapped.csv"), "-o",
                        str(tmp_path / "two"), "--quiet"]) == 2
    assert "column 1 is 'c' here and 'a' there" in capsys.readouterr().err
    assert not (tmp_path / "two").exists()


def test_a_test_csv_is_read_with_the_training_label_column(tmp_path, capsys):
    # trained with --label-column quality (the last column, no usual label name): a test
    # CSV of the same header took its first column as the label (and the label as a
    # feature); the label column's name travels with the store and the model
    from ooc_learn.cli import predict_main, train_main

    rng = np.random.default_rng(6)
    X = rng.normal(size=(200, 2))
    q = X @ [2.0, -1.0] + 0.1 * rng.normal(size=200)
    text = "f1,f2,quality\n" + "".join(f"{a:.4f},{b:.4f},{c:.4f}\n" for (a, b), c in zip(X, q))
    (tmp_path / "train.csv").write_text(text)
    (tmp_path / "test.csv").write_text(text)
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(tmp_path / "train.csv"), "-o", str(store), "--task", "regression",
                        "--label-column", "quality", "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    assert predict_main([str(model), str(tmp_path / "test.csv"), "--json", "--quiet"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["rmse"] < 0.2 and "warning" not in got.err


def test_rows_without_labels_are_predicted_and_a_file_to_score_that_lacks_them_is_named(
        tmp_path, capsys):
    # a CSV of the model's features alone crashed in the label mapping (IndexError) after a
    # warning that its first feature was taken for the label; numbers in the label column
    # of a model trained on class names were read as class codes. Now ooc-predict labels
    # rows without labels (a header naming the model's features alone, or --no-labels)
    from ooc_learn.cli import predict_main, train_main

    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 3))
    kind = np.array(["ant", "bee", "cat"])[np.argmax(X, axis=1)]
    rows = lambda cols, lab: "".join(",".join([*(f"{v:.4f}" for v in x[cols]), *lab(i)]) + "\n"
                                     for i, x in enumerate(X))
    named = lambda i: [kind[i]]
    (tmp_path / "train.csv").write_text("a,b,c,kind\n" + rows([0, 1, 2], named))
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(tmp_path / "train.csv"), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    (tmp_path / "features.csv").write_text("a,b,c\n" + rows([0, 1, 2], lambda i: []))
    (tmp_path / "bare.csv").write_text(rows([0, 1, 2], lambda i: []))

    def predicted(name, *flags):
        out = tmp_path / f"{name}.pred"
        assert predict_main([str(model), str(tmp_path / name), "-o", str(out), "--json",
                             "--quiet", *flags]) == 0
        return json.loads(capsys.readouterr().out), out.read_text().splitlines()

    capsys.readouterr()
    scored, want = predicted("train.csv")
    assert scored["labelled"] and scored["accuracy"] > 0.8
    for name, flags in (("features.csv", ()), ("bare.csv", ("--no-labels",)),
                        ("features.csv", ("--no-labels",))):
        summary, got = predicted(name, *flags)
        assert not summary["labelled"] and "accuracy" not in summary, (name, summary)
        counted = [line.split(",")[1] for line in got[1:]]
        assert summary["predicted"] == {c: counted.count(c) for c in set(counted)}
        assert got == want, name  # the same labels and decision values, row by row
    cases = {
        "bare.csv": ((), "no label column", "--no-labels"),
        "narrow.csv": ((), "2 features and a label", ""),
        "codes.csv": ((), "holds numbers", ""),
        "train.csv": (("--no-labels",), "4 columns", "drop --no-labels"),
    }
    (tmp_path / "narrow.csv").write_text("b,c,kind\n" + rows([1, 2], named))
    (tmp_path / "codes.csv").write_text(
        "a,b,c,kind\n" + rows([0, 1, 2], lambda i: [str("abc".index(kind[i][0]))]))
    for name, (flags, says, hint) in cases.items():
        assert predict_main([str(model), str(tmp_path / name), "--quiet", *flags]) == 2, name
        err = capsys.readouterr().err
        assert name in err and says in err and hint in err and "Traceback" not in err, err
    assert predict_main([str(model), str(store), "--no-labels", "--quiet"]) == 2
    assert "is a store" in capsys.readouterr().err
    # --test scores: it needs labels, and is read before training (nothing trained)
    out = tmp_path / "m2.npz"
    assert train_main([str(store), "-o", str(out), "--test", str(tmp_path / "bare.csv"),
                       "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no label column" in err and "--no-labels" not in err and not out.exists(), err


def test_hints_name_flags_that_exist_and_the_likely_fix(tmp_path, capsys):
    # found by a new-user run: hints named flags no command has (npz_keys=, --n-features on
    # ooc-predict), advice against the defaults (leaves "of about a hundred rows"), or left
    # the user guessing (a mistyped label column, a model and a store swapped)
    from ooc_learn.cli import index_main, predict_main, train_main

    rng = np.random.default_rng(2)
    header = ",".join([f"c{i}" for i in range(30)] + ["target"])
    body = "".join(",".join([f"{v:.3f}" for v in rng.normal(size=30)] + [str(i % 2)]) + "\n"
                   for i in range(60))
    (tmp_path / "wide.csv").write_text(header + "\n" + body)
    capsys.readouterr()
    assert ingest_main([str(tmp_path / "wide.csv"), "-o", str(tmp_path / "s"),
                        "--label-column", "targte", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "31:" in err and "target" in err and "--label-column target?" in err, err
    svm = tmp_path / "t.svm"
    svm.write_text("+1 1:1 2:0.5\n-1 1:-1 3:2\n" * 30)
    assert ingest_main([str(svm), "-o", str(tmp_path / "s"), "--format", "csv",
                        "--quiet"]) == 2
    assert "drop --format" in capsys.readouterr().err
    assert ingest_main([str(svm), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    assert index_main([str(tmp_path / "s"), "--leaf-size", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "hundred" not in err and "--leaf-size 16" in err, err
    model = tmp_path / "m.npz"
    assert train_main([str(tmp_path / "s"), "-o", str(model), "--quiet"]) == 0
    capsys.readouterr()
    assert predict_main([str(tmp_path / "s"), str(model), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is a store" in err and "MODEL DATA" in err, err
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(model.read_bytes()[:300])
    assert info_main([str(damaged)]) == 2
    assert "not an ooc-learn model file" in capsys.readouterr().err


def test_check_says_where_a_store_has_no_index(tmp_path, capsys):
    # a store whose index.lmdb was removed passed as "whole", then ooc-train refused it
    import shutil

    from ooc_learn.cli import check_main

    src = tmp_path / "t.svm"
    src.write_text("+1 1:1 2:0.5\n-1 1:-1 3:2\n" * 30)
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    capsys.readouterr()
    assert check_main([str(tmp_path / "s"), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["indexed"] is True
    # a damaged index over whole data: the cheap fix (ooc-index), not a new ingest
    shutil.copytree(tmp_path / "s", tmp_path / "d")
    mdb = tmp_path / "d" / "index.lmdb" / "data.mdb"
    raw = bytearray(mdb.read_bytes())
    raw[8192:8592] = bytes(b ^ 0xFF for b in raw[8192:8592])
    mdb.write_bytes(bytes(raw))
    assert check_main([str(tmp_path / "d"), "--quiet"]) == 2
    assert f"ooc-index {tmp_path / 'd'} --overwrite" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "s" / "index.lmdb")
    assert check_main([str(tmp_path / "s"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "whole" in out and "no metric-forest index" in out and "ooc-index" in out, out


def test_a_regression_target_is_stored_exactly_by_every_ingest_path(tmp_path):
    # targets were stored as float32: 1e8 + x rounded to steps of 8, RMSE 2.2 where the
    # noise is 0.01, without a word
    from ooc_learn.api import ingest_arrays
    from ooc_learn.training import train

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40_000, 2))  # 960 KB of npy: past the 3M cap's write buffer
    y = 1e8 + X @ [3.0, -1.0] + 0.01 * rng.normal(size=X.shape[0])
    (tmp_path / "t.csv").write_text("y,a,b\n" + "".join(
        f"{v!r},{a!r},{b!r}\n" for v, (a, b) in zip(y.tolist(), X.astype(np.float32).tolist())))
    np.save(tmp_path / "t.npy", np.hstack([y[:, None], X.astype(np.float32)]))
    stores = [ingest([tmp_path / "t.csv"], tmp_path / "csv", task="regression"),
              ingest([tmp_path / "t.npy"], tmp_path / "npy", task="regression",
                     label_column=0, memory="3M"),  # read directly, the labels spooled
              ingest_arrays(X.astype(np.float32), y, tmp_path / "arr", task="regression")]
    assert stores[1].ingest_stats["direct_passes"]
    for store in stores:
        with store:
            _, ys, ids = store.read_range(0, store.n_samples)
            assert np.array_equal(ys, y[ids]), store.path
            model = train(store, C=1e10)
            rmse = np.sqrt(np.mean((model.predict(X.astype(np.float32)) - y) ** 2))
            assert rmse < 0.02, (store.path, rmse)
