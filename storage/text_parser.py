"""The LIBSVM and CSV text parser: chunking the text, driving the numba kernels, naming errors.

Text is read ``chunk_bytes`` of decompressed bytes at a time; the complete lines of each piece
are parsed by a numba kernel (:mod:`._parse_kernels`) over a ``uint8`` view into output arrays
sized beforehand by counting ``:`` / delimiters / newlines, and the partial last line is
carried over. Numbers agree bit for bit with Python's ``float(token)`` (labels, float64) and
with ``np.float32(float(token))`` (feature values); the few tokens the kernel cannot convert
exactly are converted here with ``float``. A kernel's error status becomes an
:class:`~ooc_learn.storage.errors.IngestError` naming the line, the column and the token.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from . import _parse_kernels as K
from .errors import IngestError, NonFiniteError
from .labels import LabelNames
from .sniff import LIBSVM_TOKEN, CSVLayout, is_number, split_fields
from .source_io import RawChunk, SourceFile, open_binary, readinto_full

__all__ = ["iter_libsvm", "iter_csv"]

_SLOW_CAP = 1 << 12
_NAMES = {"libsvm": "LIBSVM", "csv": "CSV", "npy": ".npy", "npz": ".npz"}


def _label_text(raw: bytes) -> str:
    """A label token as a class name: spaces, a CR and one pair of quotes taken off."""
    text = raw.decode("utf-8", "replace").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    return text


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
            got = readinto_full(f, view[carry:carry + chunk_bytes])
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
        labels = np.zeros(rows_cap, np.float64)  # 0 where a CSV has no label column
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
                       if self.detected else "; or drop --format (the format is then "
                       "detected from the file)."), path=self.path, line=line)
        msg, hint = _MESSAGES[status]
        if status == K.E_DUPLICATE:
            msg = msg.format(index=int(st[K.ST_ERR_EXTRA]))
            if col is None:
                col, token = _duplicate_token(line_text, int(st[K.ST_ERR_EXTRA]))
        if status == K.E_WIDTH:
            n = int(self.kernel_args[1])
            got = len(split_fields(line_text, self.delim))
            msg = f"the row has {got} fields but the file has {n} columns"
            return IngestError(msg, hint, path=self.path, line=line)
        if status == K.E_MISSING:
            token = None
            if self.delim and line_text.rstrip("\r").endswith(self.delim) and (
                    col is not None and col == len(split_fields(line_text.rstrip("\r"),
                                                                  self.delim))):
                # the last field empty: a delimiter that ends the line (some exporters
                # write one), not a missing value
                msg = "the line ends with a delimiter (an empty last field)"
                hint = ("Remove the delimiter at the end of each line (e.g. sed 's/" +
                        ("\\t" if self.delim == "\t" else self.delim) + "$//'), or impute the "
                        "missing last value.")
        if self.fmt == "libsvm" and status == K.E_TOKEN and token.startswith("qid"):
            msg = "malformed qid token; expected 'qid:' and an integer"
        error = (NonFiniteError if status in (K.E_LABEL_NONFINITE, K.E_VALUE_NONFINITE)
                 else IngestError)
        return error(msg, hint, path=self.path, line=line, column=col, token=token)


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
    K.E_VALUE_NONFINITE: ("the value is NaN or infinite", NonFiniteError.HINT),
    K.E_INDEX_NEG: ("negative feature index",
                    "Feature indices are integers >= 0 (0-based) or >= 1 (1-based)."),
    K.E_INDEX_BIG: ("feature index above 2**31-1 = 2147483647",
                    "Indices must fit in int32: renumber the features (e.g. hash them into a "
                    "smaller range)."),
    K.E_DUPLICATE: ("feature index {index} appears twice in one row",
                    "Merge or remove the repeated index; each index may appear once per row."),
    K.E_FIELD: ("the field is not a number",
                "Every field must be numeric: encode text columns, and pass --header (header=True) "
                "if the first line is a header. Quoted numbers (\"1.5\") are read; decimal "
                "commas are not."),
    K.E_MISSING: ("empty field (missing value)",
                  "Impute or drop missing values before ingesting."),
    K.E_WIDTH: ("", "Every row needs the same number of fields; fix the row, or pass the right "
                "--delimiter (delimiter=) if it was detected wrongly."),
}


def _short(token: str, limit: int = 80) -> str:
    return token if len(token) <= limit else token[:limit] + "..."


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
            if len(fields) >= 2 and all(is_number(x) for x in fields):
                return f"CSV ('{d}'-delimited numeric fields)".replace("'\t'", "tab")
        fields = body.split()
        if len(fields) >= 3 and all(is_number(x) for x in fields):
            return "CSV (whitespace-delimited numeric fields)"
        return None
    if fmt == "csv" and any(LIBSVM_TOKEN.match(t) for t in text.split()[1:]):
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


def iter_libsvm(path, chunk_bytes: int, detected: bool) -> Iterator[RawChunk]:
    """The rows of a LIBSVM/svmlight source; ``detected``: its format was guessed (the
    errors say so)."""
    parser = _TextParser(path, "libsvm", detected, K.parse_libsvm)
    # one pass counts the lines and the ':' (an upper bound of the entries)
    yield from _iter_text(path, chunk_bytes, parser,
                          lambda arr, buf, a, b: K.count_two(arr, a, b, 10, 58))


def iter_csv(path, chunk_bytes: int, layout: CSVLayout, detected: bool,
             label_names: LabelNames | None = None) -> Iterator[RawChunk]:
    """The rows of a CSV source read with ``layout``; text labels get their codes from
    ``label_names``."""
    if label_names is not None and label_names.fixed and len(label_names) \
            and not layout.text_label:
        # read as class codes, numbers would name classes at random (or none: an index
        # error in the mapping)
        names = label_names.names
        col = repr(layout.label_name) if layout.label_name else f"{layout.label_col + 1}"
        raise IngestError(
            f"The label column ({col}) holds numbers, where the training labels are class "
            f"names ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''}).",
            "Score a file whose label column holds the training data's class names.",
            path=path)
    d = layout.delimiter
    parser = _TextParser(path, "csv", detected, K.parse_csv,
                         (-1 if d is None else ord(d), layout.n_fields, layout.label_col,
                          layout.text_label))
    parser.delim = d
    parser.names = label_names if layout.text_label else None
    n_feat = layout.n_fields - (layout.label_col < layout.n_fields)  # NO_LABEL: all

    def capacity(arr, buf, a, b):
        n_lines, seps = K.count_two(arr, a, b, 10, 32 if d is None else ord(d))
        if d is None:
            seps += buf.count(b"\t", a, b)
        return n_lines, min(n_lines * n_feat, seps + n_lines)

    first = True
    for chunk in _iter_text(path, chunk_bytes, parser, capacity, layout.header_line, n_feat):
        if first:
            chunk.feature_names, chunk.label_name = layout.feature_names, layout.label_name
            first = False
        yield chunk
