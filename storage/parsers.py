"""Streaming parsers for ingest sources: LIBSVM/svmlight, CSV, ``.npy`` and ``.npz``.

The ``.npy``/``.npz`` readers live in :mod:`_array_sources`. Every parser yields
:class:`RawChunk` s, bounded pieces of rows in CSR form, and never holds the
whole source. Text is read ``chunk_bytes`` of decompressed bytes at a time; the complete lines
of each piece are parsed by a numba kernel (``_parse_kernels``) over a ``uint8`` view into
output arrays sized beforehand by counting ``:`` / delimiters / newlines, and the partial last
line is carried over. Numbers agree bit for bit with Python's ``float(token)`` (labels, float64)
and with ``np.float32(float(token))`` (feature values); the few tokens the kernel cannot convert
exactly are converted here with ``float``.

Bad input raises :class:`~ooc_learn.storage.errors.IngestError` naming the file, the line, the
column and the token. ``column`` is 1-based: for LIBSVM the whitespace-separated token number
(the label is token 1), for CSV the field number (the label field counted), for ``.npy`` /
``.npz`` the column of the array (rows are named in the message).

Example
-------
>>> from ooc_learn.storage.parsers import iter_chunks                      # doctest: +SKIP
>>> for chunk in iter_chunks("train.svm.gz"):                               # doctest: +SKIP
...     print(chunk.first_line, chunk.labels.shape, chunk.indices.shape)
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import io
import lzma
import os
import re
import zlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from . import _parse_kernels as K
from .errors import IngestError, ParameterError

__all__ = ["RawChunk", "LabelNames", "open_binary", "detect_format", "iter_chunks", "FORMATS"]

FORMATS = ("auto", "libsvm", "csv", "npy", "npz", "idx")
INDEX_SENTINEL = int(K.INDEX_SENTINEL)
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 20
_SLOW_CAP = 1 << 12
_NAMES = {"libsvm": "LIBSVM", "csv": "CSV", "npy": ".npy", "npz": ".npz"}
_LIBSVM_TOKEN = re.compile(r"^(?:[+-]?\d+|qid):")


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


def _read_full(f, n: int) -> bytearray:
    """Read ``n`` bytes unless the stream ends first (a writable buffer)."""
    buf = bytearray(n)
    with memoryview(buf) as view:
        got = _readinto_full(f, view)
    del buf[got:]
    return buf


def _readinto_full(f, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


# ---------------------------------------------------------------------------------------------
# format detection


class LabelNames:
    """Class names of text labels (a CSV label column such as ``setosa``), each given a code
    0, 1, ... as it is first met; the parser stores the code as the row's label. ``fixed``:
    the names are given (the training store's, for test data) and another name is refused."""

    def __init__(self, names=(), *, fixed: bool = False):
        self.codes: dict[str, int] = {str(n): i for i, n in enumerate(names)}
        self.fixed = fixed

    @property
    def names(self) -> list[str]:
        return sorted(self.codes, key=self.codes.__getitem__)

    def __len__(self) -> int:
        return len(self.codes)

    def code(self, name: str) -> int | None:
        c = self.codes.get(name)
        if c is None and not self.fixed:
            c = self.codes[name] = len(self.codes)
        return c


def _label_text(raw: bytes) -> str:
    """A label token as a class name: spaces, a CR and one pair of quotes taken off."""
    text = raw.decode("utf-8", "replace").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _data_lines(head: bytearray, at_eof: bool) -> list[tuple[int, str]]:
    """The first non-blank, non-comment lines of ``head`` as ``(line number, text)``."""
    lines = head.split(b"\n")
    if not at_eof and len(lines) > 1:
        lines = lines[:-1]  # a cut last line; a single line longer than ``head`` is kept
    out = []
    for no, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", "replace").strip()
        if text and not text.startswith("#"):
            out.append((no, text))
            if len(out) == _SNIFF_LINES:
                break
    return out


def _read_head(path) -> tuple[bytearray, bool, SourceFile]:
    with open_binary(path) as f:
        head = _read_full(f, _SNIFF_BYTES)
        at_eof = len(head) < _SNIFF_BYTES
    head = head.removeprefix(b"\xef\xbb\xbf")
    return head, at_eof, f


def _empty_source(path) -> IngestError:
    return IngestError("the source has no data rows (it is empty or holds only comments and "
                       "blank lines)", "Check that the right file was given and that it was "
                       "written completely.", path=os.fspath(path))


# idx (the MNIST / Fashion-MNIST format): two zero bytes, the element type, the number of
# dimensions, then each dimension as a big-endian uint32
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def is_idx_head(head: bytes) -> bool:
    return (len(head) >= 4 and head[:2] == b"\x00\x00" and head[2] in IDX_TYPES
            and 1 <= head[3] <= 4)


def detect_format(path) -> str:
    """Return ``"libsvm"``, ``"csv"``, ``"npy"``, ``"npz"`` or ``"idx"`` for the source at
    ``path``.

    Binary formats are recognised by magic bytes (after decompression); text by its first
    data lines: ``index:value`` tokens mean LIBSVM, delimited fields mean CSV.

    >>> detect_format("train.svm.gz")                                         # doctest: +SKIP
    'libsvm'
    """
    head, at_eof, f = _read_head(path)
    if head.startswith(_NPY_MAGIC):
        return "npy"
    if is_idx_head(head):
        return "idx"
    if head.startswith(_ZIP_MAGIC):
        if f.compression:
            raise IngestError(f"the .npz archive is {f.compression}-compressed",
                              "Decompress it first: zip archives need random access.",
                              path=f.path)
        return "npz"
    if b"\x00" in head:
        raise IngestError("the source is not text (LIBSVM/CSV), .npy or .npz",
                          "Pass a LIBSVM, CSV, .npy or .npz file (optionally .gz/.bz2/.xz).",
                          path=f.path)
    lines = _data_lines(head, at_eof)
    if not lines:
        if len(head.strip()) == 0 or at_eof:
            raise _empty_source(path)
        raise IngestError("the first 64 KiB hold no data line, so the format cannot be "
                          "detected", "Pass fmt='libsvm' or fmt='csv' explicitly.", path=f.path)
    for _, text in lines:
        tokens = text.split("#", 1)[0].split()
        if any(_LIBSVM_TOKEN.match(t) for t in tokens):
            return "libsvm"
        if len(tokens) >= 2 or any(d in text for d in ",;\t"):
            return "csv"
    return "libsvm"  # only label-only rows: a LIBSVM file whose first rows have no features


# ---------------------------------------------------------------------------------------------
# the public iterator


def _check_params(fmt, chunk_bytes, label_column, delimiter, header, npz_keys) -> None:
    def bad(name, want, got):
        return ParameterError(f"The '{name}' parameter of iter_chunks must be {want}. "
                              f"Got {got!r} instead.", f"Pass {name}= as {want}.")
    if fmt not in FORMATS:
        raise bad("fmt", "one of " + ", ".join(map(repr, FORMATS)), fmt)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)) \
            or chunk_bytes < 1:
        raise bad("chunk_bytes", "an int >= 1", chunk_bytes)
    if label_column is not None and (isinstance(label_column, bool) or
                                     not isinstance(label_column, (int, np.integer, str))):
        raise bad("label_column", "None, an int or a column name", label_column)
    if delimiter is not None and (not isinstance(delimiter, str) or
                                  (len(delimiter) != 1 and delimiter != "whitespace") or
                                  delimiter in "\n\r#.+-0123456789eE" or ord(delimiter[0]) > 127):
        raise bad("delimiter", "None, 'whitespace' or one ASCII character", delimiter)
    if header not in (None, True, False):
        raise bad("header", "None, True or False", header)
    if not (isinstance(npz_keys, (tuple, list)) and len(npz_keys) == 2 and
            all(isinstance(k, str) for k in npz_keys)):
        raise bad("npz_keys", "a pair of member names such as ('X', 'y')", npz_keys)


