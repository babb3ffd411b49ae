"""Ingest sources into a block store under the memory cap.

The sources are read once and the store is written once where the write buffer holds them
(else once more through bucket files), or where they are arrays on disk read by row position
(:mod:`.ingest_direct`); the bucket path (see :mod:`shuffle`):

1. parse every source in chunks (numba parsers) and deal each chunk's rows straight into R0
   balanced random buckets (every bucket a stratified sample of the whole input, so blocks
   are iid shards even when the source is sorted by class), tracking n, nnz, feature indices
   and the label set; hash the sources on a side thread that keeps pace with the parser
   (:mod:`.ingest_parse`);
2. with n, d, the layout and the task decided, plan the R final blocks from the buckets
   (bucket b = block b when R0 = R, else whole buckets plus random shares of shared ones);
   a bucket larger than a block (R0 underestimated) is dealt again (:mod:`.ingest_plan`
   decides the shape, :mod:`.labels` the task);
3. load the buckets of one block at a time, order its rows (index-leaf order when the index
   is built, else a random permutation), and write it as block c of ``data.h5``
   (:mod:`.ingest_write`).

This module checks the parameters, runs the passes and holds :func:`ingest_arrays`.

Everything is written in a temporary sibling directory renamed into place at the end, so an
interrupted ingest (even SIGKILL) never leaves a store that opens, and a failed one leaves
nothing behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .budget import MemoryBudget
from .arrays import refuse_nonfinite
from .errors import IngestError, ParameterError
from .ingest_direct import ingest_direct, memmap_array_file, probe_array_files
from .ingest_parse import IOCount, parse_and_deal
from .ingest_plan import Shape, check_block_fits, dense_row_bytes
from .ingest_write import redeal, write_store
from .labels import decide_task
from .replace import check_store_target, remove_stale, replace_dir, temp_sibling
from .resources import peak_rss_bytes
from .sharded import ShardedStore
from .shuffle import MemoryBucket, balanced_sizes
from .stop import check_stop
from .store import Store
from .value_codes import WIDTHS, ValueCodesFull, next_width

__all__ = ["ingest", "ingest_arrays"]

log = logging.getLogger(__name__)

_FORMATS = ("auto", "libsvm", "csv", "npy", "npz", "idx")
_LAYOUTS = ("auto", "dense", "csr")
_TASKS = ("auto", "binary", "regression", "multiclass")


def _check_params(*, fmt, layout, task, n_blocks, block_rows, zero_based, n_features,
                  seed=0):
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
                        ("n_features", n_features, 1), ("seed", seed, 0)):
        if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)
                              or v < lo):
            bad(name, f"an integer >= {lo}", v)
    if zero_based not in ("auto", True, False):
        bad("zero_based", "'auto', True or False", zero_based)


def _source_names(sources) -> str:
    """The sources as a refusal names them: their paths (the first three), or "the arrays"."""
    paths = [str(s) for s in sources if isinstance(s, (str, os.PathLike))]
    if not paths:
        return "the arrays"
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def ingest(sources, out, *, format: str = "auto", layout: str = "auto", task: str = "auto",
           n_blocks: int | None = None, block_rows: int | None = None,
           n_features: int | None = None, positive_label=None, label_names=None,
           source_names: dict | None = None,
           label_column=None, delimiter: str | None = None, header: bool | None = None,
           zero_based="auto", block_orderer=None, seed: int = 0, memory=None,
           overwrite: bool = False, progress: bool = False, shards: int | None = None,
           value_codes: str | None = "auto",
           _chunks=None, _chunks_total: int = 0, _files=None) -> Store | ShardedStore:
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
    value_codes : "auto" | "uint8" | "uint16" | None
        How a dense X is stored (:mod:`~ooc_learn.storage.value_codes`): "auto" as 1- or
        2-byte codes of its distinct values where the first block shows few of them (a
        block bringing more than fit starts the ingest again with the next width, or
        float32: the sources are read once more then, and ``ingest_stats["restarts"]``
        says so); a width forces it (more distinct values than it holds raise
        :class:`IngestError`); None float32. The rows read back are the same float32
        values either way.

    Returns
    -------
    Store or ShardedStore
        The new store, opened with the same budget (of a sharded store, its manifest);
        ``store.ingest_stats`` holds ``seconds``,
        ``bytes_in`` (the sources' size), ``bytes_read`` (sources + buckets read back),
        ``bytes_written`` (buckets + the store with its index), ``store_bytes``,
        ``bucket_bytes``, ``buckets`` (how many pass 1 dealt into), ``direct_passes`` (the
        passes of a direct ingest, :mod:`~ooc_learn.storage.ingest_direct`; None for the
        buckets), ``io_read_bytes`` / ``io_write_bytes`` (this process's block I/O from
        ``/proc/self/io`` over the ingest, None where unavailable), ``peak_rss_bytes`` and
        ``pass_seconds`` (parse, redeal, write; direct: read, write).

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
                  block_rows=block_rows, zero_based=zero_based, n_features=n_features,
                  seed=seed)
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or not 1 <= shards <= 4096):
        raise ParameterError(f"The 'shards' parameter of ingest must be an int in 1..4096. "
                             f"Got {shards!r} instead.", "Pass e.g. --shards 4.")
    if value_codes not in ("auto", None, *WIDTHS):
        raise ParameterError(f"The 'value_codes' parameter of ingest must be 'auto', None or "
                             f"one of {', '.join(WIDTHS)}. Got {value_codes!r} instead.")
    budget = MemoryBudget.coerce(memory)
    if _chunks is None and not sources:
        raise ParameterError("ingest needs at least one source file.")
    # only a store is replaced, never a folder or file of the user's, nor one holding a source
    check_store_target(out, overwrite=overwrite, sources=sources)
    if _chunks is None:
        from .source_io import open_binary

        for s in sources:  # fail on a missing or unreadable file before any work
            open_binary(s).close()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = temp_sibling(out)
    tmp.mkdir()
    try:
        restarts = 0
        auto = value_codes == "auto"
        while True:
            try:
                stats = _ingest_into(
                    tmp, sources, budget=budget, fmt=format, layout=layout, task=task,
                    n_blocks=n_blocks, block_rows=block_rows, n_features=n_features,
                    positive_label=positive_label, label_names=label_names,
                    source_names=source_names or {}, label_column=label_column,
                    delimiter=delimiter, header=header, zero_based=zero_based,
                    block_orderer=block_orderer, seed=seed, progress=progress,
                    chunks=_chunks, chunks_total=_chunks_total, shards=shards, files=_files,
                    value_codes=value_codes)
                break
            except ValueCodesFull as exc:
                if not auto:
                    raise IngestError(
                        f"{_source_names(sources)}: the features hold {exc}, more than "
                        f"--value-codes {exc.width} can store.",
                        "Use --value-codes auto (or uint16, or none).") from None
                # the first block showed fewer distinct values than the data hold: again,
                # with wider codes or float32 (the sources are read once more)
                value_codes = next_width(exc.width) or None
                restarts += 1
                log.warning("ingest: %s; starting again with %s.", exc,
                            f"{value_codes} codes" if value_codes else "float32 values")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
        stats["restarts"] = restarts
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
    mapped = None if sp.issparse(X) else memmap_array_file(X, y)
    X = X if sp.issparse(X) else np.asarray(X)
    y = np.asarray(y).ravel()
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ParameterError(f"X must be 2-D with one row per label; got X {X.shape}, "
                             f"y {y.shape}.")
    if X.dtype.kind == "c" or y.dtype.kind == "c":  # float32 would drop the imaginary part
        raise ParameterError("X and y must be real; got complex values.",
                             "Pass the real part, or its parts as two features.")
    if y.dtype.kind == "O":
        missing = [i for i, v in enumerate(y.tolist()) if v is None
                   or (isinstance(v, float) and v != v)]
        if missing:  # a class named 'None' (or 'nan')
            raise ParameterError(f"Label {missing[0]} of y is missing (None or NaN), and "
                                 f"{len(missing)} in all.",
                                 "Drop the rows without a label.")
    if y.dtype.kind in "USO" and "label_names" not in kwargs:  # class names
        names, y = np.unique(y.astype(str), return_inverse=True)
        kwargs["label_names"] = [str(n) for n in names]
        y = y.astype(np.float64)
    chunk_rows = max(1, (4 << 20) // max(1, 4 * X.shape[1]))
    name = kwargs.pop("_source_name", "<arrays>")  # what the store's metadata calls them
    # a memory-mapped .npy (np.load(..., mmap_mode="r")) is read from its file by row
    # position, as ingest reads the file itself: never through its mapping whole
    return ingest([], out, _chunks=lambda: [(name, _array_chunks(X, y, chunk_rows, name))],
                  _chunks_total=X.shape[0],
                  _files=[mapped] if mapped else None,
                  **kwargs)


def _array_chunks(X, y, chunk_rows: int, name: str = "<arrays>"):
    """RawChunk-like chunks from in-memory arrays (for :func:`ingest_arrays`; ``name``: what
    a refusal calls them, the files' names where they came from files); ``bytes_read``
    counts rows, against ``_chunks_total`` = n."""
    from types import SimpleNamespace

    n = X.shape[0]
    for a in range(0, n, chunk_rows):
        b = min(n, a + chunk_rows)
        with np.errstate(over="ignore"):  # an overflow is infinite, named below
            Xc = sp.csr_matrix(X[a:b], dtype=np.float32)
        Xc.eliminate_zeros()
        Xc.sort_indices()
        # as the file sources refuse it: the store holds finite values
        refuse_nonfinite(Xc, X, row0=a, path=name)
        yield SimpleNamespace(
            labels=np.asarray(y[a:b], dtype=np.float64), indptr=Xc.indptr.astype(np.int64),
            indices=Xc.indices.astype(np.int64), values=Xc.data.astype(np.float32),
            first_line=a + 1, line_numbers=None, min_index=0, max_index=X.shape[1] - 1,
            n_columns=X.shape[1], bytes_read=b)


def _proc_io():
    """``(read_bytes, write_bytes)`` of this process so far (``/proc/self/io``), or None."""
    try:
        with open("/proc/self/io") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["read_bytes"]), int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _ingest_into(tmp: Path, sources, *, budget, fmt, layout, task, n_blocks, block_rows,
                 n_features, positive_label, label_names, source_names, label_column,
                 delimiter, header,
                 zero_based, block_orderer, seed, progress, chunks, chunks_total,
                 shards=None, files=None, value_codes="auto"):
    deal_ss, plan_ss = np.random.SeedSequence(seed).spawn(2)
    shape_kw = dict(layout=layout, n_features=n_features, zero_based=zero_based,
                    limit=budget.limit)
    buffer_bytes = max(1 << 16, budget.limit // 4)
    counter = IOCount()
    t0 = time.perf_counter()
    if files is None and chunks is None and not label_names:
        files = probe_array_files(sources, fmt, label_column)
    # arrays on disk the buffer does not hold (as buckets): read by row position, in group
    # passes (ingest_direct); None back where it declines
    if (files is not None and not label_names
            and sum(f.n * dense_row_bytes(f.n_features) for f in files) > buffer_bytes):
        done = ingest_direct(tmp, files, budget=budget, layout=layout, task=task,
                             n_blocks=n_blocks, block_rows=block_rows,
                             n_features=n_features, positive_label=positive_label,
                             source_names=source_names, block_orderer=block_orderer,
                             seed=seed, rng=np.random.default_rng(plan_ss),
                             counter=counter, progress=progress, shards=shards,
                             value_codes=value_codes)
        if done is not None:
            p, shape, task_, info = done
            took = time.perf_counter() - t0
            return _stats(tmp, p, shape, task_, counter, bucket_bytes=0, buckets=0,
                          redealt=0, pass_seconds={"read": info["read_seconds"],
                                                   "write": took - info["read_seconds"]},
                          direct=info)
    # the write buffer stays reserved while the buckets it holds stay in memory (a source
    # that fits it is never written to bucket files: read once, the store written once)
    budget.reserve(buffer_bytes, "bucket write buffer")
    held = buffer_bytes
    try:
        # ---- pass 1: parse and deal into buckets ----------------------------------------------
        p = parse_and_deal(tmp, sources, chunks, chunks_total, fmt=fmt, shards=shards,
                            label_names=label_names, source_names=source_names,
                            label_column=label_column, delimiter=delimiter, header=header,
                            zero_based=zero_based, n_blocks=n_blocks, block_rows=block_rows,
                            shape_kw=shape_kw, buffer_bytes=buffer_bytes,
                            rng=np.random.default_rng(deal_ss), counter=counter,
                            progress=progress)
        # ---- decide base, width, layout, task, blocks -----------------------------------------
        shape = Shape(p, n_blocks=n_blocks, block_rows=block_rows, check=True, **shape_kw)
        if shards:
            if p.n < shards:
                raise IngestError(f"{_source_names(sources)} hold {p.n} rows: too few for "
                                  f"{shards} shards (a shard needs a block of one row or "
                                  "more).", f"Use --shards {max(1, p.n)} or fewer.")
            # whole rounds of K blocks where the rows allow: every shard gets as many
            shape.n_blocks = min(p.n, shards * -(-shape.n_blocks // shards))
        task_, label_map, mapper = decide_task(p.tracker, task, positive_label,
                                                _source_names(sources), names=p.names)
        sizes = balanced_sizes(p.n, shape.n_blocks)  # the plan's, unless bucket b is block b
        block_need = check_block_fits(budget, int(sizes.max()), shape.bytes_per_row)
        t1 = time.perf_counter()
        buckets = [(p.buckets.bucket(b), int(r)) for b, r in enumerate(p.buckets.rows)]
        rng = np.random.default_rng(plan_ss)
        redealt = 0
        if len(buckets) != shape.n_blocks:
            buckets, redealt = redeal(tmp, buckets, int(sizes.max()), int(sizes.min()),
                                       buffer_bytes=buffer_bytes, rng=rng, counter=counter)
            if redealt:
                log.warning("ingest: %d of the buckets were larger than a block (the source "
                            "is larger than its first rows suggested) and were dealt again; "
                            "pass --blocks to deal into the final blocks at once.", redealt)
        # ---- pass 3: buckets -> blocks --------------------------------------------------------
        t2 = time.perf_counter()
        if not (p.buckets.in_memory and budget.try_reserve(block_need)):
            if p.buckets.in_memory:  # the block does not fit beside them: to their files
                before = p.buckets.bytes_written
                p.buckets.spill()
                counter.written += p.buckets.bytes_written - before
                buckets = [(q.path if isinstance(q, MemoryBucket) else q, r)
                           for q, r in buckets]
            budget.release(held)
            held = 0
            budget.reserve(block_need, "ingest block")
        held += block_need
        bucket_bytes = counter.written
        write_store(tmp, p, shape, buckets, task=task_, label_map=label_map, mapper=mapper,
                    seed=seed, positive_label=positive_label, n_features=n_features,
                    block_orderer=block_orderer, rng=rng, counter=counter, progress=progress,
                    shards=shards, value_codes=value_codes)
    finally:
        budget.release(held)
    shutil.rmtree(tmp / "buckets", ignore_errors=True)
    shutil.rmtree(tmp / "redeal", ignore_errors=True)
    pass_seconds = {"parse": t1 - t0, "redeal": t2 - t1, "write": time.perf_counter() - t2}
    return _stats(tmp, p, shape, task_, counter, bucket_bytes=bucket_bytes,
                  buckets=int(p.buckets.n_buckets), redealt=redealt, pass_seconds=pass_seconds,
                  direct=None)


def _stats(tmp, p, shape, task_, counter, *, bucket_bytes, buckets, redealt, pass_seconds,
           direct) -> dict:
    """The figures of an ingest (``store.ingest_stats``; see :func:`ingest`)."""
    store_bytes = _dir_bytes(tmp)
    log.debug("ingest passes (s): %s", pass_seconds)
    return {"n_samples": p.n, "n_features": shape.d, "n_blocks": shape.n_blocks,
            "layout": shape.layout, "task": task_, "nnz": int(p.nnz), "bytes_in": p.bytes_in,
            "bytes_read": counter.read, "bytes_written": counter.written + store_bytes,
            "store_bytes": store_bytes, "bucket_bytes": bucket_bytes, "buckets": buckets,
            "redealt_buckets": redealt, "pass_seconds": pass_seconds,
            "direct_passes": None if direct is None else direct["passes"]}
