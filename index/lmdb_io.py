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

import json
import os
import shutil
import threading
import weakref
import zlib
from contextlib import contextmanager
from pathlib import Path

import lmdb
import numpy as np

from ooc_learn.storage.errors import IndexStateError, ParameterError
from ooc_learn.storage.replace import recover, remove_stale, replace_dir, temp_sibling
from ooc_learn.storage.stop import check_stop

from .records import (INDEX_FORMAT, INDEX_FORMAT_VERSION, META_KEY, encode_nodes,
                      encode_tree_header, node_key, tree_key)
from .tree import FlatTree

MANIFEST = "manifest.json"

__all__ = ["CloseOrAbort", "ForestWriter", "open_reader", "open_env", "SharedReader",
           "index_meta", "index_summary", "index_nbytes", "verify_files", "CorruptIndex",
           "IndexVersionMismatch", "MANIFEST"]

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


class CloseOrAbort:
    """A writer's ``with`` block: :meth:`close` (finish) when it ends, :meth:`abort` (leave
    nothing) when it raises."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


class ForestWriter(CloseOrAbort):
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


def index_meta(path) -> dict:
    """The meta record of a finished index (its build parameters and the store's shape),
    read without a lock file (the directory is left as the build wrote it)."""
    path = Path(path)
    if not (path / "data.mdb").is_file():
        raise FileNotFoundError(str(path))
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True, max_dbs=0,
                    readahead=False)
    try:
        with env.begin() as txn:
            raw = txn.get(META_KEY)
    finally:
        env.close()
    if raw is None:
        raise CorruptIndex("it has no meta record")
    return json.loads(bytes(raw).decode())


def index_summary(path) -> dict:
    """What ``ooc-info`` says of the index at ``path``: ``{"state": "ok", width, leaf_size,
    seed, n_nodes, n_leaves}``, ``{"state": "missing"}``, or ``{"state": "damaged",
    "reason": ...}`` (read without verifying every byte: ``ooc-check`` does that)."""
    path = Path(path)
    if not path.exists():
        return {"state": "missing"}
    if not path.is_dir():
        return {"state": "damaged", "reason": "a file, not the index's folder"}
    try:
        meta = index_meta(path)
    except FileNotFoundError:
        return {"state": "damaged", "reason": "a folder without the index's data.mdb"}
    except (CorruptIndex, lmdb.Error, ValueError) as exc:
        return {"state": "damaged", "reason": str(exc) or type(exc).__name__}
    if meta.get("format_version") != INDEX_FORMAT_VERSION:
        return {"state": "damaged", "reason": f"written by index format "
                                              f"{meta.get('format_version')!r}, not "
                                              f"{INDEX_FORMAT_VERSION}"}
    return {"state": "ok", **{k: meta.get(k) for k in ("width", "leaf_size", "seed",
                                                        "n_nodes", "n_leaves")}}


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
