"""Ingest sources into a block store under the memory cap.

The sources are read once and the store is written once (see :mod:`shuffle`):

1. parse every source in chunks (numba parsers) and deal each chunk's rows straight into R0
   balanced random buckets (every bucket a stratified sample of the whole input, so blocks
   are iid shards even when the source is sorted by class), tracking n, nnz, feature indices
   and the label set; hash the sources on a side thread that keeps pace with the parser;
2. with n, d, the layout and the task decided, plan the R final blocks from the buckets
   (bucket b = block b when R0 = R, else whole buckets plus random shares of shared ones);
   a bucket larger than a block (R0 underestimated) is dealt again;
3. load the buckets of one block at a time, order its rows (index-leaf order when the index
   is built, else a random permutation), and write it as block c of ``data.h5``.

Everything is written in a temporary sibling directory renamed into place at the end, so an
interrupted ingest (even SIGKILL) never leaves a store that opens, and a failed one leaves
nothing behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .budget import MemoryBudget, format_size
from .errors import BudgetExceededError, IngestError, ParameterError
from .replace import check_store_target, remove_stale, replace_dir, temp_sibling
from .resources import check_stop, peak_rss_bytes
from .shuffle import (BucketWriter, Dealer, balanced_sizes, deal_chunk, iter_records, read_bucket,
                      plan_blocks)
from .sharded import ShardedStore, shard_name, write_manifest
from .store import Store, StoreWriter, row_sqnorms

__all__ = ["ingest", "ingest_arrays", "DENSE_THRESHOLD", "MULTICLASS_MAX_CLASSES"]

log = logging.getLogger(__name__)

#: auto layout is dense when at least this share of entries is non-zero
DENSE_THRESHOLD = 0.4
#: auto task: integer labels with at most this many distinct values are classes
MULTICLASS_MAX_CLASSES = 20
#: the most distinct label values tracked before a source is taken as regression
_MAX_TRACKED_LABELS = 4096
#: default target size of one block in memory
_DEFAULT_BLOCK_BYTES = 64 << 20
#: the most buckets pass 1 deals into without --blocks (each is a file, appended per flush)
_MAX_BUCKETS = 1 << 15
#: headroom of the bucket count over the estimated block count for binary array sources
BINARY_HEADROOM = 1.25

_FORMATS = ("auto", "libsvm", "csv", "npy", "npz")
_LAYOUTS = ("auto", "dense", "csr")
_TASKS = ("auto", "binary", "regression", "multiclass")


def _check_params(*, fmt, layout, task, n_blocks, block_rows, zero_based, n_features):
    def bad(name, cond, got):
        raise ParameterError(f"The '{name}' parameter of ingest must be {cond}. "
                             f"Got {got!r} instead.")

    if fmt not in _FORMATS:
        bad("format", f"one of {', '.join(_FORMATS)}", fmt)
    if layout not in _LAYOUTS:
        bad("layout", f"one of {', '.join(_LAYOUTS)}", layout)
    if task not in _TASKS:
        bad("task", f"one of {', '.join(_TASKS)}", task)
    if n_blocks is not None and block_rows is not None:
        raise ParameterError("Give either 'n_blocks' (--blocks) or 'block_rows' (--block-rows), "
                             "not both.")
    for name, v, lo in (("n_blocks", n_blocks, 1), ("block_rows", block_rows, 1),
                        ("n_features", n_features, 1)):
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)
                              or v < lo):
            bad(name, f"an integer >= {lo}", v)
    if zero_based not in ("auto", True, False):
        bad("zero_based", "'auto', True or False", zero_based)


class _Hasher(threading.Thread):
    """sha256 and size of a source file, computed beside the parse (hashlib drops the GIL).

    It reads the file a second time, so it is kept within ``window`` bytes of the parser's
    position (:meth:`advance`), both ways: the pages one of them reads are still in the page
    cache when the other gets there, and the disk delivers the source once even when the
    cache is small (a memory cgroup charges it).
    """

    def __init__(self, path: Path, buffer_bytes: int = 1 << 20, window: int = 64 << 20):
        super().__init__(daemon=True)
        self.path, self.digest, self.size, self.error = path, None, 0, None
        self.buffer_bytes = buffer_bytes
        self.window = max(int(window), 2 * buffer_bytes)
        self._parsed = 0
        self._done = False
        self._cond = threading.Condition()

    def run(self):
        try:
            h = hashlib.sha256()
            with open(self.path, "rb") as fh:
                while True:
                    with self._cond:
                        while not self._done and self.size > self._parsed + self.window:
                            self._cond.wait()
                        if self._done:  # stopped: the ingest failed
                            return
                    buf = fh.read(self.buffer_bytes)
                    if not buf:
                        break
                    h.update(buf)
                    with self._cond:
                        self.size += len(buf)
                        self._cond.notify_all()
            self.digest = h.hexdigest()
        except OSError as exc:  # the parser reports unreadable files itself
            self.error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def advance(self, position: int) -> None:
        """The parser has read the file up to ``position``; wait while the hash lags far."""
        with self._cond:
            self._parsed = max(self._parsed, int(position))
            self._cond.notify_all()
            while not self._done and self.size + self.window < self._parsed:
                self._cond.wait()

    def finish(self) -> None:
        """The parser is done with the file: let the hash run to its end and wait for it."""
        self.advance(1 << 62)
        self.join()

    def stop(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify_all()


class _LabelTracker:
    def __init__(self):
        self.values: set = set()
        self.overflow = False
        self.integral = True

    def add(self, labels: np.ndarray) -> None:
        if labels.size == 0:
            return
        if self.integral and not np.all(labels == np.round(labels)):
            self.integral = False
        if not self.overflow:
            self.values.update(np.unique(labels).tolist())
            if len(self.values) > _MAX_TRACKED_LABELS:
                self.overflow = True
                self.values = set()


def _source_names(sources) -> str:
    """The sources as a refusal names them: their paths (the first three), or "the arrays"."""
    paths = [str(s) for s in sources if isinstance(s, (str, os.PathLike))]
    if not paths:
        return "the arrays"
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _decide_task(tracker: _LabelTracker, task: str, positive_label, where: str = "the sources",
                 names=None):
    """Return (task, label_map, mapper) where mapper turns raw labels into stored ones.
    ``where`` names the sources in a refusal; ``names`` (a :class:`LabelNames`) the class
    names of text labels, whose codes the raw labels are."""
    if names is not None and len(names):
        return _decide_named(names, task, positive_label, where)
    values = sorted(tracker.values)
    if positive_label is not None:
        try:
            positive_label = float(positive_label)
        except (TypeError, ValueError):
            raise IngestError(f"--positive-label {positive_label} is not a label of "
                              f"{where}: its labels are numbers.",
                              "Pass one of the numeric labels.") from None
        if tracker.overflow or positive_label not in tracker.values:
            raise IngestError(
                f"--positive-label {positive_label:g} does not occur in the labels of the "
                f"sources (seen: {', '.join(f'{v:g}' for v in values[:10])}"
                f"{' ...' if len(values) > 10 else ''}).",
                "Pass a label that occurs in the data.")
        if task in ("auto", "binary"):
            pos = float(positive_label)
            rest = [v for v in values if v != pos]
            return ("binary", {"positive": pos, "negative": rest, "one_vs_rest": len(rest) > 1},
                    lambda lab: np.where(lab == pos, 1.0, -1.0))
    if task == "auto":
        if not tracker.overflow and len(values) == 2:
            task = "binary"
        elif not tracker.overflow and len(values) == 1 and values[0] in (-1.0, 1.0):
            task = "binary"
        elif (not tracker.overflow and tracker.integral
              and 2 < len(values) <= MULTICLASS_MAX_CLASSES):
            task = "multiclass"
        elif tracker.integral:
            # a class per value, or a count to predict: either is a guess (26 letters
            # became a regression target)
            many = (f"more than {_MAX_TRACKED_LABELS:,}" if tracker.overflow
                    else f"{len(values)}")
            raise IngestError(
                f"The labels of {where} are {many} distinct integers "
                f"({', '.join(f'{v:g}' for v in values[:8])}{' ...' if len(values) > 8 else ''}"
                f"): a class per value, or a number to predict?",
                f"Pass --task multiclass (one class per value; more than "
                f"{MULTICLASS_MAX_CLASSES} is fine when asked for) or --task regression.")
        else:
            task = "regression"
    if task == "binary":
        if tracker.overflow or len(values) > 2:
            raise IngestError(
                f"--task binary needs at most two distinct labels; the sources have "
                f"{'many' if tracker.overflow else len(values)}.",
                "Pick the positive class with --positive-label (one-vs-rest) or use "
                "--task multiclass / regression.")
        if len(values) == 1:
            pos = values[0] if values[0] in (-1.0, 1.0) else values[0]
            neg = -1.0 if pos == 1.0 else None
        else:
            neg, pos = values
        return ("binary", {"positive": pos, "negative": neg},
                lambda lab: np.where(lab == pos, 1.0, -1.0))
    if task == "multiclass":
        if tracker.overflow or not tracker.integral:
            raise IngestError("--task multiclass needs integer labels.",
                              "Use --task regression for real-valued targets.")
        return "multiclass", {"classes": values}, lambda lab: lab
    return "regression", {}, lambda lab: lab


def _decide_named(names, task: str, positive_label, where: str):
    """Text labels (class names): classes 0..k-1 in sorted name order (scikit-learn's
    ``classes_`` order); two names are binary, the later one +1; ``positive_label`` (a name)
    makes that class +1 against the rest. The label map keeps the names."""
    ordered = sorted(names.codes)
    remap = np.empty(len(ordered), np.float64)
    for rank, name in enumerate(ordered):
        remap[names.codes[name]] = rank
    k = len(ordered)
    if task == "regression":
        raise IngestError(f"The labels of {where} are class names ({', '.join(ordered[:5])}"
                          f"{' ...' if k > 5 else ''}), not numbers to predict.",
                          "Use --task auto, binary or multiclass.")
    if positive_label is not None:
        pos = str(positive_label)
        if pos not in names.codes:
            raise IngestError(f"--positive-label {pos} is not one of the class names of "
                              f"{where} ({', '.join(ordered[:10])}{' ...' if k > 10 else ''}).",
                              "Pass one of the class names.")
        rank = float(ordered.index(pos))
        return ("binary", {"positive": 1.0, "negative": 0.0, "names": ["rest", pos],
                           "one_vs_rest": True},
                lambda lab: np.where(remap[lab.astype(np.int64)] == rank, 1.0, -1.0))
    if task == "binary" or (task == "auto" and k <= 2):
        if k > 2:
            raise IngestError(f"--task binary needs at most two classes; {where} name {k}.",
                              "Use --task multiclass or --positive-label NAME.")
        return ("binary", {"positive": float(k - 1), "negative": 0.0 if k == 2 else None,
                           "names": ordered},
                lambda lab: np.where(remap[lab.astype(np.int64)] == k - 1, 1.0, -1.0))
    return ("multiclass", {"classes": [float(c) for c in range(k)], "names": ordered},
            lambda lab: remap[lab.astype(np.int64)])


def _array_chunks(X, y, chunk_rows: int):
    """RawChunk-like chunks from in-memory arrays (for :func:`ingest_arrays`); ``bytes_read``
    counts rows, against ``_chunks_total`` = n."""
    from types import SimpleNamespace

    n = X.shape[0]
    for a in range(0, n, chunk_rows):
        b = min(n, a + chunk_rows)
        Xc = sp.csr_matrix(X[a:b], dtype=np.float32)
        Xc.eliminate_zeros()
        Xc.sort_indices()
        yield SimpleNamespace(
            labels=np.asarray(y[a:b], dtype=np.float64), indptr=Xc.indptr.astype(np.int64),
            indices=Xc.indices.astype(np.int64), values=Xc.data.astype(np.float32),
            first_line=a + 1, line_numbers=None, min_index=0, max_index=X.shape[1] - 1,
            n_columns=X.shape[1], bytes_read=b)


def _check_finite_labels(labels, path, chunk):
    bad = ~np.isfinite(labels)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        line = None if chunk.line_numbers is None else int(chunk.line_numbers[i])
        raise IngestError("The label is not a finite number.",
                          "Remove or fix rows with NaN/Inf labels.", path=path, line=line,
                          token=str(labels[i]))


def ingest(sources, out, *, format: str = "auto", layout: str = "auto", task: str = "auto",
           n_blocks: int | None = None, block_rows: int | None = None,
           n_features: int | None = None, positive_label=None, label_names=None,
           source_names: dict | None = None,
           label_column=None, delimiter: str | None = None, header: bool | None = None,
           zero_based="auto", block_orderer=None, seed: int = 0, memory=None,
           overwrite: bool = False, progress: bool = False, shards: int | None = None,
           _chunks=None, _chunks_total: int = 0) -> Store | ShardedStore:
    """Ingest source files into a new store and return it opened.

    Parameters
    ----------
    sources : path or list of paths
        LIBSVM/svmlight, CSV or .npy/.npz files (``.gz``/``.bz2``/``.xz`` read transparently),
        concatenated in the order given (``row_id`` counts rows across them).
    out : path
        The store directory to create. Refused if it exists, unless ``overwrite``.
    layout : "auto" | "dense" | "csr"
        Auto picks dense when at least 40 % of the entries are non-zero.
    task : "auto" | "binary" | "regression" | "multiclass"
        Auto: two distinct labels -> binary (larger label -> +1), integer labels with at most
        20 values -> multiclass, real-valued labels -> regression; more than 20 distinct
        integers raise :class:`IngestError` (say "multiclass" or "regression").
        ``positive_label`` makes any source binary (that label vs the rest).
        Text labels (a CSV column of class names; string ``y`` of :func:`ingest_arrays`)
        are classes: codes 0..k-1 in sorted name order, the names kept in the label map.
    label_names : list of str, optional
        The class names the text labels must come from, in code order (the training store's
        ``label_map["names"]``, so that test data get the same codes); another is refused.
    source_names : dict, optional
        How the store's metadata names a source path (a copy of standard input: "<stdin>").
    n_blocks, block_rows : int, optional
        How many random blocks, or how many rows per block (default: blocks of about
        min(64 MiB, cap / 8) in memory).
    block_orderer : callable, optional
        ``block_orderer(directory, n_blocks=, n_samples=, n_features=, seed=)`` returning an
        object with ``order(b, row_offset, X, sqnorm) -> perm``, ``close()`` and ``abort()``;
        it decides the row order inside each block and may write files (the index) into the
        new store directory. ``ooc_learn.ingest`` passes the metric-forest builder here
        (storage does not import the index). Default: a random order.
    seed : int
        Seeds the shuffle and the index.
    memory : None, size or MemoryBudget
        The memory cap of the run.
    shards : int, optional
        Write a sharded store instead (:mod:`~ooc_learn.storage.sharded`): block c into the
        complete store ``out/shard-(c mod K)`` (its own index too), and ``out/shards.json``.
        The block count is rounded up to a multiple of K where the rows allow. The sources are
        read once; a CSR shard's entries are spooled once more (their count is known only
        when its blocks are written).

    Returns
    -------
    Store or ShardedStore
        The new store, opened with the same budget (of a sharded store, its manifest);
        ``store.ingest_stats`` holds ``seconds``,
        ``bytes_in`` (the sources' size), ``bytes_read`` (sources + buckets read back),
        ``bytes_written`` (buckets + the store with its index), ``store_bytes``,
        ``bucket_bytes``, ``buckets`` (how many pass 1 dealt into), ``io_read_bytes`` /
        ``io_write_bytes`` (this process's block I/O from ``/proc/self/io`` over the ingest,
        None where unavailable), ``peak_rss_bytes`` and ``pass_seconds`` (parse, redeal,
        write).

    Examples
    --------
    >>> store = ingest(["train.svm.xz"], "train.store", memory="512M")   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    io0 = _proc_io()
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    out = Path(out)
    _check_params(fmt=format, layout=layout, task=task, n_blocks=n_blocks,
                  block_rows=block_rows, zero_based=zero_based, n_features=n_features)
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or not 1 <= shards <= 4096):
        raise ParameterError(f"The 'shards' parameter of ingest must be an int in 1..4096. "
                             f"Got {shards!r} instead.", "Pass e.g. --shards 4.")
    budget = MemoryBudget.coerce(memory)
    if _chunks is None and not sources:
        raise ParameterError("ingest needs at least one source file.")
    # only a store is replaced, never a folder or file of the user's, nor one holding a source
    check_store_target(out, overwrite=overwrite, sources=sources)
    if _chunks is None:
        from .parsers import open_binary

        for s in sources:  # fail on a missing or unreadable file before any work
            open_binary(s).close()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        stats = _ingest_into(tmp, sources, budget=budget, fmt=format, layout=layout,
                             task=task, n_blocks=n_blocks, block_rows=block_rows,
                             n_features=n_features, positive_label=positive_label,
                             label_names=label_names, source_names=source_names or {},
                             label_column=label_column, delimiter=delimiter, header=header,
                             zero_based=zero_based, block_orderer=block_orderer,
                             seed=seed, progress=progress, chunks=_chunks,
                             chunks_total=_chunks_total, shards=shards)
        check_store_target(out, overwrite=overwrite, sources=sources)  # it may have appeared
        check_stop()  # the last point where a stop leaves the old store as it was
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    store = ShardedStore(out) if shards else Store(out, memory=budget)
    io1 = _proc_io()
    stats["io_read_bytes"] = None if io0 is None or io1 is None else io1[0] - io0[0]
    stats["io_write_bytes"] = None if io0 is None or io1 is None else io1[1] - io0[1]
    stats["seconds"] = time.perf_counter() - t0
    stats["peak_rss_bytes"] = peak_rss_bytes()
    store.ingest_stats = stats
    return store