def iter_chunks(path, fmt: str = "auto", *, chunk_bytes: int = 8 << 20, label_column=None,
                delimiter: str | None = None, header: bool | None = None,
                npz_keys=("X", "y"), label_names: LabelNames | None = None
                ) -> Iterator[RawChunk]:
    """Stream the rows of one source as :class:`RawChunk` s of about ``chunk_bytes`` of input.

    Parameters
    ----------
    path : source file (``.gz``/``.bz2``/``.xz`` read transparently).
    fmt : ``"auto"`` (see :func:`detect_format`), ``"libsvm"``, ``"csv"``, ``"npy"``, ``"npz"``.
    chunk_bytes : decompressed text (or array bytes) parsed per chunk.
    label_column : CSV/npy label column, an int (negative counts from the end) or a header name;
        ``None`` (default): the CSV header's column named label, y, target or class (any case;
        several such names are refused as ambiguous), else the one column of text (class
        names) in the first lines, else the first column.
    delimiter : CSV delimiter; ``None`` detects ``,`` ``\\t`` ``;`` or whitespace.
    header : CSV header line; ``None`` detects it (first row has a non-numeric field).
    npz_keys : member names of the dense matrix and the labels in an ``.npz``.
    label_names : where a CSV's text labels (class names) get their codes; shared by the
        sources of one ingest. Without it a text label column is refused.

    Parameters are checked, and the format detected, when this is called; rows are read lazily.
    An :class:`IngestError` is raised for bad input, also for a source with no data rows.

    >>> rows = sum(c.n_rows for c in iter_chunks("train.csv", label_column="y"))  # doctest: +SKIP
    """
    _check_params(fmt, chunk_bytes, label_column, delimiter, header, npz_keys)
    detected = fmt == "auto"
    open_binary(path).close()  # a missing or unreadable file fails now, not at the first row
    if detected:
        fmt = detect_format(path)
    chunk_bytes = int(chunk_bytes)
    if fmt == "libsvm":
        gen = _iter_libsvm(path, chunk_bytes, detected)
    elif fmt == "csv":
        layout = _csv_layout(path, label_column, delimiter, header)
        if layout.text_label and label_names is None:
            raise IngestError("the label column holds text (class names), not numbers",
                              "Ingest with ooc-ingest / ooc_learn.ingest, which map class "
                              "names to classes.", path=os.fspath(path))
        gen = _iter_csv(path, chunk_bytes, layout, detected, label_names)
    elif fmt == "npy":
        from ._array_sources import iter_npy

        gen = iter_npy(path, chunk_bytes, label_column)
    elif fmt == "idx":
        from ._array_sources import iter_idx

        gen = iter_idx(path, chunk_bytes)
    else:
        from ._array_sources import iter_npz

        gen = iter_npz(path, chunk_bytes, tuple(npz_keys))
    return _nonempty(gen, path)


