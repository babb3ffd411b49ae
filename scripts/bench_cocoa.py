"""CoCoA+ over 2 and 4 shards on a Dask cluster against the single-machine solver, side by side.

    python scripts/bench_cocoa.py [--work DIR] [--workers 2] [--loss sqhinge] [--eps 1e-3]

For a9a (LIBSVM, 8 blocks, with its test file) and a generated sparse set (2000 x 3000, rows
only weakly coupled): the single machine's optimum (``--solver dcd`` to eps 1e-6, its primal
objective computed here) against CoCoA+ with K = 2 and 4 shards on a local cluster of
``--workers`` processes: rounds to the relative duality gap ``--eps`` (or ``--max-rounds``),
the primal objective's distance to the optimum, test accuracy, seconds, bytes shipped per round;
then the same rows ingested as sharded stores (``ooc-ingest --shards 2`` / ``4``: each shard a
store with its own index), CoCoA+ over their shards.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _primal(X, y, model, C: float, loss: str) -> float:
    w = np.append(model.coef_, model.intercept_ / model.meta.get("bias", 1.0))
    m = np.maximum(0.0, 1.0 - np.asarray(y) * (np.asarray(X @ model.coef_).ravel()
                                              + model.intercept_))
    return 0.5 * float(w @ w) + C * float(m.sum() if loss == "hinge" else (m ** 2).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/ooc_bench_cocoa"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--loss", default="sqhinge")
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--max-rounds", type=int, default=300)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    a.work.mkdir(parents=True, exist_ok=True)
    import scipy.sparse as sp

    from _bench_data import DATA

    from ooc_learn.api import ingest_arrays
    from ooc_learn.distributed import make_client
    from ooc_learn.solvers.cocoa import train_cocoa
    from ooc_learn.storage.store import open_store
    from ooc_learn.training import train

    sets = {}
    a9a = a.work / "a9a8.store"
    if not a9a.exists():
        subprocess.run([sys.executable, "-c", "import sys; from ooc_learn.cli import "
                        "ingest_main; sys.exit(ingest_main())", str(DATA / "a9a.svm.xz"), "-o",
                        str(a9a), "--blocks", "8", "--quiet"], check=True)
    sets["a9a"] = (a9a, DATA / "a9a.t.svm.xz")
    gen = a.work / "sparse.store"
    if not gen.exists():
        rng = np.random.default_rng(0)
        X = sp.random(2000, 3000, density=0.01, random_state=1, format="csr", dtype=np.float32)
        X.data[:] = 1.0
        y = np.where(X @ rng.normal(size=3000) + 0.3 * rng.normal(size=2000) > 0, 1, -1)
        ingest_arrays(X, y, gen, n_blocks=8).close()
    sets["sparse"] = (gen, None)
    # the same rows as sharded stores (ooc-ingest --shards K: K stores, each with its index)
    for name, (path, _) in list(sets.items()):
        for k in (2, 4):
            out = a.work / f"{name}-{k}shards"
            if out.exists():
                continue
            if name == "a9a":
                subprocess.run([sys.executable, "-c", "import sys; from ooc_learn.cli import "
                                "ingest_main; sys.exit(ingest_main())",
                                str(DATA / "a9a.svm.xz"), "-o", str(out), "--blocks", "8",
                                "--shards", str(k), "--quiet"], check=True)
            else:
                with open_store(path) as st:
                    Xg, yg, _ = st.read_range(0, st.n_samples)
                ingest_arrays(Xg, yg, out, n_blocks=8, shards=k)
    rows = []
    client, cluster = make_client(workers=a.workers)
    try:
        client.run(lambda: __import__("ooc_learn.solvers.cocoa"))
        for name, (path, test) in sets.items():
            with open_store(path) as st:
                X, y, _ = st.read_range(0, st.n_samples)
            t0 = time.perf_counter()
            ref = train(path, solver="dcd", loss=a.loss, eps=1e-6, max_outer=100)
            t_ref = time.perf_counter() - t0
            p_ref = _primal(X, y, ref, 1.0, a.loss)
            acc_ref = _accuracy(ref, path, test)
            rows.append((name, "single machine (dcd, eps 1e-6)", "-", f"{p_ref:.2f}", "-",
                         f"{100 * acc_ref:.2f}", f"{t_ref:.2f}", "-"))
            runs = [(f"CoCoA+ K={k} ({a.workers} workers)", path, k) for k in (2, 4)]
            # a sharded store: each shard a store of its own
            runs += [(f"CoCoA+ {k}-shard store", a.work / f"{name}-{k}shards", None)
                     for k in (2, 4)]
            for label, where, k in runs:
                t0 = time.perf_counter()
                m = train_cocoa(where, client, shards=k, loss=a.loss, eps=a.eps,
                                epochs=a.epochs, max_rounds=a.max_rounds)
                t = time.perf_counter() - t0
                s = m.meta["stats"]
                p = _primal(X, y, m, 1.0, a.loss)
                rows.append((name, label, f"{s['rounds']}{'' if s['converged'] else '+'}",
                             f"{p:.2f}", f"{(p - p_ref) / p_ref:.1e}",
                             f"{100 * _accuracy(m, path, test):.2f}", f"{t:.2f}",
                             f"{s['bytes_per_round']:,}"))
    finally:
        client.close()
        cluster.close()
    print(f"{a.loss}, C=1, CoCoA+ stops at a duality gap of {a.eps:g} of the primal (a '+' "
          f"after the rounds: not reached in {a.max_rounds}); {a.epochs} local passes a round")
    head = ("data", "run", "rounds", "primal", "rel. to opt", "acc %", "seconds", "bytes/round")
    print(f"{head[0]:<8} {head[1]:<32} {head[2]:>7} {head[3]:>11} {head[4]:>11} {head[5]:>7} "
          f"{head[6]:>8} {head[7]:>12}")
    for r in rows:
        print(f"{r[0]:<8} {r[1]:<32} {r[2]:>7} {r[3]:>11} {r[4]:>11} {r[5]:>7} {r[6]:>8} "
              f"{r[7]:>12}")


def _accuracy(model, path, test) -> float:
    """Test accuracy on ``test`` (a LIBSVM file) or, without one, on the training store."""
    import tempfile

    from ooc_learn.api import ingest
    from ooc_learn.storage.store import open_store

    if test is None:
        with open_store(path) as st:
            return model.score(st)
    with tempfile.TemporaryDirectory() as tmp, \
            ingest([test], Path(tmp) / "t.store", build_index=False,
                   n_features=model.n_features_in_) as st:
        return model.score(st)


if __name__ == "__main__":
    main()
