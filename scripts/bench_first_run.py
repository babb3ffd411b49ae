"""README command 1 on a fresh clone: its ingest and train, first run (no numba cache) and
second run, side by side.

    python scripts/bench_first_run.py [--repo PATH] [--rows 20000] [--runs 2]

The repository is cloned into a temporary folder and installed there (a virtual environment
that sees this interpreter's packages, ``pip install --no-deps -e``), numba's cache pointed at
an empty folder (``NUMBA_CACHE_DIR``), and README command 1's steps run from the clone: the
example generated (not timed), then ``ooc-ingest`` and ``ooc-train`` each timed as the user
waits for them (process start included). The first run compiles every kernel it needs; the
second loads them from the cache. ``--runs N`` repeats the pair with a fresh cache each time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(cmd, cwd, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=1, help="cold/warm pairs, each a fresh cache")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ooc-first-run-") as tmp:
        tmp = Path(tmp)
        clone = tmp / "clone"
        subprocess.run(["git", "clone", "-q", a.repo, str(clone)], check=True)
        venv = tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "-e", str(clone)],
                       check=True, stdout=subprocess.DEVNULL)
        bin_ = venv / "bin"
        env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")
        env.pop("PYTHONPATH", None)
        subprocess.run([str(py), "-m", "ooc_learn.datasets", "example.svm", "--rows",
                        str(a.rows), "--test", "example.t.svm"], cwd=clone, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        ingest = [str(bin_ / "ooc-ingest"), "example.svm", "-o", "example.store", "--overwrite"]
        train = [str(bin_ / "ooc-train"), "example.store", "-o", "example.npz", "--test",
                 "example.t.svm"]
        rows = []
        for r in range(a.runs):
            env["NUMBA_CACHE_DIR"] = str(tmp / f"numba-cache-{r}")
            for label in ("first run (empty numba cache)", "second run (cache filled)"):
                ti = _run(ingest, clone, env)
                tt = _run(train, clone, env)
                rows.append((label, ti, tt))
        print(f"README command 1 on a fresh clone of {a.repo} ({a.rows} rows)")
        print(f"{'run':<32} {'ingest s':>9} {'train s':>9} {'total s':>9}")
        for label, ti, tt in rows:
            print(f"{label:<32} {ti:>9.2f} {tt:>9.2f} {ti + tt:>9.2f}")
        cold = [ti + tt for label, ti, tt in rows if label.startswith("first")]
        warm = [ti + tt for label, ti, tt in rows if label.startswith("second")]
        print(f"first / second run total: {min(cold) / min(warm):.1f}x "
              f"(best of {a.runs}; targets: first <= 15 s, second <= 4 s)")


if __name__ == "__main__":
    main()
