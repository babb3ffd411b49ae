"""Metric-forest index over a store: one tree per block, persisted in LMDB.

Knows vectors and trees, not losses. Installed as ``ooc_learn.index``.

- :func:`~ooc_learn.index.tree.build_block_tree` builds one block's tree in memory and the
  leaf-order permutation of its rows (ingest writes the rows in that order);
- :class:`~ooc_learn.index.lmdb_io.ForestWriter` persists the trees to ``STORE/index.lmdb``;
- :func:`~ooc_learn.index.forest.open_forest` opens a store's index as a
  :class:`~ooc_learn.index.forest.Forest` whose ``query`` serves the IBCD step (eq. 10).

The modules, from the bytes up: ``node_record`` (the node record's layout, defined once),
``lmdb_io`` (the LMDB file: records encoded, decoded, written), ``tree`` (one block's tree),
``view`` (the opened index: checks, records and rows through the caches), ``resident``
(records decoded a tree at a time, and rows at hand, for the numba loop), ``frontier`` (the
budgeted best-first heap), ``found`` (the rows a query returns, copied with their values),
``forest`` (the query: best-bin-first search and shrinking).
Their numba kernels: ``_row_kernels`` (dot products, margins), ``_build_kernels`` (tree
build), ``_record_kernels`` (records decoded in bulk), ``_frontier_kernels`` (heap, rows
seen, Fenwick tree of shrunk rows), ``_search_kernels`` (expand, scan, the search loop),
with their argument bundles in ``kernel_args``.
"""

from .forest import Forest, open_forest
from .lmdb_io import ForestWriter, index_summary
from .records import INDEX_FORMAT_VERSION
from .search_config import SearchConfig
from .tree import DEFAULT_LEAF_SIZE, DEFAULT_WIDTH, FlatTree, build_block_tree

__all__ = ["Forest", "SearchConfig", "open_forest", "ForestWriter", "index_summary",
           "INDEX_FORMAT_VERSION",
           "FlatTree", "build_block_tree", "DEFAULT_WIDTH", "DEFAULT_LEAF_SIZE"]