def _nonempty(gen, path) -> Iterator[RawChunk]:
    rows = 0
    for chunk in gen:
        rows += chunk.n_rows
        yield chunk
    if rows == 0:
        raise _empty_source(path)


# ---------------------------------------------------------------------------------------------
# text: chunking, kernel driving, slow tokens, errors


def _text_blocks(f: SourceFile, chunk_bytes: int) -> Iterator[tuple[bytearray, int, int]]:
    """Yield ``(buf, start, end)``: ``buf[start:end]`` holds whole lines ending in ``\n``.

    One buffer is reused: the unfinished last line moves to its front and the next
    ``chunk_bytes`` are read behind it; it grows only while a single line outgrows it.
    """
    buf = bytearray(chunk_bytes + 1)
    carry = 0
    start = 0
    first = True
    while True:
        if len(buf) < carry + chunk_bytes + 1:
            buf.extend(bytes(carry + chunk_bytes + 1 - len(buf)))
        with memoryview(buf) as view:
            got = _readinto_full(f, view[carry:carry + chunk_bytes])
        n = carry + got
        if first and buf.startswith(b"\xef\xbb\xbf"):
            start = 3  # a UTF-8 byte order mark is not data
        first = False
        if got < chunk_bytes:
            if n and buf[n - 1] != 10:
                buf[n] = 10
                n += 1
            if n > start:
                yield buf, start, n
            return
        end = buf.rfind(b"\n", carry, n) + 1
        if end == 0:
            carry = n
            continue
        yield buf, start, end
        buf[:n - end] = buf[end:n]
        carry, start = n - end, 0


