"""k-fold CV of a kernel SVM: cold start vs ATO / MIR / SIR seeding vs LIBSVM and scikit-learn.

Usage: python scripts/bench_svm_cv.py [--k 10 100] [--subset 2000] [--datasets heart splice ...]
       [--clock wall|cpu] [--phases]

Every method uses the same folds and runs each set over a grid of C (``--C-scale``: the set's C
times 0.1, 1 and 10); "total s" is the best of ``--repeat`` (3) runs (of more, up to 20, while they
take under a second in all), JIT warm-up outside,
"wall/cold" its ratio to cold start's; ATO's path steps count with its iterations (one pivot
each, as an SMO step). "total s" is wall seconds, or with ``--clock cpu`` this
process's CPU seconds (steadier on a shared machine; every solver runs on one thread, in this
process), for our methods and the peers alike; "init s" / "train s" are always wall. LIBSVM
(libsvm-official) is trained per fold on the same folds (cache 100 MB, eps 1e-3); scikit-learn
runs cross_val_score(SVC) with a PredefinedSplit of the same folds.

All solvers run on one thread: the libsvm-official wheel is built with OpenMP, and on a loaded
machine its spinning threads made it 10-100x slower than one thread (``docs/bench-log.md``),
so OMP_NUM_THREADS defaults to 1 here, as for our SMO and sklearn.
ATO's path costs O(|free SV|^3) per step; ``--ato-max-n`` skips it on larger sets.
``--phases`` adds the SMO iterations of rounds 1..k-1 (round 0 is a cold start for every
method) split by the pair gap: > 1, 1..0.1, 0.1..0.01, 0.01..tol.
``--oracle`` adds two seeds built from each round's exact optimum (eps 1e-9), to bound what a
seeder can save: "keep-S" keeps the previous round's alpha on the shared rows and gives T its
optimal alphas (the best SIR or MIR could do: both keep alpha_S), "opt-S" starts from the
optimal alpha_S with alpha_T = 0. Their iterations cover rounds 1..k-1 plus cold round 0.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")   # before libsvm's OpenMP runtime loads

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from libsvm.svmutil import svm_parameter, svm_predict, svm_problem, svm_train  # noqa: E402
from sklearn.model_selection import PredefinedSplit, cross_val_score  # noqa: E402
from sklearn.svm import SVC  # noqa: E402

from _bench_data import best_of  # noqa: E402
from _kernel_bench_data import fashion, libsvm  # noqa: E402
from ooc_learn.kernel import make_folds, svm_cv  # noqa: E402
from ooc_learn.kernel.seeding import restore_equality  # noqa: E402
from ooc_learn.kernel.smo import KernelMatrix, move_alpha, solve  # noqa: E402
from ooc_learn.storage.budget import MemoryBudget  # noqa: E402

# (loader, C, gamma): Wen et al. Table 2 where it applies (Heart, Adult = a9a); otherwise C=1..10
# and LIBSVM's gamma = 1/d on [-1, 1]-scaled features.
DATASETS = {
    "heart": (lambda s: libsvm("heart_scale.svm.xz"), 2182.0, 0.2),
    "splice": (lambda s: libsvm("splice_scale.svm.xz"), 10.0, 1 / 60),
    "german": (lambda s: libsvm("german.numer.svm.xz", scale=True), 1.0, 1 / 24),
    "a9a": (lambda s: libsvm("a9a.svm.xz", n_features=123, subset=s), 100.0, 0.5),
    "ijcnn1": (lambda s: libsvm("ijcnn1.svm.xz", subset=s), 10.0, 1 / 22),
    "fmnist0": (lambda s: fashion(0, subset=s), 10.0, 0.02),
}


CLOCK = time.perf_counter


def run_libsvm(X, y, folds, C, gamma):
    """Train + predict time only; building the ctypes problems is left out of the clock."""
    spent = 0.0
    correct = 0
    param = svm_parameter(f"-s 0 -t 2 -c {C} -g {gamma} -e 0.001 -m 100 -q")
    for h in np.unique(folds):
        tr, te = folds != h, folds == h
        prob = svm_problem(y[tr].tolist(), X[tr].astype(np.float64).tolist())
        Xte = X[te].astype(np.float64).tolist()
        t0 = CLOCK()
        m = svm_train(prob, param)
        p = svm_predict(y[te].tolist(), Xte, m, "-q")[0]
        spent += CLOCK() - t0
        correct += int(np.sum(np.array(p) == y[te]))
    return spent, correct / len(y)


def run_sklearn(X, y, folds, C, gamma):
    t0 = CLOCK()
    s = cross_val_score(SVC(C=C, gamma=gamma, tol=1e-3, cache_size=100), X, y,
                        cv=PredefinedSplit(folds))
    sizes = np.bincount(folds)
    return CLOCK() - t0, float(np.dot(s, sizes) / sizes.sum())


def _solve_from(km, y, train, a, C):
    """SMO iterations from the feasible seed ``a`` (svm_cv's own seeding step: the gradient
    of alpha = 0 updated with the seed's columns)."""
    G = np.zeros(km.n)
    G[train] = -1.0
    move_alpha(km, y, a, G, train)
    return solve(km, train, y, a.copy(), G, C, 1e-3)[1]


def run_oracles(X, y, folds, C, gamma):
    """Iterations of the keep-S and opt-S oracle seeds (see the module docstring)."""
    n, k = len(y), int(folds.max()) + 1
    with KernelMatrix(X, "rbf", gamma, 3, 0.0, MemoryBudget.coerce(None)) as km:
        opt, first = [], 0
        for h in range(k):
            train = np.flatnonzero(folds != h)
            a, G = np.zeros(n), np.zeros(n)
            G[train] = -1.0
            it = solve(km, train, y, a, G, C, 1e-3)[1]
            first = it if h == 0 else first
            solve(km, train, y, a, G, C, 1e-9)
            opt.append(a)
        keep_s = opt_s = first
        for h in range(1, k):
            train, T = np.flatnonzero(folds != h), np.flatnonzero(folds == h - 1)
            a = opt[h - 1].copy()
            a[folds == h] = 0.0
            a[T] = opt[h][T]
            restore_equality(a, y, C, train, T)
            keep_s += _solve_from(km, y, train, a, C)
            a = opt[h].copy()
            a[T] = 0.0
            restore_equality(a, y, C, train, T)
            opt_s += _solve_from(km, y, train, a, C)
    return keep_s, opt_s


def _phases(r):
    """SMO iterations of rounds 1..k-1 by phase (round 0 is cold for every method)."""
    ph = np.asarray(r.stats["fold_phase_iterations"])[1:].sum(axis=0)
    return "  " + " / ".join(f"{int(v)}" for v in ph) + f"  (= {int(ph.sum())})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, nargs="+", default=[10])
    ap.add_argument("--subset", type=int, default=2000)
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS))
    ap.add_argument("--methods", nargs="+", default=["cold", "ato", "mir", "sir"])
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--ato-max-n", type=int, default=1000,
                    help="skip ATO on sets with more rows (0 = never skip; a9a's 2000 rows "
                         "took 700 s)")
    ap.add_argument("--C-scale", type=float, nargs="+", default=[0.1, 1.0, 10.0],
                    help="run every set at its C times each of these (a grid, as the papers)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="total s as wall time or as this process's CPU time")
    ap.add_argument("--oracle", action="store_true",
                    help="also run the keep-S / opt-S oracle seeds (bounds on seeding)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs per cell (at least)")
    ap.add_argument("--phases", action="store_true",
                    help="print SMO iterations of rounds 1..k-1 per pair-gap phase")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    Xw, yw = np.eye(4, dtype=np.float32), np.array([-1.0, 1.0, -1.0, 1.0])
    svm_cv(Xw, yw, C=1.0, k=2)                         # JIT warm-up
    run_libsvm(Xw, yw, np.array([0, 0, 1, 1]), 1.0, 1.0)   # first-call library load
    hdr = (f"{'data':8} {'n':>5} {'C':>7} {'k':>4} {'method':8} {'init s':>8} {'train s':>8} "
           f"{'total s':>8} {'wall/cold':>9} {'iters':>8} {'iters/cold':>10} {'accuracy':>8}"
           + (f"  {'rounds 1..k-1 by gap: >1 / 1-.1 / .1-.01 / .01-tol':>30}"
              if args.phases else ""))
    print(hdr)
    print("-" * len(hdr))
    for name in args.datasets:
        load, C0, gamma = DATASETS[name]
        X, y = load(args.subset)
        y = np.where(y == np.unique(y)[1], 1.0, -1.0)
        for C, k in [(C0 * sc, k) for sc in args.C_scale for k in args.k]:
            folds = make_folds(len(y), k, seed=0)
            cold_it = cold_t = None
            for meth in args.methods:
                if meth == "ato" and args.ato_max_n and len(y) > args.ato_max_n:
                    print(f"{name:8} {len(y):5d} {C:7g} {k:4d} {meth:8} skipped "
                          f"(n > --ato-max-n)")
                    continue
                # best of --repeat (more while under a second: short runs swing 3-5x here)
                tot, r = best_of(lambda: svm_cv(X, y, kernel="rbf", C=C, gamma=gamma,
                                                folds=folds,
                                                seeding=None if meth == "cold" else meth),
                                 args.repeat, clock=CLOCK)
                # ATO's path steps are pivots like SMO's: counted with its iterations
                it = r.stats["smo_iterations"] + r.stats.get("ato_steps", 0)
                if meth == "cold":
                    cold_it, cold_t = it, tot
                ratio = f"{it / cold_it:.2f}" if cold_it else "-"
                wall = f"{tot / cold_t:.2f}" if cold_t else "-"
                print(f"{name:8} {len(y):5d} {C:7g} {k:4d} {meth:8} "
                      f"{r.stats['init_seconds']:8.3f} {r.stats['train_seconds']:8.3f} "
                      f"{tot:8.3f} {wall:>9} {it:8d} {ratio:>10} {r.estimate:8.4f}"
                      + (_phases(r) if args.phases else ""), flush=True)
            if args.oracle:
                for label, it in zip(("keep-S", "opt-S"), run_oracles(X, y, folds, C, gamma)):
                    print(f"{name:8} {len(y):5d} {C:7g} {k:4d} {label:8} {'-':>8} {'-':>8} "
                          f"{'-':>8} {'-':>9} {it:8d} {it / cold_it:10.2f} {'-':>8}"
                          if cold_it else "", flush=True)
            if not args.no_peers:
                for peer, fn in (("libsvm", run_libsvm), ("sklearn", run_sklearn)):
                    tot, acc = fn(X, y, folds, C, gamma)
                    print(f"{name:8} {len(y):5d} {C:7g} {k:4d} {peer:8} {'-':>8} {'-':>8} "
                          f"{tot:8.3f} {tot / cold_t:9.2f} {'-':>8} {'-':>10} {acc:8.4f}",
                          flush=True)


if __name__ == "__main__":
    main()