def ingest_arrays(X, y, out, **kwargs) -> Store:
    """Ingest in-memory arrays (dense ndarray or scipy sparse ``X``, vector ``y``).

    Takes the same keyword arguments as :func:`ingest`.

    >>> import numpy as np
    >>> X = np.eye(4, dtype=np.float32); y = np.array([1, -1, 1, -1])
    >>> store = ingest_arrays(X, y, "/tmp/doc.store", overwrite=True)   # doctest: +SKIP
    """
    X = X if sp.issparse(X) else np.asarray(X)
    y = np.asarray(y).ravel()
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ParameterError(f"X must be 2-D with one row per label; got X {X.shape}, "
                             f"y {y.shape}.")
    if y.dtype.kind in "USO" and "label_names" not in kwargs:  # class names
        names, y = np.unique(y.astype(str), return_inverse=True)
        kwargs["label_names"] = [str(n) for n in names]
        y = y.astype(np.float64)
    chunk_rows = max(1, (4 << 20) // max(1, 4 * X.shape[1]))
    return ingest([], out, _chunks=lambda: [("<arrays>", _array_chunks(X, y, chunk_rows))],
                  _chunks_total=X.shape[0], **kwargs)


# ---- the three passes --------------------------------------------------------------------
def _proc_io():
    """``(read_bytes, write_bytes)`` of this process so far (``/proc/self/io``), or None."""
    try:
        with open("/proc/self/io") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["read_bytes"]), int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


