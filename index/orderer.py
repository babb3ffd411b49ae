"""The metric-forest builder that ingest calls for each block (pass 3 of the shuffle).

``storage`` does not import ``index``; ``ooc_learn.ingest`` hands :func:`forest_orderer` to
``storage.ingest.ingest`` as its ``block_orderer``. For each block it builds the tree, writes it
to ``STORE/index.lmdb`` and returns the leaf-order permutation the block is written in.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.format import INDEX_DIR

from .lmdb_io import ForestWriter
from .tree import DEFAULT_LEAF_SIZE, DEFAULT_WIDTH, build_block_tree

__all__ = ["ForestOrderer", "forest_orderer"]


class ForestOrderer:
    """Builds one tree per block and persists it; ``order`` returns the leaf order."""

    def __init__(self, directory, *, n_blocks: int, n_samples: int, n_features: int,
                 seed: int, width: int = DEFAULT_WIDTH, leaf_size: int = DEFAULT_LEAF_SIZE):
        self.width, self.leaf_size, self.seed = width, leaf_size, seed
        self.writer = ForestWriter(Path(directory) / INDEX_DIR, n_blocks=n_blocks,
                                   n_samples=n_samples, n_features=n_features, width=width,
                                   leaf_size=leaf_size, seed=seed)

    def order(self, b: int, row_offset: int, X, sqnorm):
        perm, tree = build_block_tree(X, sqnorm, width=self.width, leaf_size=self.leaf_size,
                                      seed=self.seed + b)
        self.writer.add_tree(b, row_offset, tree)
        return perm

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


def forest_orderer(*, width: int | None = None, leaf_size: int | None = None):
    """A ``block_orderer`` for :func:`ooc_learn.storage.ingest.ingest` (checks parameters now)."""
    width = DEFAULT_WIDTH if width is None else width
    leaf_size = DEFAULT_LEAF_SIZE if leaf_size is None else leaf_size
    for name, v, lo in (("width", width, 2), ("leaf_size", leaf_size, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ParameterError(f"The '{name}' parameter of ingest must be an integer >= {lo}. "
                                 f"Got {v!r} instead.",
                                 "The paper uses width 10 and leaves of a few hundred rows.")
    return partial(ForestOrderer, width=width, leaf_size=leaf_size)
