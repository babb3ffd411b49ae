"""Streaming parsers for ingest sources: LIBSVM/svmlight, CSV, ``.npy``, ``.npz`` and idx.

:func:`iter_chunks` checks its parameters, detects the format (:mod:`.sniff`) and hands the
source to its reader: the text parser (:mod:`.text_parser`) or the binary array readers
(:mod:`._array_sources`); the chunk type and the opening of a (compressed) source are
:mod:`.source_io`'s. Every reader yields :class:`~ooc_learn.storage.source_io.RawChunk` s,
bounded pieces of rows in CSR form, and never holds the whole source.

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

import os
from typing import Iterator

import numpy as np

from ._array_sources import iter_idx, iter_npy, iter_npz, npy_width
from .errors import IngestError, ParameterError
from .labels import LabelNames
from .sniff import csv_layout, detect_format, empty_source
from .source_io import RawChunk, open_binary
from .text_parser import iter_csv, iter_libsvm

__all__ = ["iter_chunks", "FORMATS", "npy_width"]

FORMATS = ("auto", "libsvm", "csv", "npy", "npz", "idx")


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
    fmt : ``"auto"`` (see :func:`~ooc_learn.storage.sniff.detect_format`), ``"libsvm"``,
        ``"csv"``, ``"npy"``, ``"npz"``, ``"idx"``.
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
    _check_options_apply(path, fmt, label_column, delimiter, header)
    if fmt == "libsvm":
        gen = iter_libsvm(path, chunk_bytes, detected)
    elif fmt == "csv":
        layout = csv_layout(path, label_column, delimiter, header)
        if layout.text_label and label_names is None:
            raise IngestError("the label column holds text (class names), not numbers",
                              "Ingest with ooc-ingest / ooc_learn.ingest, which map class "
                              "names to classes.", path=os.fspath(path))
        gen = iter_csv(path, chunk_bytes, layout, detected, label_names)
    elif fmt == "npy":
        gen = iter_npy(path, chunk_bytes, label_column)
    elif fmt == "idx":
        gen = iter_idx(path, chunk_bytes)
    else:
        gen = iter_npz(path, chunk_bytes, tuple(npz_keys))
    return _nonempty(gen, path)


def _check_options_apply(path, fmt, label_column, delimiter, header) -> None:
    """Refuse a CSV option given for a source it does not apply to (it was ignored: a LIBSVM
    file's label is always its first token)."""
    for flag, value, applies in (
            ("--label-column (label_column=)", label_column, ("csv", "npy")),
            ("--delimiter (delimiter=)", delimiter, ("csv",)),
            ("--header / --no-header (header=)", header, ("csv",))):
        if value is not None and fmt not in applies:
            raise IngestError(f"{flag} applies to {' and '.join(applies)} sources; this one "
                              f"is {fmt}", "Drop the option" + (
                                  " (a LIBSVM line's label is its first token)."
                                  if fmt == "libsvm" else "."), path=os.fspath(path))


def _nonempty(gen, path) -> Iterator[RawChunk]:
    rows = 0
    for chunk in gen:
        rows += chunk.n_rows
        yield chunk
    if rows == 0:
        raise empty_source(path)