class _IOCount:
    """Bytes ingest reads and writes itself: sources, buckets, the store."""

    def __init__(self):
        self.read = 0
        self.written = 0

    def add_read(self, nbytes: int) -> None:
        self.read += int(nbytes)


class _Parsed:
    """What pass 1 learns about the input while it parses and deals it."""

    def __init__(self):
        self.n = 0
        self.nnz = 0
        self.min_index = np.iinfo(np.int64).max
        self.max_index = -1
        self.n_columns = None
        self.formats: set = set()
        self.sources: list = []
        self.tracker = _LabelTracker()
        self.buckets: BucketWriter | None = None
        self.bytes_in = 0

    def add(self, ch, name) -> None:
        self.tracker.add(ch.labels)
        self.min_index = min(self.min_index, int(ch.min_index))
        self.max_index = max(self.max_index, int(ch.max_index))
        if ch.n_columns is not None:
            if self.n_columns is not None and ch.n_columns != self.n_columns:
                raise IngestError(
                    f"This source has {ch.n_columns} feature columns but the earlier "
                    f"ones have {self.n_columns}.",
                    "All sources of one store must have the same columns.", path=name)
            self.n_columns = ch.n_columns
        self.n += len(ch.labels)
        self.nnz += int(ch.indptr[-1])


