"""One metric tree per block, built in memory: K-way nearest-pivot partitions (IBCD §4.1).

:func:`build_block_tree` is what ingest calls on each block (pass 2 of the external shuffle):
it returns the permutation that puts the block's rows in leaf order, so every node of the tree
(not only every leaf) is one contiguous row range on disk, and the tree as a
:class:`FlatTree`, a tuple of flat arrays in the spirit of pynndescent's trees.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.arrays import kernel_args, matrix_nbytes, row_sqnorms
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.jit import await_kernel

from ._build_kernels import build_tree_kernel
from .search_config import SearchConfig

__all__ = ["FlatTree", "build_block_tree", "default_leaf_size", "DEFAULT_WIDTH",
           "DEFAULT_LEAF_SIZE", "WIDE_LEAF_SIZE"]

# The build's defaults (the measurements behind them are in the benchmark log):
DEFAULT_WIDTH = 10      # K, pivots (children) per node
DEFAULT_LEAF_SIZE = 16  # rows: a node of at most this many is a leaf
WIDE_LEAF_SIZE = 32     # ... where rows are wide (default_leaf_size)

_SCATTER_MAX = 1 << 23  # elements (d·K) of the CSR scatter workspace, float32: 32 MiB
# the arrays of the layout a block does not use (a CSR block's dense X, a dense block's CSR
# parts): the kernels take both layouts' arrays
EMPTY_X = np.zeros((0, 0), np.float32)
EMPTY_PTR = np.zeros(1, np.int64)
EMPTY_IDX = np.zeros(0, np.int32)
EMPTY_VAL = np.zeros(0, np.float32)


class FlatTree(NamedTuple):
    """A metric tree over one block, as flat arrays. Rows are block positions in leaf order.

    Node 0 is the root. Node v covers block rows ``start[v]:stop[v]`` (after the leaf-order
    permutation); its children are ``first_child[v] .. first_child[v] + n_children[v] - 1``
    (none for a leaf). Child c is the Voronoi cell of pivot row ``pivot_row[c]`` (a block
    position in leaf order) whose vector is CSR row c of ``pv_indptr/pv_indices/pv_data``
    with squared norm ``pivot_sqnorm[c]``; ``radius[c]`` is the smallest cos² between that
    pivot and a row of child c (the covering radius in d), ``radius_aug[c]`` the same with
    a constant feature 1 appended to every row (the query's bias space). Only the pivot
    rows and radii are persisted; the vectors are rows of the store.
    """

    start: np.ndarray         # int64 (n_nodes,)
    stop: np.ndarray          # int64 (n_nodes,)
    first_child: np.ndarray   # int32 (n_nodes,), -1 for a leaf
    n_children: np.ndarray    # int32 (n_nodes,)
    depth: np.ndarray         # int32 (n_nodes,)
    pivot_row: np.ndarray     # int64 (n_nodes,), -1 for the root
    pivot_sqnorm: np.ndarray  # float32 (n_nodes,)
    pv_indptr: np.ndarray     # int64 (n_nodes + 1,)
    pv_indices: np.ndarray    # int32 (nnz,)
    pv_data: np.ndarray       # float32 (nnz,)
    radius: np.ndarray        # float32 (n_nodes,), 1 for the root
    radius_aug: np.ndarray    # float32 (n_nodes,)

    @property
    def n_nodes(self) -> int:
        return int(self.start.shape[0])

    @property
    def n_rows(self) -> int:
        return int(self.stop[0]) if self.n_nodes else 0

    @property
    def n_leaves(self) -> int:
        return int(np.count_nonzero(self.n_children == 0))

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.n_nodes else 0

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self))


def default_leaf_size(X, width: int = DEFAULT_WIDTH) -> int:
    """The rows per leaf of a build given none, from a block's rows ``X``: DEFAULT_LEAF_SIZE,
    or WIDE_LEAF_SIZE where a node of ``width`` such leaves outgrows what a search reads as
    one span (``SearchConfig.span_bytes``).

    A capped search reads a node's rows in one slice while they fit a span; above that it
    reads the node's pivot rows one by one. A node splits into ``width`` children once it
    holds more than a leaf, so leaves hold a few rows each (3.5 on average at 16 and width
    10), and on wide rows most nodes sit above the span: each row examined then cost ~2
    pivot reads. With wider leaves there are half as many nodes.
    """
    n = X.shape[0]
    if not n:
        return DEFAULT_LEAF_SIZE
    node_bytes = DEFAULT_LEAF_SIZE * int(width) * matrix_nbytes(X) / n
    return WIDE_LEAF_SIZE if node_bytes > SearchConfig.span_bytes else DEFAULT_LEAF_SIZE


def check_params(width, leaf_size, seed):
    """Refuse a tree width, leaf size or seed that no tree can be built with."""
    if not isinstance(width, (int, np.integer)) or isinstance(width, bool) or width < 2:
        raise ParameterError(
            f"The 'width' parameter of build_block_tree must be an int >= 2. Got {width!r} "
            f"instead.", "Use --width 10 (the paper's value) unless you have measured better.")
    if (not isinstance(leaf_size, (int, np.integer)) or isinstance(leaf_size, bool)
            or leaf_size < 1):
        raise ParameterError(
            f"The 'leaf_size' parameter of build_block_tree must be an int >= 1. Got "
            f"{leaf_size!r} instead.", "Leave it out for the default (--leaf-size 16, or 32 "
            "for rows over ~800 bytes), or pass a positive number of rows.")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ParameterError(
            f"The 'seed' parameter of build_block_tree must be an int >= 0. Got {seed!r} "
            f"instead.", "Pass a non-negative integer such as 0.")


def build_block_tree(X, sqnorm=None, *, width: int = DEFAULT_WIDTH,
                     leaf_size: int = DEFAULT_LEAF_SIZE, seed: int = 0):
    """Build the metric tree of one block and the leaf-order permutation of its rows.

    Parameters
    ----------
    X : float32 ndarray (rows, d) or scipy CSR matrix
        The block's rows.
    sqnorm : float32 ndarray (rows,), optional
        Squared row norms (the store's; computed from ``X`` when omitted).
    width : int
        K, the number of pivots per node (IBCD §4.1 uses 10).
    leaf_size : int
        Nodes with at most this many rows become leaves.
    seed : int
        Pivot draws come only from this seed: same seed, same tree.

    Returns
    -------
    perm : int64 ndarray (rows,)
        ``X[perm]`` is the block in leaf order.
    tree : FlatTree
        Row ranges relative to the block, in the permuted order.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).random((1000, 5), dtype=np.float32)
    >>> perm, tree = build_block_tree(X, width=4, leaf_size=50, seed=1)
    >>> sorted(perm) == list(range(1000)), int(tree.stop[0])
    (True, 1000)
    """
    check_params(width, leaf_size, seed)
    if not sp.issparse(X):
        X = np.asarray(X)
        if X.ndim != 2:
            raise ParameterError(
                f"The 'X' parameter of build_block_tree must be 2-D. Got shape {X.shape} "
                f"instead.", "Pass one block as a (rows, features) array or CSR matrix.")
    n = X.shape[0]
    if sqnorm is None:
        sqnorm = row_sqnorms(X)
    sqnorm = np.ascontiguousarray(sqnorm, dtype=np.float32)
    if sqnorm.shape != (n,):
        raise ParameterError(
            f"The 'sqnorm' parameter of build_block_tree must have one entry per row "
            f"({n}). Got shape {sqnorm.shape} instead.", "Pass the block's squared norms.")
    Xd, indptr, indices, data, is_csr = kernel_args(X)
    d = X.shape[1]
    # CSR rows scatter the pivots into a (d, K) workspace unless it would exceed 32 MiB
    work = (np.zeros((d, width), np.float32) if is_csr and d * width <= _SCATTER_MAX
            else np.zeros((0, 0), np.float32))
    await_kernel("build_tree_kernel")  # a first run's helper may be compiling it
    (order, start, stop, first_child, n_children, pivot_orig, depth, radius,
     radius_aug) = build_tree_kernel(
        Xd, indptr, indices, data, is_csr, sqnorm, int(width), int(leaf_size), int(seed), work)
    inv = np.empty(n, np.int64)
    inv[order] = np.arange(n)
    has_pivot = pivot_orig >= 0
    pivot_row = np.where(has_pivot, inv[np.maximum(pivot_orig, 0)], -1) if n else pivot_orig
    pv = _pivot_matrix(X, pivot_orig, has_pivot)
    pivot_sqnorm = np.where(has_pivot, sqnorm[np.maximum(pivot_orig, 0)], 0).astype(np.float32) \
        if n else np.zeros(pivot_orig.shape[0], np.float32)
    tree = FlatTree(start, stop, first_child, n_children, depth, pivot_row, pivot_sqnorm,
                    pv.indptr.astype(np.int64), pv.indices.astype(np.int32),
                    pv.data.astype(np.float32), radius, radius_aug)
    return order, tree


def _pivot_matrix(X, pivot_orig, has_pivot) -> sp.csr_matrix:
    """CSR matrix with row c = pivot vector of node c (an empty row for the root)."""
    n_nodes = pivot_orig.shape[0]
    d = X.shape[1]
    rows = pivot_orig[has_pivot]
    if sp.issparse(X):
        sub = sp.csr_matrix(X.tocsr()[rows], dtype=np.float32)
        sub.sort_indices()
        sub.eliminate_zeros()
    else:
        # one kernel pass (scipy's dense -> COO -> CSR route was 16 % of ingest's pass 3 on
        # 1.02M x 784 rows at --memory 224M, 611 blocks)
        from ooc_learn.storage._parse_kernels import dense_to_csr

        sub_ip = np.empty(rows.shape[0] + 1, np.int64)
        ind, val = dense_to_csr(np.ascontiguousarray(np.asarray(X)[rows], dtype=np.float32),
                                sub_ip)
        sub = sp.csr_matrix((val, ind.astype(np.int32), sub_ip), shape=(rows.shape[0], d))
    # scatter the pivot rows into node positions (root and any node without a pivot: empty)
    counts = np.zeros(n_nodes, np.int64)
    counts[has_pivot] = np.diff(sub.indptr)
    indptr = np.zeros(n_nodes + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return sp.csr_matrix((sub.data, sub.indices, indptr), shape=(n_nodes, d))

