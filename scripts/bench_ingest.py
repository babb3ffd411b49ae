#!/usr/bin/env python
"""Ingest throughput and peak memory, side by side with scikit-learn's parser.

For each source: end-to-end ``ooc-ingest`` (parse + external shuffle + HDF5 write, index off
and on) versus ``sklearn.datasets.load_svmlight_file`` (parse only, in memory), each run in its
own child process whose peak RSS is read from outside (``RUSAGE_CHILDREN`` of a wrapper).
The memory promise is checked against the same command on a tiny source:
peak RSS(big) <= peak RSS(tiny) + cap.

    python scripts/bench_ingest.py [--shared ../shared/data] [--big-gb 2.0] [--memory 64M]
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tempfile
from pathlib import Path

import numpy as np

from ooc_learn.storage.measure import measure_command

from _bench_data import fashion_mnist

HERE = Path(__file__).resolve().parent


def measure(cmd: list[str]) -> tuple[int, float]:
    """Run ``cmd`` in a child of a fresh wrapper; return (peak RSS bytes, wall seconds)."""
    rss, dt, rc, err = measure_command(cmd)
    if rc != 0:
        raise RuntimeError(f"{cmd} failed:\n{err[-2000:]}")
    return rss, dt


def sklearn_cmd(path: Path) -> list[str]:
    code = ("import sys; from sklearn.datasets import load_svmlight_file; "
            "load_svmlight_file(sys.argv[1])")
    return [sys.executable, "-c", code, str(path)]


def ingest_cmd(path: Path, out: Path, memory: str, index: bool) -> list[str]:
    code = "import sys; from ooc_learn.cli import ingest_main; sys.exit(ingest_main())"
    cmd = [sys.executable, "-c", code, str(path), "-o", str(out), "--overwrite", "--quiet",
           "--memory", memory]
    return cmd + ([] if index else ["--no-index"])


def write_fashion_mnist(shared: Path, out: Path) -> Path | None:
    if not (shared / "fashion-mnist" / "train-images-idx3-ubyte.gz").exists():
        return None
    X, y = fashion_mnist("train", shared)
    with open(out, "w") as fh:
        for i in range(X.shape[0]):
            nz = np.flatnonzero(X[i])
            fh.write(f"{int(y[i] == 0) * 2 - 1} " +
                     " ".join(f"{j + 1}:{X[i, j] / 255:.6g}" for j in nz) + "\n")
    return out


def decompress(src: Path, out: Path) -> Path | None:
    if not src.exists():
        return None
    with lzma.open(src) as fi, open(out, "wb") as fo:
        while buf := fi.read(1 << 24):
            fo.write(buf)
    return out


def write_generated(out: Path, gb: float, seed: int = 0) -> Path:
    """A sparse LIBSVM source of at least ``gb`` GB: a ~100 MB block of rows, written again
    with fresh labels until the size is reached (the parser's work per byte is the same)."""
    rng = np.random.default_rng(seed)
    lines = []
    size = 0
    while size < 100e6:
        nz = np.sort(rng.choice(1000, 40, replace=False)) + 1
        vals = rng.normal(size=40)
        line = " ".join(f"{j}:{v:.5f}" for j, v in zip(nz, vals))
        lines.append(line)
        size += len(line) + 3
    target = gb * 1e9
    written = 0
    with open(out, "w") as fh:
        while written < target:
            labels = rng.choice(["1", "-1"], len(lines))
            chunk = "\n".join(f"{l} {r}" for l, r in zip(labels, lines)) + "\n"
            fh.write(chunk)
            written += len(chunk)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", default=str(HERE.parent.parent / "shared" / "data"))
    p.add_argument("--big-gb", type=float, default=2.0, help="size of the generated source")
    p.add_argument("--memory", default="64M")
    p.add_argument("--skip-sklearn-big", action="store_true",
                   help="skip scikit-learn on the generated source (it needs ~3x its size in RAM)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    shared = Path(args.shared)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_ingest_"))
    work.mkdir(parents=True, exist_ok=True)

    sources = {}
    tiny = work / "tiny.svm"
    tiny.write_text("1 1:0.5 3:1\n-1 2:0.25\n" * 50)
    print("preparing sources in", work, file=sys.stderr)
    fm = write_fashion_mnist(shared, work / "fashion_mnist.svm") if not (work / "fashion_mnist.svm").exists() else work / "fashion_mnist.svm"
    if fm:
        sources["fashion-mnist"] = fm
    ij = decompress(shared / "ijcnn1.svm.xz", work / "ijcnn1.svm")
    if ij:
        sources["ijcnn1"] = ij
    if args.big_gb > 0:
        big = work / "generated.svm"
        if not big.exists() or big.stat().st_size < args.big_gb * 1e9:
            write_generated(big, args.big_gb)
        sources[f"generated-{args.big_gb:g}GB"] = big

    # the same command on a tiny source: the RSS every run pays for Python, numba, h5py
    base_rss, _ = measure(ingest_cmd(tiny, work / "tiny.store", args.memory, index=True))
    cap = _parse(args.memory)
    rows = []
    for name, src in sources.items():
        mb = src.stat().st_size / 1e6
        row = {"source": name, "MB": round(mb, 1)}
        for index in (False, True):
            rss, dt = measure(ingest_cmd(src, work / f"{name}.store", args.memory, index))
            key = "ours_index" if index else "ours"
            row[f"{key}_MBps"] = round(mb / dt, 1)
            row[f"{key}_rss_MB"] = round(rss / 2**20, 1)
            row[f"{key}_over_base_MB"] = round((rss - base_rss) / 2**20, 1)
            row[f"{key}_within_cap"] = bool(rss - base_rss <= cap * 1.03)
        if name.startswith("generated") and args.skip_sklearn_big:
            row["sklearn_MBps"] = None
        else:
            rss, dt = measure(sklearn_cmd(src))
            row["sklearn_MBps"] = round(mb / dt, 1)
            row["sklearn_rss_MB"] = round(rss / 2**20, 1)
        if row.get("sklearn_MBps"):
            row["ratio_vs_sklearn"] = round(row["ours_MBps"] / row["sklearn_MBps"], 2)
            row["ratio_index_vs_sklearn"] = round(row["ours_index_MBps"] / row["sklearn_MBps"], 2)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

    print(f"\nmemory cap {args.memory}; baseline RSS of the same command on a tiny source: "
          f"{base_rss / 2**20:.1f} MB")
    hdr = (f"{'source':<22}{'MB':>8}{'ours MB/s':>11}{'+index':>9}{'sklearn MB/s':>14}"
           f"{'ratio':>7}{'ratio+idx':>10}{'RSS-base MB':>13}{'+idx':>7}{'sk RSS MB':>11}")
    print(hdr)
    for r in rows:
        print(f"{r['source']:<22}{r['MB']:>8.1f}{r['ours_MBps']:>11.1f}{r['ours_index_MBps']:>9.1f}"
              f"{(r.get('sklearn_MBps') or float('nan')):>14.1f}"
              f"{(r.get('ratio_vs_sklearn') or float('nan')):>7.2f}"
              f"{(r.get('ratio_index_vs_sklearn') or float('nan')):>10.2f}"
              f"{r['ours_over_base_MB']:>13.1f}{r['ours_index_over_base_MB']:>7.1f}"
              f"{(r.get('sklearn_rss_MB') or float('nan')):>11.1f}")
    if args.json:
        print(json.dumps({"base_rss_bytes": base_rss, "rows": rows}))
    return 0


def _parse(s: str) -> int:
    from ooc_learn.storage.budget import parse_size

    return parse_size(s)


if __name__ == "__main__":
    sys.exit(main())
