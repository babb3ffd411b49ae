"""Write a store: :class:`StoreWriter` fills a preallocated ``data.h5`` block by block, and
:func:`rewrite_block_order` rewrites one with each block's rows permuted (the index's leaf
order)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp

from .arrays import row_sqnorms
from .errors import ParameterError
from .format import CODED_VERSION, DATA_FILE, FORMAT_NAME, FORMAT_VERSION, META_FILE
from .integrity import HASHED, block_digests, digest
from .stop import check_stop
from .store import open_store
from .value_codes import WIDTHS, ValueCodes

__all__ = ["StoreWriter", "rewrite_block_order"]

_SPOOL_INDICES, _SPOOL_DATA = ".indices.spool", ".data.spool"
_SPOOL_PIECE = 1 << 21  # entries copied at a time (8 MiB of either array)


class StoreWriter:
    """Write ``data.h5`` of a new store, block after block.

    Datasets are preallocated with the final sizes (known after the shuffle's first pass) and
    use HDF5's contiguous layout: every block, leaf or row range is then one direct read.
    A store whose ``nnz`` is not known up front (``nnz=None``: a shard of a sharded ingest,
    whose blocks' entries are counted only as they are written) counts them; a CSR one spools
    its entries to two raw files beside ``data.h5`` and copies them in at :meth:`finish`
    (``spooled_bytes``: the bytes spooled, written once more and read back once).
    """

    def __init__(self, directory, *, n_samples: int, n_features: int, nnz: int, layout: str,
                 block_offsets, task: str, metadata: dict, value_codes="auto"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.n_samples, self.n_features = int(n_samples), int(n_features)
        self.nnz = None if nnz is None else int(nnz)
        self._spool = None
        self.spooled_bytes = 0
        self.layout, self.task, self.metadata = layout, task, metadata
        self.block_offsets = np.asarray(block_offsets, dtype=np.int64)
        self._next_block = 0
        self._labels_due: set = set()
        self._nnz_pos = 0
        self._hashes = np.zeros((len(self.block_offsets) - 1, len(HASHED[layout])), np.uint64)
        n, d = self.n_samples, self.n_features
        f = self._file = h5py.File(self.directory / DATA_FILE, "w", libver="latest",
                                       rdcc_nbytes=0)
        f.create_dataset("row_id", (n,), dtype=np.int64)
        f.create_dataset("sqnorm", (n,), dtype=np.float32)
        f.create_dataset("block_offsets", data=self.block_offsets)
        # a dense X: float32, or value codes (decided on the first block where "auto")
        self._codes = None
        self._codes_mode = value_codes if layout == "dense" else None
        if isinstance(value_codes, str) and value_codes in WIDTHS:
            self._codes = ValueCodes(value_codes)
        elif value_codes not in (None, "auto"):
            raise ParameterError(f"value_codes must be 'auto', None or one of "
                                 f"{', '.join(WIDTHS)}; got {value_codes!r}.")
        if layout == "dense":
            if value_codes is None:
                f.create_dataset("X", (n, d), dtype=np.float32)
        elif layout == "csr":
            f.create_dataset("indptr", (n + 1,), dtype=np.int64)
            if self.nnz is None:
                self._spool = (open(self.directory / _SPOOL_INDICES, "wb"),
                               open(self.directory / _SPOOL_DATA, "wb"))
            else:
                f.create_dataset("indices", (self.nnz,), dtype=np.int32)
                f.create_dataset("data", (self.nnz,), dtype=np.float32)
            f["indptr"][0:1] = 0
        else:  # pragma: no cover - callers validate
            raise ParameterError(f"Unknown layout {layout!r}.")

    def write_block(self, b: int, X, y, row_ids, sqnorm=None, nnz: int | None = None) -> None:
        """Write block ``b`` (blocks in order). ``X`` dense float32 or CSR with sorted indices;
        ``y`` None: the labels come later, by :meth:`set_labels`; ``nnz``: the non-zeros of a
        dense ``X`` where the caller has counted them."""
        if b != self._next_block:
            raise ValueError(f"blocks must be written in order: expected {self._next_block}, got {b}")
        start, stop = int(self.block_offsets[b]), int(self.block_offsets[b + 1])
        if X.shape[0] != stop - start:
            raise ValueError(f"block {b} has {X.shape[0]} rows, expected {stop - start}")
        f = self._file
        parts = {"row_id": np.asarray(row_ids, np.int64),
                 "sqnorm": np.asarray(row_sqnorms(X) if sqnorm is None else sqnorm, np.float32)}
        if y is not None:
            parts["y"] = np.asarray(y, dtype=self._label_dtype())
            self._labels()
        else:
            self._labels_due.add(b)
        if self.layout == "dense":
            parts["X"] = np.ascontiguousarray(X.toarray() if sp.issparse(X) else X,
                                              dtype=np.float32)
            if self.nnz is None:  # counted as the blocks come (a shard's)
                self._nnz_pos += int(np.count_nonzero(parts["X"]) if nnz is None else nnz)
            stored = self._dense_X(parts["X"])
        else:
            X = sp.csr_matrix(X) if not sp.issparse(X) else X
            a = self._nnz_pos
            nb = int(X.indptr[-1])
            parts["indptr"] = X.indptr.astype(np.int64) + a  # the block's rows' pointers
            parts["indices"] = X.indices.astype(np.int32, copy=False)
            parts["data"] = X.data.astype(np.float32, copy=False)
            if nb and self._spool is not None:
                parts["indices"].tofile(self._spool[0])
                parts["data"].tofile(self._spool[1])
            elif nb:
                f["indices"][a:a + nb] = parts["indices"]
                f["data"][a:a + nb] = parts["data"]
            f["indptr"][start + 1:stop + 1] = parts["indptr"][1:]
            self._nnz_pos = a + nb
        for name in ("y", "row_id", "sqnorm"):
            if name in parts:
                f[name][start:stop] = parts[name]
        if self.layout == "dense":
            f["X"][start:stop] = stored
        # a coded X's digest is of its float32 values, as the store reads them back
        self._hashes[b] = block_digests(parts, self.layout, missing=0)
        self._next_block += 1

    def _dense_X(self, X: np.ndarray) -> np.ndarray:
        """A dense block as stored: the codes of its values (the first block decides whether
        X has codes, and their width), or X itself. Raises ``ValueCodesFull`` where a block
        brings more distinct values than the codes hold."""
        coded = None
        if "X" not in self._file:
            if self._codes is None and self._codes_mode == "auto":
                self._codes, coded = ValueCodes.first_block(X)
            self._file.create_dataset("X", (self.n_samples, self.n_features),
                                      dtype=np.float32 if self._codes is None
                                      else self._codes.dtype)
        if self._codes is None:
            return X
        return self._codes.encode(X) if coded is None else coded

    @property
    def value_codes(self) -> str | None:
        """The width of X's value codes ("uint8", "uint16"), None for float32 (or before a
        first dense block decided)."""
        return None if self._codes is None else self._codes.width

    def set_labels(self, b: int, y) -> None:
        """The labels of block ``b``, written without them (in the block's written order)."""
        start, stop = int(self.block_offsets[b]), int(self.block_offsets[b + 1])
        y = np.asarray(y, dtype=self._label_dtype())
        if y.shape != (stop - start,):
            raise ValueError(f"block {b} has {stop - start} rows, got {y.shape[0]} labels")
        self._labels()[start:stop] = y
        self._hashes[b, HASHED[self.layout].index("y")] = digest(y)
        self._labels_due.discard(b)

    def _label_dtype(self):
        """float64 for a regression target (float32 rounded 1e8 + x to steps of 8: RMSE
        2.2 where 0.01 was right, without a word), float32 for class labels (exact)."""
        return np.float64 if self.task == "regression" else np.float32

    def _labels(self):
        """The ``y`` dataset, made at the first labels (the direct ingest learns the task,
        and so the labels' type, after its last pass)."""
        f = self._file
        if "y" not in f:
            f.create_dataset("y", (self.n_samples,), dtype=self._label_dtype())
        return f["y"]

    def finish(self) -> None:
        """Stamp the attributes, mark complete (last), close, and write ``meta.json``."""
        if self._next_block != len(self.block_offsets) - 1 or self._labels_due:
            raise ValueError("not every block was written, or not every block's labels")
        self._labels()  # a store of no rows
        f = self._file
        if self.layout == "dense" and "X" not in f:  # no block (no rows): float32
            f.create_dataset("X", (self.n_samples, self.n_features), dtype=np.float32)
        coded = self.layout == "dense" and self._codes is not None
        if coded:
            f.create_dataset("X_values", data=self._codes.table())
            f["X_values"].attrs["distinct"] = self._codes.n
            self.metadata["value_codes"] = {"width": self._codes.width,
                                            "distinct": self._codes.n}
        if self.nnz is None:  # a shard's entries, counted in write_block
            self.nnz = self.metadata["nnz"] = self._nnz_pos
        if self._spool is not None:
            self._copy_spool()
        # format 2: X holds value codes (a reader of format 1 refuses the store by name)
        attrs = {"format": FORMAT_NAME, "format_version": CODED_VERSION if coded
                 else FORMAT_VERSION,
                 "n_samples": self.n_samples, "n_features": self.n_features,
                 "nnz": self.nnz if self.layout == "csr" else self._dense_nnz(),
                 "n_blocks": len(self.block_offsets) - 1, "layout": self.layout,
                 "task": self.task}
        for k, v in attrs.items():
            f.attrs[k] = v
        f.attrs["metadata"] = json.dumps(self.metadata)
        f.create_dataset("block_hash", data=self._hashes)
        f["block_hash"].attrs["datasets"] = json.dumps(HASHED[self.layout])
        f.flush()
        f.attrs["complete"] = True
        f.close()
        meta = dict(attrs, metadata=self.metadata)
        with open(self.directory / META_FILE, "w") as fh:
            json.dump(meta, fh, indent=1)

    def _copy_spool(self) -> None:
        """The spooled entries into contiguous datasets, a bounded piece at a time."""
        for fh in self._spool:
            fh.close()
        self._spool = None
        nnz = self.nnz
        f = self._file
        for name, spool, dtype in (("indices", _SPOOL_INDICES, np.int32),
                                   ("data", _SPOOL_DATA, np.float32)):
            ds = f.create_dataset(name, (nnz,), dtype=dtype)
            path = self.directory / spool
            with open(path, "rb") as fh:
                for a in range(0, nnz, _SPOOL_PIECE):
                    piece = np.fromfile(fh, dtype=dtype, count=min(_SPOOL_PIECE, nnz - a))
                    ds[a:a + piece.shape[0]] = piece
            self.spooled_bytes += path.stat().st_size
            path.unlink()

    def _dense_nnz(self) -> int:
        return int(self.metadata.get("nnz", 0))

    def abort(self) -> None:
        try:
            self._file.close()
        except Exception:
            pass
        for fh in self._spool or ():
            fh.close()


def rewrite_block_order(store_path, perms, *, memory=None) -> None:
    """Rewrite ``data.h5`` with each block's rows permuted by a block-local permutation.

    ``perms(new_dir)`` returns an iterable of one permutation per block, in block order; it
    may be a generator that reads each block from the old store to compute its permutation and
    writes more files (the index) into ``new_dir``, the new store directory, as it goes. The
    new directory is written beside the old one and swapped in with one rename, so a crash
    leaves the old store intact.
    """
    from .replace import remove_stale, replace_dir, temp_sibling

    store_path = Path(store_path)
    remove_stale(store_path)
    with open_store(store_path, memory=memory) as old:
        tmp = temp_sibling(store_path, "rw")
        tmp.mkdir()
        try:
            w = StoreWriter(tmp, n_samples=old.n_samples, n_features=old.n_features,
                            nnz=old.nnz, layout=old.layout, block_offsets=old.block_offsets,
                            task=old.task, metadata=old.metadata,
                            value_codes=old.value_codes)
            for b, perm in enumerate(perms(tmp)):
                X, y, ids = old.read_range(old.block_offsets[b], old.block_offsets[b + 1])
                perm = np.asarray(perm, dtype=np.int64)
                w.write_block(b, X[perm], y[perm], ids[perm], old.sqnorms(
                    old.block_offsets[b], old.block_offsets[b + 1])[perm])
            w.finish()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        check_stop()  # the last point where a stop leaves the old store as it was
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, store_path)