class _Shape:
    """The store's shape, decided from the pass-1 figures (also estimated after one chunk)."""

    def __init__(self, p: _Parsed, *, layout, n_features, zero_based, n_blocks, block_rows,
                 limit, check: bool):
        base = 0
        if "libsvm" in p.formats:
            base = 0 if (zero_based is True or p.min_index == 0) else 1
            if zero_based is False:
                base = 1
        d_data = max(p.max_index + 1 - base, p.n_columns or 0, 0)
        d = d_data if n_features is None else n_features
        if check and d < d_data:
            raise IngestError(f"The sources have {d_data} features but n_features={d} was "
                              f"given.", f"Pass --n-features {d_data} or larger.")
        d = max(d, d_data, 1)
        n = max(p.n, 1)
        self.base, self.d = base, d
        self.density = p.nnz / float(n * d)
        self.layout = layout if layout != "auto" else (
            "dense" if self.density >= DENSE_THRESHOLD else "csr")
        self.bytes_per_row = (4 * d if self.layout == "dense" else 8 + 8 * p.nnz / n) + 24
        if block_rows is None and n_blocks is None:
            target = min(_DEFAULT_BLOCK_BYTES, limit // 8)
            block_rows = max(1, int(target // self.bytes_per_row))
        self.block_rows = block_rows
        if n_blocks is None:
            n_blocks = max(1, -(-p.n // block_rows))
        self.n_blocks = max(1, min(n_blocks, p.n))


def _deal_buckets(p: _Parsed, ch, total: int, *, n_blocks, block_rows, shape_kw) -> int:
    """How many buckets pass 1 deals into, decided at the first chunk ``ch``.

    ``--blocks R``: R. A first chunk that is the whole input: the final block count. Else
    the count estimated from the chunk (rows per source byte, bytes per stored row) times
    2 for headroom, rounded up to a power of two: pass 3 merges buckets into blocks at no
    cost, while a bucket larger than a block costs a re-deal (one more write and read of it).
    Binary arrays (.npy, .npz) have rows of one size, so only the density can surprise: 1.25
    for headroom, not rounded. Fewer buckets make larger records from the same buffer (a
    3.2 GB .npy at --memory 224M: 1024 buckets of ~10 KB records -> 764).
    """
    if n_blocks is not None:
        return int(n_blocks)
    est = _Shape(p, n_blocks=None, block_rows=block_rows, check=False, **shape_kw)
    if total and ch.bytes_read >= total:
        return est.n_blocks
    n_est = p.n * total / max(1, ch.bytes_read) if total else p.n
    want = n_est / est.block_rows
    if p.formats and p.formats <= {"npy", "npz"}:
        r0 = int(np.ceil(BINARY_HEADROOM * want))
    else:
        r0 = 1 << max(0, int(np.ceil(np.log2(max(1.0, 2 * want)))))
    return int(min(r0, _MAX_BUCKETS, 1 << int(np.ceil(np.log2(max(2.0, n_est))))))


def _parse_and_deal(tmp: Path, sources, chunks, chunks_total, *, fmt, label_names, shards,
                    source_names, label_column, delimiter, header, zero_based, n_blocks, block_rows,
                    shape_kw, buffer_bytes, rng, counter: _IOCount, progress) -> _Parsed:
    """Pass 1: parse every source and deal its rows into buckets as they come."""
    from tqdm.auto import tqdm

    from .parsers import LabelNames

    p = _Parsed()
    # text labels' class names, shared by the sources; given (test data): fixed
    p.names = LabelNames(label_names or (), fixed=label_names is not None)
    # the parser holds about 6x its text chunk (buffer, carry, output arrays)
    chunk_bytes = int(min(16 << 20, max(64 << 10, shape_kw["limit"] // 32)))
    if chunks is None:
        from .parsers import detect_format, iter_chunks

        total = sum(s.stat().st_size for s in sources)

        def source_iter():
            for s in sources:
                f = detect_format(s) if fmt == "auto" else fmt
                p.formats.add(f)
                yield str(s), iter_chunks(s, f, chunk_bytes=chunk_bytes,
                                          label_column=label_column, delimiter=delimiter,
                                          header=header, label_names=p.names)
        it = source_iter()
    else:
        total = int(chunks_total)
        it = iter(chunks())
        p.formats.add("arrays")
    dealer = None
    hashers = []
    bar = tqdm(total=(total if chunks is None else 0) or None, unit="B", unit_scale=True,
               desc="parse", disable=not progress, leave=False)
    try:
        for name, chunk_iter in it:
            h = None
            if chunks is None:
                h = _Hasher(Path(name), min(chunk_bytes, 4 << 20), window=4 * chunk_bytes)
                h.start()
                hashers.append(h)
            rows_before = p.n
            done_before = 0
            for ch in chunk_iter:
                check_stop()  # a safe point for SIGINT / SIGTERM
                _check_finite_labels(ch.labels, name, ch)
                if zero_based is False and ch.min_index == 0 and "libsvm" in p.formats:
                    raise IngestError(
                        "Feature index 0 found, but the indices were declared 1-based (by "
                        "--one-based, or by the training store of the model this file is "
                        "scored with).",
                        "Drop --one-based if the file is 0-based; a test file must use the "
                        "training file's index base.", path=name, line=ch.first_line)
                row0 = p.n
                p.add(ch, name)
                if dealer is None:
                    r0 = _deal_buckets(p, ch, total, n_blocks=n_blocks, block_rows=block_rows,
                                       shape_kw=shape_kw)
                    if shards:  # whole rounds of K: the blocks will be (see _ingest_into)
                        r0 = shards * -(-r0 // shards)
                    p.buckets = BucketWriter(tmp / "buckets", r0, buffer_bytes=buffer_bytes)
                    dealer = Dealer(r0, rng)
                m = p.n - row0
                p.buckets.add(dealer.deal(m), ch.labels, np.arange(row0, p.n, dtype=np.int64),
                              ch.indptr, ch.indices, ch.values)
                if h is not None:
                    h.advance(ch.bytes_read)
                    bar.update(max(0, ch.bytes_read - done_before))
                done_before = ch.bytes_read
            if p.n == rows_before and chunks is None:
                raise IngestError("The source contains no data rows.",
                                  "Check that the file is not empty and is in a supported "
                                  "format (LIBSVM, CSV, .npy/.npz).", path=name)
            shown = source_names.get(str(name))
            if shown is not None:  # ooc-ingest -: the copy of standard input is <stdin>
                p.sources.append({"name": shown, "path": shown})
            else:
                p.sources.append({"name": Path(name).name, "path": str(Path(name).resolve())
                                  if chunks is None else name})
            p.sources[-1]["rows"] = p.n - rows_before
            if h is not None:
                h.finish()
                p.sources[-1].update(sha256=h.digest, bytes=h.size)
                p.bytes_in += h.size
    finally:
        bar.close()
        for h in hashers:
            h.stop()
    if p.n == 0:
        raise IngestError("The sources contain no data rows.", "Check the input files.")
    p.buckets.close()
    counter.read += p.bytes_in
    counter.written += p.buckets.bytes_written
    return p


def _redeal(tmp: Path, buckets: list, max_rows: int, min_rows: int, *, buffer_bytes, rng,
            counter: _IOCount) -> tuple[list, int]:
    """Deal every bucket of more than ``max_rows`` rows into sub-buckets of at most
    ``min_rows`` (so no bucket spans more than two blocks); ``(buckets, how many)``."""
    out, redealt = [], 0
    for i, (path, rows) in enumerate(buckets):
        if rows <= max_rows:
            out.append((path, rows))
            continue
        k = -(-rows // min_rows)
        writer = BucketWriter(tmp / "redeal" / f"{i:06d}", k, buffer_bytes=buffer_bytes)
        dealer = Dealer(k, rng)
        for rec in iter_records(path, counter.add_read):
            indptr, indices, values = rec.csr()
            writer.add(dealer.deal(rec.n_rows), rec.labels, rec.row_ids, indptr, indices,
                       values)
        writer.close()
        path.unlink()
        counter.written += writer.bytes_written
        out.extend((writer.path(j), int(writer.rows[j])) for j in range(k))
        redealt += 1
    return out, redealt


def _load_bucket(path, rows: int, blocks, counts, pending: dict, *, shape: _Shape, rng,
                 counter: _IOCount, drop=None) -> None:
    """Read one bucket and hand its rows, in the store's layout, to the blocks of the plan
    (a random share to each when it is shared); ``drop(path)`` deletes the file (default:
    at once)."""
    labels, row_ids, X = read_bucket(path, shape.layout, shape.d, shape.base, counter.add_read)
    if labels.shape[0] != rows:  # pragma: no cover - the writer counted what it wrote
        raise OSError(f"bucket file {path} holds {labels.shape[0]} rows, expected {rows}")
    if len(blocks) == 1:
        pending.setdefault(int(blocks[0]), []).append((labels, row_ids, X))
    else:
        dest = deal_chunk(counts.copy(), rows, rng)
        for i in range(len(blocks)):
            sel = np.flatnonzero(dest == i)
            pending.setdefault(int(blocks[i]), []).append((labels[sel], row_ids[sel], X[sel]))
    (drop or Path.unlink)(path)


def _stack(parts, layout: str):
    labels = np.concatenate([q[0] for q in parts])
    row_ids = np.concatenate([q[1] for q in parts])
    if len(parts) == 1:
        X = parts[0][2]
    elif layout == "dense":
        X = np.concatenate([q[2] for q in parts])
    else:
        X = sp.vstack([q[2] for q in parts], format="csr")
    if layout == "csr":
        X.sort_indices()
    return labels, row_ids, X


def _write_blocks(writers, forests, buckets: list, plan, offsets, *, shape: _Shape, mapper,
                  rng, counter: _IOCount, progress) -> None:
    """Pass 3: build block after block from the buckets (each read once) and write them:
    block c to ``writers[c % K]`` as its block c // K (K = 1: the store's own block c),
    ordered by ``forests[c % K]`` (a random order without)."""
    K = len(writers)
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    starts = np.concatenate(([0], np.cumsum([r for _, r in buckets])))
    pending: dict = {}
    nxt = 0
    # read buckets are deleted by a side thread: freeing a bucket file's extents took 13 % of
    # pass 3 at --memory 224M (1024 files written interleaved), the GIL released meanwhile
    dropped = []
    with ThreadPoolExecutor(1) as unlinker, tqdm(
            total=len(offsets) - 1, unit="block", desc="write", disable=not progress,
            leave=False) as bar:

        def drop(path):
            dropped.append(unlinker.submit(path.unlink))

        for c in range(len(offsets) - 1):
            check_stop()  # a safe point for SIGINT / SIGTERM, one a block
            while nxt < len(buckets) and starts[nxt] < offsets[c + 1]:
                path, rows = buckets[nxt]
                if rows:
                    _load_bucket(path, rows, plan.bucket_blocks[nxt], plan.bucket_counts[nxt],
                                 pending, shape=shape, rng=rng, counter=counter, drop=drop)
                nxt += 1
            labels, row_ids, X = _stack(pending.pop(c), shape.layout)
            y = mapper(labels).astype(np.float32)
            sq = row_sqnorms(X)
            k, b = c % K, c // K
            if forests is not None:
                perm = forests[k].order(b, int(writers[k].block_offsets[b]), X, sq)
            else:
                perm = rng.permutation(len(labels))
            writers[k].write_block(b, X[perm], y[perm], row_ids[perm], sq[perm])
            del X
            bar.update(1)
    for f in dropped:
        f.result()  # an unlink that failed is an error like any other


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _check_block_fits(budget, rows: int, bytes_per_row: float) -> int:
    """Bytes pass 3 needs for a block of ``rows`` rows (x3 for the parts it is stacked from,
    or the remainder of a shared bucket, and its permuted copy); raises when the cap is
    smaller."""
    need = int(rows * bytes_per_row * 3)
    if need > budget.limit:
        raise BudgetExceededError(
            f"A block of {rows} rows needs about {format_size(need)} to "
            f"ingest but the memory cap is {format_size(budget.cap)}"
            + (f" ({format_size(budget.limit)} beyond the process's fixed part)."
               if budget.fixed else "."),
            f"Raise --memory to at least {format_size(budget.fixed + need, up=True)} "
            f"or lower --block-rows (or raise --blocks).")
    return need


def _write_store(tmp: Path, p: _Parsed, shape: _Shape, buckets: list, *, task, label_map,
                 mapper, seed, positive_label, n_features, block_orderer, rng, counter,
                 progress, shards: int | None = None) -> None:
    """Pass 3: plan the blocks from the buckets, write ``data.h5`` and the orderer's files;
    with ``shards`` K, block c goes to the store ``tmp/shard-(c mod K)`` instead, and the
    manifest is written last (see :mod:`~ooc_learn.storage.sharded`)."""
    plan = plan_blocks([r for _, r in buckets], shape.n_blocks)
    offsets = np.zeros(shape.n_blocks + 1, np.int64)
    np.cumsum(plan.block_sizes, out=offsets[1:])
    K = shards or 1
    metadata = {
        "label_map": label_map, "sources": p.sources, "formats": sorted(p.formats),
        "zero_based": shape.base == 0, "nnz": int(p.nnz), "density": shape.density,
        "params": {"n_blocks": int(shape.n_blocks), "seed": int(seed), "layout": shape.layout,
                   "task": task, "positive_label": positive_label,
                   "n_features": n_features},
    }
    targets, forests = [], []  # per shard (one without shards): its writer, its orderer
    try:
        for k in range(K):
            blocks = np.arange(k, shape.n_blocks, K)
            sizes = plan.block_sizes[blocks]
            local = np.zeros(blocks.size + 1, np.int64)
            np.cumsum(sizes, out=local[1:])
            where, meta, nnz = tmp, metadata, p.nnz
            if shards:
                where = tmp / shard_name(k)
                meta = dict(metadata, nnz=None,
                            shard={"index": k, "of": K, "blocks": blocks.tolist()},
                            params=dict(metadata["params"], n_blocks=int(blocks.size),
                                        shard=k, shards=K))
                nnz = None  # counted as the blocks come
            targets.append(StoreWriter(where, n_samples=int(local[-1]), n_features=shape.d,
                                       nnz=nnz, layout=shape.layout, block_offsets=local,
                                       task=task, metadata=meta))
            if block_orderer is not None:
                forests.append(block_orderer(where, n_blocks=int(blocks.size),
                                             n_samples=int(local[-1]), n_features=shape.d,
                                             seed=seed + k))
        _write_blocks(targets, forests or None, buckets, plan, offsets, shape=shape,
                      mapper=mapper, rng=rng, counter=counter, progress=progress)
        for forest in forests:
            forest.close()
        forests = []
        for writer in targets:
            writer.finish()
            counter.written += writer.spooled_bytes
            counter.read += writer.spooled_bytes
        if shards:
            listed = []
            for k, writer in enumerate(targets):
                with Store(writer.directory) as st:
                    listed.append({"path": shard_name(k), "n_samples": st.n_samples,
                                   "n_blocks": st.n_blocks, "nnz": st.nnz,
                                   "fingerprint": st.fingerprint()})
            write_manifest(tmp, listed, n_features=shape.d, task=task, layout=shape.layout,
                           label_map=label_map)
    except BaseException:
        for writer in targets:
            writer.abort()
        for forest in forests:
            if hasattr(forest, "abort"):
                forest.abort()
        raise


def _ingest_into(tmp: Path, sources, *, budget, fmt, layout, task, n_blocks, block_rows,
                 n_features, positive_label, label_names, source_names, label_column,
                 delimiter, header,
                 zero_based, block_orderer, seed, progress, chunks, chunks_total,
                 shards=None):
    deal_ss, plan_ss = np.random.SeedSequence(seed).spawn(2)
    shape_kw = dict(layout=layout, n_features=n_features, zero_based=zero_based,
                    limit=budget.limit)
    buffer_bytes = max(1 << 16, budget.limit // 4)
    counter = _IOCount()
    t0 = time.perf_counter()
    with budget.reservation(buffer_bytes, "bucket write buffer"):
        # ---- pass 1: parse and deal into buckets ------------------------------------------
        p = _parse_and_deal(tmp, sources, chunks, chunks_total, fmt=fmt, shards=shards,
                            label_names=label_names, source_names=source_names,
                            label_column=label_column, delimiter=delimiter, header=header,
                            zero_based=zero_based, n_blocks=n_blocks, block_rows=block_rows,
                            shape_kw=shape_kw, buffer_bytes=buffer_bytes,
                            rng=np.random.default_rng(deal_ss), counter=counter,
                            progress=progress)
        # ---- decide base, width, layout, task, blocks -------------------------------------
        shape = _Shape(p, n_blocks=n_blocks, block_rows=block_rows, check=True, **shape_kw)
        if shards:
            if p.n < shards:
                raise IngestError(f"{_source_names(sources)} hold {p.n} rows: too few for "
                                  f"{shards} shards (a shard needs a block of one row or "
                                  "more).", f"Use --shards {max(1, p.n)} or fewer.")
            # whole rounds of K blocks where the rows allow: every shard gets as many
            shape.n_blocks = min(p.n, shards * -(-shape.n_blocks // shards))
        task_, label_map, mapper = _decide_task(p.tracker, task, positive_label,
                                                _source_names(sources), names=p.names)
        sizes = balanced_sizes(p.n, shape.n_blocks)  # the plan's, unless bucket b is block b
        block_need = _check_block_fits(budget, int(sizes.max()), shape.bytes_per_row)
        t1 = time.perf_counter()
        buckets = [(p.buckets.path(b), int(r)) for b, r in enumerate(p.buckets.rows)]
        rng = np.random.default_rng(plan_ss)
        redealt = 0
        if len(buckets) != shape.n_blocks:
            buckets, redealt = _redeal(tmp, buckets, int(sizes.max()), int(sizes.min()),
                                       buffer_bytes=buffer_bytes, rng=rng, counter=counter)
            if redealt:
                log.warning("ingest: %d of the buckets were larger than a block (the source is "
                            "larger than its first rows suggested) and were dealt again; pass "
                            "--blocks to deal into the final blocks at once.", redealt)
    bucket_bytes = counter.written
    # ---- pass 3: buckets -> blocks ----------------------------------------------------------
    t2 = time.perf_counter()
    with budget.reservation(block_need, "ingest block"):
        _write_store(tmp, p, shape, buckets, task=task_, label_map=label_map, mapper=mapper,
                     seed=seed, positive_label=positive_label, n_features=n_features,
                     block_orderer=block_orderer, rng=rng, counter=counter, progress=progress,
                     shards=shards)
    shutil.rmtree(tmp / "buckets", ignore_errors=True)
    shutil.rmtree(tmp / "redeal", ignore_errors=True)
    store_bytes = _dir_bytes(tmp)
    pass_seconds = {"parse": t1 - t0, "redeal": t2 - t1, "write": time.perf_counter() - t2}
    log.debug("ingest passes (s): %s", pass_seconds)
    return {"n_samples": p.n, "n_features": shape.d, "n_blocks": shape.n_blocks,
            "layout": shape.layout, "task": task_, "nnz": int(p.nnz), "bytes_in": p.bytes_in,
            "bytes_read": counter.read, "bytes_written": counter.written + store_bytes,
            "store_bytes": store_bytes, "bucket_bytes": bucket_bytes,
            "buckets": int(p.buckets.n_buckets), "redealt_buckets": redealt,
            "pass_seconds": pass_seconds}
