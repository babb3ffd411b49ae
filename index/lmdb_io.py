"""The metric forest on disk: ``STORE/index.lmdb`` (format version 2).

Records (one LMDB database, little-endian payloads, each ending in a CRC-32 of the bytes
before it so a damaged record is detected instead of decoded):

==========================  ==========================================================
key                         value
==========================  ==========================================================
``b"meta"``                 JSON: format name and version, n_blocks, n_samples,
                            n_features, block_offsets, width, leaf_size, seed, counts;
                            written last, by :meth:`ForestWriter.close`
``b"T" + >u4 tree``         tree header: block row offset, rows, nodes, depth, CRC-32 of
                            the root's pivot rows (detects rows rewritten after the build)
``b"N" + >u4 tree >u4 v``   node v of that tree (the root and every internal node):
                            its row range, first child id and, per child: row range,
                            whether it is a leaf, pivot row, pivot squared norm and the
                            covering radius of the child (smallest cos² between its
                            pivot and its rows, plain and with the bias feature 1;
                            float16 rounded down, so still a bound); the byte layout is
                            :mod:`~ooc_learn.index.node_record`'s
==========================  ==========================================================

Pivot vectors are not stored: a pivot is a row of its node, and rows live in ``data.h5``
(format 1 stored them and cost 0.4-1x the data file at leaves small enough for the
precision target; see ``scripts/bench_index.py``). The query reads them from the store.

Beside ``data.mdb`` the writer leaves ``manifest.json`` with the file's size and CRC-32,
checked before LMDB maps the file: LMDB trusts its page pointers, so a truncated or
overwritten file could otherwise fault the reader (SIGBUS) instead of raising an error.

Leaves need no record: their row range sits in the parent's record, and their rows are one
contiguous slice of ``data.h5`` (rows live there, not here). Row positions in the index are
store rows (the block's offset added). The writer builds into a temporary sibling directory
and renames it into place when every tree is written, so an interrupted build leaves no
index rather than a partial one. Readers open the environment read-only; several processes
can query one index at once.
"""

from __future__ import annotations

import functools
import json
import operator
import os
import shutil
import struct
import threading
import weakref
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import lmdb
import numpy as np
import scipy.sparse as sp

from ooc_learn.storage.errors import IndexStateError, ParameterError
from ooc_learn.storage.replace import recover, remove_stale, replace_dir, temp_sibling
from ooc_learn.storage.stop import check_stop

from .node_record import (COLUMNS, FORMAT_VERSION, HEAD_STRUCT, MAGIC, columns_struct)
from .tree import FlatTree

__all__ = ["ForestWriter", "Node", "TreeHeader", "INDEX_FORMAT", "INDEX_FORMAT_VERSION",
           "encode_node", "encode_nodes", "decode_node", "encode_tree_header",
           "decode_tree_header",
           "tree_key", "node_key", "tree_node_records", "META_KEY", "open_reader", "SharedReader",
           "index_nbytes",
           "verify_files", "CorruptIndex", "IndexVersionMismatch", "MANIFEST", "rows_crc"]

INDEX_FORMAT = "ooc-learn-index"
INDEX_FORMAT_VERSION = FORMAT_VERSION  # the node record's (node_record.FORMAT_VERSION)
META_KEY = b"meta"
MANIFEST = "manifest.json"
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


def _seal(payload: bytes) -> bytes:
    return payload + _CRC.pack(zlib.crc32(payload) & 0xFFFFFFFF)


def _unseal(value: bytes, what: str) -> memoryview:
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
    return _seal(_TREE_HEAD.pack(_TREE_MAGIC, INDEX_FORMAT_VERSION, 0, tree_id, row_offset,
                                 tree.n_rows, tree.n_nodes, n_internal, tree.max_depth,
                                 root_pivot_crc(tree, n_features)))


