"""Metric-forest index over a store: one tree per block, persisted in LMDB.

Knows vectors and trees, not losses. Installed as ``ooc_learn.index``.

- :func:`~ooc_learn.index.tree.build_block_tree` builds one block's tree in memory and the
  leaf-order permutation of its rows (ingest writes the rows in that order);
- :class:`~ooc_learn.index.lmdb_io.ForestWriter` persists the trees to ``STORE/index.lmdb``;
- :func:`~ooc_learn.index.forest.open_forest` opens a store's index as a
  :class:`~ooc_learn.index.forest.Forest` whose ``query`` serves the IBCD step (eq. 10).
"""

from .forest import Forest, open_forest, outlier_margin
from .lmdb_io import INDEX_FORMAT_VERSION, ForestWriter
from .tree import DEFAULT_LEAF_SIZE, DEFAULT_WIDTH, FlatTree, build_block_tree

__all__ = ["Forest", "open_forest", "outlier_margin", "ForestWriter", "INDEX_FORMAT_VERSION",
           "FlatTree", "build_block_tree", "DEFAULT_WIDTH", "DEFAULT_LEAF_SIZE"]
