"""What a text or binary source is, read from its first 64 KiB: its format and its CSV layout.

:func:`detect_format` recognises ``.npy``, ``.npz`` and idx by their magic bytes (after
decompression) and text by its first data lines (``index:value`` tokens mean LIBSVM, delimited
fields CSV). :func:`csv_layout` finds a CSV's delimiter, its header line and its label column
(by name, or as the one column of class names). Both read the head of the source only; the
parsers check every later line against what was decided here.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass

from .errors import IngestError
from .source_io import LABEL_NAMES, SourceFile, is_idx_head, label_index, open_binary, read_full

__all__ = ["detect_format", "CSVLayout", "csv_layout", "LIBSVM_TOKEN", "NO_LABEL", "is_number",
           "first_difference", "split_fields", "empty_source"]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_SNIFF_BYTES = 1 << 16
_SNIFF_LINES = 20
#: the start of a LIBSVM feature token (``7:`` or ``qid:``)
LIBSVM_TOKEN = re.compile(r"^(?:[+-]?\d+|qid):")


def _unquoted(text: str) -> str:
    """``text`` without one pair of double quotes around it, as a CSV field may be written."""
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def first_difference(a, b) -> int:
    """The first position where the name lists ``a`` and ``b`` differ (the shorter one's
    length where one extends the other): what a refusal of other columns names."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def is_number(text: str, *, quoted: bool = False) -> bool:
    """Whether Python's ``float`` reads ``text`` as a number (``quoted``: also inside one pair
    of double quotes, as a CSV field may be written)."""
    if quoted:
        text = _unquoted(text)
    try:
        float(text)
    except ValueError:
        return False
    return True


def split_fields(text: str, delim: str | None) -> list[str]:
    """The fields of a CSV line; ``delim`` None splits at runs of whitespace."""
    return text.split() if delim is None else text.split(delim)


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
        head = read_full(f, _SNIFF_BYTES)
        at_eof = len(head) < _SNIFF_BYTES
    head = head.removeprefix(b"\xef\xbb\xbf")
    return head, at_eof, f


def empty_source(path) -> IngestError:
    """The error for a source that holds no data row."""
    return IngestError("the source has no data rows (it is empty or holds only comments and "
                       "blank lines)", "Check that the right file was given and that it was "
                       "written completely.", path=os.fspath(path))


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
            raise empty_source(path)
        raise IngestError("the first 64 KiB hold no data line, so the format cannot be "
                          "detected", "Pass --format libsvm or --format csv (fmt=) "
                          "explicitly.", path=f.path)
    for _, text in lines:
        tokens = text.split("#", 1)[0].split()
        if any(LIBSVM_TOKEN.match(t) for t in tokens):
            return "libsvm"
        if len(tokens) >= 2 or any(d in text for d in ",;\t"):
            return "csv"
    return "libsvm"  # only label-only rows: a LIBSVM file whose first rows have no features


@dataclass
class CSVLayout:
    """How a CSV source's lines are read (decided by :func:`csv_layout`)."""

    delimiter: str | None   # None: runs of whitespace
    header_line: int        # 1-based line of the header, 0 when there is none
    n_fields: int
    label_col: int
    text_label: bool = False  # the label column holds class names
    feature_names: list | None = None  # the header's names of the feature columns, in order
    label_name: str | None = None  # the header's name of the label column


#: ``label_column`` of a CSV without one: every column a feature, each row's label 0 (rows
#: to predict, ``ooc-predict --no-labels``; not a name a header can hold)
NO_LABEL = "\x00no label column"


def csv_layout(path, label_column, delimiter, header) -> CSVLayout:
    """The layout of the CSV source at ``path``, detected where an argument is None (see
    :func:`~ooc_learn.storage.parsers.iter_chunks` for the arguments)."""
    head, at_eof, f = _read_head(path)
    lines = _data_lines(head, at_eof)
    if not lines:
        if at_eof:
            raise empty_source(path)
        raise IngestError("the first 64 KiB hold no data line, so the CSV layout cannot be "
                          "detected", "Remove the leading comment lines.", path=f.path)
    if delimiter is None:
        delimiter = _sniff_delimiter([t for _, t in lines])
    elif delimiter == "whitespace" or delimiter == " ":
        delimiter = None
    first_no, first = lines[0]
    fields = [x.strip() for x in split_fields(first, delimiter)]
    rows = [[x.strip() for x in split_fields(t, delimiter)] for _, t in lines[1:]]
    if header is None:
        # a header's names are text where the data below are numbers (a column of class
        # names is text in every line, the first too)
        header = not all(is_number(x, quoted=True) for x in fields) and (
            not rows or any(not is_number(a, quoted=True) and is_number(b, quoted=True)
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
    if label_column == NO_LABEL:  # the label column one past the last: never met
        return CSVLayout(delimiter, first_no if header else 0, n_fields, n_fields, False,
                         list(names) if names else None, None)

    def text(j, rows):
        return (r[j] and not is_number(r[j], quoted=True) for r in rows)

    # a column of class names is text in every line read; one stray word in a column of
    # numbers is a bad value, which the parser names with its line
    name_cols = [j for j in range(n_fields) if full and all(text(j, full))]
    if label_column is None and len(name_cols) == 1 and not (
            names and any(x.strip().lower() in LABEL_NAMES for x in names)):
        label_column = name_cols[0]  # the one column of class names is the label
    if label_column is None and not header and full and n_fields > 1:
        _warn_if_the_label_looks_last(path, full)
    label_col = label_index(path, label_column, names, n_fields)
    # a full-width row whose label field is not a number (rows of another width are the
    # kernel's to name, with their line)
    text_label = any(text(label_col, full))
    features = None if not names else [x for j, x in enumerate(names) if j != label_col]
    return CSVLayout(delimiter, first_no if header else 0, n_fields, label_col, text_label,
                     features, names[label_col] if names else None)


def _labelish(values: list[str]) -> bool:
    """Whether sampled fields look like class labels: integers, at most half of them
    distinct (two at the least)."""
    if not all(is_number(v, quoted=True) for v in values):
        return False
    nums = [float(_unquoted(v)) for v in values]
    return (all(v == int(v) for v in nums)
            and len(set(nums)) <= max(2, len(nums) // 2))


def _warn_if_the_label_looks_last(path, rows: list[list[str]]) -> None:
    """A headerless CSV's label is its first column by default; where that column does not
    look like labels and the last does (UCI's files put the class last), say so."""
    if _labelish([r[-1] for r in rows]) and not _labelish([r[0] for r in rows]):
        import warnings

        warnings.warn(f"{os.fspath(path)}: the label is the first column (no header names "
                      f"one), which holds values like {rows[0][0]}; the last column looks like "
                      f"class labels. If it holds them, pass --label-column -1.",
                      RuntimeWarning, stacklevel=3)


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