class _TextParser:
    """Drives one text kernel over successive buffers; holds the slow-token scratch arrays."""

    def __init__(self, path, fmt: str, detected: bool, kernel, kernel_args=()):
        self.path, self.fmt, self.detected = os.fspath(path), fmt, detected
        self.kernel, self.kernel_args = kernel, kernel_args
        self.st = np.zeros(K.ST_SIZE, dtype=np.int64)
        self.st[K.ST_LINE] = 1
        self._slow(_SLOW_CAP)
        self.delim = None
        self.names: LabelNames | None = None  # text labels: class names to codes

    def _slow(self, cap: int) -> None:
        self.slow_a = np.empty(cap, np.int64)
        self.slow_b = np.empty(cap, np.int64)
        self.slow_t = np.empty(cap, np.int64)

    def parse(self, buf: bytes, start: int, end: int, rows_cap: int, nnz_cap: int,
              n_columns, bytes_read: int) -> RawChunk | None:
        st = self.st
        st[[K.ST_POS, K.ST_ROWS, K.ST_NNZ, K.ST_NSLOW, K.ST_NZERO]] = (start, 0, 0, 0, 0)
        st[K.ST_MIN], st[K.ST_MAX] = K.INDEX_SENTINEL, -1
        arr = np.frombuffer(buf, dtype=np.uint8)
        labels = np.empty(rows_cap, np.float64)
        indptr = np.zeros(rows_cap + 1, np.int64)
        indices = np.empty(nnz_cap, np.int64)
        values = np.empty(nnz_cap, np.float32)
        lines = np.empty(rows_cap, np.int64)
        zeros = False
        while True:
            pos0 = st[K.ST_POS]
            status = self.kernel(arr, end, st, *self.kernel_args, labels, indptr, indices,
                                 values, lines, self.slow_a, self.slow_b, self.slow_t)
            if st[K.ST_NSLOW]:
                zeros |= self._resolve(buf, labels, indptr, values, lines)
                st[K.ST_NSLOW] = 0
            if status == K.OK:
                break
            if status != K.SLOW_FULL:
                raise self._error(status, buf)
            if st[K.ST_POS] == pos0:  # one row holds more slow tokens than the scratch
                self._slow(2 * self.slow_a.shape[0])
        rows, nnz = int(st[K.ST_ROWS]), int(st[K.ST_NNZ])
        if rows == 0:
            return None
        if zeros or st[K.ST_NZERO]:
            nnz = int(K.drop_zeros(indptr[:rows + 1], indices, values))
        if n_columns is not None and rows:
            st[K.ST_MIN], st[K.ST_MAX] = (0, n_columns - 1) if n_columns else (K.INDEX_SENTINEL, -1)
        indices, values = indices[:nnz], values[:nnz]
        if 2 * nnz < nnz_cap:
            indices, values = indices.copy(), values.copy()
        return RawChunk(labels[:rows], indptr[:rows + 1], indices, values, int(lines[0]),
                        lines[:rows], int(st[K.ST_MIN]), int(st[K.ST_MAX]), n_columns,
                        bytes_read)

    def _resolve(self, buf, labels, indptr, values, lines) -> bool:
        """Convert the slow tokens with ``float``; returns True when one became 0."""
        zero = False
        for k in range(int(self.st[K.ST_NSLOW])):
            a, b, t = int(self.slow_a[k]), int(self.slow_b[k]), int(self.slow_t[k])
            if t < 0 and self.names is not None:  # a class name
                name = _label_text(buf[a:b])
                code = self.names.code(name) if name else None
                if code is None:
                    raise self._at(a, f"the label {name!r} is not a class of the training data"
                                   if name else "the label is empty", "Use the class names "
                                   "of the training data (the store's label map: ooc-info)."
                                   if name else "Give every row a class name.",
                                   line=lines[-t - 1])
                labels[-t - 1] = code
                continue
            v = float(buf[a:b])
            if t < 0:
                if not np.isfinite(v):
                    raise self._at(a, "the label overflows float64",
                                   "Labels must be finite numbers.", line=lines[-t - 1])
                labels[-t - 1] = v
            else:
                with np.errstate(over="ignore"):
                    v32 = np.float32(v)
                if not np.isfinite(v32):
                    row = int(np.searchsorted(indptr[1:self.st[K.ST_ROWS] + 1], t, "right"))
                    line = lines[row] if row < self.st[K.ST_ROWS] else self.st[K.ST_LINE]
                    raise self._at(a, "the feature value overflows float32 (|value| > 3.4e38)",
                                   "Rescale the feature; values are stored as float32.",
                                   line=line)
                values[t] = v32
                zero |= v32 == 0
        return zero

    def _at(self, pos: int, message: str, hint: str, line) -> IngestError:
        """An IngestError for the token that contains byte ``pos`` of the current buffer."""
        buf = self._buf
        a = buf.rfind(b"\n", 0, pos) + 1
        if self.delim is None:
            s, e = pos, pos
            while s > a and buf[s - 1] not in b" \t\r":
                s -= 1
            while e < len(buf) and buf[e] not in b" \t\r\n#":
                e += 1
            col = len(buf[a:s].split()) + 1
        else:
            d = self.delim.encode()
            col = buf.count(d, a, pos) + 1
            s = buf.rfind(d, a, pos) + 1 if col > 1 else a
            e = min(x for x in (buf.find(d, pos), buf.find(b"\n", pos), len(buf)) if x >= 0)
        token = _short(buf[s:e].decode("utf-8", "replace").strip())
        return IngestError(message, hint, path=self.path, line=int(line), column=col, token=token)

    def _error(self, status: int, buf: bytes) -> IngestError:
        st = self.st
        line, a, b = int(st[K.ST_ERR_LINE]), int(st[K.ST_ERR_A]), int(st[K.ST_ERR_B])
        col = int(st[K.ST_ERR_COL]) or None
        token = _short(buf[a:b].decode("utf-8", "replace"))
        line_text = buf[buf.rfind(b"\n", 0, a) + 1:buf.find(b"\n", a)].decode("utf-8", "replace")
        if status in (K.E_TOKEN, K.E_LABEL, K.E_LABEL_MISSING, K.E_FIELD, K.E_WIDTH):
            other = _looks_like(line_text, self.fmt)
            if other:
                verb = "was detected as" if self.detected else "is read as"
                how = "from its first lines " if self.detected else ""
                return IngestError(
                    f"the file {verb} {_NAMES[self.fmt]} {how}but line {line} looks like {other}",
                    "One source must keep one layout: fix the line or split the file by format"
                    + (" (or pass the format explicitly if the detection was wrong)."
                       if self.detected else "."), path=self.path, line=line)
        msg, hint = _MESSAGES[status]
        if status == K.E_DUPLICATE:
            msg = msg.format(index=int(st[K.ST_ERR_EXTRA]))
            if col is None:
                col, token = _duplicate_token(line_text, int(st[K.ST_ERR_EXTRA]))
        if status == K.E_WIDTH:
            n = int(self.kernel_args[1])
            got = len(_split(line_text, self.delim))
            msg = f"the row has {got} fields but the file has {n} columns"
            return IngestError(msg, hint, path=self.path, line=line)
        if status == K.E_MISSING:
            token = None
        if self.fmt == "libsvm" and status == K.E_TOKEN and token.startswith("qid"):
            msg = "malformed qid token; expected 'qid:' and an integer"
        return IngestError(msg, hint, path=self.path, line=line, column=col, token=token)


