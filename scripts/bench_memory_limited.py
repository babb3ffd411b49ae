#!/usr/bin/env python
"""Every ooc-learn command and two streaming peers, each inside its own memory cgroup.

The memory-limited scenario, built here end to end:

* data: augmented Fashion-MNIST, "tops vs rest" (+1 for T-shirt, pullover, dress, coat,
  shirt; -1 for the rest, about balanced). Each of the 60k training images in 17 versions by
  default (the identity and 16 pixel shifts, zero-filled at the border), pixels / 255 as
  float32: 1,020,000 x 784 = 3.2 GB, written in chunks as ``WORK/train.npy`` (float32,
  (N, 785), column 0 the label), image-major (the 17 versions of an image are consecutive;
  the ingest shuffles into blocks, the peers stream the file as a user's source would be).
  The 10k t10k images, unaugmented, are ``WORK/test.npy`` (same layout). Files are reused
  while ``WORK/data.json`` matches ``--rows``.
* settings: ``1g`` (a 1 GiB cgroup, ``--memory 768M``) and ``10x`` (the paper's 10x setting:
  data 10x the cap; a 320 MiB cgroup, ``--memory 224M``). The page cache is dropped before
  each run, and each run gets a fresh cgroup (storage.measure.run_in_memory_cgroup): its
  peak RSS (the command's own, from RUSAGE_CHILDREN), the cgroup's peak (page cache
  included, so a command that streams a big file sits near the limit however little it
  holds), OOM kills, bytes read from storage.
* ours: ``ooc-ingest`` (a store per setting), ``ooc-train`` with ``ibcd`` (exact stop),
  ``ibcd`` in the paper's setting (``--truncate 1 --sample-eps 0.05``), ``dcd``, ``bm``,
  ``pegasos`` (each with ``--test test.npy``), ``ooc-predict`` of the ibcd model, TreeCV
  10-fold of Pegasos (``ooc-train --cv 10``) and ``SparseRLS.fit(store)`` (Python API);
  by name only (``--only ibcd-first``), the exact stop's first run with numba's cache empty.
* peers, in the same cgroup: scikit-learn ``SGDClassifier(hinge, alpha=1/(C n))``
  ``partial_fit`` over 10,000-row chunks of the memory-mapped ``train.npy`` (chunk order
  permuted per epoch, 3 epochs); Vowpal Wabbit (``vowpalwabbit`` package): a text file written
  from the memory-mapped array (its own row, ``vw-convert``), then ``--loss_function hinge
  --passes 3 -c -k --holdout_off`` (``--holdout_off``: VW would otherwise keep every 10th row
  out of training and stop early on it; every other run trains on all rows).
  The peers' peak RSS includes the resident pages of the mapped file (reclaimable).
* reference, outside any cgroup: LIBLINEAR ``-s 3 -c 1 -B 1`` (the hinge and C of ibcd) on
  the whole training set in memory (~14 GB and ~500 s at 1.02M rows), cached in
  ``WORK/liblinear-*.json``.

Its ``read_back`` column is IBCD's rows of the active set spilled to disk and read back from
there (``ooc-train --json``'s ``rows_read_back``); ``read GiB`` counts those reads too.
It prints one row per run and the ratios the issue targets (IBCD wall / SGD 3-epoch wall,
10x wall / 1g wall per command, accuracy minus LIBLINEAR's), and writes everything to
``--json-out``. A command that fails or is OOM-killed is a finding: its row shows rc and the
OOM count and the run goes on. Where no cgroup can be made (not root, no memory controller)
the runs fall back to run_measured (no enforced limit) and the header says so.

Usage::

    python scripts/bench_memory_limited.py                         # 1.02M rows, both settings
    python scripts/bench_memory_limited.py --rows 60000 --setting 1g --no-liblinear  # ~2 min
    python scripts/bench_memory_limited.py --rows 60000    # both settings, ~7.5 min (dcd
                                                           # in the 10x setting: 216 s of it)
    python scripts/bench_memory_limited.py --setting 10x --only ingest,ibcd,sgd
    python scripts/bench_memory_limited.py --only ibcd,ibcd-first   # a fresh install's first run
    python scripts/bench_memory_limited.py --json-out bench_out/memory_limited.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _bench_data import DATA, read_idx  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
# 10x-288: the same 320 MiB cgroup with --memory 288M: --memory is the whole process, so the
# 64 MiB more all go to the working share beside the fixed part (interpreter, numba and its
# kernels, h5py); its size when this setting was added is in docs/bench-log.md
SETTINGS = {"1g": (1 * GiB, "768M"), "10x": (320 * MiB, "224M"),
            "10x-288": (320 * MiB, "288M")}
TOPS = (0, 2, 3, 4, 6)                    # T-shirt, pullover, dress, coat, shirt
# (dx, dy) in a fixed order: 8 one-pixel shifts, 8 two-pixel ones along the axes and
# diagonals (with the identity: the 17 versions), then the 8 knight's moves (up to 25).
SHIFTS = ([(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)]
          + [(2, 0), (-2, 0), (0, 2), (0, -2), (2, 2), (2, -2), (-2, 2), (-2, -2)]
          + [(1, 2), (2, 1), (-1, 2), (-2, 1), (1, -2), (2, -1), (-1, -2), (-2, -1)])
VERSIONS = [(0, 0)] + SHIFTS
RUNS = ("ingest", "ibcd", "ibcd-paper", "dcd", "bm", "pegasos", "predict", "treecv", "rls",
        "sgd", "vw-convert", "vw")
# asked for by name only (--only): a first run, numba's cache empty (NUMBA_CACHE_DIR fresh)
OPT_IN = ("ibcd-first",)
DATA_FORMAT = 1


# ---------------------------------------------------------------- data
def shift(images: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """``images`` (n, 28, 28) moved ``dx`` right and ``dy`` down, zero-filled."""
    out = np.zeros_like(images)
    h, w = images.shape[1:]
    out[:, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)] = \
        images[:, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
    return out


def _labels_pm1(labels: np.ndarray) -> np.ndarray:
    return np.where(np.isin(labels, TOPS), 1.0, -1.0).astype(np.float32)


def _write_npy_chunks(path: Path, n_rows: int, chunks) -> None:
    """Write float32 (n_rows, 785) from an iterator of row chunks, never all in memory; the
    file appears under its name only when complete."""
    tmp = path.with_name(path.name + ".part")
    written = 0
    with open(tmp, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (n_rows, 785)})
        for chunk in chunks:
            fh.write(np.ascontiguousarray(chunk, dtype="<f4").tobytes())
            written += chunk.shape[0]
    if written != n_rows:
        raise RuntimeError(f"{path}: wrote {written} rows, expected {n_rows}")
    tmp.replace(path)


def augmented_chunks(images: np.ndarray, labels: np.ndarray, n_rows: int, chunk: int = 1000):
    """Image-major rows: image i's versions (identity, then SHIFTS) consecutive."""
    n_img = images.shape[0]
    v = math.ceil(n_rows / n_img)
    left = n_rows
    y = _labels_pm1(labels)
    for a in range(0, n_img, chunk):
        if left <= 0:
            return
        img = images[a:a + chunk].reshape(-1, 28, 28)
        out = np.empty((img.shape[0], v, 785), dtype=np.float32)
        out[:, :, 0] = y[a:a + chunk, None]
        for s, (dx, dy) in enumerate(VERSIONS[:v]):
            # pixel / 255 in float64, then float32 (as bench_train scales them)
            out[:, s, 1:] = shift(img, dx, dy).reshape(img.shape[0], 784) / 255.0
        out = out.reshape(-1, 785)[:left]
        left -= out.shape[0]
        yield out


