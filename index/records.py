"""The index's records in bytes: the LMDB keys, and the encoding of tree headers and node
records (the node layout is :mod:`~ooc_learn.index.node_record`'s; the table of records is in
:mod:`~ooc_learn.index.lmdb_io`'s docstring). Every value ends in a CRC-32 of the bytes before
it (:func:`seal`), so a damaged record is detected instead of decoded."""

from __future__ import annotations

import functools
import operator
import struct
import zlib
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .node_record import COLUMNS, FORMAT_VERSION, HEAD_STRUCT, MAGIC, columns_struct
from .tree import FlatTree

__all__ = ["INDEX_FORMAT", "INDEX_FORMAT_VERSION", "META_KEY", "Node", "TreeHeader",
           "decode_node", "decode_tree_header", "encode_node", "encode_nodes",
           "encode_tree_header", "node_key", "root_pivot_crc", "rows_crc", "seal", "tree_key",
           "tree_node_records", "unseal"]

INDEX_FORMAT = "ooc-learn-index"
INDEX_FORMAT_VERSION = FORMAT_VERSION  # the node record's (node_record.FORMAT_VERSION)
META_KEY = b"meta"
_TREE_HEAD = struct.Struct("<4sHHqqqqqiI")  # magic, version, flags, tree, offset, rows,
#                                             nodes, internal, depth, root pivot CRC
_CRC = struct.Struct("<I")
# a node record's columns (node_record.COLUMNS): name, numpy dtype, entries beyond k
_COLUMNS = tuple((name, np.dtype("<" + code), extra) for name, code, extra in COLUMNS)
_COLUMN_NAMES = tuple(name for name, _, _ in COLUMNS)
_BOUNDS_END = 2 + _COLUMN_NAMES.index("bounds")  # in a record's parts: after head and bounds
_I32 = struct.Struct("<i")
_TREE_MAGIC = b"OOCT"


class Node(NamedTuple):
    """One decoded node record. Row positions are store rows."""

    start: int
    stop: int
    child_id: np.ndarray      # int32 (k,)
    child_start: np.ndarray   # int64 (k,)
    child_stop: np.ndarray    # int64 (k,)
    child_leaf: np.ndarray    # bool (k,)
    pivot_row: np.ndarray     # int64 (k,)
    pivot_sqnorm: np.ndarray  # float32 (k,)
    radius: np.ndarray        # float32 (k,): min cos² pivot-row in the child
    radius_aug: np.ndarray    # float32 (k,): the same with the bias feature 1 appended

    @property
    def nbytes(self) -> int:
        """Memory held, with each array object's header (about 112 bytes) and the tuple."""
        return int(sum(a.nbytes + 112 for a in self[2:])) + 200


class TreeHeader(NamedTuple):
    tree: int
    row_offset: int
    n_rows: int
    n_nodes: int
    n_internal: int
    depth: int
    pivot_crc: int


def tree_key(tree: int) -> bytes:
    return b"T" + struct.pack(">I", tree)


def node_key(tree: int, node: int) -> bytes:
    return _node_prefix(tree) + struct.pack(">I", node)


def _node_prefix(tree: int) -> bytes:
    return b"N" + struct.pack(">I", tree)


def tree_node_records(txn, tree: int):
    """``(v, value)`` of every node record of ``tree``, in key order, by one cursor walk
    (v is −1 for a key of the wrong length: the decoder then names the record)."""
    prefix = _node_prefix(tree)
    cur = txn.cursor()
    if not cur.set_range(prefix):
        return
    for key, value in cur:
        if key[:len(prefix)] != prefix:
            break
        yield (struct.unpack(">I", key[len(prefix):])[0] if len(key) == len(prefix) + 4
               else -1), value


def seal(payload: bytes) -> bytes:
    return payload + _CRC.pack(zlib.crc32(payload) & 0xFFFFFFFF)


def unseal(value: bytes, what: str) -> memoryview:
    if value is None or len(value) < _CRC.size:
        raise ValueError(f"{what} is missing or truncated")
    body = memoryview(value)[:-_CRC.size]
    (crc,) = _CRC.unpack(value[-_CRC.size:])
    if zlib.crc32(body) & 0xFFFFFFFF != crc:
        raise ValueError(f"{what} fails its checksum")
    return body


