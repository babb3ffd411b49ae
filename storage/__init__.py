"""Block store: ingest parsers, external shuffle, HDF5 blocks, LRU block cache, memory budget.

Knows bytes and rows, nothing about learning. Installed as ``ooc_learn.storage``.
"""

from .budget import MemoryBudget, format_size, parse_size
from .cache import LRUCache
from .errors import (BudgetExceededError, ClosedError, IndexStateError, IngestError,
                     ModelMismatchError, NonFiniteError, OOCError, ParameterError,
                     StoreExistsError, StoreFormatError, UsageError)

__all__ = [
    "MemoryBudget", "parse_size", "format_size", "LRUCache",
    "OOCError", "UsageError", "ParameterError", "IngestError", "NonFiniteError",
    "StoreFormatError",
    "StoreExistsError", "BudgetExceededError", "IndexStateError", "ModelMismatchError",
    "ClosedError",
]
