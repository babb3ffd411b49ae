#!/usr/bin/env python
"""Benchmark sparse RLS cross-validation (Pahikkala et al. 2012, Section 6.1).

For each data set and basis size n, in one run:

* ``fit``      one SparseRLS training (O(m n^2));
* ``loo1``     fit + LOO for one lambda; ``loo20`` fit + LOO for a 20-value lambda grid
               (basis rows kept, loss dropped: the setting Cawley-Talbot is defined for);
* ``loo20rm``  fit + LOO for 20 lambdas with basis rows removed;
* ``ct20``     the Cawley-Talbot O(m n^2)-per-lambda LOO over the same 20 lambdas;
* ``skl20``    scikit-learn Nystroem features on the same basis + RidgeCV(gcv_mode="svd",
               fit_intercept=False) over the same alphas: the same model, exact efficient LOO;
* ``kf10``     fit + 10-fold CV with basis removal, 20 lambdas; ``kf10g`` the same with the
               folds given at construction (per-fold Grams accumulated during the training
               pass, :class:`SparseRLS` ``folds=``); ``refit10`` the brute force: ten
               fits on the held-in rows with basis L = B \\ H, each predicting its fold for the
               20 lambdas through the O(n^2) lambda switch.

Agreement columns: max |ours - other| / max |y| of the LOO / k-fold predictions (ct, refit)
and the relative gap of the LOO-MSE curves (skl; Nystroem uses a pseudo-inverse of K_BB where
we use a 1e-8 diagonal shift, so tiny differences are expected).

Data: cpusmall, abalone_scale, housing_scale from ../shared/data (features standardised,
targets centred, RBF gamma = 1/d), the sinusoid task of Section 6.3 (3,000 points on [-20, 20],
noise sd 2, gamma 0.5), and with --big a generated set of >= 1M rows ingested into a Store and
fitted / cross-validated by streaming under a memory cap.

Usage: python scripts/bench_rls.py [--n 500 1000 2000] [--datasets ...] [--big-rows 1000000]
"""

from __future__ import annotations

import argparse
import lzma
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ooc_learn.rls import SparseRLS, cawley_talbot_loo

