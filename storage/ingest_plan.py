"""Block planning for ingest: the store's shape, the bucket count of pass 1, a block's memory.

From the figures pass 1 gathers (:class:`~ooc_learn.storage.ingest_parse.Parsed`), a
:class:`Shape` decides the index base, the width, the layout (dense or CSR), the rows per block
and the block count; :func:`deal_buckets` decides, at pass 1's first chunk, how many buckets to
deal into; :func:`check_block_fits` refuses a block the memory cap cannot hold while pass 3
builds it.
"""

from __future__ import annotations

import numpy as np

from .budget import format_size
from .errors import BudgetExceededError, IngestError

__all__ = ["Shape", "deal_buckets", "check_block_fits", "dense_row_bytes", "DENSE_THRESHOLD",
           "BINARY_HEADROOM"]

#: auto layout is dense when at least this share of entries is non-zero
DENSE_THRESHOLD = 0.4
#: default target size of one block in memory
_DEFAULT_BLOCK_BYTES = 64 << 20
#: the most buckets pass 1 deals into without --blocks (each is a file, appended per flush)
_MAX_BUCKETS = 1 << 15
#: headroom of the bucket count over the estimated block count for binary array sources
BINARY_HEADROOM = 1.25


def dense_row_bytes(d: int) -> int:
    """Bytes of one dense row of ``d`` features as a block holds it (values, label, row id,
    norm)."""
    return 4 * d + 24


class WiderThanAsked(IngestError):
    """The sources have more features than ``n_features`` allows (``data``, ``asked``)."""

    def __init__(self, data: int, asked: int):
        super().__init__(f"The sources have {data} features but n_features={asked} was "
                         f"given.", f"Pass --n-features {data} or larger.")
        self.data, self.asked = data, asked


class Shape:
    """The store's shape, decided from the pass-1 figures (also estimated after one chunk)."""

    def __init__(self, p, *, layout, n_features, zero_based, n_blocks, block_rows,
                 limit, check: bool):
        base = 0
        if "libsvm" in p.formats:
            base = 0 if (zero_based is True or p.min_index == 0) else 1
            if zero_based is False:
                base = 1
        d_data = max(p.max_index + 1 - base, p.n_columns or 0, 0)
        d = d_data if n_features is None else n_features
        if check and d < d_data:
            raise WiderThanAsked(d_data, d)
        d = max(d, d_data, 1)
        n = max(p.n, 1)
        self.base, self.d = base, d
        self.density = p.nnz / float(n * d)
        self.layout = layout if layout != "auto" else (
            "dense" if self.density >= DENSE_THRESHOLD else "csr")
        self.bytes_per_row = (dense_row_bytes(d) if self.layout == "dense"
                              else 8 + 8 * p.nnz / n + 24)
        if block_rows is None and n_blocks is None:
            target = min(_DEFAULT_BLOCK_BYTES, limit // 8)
            block_rows = max(1, int(target // self.bytes_per_row))
        self.block_rows = block_rows
        if n_blocks is None:
            n_blocks = max(1, -(-p.n // block_rows))
        self.n_blocks = max(1, min(n_blocks, p.n))


def deal_buckets(p, ch, total: int, *, n_blocks, block_rows, shape_kw) -> int:
    """How many buckets pass 1 deals into, decided at the first chunk ``ch``.

    ``--blocks R``: R. A first chunk that is the whole input: the final block count. Else
    the count estimated from the chunk (rows per source byte, bytes per stored row) times
    2 for headroom, rounded up to a power of two: pass 3 merges buckets into blocks at no
    cost, while a bucket larger than a block costs a re-deal (one more write and read of it).
    Binary arrays (.npy, .npz) have rows of one size, so only the density can surprise: 1.25
    for headroom, not rounded. Fewer buckets make larger records from the same buffer.
    """
    if n_blocks is not None:
        return int(n_blocks)
    est = Shape(p, n_blocks=None, block_rows=block_rows, check=False, **shape_kw)
    if total and ch.bytes_read >= total:
        return est.n_blocks
    n_est = p.n * total / max(1, ch.bytes_read) if total else p.n
    want = n_est / est.block_rows
    if p.formats and p.formats <= {"npy", "npz"}:
        r0 = int(np.ceil(BINARY_HEADROOM * want))
    else:
        r0 = 1 << max(0, int(np.ceil(np.log2(max(1.0, 2 * want)))))
    return int(min(r0, _MAX_BUCKETS, 1 << int(np.ceil(np.log2(max(2.0, n_est))))))


def check_block_fits(budget, rows: int, bytes_per_row: float) -> int:
    """Bytes pass 3 needs for a block of ``rows`` rows (x3 for the parts it is stacked from,
    or the remainder of a shared bucket, and its permuted copy); raises when the cap is
    smaller."""
    need = int(rows * bytes_per_row * 3)
    if need > budget.limit:
        raise BudgetExceededError(
            f"A block of {rows} rows needs about {format_size(need)} to "
            f"ingest but the memory cap is {format_size(budget.cap)}"
            + (f" ({format_size(budget.limit)} beyond the process's fixed part)."
               if budget.fixed else "."),
            f"Raise --memory to at least {format_size(budget.fixed + need, up=True)} "
            f"or lower --block-rows (or raise --blocks).")
    return need