def prepare_data(args) -> dict:
    """``train.npy`` / ``test.npy`` in ``args.work`` (reused when data.json matches)."""
    work = args.work
    meta_path = work / "data.json"
    want = {"format": DATA_FORMAT, "rows": args.rows, "versions": math.ceil(args.rows / 60000),
            "source": str(args.fashion.resolve()), "task": "tops-vs-rest", "tops": list(TOPS)}
    train, test = work / "train.npy", work / "test.npy"
    if (meta_path.exists() and train.exists() and test.exists()
            and json.loads(meta_path.read_text()) == want):
        print(f"data: reusing {train} ({args.rows} rows) and {test}", flush=True)
        return want
    n_versions = want["versions"]
    if n_versions > len(VERSIONS):
        raise SystemExit(f"--rows {args.rows}: at most {60000 * len(VERSIONS)} rows "
                         f"(60,000 images x {len(VERSIONS)} versions).")
    print(f"data: writing {train} ({args.rows} rows, {n_versions} versions of each image, "
          f"{args.rows * 785 * 4 / GiB:.2f} GiB) ...", flush=True)
    meta_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    d = args.fashion
    X = read_idx(d / "train-images-idx3-ubyte.gz").reshape(-1, 784)
    lab = read_idx(d / "train-labels-idx1-ubyte.gz")
    _write_npy_chunks(train, args.rows, augmented_chunks(X, lab, args.rows))
    Xt = read_idx(d / "t10k-images-idx3-ubyte.gz").reshape(-1, 784)
    labt = read_idx(d / "t10k-labels-idx1-ubyte.gz")
    _write_npy_chunks(test, Xt.shape[0], augmented_chunks(Xt, labt, Xt.shape[0]))
    meta_path.write_text(json.dumps(want))
    print(f"data: written in {time.perf_counter() - t0:.1f} s", flush=True)
    return want