def rows_crc(X) -> int:
    """CRC-32 of rows in a layout-free form (per row: non-zero columns, then values)."""
    M = sp.csr_matrix(X, dtype=np.float32, copy=True)
    M.sum_duplicates()
    M.eliminate_zeros()
    return zlib.crc32(np.diff(M.indptr).astype("<i4").tobytes() + M.indices.astype(
        "<i4").tobytes() + M.data.astype("<f4").tobytes()) & 0xFFFFFFFF


def root_pivot_crc(tree: FlatTree, n_features: int) -> int:
    """:func:`rows_crc` of the root's pivot rows (0 when the root is a leaf)."""
    if tree.n_nodes == 0 or tree.n_children[0] == 0:
        return 0
    c0, k = int(tree.first_child[0]), int(tree.n_children[0])
    lo, hi = int(tree.pv_indptr[c0]), int(tree.pv_indptr[c0 + k])
    P = sp.csr_matrix((tree.pv_data[lo:hi], tree.pv_indices[lo:hi],
                       tree.pv_indptr[c0:c0 + k + 1] - lo), shape=(k, n_features))
    return rows_crc(P)


def encode_tree_header(tree_id: int, row_offset: int, tree: FlatTree,
                       n_features: int) -> bytes:
    n_internal = int(np.count_nonzero(tree.n_children > 0))
    return seal(_TREE_HEAD.pack(_TREE_MAGIC, INDEX_FORMAT_VERSION, 0, tree_id, row_offset,
                                 tree.n_rows, tree.n_nodes, n_internal, tree.max_depth,
                                 root_pivot_crc(tree, n_features)))


def decode_tree_header(value: bytes, tree_id: int) -> TreeHeader:
    body = unseal(value, f"the header of tree {tree_id}")
    if len(body) != _TREE_HEAD.size:
        raise ValueError(f"the header of tree {tree_id} has the wrong size")
    magic, version, _, t, off, rows, nodes, internal, depth, crc = _TREE_HEAD.unpack(body)
    if magic != _TREE_MAGIC or version != INDEX_FORMAT_VERSION or t != tree_id:
        raise ValueError(f"the header of tree {tree_id} is not a version-"
                         f"{INDEX_FORMAT_VERSION} tree header")
    return TreeHeader(t, off, rows, nodes, internal, depth, crc)


def _down16(r) -> np.ndarray:
    """float16, rounded down: a smaller min cos² is a wider radius, so still a valid bound."""
    r = np.asarray(r, np.float32)
    h = r.astype("<f2")
    up = h.astype(np.float32) > r
    h[up] = np.nextafter(h[up], np.float16(-1))
    return np.maximum(h, np.float16(0)).astype("<f2")


def encode_node(tree_id: int, tree: FlatTree, v: int, row_offset: int) -> bytes:
    """Serialise node v (store rows = block rows + ``row_offset``).

    Child ranges and pivot rows are int32 offsets from the node's first row. No pivot
    vectors: the pivots are rows of the node, read from the store when the node is expanded.
    """
    k = int(tree.n_children[v])
    c0 = int(tree.first_child[v])
    c = np.arange(c0, c0 + k)
    start = int(tree.start[v])
    bounds = np.append(tree.start[c], tree.stop[v]) - start if k else np.zeros(1, np.int64)
    cols = dict(bounds=bounds, leaf=tree.n_children[c] == 0, pivot=tree.pivot_row[c] - start,
                sqnorm=tree.pivot_sqnorm[c], radius=_down16(tree.radius[c]),
                radius_aug=_down16(tree.radius_aug[c]))
    return seal(HEAD_STRUCT.pack(MAGIC, FORMAT_VERSION, 0, tree_id, start + row_offset,
                                  int(tree.stop[v]) + row_offset, c0, k)
                 + b"".join(cols[name].astype(dt).tobytes() for name, dt, _ in _COLUMNS))


