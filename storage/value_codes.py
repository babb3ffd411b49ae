"""Value codes: a dense store's X as 1- or 2-byte codes into a table of its distinct values.

Much dense data holds few distinct values: image pixels (256 levels, scaled or not), binary
and one-hot features, small counts. Such an X is stored as ``uint8`` (at most 256 distinct
values) or ``uint16`` (at most 65,536) codes, with ``X_values``, the float32 value of each
code, beside it. The encoding is lossless (values are matched by their float32 bits), and the
store reads back the same float32 X as before, decoded as it is read
(:class:`~ooc_learn.storage.arrays.CodedSlicer`): what shrinks is what the disk and the page
cache carry. Augmented Fashion-MNIST (1.02M rows, 784 pixels): 3.2 GB of float32, 0.8 GB of
codes; a pass over it reads 4x fewer bytes, and a 1 GiB machine's page cache holds a third of
it. Decoding runs at ~2.9 G values/s here (a copy's speed), against ~0.15 G/s for a 600 MB/s
disk's float32 reads.

The writer decides on the first block it writes (a random shard of the rows): codes where its
values fit the width with the rest of the data's likely to (uint8 up to 256 distinct values,
uint16 up to ``U16_FIRST_BLOCK``, values repeating), plain float32 otherwise. A later block bringing more
distinct values than the width holds raises :class:`ValueCodesFull`; the ingest then starts
again with the next width (:func:`next_width`): rare (the first block saw all but the rarest
values), and never a half-written store.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["RowCodes", "ValueCodes", "ValueCodesFull", "decode", "choose_width",
           "next_width", "U16_FIRST_BLOCK", "WIDTHS"]

#: the code types, by name as ``ooc-ingest --value-codes`` and the metadata say them
WIDTHS = {"uint8": np.uint8, "uint16": np.uint16}

#: the most distinct values a first block may show for uint16 codes (a quarter of what they
#: hold: continuous data shows new values in every block, and would start the ingest again)
U16_FIRST_BLOCK = 1 << 14

# a NaN's bits: never a stored value (the store refuses non-finite values), so an empty slot
_EMPTY = np.uint32(0xFFFFFFFF)


class ValueCodesFull(Exception):
    """A block brought more distinct values than the codes hold (``width``: the codes',
    ``seen``: the distinct values met before the block that overflowed, at least)."""

    def __init__(self, width: str, seen: int):
        super().__init__(f"more than {np.iinfo(WIDTHS[width]).max + 1} distinct values "
                         f"({seen} before the block that overflowed)")
        self.width, self.seen = width, seen


def choose_width(distinct: int, size: int) -> str | None:
    """The codes for a store whose first block holds ``distinct`` distinct values among its
    ``size`` values (None: float32). The values must repeat (each seen 4 times on average for
    uint8, 16 for uint16): a small first block of continuous data holds few values, all
    distinct."""
    if distinct <= 256 and 4 * distinct <= size:
        return "uint8"
    if distinct <= U16_FIRST_BLOCK and 16 * distinct <= size:
        return "uint16"
    return None


def next_width(width: str) -> str | None:
    """The width to start again with after ``width`` overflowed (None: float32)."""
    return "uint16" if width == "uint8" else None


class ValueCodes:
    """The value table of one store as its blocks are written: each new float32 value (by its
    bits) gets the next code, up to the width's limit."""

    def __init__(self, width: str):
        self.width = width
        self.dtype = np.dtype(WIDTHS[width])
        size = int(np.iinfo(self.dtype).max) + 1
        self.bits = np.zeros(size, np.uint32)  # code -> the value's bits
        self.n = 0
        # open addressing over the values' bits, at most half full
        self._slots = np.full(2 * size, _EMPTY, np.uint32)
        self._codes = np.zeros(2 * size, np.int32)

    @classmethod
    def of_table(cls, width: str, values: np.ndarray) -> ValueCodes:
        """Codes whose table starts with ``values`` (float32) in their order: code i is
        ``values[i]``'s (a value repeated keeps its first code)."""
        codes = cls(width)
        codes.encode(values)
        return codes

    @classmethod
    def first_block(cls, X) -> tuple[ValueCodes | None, np.ndarray | None]:
        """``(codes, X's codes)`` for a store whose first block is ``X`` (one pass over it),
        or ``(None, None)`` where it is better stored as float32."""
        probe = cls("uint16")
        try:
            coded = probe.encode(X)
        except ValueCodesFull:
            return None, None
        width = choose_width(probe.n, int(np.size(X)))
        if width == "uint8":  # the same codes, one byte each
            return cls.of_table(width, probe.table()[:probe.n]), coded.astype(np.uint8)
        return (probe, coded) if width else (None, None)

    def encode(self, X, out: np.ndarray | None = None) -> np.ndarray:
        """``X`` (float32, C order) as codes of the same shape (into ``out``, C-contiguous,
        where given); new values join the table. Raises :class:`ValueCodesFull` where they
        do not fit: the codes of the blocks before stay valid, and the store being written
        starts again."""
        bits = np.ascontiguousarray(X, np.float32).view(np.uint32)
        if out is None:
            out = np.empty(bits.shape, self.dtype)
        n = _encode(bits.ravel(), self._slots, self._codes, self.bits, self.n,
                    out.reshape(-1))
        if n < 0:
            raise ValueCodesFull(self.width, self.n)
        self.n = n
        return out

    def table(self) -> np.ndarray:
        """The float32 value of every code (unused codes 0.0): what ``X_values`` holds, one
        entry for each code the width has, so that any code a damaged file holds decodes
        (the block digests then name the damage)."""
        return self.bits.view(np.float32).copy()


