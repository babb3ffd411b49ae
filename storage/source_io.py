"""Opening an ingest source, and the chunk of rows every parser yields.

Shared by the text parsers (:mod:`.parsers`) and the array readers (:mod:`._array_sources`):
:class:`RawChunk`, :func:`open_binary` (gzip / bzip2 / xz found by their magic bytes), reading
a stream in full, the idx header test and the choice of a label column.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import os
import zlib
from dataclasses import dataclass

import numpy as np

from . import _parse_kernels as K
from .errors import IngestError

__all__ = ["RawChunk", "SourceFile", "open_binary", "read_full", "readinto_full",
           "INDEX_SENTINEL", "IDX_TYPES", "is_idx_head", "LABEL_NAMES", "label_index"]

INDEX_SENTINEL = int(K.INDEX_SENTINEL)
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


@dataclass
class RawChunk:
    """A bounded piece of consecutive source rows in CSR form.

    ``indices`` are raw: LIBSVM indices as written (not base-converted); CSV/npy/npz the 0-based
    position of the feature among the non-label columns. ``first_line`` and ``line_numbers``
    are 1-based lines of the decompressed text (1-based rows for .npy/.npz).
    ``min_index``/``max_index`` cover every feature token, explicit zeros included
    (``INDEX_SENTINEL`` / -1 when there is none).
    """

    labels: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    first_line: int
    line_numbers: np.ndarray | None
    min_index: int
    max_index: int
    n_columns: int | None
    bytes_read: int
    #: a CSV header's feature names and label name (the first chunk of such a source)
    feature_names: list | None = None
    label_name: str | None = None

    @property
    def n_rows(self) -> int:
        return int(self.labels.shape[0])


# ---------------------------------------------------------------------------------------------
# opening and decompressing


class SourceFile(io.BufferedIOBase):
    """A source opened for binary reading, decompressed when its magic bytes say so.

    Read errors of the compressed stream (truncated, corrupted) become :class:`IngestError`.
    :meth:`raw_tell` is the position in the file on disk, for progress reporting.
    """

    def __init__(self, path: str, raw, stream, compression: str | None):
        super().__init__()
        self.path, self.compression = path, compression
        self._raw, self._stream = raw, stream

    def readable(self) -> bool:
        return True

    @contextlib.contextmanager
    def _errors(self):
        try:
            yield
        except (EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
            what = f"{self.compression} stream" if self.compression else "file"
            tool = {"gzip": "gzip -t", "bzip2": "bzip2 -t", "xz": "xz -t"}.get(self.compression)
            check = f" (check it with '{tool} FILE')" if tool else ""
            raise IngestError(f"the {what} is truncated or corrupted: {exc}",
                              f"Re-download or re-create the file{check}.",
                              path=self.path) from exc

    def read(self, size: int | None = -1) -> bytes:
        with self._errors():
            return self._stream.read(-1 if size is None else size)

    def read1(self, size: int = -1) -> bytes:
        with self._errors():
            return self._stream.read1(size)

    def readinto(self, buffer) -> int:
        with self._errors():
            return self._stream.readinto(buffer)

    def raw_tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        if not self.closed:
            try:
                if self._stream is not self._raw:
                    self._stream.close()
            finally:
                self._raw.close()
                super().close()


def open_binary(path) -> SourceFile:
    """Open ``path`` for binary reading; gzip/bzip2/xz are decompressed (found by magic bytes).

    Raises :class:`IngestError` naming the path when it is missing or unreadable.

    >>> with open_binary("train.svm.xz") as f:                                # doctest: +SKIP
    ...     head = f.read(100)
    """
    p = os.fspath(path)
    try:
        raw = open(p, "rb")
        magic = raw.read(6)
        raw.seek(0)
    except FileNotFoundError:
        raise IngestError("the source file does not exist",
                          "Check the path and the working directory.", path=p) from None
    except IsADirectoryError:
        raise IngestError("the source is a directory, not a file",
                          "Pass the data files inside it, one per argument.", path=p) from None
    except PermissionError:
        raise IngestError("the source file cannot be read (permission denied)",
                          "Give the user running ingest read permission (chmod +r).",
                          path=p) from None
    except OSError as exc:
        raise IngestError(f"the source file cannot be opened: {exc.strerror or exc}",
                          "Check that the path names a readable regular file.", path=p) from None
    compression = next((name for m, name in _MAGIC.items() if magic.startswith(m)), None)
    if compression == "gzip":
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    elif compression == "bzip2":
        stream = bz2.BZ2File(raw, "rb")
    elif compression == "xz":
        stream = lzma.LZMAFile(raw, "rb")
    else:
        stream = raw
    return SourceFile(p, raw, stream, compression)


def read_full(f, n: int) -> bytearray:
    """Read ``n`` bytes unless the stream ends first (a writable buffer)."""
    buf = bytearray(n)
    with memoryview(buf) as view:
        got = readinto_full(f, view)
    del buf[got:]
    return buf


def readinto_full(f, view: memoryview) -> int:
    """Fill ``view`` unless the stream ends first; the number of bytes read."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


