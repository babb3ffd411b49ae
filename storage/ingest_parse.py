"""Pass 1 of ingest: parse every source and deal its rows into buckets as they come.

Each chunk the parsers yield (:func:`~ooc_learn.storage.parsers.iter_chunks`, or the chunks of
in-memory arrays) is checked, counted into a :class:`Parsed` (n, nnz, feature indices, the
label set) and dealt at once into R0 balanced random buckets (:mod:`~ooc_learn.storage.shuffle`;
R0 decided at the first chunk, :func:`~ooc_learn.storage.ingest_plan.deal_buckets`). A side
thread hashes each source file while the parser reads it, kept within a window of the parser's
position so the disk delivers the file once.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np

from .errors import IngestError
from .ingest_plan import deal_buckets
from .labels import LabelTracker
from .shuffle import BucketWriter, Dealer
from .sniff import first_difference
from .stop import check_stop

__all__ = ["Parsed", "IOCount", "parse_and_deal"]


class IOCount:
    """Bytes ingest reads and writes itself: sources, buckets, the store."""

    def __init__(self):
        self.read = 0
        self.written = 0

    def add_read(self, nbytes: int) -> None:
        self.read += int(nbytes)


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


class Parsed:
    """What pass 1 learns about the input while it parses and deals it."""

    def __init__(self):
        self.n = 0
        self.nnz = 0
        self.min_index = np.iinfo(np.int64).max
        self.max_index = -1
        self.n_columns = None
        self.formats: set = set()
        self.sources: list = []
        self.tracker = LabelTracker()
        self.buckets: BucketWriter | None = None
        self.bytes_in = 0
        self._names: dict = {}  # source -> its CSV header's feature names (None: none)
        self.label_name = None  # the first CSV header's name of its label column

    @property
    def feature_names(self) -> list | None:
        """The feature columns' names where every source is a CSV with the same header."""
        named = list(self._names.values())
        return named[0] if named and all(v is not None for v in named) else None

    def add(self, ch, name) -> None:
        if name not in self._names:  # a source's first chunk
            names = getattr(ch, "feature_names", None)
            for other, seen in self._names.items():
                if names is not None and seen is not None and names != seen:
                    at = first_difference(names, seen)
                    raise IngestError(
                        f"This source's header names other columns than {other}'s: column "
                        f"{at + 1} is {names[at]!r} here and {seen[at]!r} there.",
                        "Give every source of one store the same columns in the same order.",
                        path=name)
            self._names[name] = names
            if names is not None and self.label_name is None:
                self.label_name = getattr(ch, "label_name", None)
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


def _check_finite_labels(labels, path, chunk):
    bad = ~np.isfinite(labels)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        line = None if chunk.line_numbers is None else int(chunk.line_numbers[i])
        raise IngestError("The label is not a finite number.",
                          "Remove or fix rows with NaN/Inf labels.", path=path, line=line,
                          token=str(labels[i]))


def parse_and_deal(tmp: Path, sources, chunks, chunks_total, *, fmt, label_names, shards,
                    source_names, label_column, delimiter, header, zero_based, n_blocks, block_rows,
                    shape_kw, buffer_bytes, rng, counter: IOCount, progress) -> Parsed:
    """Pass 1: parse every source and deal its rows into buckets as they come."""
    from tqdm.auto import tqdm

    from .labels import LabelNames

    p = Parsed()
    # text labels' class names, shared by the sources; given (test data): fixed
    p.names = LabelNames(label_names or (), fixed=label_names is not None)
    # the parser holds about 6x its text chunk (buffer, carry, output arrays)
    chunk_bytes = int(min(16 << 20, max(64 << 10, shape_kw["limit"] // 32)))
    if chunks is None:
        from .parsers import detect_format, iter_chunks

        total = sum(s.stat().st_size for s in sources)
        formats = [detect_format(s) if fmt == "auto" else fmt for s in sources]
        for s, f in zip(sources, formats):
            if f != formats[0]:
                # a LIBSVM file's 1-based columns and +/-1 labels would be read into a CSV's
                # columns and class names without a word
                shown = source_names.get(str(s), s)
                first = source_names.get(str(sources[0]), sources[0])
                raise IngestError(
                    f"This source is {f}, but {first} is {formats[0]}: the sources of one "
                    "store must share a format.",
                    "Ingest each format into its own store, or convert one file to the "
                    "other's format first.", path=shown)

        def source_iter():
            for s, f in zip(sources, formats):
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
                    r0 = deal_buckets(p, ch, total, n_blocks=n_blocks, block_rows=block_rows,
                                       shape_kw=shape_kw)
                    if shards:  # whole rounds of K: the blocks will be (see ingest._ingest_into)
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
    p.buckets.close(in_memory=True)  # no files where its buffer held every row
    counter.read += p.bytes_in
    counter.written += p.buckets.bytes_written
    return p
