"""Data loaders shared by scripts/bench_svm_cv.py and scripts/bench_loo.py (reads ../shared/data)."""

from __future__ import annotations

import io
import lzma
import tarfile

import numpy as np
from sklearn.datasets import load_svmlight_file

from _bench_data import DATA, fashion_mnist


def libsvm(name, n_features=None, subset=None, seed=0, scale=False):
    X, y = load_svmlight_file(lzma.open(DATA / name), n_features=n_features)
    X = X.toarray().astype(np.float32)
    if subset and subset < X.shape[0]:
        idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], subset, replace=False))
        X, y = X[idx], y[idx]
    if scale:   # to [-1, 1] per feature, as LIBSVM's svm-scale
        lo, hi = X.min(0), X.max(0)
        span = np.where(hi > lo, hi - lo, 1.0)
        X = (2 * (X - lo) / span - 1).astype(np.float32)
    return X, y


def fashion(cls=0, subset=2000, seed=0):
    imgs, labels = fashion_mnist("train")
    idx = np.sort(np.random.default_rng(seed).choice(len(labels), subset, replace=False))
    return (imgs[idx] / 255.0).astype(np.float32), np.where(labels[idx] == cls, 1.0, -1.0)


def ida(name, split=1):
    """Training part of IDA split ``split`` (Raetsch's benchmark files)."""
    with tarfile.open(DATA / "ida" / f"{name}.tar.xz") as tf:
        def read(kind):
            member = tf.extractfile(f"{name}/{name}_train_{kind}_{split}.asc")
            return np.loadtxt(io.TextIOWrapper(member))
        X, y = read("data"), read("labels")
    return np.atleast_2d(X).reshape(len(y), -1).astype(np.float32), y