class RowCodes:
    """A coded store's codes for rows read from it, to write them to a file of codes and read
    them back (IBCD's spilled active set: a quarter of the float32 bytes, for uint8), a piece
    of ``PIECE`` bytes at a time through one buffer of its own (``PIECE`` is what to reserve
    for it). Every value of such rows is in the store's table, so the codes never
    overflow."""

    PIECE = 1 << 18

    def __init__(self, table: np.ndarray):
        # a code for every value of the store, in its table order
        self._codes = ValueCodes.of_table("uint8" if table.size == 256 else "uint16", table)
        self.table = self._codes.table()
        self.dtype = self._codes.dtype
        self._buf = np.empty(self.PIECE, np.uint8)

    def row_bytes(self, d: int) -> int:
        return d * self.dtype.itemsize

    def _step(self, d: int) -> int:
        return max(1, self.PIECE // max(1, self.row_bytes(d)))

    def write(self, X: np.ndarray, f) -> None:
        """The codes of the float32 rows ``X`` to the open binary file ``f``."""
        c = self._codes
        n, step = c.n, self._step(X.shape[1])
        for a in range(0, X.shape[0], step):
            part = X[a:a + step]
            out = c.encode(part, self._buf[:part.size * self.dtype.itemsize].view(self.dtype))
            if c.n != n:  # pragma: no cover - rows read from the store hold its values
                raise ValueError("a row holds a value outside the store's value table")
            f.write(memoryview(out).cast("B"))

    def read(self, f, offset: int, rows: int, d: int) -> np.ndarray:
        """``rows`` float32 rows of ``d`` values decoded from ``f`` at byte ``offset``."""
        out = np.empty((rows, d), np.float32)
        f.seek(offset)
        step = self._step(d)
        for a in range(0, rows, step):
            k = min(rows, a + step) - a
            nbytes = k * self.row_bytes(d)
            got = f.readinto(memoryview(self._buf)[:nbytes])
            if got != nbytes:
                raise OSError(f"{getattr(f, 'name', 'a spill file')} ends {nbytes - got} "
                              "bytes early")
            decode(self._buf[:nbytes].view(self.dtype).reshape(k, d), self.table,
                   out[a:a + k])
        return out


@njit(cache=True, nogil=True)
def _encode(bits, slots, slot_code, table_bits, n_table, out):
    """Codes of the values ``bits`` (flat) into ``out``; returns the table's new size, or -1
    where a value found it full. The last value met is tried first (runs of zeros)."""
    mask = slots.size - 1
    last_b = np.uint32(0xFFFFFFFF)
    last_c = 0
    for i in range(bits.size):
        b = bits[i]
        if b == last_b:
            out[i] = last_c
            continue
        h = (np.uint64(b) * np.uint64(2654435761)) & np.uint64(mask)
        while True:
            k = slots[h]
            if k == b:
                c = slot_code[h]
                break
            if k == np.uint32(0xFFFFFFFF):
                if n_table == table_bits.size:
                    return -1
                slots[h] = b
                slot_code[h] = n_table
                table_bits[n_table] = b
                c = n_table
                n_table += 1
                break
            h = (h + np.uint64(1)) & np.uint64(mask)
        out[i] = c
        last_b, last_c = b, c
    return n_table


@njit(cache=True, nogil=True)
def _decode(codes, table, out):
    for i in range(codes.size):
        out[i] = table[codes[i]]


def decode(codes: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 values of ``codes`` (``table`` holds one entry for every code of their
    type), into ``out`` (C-contiguous float32 of their shape) where given. Releases the GIL
    (a prefetching thread decodes beside the solver)."""
    if out is None:
        out = np.empty(codes.shape, np.float32)
    if codes.size:
        _decode(codes.reshape(-1), table, out.reshape(-1))
    return out
