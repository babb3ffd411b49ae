"""K-fold CV of the linear SVM on a store (``ooc-train --cv``) against LIBLINEAR ``-v``.

Usage: python scripts/bench_linear_cv.py [--datasets a9a ijcnn1] [--k 5] [--C 1]
       [--grid 0.01 0.1 1 10] [--solvers ibcd dcd] [--repeat 3] [--work DIR]

For each data set (LIBSVM text from ``../shared/data``, ingested once into ``WORK``):

* ``ooc-train STORE --cv K --C C --solver S`` as the user runs it (a subprocess: imports,
  store open, every fold, the scoring; wall time, best of ``--repeat``), warm-started folds
  and, for the reference, every fold from scratch (``linear_cv(..., warm_start=False)``
  in this process, JIT warmed first); the dual CD solvers also with ``--jobs 2`` (folds in
  threads);
* LIBLINEAR ``-s 3 -c C -B 1 -v K`` (hinge, dual CD; liblinear-official, in this process on
  the parsed arrays, best of ``--repeat``), its own random folds;
* the grid ``--grid``: one ``ooc-train --cv K --C c1,c2,...`` (warm-started along C), against
  four independent ``ooc-train --cv`` runs and LIBLINEAR ``-v K`` per C, and LIBLINEAR's own
  parameter search ``-s 2 -C -v K`` (it supports -C for -s 0 / 2 only; the squared hinge)
  against ``ooc-train --cv K --C-search``.

``--multiclass``: Fashion-MNIST, 10 classes, one ingest (60k x 784, pixels / 255, as
float32 npy), ``ooc-train STORE --loss sqhinge`` (one-vs-rest from the one store; one class
at a time and ``--jobs 2``, two classes at once in threads) against
LIBLINEAR ``-s 2 -c C -B 1`` (its multiclass rule is one-vs-rest too), test accuracy on the
10k t10k images, wall time of each (ours: the CLI, store open and all; LIBLINEAR: in this
process on the arrays), one run each (tens of seconds).

``--regression``: cpusmall and abalone (LIBSVM text, ingested with ``--task regression``),
``ooc-train --cv 5`` RMSE (least squares at the best C of the grid, exact normal equations)
and the in-sample RMSE of ``ooc-train`` against scikit-learn ``Ridge(alpha=1/(2C))`` and
LIBLINEAR ``-s 11 -c C -p 0 -B 1`` at the same C; walls best of ``--repeat``.

Prints a table and the ratios (ours / LIBLINEAR time, accuracy differences in points).
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


from _bench_data import DATA, best_of, ooc_cli

DATASETS = {"a9a": "a9a.svm.xz", "ijcnn1": "ijcnn1.svm.xz", "w8a": "w8a.svm.xz",
            "australian": "australian.svm.xz"}


def _cli(cmd, repeat):
    def go():
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return json.loads(r.stdout)
    return best_of(go, repeat)


def _liblinear(path, opts, repeat):
    from liblinear.liblinearutil import parameter, problem, svm_read_problem, train

    y, x = svm_read_problem(str(path))

    def go():
        return train(problem(y, x), parameter(opts + " -q"))
    return best_of(go, repeat)


def _multiclass(a, rows, ratios):
    from liblinear.liblinearutil import parameter, predict, problem, train

    from _bench_data import fashion_mnist

    Xtr, ytr = fashion_mnist("train")
    Xte, yte = fashion_mnist("t10k")
    Xtr = (Xtr / 255.0).astype(np.float32)
    Xte = (Xte / 255.0).astype(np.float32)
    npy, tnpy = a.work / "fashion10.npy", a.work / "fashion10-test.npy"
    if not npy.exists():
        np.save(npy, np.c_[ytr.astype(np.float32), Xtr])
        np.save(tnpy, np.c_[yte.astype(np.float32), Xte])
    store = a.work / "fashion10.store"
    if not store.exists():
        subprocess.run(ooc_cli("ingest_main") + [str(npy), "-o", str(store), "--task",
                                              "multiclass", "--quiet"], check=True)
    ours = []
    for solver in a.solvers:
        for jobs in (1, 2):
            model = a.work / f"fashion10-{solver}.npz"
            model.unlink(missing_ok=True)
            t, out = _cli(ooc_cli("train_main") + [str(store), "-o", str(model), "--solver",
                                                solver, "--loss", "sqhinge", "--C", str(a.C),
                                                "--test", str(tnpy), "--jobs", str(jobs),
                                                "--json", "--quiet"], 1)
            ours.append((f"{solver} --jobs {jobs}", t, out["test_accuracy"]))
            rows.append(("fashion10", f"ooc-train {solver} sqhinge one-vs-rest --jobs {jobs}",
                         a.C, t, out["test_accuracy"]))
    t0 = time.perf_counter()
    m = train(problem(ytr.astype(np.float64), Xtr.astype(np.float64)),
              parameter(f"-s 2 -c {a.C} -B 1 -q"))
    ll_t = time.perf_counter() - t0
    _, (acc, _, _), _ = predict(yte.astype(np.float64), Xte.astype(np.float64), m, "-q")
    rows.append(("fashion10", "liblinear -s 2 (one-vs-rest)", a.C, ll_t, acc / 100.0))
    for run, t, accuracy in ours:
        ratios.append((f"fashion10 {run} wall / liblinear", t / ll_t))
        ratios.append((f"fashion10 {run} acc - liblinear, points",
                       100 * (accuracy - acc / 100.0)))


def _regression(a, rows, ratios):
    from liblinear.liblinearutil import parameter, problem, svm_read_problem, train
    from sklearn.datasets import load_svmlight_file
    from sklearn.linear_model import Ridge

    for name, file in (("cpusmall", "cpusmall.svm.xz"), ("abalone", "abalone_scale.svm.xz")):
        txt = a.work / f"{name}.svm"
        if not txt.exists():
            txt.write_bytes(lzma.decompress((DATA / file).read_bytes()))
        store = a.work / f"{name}.store"
        if not store.exists():
            subprocess.run(ooc_cli("ingest_main") + [str(txt), "-o", str(store), "--task",
                                                  "regression", "--quiet"], check=True)
        X, y = load_svmlight_file(str(txt))
        X = X.toarray()
        t, cv = _cli(ooc_cli("train_main") + [str(store), "--cv", "5", "--C",
                                           ",".join(f"{c:g}" for c in a.grid), "--json",
                                           "--quiet"], a.repeat)
        C = cv["best_C"]
        rows.append((name, "ooc-train --cv 5 grid (cv rmse at best C)", C, t, cv["estimate"]))
        model = a.work / f"{name}.npz"
        model.unlink(missing_ok=True)
        t, out = _cli(ooc_cli("train_main") + [str(store), "-o", str(model), "--C", str(C),
                                            "--test", str(store), "--json", "--quiet"],
                      a.repeat)
        rows.append((name, "ooc-train (train rmse)", C, t, out["test_rmse"]))

        def rmse(pred):
            return float(np.sqrt(np.mean((y - pred) ** 2)))
        tr, rd = best_of(lambda: Ridge(alpha=0.5 / C).fit(X, y), a.repeat)
        rows.append((name, "sklearn Ridge (train rmse)", C, tr, rmse(rd.predict(X))))
        yl, xl = svm_read_problem(str(txt))
        tl, m = best_of(lambda: train(problem(yl, xl), parameter(f"-s 11 -c {C} -p 0 -B 1 -q")),
                      a.repeat)
        w = np.array([m.get_decfun_coef(j + 1) for j in range(X.shape[1])])
        rows.append((name, "liblinear -s 11 (train rmse)", C, tl,
                     rmse(X @ w + m.get_decfun_bias())))
        ratios.append((f"{name} rmse / Ridge", out["test_rmse"] / rows[-2][4]))
        ratios.append((f"{name} rmse / liblinear -s 11", out["test_rmse"] / rows[-1][4]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", default=["a9a", "ijcnn1"], choices=sorted(DATASETS))
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--C", type=float, default=1.0)
    p.add_argument("--grid", type=float, nargs="*", default=[0.01, 0.1, 1.0, 10.0])
    p.add_argument("--solvers", nargs="+", default=["ibcd", "dcd"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ooc_bench_cv")
    p.add_argument("--multiclass", action="store_true", help="add Fashion-MNIST, 10 classes")
    p.add_argument("--regression", action="store_true", help="add cpusmall and abalone")
    p.add_argument("--binary", action=argparse.BooleanOptionalAction, default=True,
                   help="the --datasets part (default on)")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    from ooc_learn.cv.linear import linear_cv

    rows, ratios = [], []
    if a.multiclass:
        _multiclass(a, rows, ratios)
    if a.regression:
        _regression(a, rows, ratios)
    for name in (a.datasets if a.binary else []):
        txt = a.work / f"{name}.svm"
        if not txt.exists():
            txt.write_bytes(lzma.decompress((DATA / DATASETS[name]).read_bytes()))
        store = a.work / f"{name}.store"
        if not store.exists():
            subprocess.run(ooc_cli("ingest_main") + [str(txt), "-o", str(store), "--quiet"],
                           check=True)
        ll_t, ll_acc = _liblinear(txt, f"-s 3 -c {a.C} -B 1 -v {a.k}", a.repeat)
        ll_acc /= 100.0
        rows.append((name, f"liblinear -s 3 -v {a.k}", a.C, ll_t, ll_acc))
        for solver in a.solvers:
            t, out = _cli(ooc_cli("train_main") + [str(store), "--cv", str(a.k), "--C", str(a.C),
                                                "--solver", solver, "--json", "--quiet"],
                          a.repeat)
            rows.append((name, f"ooc-train --cv {a.k} {solver}", a.C, t, out["estimate"]))
            ratios.append((f"{name} {solver} --cv wall / liblinear -v", t / ll_t))
            ratios.append((f"{name} {solver} acc - liblinear, points",
                           100 * (out["estimate"] - ll_acc)))
            linear_cv(str(store), a.k, solver=solver, C=a.C)  # JIT warm-up, outside the clock
            tw, rw = best_of(lambda: linear_cv(str(store), a.k, solver=solver, C=a.C), a.repeat)
            tc, rc = best_of(lambda: linear_cv(str(store), a.k, solver=solver, C=a.C,
                                          warm_start=False), a.repeat)
            rows.append((name, f"linear_cv {solver} warm (API)", a.C, tw, rw.estimate))
            rows.append((name, f"linear_cv {solver} cold (API)", a.C, tc, rc.estimate))
            ratios.append((f"{name} {solver} warm / cold folds (API)", tw / tc))
            if solver in ("dcd", "bm"):  # folds in threads
                tj, rj = best_of(lambda: linear_cv(str(store), a.k, solver=solver, C=a.C,
                                                 n_jobs=2), a.repeat)
                rows.append((name, f"linear_cv {solver} --jobs 2 (API)", a.C, tj, rj.estimate))
                ratios.append((f"{name} {solver} --jobs 2 (API) / liblinear -v", tj / ll_t))
                t2, out2 = _cli(ooc_cli("train_main") + [str(store), "--cv", str(a.k), "--C",
                                                      str(a.C), "--solver", solver, "--jobs",
                                                      "2", "--json", "--quiet"], a.repeat)
                rows.append((name, f"ooc-train --cv {a.k} {solver} --jobs 2", a.C, t2,
                             out2["estimate"]))
                ratios.append((f"{name} {solver} --jobs 2 --cv wall / liblinear -v", t2 / ll_t))
        if a.grid:
            grid = ",".join(f"{c:g}" for c in a.grid)
            ll_each = []
            for c in a.grid:
                t, acc = _liblinear(txt, f"-s 3 -c {c} -B 1 -v {a.k}", 1)
                ll_each.append((t, acc / 100.0))
                rows.append((name, f"liblinear -s 3 -v {a.k}", c, t, acc / 100.0))
            ll_grid_t = sum(t for t, _ in ll_each)
            tC, found = _liblinear(txt, f"-s 2 -C -B 1 -v {a.k}", 1)
            rows.append((name, f"liblinear -s 2 -C -v {a.k} (best C)", found[0], tC, found[2]))
            for solver in a.solvers:
                t, out = _cli(ooc_cli("train_main") + [str(store), "--cv", str(a.k), "--C-search",
                                                    "--solver", solver, "--json", "--quiet"],
                              1)
                rows.append((name, f"ooc-train --cv {a.k} --C-search {solver} (best C)",
                             out["best_C"], t, out["estimate"]))
                ratios.append((f"{name} {solver} --C-search / liblinear -C", t / tC))
                ratios.append((f"{name} {solver} --C-search best acc - liblinear -C's, points",
                               100 * (out["estimate"] - found[2])))
            for solver in a.solvers:
                t, out = _cli(ooc_cli("train_main") + [str(store), "--cv", str(a.k), "--C", grid,
                                                    "--solver", solver, "--json", "--quiet"], 1)
                for r, (_, acc) in zip(out["grid"], ll_each):
                    rows.append((name, f"ooc-train --cv {a.k} {solver} grid", r["C"],
                                 r["seconds"], r["estimate"]))
                    ratios.append((f"{name} {solver} C={r['C']:g} acc - liblinear, points",
                                   100 * (r["estimate"] - acc)))
                rows.append((name, f"ooc-train --cv {a.k} {solver} grid (total)", grid, t,
                             float("nan")))
                single = 0.0
                for c in a.grid:
                    ts, _ = _cli(ooc_cli("train_main") + [str(store), "--cv", str(a.k), "--C",
                                                       f"{c:g}", "--solver", solver, "--json",
                                                       "--quiet"], 1)
                    single += ts
                rows.append((name, f"4 x ooc-train --cv {a.k} {solver} (total)", grid, single,
                             float("nan")))
                ratios.append((f"{name} {solver} grid / independent runs", t / single))
                ratios.append((f"{name} {solver} grid / liblinear -C", t / tC))
                ratios.append((f"{name} {solver} grid / liblinear -v per C", t / ll_grid_t))
    print(f"\n{'data':10} {'run':42} {'C':>14} {'wall s':>8} {'acc%/rmse':>9}")
    for name, run, C, t, acc in rows:
        c = f"{C:g}" if isinstance(C, float) else str(C)
        shown = f"{acc:9.4f}" if "rmse" in run else f"{100 * acc:9.2f}"
        print(f"{name:10} {run:42} {c:>14} {t:8.2f} {shown}")
    print(f"\nratios (walls best of {a.repeat} where a row says so; grid rows one run):")
    for label, v in ratios:
        print(f"  {label:50} {v:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
