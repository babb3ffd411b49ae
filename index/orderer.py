"""The ingest hook: build each block's tree as ingest writes it, and the forest beside it.

``ooc_learn.ingest`` passes :func:`forest_orderer` to the storage layer (which does not import
the index). For every block, pass 3 of the external shuffle calls ``order(b, row_offset, X,
sqnorm)``: the tree is built in memory, persisted in one LMDB transaction, and the
leaf-order permutation returned so the block's rows land on disk leaf by leaf.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from ooc_learn.storage.format import INDEX_DIR

from .lmdb_io import CloseOrAbort, ForestWriter
from .tree import (DEFAULT_LEAF_SIZE, DEFAULT_WIDTH, build_block_tree, check_params,
                   default_leaf_size)

__all__ = ["ForestOrderer", "forest_orderer", "block_seed"]


def block_seed(seed: int, block: int) -> int:
    """The tree seed of one block: independent streams per block from one run seed."""
    return int(np.random.SeedSequence([int(seed), int(block)]).generate_state(1)[0])


class ForestOrderer(CloseOrAbort):
    """Builds the forest of a store being written into ``directory`` (see module doc);
    ``leaf_size`` None: :func:`~.tree.default_leaf_size` of the first block's rows, for
    every block."""

    def __init__(self, directory, *, n_blocks: int, n_samples: int, n_features: int,
                 seed: int = 0, width: int = DEFAULT_WIDTH, leaf_size: int | None = None):
        self.width, self.leaf_size, self.seed = width, leaf_size, seed
        self._where = Path(directory) / INDEX_DIR
        self._shape = dict(n_blocks=n_blocks, n_samples=n_samples, n_features=n_features)
        self.writer = None  # opened with the leaf size: now, or at the first block
        if leaf_size is not None:
            self._open(leaf_size)
        self.build_seconds = 0.0
        self.write_seconds = 0.0

    def _open(self, leaf_size: int) -> None:
        self.leaf_size = leaf_size
        self.writer = ForestWriter(self._where, width=self.width, leaf_size=leaf_size,
                                   seed=self.seed, **self._shape)

    def order(self, b: int, row_offset: int, X, sqnorm) -> np.ndarray:
        """Build block b's tree, write it, and return the leaf-order permutation."""
        if self.writer is None:
            self._open(default_leaf_size(X, self.width))
        t0 = time.perf_counter()
        perm, tree = build_block_tree(X, sqnorm, width=self.width, leaf_size=self.leaf_size,
                                      seed=block_seed(self.seed, b))
        t1 = time.perf_counter()
        self.writer.add_tree(b, row_offset, tree)
        self.build_seconds += t1 - t0
        self.write_seconds += time.perf_counter() - t1
        return perm

    def close(self) -> None:
        if self.writer is None:  # no block came (a store of no rows)
            self._open(DEFAULT_LEAF_SIZE)
        self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


def forest_orderer(*, width: int | None = None, leaf_size: int | None = None):
    """A ``block_orderer`` for :func:`ooc_learn.storage.ingest.ingest` (parameters checked now;
    ``leaf_size`` None: by the rows, :func:`~.tree.default_leaf_size`).

    >>> orderer = forest_orderer(width=10, leaf_size=16)
    """
    width = DEFAULT_WIDTH if width is None else width
    check_params(width, DEFAULT_LEAF_SIZE if leaf_size is None else leaf_size, 0)
    return functools.partial(ForestOrderer, width=width, leaf_size=leaf_size)
