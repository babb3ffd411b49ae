"""Model selection on Dask against one process, side by side (issue 27's targets).

    python scripts/bench_dask.py [--work DIR] [--workers 2] [--solver ibcd]

1. 5-fold CV x 4 C values of Fashion-MNIST class 6 (shirt) vs the rest: one process
   (``linear_cv_grid``, folds warm-started one after another) against the folds as tasks on
   a local cluster of ``--workers`` worker processes (``client=``), and the CLI's
   ``ooc-train --cv 5 --workers N`` (cluster start included) against ``ooc-train --cv 5``;
   fold scores compared.
2. The ten one-vs-rest classes of Fashion-MNIST: one class at a time against the classes as
   tasks on the cluster (API, and the CLI with --workers N); models compared. One more run
   records the tasks (the scheduler's task stream): their summed compute time against the one
   process's time, and the ratio no schedule of those tasks could beat.
3. TreeCV, 10 folds of PEGASOS (lam = 1/n) on the shirt store: one process against its
   subtrees as tasks on the cluster and in ``n_jobs`` local processes; fold scores compared.

``--parts cv,ovr,tree,cli`` picks what runs (default: all).

API timings are the best of ``--repeat`` runs on a cluster started beforehand (a user with a
cluster running); CLI timings are one run each, the cluster's start inside. Data come from
``../shared/data/fashion-mnist`` (or ``OOC_DATA``); stores are built once under ``--work``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_data import best_of, ooc_cli  # noqa: E402


def _cli(args) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t0, json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/ooc_bench_dask"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--solver", default="ibcd")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--Cs", default="0.01,0.1,1,10")
    ap.add_argument("--parts", default="cv,ovr,tree,cli")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    a.work.mkdir(parents=True, exist_ok=True)
    import warnings

    warnings.simplefilter("ignore")
    from _bench_data import fashion_mnist

    from ooc_learn.cv.linear import linear_cv_grid
    from ooc_learn.distributed import make_client
    from ooc_learn.training import train

    npy = a.work / "fashion.npy"
    if not npy.exists():
        X, y = fashion_mnist("train")
        np.save(npy, np.c_[y.astype(np.float32), (X / 255.0).astype(np.float32)])
    shirt, ten = a.work / "shirt.store", a.work / "fashion10.store"
    for store, extra in ((shirt, ["--positive-label", "6"]), (ten, ["--task", "multiclass"])):
        if not store.exists():
            subprocess.run(ooc_cli("ingest_main") + [str(npy), "-o", str(store), "--quiet"]
                           + extra, check=True)
    Cs = [float(c) for c in a.Cs.split(",")]
    rows, ratios = [], []

    client, cluster = make_client(workers=a.workers)
    try:
        client.run(lambda: __import__("ooc_learn.training"))  # workers import once
        # ---- 1. 5-fold CV x 4 C, class 6 vs rest
        if "cv" in parts:
            kw = dict(solver=a.solver, loss="sqhinge")
            t_one, one = best_of(lambda: linear_cv_grid(shirt, 5, Cs, **kw), a.repeat)
            t_dask, dsk = best_of(lambda: linear_cv_grid(shirt, 5, Cs, client=client, **kw),
                                a.repeat)
            for r1, r2 in zip(one, dsk):
                diff = float(np.abs(r1.fold_scores - r2.fold_scores).max())
                rows.append((f"shirt C={r1.stats['C']:g}", "fold scores, one process vs dask",
                             f"{100 * r1.estimate:.2f} / {100 * r2.estimate:.2f} %",
                             f"max |diff| {100 * diff:.2f} pts"))
            rows.append(("shirt 5-fold x 4 C", "one process (API)", f"{t_one:.2f} s", ""))
            rows.append(("shirt 5-fold x 4 C", f"dask {a.workers} workers (API)",
                         f"{t_dask:.2f} s", ""))
            ratios.append((f"CV 5 x 4 C: one process / dask {a.workers} workers (API)",
                           t_one / t_dask))
            # the same folds from scratch on one process in threads (dcd) give equal scores
        # ---- 2. ten one-vs-rest classes
        if "ovr" in parts:
            t_seq, m_seq = best_of(lambda: train(ten, loss="sqhinge", solver=a.solver), a.repeat)
            t_ovr, m_ovr = best_of(lambda: train(ten, loss="sqhinge", solver=a.solver,
                                               client=client), a.repeat)
            same = bool(np.array_equal(m_seq.coef_, m_ovr.coef_))
            rows.append(("fashion 10 classes", "one class at a time (API)", f"{t_seq:.2f} s", ""))
            rows.append(("fashion 10 classes", f"dask {a.workers} workers (API)", f"{t_ovr:.2f} s",
                         f"same model: {same}"))
            ratios.append((f"10 classes: sequential / dask {a.workers} workers (API)",
                           t_seq / t_ovr))
            # what bounds that ratio: one more run with the scheduler's task stream. The
            # tasks' summed compute time against the one process's (the same classes, run
            # side by side on the workers' cores), and the best any order of these tasks on
            # the workers could do
            from dask.distributed import get_task_stream

            with get_task_stream(client) as ts:
                t0 = time.perf_counter()
                train(ten, loss="sqhinge", solver=a.solver, client=client)
                t_rec = time.perf_counter() - t0
            took = [ss["stop"] - ss["start"] for x in ts.data for ss in x["startstops"]
                    if ss["action"] == "compute"]
            floor = max(sum(took) / a.workers, max(took))
            rows.append(("fashion 10 classes", "dask: tasks' summed compute time",
                         f"{sum(took):.2f} s", f"run {t_rec:.2f} s"))
            ratios.append(("10 classes: tasks' summed time / sequential (cores shared)",
                           sum(took) / t_seq))
            ratios.append((f"10 classes: sequential / (summed tasks / {a.workers}) (the ceiling)",
                           t_seq / floor))
        # ---- 3. TreeCV of PEGASOS, its subtrees as tasks
        if "tree" in parts:
            from ooc_learn.cv.treecv import tree_cv
            from ooc_learn.learners import Pegasos
            from ooc_learn.storage.store import open_store

            with open_store(shirt) as st:
                lrn = Pegasos(lam=1.0 / st.n_samples)
                t_seq, r_seq = best_of(lambda: tree_cv(st, lrn, 10), a.repeat)
                t_dsk, r_dsk = best_of(lambda: tree_cv(st, lrn, 10, client=client), a.repeat)
                t_loc, r_loc = best_of(lambda: tree_cv(st, lrn, 10, n_jobs=a.workers), a.repeat)
            same = bool(np.array_equal(r_seq.fold_scores, r_dsk.fold_scores)
                        and np.array_equal(r_seq.fold_scores, r_loc.fold_scores))
            rows.append(("shirt TreeCV 10-fold", "PEGASOS, one process (API)", f"{t_seq:.2f} s",
                         f"error {r_seq.estimate:.4f}"))
            rows.append(("shirt TreeCV 10-fold", f"dask {a.workers} workers (API)",
                         f"{t_dsk:.2f} s", f"same folds: {same}"))
            rows.append(("shirt TreeCV 10-fold", f"n_jobs={a.workers} local processes",
                         f"{t_loc:.2f} s", ""))
            ratios.append((f"TreeCV 10-fold: one process / dask {a.workers} workers (API)",
                           t_seq / t_dsk))
            ratios.append((f"TreeCV 10-fold: one process / n_jobs={a.workers} (API)",
                           t_seq / t_loc))
    finally:
        client.close()
        cluster.close()
    # ---- the CLI, cluster start included
    if "cli" in parts:
        base = ooc_cli("train_main")
        cv = [str(shirt), "--cv", "5", "--C", a.Cs, "--solver", a.solver, "--loss", "sqhinge",
              "--json", "--quiet"]
        t1, j1 = _cli(base + cv)
        t2, j2 = _cli(base + cv + ["--workers", str(a.workers)])
        rows.append(("shirt 5-fold x 4 C", "ooc-train --cv 5", f"{t1:.2f} s",
                     f"best C {j1['best_C']:g}"))
        rows.append(("shirt 5-fold x 4 C", f"ooc-train --cv 5 --workers {a.workers}",
                     f"{t2:.2f} s", f"best C {j2['best_C']:g}"))
        ratios.append((f"CV 5 x 4 C: ooc-train / --workers {a.workers} (CLI, start included)",
                       t1 / t2))
        tr = [str(ten), "-o", str(a.work / "m.npz"), "--solver", a.solver, "--loss", "sqhinge",
              "--json", "--quiet"]
        t3, _ = _cli(base + tr)
        t4, _ = _cli(base + tr + ["--workers", str(a.workers)])
        rows.append(("fashion 10 classes", "ooc-train", f"{t3:.2f} s", ""))
        rows.append(("fashion 10 classes", f"ooc-train --workers {a.workers}", f"{t4:.2f} s", ""))
        ratios.append((f"10 classes: ooc-train / --workers {a.workers} (CLI, start included)",
                       t3 / t4))
    print(f"{'data':<20} {'run':<40} {'result':>22} {'':<20}")
    for r in rows:
        print(f"{r[0]:<20} {r[1]:<40} {r[2]:>22} {r[3]:<20}")
    print(f"(API: best of {a.repeat}; CLI: one run each)")
    for name, v in ratios:
        print(f"  {name:<66} {v:6.2f}")


if __name__ == "__main__":
    main()