_TOKEN_HINT = ("LIBSVM lines read 'label index:value index:value ...' with integer indices and "
               "decimal values; fix or remove the token.")
_MESSAGES = {
    K.E_TOKEN: ("malformed feature token; expected 'index:value' such as '7:0.25'", _TOKEN_HINT),
    K.E_LABEL: ("the label is not a number",
                "Each line must start with a numeric label such as +1, -1, 2 or 1.5e3."),
    K.E_LABEL_MISSING: ("the line has no label: it starts with a feature token",
                        "Put the numeric label first, e.g. '+1 3:0.5 7:1.0'."),
    K.E_LABEL_NONFINITE: ("the label is NaN or infinite",
                          "Drop the row or give it a finite label."),
    K.E_VALUE_NONFINITE: ("the value is NaN or infinite",
                          "Impute or drop missing values before ingesting; the store holds "
                          "finite float32 values only."),
    K.E_INDEX_NEG: ("negative feature index",
                    "Feature indices are integers >= 0 (0-based) or >= 1 (1-based)."),
    K.E_INDEX_BIG: ("feature index above 2**31-1 = 2147483647",
                    "Indices must fit in int32: renumber the features (e.g. hash them into a "
                    "smaller range)."),
    K.E_DUPLICATE: ("feature index {index} appears twice in one row",
                    "Merge or remove the repeated index; each index may appear once per row."),
    K.E_FIELD: ("the field is not a number",
                "Every field must be numeric: encode text columns, and pass header=True if the "
                "first line is a header."),
    K.E_MISSING: ("empty field (missing value)",
                  "Impute or drop missing values before ingesting."),
    K.E_WIDTH: ("", "Every row needs the same number of fields; fix the row, or pass the right "
                "delimiter= if it was detected wrongly."),
}