# ---------------------------------------------------------------- peers (run as children)
def _test_arrays(path):
    t = np.load(path)
    return t[:, 1:], t[:, 0]


def peer_sgd(args) -> dict:
    """SGDClassifier(hinge).partial_fit over chunks of the memory-mapped file."""
    from sklearn.linear_model import SGDClassifier

    mm = np.load(args.train, mmap_mode="r")
    n = mm.shape[0]
    clf = SGDClassifier(loss="hinge", alpha=1.0 / (args.C * n), random_state=args.seed)
    rng = np.random.default_rng(args.seed)
    starts = np.arange(0, n, args.sgd_chunk)
    t0 = time.perf_counter()
    for _ in range(args.sgd_epochs):
        for a in rng.permutation(starts):
            block = np.array(mm[a:a + args.sgd_chunk])
            clf.partial_fit(block[:, 1:], block[:, 0], classes=np.array([-1.0, 1.0]))
    fit = time.perf_counter() - t0
    Xt, yt = _test_arrays(args.test)
    acc = float(np.mean(np.where(clf.decision_function(Xt) > 0, 1.0, -1.0) == yt))
    return {"test_accuracy": acc, "fit_seconds": fit, "epochs": args.sgd_epochs,
            "rows_read": int(args.sgd_epochs * n), "alpha": clf.alpha}


def _vw_lines(block: np.ndarray) -> str:
    """VW text lines ``label |f j:x ...`` for the non-zeros of a (rows, 1 + d) block. Each
    distinct value is formatted once per block (generic, fast when values repeat)."""
    y, X = block[:, 0], block[:, 1:]
    rows, cols = np.nonzero(X)
    vals, inv = np.unique(X[rows, cols], return_inverse=True)
    vstr = [f"{v:.7g}" for v in vals.tolist()]
    if vals.size * X.shape[1] <= 1 << 20:
        table = np.array([[f"{j + 1}:{s}" for s in vstr] for j in range(X.shape[1])],
                         dtype=object)
        toks = table[cols, inv].tolist()
    else:
        toks = [f"{j + 1}:{vstr[k]}" for j, k in zip(cols.tolist(), inv.tolist())]
    ends = np.cumsum(np.bincount(rows, minlength=X.shape[0])).tolist()
    labs = ["1" if v > 0 else "-1" for v in y.tolist()]
    out, a = [], 0
    for lab, e in zip(labs, ends):
        out.append(f"{lab} |f {' '.join(toks[a:e])}\n")
        a = e
    return "".join(out)


def peer_vw_convert(args) -> dict:
    t0 = time.perf_counter()
    sizes = {}
    for src, name in ((args.train, "train.vw"), (args.test, "test.vw")):
        mm = np.load(src, mmap_mode="r")
        dst = Path(args.vw_dir) / name
        with open(dst.with_name(name + ".part"), "w") as fh:
            for a in range(0, mm.shape[0], 5000):
                fh.write(_vw_lines(np.array(mm[a:a + 5000])))
        dst.with_name(name + ".part").replace(dst)
        sizes[name] = dst.stat().st_size
    return {"fit_seconds": time.perf_counter() - t0, "bytes_written_text": sizes}


def peer_vw(args) -> dict:
    from vowpalwabbit import Workspace

    d = Path(args.vw_dir)
    model, preds = d / "model.vw", d / "test.pred"
    t0 = time.perf_counter()
    ws = Workspace(arg_list=["-d", str(d / "train.vw"), "--loss_function", "hinge",
                             "--passes", str(args.vw_passes), "-c", "-k", "--cache_file",
                             str(d / "train.cache"), "--holdout_off", "-f", str(model),
                             "--quiet"])
    ws.finish()
    fit = time.perf_counter() - t0
    ws = Workspace(arg_list=["-i", str(model), "-t", "-d", str(d / "test.vw"), "-p",
                             str(preds), "--quiet"])
    ws.finish()
    p = np.loadtxt(preds, usecols=0, ndmin=1)
    yt = np.load(args.test, mmap_mode="r")[:, 0]
    acc = float(np.mean(np.where(p > 0, 1.0, -1.0) == yt))
    (d / "train.cache").unlink(missing_ok=True)
    return {"test_accuracy": acc, "fit_seconds": fit, "passes": args.vw_passes}


