"""Read the block store (see :mod:`ooc_learn.storage.format` for the layout; ``writer.py``
writes it).

:class:`Store` reads blocks, row ranges and row gathers through an LRU block cache that
reserves from the run's :class:`MemoryBudget`, checking each whole-block read against its
digest (``integrity.py``). The file is longer than our ~500 lines because :class:`Store` is one
object: every read path shares the open file, its direct slicers, the block cache, the
one-vs-rest label view and the digest checks, and splitting it would pass them all around.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp

from .arrays import (CodedDataset, Slicer, coded_piece_bytes, open_direct, open_random,
                     rows_nbytes, rows_one_by_one, run_bounds)
from .budget import MemoryBudget
from .cache import LRUCache
from .errors import (BudgetExceededError, ClosedError, IndexStateError, ParameterError,
                     StoreFormatError)
from .format import (CODED_VERSION, DATA_FILE, FORMAT_NAME, FORMAT_VERSION, INDEX_DIR,
                     READ_VERSIONS, TMP_MARKER)
from .integrity import HASHED, REBUILD_HINT, check_columns, check_row_pointers, digest
from .stop import check_stop

__all__ = ["Store", "open_store", "open_data", "is_store", "is_store_path"]

# Store.iter_chunks' smallest range when the cap holds less than the rows asked
CHUNK_MIN_ROWS = 16
# One block cache per store file and budget, shared by every Store open on them: the
# one-vs-rest classes of a multiclass store (each its own view, trained in threads under one
# budget) read each block once between them instead of once each. (id(budget), file key) ->
# [cache, views using it]; the entry holds the cache and so its budget, so the id stays that
# budget's while the entry lives.
_SHARED_CACHES: dict = {}
_SHARED_LOCK = threading.Lock()


def _file_key(data: Path):
    """The data file's identity: a store rewritten or re-ingested in place is another file."""
    try:
        st = os.stat(data)
    except OSError:
        return None
    return (str(data.resolve()), st.st_dev, st.st_ino, st.st_mtime_ns)


def _acquire_block_cache(budget: MemoryBudget, data: Path, name: str):
    """The block cache of ``data`` under ``budget``, made by the first view; with its key."""
    key = _file_key(data)
    with _SHARED_LOCK:
        entry = _SHARED_CACHES.get((id(budget), key)) if key is not None else None
        if entry is None:
            entry = [LRUCache(budget, name=name), 0]
            if key is not None:
                _SHARED_CACHES[(id(budget), key)] = entry
        entry[1] += 1
        return entry[0], key


def _release_block_cache(budget: MemoryBudget, key, cache: LRUCache) -> None:
    """A view lets go of its block cache; the last one empties and closes it."""
    with _SHARED_LOCK:
        entry = _SHARED_CACHES.get((id(budget), key))
        if entry is not None and entry[0] is cache:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _SHARED_CACHES[(id(budget), key)]
    cache.close()


def is_store(path) -> bool:
    p = Path(path)
    return (p / DATA_FILE).is_file() and TMP_MARKER not in p.name


def is_store_path(X) -> bool:
    """Whether ``X``, a model's or an estimator's input, is a store's path (str or
    PathLike); a path where no store is is refused, naming it (numpy took it for a 0-d
    array: "X must be 2-d", or scikit-learn asked for y); anything else is not a path."""
    if not isinstance(X, (str, os.PathLike)):
        return False
    if is_store(X):
        return True
    raise ParameterError(f"No ooc-learn store at {X}.",
                         "Pass arrays, a sparse matrix, a Store, or the path of a store "
                         "written by ooc-ingest (a source file: ingest it first, or score it "
                         "with ooc-predict MODEL FILE).")