DATA = Path(os.environ.get("OOC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
LAMS = np.logspace(-4, 3, 20)


def load(name: str, rng):
    if name == "sinusoid":
        x = rng.uniform(-20, 20, size=(3000, 1))
        return x, np.sin(x[:, 0]) + rng.normal(scale=2.0, size=3000), 0.5
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(lzma.open(DATA / f"{name}.svm.xz"))
    X = X.toarray()
    sd = X.std(axis=0)
    X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    return X, y - y.mean(), 1.0 / X.shape[1]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_one(name, X, y, gamma, n, seed=0):
    m = X.shape[0]
    n = min(n, m)
    kw = dict(kernel="rbf", gamma=gamma, n_basis=n, seed=seed, lam=1.0)
    row = {"data": name, "m": m, "n": n}
    row["fit"], _ = timed(lambda: SparseRLS(**kw).fit(X, y))
    row["loo1"], _ = timed(lambda: SparseRLS(**kw).fit(X, y).loo_predict("keep_no_loss"))
    model = SparseRLS(**kw)
    row["loo20"], ours = timed(lambda: model.fit(X, y).loo_predict_path(LAMS, "keep_no_loss"))
    row["loo20rm"], _ = timed(lambda: SparseRLS(**kw).fit(X, y).loo_predict_path(LAMS, "remove"))
    basis = model.basis_
    row["ct20"], ct = timed(lambda: cawley_talbot_loo(X, y, LAMS, basis=basis, gamma=gamma))
    scale = np.abs(y).max()
    row["d_ct"] = float(np.abs(ours - ct).max() / scale)
    row["skl20"], gap = timed(lambda: sklearn_ridgecv(X, y, basis, gamma, ours))
    row["d_skl"] = gap
    km = SparseRLS(**kw)
    row["kf10"], kf = timed(lambda: km.fit(X, y).kfold_predict_path(10, LAMS, "remove"))
    kg = SparseRLS(folds=10, **kw)
    row["kf10g"], kfg = timed(lambda: kg.fit(X, y).kfold_predict_path(10, LAMS, "remove"))
    folds = [np.sort(f) for f in np.array_split(np.random.default_rng(seed).permutation(m), 10)]
    row["refit10"], rf = timed(lambda: refit_folds(X, y, basis, folds, kw))
    row["d_refit"] = float(max(np.nanmax(np.abs(kf - rf)), np.nanmax(np.abs(kfg - rf))) / scale)
    row["best_lam"] = float(LAMS[np.argmin(((ours - y) ** 2).mean(axis=1))])
    return row


def sklearn_ridgecv(X, y, basis, gamma, ours):
    from sklearn.kernel_approximation import Nystroem
    from sklearn.linear_model import RidgeCV

    ny = Nystroem(kernel="rbf", gamma=gamma, n_components=basis.size, random_state=0)
    F = ny.fit(X[basis]).transform(X)
    try:
        rc = RidgeCV(alphas=LAMS, fit_intercept=False, gcv_mode="svd", store_cv_results=True)
        rc.fit(F, y)
        cv = rc.cv_results_
    except TypeError:                      # scikit-learn < 1.5
        rc = RidgeCV(alphas=LAMS, fit_intercept=False, gcv_mode="svd", store_cv_values=True)
        rc.fit(F, y)
        cv = rc.cv_values_
    skl_curve = np.asarray(cv).reshape(X.shape[0], -1).mean(axis=0)
    our_curve = ((ours - y) ** 2).mean(axis=1)
    return float(np.max(np.abs(skl_curve - our_curve) / our_curve))


def refit_folds(X, y, basis, folds, kw):
    out = np.full((LAMS.size, X.shape[0]), np.nan)
    for H in folds:
        keep = np.setdiff1d(np.arange(X.shape[0]), H)
        L = np.setdiff1d(basis, H)
        local = np.searchsorted(keep, L)               # basis positions among held-in rows
        args = {k: v for k, v in kw.items() if k not in ("n_basis", "seed")}
        model = SparseRLS(basis=local, **args).fit(X[keep], y[keep])
        for k, coef in enumerate(model.coef_path(LAMS)):
            model.coef_ = coef
            out[k, H] = model.predict(X[H])
    return out


def bench_big(rows: int, n: int, memory: str, seed=0):
    """Streaming fit + 20-lambda LOO + 10-fold (block groups) of a >= 1M-row Store."""
    from ooc_learn.storage.ingest import ingest_arrays

    rng = np.random.default_rng(seed)
    d = 8
    X = rng.uniform(-1, 1, size=(rows, d)).astype(np.float32)
    y = (np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=rows)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        t_ing, store = timed(lambda: ingest_arrays(X, y, Path(tmp) / "big.store", n_blocks=20,
                                                   task="regression", memory=memory))
        del X
        kw = dict(kernel="rbf", gamma=1.0 / d, n_basis=n, seed=seed, memory=memory)
        model = SparseRLS(**kw)
        t_fit, _ = timed(lambda: model.fit(store))
        cached = model._ucache is not None
        t_loo, loo = timed(lambda: model.loo_predict_path(LAMS, "remove"))
        t_kf, kf = timed(lambda: model.kfold_predict_path(10, LAMS, "remove"))
        ys = np.asarray(store.labels(), dtype=np.float64)
        mse_loo = ((loo - ys) ** 2).mean(axis=1)
        mse_kf = ((kf - ys) ** 2).mean(axis=1)
        store.close()
    return dict(rows=rows, n=n, memory=memory, u_cached=cached, ingest=t_ing, fit=t_fit,
                loo20=t_loo, kf10=t_kf, best_loo=float(LAMS[mse_loo.argmin()]),
                best_kf=float(LAMS[mse_kf.argmin()]), mse_loo=float(mse_loo.min()),
                strategies=model.cv_stats_.get("strategies"))


def print_table(rows):
    head = ("data", "m", "n", "fit", "loo1", "loo20", "loo20rm", "ct20", "skl20", "kf10",
            "kf10g", "refit10", "20LOO/fit", "20LOO/1LOO", "CT/ours", "skl/ours", "refit/kf",
            "refit/kfg", "d_ct", "d_skl", "d_refit")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        vals = [r["data"], r["m"], r["n"]] + [f"{r[k]:.2f}" for k in
                                                  ("fit", "loo1", "loo20", "loo20rm", "ct20",
                                                   "skl20", "kf10", "kf10g", "refit10")]
        vals += [f"{r['loo20'] / r['fit']:.2f}", f"{r['loo20'] / r['loo1']:.2f}",
                 f"{r['ct20'] / r['loo20']:.1f}", f"{r['skl20'] / r['loo20']:.2f}",
                 f"{r['refit10'] / r['kf10']:.1f}", f"{r['refit10'] / r['kf10g']:.1f}",
                 f"{r['d_ct']:.1e}", f"{r['d_skl']:.1e}",
                 f"{r['d_refit']:.1e}"]
        print("| " + " | ".join(str(v) for v in vals) + " |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="*",
                    default=["housing_scale", "abalone_scale", "cpusmall", "sinusoid"])
    ap.add_argument("--n", nargs="*", type=int, default=[500, 1000, 2000])
    ap.add_argument("--big-rows", type=int, default=0, help="rows of the generated Store (0: skip)")
    ap.add_argument("--big-n", type=int, default=500)
    ap.add_argument("--big-memory", default="1G")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads for every method (1: stable timings on a shared machine)")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(args.threads):
        run(args)


def run(args):
    rng = np.random.default_rng(0)
    SparseRLS(n_basis=5).fit(np.random.default_rng(1).normal(size=(20, 2)), np.ones(20))  # JIT
    rows = []
    for name in args.datasets:
        X, y, gamma = load(name, rng)
        for n in args.n:
            if n > X.shape[0] and n != args.n[0]:
                continue
            rows.append(bench_one(name, X, y, gamma, n))
            print(rows[-1], file=sys.stderr, flush=True)
    print_table(rows)
    if args.big_rows:
        print(bench_big(args.big_rows, args.big_n, args.big_memory), flush=True)


if __name__ == "__main__":
    main()
