"""A first run under --memory compiles its kernels first, in helpers on the head of its input
(ooc_learn._warmup), so that the command itself loads them within its cap."""

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import ooc_learn
from ooc_learn import _warmup
from ooc_learn.cli import warmup as helper
from ooc_learn.storage.store import open_store


def _store(path, *, sparse=False, n=8000, d=50, blocks=2, index=True):
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(n, d)) * np.linspace(0.1, 2.0, d)).astype(np.float32)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    if sparse:
        X = sp.csr_matrix(np.where(np.abs(X) > 1.0, X, 0.0))
    ooc_learn.ingest_arrays(X, y, path, n_blocks=blocks, build_index=index).close()
    return str(path)


def test_kernel_files_are_told_cached_by_their_index_files_and_dates(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    src = pkg / "kern.py"
    src.write_text("def f(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    kernels = [("fakepkg.kern", "f")]
    assert not _warmup.kernel_files_cached(kernels)  # no index file
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    index = pkg / "__pycache__" / f"kern.f-1.{tag}.nbi"
    index.write_bytes(b"x")
    os.utime(src, (1_000_000, 1_000_000))
    assert _warmup.kernel_files_cached(kernels)
    os.utime(src, (4_000_000_000, 4_000_000_000))  # the source changed after the cache
    assert not _warmup.kernel_files_cached(kernels)
    os.utime(src, (1_000_000, 1_000_000))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nc"))  # numba's cache elsewhere:
    assert not _warmup.kernel_files_cached(kernels)  # the in-tree file is not numba's now
    moved = Path(_warmup.numba_cache_dir(str(src)))
    moved.mkdir(parents=True)
    (moved / index.name).write_bytes(b"x")
    assert _warmup.kernel_files_cached(kernels)


def test_the_cache_folder_is_where_numba_puts_it(tmp_path, monkeypatch):
    """Against numba's own locators, for a kernel of the package."""
    from numba.core import caching

    from ooc_learn.solvers import _kernels

    func = _kernels.dcd_solve.py_func
    src = func.__code__.co_filename
    assert _warmup.numba_cache_dir(src) == caching.InTreeCacheLocator(
        func, src).get_cache_path()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(caching.config, "CACHE_DIR", str(tmp_path))
    assert _warmup.numba_cache_dir(src) == caching.UserProvidedCacheLocator(
        func, src).get_cache_path()
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a folder numba cannot write
    assert _warmup.numba_cache_dir(src) == caching.UserWideCacheLocator(
        func, src).get_cache_path()


def test_a_source_head_keeps_its_first_lines_and_format(tmp_path):
    lines = [f"{1 if i % 2 else -1} 1:{i} 3:0.5\n".encode() for i in range(helper.HEAD_LINES
                                                                             + 500)]
    src = tmp_path / "train.svm.gz"
    with gzip.open(src, "wb") as f:
        f.writelines(lines)
    out = tmp_path / "heads"
    out.mkdir()
    head = helper._source_head(str(src), out)
    assert head.name.endswith("train.svm")  # decompressed, the format's own name kept
    assert head.read_bytes() == b"".join(lines[:helper.HEAD_LINES])
    a = np.arange(3 * (helper.HEAD_ROWS + 10), dtype=np.float32).reshape(-1, 3)
    np.save(tmp_path / "X.npy", a)
    got = np.load(helper._source_head(str(tmp_path / "X.npy"), out))
    assert np.array_equal(got, a[:helper.HEAD_ROWS])
    assert helper._source_head("-", out) is None  # standard input cannot be cut


def test_heads_of_wide_data_stop_at_their_byte_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(helper, "HEAD_BYTES", 1000)
    row = ",".join(["0.5"] * 100) + "\n"  # 400 bytes a line
    src = tmp_path / "wide.csv"
    src.write_text("label," + ",".join(f"f{i}" for i in range(99)) + "\n" + row * 50)
    out = tmp_path / "heads"
    out.mkdir()
    head = helper._source_head(str(src), out).read_bytes()
    text = src.read_bytes()
    assert text.startswith(head) and head.endswith(b"\n")
    assert 1000 <= len(head) < 1000 + len(row) and head.count(b"\n") == 3
    np.save(tmp_path / "X.npy", np.zeros((50, 100), np.float32))  # 400 bytes a row
    assert np.load(helper._source_head(str(tmp_path / "X.npy"), out)).shape == (2, 100)
    store = _store(tmp_path / "s", n=500, d=100, blocks=1, index=False)
    with open_store(helper._store_head(store, tmp_path / "h")) as head_store:
        assert head_store.n_samples == 64  # 64 rows at least, HEAD_BYTES allowing fewer


@pytest.mark.parametrize("sparse", [False, True])
def test_the_train_head_keeps_layout_task_folds_and_reads_no_further(tmp_path, sparse):
    store = _store(tmp_path / "s", sparse=sparse)
    test = tmp_path / "t.svm"
    test.write_text("1 1:0.5 2:1\n-1 1:-0.5 3:1\n")
    work = tmp_path / "w"
    work.mkdir()
    args = _train_args([store, "-o", str(tmp_path / "m.h5"), "--cv", "5", "--test", str(test),
                        "--jobs", "2", "--memory", "300M"])
    assert helper._prepare_train(args, work)
    with open_store(args.store) as head, open_store(store) as full:
        assert head.layout == full.layout and head.task == full.task
        assert head.n_samples == min(helper.HEAD_ROWS, full.n_samples)
        assert head.n_features == min(helper.HEAD_FEATURES, full.n_features)
        assert head.n_blocks >= 5 and head.has_index
        # the store's first rows, cut to the first features (in the head's own row order)
        X, y, _ = head.read_range(0, head.n_samples)
        X0, y0, _ = full.read_range(0, head.n_samples)
        X = X.toarray() if sparse else X
        X0 = (X0.toarray() if sparse else X0)[:, :helper.HEAD_FEATURES]
        key = lambda X, y: np.lexsort(np.column_stack([y, X]).T)  # noqa: E731
        assert np.array_equal(np.column_stack([y, X])[key(X, y)],
                              np.column_stack([y0, X0])[key(X0, y0)])
    # the test file's parsers compiled on its head, not scored against the cut features
    assert args.test is None and (work / "test-head.store").exists()
    assert args.output == str(work / "model.h5") and args.jobs == 1
    # a run that does not search the index gets a head without one (building it loaded the
    # tree builder's kernels into every helper: a TreeCV first run in the 10x setting took
    # 494.7 s, its helpers stalled then thrashing; 45.4 s since)
    for other in (["--cv", "5", "--cv-method", "tree"], ["--solver", "dcd"]):
        (work / "head.store").rename(work / f"old{len(other)}")
        args = _train_args([store, "-o", str(tmp_path / "m.h5"), *other])
        assert helper._prepare_train(args, work)
        with open_store(args.store) as head:
            assert not head.has_index


def test_the_predict_head_keeps_every_feature_and_writes_in_the_helpers_folder(tmp_path):
    from ooc_learn.cli.predict import predict_command

    store = _store(tmp_path / "s", n=9000, d=40)
    work = tmp_path / "w"
    work.mkdir()
    args = predict_command()[0].parse_args(["m.npz", store, "-o", str(tmp_path / "p.csv")])
    assert helper._prepare_predict(args, work)
    with open_store(args.data) as head:  # the model's input: all 40 features
        assert head.n_features == 40 and head.n_samples == helper.HEAD_ROWS
    assert args.output == str(work / "predictions.csv") and args.model == "m.npz"
    src = tmp_path / "t.svm"
    src.write_text("1 1:0.5\n" * 5000)
    args = predict_command()[0].parse_args(["m.npz", str(src), "-o", "-"])
    assert helper._prepare_predict(args, work) and args.output is None
    assert sum(1 for _ in open(args.data)) == helper.HEAD_LINES


def test_a_runs_main_kernels_follow_its_source_solver_and_search_loop(tmp_path):
    """What decides whether a run is a first run: its own main kernels (an IBCD run under a
    cap that does not hold the store never calls the compiled search loop; a dcd run never
    calls IBCD's: requiring those, such runs warmed up again every time)."""
    first = _warmup.first_run_kernels
    tree, search, leaf, dual = _warmup._TREE, _warmup._SEARCH, _warmup._LEAF_SCAN, \
        _warmup._DUAL_CD
    (tmp_path / "a.svm").write_text("# comment\n1 1:0.5 3:2\n-1 2:1\n")
    (tmp_path / "a.csv").write_text("y,a,b\n1,0.5,2\n")
    with gzip.open(tmp_path / "a.svm.gz", "wt") as fh:
        fh.write("+1 4:1e-3\n")
    ingest = argparse.Namespace(format="auto", no_index=False)
    for sources, parsers in ((["a.svm"], ["parse_libsvm"]), (["a.csv"], ["parse_csv"]),
                             (["a.svm.gz", "a.csv"], ["parse_csv", "parse_libsvm"]),
                             (["x.npy"], [])):
        ingest.sources = [str(tmp_path / f) for f in sources]
        assert first("ooc-ingest", ingest) == tuple(
            ("ooc_learn.storage._parse_kernels", k) for k in parsers) + (tree,)
    ingest.format, ingest.no_index = "csv", True
    assert first("ooc-ingest", ingest) == (_warmup._PARSERS["csv"],)
    assert first("ooc-index", argparse.Namespace(store="s")) == (tree,)
    start = (_warmup._kernel("_plus_one"), _warmup._kernel("_fail"))
    assert first("ooc-predict", argparse.Namespace(data=str(tmp_path / "a.svm.gz"))) == (
        start + (_warmup._PARSERS["libsvm"],))
    assert first("ooc-predict", argparse.Namespace(data=str(tmp_path / "x.npy"))) == start

    store = _store(tmp_path / "s", n=3000, d=10, blocks=3)
    rows = 3000 * 4 * (10 + 3)  # the search's estimate of the store's rows
    train = argparse.Namespace(store=store, solver=None)
    assert first("ooc-train", train, rows) == (search, dual)
    assert first("ooc-train", train, rows - 1) == (leaf, dual)
    assert first("ooc-train", argparse.Namespace(store="missing", solver="ibcd"), 1) == (
        search, dual)
    train.solver = "dcd"
    assert first("ooc-train", train, rows) == (_warmup._DCD_EPOCH,)
    train.solver = "pegasos"
    assert first("ooc-train", train)[0][1] == "pegasos_pass"
    for cv in (dict(solver="pegasos"), dict(solver=None, cv_method="tree"),
               dict(solver=None, learner="lsqsgd")):  # TreeCV / k-fold of a learner
        assert first("ooc-train", argparse.Namespace(store=store, cv=5, **cv)) == (
            _warmup._kernel("decision_range"),)
    reg = tmp_path / "r"
    X = np.random.default_rng(0).normal(size=(200, 3)).astype(np.float32)
    ooc_learn.ingest_arrays(X, X[:, 0], reg, task="regression", build_index=False).close()
    assert first("ooc-train", argparse.Namespace(store=str(reg), solver=None)) == ()
    assert first("ooc-train", argparse.Namespace(store=str(reg), solver="dcd"))[0][1] == \
        "svr_epoch"
    assert first("ooc-predict", argparse.Namespace(data=store)) == start


CALLED = r"""
import importlib, json, sys
from ooc_learn import _warmup
from ooc_learn.cli import ingest_main, predict_main, train_main
from ooc_learn.cli.ingest import ingest_command
from ooc_learn.cli.predict import predict_command
from ooc_learn.cli.train import train_command
from ooc_learn.index import view

def called(kernel):
    module, name = kernel
    return bool(getattr(importlib.import_module(module), name).signatures)

out = []
for prog, argv, cap, python_loop in json.loads(sys.argv[1]):
    command, main = {"ooc-train": (train_command, train_main),
                     "ooc-ingest": (ingest_command, ingest_main),
                     "ooc-predict": (predict_command, predict_main)}[prog]
    parser = command()[0]
    kernels = _warmup.first_run_kernels(prog, parser.parse_args(argv), cap)
    view.HOLDS_DATA = False if python_loop else None
    rc = main(argv + ["--quiet"])
    out.append([prog, rc, [k[1] for k in kernels if not called(k)],
                called(_warmup._SEARCH)])
print(json.dumps(out))
"""


def test_the_main_kernels_named_are_the_ones_the_run_calls(tmp_path):
    """Each run of a fresh process (kernels from numba's cache) calls the kernels
    first_run_kernels names for it; the Python search loop (the warm-up helper's run on the
    head of a store the command's cap does not hold) never calls the compiled one."""
    store = _store(tmp_path / "s", n=4000, d=10, blocks=3)
    (tmp_path / "a.svm").write_text("".join(f"{(-1) ** i} 1:{i % 7} 3:0.5\n"
                                            for i in range(300)))
    (tmp_path / "a.csv").write_text("".join(f"{i % 2},{i % 7},0.5\n" for i in range(300)))
    (tmp_path / "p.svm").write_text("".join(f"{(-1) ** i} 1:{i % 7} 10:0.5\n"
                                            for i in range(300)))
    out = tmp_path / "m.npz"
    # each kernel is checked in a process where no earlier run called it
    batches = [
        [["ooc-train", [store, "-o", str(out)], 1, True],       # capped: the Python loop
         ["ooc-train", [store, "-o", str(out)], None, False],   # the compiled loop
         ["ooc-train", [store, "-o", str(out), "--solver", "pegasos"], None, False],
         ["ooc-predict", [str(out), str(tmp_path / "p.svm")], None, False]],
        [["ooc-train", [store, "-o", str(out), "--solver", "dcd"], None, False],
         ["ooc-train", [store, "--cv", "3", "--cv-method", "tree"], None, False],
         ["ooc-ingest", [str(tmp_path / "a.svm"), "-o", str(tmp_path / "i1")], None, False],
         ["ooc-ingest", [str(tmp_path / "a.csv"), "-o", str(tmp_path / "i2"),
                         "--label-column", "0"], None, False]],
    ]
    for batch in batches:
        run = subprocess.run([sys.executable, "-c", CALLED, json.dumps(batch)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        results = json.loads(run.stdout.strip().splitlines()[-1])
        for (prog, rc, not_called, search_called), (_, argv, cap, python_loop) in zip(
                results, batch):
            assert rc == 0 and not_called == [], (prog, argv, not_called)
        if batch is batches[0]:
            assert [r[3] for r in results] == [False, True, True, True]


def _train_args(argv):
    from ooc_learn.cli.train import _train_parser

    return _train_parser().parse_args(argv)


def test_the_helper_trains_on_the_head_and_stops_where_its_rss_passes_its_share(tmp_path):
    store = _store(tmp_path / "s", n=3000, d=10, blocks=2)
    argv = json.dumps([store, "-o", str(tmp_path / "m.npz"), "--solver", "dcd",
                       "--memory", "100M"])
    env = dict(os.environ, OOC_WARMUP="0", OOC_COMPILE_AHEAD="0")
    folder = tmp_path / "w"
    folder.mkdir()
    run = subprocess.run([sys.executable, "-m", "ooc_learn.cli.warmup", "ooc-train", argv,
                          str(folder)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (folder / "model.npz").exists() and not (tmp_path / "m.npz").exists()
    env["OOC_WARMUP_RSS"] = str(1 << 20)  # past at once: the next helper goes on
    run = subprocess.run([sys.executable, "-m", "ooc_learn.cli.warmup", "ooc-train", argv,
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == _warmup.AGAIN


def test_helpers_go_on_while_each_adds_kernels_and_the_command_goes_on_after(monkeypatch):
    monkeypatch.delenv("OOC_WARMUP", raising=False)
    monkeypatch.setattr(_warmup, "kernel_files_cached", lambda kernels: False)
    rounds, counts = [], iter([10, 14, 20, 20])
    monkeypatch.setattr(_warmup, "cached_kernel_count", lambda: next(counts))
    plan = iter([_warmup.AGAIN, _warmup.AGAIN, 0])

    def helper(cmd, env, end, stop):
        rounds.append((cmd[3], env.get("OOC_WARMUP_RSS"), env["OOC_WARMUP"],
                       os.path.isdir(cmd[5])))
        return next(plan)

    monkeypatch.setattr(_warmup, "_run_helper", helper)
    args = argparse.Namespace(quiet=True)
    assert _warmup.warm_up_first("ooc-train", ["s"], args, cap=1 << 30)
    assert len(rounds) == 3 and all(r[0] == "ooc-train" and r[2] == "0" and r[3]
                                    for r in rounds)
    assert int(rounds[0][1]) < 1 << 30  # the cap less this process's RSS
    # a helper that stops without caching a kernel more: a last one without the limit
    rounds.clear()
    counts, plan = iter([10, 10]), iter([_warmup.AGAIN, 0])
    monkeypatch.setattr(_warmup, "cached_kernel_count", lambda: next(counts))
    assert _warmup.warm_up_first("ooc-train", ["s"], args, cap=1 << 30)
    assert len(rounds) == 2 and rounds[1][1] is None


def test_no_warm_up_where_cached_switched_off_on_dask_or_for_other_commands(monkeypatch):
    ran = []
    monkeypatch.setattr(_warmup, "_run_helper", lambda *a: ran.append(a) or 0)
    args = argparse.Namespace(quiet=True, workers=None, scheduler=None)
    monkeypatch.setattr(_warmup, "kernel_files_cached", lambda kernels: True)
    assert not _warmup.warm_up_first("ooc-train", [], args, cap=1 << 30)
    monkeypatch.setattr(_warmup, "kernel_files_cached", lambda kernels: False)
    monkeypatch.setenv("OOC_WARMUP", "0")
    assert not _warmup.warm_up_first("ooc-train", [], args, cap=1 << 30)
    monkeypatch.delenv("OOC_WARMUP")
    assert not _warmup.warm_up_first("ooc-check", [], args, cap=1 << 30)
    assert not _warmup.warm_up_first("ooc-train", [], argparse.Namespace(quiet=True, workers=2),
                                  cap=1 << 30)
    assert not ran
    assert _warmup.warm_up_first("ooc-train", [], args, cap=1 << 30) and len(ran) == 1


def test_a_first_run_under_a_cap_compiles_in_helpers_and_stays_within_it(tmp_path,
                                                                          monkeypatch):
    """End to end, numba's cache empty (a fresh NUMBA_CACHE_DIR): the command says it
    compiles first, its peak RSS (and each helper's: the wrapper reads the largest) is within
    --memory, and its kernels are in the cache after, those the run never reaches too.
    In-process, the same first run of ooc-train on a9a peaked at 297-304 MiB under --memory
    300M (session 45)."""
    from ooc_learn.storage.measure import (memory_cgroup_available, run_in_memory_cgroup,
                                           run_measured)

    store = _store(tmp_path / "s", n=20000, d=20, blocks=4)
    cache = tmp_path / "numba-cache"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    monkeypatch.delenv("OOC_WARMUP", raising=False)
    cap = 300 << 20
    cmd = [sys.executable, "-c",
           "import sys; from ooc_learn.cli import train_main; sys.exit(train_main())",
           store, "-o", str(tmp_path / "m.npz"), "--memory", str(cap)]
    if memory_cgroup_available()[0]:
        r = run_in_memory_cgroup(cmd, cap + (64 << 20), drop_caches=False, timeout=600)
        assert r["oom_kills"] == 0
    else:
        r = run_measured(cmd, timeout=600)
    assert r["rc"] == 0, r["stderr"]
    assert "compiling kernels first" in r["stderr"]
    assert r["peak_rss_bytes"] <= cap, (r["peak_rss_bytes"] - cap) / 2**20
    assert _warmup.kernel_files_cached(_warmup.first_run_kernels(
        "ooc-train", argparse.Namespace(store=store, solver=None), cap))
    # and the kernels that run only at scale, which neither the head's run nor the command's
    # on this small store reaches (the capped search's leaf scan, a .npy's direct ingest)
    from ooc_learn._jit import AT_SCALE, MODULES

    assert _warmup.kernel_files_cached([(MODULES[k], k) for k in AT_SCALE["ooc-train"]])
