"""Array-backed stand-in for a store: blocks in leaf order, an index in tmp_path."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ooc_learn.index._row_kernels import brute_force_margins
from ooc_learn.index.forest import Forest
from ooc_learn.index.lmdb_io import ForestWriter
from ooc_learn.index.tree import build_block_tree
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.losses import outlier_margin


class ArrayStore:
    """The slice of the Store API the index uses, over in-memory arrays."""

    def __init__(self, X, y, block_offsets, path, budget="64M", row_ids=None):
        self.X, self.y = X, np.asarray(y, np.float32)
        self.block_offsets = np.asarray(block_offsets, np.int64)
        self.n_samples, self.n_features = X.shape
        self.n_blocks = len(block_offsets) - 1
        self.path = path
        self.budget = budget
        self.reads = 0
        self.row_ids = np.arange(self.n_samples) if row_ids is None else row_ids

    def read_range(self, start, stop):
        self.reads += 1
        return self.X[start:stop], self.y[start:stop], np.arange(start, stop)

    def forest(self, **kw):
        return Forest(self.path / "index.lmdb", read_range=self.read_range,
                      n_samples=self.n_samples, n_features=self.n_features,
                      block_offsets=self.block_offsets, budget=self.budget,
                      name=str(self.path), **kw)


def make_indexed(X, y, path, *, n_blocks=3, width=4, leaf_size=16, seed=0, budget="64M"):
    """Split rows into blocks, build one tree each, permute to leaf order, write the index."""
    n = X.shape[0]
    offsets = np.linspace(0, n, n_blocks + 1).astype(np.int64)
    parts_X, parts_y, parts_id, trees = [], [], [], []
    for b in range(n_blocks):
        lo, hi = offsets[b], offsets[b + 1]
        Xb = X[lo:hi]
        perm, tree = build_block_tree(Xb, width=width, leaf_size=leaf_size, seed=seed + b)
        parts_X.append(Xb[perm])
        parts_y.append(np.asarray(y[lo:hi])[perm])
        parts_id.append(lo + perm)
        trees.append(tree)
    Xp = sp.vstack(parts_X, format="csr") if sp.issparse(X) else np.vstack(parts_X)
    yp = np.concatenate(parts_y)
    path.mkdir(parents=True, exist_ok=True)
    with ForestWriter(path / "index.lmdb", n_blocks=n_blocks, n_samples=n,
                      n_features=X.shape[1], width=width, leaf_size=leaf_size,
                      seed=seed) as writer:
        for b, tree in enumerate(trees):
            writer.add_tree(b, int(offsets[b]), tree)
    store = ArrayStore(Xp, yp, offsets, path, budget=budget, row_ids=np.concatenate(parts_id))
    return store, trees


def brute_force(store, w, w_outer=None, s=1.0, loss="hinge", exclude=None):
    """Every row satisfying eq. 10, by a full scan (the slow, obviously correct reference)."""
    w = np.asarray(w, np.float64)
    d = store.n_features
    def margins(v):
        wv, b = (v[:d], float(v[d])) if len(v) == d + 1 else (v, 0.0)
        return brute_force_margins(*kernel_args(store.X)[:4], sp.issparse(store.X), store.y,
                                   np.ascontiguousarray(wv), b)
    m = margins(w)
    mt = m if w_outer is None else margins(np.asarray(w_outer, np.float64))
    ok = (m < 1.0) & (mt >= outlier_margin(loss, s))
    if exclude is not None:
        ok[exclude] = False
    return np.flatnonzero(ok)


def blobs(rng, n=600, d=8, csr=False, density=0.5):
    """Two overlapping classes, with degenerate rows: zeros and duplicates."""
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0).astype(np.float32)
    X = rng.normal(size=(n, d)).astype(np.float32) + 0.8 * y[:, None]
    X[rng.random((n, d)) > density] = 0.0
    X[:5] = 0.0
    X[5:15] = X[15]
    return (sp.csr_matrix(X) if csr else X), y
