"""The argument bundles of the search kernels: tuples of arrays and scalars, named.

A kernel takes a few bundles instead of dozens of positional arguments. Each bundle crosses
into numba as a plain tuple in the field order of its class here, and the kernel views it by
name (``q = Query(*query)``; the view costs nothing in compiled code): numba's dispatcher
types a plain tuple from a cheap fingerprint, while a named tuple's spells out its class and
field names on every call (about 1 µs a bundle, which the Python side of the search pays for
every kernel call it makes). So the Python side builds ``tuple(Query(...))``. numba's typed
lists have no fingerprint at all: the row list (``_search_kernels.new_row_list``) travels
beside the bundles, never inside one.

Field dtypes are part of a kernel's signature (``ooc_learn._jit._signature`` spells
``bbf_run``'s out for the compile-ahead helper): build the bundles with the dtypes noted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Query", "Picks", "Values", "Children", "NodeArrays", "RowSlots", "Stops"]


class Query(NamedTuple):
    """The hyperplane a query searches near and eq. 10's thresholds (fixed for one query)."""

    w: np.ndarray       # float64 (d,): the current weights
    b: float            # their bias (0.0 without one)
    wt: np.ndarray      # float64 (d,): the outer iterate w_t of the truncated-loss relaxation
    bt: float
    same_outer: bool    # wt, bt are w, b: one margin a row
    low: float          # L⁻¹(1+s): y·w_tᵀx below it is an outlier (-inf: no truncation)
    shrink_hi: float    # 1 + T: y·wᵀx above it is shrunk (inf: not shrinking)
    wsq: float          # ‖w‖² (+ b² with the bias), the ranking's scale
    augment: bool       # the rows carry a constant feature 1 (the bias)
    mu: float           # SearchConfig.rank_mu: weight of an internal node's covering radius
    lam: float          # SearchConfig.rank_lam: weight of a leaf's covering radius


class Picks(NamedTuple):
    """The rows one query returns and the marks that keep it from returning a row twice.

    The arrays are updated in place; ``seen`` is replaced when the frontier grows it.
    """

    out: np.ndarray     # int64 (n,): store rows returned, in order found
    state: np.ndarray   # int64 (5,): rows returned, examined, newly shrunk, in seen, pivots
    #                     examined
    excl: np.ndarray    # uint8 (n_samples,) or (0,): rows never examined (the active set)
    shrunk: np.ndarray  # uint8 (n_samples,) or (0,): rows shrunk on the index (§4.3)
    fen: np.ndarray     # int32 (n_samples,) or (0,): Fenwick tree counting the shrunk rows
    shrink_on: bool     # fen and shrunk are in use
    seen: np.ndarray    # int64 hash set (−1 empty) of rows examined as pivots
    need: int           # stop once this many rows are returned
    max_examine: int    # or once this many were examined
    take_pivots: bool   # pivot rows are candidates (SearchConfig.pivot_candidates)
    take_now: bool      # a qualifying pivot row is returned as its parent is expanded
    #                     ("qualifying"); else when its partition is reached ("reached")


class Values(NamedTuple):
    """The values of the rows a query returns (``Forest.query(..., with_rows=True)``), each
    copied as the search verifies it, with its label and squared norm: row r's are X[r]
    (dense) or ind, dat[ptr[r]:ptr[r + 1]] (CSR); the buffers hold y.shape[0] rows. A search
    that copies nothing passes None instead (numba compiles it apart, without the copies).
    """

    X: np.ndarray       # float32 (rows, d) dense, else (0, 0)
    ptr: np.ndarray     # int64 (rows + 1,) CSR, else (1,)
    ind: np.ndarray     # int32 (stored values,) CSR
    dat: np.ndarray     # float32 (stored values,) CSR
    y: np.ndarray       # float32 (rows,): labels as the search reads them
    sqn: np.ndarray     # float64 (rows,): squared norms; −1 while not copied


class Children(NamedTuple):
    """A node's children (k of each), as decoded from its record: a slice of
    :class:`NodeArrays`, or the columns of a ``lmdb_io.Node`` (the same fields in the same
    order, ``Node[2:9]``, with ``radius_aug`` in place of ``radius`` for a query with a
    bias)."""

    child_id: np.ndarray      # int32: node ids in the tree
    child_start: np.ndarray   # int64: first store row
    child_stop: np.ndarray    # int64: one past the last
    child_leaf: np.ndarray    # bool
    pivot_row: np.ndarray     # int64: store row of the child's pivot
    pivot_sqnorm: np.ndarray  # float32: its squared norm
    radius: np.ndarray        # float32: covering radius (min cos²), in the query's space


class NodeArrays(NamedTuple):
    """The node records the resident cache holds decoded (:class:`~ooc_learn.index.resident.
    Resident`): per node slot its children's first position and count, per child position
    its columns. ``node_slot[base[t] + v]`` is the slot of node v of tree t, −1 when not
    decoded."""

    base: np.ndarray       # int64 (trees,): tree t's first entry in node_slot
    node_slot: np.ndarray  # int32 (nodes of the forest,)
    first: np.ndarray      # int64 (slots,): the slot's first child position
    k: np.ndarray          # int64 (slots,): its number of children
    start: np.ndarray      # int64 (slots,): its first store row
    stop: np.ndarray       # int64 (slots,)
    c_id: np.ndarray       # int32 (positions,): the columns of Children
    c_start: np.ndarray    # int64
    c_stop: np.ndarray     # int64
    c_leaf: np.ndarray     # bool
    c_piv: np.ndarray      # int64
    c_sq: np.ndarray       # float32
    c_rad: np.ndarray      # float32: covering radius in x-space
    c_rada: np.ndarray     # float32: the same in the bias-augmented space [x, 1]


class RowSlots(NamedTuple):
    """Where the search finds rows at hand: slots of the row list (−1: not at hand)."""

    blk_slot: np.ndarray   # int32 (trees,): tree t's whole store block
    boff: np.ndarray       # int64 (trees + 1,): the blocks' first store rows
    span_slot: np.ndarray  # int32 (n_samples,): a span's slice, by its first row
    slot_stop: np.ndarray  # int64 (slots,): the last row + 1 of the span in each slot
    pv_slot: np.ndarray    # int32 (nodes of the forest,): an upper node's pivot rows
    is_csr: bool           # the rows' layout
    span_rows: float       # a node of at most this many rows is read whole (a span)


class Stops(NamedTuple):
    """When the search loop hands back besides a miss (see ``bbf_run``)."""

    prec_from: int    # from this many rows examined, stop when the share returned is below
    min_prec: float   # this
    max_read: float   # stop once the query read this many rows (inf: never)