class Store:
    """A finished block store opened read-only.

    Parameters
    ----------
    path : str or Path
        The store directory written by :func:`ooc_learn.ingest`.
    memory : None, size or MemoryBudget
        The run's memory cap; the block cache reserves from it.
    direct : bool or None
        Whether reads of 1 MiB or more bypass the page cache (``O_DIRECT``, where the file
        system has it). None: where the data file is larger than the memory the page cache
        could have now (:func:`~.measure.memory_headroom_bytes`). A pass over such a file
        evicts its own pages before the next pass comes back to them, and in a memory cgroup
        every buffered read first reclaims the cgroup's pages: on the issue-23 store in a
        1 GiB cgroup, IBCD's scans read 1.1-1.5 GB/s buffered and 2.8 GB/s direct. The
        environment's ``OOC_DIRECT_IO`` (auto, on, off) sets it for every store a run opens.

    Examples
    --------
    >>> with open_store("train.store", memory="256M") as store:   # doctest: +SKIP
    ...     for X, y, row_ids in store.iter_blocks():
    ...         pass
    """

    def __init__(self, path, memory=None, *, positive=None, direct: bool | None = None):
        self.path = Path(path)
        self.budget = MemoryBudget.coerce(memory)
        data = self.path / DATA_FILE
        if TMP_MARKER in self.path.name:
            raise StoreFormatError(
                f"{self.path} is an unfinished store (an ingest that was interrupted).",
                "Run ooc-ingest again; the leftover folder is removed automatically.")
        if not self.path.exists():
            from .replace import recover

            recover(self.path)  # a replace killed between its two renames: the old store back
        if not self.path.exists():
            raise StoreFormatError(f"No store at {self.path}.",
                                   "Create one with: ooc-ingest SOURCE -o STORE")
        if not data.is_file():
            from .sharded import ShardedStore, is_sharded_store

            if is_sharded_store(self.path):  # K stores and a manifest: not one store
                k = ShardedStore(self.path).n_shards
                raise StoreFormatError(
                    f"{self.path} is a sharded store ({k} shards): this reads one store.",
                    "Train one model over its shards with --solver cocoa --workers N (ooc-predict, "
                    f"--test and ooc-check read it whole), or pass one shard's store "
                    f"({self.path}/shard-0).")
            raise StoreFormatError(
                f"{self.path} is not an ooc-learn store (no {DATA_FILE} inside).",
                "Create one with: ooc-ingest SOURCE -o STORE")
        direct = _reads_direct(data, direct)  # before anything is opened: it may refuse
        try:
            # no chunk cache: the datasets are contiguous (every read goes straight to the
            # file), so HDF5's default 1 MiB per dataset would be memory outside the budget
            self._file = h5py.File(data, "r", rdcc_nbytes=0)
        except OSError as exc:
            raise StoreFormatError(f"{data} cannot be opened as HDF5 ({exc}).",
                                   "The store is damaged; re-create it with ooc-ingest "
                                   "--overwrite.") from None
        try:
            self._read_header(data)
        except StoreFormatError:
            self._file.close()
            raise
        except Exception as exc:  # a missing or mistyped attribute or dataset
            self._file.close()
            raise StoreFormatError(f"{data} is damaged: its header cannot be read "
                                   f"({type(exc).__name__}: {exc}).", REBUILD_HINT) from None
        self._closed = False
        # dataset handles looked up once: a lookup by name costs as much as a small read
        self._ds = {name: self._file[name] for name in
                    ("y", "row_id", "X", "indptr", "data", "indices") if name in self._file}
        # row slices straight from the file where a dataset is plain contiguous bytes (the
        # writer's layout); h5py otherwise
        self._fd = os.open(data, os.O_RDONLY) if hasattr(os, "preadv") else None
        # and a second one without read-ahead for the small scattered reads (open_random),
        # where the platform can advise it
        self._fd_small = self._fd_direct = None
        if self._fd is not None:
            if hasattr(os, "posix_fadvise"):
                self._fd_small = open_random(data)
            if direct:
                self._fd_direct = open_direct(data)
            self._ds = {k: Slicer.of(self._fd, v, self._fd_small, self._fd_direct,
                                     self.value_table if k == "X" else None,
                                     coded_piece_bytes(self.budget.limit))
                        for k, v in self._ds.items()}
        elif self.value_table is not None:
            self._ds["X"] = CodedDataset(self._ds["X"], self.value_table)
        # the buffer the value codes are read through (one reading thread's)
        self._piece_held = getattr(self._ds.get("X"), "buffer_bytes", 0)
        if self._piece_held:
            try:
                self.budget.reserve(self._piece_held, f"value-code reads of {self.path.name}")
            except BaseException:
                self._piece_held = 0
                self.close()
                raise
        # shared with every other view of this file under this budget (_acquire_block_cache):
        # entries keep the stored labels; a one-vs-rest view maps them as they leave
        self._cache, self._cache_key = _acquire_block_cache(self.budget, data,
                                                            f"blocks of {self.path.name}")
        self.rows_read = 0
        self.bytes_read = 0
        self.stored_task = self.task
        self.positive = None
        if positive is not None:
            try:
                self._one_vs_rest(positive)
            except Exception:
                self.close()
                raise

    def _read_header(self, data: Path) -> None:
        a = self._file.attrs
        if a.get("format") != FORMAT_NAME:
            raise StoreFormatError(f"{data} is not an ooc-learn store file.",
                                   "Create one with: ooc-ingest SOURCE -o STORE")
        version = int(a.get("format_version", -1))
        if version not in READ_VERSIONS:
            raise StoreFormatError(
                f"{self.path} was written by store format {version}; this ooc-learn reads "
                f"formats {' and '.join(map(str, READ_VERSIONS))}.",
                "Re-ingest the source with this version: ooc-ingest SOURCE -o STORE --overwrite")
        if not bool(a.get("complete", False)):
            raise StoreFormatError(f"{self.path} is incomplete (its ingest did not finish).",
                                   "Re-run ooc-ingest with --overwrite.")
        self._read_shape(a, version)

    def _read_shape(self, a, version: int = FORMAT_VERSION) -> None:
        """The header's figures, each checked against the datasets they describe."""
        def bad(what):
            return StoreFormatError(f"{self.path / DATA_FILE} is damaged: {what}.", REBUILD_HINT)

        self.n_samples = int(a["n_samples"])
        self.n_features = int(a["n_features"])
        self.n_blocks = int(a["n_blocks"])
        self.nnz = int(a["nnz"])
        self.layout = str(a["layout"])
        self.task = str(a["task"])
        n, d = self.n_samples, self.n_features
        if min(n, d, self.nnz) < 0 or self.n_blocks < 1 or self.layout not in HASHED:
            raise bad(f"impossible header figures (n_samples {n}, n_features {d}, nnz "
                      f"{self.nnz}, n_blocks {self.n_blocks}, layout {self.layout!r})")
        try:
            self.metadata = json.loads(a["metadata"])
        except (ValueError, TypeError):
            raise bad("its metadata attribute is not JSON") from None
        if not isinstance(self.metadata, dict):
            raise bad("its metadata attribute is not a JSON object")
        f = self._file
        want = {"y": ((n,), "f"), "row_id": ((n,), "i"), "sqnorm": ((n,), "f")}
        self.value_table = None
        if self.layout == "dense" and version == CODED_VERSION:
            want["X"] = ((n, d), "u")
            self.value_table = self._read_value_table(bad)
        elif self.layout == "dense":
            want["X"] = ((n, d), "f")
        else:
            want.update(indptr=((n + 1,), "i"), indices=((self.nnz,), "i"),
                        data=((self.nnz,), "f"))
        for name, (shape, kind) in want.items():
            ds = f.get(name)
            if not isinstance(ds, h5py.Dataset):
                raise bad(f"the dataset {name!r} is missing")
            if ds.shape != shape or ds.dtype.kind != kind:
                raise bad(f"the dataset {name!r} has shape {ds.shape} ({ds.dtype}), not "
                          f"{shape} ({'float' if kind == 'f' else 'integer'})")
        off = f["block_offsets"][:] if isinstance(f.get("block_offsets"), h5py.Dataset) else None
        if (off is None or off.ndim != 1 or off.dtype.kind != "i"
                or off.shape[0] != self.n_blocks + 1 or off[0] != 0 or off[-1] != n
                or np.any(np.diff(off) < 0)):
            raise bad(f"block_offsets must rise from 0 to {n} in {self.n_blocks + 1} entries")
        self.block_offsets = off.astype(np.int64)
        if self.layout == "csr":
            ends = f["indptr"][[0, n]] if n else f["indptr"][:1]
            if ends[0] != 0 or ends[-1] != self.nnz:
                raise bad(f"indptr must run from 0 to nnz = {self.nnz}")
        hashes = f.get("block_hash")  # stores written before the digests have none
        self._hashes = None
        if hashes is not None:
            names = json.loads(hashes.attrs.get("datasets", "null"))
            if (names != list(HASHED[self.layout]) or hashes.shape != (self.n_blocks, len(names))
                    or hashes.dtype != np.uint64):
                raise bad("block_hash does not match the store's datasets")
            self._hashes = hashes[:]
            # which (block, dataset) slices this handle has checked: a store is immutable
            # while open (replaced by a rename, never rewritten in place), so a read pass
            # after the first checks nothing new
            self._checked = np.zeros(self._hashes.shape, dtype=bool)

    def _read_value_table(self, bad) -> np.ndarray:
        """``X_values`` of a store whose X holds value codes: one float32 entry per code."""
        X, vals = self._file.get("X"), self._file.get("X_values")
        if not (isinstance(X, h5py.Dataset) and isinstance(vals, h5py.Dataset)):
            raise bad("its X or X_values dataset is missing")
        if (X.dtype not in (np.uint8, np.uint16) or vals.dtype != np.float32
                or vals.shape != (int(np.iinfo(X.dtype).max) + 1,)):
            raise bad(f"X_values ({vals.shape}, {vals.dtype}) does not hold one float32 "
                      f"value per code of X ({X.dtype})")
        self._code_dtype = X.dtype
        return vals[:]

    @property
    def value_codes(self) -> str | None:
        """The type of X's value codes ("uint8", "uint16"), None where X is float32
        (:mod:`~ooc_learn.storage.value_codes`)."""
        return None if self.value_table is None else str(self._code_dtype)

    def _one_vs_rest(self, positive) -> None:
        """Read a multiclass store as the binary task ``positive`` vs the rest: every label
        leaves the store as +1 (the class) or -1 (any other), the task reads "binary". The
        file is unchanged; one ingest serves every class (one-vs-rest training)."""
        classes = self.metadata.get("label_map", {}).get("classes")
        if self.stored_task != "multiclass" or not classes:
            raise ParameterError(
                f"One class against the rest is read from a multiclass store; {self.path} "
                f"holds a {self.stored_task} task.",
                "Train it directly, or ingest with --task multiclass.")
        try:
            c = float(positive)
        except (TypeError, ValueError):
            c = None
        if c is None or c not in [float(v) for v in classes]:
            raise ParameterError(
                f"{positive!r} is not a class of {self.path} (classes: "
                f"{', '.join(f'{v:g}' for v in map(float, classes))}).",
                "Pick one of the store's classes.")
        self.positive = c
        self.task = "binary"

    def labels_out(self, y):
        """Labels as this view reads them: stored, or +1 / -1 for the one-vs-rest class (the
        block cache, shared between views, keeps the stored ones)."""
        if self.positive is None:
            return y
        return np.where(np.asarray(y) == self.positive, 1.0, -1.0).astype(np.float32)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the cache and the file. Closing twice is fine."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self.budget.release(getattr(self, "_piece_held", 0))
        self._piece_held = 0
        if getattr(self, "_cache", None) is not None:
            _release_block_cache(self.budget, self._cache_key, self._cache)
        self._file.close()
        for name in ("_fd", "_fd_small", "_fd_direct"):
            if getattr(self, name, None) is not None:
                os.close(getattr(self, name))
                setattr(self, name, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed store raises :class:`ClosedError`)."""
        return getattr(self, "_closed", True)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"The store {self.path} is closed.",
                              "Open it again with ooc_learn.open_store(path).")

    def __repr__(self) -> str:
        return (f"Store({str(self.path)!r}, n_samples={self.n_samples}, "
                f"n_features={self.n_features}, n_blocks={self.n_blocks}, "
                f"layout={self.layout!r}, task={self.task!r})")

    # -- metadata ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self.n_samples, self.n_features

    @property
    def block_sizes(self) -> np.ndarray:
        return np.diff(self.block_offsets)

    @property
    def label_map(self) -> dict:
        return self.metadata.get("label_map", {})

    @property
    def libsvm_base(self) -> bool | None:
        """Whether the LIBSVM sources were read 0-based (True) or 1-based (False); None where
        the store holds no LIBSVM source (a CSV's or an array's columns have no index base,
        and a LIBSVM file scored against its model is read by its own, as ingest reads it)."""
        md = self.metadata
        if "libsvm" not in md.get("formats", ["libsvm"]):
            return None
        base = md.get("zero_based")
        return None if base is None else bool(base)

    def fingerprint(self) -> str:
        """Identifies the data: the sources' digests and the shuffle parameters."""
        import hashlib

        h = hashlib.sha256()
        h.update(json.dumps([s.get("sha256") or s.get("sha256_pieces")
                             for s in self.metadata.get("sources", [])]).encode())
        h.update(json.dumps(self.metadata.get("params", {}), sort_keys=True).encode())
        h.update(f"{self.n_samples},{self.n_features}".encode())
        return h.hexdigest()[:16]

    def block_of(self, rows) -> np.ndarray:
        """Block id of each store row position."""
        return np.searchsorted(self.block_offsets, np.asarray(rows), side="right") - 1

    def info(self) -> dict:
        return {"store": str(self.path), "n_samples": self.n_samples,
                "n_features": self.n_features, "n_blocks": self.n_blocks, "nnz": self.nnz,
                "layout": self.layout, "task": self.task, "value_codes": self.value_codes,
                "block_rows": {"min": int(self.block_sizes.min()),
                               "max": int(self.block_sizes.max())},
                "data_bytes": (self.path / DATA_FILE).stat().st_size,
                "has_index": (self.path / INDEX_DIR).exists(),
                # what a cap must leave for data: one block at a time, or every row in memory
                "memory": {"block_bytes": self.estimated_bytes(int(self.block_sizes.max())),
                           "all_rows_bytes": self.estimated_bytes(self.n_samples)},
                "metadata": self.metadata}

    # -- reads ---------------------------------------------------------------------------
    def read_range(self, start: int, stop: int, *, ids: bool = True,
                   stored_labels: bool = False, out: np.ndarray | None = None):
        """Rows ``start:stop`` of the store as ``(X, y, row_ids)``; one read per dataset
        (``ids=False`` skips the row ids, returning None for them: one read fewer;
        ``stored_labels`` the labels as stored, not as this view maps them). ``out``: a
        float32 buffer of at least ``stop - start`` rows that a store with value codes
        decodes X into (X is then a view of it); others ignore it."""
        self._check_open()
        check_stop()  # a safe point for SIGINT / SIGTERM
        start, stop = int(start), int(stop)
        if not (0 <= start <= stop <= self.n_samples):
            raise IndexError(f"row range {start}:{stop} outside 0:{self.n_samples}")
        f = self._ds
        got = {"y": f["y"][start:stop]}
        if ids:
            got["row_id"] = f["row_id"][start:stop]
        if self.layout == "dense":
            X = got["X"] = (f["X"][start:stop] if out is None or self.value_table is None
                            else f["X"].read_into(start, stop, out))
        else:
            indptr = got["indptr"] = f["indptr"][start:stop + 1]
            check_row_pointers(self.path, indptr, self.nnz, f"rows {start}:{stop}")
            a, b = int(indptr[0]), int(indptr[-1])
            got["data"], got["indices"] = f["data"][a:b], f["indices"][a:b]
            check_columns(self.path, got["indices"], self.n_features, f"rows {start}:{stop}")
            X = sp.csr_matrix((got["data"], got["indices"], indptr - a),
                              shape=(stop - start, self.n_features))
        self._verify(start, stop, got)
        y, row_ids = got["y"], got.get("row_id")
        if not stored_labels:
            y = self.labels_out(y)
        self.rows_read += stop - start
        nb = rows_nbytes(X, y, row_ids)
        if self.value_table is not None:  # the codes read, not the float32 returned
            nb -= X.nbytes - X.size * self._code_dtype.itemsize
        self.bytes_read += nb
        return X, y, row_ids

    @property
    def past_page_cache(self) -> bool:
        """Whether large reads bypass the page cache (the file outgrows the memory it could
        have, or ``direct=`` / ``OOC_DIRECT_IO`` says so): then scattered reads are also
        named ahead (:meth:`will_need`)."""
        return self._fd_direct is not None

    @property
    def read_ahead(self):
        """:meth:`will_need` where it starts reads (a dense store read
        :attr:`past_page_cache`), else None: what an index's search is handed to name the
        leaves it will read next (on a store the page cache holds, the advice cost 8-15 %
        of a query for nothing; bench-log, 2026-11-27)."""
        return self.will_need if self.past_page_cache and self.layout == "dense" else None

    def will_need(self, spans) -> None:
        """Start reading the row spans ``(start, stop)`` (X and labels) ahead of the
        :meth:`read_range` calls that will want them (:meth:`Slicer.will_need`), where the
        store is read :attr:`past_page_cache`; nothing on a CSR store or where the platform
        cannot. The index's search names the leaves it will most likely read next."""
        if self.layout != "dense":
            return
        for name in ("X", "y"):
            ds = self._ds.get(name)
            if isinstance(ds, Slicer):
                ds.will_need(spans)

    def read_rows(self, rows):
        """Rows at sorted store positions ``rows`` as ``(X, y)``: scattered single rows (a
        node's pivot rows) in one call; on a dense store one direct read per row into one
        array, otherwise one :meth:`read_range` per row."""
        self._check_open()
        rows = np.asarray(rows, dtype=np.int64).ravel()
        if rows.size and (rows[0] < 0 or rows[-1] >= self.n_samples
                          or np.any(np.diff(rows) < 0)):
            raise IndexError(f"row positions must be sorted and in 0:{self.n_samples}")
        Xs, ys = self._ds.get("X"), self._ds["y"]
        if self.layout == "dense" and isinstance(Xs, Slicer) and isinstance(ys, Slicer):
            X, y = Xs.take(rows), ys.take(rows)
            self.rows_read += rows.size
            self.bytes_read += rows.size * Xs.row_bytes + y.nbytes
            return X, self.labels_out(y)
        return rows_one_by_one(lambda a, b: self.read_range(a, b, ids=False), rows)

    def read_block(self, b: int, *, stored_labels: bool = False):
        """Block ``b`` as ``(X, y, row_ids)``, through the LRU block cache (shared with the
        other views of this store under this budget; ``stored_labels``: as in
        :meth:`read_range`)."""
        self._check_open()
        b = int(b)
        if not 0 <= b < self.n_blocks:
            raise IndexError(f"block {b} outside 0:{self.n_blocks}")

        def load():
            out = self.read_range(self.block_offsets[b], self.block_offsets[b + 1],
                                  stored_labels=True)
            return out, rows_nbytes(*out)

        rows = int(self.block_offsets[b + 1] - self.block_offsets[b])
        need = self.estimated_bytes(rows)
        if need > self.budget.limit and not self.block_is_cached(b):
            # a block the cache cannot hold would be read beside the cap: refused, naming
            # the ways out (the store's blocks were sized at ingest for a larger cap)
            from .budget import format_size

            fit = self.block_rows_that_fit()
            raise BudgetExceededError(
                f"Block {b} of {self.path} holds {rows:,} rows ({format_size(need)}), more "
                f"than the {format_size(self.budget.limit)} the memory cap "
                f"{format_size(self.budget.cap)} leaves for data.",
                f"Raise --memory to at least {format_size(self.budget.cap_needed(need), up=True)}"
                f", or re-ingest with --block-rows {fit} (blocks are sized at ingest from its "
                f"--memory).")
        X, y, row_ids = self._cache.get_or_load(("block", b), load, expect=need)
        return X, (y if stored_labels else self.labels_out(y)), row_ids

    def block_rows_that_fit(self) -> int:
        """The ``--block-rows`` to re-ingest with so that a block takes a quarter of this
        budget's working share (the hint of the refusals of blocks that do not fit)."""
        return max(1, self.budget.limit // 4 // max(1, self.estimated_bytes(1)))

    @property
    def block_cache(self) -> LRUCache:
        """The LRU cache of whole blocks (entries ``("block", b)`` → ``(X, y, row_ids)``, the
        labels as stored: see :meth:`labels_out`), shared by the views of this store under
        this budget; the index search listens to it (``LRUCache.listen``) to read cached
        blocks in place."""
        return self._cache

    def block_is_cached(self, b: int) -> bool:
        """Whether block ``b`` is in the LRU block cache now."""
        return ("block", int(b)) in self._cache

    def reads_whole_block(self, b: int) -> bool:
        """The read policy for partial reads of block ``b``: load the whole block through the
        cache when it is cached or a quarter of the free budget holds it; otherwise read only
        the rows wanted. :meth:`gather` and IBCD's row reader both follow it."""
        lo, hi = int(self.block_offsets[b]), int(self.block_offsets[b + 1])
        return (self.block_is_cached(b)
                or (hi - lo) * max(1, self.estimated_bytes(1)) * 4 <= self.budget.available)

    def iter_blocks(self, order=None):
        """Yield ``(X, y, row_ids)`` for each block, in ``order`` (default 0..R-1)."""
        for b in (range(self.n_blocks) if order is None else order):
            yield self.read_block(b)

    def iter_chunks(self, max_rows: int, *, ids: bool = True, blocks=None,
                    reuse: bool = False):
        """Yield ``(start, X, y, row_ids)`` covering the store in order (or the blocks
        ``blocks``, in the order given), under the read policy
        of :meth:`reads_whole_block`: a whole block through the cache when it takes one, else
        ranges of at most ``max_rows`` rows, each paid from the budget while it is held
        (``ids=False`` skips the row ids). Where the cap holds less than ``max_rows`` rows at
        the moment (the caller's state grew between chunks, or the RSS holds more than the
        account), the range halves down to ``CHUNK_MIN_ROWS`` rows before the reservation
        fails. A caller lets go of each chunk before asking for the next.

        ``reuse``: the caller copies what it keeps of a chunk (a scan's selection), so on a
        store with value codes the ranges are decoded into one buffer, reserved while the
        pass lasts, instead of a fresh array each: the pages of 96 MiB chunks faulted in
        afresh each time cost more than their decoding (bench-log, session 50)."""
        self._check_open()
        into = _ChunkBuffer(self) if reuse and self.value_table is not None else None
        try:
            for b in range(self.n_blocks) if blocks is None else blocks:
                b = int(b)
                yield from self.iter_range(int(self.block_offsets[b]),
                                           int(self.block_offsets[b + 1]), max_rows, ids=ids,
                                           _into=into)
        finally:
            if into is not None:
                into.release()

    def iter_range(self, start: int, stop: int, max_rows: int, *, ids: bool = True,
                   _into=None):
        """Yield ``(start, X, y, row_ids)`` covering the rows ``start:stop`` of one block
        under the read policy of :meth:`iter_chunks`: a view of the whole block through the
        cache when it takes one, else ranges of at most ``max_rows`` rows paid from the
        budget while they are held (``_into``: :meth:`iter_chunks`'s reused buffer, paid
        while it lives)."""
        self._check_open()
        start, stop = int(start), int(stop)
        b = int(np.searchsorted(self.block_offsets, start, side="right") - 1)
        lo, hi = int(self.block_offsets[b]), int(self.block_offsets[b + 1])
        if not lo <= start <= stop <= hi:
            raise IndexError(f"rows {start}:{stop} are not inside one block")
        if start == stop:
            return
        if self.reads_whole_block(b):
            X, y, row_ids = self.read_block(b)
            if (start, stop) == (lo, hi):
                yield start, X, y, row_ids
            else:
                yield (start, X[start - lo:stop - lo], y[start - lo:stop - lo],
                       None if row_ids is None else row_ids[start - lo:stop - lo])
            return
        step, budget = max(1, int(max_rows)), self.budget
        a = start
        while a < stop and _into is not None:
            buf = _into.rows(min(stop, a + step) - a)
            z = a + buf.shape[0]
            yield (a,) + tuple(self.read_range(a, z, ids=ids, out=buf))
            a = z
        while a < stop:
            # by the RSS too: what the account does not itemise (the caller's last
            # chunk, still held while this one is read) halves the chunk
            z = a + budget.reserve_shrinking(min(stop, a + step) - a, self.estimated_bytes,
                                             CHUNK_MIN_ROWS, "store chunk")
            nbytes = self.estimated_bytes(z - a)
            try:
                yield (a,) + tuple(self.read_range(a, z, ids=ids))
            finally:
                budget.release(nbytes)
            a = z

    def gather(self, rows, *, whole_blocks: bool = True):
        """Rows at store positions ``rows`` as ``(X, y, row_ids)``, in the order given.

        Rows are grouped by block so each block is read at most once: whole, through the
        cache, under the policy of :meth:`reads_whole_block`, else only runs of the rows
        wanted. ``whole_blocks=False`` (a sample not to be read again) reads a block whole
        only when it is cached, or when the policy allows it and the runs would read half
        of it anyway. IBCD's 10,000-row sample for w_0 read the generated benchmark store's
        blocks whole with the policy alone, for 2.4 % of their rows (now by runs);
        Fashion-MNIST's runs would read 82 % (still whole).
        """
        self._check_open()
        rows = np.asarray(rows, dtype=np.int64).ravel()
        n = rows.size
        if n and (rows.min() < 0 or rows.max() >= self.n_samples):
            raise IndexError(f"row positions must be in 0:{self.n_samples}")
        if not n:
            X0, _, _ = self.read_range(0, 0)
            return X0, np.empty(0, np.float32), np.empty(0, np.int64)
        # rows are read block by block in sorted order into the results (dense X too), which
        # are permuted once at the end unless the rows came sorted (IBCD's sample): a part
        # per block, concatenated and then permuted, copied the sample twice more (31 MB on
        # Fashion-MNIST, in fresh pages each time)
        in_order = bool(np.all(rows[1:] >= rows[:-1]))
        order = None if in_order else np.argsort(rows, kind="stable")
        srt = rows if in_order else rows[order]
        blocks = self.block_of(srt)
        f = self._ds
        dense = self.layout == "dense"
        Xout = np.empty((n, self.n_features), np.float32) if dense else None
        yout, idout = np.empty(n, f["y"].dtype), np.empty(n, f["row_id"].dtype)
        parts_X = []  # CSR rows, block by block: (row lengths, data, indices)
        # read straight from the file: one system call per run of rows (X; a CSR store's
        # data and indices), the labels, ids (and row pointers) of a block's span in one each
        # (by runs where the span is larger than the X rows wanted). Scattered single rows
        # through read_range cost ~15 us each in Python (dense; ~50 us CSR): a capped IBCD
        # run's 10,000-row sample for w_0 on the generated store took 0.12-0.15 s of its
        # 0.35-0.40 s, on a CSR store (200k x 2000, 1 % nonzeros) 0.4-0.7 s.
        direct = all(isinstance(f.get(k), Slicer) for k in (
            ("X", "y", "row_id") if dense else ("indptr", "data", "indices", "y", "row_id")))
        starts = np.r_[0, np.flatnonzero(np.diff(blocks)) + 1, n].tolist()
        for a0, a1 in zip(starts[:-1], starts[1:]):
            b = int(blocks[a0])
            lo = int(self.block_offsets[b])
            want = srt[a0:a1]
            # the whole block through the cache when it is cached or fits easily (later
            # gathers then cost no I/O; a sample: see above); else runs of the wanted rows
            whole = self.block_is_cached(b)
            runs = None
            if not whole and self.reads_whole_block(b):
                if whole_blocks:
                    whole = True
                else:
                    runs = run_bounds(want)
                    span = sum(int(want[j - 1] - want[i]) + 1 for i, j in runs)
                    whole = 2 * span >= int(self.block_offsets[b + 1]) - lo
            if whole:
                X, y, ids = self.read_block(b)
                local = want - lo
                if dense:
                    np.take(X, local, axis=0, out=Xout[a0:a1])
                else:
                    Xl = X[local]
                    parts_X.append((np.diff(Xl.indptr), Xl.data, Xl.indices))
                np.take(y, local, out=yout[a0:a1])
                np.take(ids, local, out=idout[a0:a1])
                continue
            if runs is None:
                runs = run_bounds(want)
            if direct:
                a, z = int(want[0]), int(want[-1]) + 1
                if dense:
                    read = f["X"].take_runs(want, runs, out=Xout[a0:a1])
                    x_bytes = Xout[a0:a1].nbytes
                    self.bytes_read += read * f["X"].row_bytes
                else:
                    part, read, x_bytes = self._csr_runs(want, runs)
                    parts_X.append(part)
                self.rows_read += read
                for ds, out in ((f["y"], yout), (f["row_id"], idout)):
                    # the span in one read while it takes no more than the X rows returned
                    if (z - a) * ds.row_bytes <= x_bytes:
                        np.take(ds[a:z], want - a, out=out[a0:a1])
                        read = z - a
                    else:
                        read = ds.take_runs(want, runs, out=out[a0:a1])
                    self.bytes_read += read * ds.row_bytes
                if self.positive is not None:  # read raw from the file, not by read_range
                    yout[a0:a1] = self.labels_out(yout[a0:a1])
                continue
            for r_a, r_b in runs:
                run = want[r_a:r_b]
                r0, r1 = int(run[0]), int(run[-1]) + 1
                X, y, ids = self.read_range(r0, r1)
                local = run - r0
                if dense:
                    Xout[a0 + r_a:a0 + r_b] = X[local]
                else:
                    Xl = X[local]
                    parts_X.append((np.diff(Xl.indptr), Xl.data, Xl.indices))
                yout[a0 + r_a:a0 + r_b] = y[local]
                idout[a0 + r_a:a0 + r_b] = ids[local]
        if dense:
            X = Xout
        else:
            indptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.concatenate([p[0] for p in parts_X]), out=indptr[1:])
            X = sp.csr_matrix((np.concatenate([p[1] for p in parts_X]),
                               np.concatenate([p[2] for p in parts_X]), indptr),
                              shape=(n, self.n_features))
        if in_order:
            return X, yout, idout
        inv = np.empty_like(order)
        inv[order] = np.arange(n)
        return X[inv], yout[inv], idout[inv]

    def _csr_runs(self, want: np.ndarray, runs):
        """CSR rows at the sorted positions ``want`` (one block's) read by ``runs``: the row
        pointers of their span in one read (by runs where that is larger than the rows'
        nonzeros), each run's data and indices in one read each. Returns ``((row lengths,
        data, indices), rows read, bytes of the rows returned)``."""
        f = self._ds
        ip_ds, dat_ds, ind_ds = f["indptr"], f["data"], f["indices"]
        a, z = int(want[0]), int(want[-1]) + 1
        d = np.diff(want)
        span_ip = ip_ds[a:z + 1] if (z - a + 1) * ip_ds.row_bytes <= (
            self.estimated_bytes(want.size)) else None
        self.bytes_read += 0 if span_ip is None else span_ip.nbytes
        lens, datas, inds = [], [], []
        read = 0
        for i, j in runs:
            r0, r1 = int(want[i]), int(want[j - 1]) + 1
            read += r1 - r0
            if span_ip is not None:
                ip = span_ip[r0 - a:r1 - a + 1]
            else:
                ip = ip_ds[r0:r1 + 1]
                self.bytes_read += ip.nbytes
            check_row_pointers(self.path, ip, self.nnz, f"rows {r0}:{r1}")
            s0, s1 = int(ip[0]), int(ip[-1])
            dat, ind = dat_ds[s0:s1], ind_ds[s0:s1]
            check_columns(self.path, ind, self.n_features, f"rows {r0}:{r1}")
            self.bytes_read += dat.nbytes + ind.nbytes
            sel = want[i:j] - r0
            ln = ip[sel + 1] - ip[sel]
            if np.all(d[i:j - 1] == 1):  # consecutive rows: all of what was read
                lens.append(ln)
                datas.append(dat)
                inds.append(ind)
                continue
            # the wanted rows' nonzeros: each row's start, repeated over its length, plus
            # the position within the row
            first = np.repeat(ip[sel] - s0 - (np.cumsum(ln) - ln), ln)
            pick = first + np.arange(first.size)
            lens.append(ln)
            datas.append(dat[pick])
            inds.append(ind[pick])
        part = (np.concatenate(lens), np.concatenate(datas), np.concatenate(inds))
        return part, read, part[1].nbytes + part[2].nbytes + 8 * want.size

    def _verify(self, start: int, stop: int, got: dict) -> None:
        """Check the arrays of a read of rows ``start:stop`` against the digests of every
        block the read covers whole (parts of blocks are bounds-checked only), once per
        block and dataset for this handle (:meth:`verify` checks every block again)."""
        if self._hashes is None or stop <= start:
            return
        off = self.block_offsets
        b0 = int(np.searchsorted(off, start, side="left"))
        b1 = int(np.searchsorted(off, stop, side="right")) - 1
        ip = got.get("indptr")
        checked = self._checked
        for b in range(b0, b1):
            lo, hi = int(off[b]) - start, int(off[b + 1]) - start
            for k, name in enumerate(HASHED[self.layout]):
                if name not in got or checked[b, k]:
                    continue
                if name == "indptr":
                    part = ip[lo:hi + 1]
                elif name in ("indices", "data"):
                    part = got[name][int(ip[lo] - ip[0]):int(ip[hi] - ip[0])]
                else:
                    part = got[name][lo:hi]
                if digest(part) != int(self._hashes[b, k]):
                    raise StoreFormatError(f"{self.path}: block {b} of {DATA_FILE} fails its "
                                           f"checksum ({name}): the file is damaged.", REBUILD_HINT)
                checked[b, k] = True

    @property
    def has_digests(self) -> bool:
        """Whether the blocks carry digests (stores written before them do not)."""
        return self._hashes is not None

    def verify(self, progress=None) -> list[str]:
        """Read every block and check it (digests where the store has them, see
        :attr:`has_digests`; row pointers, column indices, labels of a binary store); returns
        what is wrong, one line each (empty: the store is whole). The digests are checked
        again, read before by this handle or not."""
        self._check_open()
        if self._hashes is not None:
            self._checked[:] = False
        problems = []
        for b in range(self.n_blocks):
            lo, hi = int(self.block_offsets[b]), int(self.block_offsets[b + 1])
            try:
                X, y, _ = self.read_range(lo, hi)
                self.sqnorms(lo, hi)
                if self.stored_task == "binary" and y.size and not np.all(np.abs(y) == 1):
                    problems.append(f"{self.path}: block {b} holds labels other than -1/+1.")
            except StoreFormatError as exc:
                problems.append(exc.message)
            if progress is not None:
                progress(b)
        return problems

    def sqnorms(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        self._check_open()
        stop = self.n_samples if stop is None else stop
        out = self._file["sqnorm"][start:stop]
        self._verify(start, stop, {"sqnorm": out})
        return out

    def labels(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        self._check_open()
        return self.labels_out(self._file["y"][start:self.n_samples if stop is None else stop])

    def row_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        self._check_open()
        return self._file["row_id"][start:self.n_samples if stop is None else stop]

    def load_all(self):
        """All rows in memory as ``(X, y, row_ids)``, reserving their size from the budget."""
        need = self.estimated_bytes()
        self.budget.reserve(need, f"whole store {self.path.name} in memory")
        try:
            return self.read_range(0, self.n_samples)
        finally:
            self.budget.release(need)

    def estimated_bytes(self, rows: int | None = None) -> int:
        """Bytes that ``rows`` rows (default all) take in memory in this layout."""
        rows = self.n_samples if rows is None else int(rows)
        per_row = 12 + (4 * self.n_features if self.layout == "dense"
                        else 8 + 8 * self.nnz / max(1, self.n_samples))
        return int(per_row * rows)

    @property
    def has_index(self) -> bool:
        return (self.path / INDEX_DIR).exists()

    def require_index(self) -> None:
        """Raise :class:`IndexStateError`, naming the command that builds it, when the store
        has no metric-forest index. The store does not open its index (the index is the layer
        above it): :func:`ooc_learn.index.open_forest` does.

        >>> store.require_index()                                 # doctest: +SKIP
        >>> forest = ooc_learn.index.open_forest(store)           # doctest: +SKIP
        """
        self._check_open()
        if not self.has_index:
            raise IndexStateError(f"The store {self.path} has no metric-forest index.",
                                  f"Build it with: ooc-index {self.path} (in Python, "
                                  "ingest with build_index=True, or train with "
                                  "solver='dcd', which needs none).")


class _ChunkBuffer:
    """The float32 buffer a pass's chunks are decoded into (:meth:`Store.iter_chunks`'s
    ``reuse``), reserved from the budget while it lives; made again (shrinking as a chunk's
    reservation does) only when a chunk wants more rows than it holds."""

    def __init__(self, store: Store):
        self.store, self.X, self.held = store, None, 0

    def rows(self, k: int) -> np.ndarray:
        """A buffer of ``k`` rows, or fewer where the cap holds fewer."""
        if self.X is not None and self.X.shape[0] >= k:
            return self.X[:k]
        self.release()
        st = self.store
        k = st.budget.reserve_shrinking(k, st.estimated_bytes, CHUNK_MIN_ROWS, "store chunk")
        self.held = st.estimated_bytes(k)
        self.X = np.empty((k, st.n_features), np.float32)
        return self.X

    def release(self) -> None:
        self.X = None
        self.store.budget.release(self.held)
        self.held = 0


def open_store(path, memory=None, *, positive=None, direct: bool | None = None) -> Store:
    """Open a finished store read-only. See :class:`Store`. ``positive``: read a multiclass
    store as that class against the rest (labels +1 / -1, task "binary")."""
    return Store(path, memory=memory, positive=positive, direct=direct)


#: OOC_DIRECT_IO, when ``direct`` is None: "auto" (the size rule), "1" / "on" or "0" / "off"
_DIRECT_IO = {"auto": None, "": None, "1": True, "on": True, "0": False, "off": False}


def _reads_direct(data: Path, direct: bool | None) -> bool:
    """Whether the large reads of ``data`` bypass the page cache (see :class:`Store`); where
    ``direct`` is None, the environment's ``OOC_DIRECT_IO`` may decide."""
    if direct is None:
        env = os.environ.get("OOC_DIRECT_IO", "auto").strip().lower()
        if env not in _DIRECT_IO:
            raise ParameterError(f"OOC_DIRECT_IO={os.environ['OOC_DIRECT_IO']!r} is not a "
                                 "setting of direct reads.",
                                 "Set it to auto (the default: direct where the store is "
                                 "larger than the memory left), on or off.")
        direct = _DIRECT_IO[env]
    if direct is not None:
        return bool(direct)
    from .measure import memory_headroom_bytes

    room = memory_headroom_bytes()
    return room is not None and data.stat().st_size > room


def open_data(data, memory=None) -> tuple[Store, bool]:
    """``(store, opened_here)`` for a Store or a store path; the caller closes what it opened."""
    if isinstance(data, Store):
        return data, False
    return open_store(data, memory=memory), True


