"""The node record of ``STORE/index.lmdb``: its byte layout, defined here once.

Every writer and reader derives from these tables: the encoders and :func:`decode_node` of
:mod:`~ooc_learn.index.lmdb_io`, the numba decoder
:func:`~ooc_learn.index._record_kernels.decode_records` (through the offsets below, which
numba compiles in as constants) and the resident node cache's sizing
(:mod:`~ooc_learn.index.resident`).

A record of an internal node (or a root) with k children, little-endian::

    head     magic "OOCN", version, flags, tree, start, stop, first child, k    (HEAD)
    columns  per child, one column after the other                           (COLUMNS)
             bounds      int32 x (k + 1)  child j covers start + bounds[j] .. bounds[j + 1]
             leaf        uint8            1: child j is a leaf
             pivot       int32            its pivot row, minus the node's start
             sqnorm      float32          the pivot's squared norm
             radius      float16          smallest cos² pivot-row in the child, rounded down
             radius_aug  float16          the same with the bias feature 1 appended
    crc      uint32  zlib CRC-32 of every byte before it

Row positions are store rows. Changing anything here is a new ``FORMAT_VERSION``.
"""

from __future__ import annotations

import functools
import struct

__all__ = ["FORMAT_VERSION", "MAGIC", "MAGIC_U32", "HEAD", "HEAD_STRUCT", "HEAD_BYTES",
           "HEAD_AT", "COLUMNS", "COLUMN_AT", "CHILD_BYTES", "CRC_BYTES", "FIXED_BYTES",
           "columns_struct"]

FORMAT_VERSION = 2  # of the whole index (lmdb_io.INDEX_FORMAT_VERSION); each record has it
MAGIC = b"OOCN"
MAGIC_U32 = int.from_bytes(MAGIC, "little")  # the magic read as one little-endian uint32

# (field, struct code) of the head, in order
HEAD = (("magic", "4s"), ("version", "H"), ("flags", "H"), ("tree", "i"), ("start", "q"),
        ("stop", "q"), ("first_child", "i"), ("k", "i"))
HEAD_STRUCT = struct.Struct("<" + "".join(code for _, code in HEAD))
HEAD_BYTES = HEAD_STRUCT.size


def _head_offsets() -> dict:
    at, out = 0, {}
    for name, code in HEAD:
        out[name] = at
        at += struct.calcsize("<" + code)
    return out


HEAD_AT = _head_offsets()  # field -> byte offset in the record

# (column, struct code, entries beyond k): the per-child columns, in order
COLUMNS = (("bounds", "i", 1), ("leaf", "B", 0), ("pivot", "i", 0), ("sqnorm", "f", 0),
           ("radius", "e", 0), ("radius_aug", "e", 0))
CRC_BYTES = 4
CHILD_BYTES = sum(struct.calcsize("<" + code) for _, code, _ in COLUMNS)  # bytes per child
_EXTRA_BYTES = sum(struct.calcsize("<" + code) * extra for _, code, extra in COLUMNS)
FIXED_BYTES = HEAD_BYTES + _EXTRA_BYTES + CRC_BYTES  # a record's bytes besides k children


def _column_offsets() -> dict:
    """column -> ``(at, per_child)``: in a record with k children the column starts at
    byte ``at + per_child * k``."""
    at, per, out = HEAD_BYTES, 0, {}
    for name, code, extra in COLUMNS:
        out[name] = (at, per)
        size = struct.calcsize("<" + code)
        at += size * extra
        per += size
    return out


COLUMN_AT = _column_offsets()


@functools.lru_cache(maxsize=None)
def columns_struct(k: int) -> struct.Struct:
    """The columns of a record with ``k`` children as one ``struct`` (after the head)."""
    return struct.Struct("<" + "".join(f"{k + extra}{code}" for _, code, extra in COLUMNS))
