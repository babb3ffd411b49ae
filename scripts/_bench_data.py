"""What the benchmarks share: where they find ``../shared/data``, the Fashion-MNIST idx
reader, the best of N timed runs and the CLI entry points through this interpreter.

Used by the ``scripts/bench_*.py`` only (never by the package or the tests). ``OOC_DATA``
overrides the location.
"""

from __future__ import annotations

import gzip
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path(os.environ.get("OOC_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def read_idx(path: Path) -> np.ndarray:
    """A gzip'd idx file (the MNIST format: magic, dimension sizes, uint8 data)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist(split: str = "train", root: Path = DATA) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``split`` ("train" or "t10k"): uint8 images (n, 784) and labels (n,)."""
    d = Path(root) / "fashion-mnist"
    X = read_idx(d / f"{split}-images-idx3-ubyte.gz").reshape(-1, 784)
    return X, read_idx(d / f"{split}-labels-idx1-ubyte.gz")


def best_of(fn, repeat: int, min_seconds: float = 1.0, max_repeat: int = 20,
            clock=time.perf_counter):
    """``(seconds, result)``: the best time (``clock``: wall by default) of ``repeat`` calls
    of ``fn`` (short runs swing 3-5x on this machine), more calls (up to ``max_repeat``)
    while they have taken less than ``min_seconds`` in all, so that a run of a few
    milliseconds is the best of many; and the last call's result."""
    best, out, spent, runs = float("inf"), None, 0.0, 0
    while runs < max(1, int(repeat)) or (spent < min_seconds and runs < max_repeat):
        t0 = clock()
        out = fn()
        took = clock() - t0
        best, spent, runs = min(best, took), spent + took, runs + 1
    return best, out


def ooc_cli(main: str) -> list[str]:
    """A command line that runs ``ooc_learn.cli.<main>`` (e.g. ``train_main``) with this
    interpreter, whatever console scripts are on the PATH."""
    return [sys.executable, "-c", f"import sys; from ooc_learn.cli import {main}; "
                                  f"sys.exit({main}())"]