def _short(token: str, limit: int = 80) -> str:
    return token if len(token) <= limit else token[:limit] + "..."


def _split(text: str, delim: str | None) -> list[str]:
    return text.split() if delim is None else text.split(delim)


def _duplicate_token(line_text: str, index: int) -> tuple[int | None, str | None]:
    seen = False
    for j, tok in enumerate(line_text.split("#", 1)[0].split(), start=1):
        head = tok.split(":", 1)[0]
        if j > 1 and head.lstrip("+-").isdigit() and int(head) == index:
            if seen:
                return j, tok
            seen = True
    return None, None


def _looks_like(text: str, fmt: str) -> str | None:
    """The other layout ``text`` looks like, if it clearly does."""
    text = text.strip()
    if fmt == "libsvm":
        body = text.split("#", 1)[0]
        if ":" in body:
            return None
        for d in ",;\t":
            fields = body.split(d)
            if len(fields) >= 2 and all(_is_number(x) for x in fields):
                return f"CSV ('{d}'-delimited numeric fields)".replace("'\t'", "tab")
        fields = body.split()
        if len(fields) >= 3 and all(_is_number(x) for x in fields):
            return "CSV (whitespace-delimited numeric fields)"
        return None
    if fmt == "csv" and any(_LIBSVM_TOKEN.match(t) for t in text.split()[1:]):
        return "LIBSVM (index:value tokens)"
    return None


def _iter_text(path, chunk_bytes: int, parser: _TextParser, capacity, skip_lines: int = 0,
               n_columns=None) -> Iterator[RawChunk]:
    with open_binary(path) as f:
        for buf, start, end in _text_blocks(f, chunk_bytes):
            while skip_lines and start < end:  # the CSV header and the lines before it
                start = buf.index(b"\n", start) + 1
                skip_lines -= 1
                parser.st[K.ST_LINE] += 1
            arr = np.frombuffer(buf, dtype=np.uint8)
            n_lines, nnz_cap = capacity(arr, buf, start, end)
            del arr  # an exported bytearray cannot grow (``_text_blocks`` may extend it)
            parser._buf = buf
            chunk = parser.parse(buf, start, end, n_lines, nnz_cap, n_columns, f.raw_tell())
            if chunk is not None:
                yield chunk


def _iter_libsvm(path, chunk_bytes: int, detected: bool) -> Iterator[RawChunk]:
    parser = _TextParser(path, "libsvm", detected, K.parse_libsvm)
    # one pass counts the lines and the ':' (an upper bound of the entries)
    yield from _iter_text(path, chunk_bytes, parser,
                          lambda arr, buf, a, b: K.count_two(arr, a, b, 10, 58))


# ---------------------------------------------------------------------------------------------
# CSV layout (delimiter, header, label column)


@dataclass
class _CSVLayout:
    delimiter: str | None   # None: runs of whitespace
    header_line: int        # 1-based line of the header, 0 when there is none
    n_fields: int
    label_col: int
    text_label: bool = False  # the label column holds class names


