"""What keeps a store's damage from passing unseen: the per-block digests and the checks of
CSR structure read from the file."""

from __future__ import annotations

import numpy as np
import xxhash

from .errors import StoreFormatError

__all__ = ["HASHED", "REBUILD_HINT", "block_digests", "check_columns", "check_row_pointers",
           "digest"]

# the datasets whose slices of each block carry an xxh3-64 digest (``block_hash``, one row a
# block, written at ingest): checked on a handle's first whole-block read of each block and
# by ``verify`` (a store does not change while open). xxh3 hashes at ~15 GB/s here (zlib's
# CRC-32 at 2); checked on every pass, it added ~15 % to the reads of a store the cap keeps
# out of memory (189 MB from the page cache in 2.3 MB chunks: 30 ms, 34 ms with digests)
HASHED = {"dense": ("X", "y", "row_id", "sqnorm"),
          "csr": ("indptr", "indices", "data", "y", "row_id", "sqnorm")}
REBUILD_HINT = "Re-create the store from its source: ooc-ingest SOURCE -o STORE --overwrite"


def digest(a: np.ndarray) -> int:
    """xxh3-64 of an array's bytes (C order)."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(a))


def block_digests(parts: dict, layout: str, missing=None) -> list[int]:
    """The digests of one block's slices of the datasets (``HASHED[layout]``, in order); a
    dataset not in ``parts`` gets ``missing`` where that is given (its slice comes later)."""
    return [digest(parts[k]) if k in parts or missing is None else missing
            for k in HASHED[layout]]


def check_row_pointers(path, indptr: np.ndarray, nnz: int, where: str) -> None:
    """Refuse CSR row pointers that decrease or leave ``0:nnz`` (read from a damaged file,
    they would index out of bounds in the kernels)."""
    if indptr.size and (indptr[0] < 0 or indptr[-1] > nnz or np.any(np.diff(indptr) < 0)):
        raise StoreFormatError(f"{path}: the row pointers of {where} are damaged (decreasing "
                               f"or outside 0:{nnz}).", REBUILD_HINT)


def check_columns(path, indices: np.ndarray, d: int, where: str) -> None:
    """Refuse CSR column indices outside ``0:d`` (see :func:`check_row_pointers`)."""
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= d):
        raise StoreFormatError(f"{path}: {where} holds a column index outside 0:{d} (the "
                               "file is damaged).", REBUILD_HINT)