def peer_rls(args) -> dict:
    import ooc_learn
    from ooc_learn.rls import SparseRLS  # the solver: no scikit-learn in the capped process
    from ooc_learn.storage.resources import peak_rss_bytes

    from ooc_learn.storage.budget import MemoryBudget, late_load_bytes

    # the whole process under the cap, as for the CLI commands (the API's plain
    # memory= is what the engine adds to the caller's process), with a training command's
    # allowance for kernels that load later (no text parsers: the test set is .npy)
    budget = MemoryBudget.for_process(args.memory,
                                      late_load=late_load_bytes(solvers=True, parsers=False),
                                      start_peak=True)
    with ooc_learn.open_store(args.store, memory=budget) as st:
        t0 = time.perf_counter()
        model = SparseRLS(kernel=args.rls_kernel, n_basis=args.rls_basis, lam=args.rls_lam,
                          seed=args.seed).fit(st)
        fit = time.perf_counter() - t0
        fit_rss = peak_rss_bytes()          # the fit's own peak, before the checks below
        Xt, yt = _test_arrays(args.test)
        dec = np.concatenate([np.asarray(model.predict(Xt[a:a + 1000])).ravel()
                              for a in range(0, Xt.shape[0], 1000)])
        acc = float(np.mean(np.where(dec > 0, 1.0, -1.0) == yt))
        out = {"test_accuracy": acc, "fit_seconds": fit, "kernel": args.rls_kernel,
               "n_basis": args.rls_basis, "lam": args.rls_lam,
               "rows_read": model.stats_.get("rows_read"), "stats": model.stats_,
               "peak_rss_after_fit_bytes": fit_rss}
        try:
            t1 = time.perf_counter()
            loo = np.asarray(model.loo_predict()).ravel()
            y = np.asarray(st.labels()).ravel()
            out.update(loo_accuracy=float(np.mean(np.where(loo > 0, 1.0, -1.0) == y)),
                       loo_seconds=time.perf_counter() - t1)
        except Exception as e:              # noqa: BLE001 -- report, keep the fit's figures
            out["loo_error"] = f"{type(e).__name__}: {e}"
        model.close()
    return out


def peer_liblinear(args) -> dict:
    """LIBLINEAR -s 3 on (a seeded subset of) the training rows, in memory."""
    import scipy.sparse as sp
    from liblinear.liblinearutil import parameter, problem, train

    mm = np.load(args.train, mmap_mode="r")
    n = mm.shape[0]
    rows = None
    if args.liblinear_rows and args.liblinear_rows < n:
        rows = np.sort(np.random.default_rng(args.seed).choice(n, args.liblinear_rows,
                                                              replace=False))
    t0 = time.perf_counter()
    parts, ys = [], []
    for a in range(0, n, 50000):
        block = np.asarray(mm[a:a + 50000])
        if rows is not None:
            block = block[rows[(rows >= a) & (rows < a + 50000)] - a]
        parts.append(sp.csr_matrix(block[:, 1:]))
        ys.append(block[:, 0].astype(np.float64))
    X, y = sp.vstack(parts, format="csr"), np.concatenate(ys)
    del parts
    prob = problem(y, X)
    del X
    prob.set_bias(1)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = train(prob, parameter(f"-s 3 -c {args.C} -B 1 -q"))
    fit = time.perf_counter() - t0
    w = np.array([m.w[i] for i in range(785)])
    if m.label[0] != 1:                     # liblinear's first label is the positive side
        w = -w
    Xt, yt = _test_arrays(args.test)
    acc = float(np.mean(np.where(Xt @ w[:784] + w[784] > 0, 1.0, -1.0) == yt))
    return {"test_accuracy": acc, "fit_seconds": fit, "load_seconds": load,
            "rows": int(y.size)}


PEERS = {"sgd": peer_sgd, "vw-convert": peer_vw_convert, "vw": peer_vw, "rls": peer_rls,
         "liblinear": peer_liblinear}