def _csv_layout(path, label_column, delimiter, header) -> _CSVLayout:
    head, at_eof, f = _read_head(path)
    lines = _data_lines(head, at_eof)
    if not lines:
        if at_eof:
            raise _empty_source(path)
        raise IngestError("the first 64 KiB hold no data line, so the CSV layout cannot be "
                          "detected", "Remove the leading comment lines.", path=f.path)
    if delimiter is None:
        delimiter = _sniff_delimiter([t for _, t in lines])
    elif delimiter == "whitespace" or delimiter == " ":
        delimiter = None
    first_no, first = lines[0]
    fields = [x.strip() for x in _split(first, delimiter)]
    rows = [[x.strip() for x in _split(t, delimiter)] for _, t in lines[1:]]
    if header is None:
        # a header's names are text where the data below are numbers (a column of class
        # names is text in every line, the first too)
        header = not all(_is_number(x) for x in fields) and (
            not rows or any(not _is_number(a) and _is_number(b)
                            for a, b in zip(fields, rows[0])))
    names = None
    if header:
        if delimiter is not None:
            names = [x.strip() for x in next(csv.reader([first], delimiter=delimiter))]
        else:
            names = fields
    n_fields = len(names) if names else len(fields)
    data = rows if header else [fields] + rows
    full = [r for r in data if len(r) == n_fields]
    text_cols = [j for j in range(n_fields)
                 if any(r[j] and not _is_number(r[j]) for r in full)]
    if label_column is None and len(text_cols) == 1 and not (
            names and any(x.strip().lower() in LABEL_NAMES for x in names)):
        label_column = text_cols[0]  # the one column of class names is the label
    label_col = _label_index(path, label_column, names, n_fields)
    # a full-width row whose label field is not a number (rows of another width are the
    # kernel's to name, with their line)
    text_label = label_col in text_cols
    return _CSVLayout(delimiter, first_no if header else 0, n_fields, label_col, text_label)


def _sniff_delimiter(lines: list[str]) -> str | None:
    for d in (",", "\t", ";"):
        counts = {line.count(d) for line in lines}
        if len(counts) == 1 and counts.pop() > 0:
            return d
    widths = {len(line.split()) for line in lines}
    if len(widths) == 1 and widths.pop() > 1:
        return None
    # inconsistent rows: pick the first line's delimiter and let the width check name the row
    return max((",", "\t", ";"), key=lines[0].count) if any(
        d in lines[0] for d in ",\t;") else None


LABEL_NAMES = ("label", "y", "target", "class")


def _label_index(path, label_column, names, n_fields: int) -> int:
    if label_column is None:  # auto: a header's label name, else the first column
        named = [i for i, x in enumerate(names or ()) if x.strip().lower() in LABEL_NAMES]
        if len(named) > 1:
            cols = ", ".join(f"{names[i]!r} (column {i})" for i in named)
            raise IngestError(f"the header names more than one label column: {cols}",
                              f"Pick the label with --label-column NAME (label_column=), e.g. "
                              f"--label-column {names[named[0]]}.", path=os.fspath(path))
        return named[0] if named else 0
    if isinstance(label_column, str):
        if names is None:
            raise IngestError(f"label_column={label_column!r} names a column, but the file has "
                              "no header line", "Pass the label column's number instead, or "
                              "header=True if the first line is a header.", path=os.fspath(path))
        if label_column not in names:
            raise IngestError(f"no column named {label_column!r}; the header has {names[:20]}",
                              "Pass one of the header's names or a column number.",
                              path=os.fspath(path))
        return names.index(label_column)
    col = int(label_column)
    if not -n_fields <= col < n_fields:
        raise IngestError(f"label_column={col} is out of range: the rows have {n_fields} "
                          "fields", f"Pass a column number in [-{n_fields}, {n_fields - 1}].",
                          path=os.fspath(path))
    return col % n_fields


def _iter_csv(path, chunk_bytes: int, layout: _CSVLayout, detected: bool,
              label_names: LabelNames | None = None) -> Iterator[RawChunk]:
    d = layout.delimiter
    parser = _TextParser(path, "csv", detected, K.parse_csv,
                         (-1 if d is None else ord(d), layout.n_fields, layout.label_col,
                          layout.text_label))
    parser.delim = d
    parser.names = label_names if layout.text_label else None
    n_feat = layout.n_fields - 1

    def capacity(arr, buf, a, b):
        n_lines, seps = K.count_two(arr, a, b, 10, 32 if d is None else ord(d))
        if d is None:
            seps += buf.count(b"\t", a, b)
        return n_lines, min(n_lines * n_feat, seps + n_lines)

    yield from _iter_text(path, chunk_bytes, parser, capacity, layout.header_line, n_feat)