def decode_tree_header(value: bytes, tree_id: int) -> TreeHeader:
    body = _unseal(value, f"the header of tree {tree_id}")
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
    return _seal(HEAD_STRUCT.pack(MAGIC, FORMAT_VERSION, 0, tree_id, start + row_offset,
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
        yield v, _seal(b"".join(parts))


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
    body = _unseal(value, what)
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


def _record_pages(records, psize: int) -> int:
    """Pages LMDB needs to hold ``records`` (a fresh B-tree bound, not a guess).

    A value larger than about half a page goes to its own run of overflow pages; smaller
    items share leaf pages, which a B-tree keeps at least half full, hence the factor 2.
    Branch pages (at most one per two leaf pages) and a fixed allowance for the meta pages,
    the copy-on-write path of the transaction and the free list come on top.
    """
    overflow = 0
    inline = 0
    for key, value in records:
        item = 8 + len(key) + len(value)
        if item > (psize - 16) // 2:
            overflow += -(-(len(value) + 16) // psize)
            inline += 8 + len(key) + 8 + 2
        else:
            inline += item + 2
    leaf_pages = -(-2 * inline // (psize - 16)) + 1
    return overflow + leaf_pages + leaf_pages // 2 + 32


class ForestWriter:
    """Write one tree per block into ``path`` (normally ``STORE/index.lmdb``).

    Parameters
    ----------
    path : str or Path
        The index directory to create; it appears only when :meth:`close` succeeds.
    n_blocks, n_samples, n_features : int
        The store's shape; the reader checks them against the store it is opened with.
    width, leaf_size, seed : int
        The build parameters, recorded in the meta record.
    overwrite : bool
        Replace an existing index at ``path`` (default True: the caller decided).

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> from ooc_learn.index.tree import build_block_tree
    >>> X = np.random.default_rng(0).random((300, 4), dtype=np.float32)
    >>> perm, tree = build_block_tree(X, width=3, leaf_size=20)
    >>> d = tempfile.mkdtemp()
    >>> with ForestWriter(os.path.join(d, "index.lmdb"), n_blocks=1, n_samples=300,
    ...                   n_features=4, width=3, leaf_size=20, seed=0) as w:
    ...     w.add_tree(0, 0, tree)
    """

    def __init__(self, path, *, n_blocks: int, n_samples: int, n_features: int,
                 width: int, leaf_size: int, seed: int, overwrite: bool = True):
        for name, val, low in (("n_blocks", n_blocks, 1), ("n_samples", n_samples, 0),
                               ("n_features", n_features, 0), ("width", width, 2),
                               ("leaf_size", leaf_size, 1), ("seed", seed, 0)):
            if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < low:
                raise ParameterError(
                    f"The '{name}' parameter of ForestWriter must be an int >= {low}. Got "
                    f"{val!r} instead.", "Pass the store's shape and the build parameters.")
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise IndexStateError(f"An index already exists at {self.path}.",
                                  "Pass overwrite=True (ooc-index STORE --overwrite).")
        self.params = dict(n_blocks=int(n_blocks), n_samples=int(n_samples),
                           n_features=int(n_features), width=int(width),
                           leaf_size=int(leaf_size), seed=int(seed))
        remove_stale(self.path)
        self._tmp = temp_sibling(self.path)
        self._env = lmdb.open(str(self._tmp), map_size=1 << 16, subdir=True, sync=False,
                              metasync=False, max_dbs=0, readahead=False)
        self._psize = self._env.stat()["psize"]
        self._trees: dict[int, tuple[int, int, int, int]] = {}
        self.transactions = 0
        self.map_grows = 0      # map size raised from the computed bound
        self.map_retries = 0    # transactions redone because the bound fell short

    def _ensure_room(self, records) -> None:
        info = self._env.info()
        need = (info["last_pgno"] + 1 + _record_pages(records, self._psize)) * self._psize
        if need > info["map_size"]:
            self._env.set_mapsize(need)
            self.map_grows += 1

    def add_tree(self, block_id: int, block_row_offset: int, tree: FlatTree) -> None:
        """Write the tree of one block in a single write transaction."""
        if self._env is None:
            raise IndexStateError(f"The index writer for {self.path} is closed.",
                                  "Create a new ForestWriter.")
        if not 0 <= block_id < self.params["n_blocks"] or block_id in self._trees:
            raise ParameterError(
                f"The 'block_id' parameter of ForestWriter.add_tree must be a new block in "
                f"[0, {self.params['n_blocks']}). Got {block_id!r} instead.",
                "Add each block's tree exactly once.")
        off = int(block_row_offset)
        records = [(tree_key(block_id), encode_tree_header(block_id, off, tree,
                                                           self.params["n_features"]))]
        records += [(node_key(block_id, v), rec) for v, rec in encode_nodes(block_id, tree, off)]
        self._ensure_room(records)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in records:
                        txn.put(key, value)
                break
            except lmdb.MapFullError:  # the bound above was short: grow and redo the txn
                self._env.set_mapsize(2 * self._env.info()["map_size"])
                self.map_retries += 1
        self.transactions += 1
        self._trees[int(block_id)] = (off, tree.n_rows, tree.n_nodes, tree.n_leaves)

    def close(self) -> Path:
        """Check every block has its tree, write the meta record, and move into place."""
        if self._env is None:
            return self.path
        p = self.params
        missing = sorted(set(range(p["n_blocks"])) - set(self._trees))
        offsets = [0]
        for b in range(p["n_blocks"]):
            if b in self._trees:
                offsets.append(offsets[-1] + self._trees[b][1])
        bad = missing or any(self._trees[b][0] != offsets[b] for b in range(p["n_blocks"])) \
            or offsets[-1] != p["n_samples"]
        if bad:
            self.abort()
            what = (f"trees of blocks {missing[:10]} were never added" if missing else
                    "the trees' row ranges do not tile the store's rows")
            raise IndexStateError(f"The index for {self.path} is incomplete: {what}.",
                                  "Rebuild it with `ooc-index STORE --overwrite`.")
        meta = dict(format=INDEX_FORMAT, format_version=INDEX_FORMAT_VERSION, **p,
                    block_offsets=offsets,
                    n_nodes=sum(t[2] for t in self._trees.values()),
                    n_leaves=sum(t[3] for t in self._trees.values()), complete=True)
        record = [(META_KEY, json.dumps(meta).encode())]
        self._ensure_room(record)
        with self._env.begin(write=True) as txn:
            txn.put(*record[0])
        self._env.sync(True)
        self._env.close()
        self._env = None
        size, crc = _file_crc(self._tmp / "data.mdb")
        manifest = self._tmp / MANIFEST
        with open(manifest, "w") as fh:
            json.dump({"format": INDEX_FORMAT, "format_version": INDEX_FORMAT_VERSION,
                       "data.mdb": {"size": size, "crc32": crc}}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            check_stop()  # the last point where a stop leaves the old index as it was
        except BaseException:
            self.abort()
            raise
        replace_dir(self._tmp, self.path)  # the old index or the new one, at every instant
        return self.path

    def abort(self) -> None:
        """Drop the partial build. Safe to call twice."""
        if self._env is not None:
            self._env.close()
            self._env = None
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


def _file_crc(path: Path) -> tuple[int, int]:
    # one reused 1 MiB buffer: opening an index must not cost memory outside the cap
    crc = 0
    size = 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while k := fh.readinto(buf):
            crc = zlib.crc32(view[:k], crc)
            size += k
    return size, crc & 0xFFFFFFFF


class CorruptIndex(Exception):
    """The index files fail their manifest check (raised before LMDB touches them)."""


class IndexVersionMismatch(CorruptIndex):
    """The index was written by another format version (``.version``)."""

    def __init__(self, version):
        self.version = version
        super().__init__(f"format version {version!r}")


def verify_files(path) -> None:
    """Check ``data.mdb`` against ``manifest.json``; raise :class:`CorruptIndex` if not equal."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        want = manifest["data.mdb"]
    except FileNotFoundError:
        raise CorruptIndex("its manifest is missing (the build did not finish)") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CorruptIndex("its manifest is not readable") from None
    if not isinstance(want, dict):
        raise CorruptIndex("its manifest is not readable")
    if manifest.get("format_version") != INDEX_FORMAT_VERSION:
        raise IndexVersionMismatch(manifest.get("format_version"))
    size = (path / "data.mdb").stat().st_size
    if size != want.get("size"):
        raise CorruptIndex(f"data.mdb has {size} bytes, its manifest says {want.get('size')}")
    if _file_crc(path / "data.mdb")[1] != want.get("crc32"):
        raise CorruptIndex("data.mdb fails its checksum")


def open_reader(path) -> lmdb.Environment:
    """Verify the files, then open the environment read-only.

    Raises FileNotFoundError (no index), :class:`CorruptIndex` (files damaged or from
    another version) or ``lmdb.Error``. Falls back to a lock-free open when the directory
    is read-only (nobody can be writing it then).
    """
    path = Path(path)
    if not (path / "data.mdb").is_file():
        raise FileNotFoundError(str(path))
    verify_files(path)
    return open_env(path)


def open_env(path) -> lmdb.Environment:
    """Open the (already verified) environment read-only; used again to remap it."""
    try:
        return lmdb.open(str(path), readonly=True, lock=True, subdir=True, max_dbs=0,
                         readahead=False, max_readers=512)
    except (lmdb.ReadonlyError, PermissionError, lmdb.ReadersFullError):
        return lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_dbs=0,
                         readahead=False)


class SharedReader:
    """The read-only environment of one index, shared by every reader of it in this process.

    LMDB opens an environment once per process (py-lmdb refuses a second open of the same
    files), while one-vs-rest classes trained in threads each query the store's index with
    their own forest state. Each takes the environment with :meth:`acquire` (the first
    verifies and opens it) and gives it back with :meth:`release` (the last closes it);
    :meth:`read` yields a read transaction; :meth:`remap` drops the memory map's resident
    pages by reopening the environment once no transaction is open.
    """

    # weak: a forest dropped without close() still lets its environment go with it
    _open: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
    _open_lock = threading.Lock()

    def __init__(self, key, path: Path, env: lmdb.Environment):
        self._key, self.path, self._env = key, path, env
        self._users = 0
        self._cond = threading.Condition()
        self._active = 0  # read transactions open now

    @classmethod
    def acquire(cls, path) -> "SharedReader":
        """The shared reader of the index at ``path``; raises as :func:`open_reader`."""
        path = Path(path)
        if not path.exists():
            recover(path)  # a replace killed between its two renames: the old index back
        try:
            st = (path / "data.mdb").stat()
            key = (str(path.resolve()), st.st_dev, st.st_ino)  # a rebuilt index: a new one
        except OSError:
            key = None
        with cls._open_lock:
            reader = cls._open.get(key) if key is not None else None
            if reader is None:
                reader = cls(key, path, open_reader(path))
                if key is not None:
                    cls._open[key] = reader
            reader._users += 1
            return reader

    @contextmanager
    def read(self):
        with self._cond:
            self._active += 1
        try:
            with self._env.begin(buffers=False) as txn:
                yield txn
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def remap(self) -> None:
        with self._cond:
            while self._active:
                self._cond.wait()
            self._env.close()
            self._env = open_env(self.path)

    def release(self) -> None:
        # closed under the lock: another thread's acquire between the deregistration and
        # the close would open the same environment again, which LMDB refuses ("already
        # open in this process")
        with self._open_lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._key is not None and self._open.get(self._key) is self:
                del self._open[self._key]
            self._env.close()

    @classmethod
    def is_open(cls, path) -> bool:
        """Whether this process holds the index at ``path`` open now."""
        where = str(Path(path).resolve())
        return any(key[0] == where for key in list(cls._open.keys()))


def index_nbytes(path) -> int:
    """Bytes the index occupies on disk (data file only; the lock file is not data)."""
    f = Path(path) / "data.mdb"
    return f.stat().st_size if f.exists() else 0