# idx (the MNIST / Fashion-MNIST format): two zero bytes, the element type, the number of
# dimensions, then each dimension as a big-endian uint32
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def is_idx_head(head: bytes) -> bool:
    """Whether ``head`` starts like an idx file."""
    return (len(head) >= 4 and head[:2] == b"\x00\x00" and head[2] in IDX_TYPES
            and 1 <= head[3] <= 4)


LABEL_NAMES = ("label", "y", "target", "class")


def label_index(path, label_column, names, n_fields: int) -> int:
    """The 0-based label column of rows of ``n_fields`` fields: ``label_column`` (a number,
    negative from the end, or a header name) or, when None, the header's label name
    (:data:`LABEL_NAMES`) else the first column."""
    if label_column is None:  # auto: a header's label name, else the first column
        named = [i for i, x in enumerate(names or ()) if x.strip().lower() in LABEL_NAMES]
        if len(named) > 1:
            cols = ", ".join(f"{names[i]!r} (column {i})" for i in named)
            raise IngestError(f"the header names more than one label column: {cols}",
                              f"Pick the label with --label-column NAME (label_column=), e.g. "
                              f"--label-column {names[named[0]]}.", path=os.fspath(path))
        if names and not named:  # a header that names no label: say which column is
            import warnings

            warnings.warn(f"{os.fspath(path)}: the header names no label column "
                          f"({', '.join(LABEL_NAMES)}); its first column, {names[0]!r}, is the "
                          f"label. If another is, pass --label-column NAME.", RuntimeWarning,
                          stacklevel=2)
        return named[0] if named else 0
    if isinstance(label_column, str):
        if names is None:
            raise IngestError(f"label_column={label_column!r} names a column, but the file has "
                              "no header line", "Pass the label column's number instead, or "
                              "--header (header=True) if the first line is a header.",
                              path=os.fspath(path))
        if label_column not in names:
            import difflib

            shown = names if len(names) <= 12 else names[:6] + ["..."] + names[-5:]
            near = difflib.get_close_matches(label_column, names, n=1)
            raise IngestError(f"no column named {label_column!r}; the header has "
                              f"{len(names)}: {', '.join(shown)}",
                              (f"Did you mean --label-column {near[0]}? " if near else "")
                              + "Pass one of the header's names or a column number.",
                              path=os.fspath(path))
        return names.index(label_column)
    col = int(label_column)
    if not -n_fields <= col < n_fields:
        raise IngestError(f"label_column={col} is out of range: the rows have {n_fields} "
                          "fields", f"Pass a column number in [-{n_fields}, {n_fields - 1}].",
                          path=os.fspath(path))
    return col % n_fields
