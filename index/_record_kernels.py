"""The numba decoder of node records in bulk: a whole tree's records by one call.

It decodes the records :mod:`~ooc_learn.index.lmdb_io` writes (their layout is
:mod:`~ooc_learn.index.node_record`'s, compiled in here as constants) into the flat arrays of
the resident node cache, with every check of ``lmdb_io.decode_node`` (CRC-32 included), so
the search's loop never waits on Python to decode a record.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .kernel_args import NodeArrays
from .node_record import (CHILD_BYTES, COLUMN_AT, COLUMNS, CRC_BYTES, FIXED_BYTES,
                          FORMAT_VERSION, HEAD, HEAD_AT, MAGIC_U32)

__all__ = ["CRC_TABLE", "decode_records"]


def _crc_table():
    t = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        t = np.where(t & np.uint64(1), (t >> np.uint64(1)) ^ np.uint64(0xEDB88320),
                     t >> np.uint64(1))
    return t


CRC_TABLE = _crc_table()  # zlib's CRC-32 (polynomial 0xEDB88320), one entry per byte value
_U8 = np.uint64(8)
_U16 = np.uint64(16)
_U24 = np.uint64(24)
_U32 = np.uint64(32)
_FF = np.uint64(0xFF)
_MAGIC = np.uint64(MAGIC_U32)
_VERSION_NO = np.uint64(FORMAT_VERSION)
# what the readers below take each field and column for (int32 bounds, uint8 leaf flags, ...)
if ([code for _, code in HEAD] != ["4s", "H", "H", "i", "q", "q", "i", "i"]
        or [code for _, code, _ in COLUMNS] != ["i", "B", "i", "f", "e", "e"]):
    raise ImportError("node_record's layout changed: update decode_records to read it")
# byte offsets (head) and (at, per child) column starts, as numba constants
_VERSION, _TREE, _START, _STOP = HEAD_AT["version"], HEAD_AT["tree"], HEAD_AT["start"], \
    HEAD_AT["stop"]
_FIRST, _K = HEAD_AT["first_child"], HEAD_AT["k"]
_BOUNDS, _LEAF, _PIVOT = COLUMN_AT["bounds"], COLUMN_AT["leaf"], COLUMN_AT["pivot"]
_SQNORM, _RADIUS, _RADIUS_AUG = COLUMN_AT["sqnorm"], COLUMN_AT["radius"], \
    COLUMN_AT["radius_aug"]


@njit(cache=True, nogil=True)
def _crc32(buf, a, z, table):
    """zlib's CRC-32 of ``buf[a:z]``."""
    c = np.uint64(0xFFFFFFFF)
    for i in range(a, z):
        c = table[(c ^ np.uint64(buf[i])) & _FF] ^ (c >> _U8)
    return c ^ np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _u16(buf, p):
    return np.uint64(buf[p]) | (np.uint64(buf[p + 1]) << _U8)


@njit(cache=True, nogil=True)
def _u32(buf, p):
    return (np.uint64(buf[p]) | (np.uint64(buf[p + 1]) << _U8)
            | (np.uint64(buf[p + 2]) << _U16) | (np.uint64(buf[p + 3]) << _U24))


@njit(cache=True, nogil=True)
def _i32(buf, p):
    u = np.int64(_u32(buf, p))
    return u - 4294967296 if u >= 2147483648 else u


@njit(cache=True, nogil=True)
def _i64(buf, p):
    return np.int64(_u32(buf, p) | (_u32(buf, p + 4) << _U32))


@njit(cache=True, nogil=True)
def _ieee(bits, n_exp, n_man):
    """The IEEE binary float with these bits, ``n_exp`` exponent and ``n_man`` mantissa bits
    (float32: 8, 23; float16: 5, 10), as a float64 (exact)."""
    b = np.int64(bits)
    top = (1 << n_exp) - 1
    e = (b >> n_man) & top
    m = b & ((1 << n_man) - 1)
    shift = (top >> 1) + n_man  # the exponent bias plus the mantissa's width
    if e == 0:
        v = math.ldexp(float(m), 1 - shift)
    elif e == top:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(float(m + (1 << n_man)), e - shift)
    return -v if (b >> (n_exp + n_man)) & 1 else v


@njit(cache=True, nogil=True)
def decode_records(buf, offs, vids, tree, n_nodes, table, slot, pos, nodes):
    """Decode the node records ``buf[offs[r]:offs[r+1]]`` (node ``vids[r]`` of ``tree``, which
    has ``n_nodes`` nodes) into ``nodes`` (:class:`~ooc_learn.index.kernel_args.NodeArrays`).

    Node r goes to slot ``slot + r`` (its children from position ``pos`` on) and
    ``nodes.node_slot[nodes.base[tree] + v]`` points at it. Returns ``(r, slot, pos)``:
    r = −1 when every record decoded, else the first record that fails a check
    (``lmdb_io.decode_node`` names what is wrong with it).
    """
    nodes = NodeArrays(*nodes)
    base = nodes.base[tree]
    for r in range(vids.shape[0]):
        a = offs[r]
        z = offs[r + 1]
        v = vids[r]
        if z - a < FIXED_BYTES or not 0 <= v < n_nodes:
            return r, slot, pos
        end = z - CRC_BYTES
        if _crc32(buf, a, end, table) != _u32(buf, end):
            return r, slot, pos
        if (_u32(buf, a) != _MAGIC or _u16(buf, a + _VERSION) != _VERSION_NO
                or _i32(buf, a + _TREE) != tree):
            return r, slot, pos
        start = _i64(buf, a + _START)
        stop = _i64(buf, a + _STOP)
        c0 = _i32(buf, a + _FIRST)
        k = _i32(buf, a + _K)
        if k < 0 or FIXED_BYTES + CHILD_BYTES * k != z - a:
            return r, slot, pos
        pb = a + _BOUNDS[0] + _BOUNDS[1] * k
        span = stop - start
        if k > 0 and (_i32(buf, pb) != 0 or _i32(buf, pb + 4 * k) != span):
            return r, slot, pos
        pl = a + _LEAF[0] + _LEAF[1] * k
        pp = a + _PIVOT[0] + _PIVOT[1] * k
        ps = a + _SQNORM[0] + _SQNORM[1] * k
        pr = a + _RADIUS[0] + _RADIUS[1] * k
        pa = a + _RADIUS_AUG[0] + _RADIUS_AUG[1] * k
        for j in range(k):
            lo = _i32(buf, pb + 4 * j)
            hi = _i32(buf, pb + 4 * j + 4)
            pv = _i32(buf, pp + 4 * j)
            if hi < lo or pv < 0 or pv >= span:
                return r, slot, pos
            q = pos + j
            nodes.c_id[q] = c0 + j
            nodes.c_start[q] = start + lo
            nodes.c_stop[q] = start + hi
            nodes.c_leaf[q] = buf[pl + j] != 0
            nodes.c_piv[q] = start + pv
            nodes.c_sq[q] = _ieee(_u32(buf, ps + 4 * j), 8, 23)
            nodes.c_rad[q] = _ieee(_u16(buf, pr + 2 * j), 5, 10)
            nodes.c_rada[q] = _ieee(_u16(buf, pa + 2 * j), 5, 10)
        nodes.first[slot] = pos
        nodes.k[slot] = k
        nodes.start[slot] = start
        nodes.stop[slot] = stop
        nodes.node_slot[base + v] = slot
        slot += 1
        pos += k
    return -1, slot, pos