def encode_nodes(tree_id: int, tree: FlatTree, row_offset: int):
    """``(v, encode_node(tree_id, tree, v, row_offset))`` for the root and every internal
    node, with the per-child columns converted once for the whole tree (the build's hot
    path: per node only slices are joined)."""
    n = tree.n_nodes
    kids = tree.n_children.astype(np.int64)
    internal = np.flatnonzero(kids > 0)
    parent = np.zeros(n, np.int64)
    if internal.size:
        first = tree.first_child[internal].astype(np.int64)
        ids = np.concatenate([np.arange(f, f + k) for f, k in zip(first, kids[internal])])
        parent[ids] = np.repeat(internal, kids[internal])
    base = tree.start[parent]
    # every node's column entry as a child of its parent, as bytes: a record joins slices;
    # "bounds" holds the child's first row (the record appends its parent's span)
    cols = dict(bounds=tree.start - base, leaf=kids == 0,
                pivot=np.where(tree.pivot_row >= 0, tree.pivot_row - base, 0),
                sqnorm=tree.pivot_sqnorm, radius=_down16(tree.radius),
                radius_aug=_down16(tree.radius_aug))
    cols = [(cols[name].astype(dt).tobytes(), dt.itemsize) for name, dt, _ in _COLUMNS]
    todo = internal if (n == 0 or kids[0] > 0) else np.append(0, internal)
    for v in todo.tolist():
        k = int(kids[v])
        c0 = int(tree.first_child[v])
        a, z = c0, c0 + k
        start = int(tree.start[v])
        parts = [HEAD_STRUCT.pack(MAGIC, FORMAT_VERSION, 0, tree_id, start + row_offset,
                                  int(tree.stop[v]) + row_offset, c0, k)]
        parts += [col[size * a:size * z] for col, size in cols]
        parts.insert(_BOUNDS_END, _I32.pack(int(tree.stop[v]) - start if k else 0))
        yield v, seal(b"".join(parts))


@functools.lru_cache(maxsize=None)
def _columns_of(k: int) -> tuple:
    """The columns of a record with ``k`` children: their ``struct``, and a getter of
    bounds, leaf, pivot, sqnorm, radius, radius_aug (in this order) from its values."""
    at, where = 0, {}
    for name, _, extra in _COLUMNS:
        where[name] = slice(at, at + k + extra)
        at += k + extra
    return columns_struct(k), operator.itemgetter(*(where[name] for name in (
        "bounds", "leaf", "pivot", "sqnorm", "radius", "radius_aug")))


def decode_node(value: bytes, tree_id: int, node: int) -> Node:
    """Inverse of :func:`encode_node`; raises ValueError on any inconsistency.

    A query decodes each node it expands once (9,300 of them in an IBCD run on the
    benchmark's generated store): the columns are unpacked by one ``struct`` call and checked
    as Python numbers, since k (the forest's width) is small."""
    what = f"node {node} of tree {tree_id}"
    body = unseal(value, what)
    if len(body) < HEAD_STRUCT.size:
        raise ValueError(f"{what} is truncated")
    magic, version, _, t, start, stop, c0, k = HEAD_STRUCT.unpack_from(body, 0)
    if magic != MAGIC or version != FORMAT_VERSION or t != tree_id or k < 0:
        raise ValueError(f"{what} is not a version-{FORMAT_VERSION} node record")
    cols, columns = _columns_of(k)
    size = HEAD_STRUCT.size + cols.size
    if len(body) != size:
        raise ValueError(f"{what} is truncated" if len(body) < size
                         else f"{what} has trailing bytes")
    v = cols.unpack_from(body, HEAD_STRUCT.size)
    bounds, leaf, piv, sq, rad, rad_aug = columns(v)
    span = stop - start
    if k and (bounds[0] != 0 or bounds[-1] != span
              or any(b < a for a, b in zip(bounds, bounds[1:]))
              or min(piv) < 0 or max(piv) >= span):
        raise ValueError(f"{what} has inconsistent row ranges")
    first = np.array(bounds, np.int64) + start
    return Node(start, stop, np.arange(c0, c0 + k, dtype=np.int32), first[:-1], first[1:],
                np.array(leaf, bool), np.array(piv, np.int64) + start,
                np.array(sq, np.float32), np.array(rad, np.float32),
                np.array(rad_aug, np.float32))
