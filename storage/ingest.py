"""Ingest sources into a block store under the memory cap.

Three passes, each streaming (see :mod:`shuffle`):

1. parse every source in chunks (numba parsers) and append the rows to a binary spill,
   tracking n, nnz, feature indices and the label set; hash the sources on a side thread;
2. deal the spilled rows into R balanced random buckets (blocks are iid shards even when
   the source is sorted by class);
3. load one bucket at a time, order its rows (index-leaf order when the index is built,
   else a random permutation), and write it as block b of ``data.h5``.

Everything is written in a temporary sibling directory renamed into place at the end, so an
interrupted ingest (even SIGKILL) never leaves a store that opens, and a failed one leaves
nothing behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .budget import MemoryBudget, format_size
from .errors import BudgetExceededError, IngestError, ParameterError, StoreExistsError
from .format import TMP_MARKER
from .resources import peak_rss_bytes
from .shuffle import BucketWriter, Spill, balanced_sizes, deal_chunk, read_bucket
from .store import Store, StoreWriter, row_sqnorms, swap_into_place

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


def _clean_stale(out: Path) -> None:
    """Remove temporary directories of earlier ingests into ``out`` whose process is gone."""
    prefix = f".{out.name}{TMP_MARKER}"
    if not out.parent.is_dir():
        return
    for p in out.parent.iterdir():
        if not p.name.startswith(prefix):
            continue
        pid = p.name[len(prefix):].split("-")[0]
        try:
            os.kill(int(pid), 0)
            alive = True
        except (ValueError, ProcessLookupError):
            alive = False
        except PermissionError:
            alive = True
        if not alive:
            shutil.rmtree(p, ignore_errors=True)


class _Hasher(threading.Thread):
    """sha256 and size of a source file, computed beside the parse (hashlib drops the GIL)."""

    def __init__(self, path: Path, buffer_bytes: int = 1 << 20):
        super().__init__(daemon=True)
        self.path, self.digest, self.size, self.error = path, None, 0, None
        self.buffer_bytes = buffer_bytes

    def run(self):
        try:
            h = hashlib.sha256()
            with open(self.path, "rb") as fh:
                while True:
                    buf = fh.read(self.buffer_bytes)
                    if not buf:
                        break
                    h.update(buf)
                    self.size += len(buf)
            self.digest = h.hexdigest()
        except OSError as exc:  # the parser reports unreadable files itself
            self.error = exc


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


def _decide_task(tracker: _LabelTracker, task: str, positive_label):
    """Return (task, label_map, mapper) where mapper turns raw labels into stored ones."""
    values = sorted(tracker.values)
    if positive_label is not None:
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


def _array_chunks(X, y, chunk_rows: int):
    """RawChunk-like chunks from in-memory arrays (for :func:`ingest_arrays`)."""
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
            n_columns=X.shape[1], bytes_read=0)


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
           n_features: int | None = None, positive_label: float | None = None,
           label_column=0, delimiter: str | None = None, header: bool | None = None,
           zero_based="auto", block_orderer=None, seed: int = 0, memory=None,
           overwrite: bool = False, progress: bool = False, _chunks=None) -> Store:
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
        20 values -> multiclass, else regression. ``positive_label`` makes any source binary
        (that label vs the rest).
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

    Returns
    -------
    Store
        The new store, opened with the same budget; ``store.ingest_stats`` holds ``seconds``,
        ``bytes_in``, ``peak_rss_bytes`` and ``pass_seconds`` (parse, shuffle, write).

    Examples
    --------
    >>> store = ingest(["train.svm.xz"], "train.store", memory="512M")   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [Path(s) for s in sources]
    out = Path(out)
    _check_params(fmt=format, layout=layout, task=task, n_blocks=n_blocks,
                  block_rows=block_rows, zero_based=zero_based, n_features=n_features)
    budget = MemoryBudget.coerce(memory)
    if _chunks is None and not sources:
        raise ParameterError("ingest needs at least one source file.")
    if out.exists() and not overwrite:
        raise StoreExistsError(f"The output {out} already exists.",
                               "Pass --overwrite to replace it, or choose another -o path.")
    if _chunks is None:
        from .parsers import open_binary

        for s in sources:  # fail on a missing or unreadable file before any work
            open_binary(s).close()
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out)
    tmp = out.parent / f".{out.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        stats = _ingest_into(tmp, sources, budget=budget, fmt=format, layout=layout,
                             task=task, n_blocks=n_blocks, block_rows=block_rows,
                             n_features=n_features, positive_label=positive_label,
                             label_column=label_column, delimiter=delimiter, header=header,
                             zero_based=zero_based, block_orderer=block_orderer,
                             seed=seed, progress=progress, chunks=_chunks)
        if out.exists() and not overwrite:  # appeared while we worked
            raise StoreExistsError(f"The output {out} already exists.",
                                   "Pass --overwrite to replace it.")
        swap_into_place(tmp, out, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    store = Store(out, memory=budget)
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
    chunk_rows = max(1, (4 << 20) // max(1, 4 * X.shape[1]))
    return ingest([], out, _chunks=lambda: [("<arrays>", _array_chunks(X, y, chunk_rows))],
                  **kwargs)


def _ingest_into(tmp: Path, sources, *, budget, fmt, layout, task, n_blocks, block_rows,
                 n_features, positive_label, label_column, delimiter, header, zero_based,
                 block_orderer, seed, progress, chunks):
    from tqdm.auto import tqdm

    spill = Spill(tmp / "spill")
    tracker = _LabelTracker()
    min_index, max_index, n_columns = np.iinfo(np.int64).max, -1, None
    formats_seen = set()
    src_meta = []
    hashers = []
    bytes_in = 0
    # the parser holds about 6x its text chunk (buffer, carry, output arrays)
    chunk_bytes = int(min(16 << 20, max(64 << 10, budget.limit // 32)))

    # ---- pass 1: parse and spill ------------------------------------------------------
    t_pass = time.perf_counter()
    if chunks is None:
        from .parsers import detect_format, iter_chunks

        total = sum(s.stat().st_size for s in sources)

        def source_iter():
            for s in sources:
                f = detect_format(s) if fmt == "auto" else fmt
                formats_seen.add(f)
                yield str(s), iter_chunks(s, f, chunk_bytes=chunk_bytes,
                                          label_column=label_column, delimiter=delimiter,
                                          header=header)
        it = source_iter()
    else:
        total = 0
        it = iter(chunks())
        formats_seen.add("arrays")
    bar = tqdm(total=total or None, unit="B", unit_scale=True, desc="parse", disable=not progress,
               leave=False)
    for name, chunk_iter in it:
        if chunks is None:
            h = _Hasher(Path(name), chunk_bytes)
            h.start()
            hashers.append(h)
        rows_before = spill.n_rows
        done_before = 0
        for ch in chunk_iter:
            _check_finite_labels(ch.labels, name, ch)
            if zero_based is False and ch.min_index == 0 and "libsvm" in formats_seen:
                raise IngestError("Feature index 0 found but zero_based=False.",
                                  "Drop --one-based (indices are 0-based).", path=name,
                                  line=ch.first_line)
            spill.append(ch.labels, ch.indptr, ch.indices, ch.values)
            tracker.add(ch.labels)
            min_index = min(min_index, int(ch.min_index))
            max_index = max(max_index, int(ch.max_index))
            if ch.n_columns is not None:
                if n_columns is not None and ch.n_columns != n_columns:
                    raise IngestError(
                        f"This source has {ch.n_columns} feature columns but the earlier "
                        f"ones have {n_columns}.",
                        "All sources of one store must have the same columns.", path=name)
                n_columns = ch.n_columns
            bar.update(max(0, ch.bytes_read - done_before))
            done_before = ch.bytes_read
        if spill.n_rows == rows_before and chunks is None:
            raise IngestError("The source contains no data rows.",
                              "Check that the file is not empty and is in a supported "
                              "format (LIBSVM, CSV, .npy/.npz).", path=name)
        src_meta.append({"name": Path(name).name, "path": str(Path(name).resolve())
                         if chunks is None else name, "rows": spill.n_rows - rows_before})
    bar.close()
    spill.close_writing()
    n, nnz = spill.n_rows, spill.nnz
    if n == 0:
        raise IngestError("The sources contain no data rows.", "Check the input files.")
    for h, meta in zip(hashers, src_meta):
        h.join()
        meta.update(sha256=h.digest, bytes=h.size)
        bytes_in += h.size

    # ---- decide base, width, layout, task ----------------------------------------------
    textual = "libsvm" in formats_seen
    base = 0
    if textual:
        base = 0 if (zero_based is True or min_index == 0) else 1
        if zero_based is False:
            base = 1
    d_data = max(max_index + 1 - base, n_columns or 0, 0)
    d = d_data if n_features is None else n_features
    if d < d_data:
        raise IngestError(f"The sources have {d_data} features but n_features={d} was given.",
                          f"Pass --n-features {d_data} or larger.")
    d = max(d, 1)
    density = nnz / float(n * d)
    lay = layout if layout != "auto" else ("dense" if density >= DENSE_THRESHOLD else "csr")
    task_, label_map, mapper = _decide_task(tracker, task, positive_label)

    bytes_per_row = (4 * d if lay == "dense" else 8 + 8 * nnz / n) + 24
    if block_rows is None and n_blocks is None:
        target = min(_DEFAULT_BLOCK_BYTES, budget.limit // 8)
        block_rows = max(1, int(target // bytes_per_row))
    if n_blocks is None:
        n_blocks = max(1, -(-n // block_rows))
    n_blocks = min(n_blocks, n)
    sizes = balanced_sizes(n, n_blocks)
    block_need = int(sizes.max() * bytes_per_row * 3)
    if block_need > budget.limit:
        raise BudgetExceededError(
            f"A block of {int(sizes.max())} rows needs about {format_size(block_need)} to "
            f"ingest but the memory cap is {format_size(budget.limit)}.",
            f"Raise --memory or lower --block-rows (or raise --blocks).")
    offsets = np.zeros(n_blocks + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])

    # ---- pass 2: deal rows into balanced random buckets ---------------------------------
    t_parse = time.perf_counter() - t_pass
    t_pass = time.perf_counter()
    rng = np.random.default_rng(seed)
    buckets = BucketWriter(tmp / "buckets", n_blocks, buffer_bytes=budget.limit // 4)
    remaining = sizes.copy()
    chunk_rows = max(1024, int(chunk_bytes // max(1.0, 8 + 8 * nnz / n + 16)))
    done = 0
    with tqdm(total=n, unit="row", desc="shuffle", disable=not progress, leave=False) as bar:
        for labels, indptr, indices, values in spill.iter_rows(chunk_rows):
            m = len(labels)
            lab = deal_chunk(remaining, m, rng)
            buckets.add(lab, labels, np.arange(done, done + m, dtype=np.int64), indptr,
                        indices, values)
            done += m
            bar.update(m)
    buckets.flush()
    spill.remove()

    # ---- pass 3: one bucket -> one block -----------------------------------------------
    t_shuffle = time.perf_counter() - t_pass
    t_pass = time.perf_counter()
    metadata = {
        "label_map": label_map, "sources": src_meta, "formats": sorted(formats_seen),
        "zero_based": base == 0, "nnz": int(nnz), "density": density,
        "params": {"n_blocks": int(n_blocks), "seed": int(seed), "layout": lay,
                   "task": task_, "positive_label": positive_label,
                   "n_features": n_features},
    }
    writer = StoreWriter(tmp, n_samples=n, n_features=d, nnz=nnz, layout=lay,
                         block_offsets=offsets, task=task_, metadata=metadata)
    forest = None
    if block_orderer is not None:
        forest = block_orderer(tmp, n_blocks=n_blocks, n_samples=n, n_features=d, seed=seed)
    try:
        with tqdm(total=n_blocks, unit="block", desc="write", disable=not progress,
                  leave=False) as bar:
            for b in range(n_blocks):
                labels, row_ids, indptr, indices, values = read_bucket(buckets.path(b))
                buckets.path(b).unlink()
                if base:
                    indices = indices - np.int32(base)
                X = sp.csr_matrix((values, indices, indptr), shape=(len(labels), d))
                if lay == "dense":
                    X = X.toarray()
                y = mapper(labels).astype(np.float32)
                sq = row_sqnorms(X)
                if forest is not None:
                    perm = forest.order(b, int(offsets[b]), X, sq)
                else:
                    perm = rng.permutation(len(labels))
                writer.write_block(b, X[perm], y[perm], row_ids[perm], sq[perm])
                bar.update(1)
        if forest is not None:
            forest.close()
            forest = None
        writer.finish()
    except BaseException:
        writer.abort()
        if forest is not None and hasattr(forest, "abort"):
            forest.abort()
        raise
    shutil.rmtree(tmp / "buckets", ignore_errors=True)
    shutil.rmtree(tmp / "spill", ignore_errors=True)
    pass_seconds = {"parse": t_parse, "shuffle": t_shuffle, "write": time.perf_counter() - t_pass}
    log.debug("ingest passes (s): %s", pass_seconds)
    return {"n_samples": n, "n_features": d, "n_blocks": n_blocks, "layout": lay,
            "task": task_, "nnz": int(nnz), "bytes_in": bytes_in, "pass_seconds": pass_seconds}
