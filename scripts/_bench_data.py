"""Where the benchmarks find ``../shared/data`` and the Fashion-MNIST idx reader they share.

Used by the ``scripts/bench_*.py`` only (never by the package or the tests). ``OOC_DATA``
overrides the location.
"""

from __future__ import annotations

import gzip
import os
import struct
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
