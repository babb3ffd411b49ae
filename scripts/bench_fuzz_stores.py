"""Fuzz the store reader: ``--stores`` damaged copies of a dense and a CSR store (random byte
flips in the stored values, random cuts of data.h5, the structural damages of
``ooc_learn._corrupt``), each run through ``ooc-check``, ``ooc-train`` (IBCD) and ``ooc-train
--solver dcd`` in batches of one process each. Prints the tallies: signals (crashes),
tracebacks, exit codes, and how many flipped bytes ``ooc-check`` detected.

    python scripts/bench_fuzz_stores.py --stores 1000 --work /tmp/ooc_fuzz
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def build(work: Path, csr: bool) -> Path:
    from sklearn.datasets import dump_svmlight_file

    from ooc_learn.cli import ingest_main

    rng = np.random.default_rng(11)
    n, d = 2000, 40
    X = (sp.random(n, d, density=0.1, random_state=11, format="csr") if csr
         else rng.normal(size=(n, d)))
    y = np.where(X @ rng.normal(size=d) > 0, 1.0, -1.0)
    src = work / f"src-{'csr' if csr else 'dense'}.svm"
    dump_svmlight_file(X, y, str(src), zero_based=False)
    store = work / f"store-{'csr' if csr else 'dense'}"
    assert ingest_main([str(src), "-o", str(store), "--quiet", "--overwrite", "--blocks", "4",
                        "--layout", "csr" if csr else "dense"]) == 0
    return store


def damaged(store: Path, out: Path, i: int, rng):
    """One damaged copy: ``(path, kind, description, benign)``."""
    import h5py

    from ooc_learn import _corrupt as C
    from ooc_learn.storage.integrity import HASHED

    dst = out / f"{store.name}-{i:05d}"
    shutil.copytree(store, dst)
    r = rng.random()
    if r < 0.6:
        with h5py.File(dst / "data.h5", "r") as f:
            names = [k for k in HASHED[str(f.attrs["layout"])] if k in f]
        name = names[int(rng.integers(len(names)))]
        descs = [C.flip_byte(dst, name, rng) for _ in range(int(rng.integers(1, 4)))]
        return dst, "flip", "; ".join(descs), False
    if r < 0.75:
        return dst, "cut", C.truncate(dst, float(rng.uniform(0.0, 0.98))), False
    labels = sorted(C.STRUCTURAL)
    label = labels[int(rng.integers(len(labels)))]
    desc = C.STRUCTURAL[label](dst)
    return dst, "structural", f"{label}: {desc}", label in C.BENIGN or "absent" in str(desc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", type=int, default=1000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--work", default="/tmp/ooc_fuzz")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = np.random.default_rng(a.seed)
    bases = [build(work, False), build(work, True)]
    t0 = time.perf_counter()
    tally = Counter()
    flips = Counter()
    problems = []
    done = 0
    while done < a.stores:
        batch_dir = work / f"batch-{done:05d}"
        batch_dir.mkdir()
        made = [damaged(bases[(done + j) % 2], batch_dir, done + j, rng)
                for j in range(min(a.batch, a.stores - done))]
        proc = subprocess.run([sys.executable, "-m", "ooc_learn._corrupt_driver",
                               str(batch_dir)] + [str(m[0]) for m in made],
                              capture_output=True, text=True, timeout=3600)
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0:
            tally["signal" if proc.returncode < 0 else "driver failed"] += 1
            last = [x for x in lines if x["cmd"] == "start"][-1:]
            problems.append(f"batch {done}: exit {proc.returncode} at {last}")
        res = {(r["store"], r["cmd"]): r for r in lines if r["cmd"] != "start"}
        for path, kind, desc, benign in made:
            for cmd in ("check", "train", "dcd"):
                r = res.get((str(path), cmd))
                if r is None:
                    continue
                if r["traceback"]:
                    tally["traceback"] += 1
                    problems.append(f"{cmd} on {kind} {desc}: {r['traceback'][-300:]}")
                tally[f"{cmd} rc {r['rc']}"] += 1
            chk = res.get((str(path), "check"))
            if kind == "flip" and chk is not None:
                flips["flipped stores"] += 1
                flips["detected"] += int(chk["rc"] == 2)
            if not benign and chk is not None and chk["rc"] != 2:
                problems.append(f"check passed a damaged store: {kind} {desc}")
            tally[f"stores {kind}{' (benign)' if benign else ''}"] += 1
        shutil.rmtree(batch_dir, ignore_errors=True)
        done += len(made)
        print(f"  {done} stores, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\n{done} damaged stores in {time.perf_counter() - t0:.0f} s")
    for k in sorted(tally):
        print(f"  {k:28s} {tally[k]}")
    print(f"  flipped-byte stores detected by ooc-check: {flips['detected']} of "
          f"{flips['flipped stores']}")
    print(f"  signals: {tally['signal']}, tracebacks: {tally['traceback']}")
    for line in problems[:20]:
        print("  PROBLEM", line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