# ---------------------------------------------------------------- measured runs
def _ooc(cmd: str) -> list[str]:
    """The console script beside this interpreter, else the same entry point through it."""
    exe = Path(sys.executable).parent / cmd
    if exe.exists():
        return [str(exe)]
    fn = {"ooc-ingest": "ingest_main", "ooc-train": "train_main",
          "ooc-predict": "predict_main"}[cmd]
    return [sys.executable, "-c", f"import sys; from ooc_learn.cli import {fn}; sys.exit({fn}())"]


def _self(peer: str, args, **extra) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--peer", peer, "--train",
           str(args.work / "train.npy"), "--test", str(args.work / "test.npy"),
           "--C", str(args.C), "--seed", str(args.seed)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def last_json(text: str) -> dict | None:
    """The last stdout line that is a JSON object (commands print one with --json)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


class Runner:
    """Runs commands in fresh cgroups (or measured without one) and keeps the records."""

    def __init__(self, args):
        from ooc_learn.storage.measure import memory_cgroup_available

        self.args = args
        self.cgroup_ok, self.cgroup_why = memory_cgroup_available()
        self.records: list[dict] = []
        self.cache_warned = False

    def run(self, name: str, setting: str | None, cmd: list[str], *, cgroup: bool = True
            ) -> dict:
        from ooc_learn.storage.measure import (CgroupUnavailableError,
                                               run_in_memory_cgroup, run_measured)

        a = self.args
        limit = SETTINGS[setting][0] if setting else None
        t0 = time.perf_counter()
        r = None
        if cgroup and self.cgroup_ok and limit:
            try:
                r = run_in_memory_cgroup(cmd, limit, drop_caches=True, timeout=a.timeout)
            except CgroupUnavailableError as e:
                self.cgroup_ok, self.cgroup_why = False, e.message
                print(f"    cgroups: NOT AVAILABLE any more ({e.message}); falling back to "
                      "run_measured (no limit enforced)", flush=True)
        if r is None:
            r = run_measured(cmd, drop_caches=True, timeout=a.timeout)
        if r.get("drop_caches_error") and not self.cache_warned:
            self.cache_warned = True
            print(f"    note: {r['drop_caches_error']}", flush=True)
        out = last_json(r.get("stdout", "")) or {}
        rec = {"name": name, "setting": setting or "none", "cmd": cmd,
               "elapsed_outer_s": time.perf_counter() - t0, "result": out,
               **{k: v for k, v in r.items() if k not in ("stdout", "stderr")},
               "stderr_tail": r.get("stderr", "")[-3000:],
               "stdout_tail": r.get("stdout", "")[-1000:] if not out else ""}
        rec["accuracy"] = _accuracy(out)
        rec["fit_s"] = out.get("seconds", out.get("fit_seconds",
                                                  (out.get("stats") or {}).get("seconds")))
        self.records.append(rec)
        print(format_row(rec), flush=True)
        if rec["rc"] != 0:
            lines = rec["stderr_tail"].strip().splitlines()
            why = rec.get("error") or (lines[-1] if lines else "no stderr")
            print(f"    ^ {name} failed (rc {rec['rc']}, oom kills {rec.get('oom_kills')}, "
                  f"timed out {rec.get('timed_out')}): {why[:300]}", flush=True)
        return rec


def _accuracy(out: dict) -> float | None:
    for key in ("test_accuracy", "accuracy"):
        if out.get(key) is not None:
            return float(out[key])
    if "estimate" in out:                   # a CV result
        metric = str(out.get("metric", ""))
        if metric == "accuracy":
            return float(out["estimate"])
        if metric in ("error", "zero_one", "error_rate", "0-1"):
            return 1.0 - float(out["estimate"])
    return None


HEADER = (f"{'run':<12} {'setting':<7} {'rc':>4} {'oom':>3} {'wall s':>8} {'fit s':>8} "
          f"{'RSS MiB':>8} {'cg MiB':>7} {'read GiB':>8} {'acc %':>6} {'outer':>5} "
          f"{'rows_read':>10} {'read_back':>10}")


def _f(v, fmt, width):
    return f"{'-':>{width}}" if v is None else f"{v:{width}{fmt}}"


def _mib(v):
    return None if v is None else v / MiB


def format_row(r: dict) -> str:
    res = r.get("result") or {}
    rows_read = res.get("rows_read", (res.get("stats") or {}).get("rows_read"))
    acc = None if r.get("accuracy") is None else 100 * r["accuracy"]
    read = None if r.get("read_bytes") is None else r["read_bytes"] / GiB
    note = ""
    if r.get("rc") != 0:
        note = ("TIMEOUT" if r.get("timed_out") else "OOM-KILLED" if r.get("oom_kills")
                else "FAILED")
    elif r.get("cached"):
        note = "(cached)"
    return (f"{r['name']:<12} {r['setting']:<7} {_f(r.get('rc'), 'd', 4)} "
            f"{_f(r.get('oom_kills'), 'd', 3)} {_f(r.get('wall_s'), '.1f', 8)} "
            f"{_f(r.get('fit_s'), '.1f', 8)} {_f(_mib(r.get('peak_rss_bytes')), '.0f', 8)} "
            f"{_f(_mib(r.get('cgroup_peak_bytes')), '.0f', 7)} {_f(read, '.2f', 8)} "
            f"{_f(acc, '.2f', 6)} {_f(res.get('outer_iterations'), 'd', 5)} "
            f"{_f(rows_read, 'd', 10)} {_f(res.get('rows_read_back'), 'd', 10)}  "
            f"{note}").rstrip()


# ---------------------------------------------------------------- the scenario
def run_setting(runner: Runner, setting: str, only: set[str], data_meta: dict) -> None:
    a = runner.args
    mem = SETTINGS[setting][1]
    w = a.work
    train, test = w / "train.npy", w / "test.npy"
    store = w / f"store-{setting}"
    store_meta = w / f"store-{setting}.json"
    models = w / "models"
    models.mkdir(exist_ok=True)
    common = ["--memory", mem, "--quiet", "--json"]
    fresh = store_meta.exists() and json.loads(store_meta.read_text()) == data_meta
    needs_store = only & {"ibcd", "ibcd-paper", "dcd", "bm", "pegasos", "predict", "treecv",
                          "rls", "ibcd-first"}
    if "ingest" in only or (needs_store and not fresh):
        store_meta.unlink(missing_ok=True)
        r = runner.run("ingest", setting, _ooc("ooc-ingest") + [
            str(train), "-o", str(store), "--label-column", "0", "--overwrite", *common])
        if r["rc"] == 0:
            store_meta.write_text(json.dumps(data_meta))
        elif needs_store:
            print(f"    no store for the {setting} setting: skipping "
                  f"{', '.join(sorted(needs_store))}", flush=True)
            only = only - needs_store
    train_cmd = _ooc("ooc-train") + [str(store), "--C", str(a.C), "--test", str(test), *common]
    solvers = {"ibcd": ["--solver", "ibcd"],
               "ibcd-paper": ["--solver", "ibcd", "--truncate", "1", "--sample-eps", "0.05"],
               "dcd": ["--solver", "dcd"], "bm": ["--solver", "bm"],
               "pegasos": ["--solver", "pegasos"]}
    for name, extra in solvers.items():
        if name in only:
            model = models / f"{setting}-{name}.npz"
            model.unlink(missing_ok=True)
            runner.run(name, setting, train_cmd + ["-o", str(model)] + extra)
    if "ibcd-first" in only:
        # what a fresh install's first run costs: numba compiles every kernel (the command's
        # helpers first, within --memory: ooc_learn._warmup); the RSS column is the largest of
        # the command and its helpers
        with tempfile.TemporaryDirectory(prefix="numba-cache-", dir=a.work) as cache:
            runner.run("ibcd-first", setting, ["env", f"NUMBA_CACHE_DIR={cache}"] + train_cmd
                       + ["-o", str(models / f"{setting}-ibcd-first.npz"), "--solver", "ibcd"])
    if "predict" in only:
        # the exact-stop model, else the sampled rule's (the exact stop may not finish
        # within --timeout)
        found = [m for m in (models / f"{setting}-ibcd.npz", models / f"{setting}-ibcd-paper.npz")
                 if m.exists()]
        if found:
            print(f"    predict {setting}: {found[0].name}", flush=True)
            runner.run("predict", setting, _ooc("ooc-predict") + [str(found[0]), str(test),
                                                                  *common])
        else:
            print(f"    predict {setting}: no {setting}-ibcd(-paper).npz (run ibcd first)",
                  flush=True)
    if "treecv" in only:
        runner.run("treecv", setting, _ooc("ooc-train") + [
            str(store), "--cv", "10", "--cv-method", "tree", "--learner", "pegasos",
            "--seed", str(a.seed), *common])
    if "rls" in only:
        runner.run("rls", setting, _self("rls", a, store=store, memory=mem,
                                         rls_kernel=a.rls_kernel, rls_basis=a.rls_basis,
                                         rls_lam=a.rls_lam))
    if "sgd" in only:
        runner.run("sgd", setting, _self("sgd", a, sgd_epochs=a.sgd_epochs,
                                         sgd_chunk=a.sgd_chunk))
    if only & {"vw-convert", "vw"}:
        try:
            import vowpalwabbit  # noqa: F401
        except ImportError:
            print("    vw: the vowpalwabbit package is missing (pip install vowpalwabbit); "
                  "skipping Vowpal Wabbit", flush=True)
            return
        vw_dir = w / "vw"
        vw_dir.mkdir(exist_ok=True)
        have = (vw_dir / "train.vw").exists() and (vw_dir / "data.json").exists() and \
            json.loads((vw_dir / "data.json").read_text()) == data_meta
        if "vw-convert" in only or not have:
            (vw_dir / "data.json").unlink(missing_ok=True)
            r = runner.run("vw-convert", setting, _self("vw-convert", a, vw_dir=vw_dir))
            if r["rc"] != 0:
                return
            (vw_dir / "data.json").write_text(json.dumps(data_meta))
        if "vw" in only:
            runner.run("vw", setting, _self("vw", a, vw_dir=vw_dir, vw_passes=a.vw_passes))


def warm_up(args) -> None:
    """Run each command once on the first 2,000 test rows, unmeasured: numba compiles its
    kernels into its on-disk cache here, not inside the first measured run."""
    import shutil
    import subprocess

    t0 = time.perf_counter()
    d = args.work / "warmup"
    d.mkdir(exist_ok=True)
    src, store, model = d / "tiny.npy", d / "store", d / "model.npz"
    np.save(src, np.load(args.work / "test.npy", mmap_mode="r")[:2000])
    # roomy: SparseRLS alone charges ~218 MiB of fixed part and 48 MiB for BLAS/LAPACK
    mem = ["--memory", "512M", "--quiet"]
    cmds = [_ooc("ooc-ingest") + [str(src), "-o", str(store), "--label-column", "0",
                                  "--overwrite", *mem]]
    for solver in ("ibcd", "dcd", "bm", "pegasos"):
        cmds.append(_ooc("ooc-train") + [str(store), "-o", str(model), "--solver", solver,
                                         "--test", str(src), *mem])
    cmds += [_ooc("ooc-train") + [str(store), "-o", str(model), "--truncate", "1",
                                  "--sample-eps", "0.05", *mem],
             _ooc("ooc-predict") + [str(model), str(src), *mem],
             _ooc("ooc-train") + [str(store), "--cv", "10", "--learner", "pegasos", *mem],
             _self("rls", args, store=store, memory="512M", rls_kernel=args.rls_kernel,
                   rls_basis=min(args.rls_basis, 200), rls_lam=args.rls_lam)]
    failed = 0
    for cmd in cmds:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        failed += r.returncode != 0
    shutil.rmtree(d, ignore_errors=True)
    print(f"warm-up: {len(cmds)} commands on 2,000 rows in {time.perf_counter() - t0:.1f} s"
          + (f" ({failed} failed; the measured runs will show why)" if failed else ""),
          flush=True)


def liblinear_reference(runner: Runner, data_meta: dict) -> dict | None:
    """LIBLINEAR outside any cgroup, cached in WORK (reruns reuse it)."""
    a = runner.args
    n = a.liblinear_rows if a.liblinear_rows and a.liblinear_rows < a.rows else a.rows
    cache = a.work / f"liblinear-{n}-C{a.C:g}.json"
    key = {"data": data_meta, "rows": n, "C": a.C, "seed": a.seed}
    if cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            rec = saved["record"]
            rec["cached"] = True
            runner.records.append(rec)
            print(format_row(rec), flush=True)
            return rec
    rec = runner.run("liblinear", None, _self("liblinear", a, liblinear_rows=n), cgroup=False)
    if rec["rc"] == 0:
        cache.write_text(json.dumps({"key": key, "record": rec}))
    return rec


def ratios(records: list[dict]) -> dict:
    """The figures the issue targets, from the successful runs."""
    ok = {(r["name"], r["setting"]): r for r in records if r.get("rc") == 0}
    out: dict = {}
    for s in SETTINGS:
        sgd = ok.get(("sgd", s))
        for name in ("ibcd", "ibcd-paper"):
            r = ok.get((name, s))
            if r and sgd:
                out[f"{name} wall / sgd wall ({s})"] = r["wall_s"] / sgd["wall_s"]
    for name in RUNS:
        a, b = ok.get((name, "1g")), ok.get((name, "10x"))
        if a and b:
            out[f"{name} wall 10x / 1g"] = b["wall_s"] / a["wall_s"]
    ll = ok.get(("liblinear", "none"))
    if ll and ll.get("accuracy") is not None:
        for (name, s), r in ok.items():
            if name != "liblinear" and r.get("accuracy") is not None:
                out[f"{name} ({s}) acc - liblinear, points"] = 100 * (r["accuracy"]
                                                                       - ll["accuracy"])
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fashion", type=Path, default=DATA / "fashion-mnist",
                   help="folder of the Fashion-MNIST idx .gz files (default: %(default)s)")
    p.add_argument("--rows", type=int, default=1_020_000,
                   help="training rows (60,000 images x versions; default %(default)s)")
    p.add_argument("--work", type=Path,
                   default=Path(os.environ.get("TMPDIR", "/tmp")) / "ooc_bench_memory",
                   help="data, stores, models (default: %(default)s)")
    p.add_argument("--setting", choices=("1g", "10x", "10x-288", "both", "all"), default="both",
                   help="both: 1g and 10x (the issue's two); all: also 10x-288")
    p.add_argument("--only", default=None,
                   help=f"comma list of runs (of {','.join(RUNS)},liblinear)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--C", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sgd-epochs", type=int, default=3)
    p.add_argument("--sgd-chunk", type=int, default=10000)
    p.add_argument("--vw-passes", type=int, default=3)
    p.add_argument("--rls-kernel", default="rbf")
    p.add_argument("--rls-basis", type=int, default=500)
    p.add_argument("--rls-lam", type=float, default=1.0)
    p.add_argument("--liblinear", action=argparse.BooleanOptionalAction, default=True,
                   help="the LIBLINEAR reference (outside the cgroups; ~14 GB at 1.02M rows)")
    p.add_argument("--liblinear-rows", type=int, default=0,
                   help="train LIBLINEAR on a seeded random subset of this many rows (0: all)")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="run each command once on 2,000 rows first (numba's JIT cache)")
    p.add_argument("--json-out", type=Path, default=None)
    # child side (the script calls itself so a peer runs inside the cgroup)
    p.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)
    p.add_argument("--train", help=argparse.SUPPRESS)
    p.add_argument("--test", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--memory", help=argparse.SUPPRESS)
    p.add_argument("--vw-dir", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.peer:
        print(json.dumps(PEERS[args.peer](args)), flush=True)
        return 0
    only = set(RUNS) | {"liblinear"}
    if args.only:
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        unknown = only - set(RUNS) - set(OPT_IN) - {"liblinear"}
        if unknown:
            raise SystemExit(f"--only: unknown runs {sorted(unknown)}; "
                             f"choose from {', '.join(RUNS + OPT_IN)}, liblinear")
    args.work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data_meta = prepare_data(args)
    runner = Runner(args)
    if args.warmup and only - {"sgd", "vw", "vw-convert", "liblinear"}:
        warm_up(args)
    print(f"cgroups: {runner.cgroup_why}" if runner.cgroup_ok else
          f"cgroups: NOT AVAILABLE ({runner.cgroup_why}); falling back to run_measured: no "
          "limit is enforced, peak RSS is the child's ru_maxrss", flush=True)
    settings = ({"both": ["1g", "10x"], "all": list(SETTINGS)}.get(args.setting)
                or [args.setting])
    for s in settings:
        print(f"setting {s}: cgroup {SETTINGS[s][0] / MiB:.0f} MiB, --memory {SETTINGS[s][1]}"
              f", data {args.rows * 785 * 4 / MiB:.0f} MiB", flush=True)
    print(HEADER, flush=True)
    for s in settings:
        run_setting(runner, s, only - {"liblinear"}, data_meta)
    if args.liblinear and "liblinear" in only:
        liblinear_reference(runner, data_meta)
    rat = ratios(runner.records)
    print("\n" + HEADER)
    for r in runner.records:
        print(format_row(r))
    print("\nratios:")
    for k, v in rat.items():
        print(f"  {k:<45} {v:+.2f}" if "acc" in k else f"  {k:<45} {v:.2f}")
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s", flush=True)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "data": data_meta,
             "cgroup": [runner.cgroup_ok, runner.cgroup_why],
             "settings": {k: {"cgroup_bytes": v[0], "memory": v[1]}
                          for k, v in SETTINGS.items()},
             "runs": runner.records, "ratios": rat, "total_seconds": total}, indent=1))
        print(f"results in {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
