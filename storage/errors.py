"""The error hierarchy of ooc-learn.

Every failure a user can cause or meet is an :class:`OOCError` with a ``hint`` that says
what to do about it. The CLI maps :class:`UsageError` subclasses (bad input, bad flags,
mismatched files) to exit code 2 and everything else to exit code 1.

The classes live in ``storage`` because it is the lowest layer; ``ooc_learn`` re-exports them.
"""

from __future__ import annotations

__all__ = [
    "OOCError",
    "UsageError",
    "IngestError",
    "NonFiniteError",
    "StoreFormatError",
    "StoreExistsError",
    "BudgetExceededError",
    "IndexStateError",
    "ModelMismatchError",
    "ParameterError",
    "ClosedError",
]


class OOCError(Exception):
    """Base of every ooc-learn error. ``hint`` says how to fix it (may be empty)."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(f"{message} {hint}".strip() if hint else message)


class UsageError(OOCError):
    """Bad input or bad parameters: the user must change what they passed (exit code 2)."""

    exit_code = 2


class ParameterError(UsageError, ValueError):
    """A parameter is out of its valid range. Raised before any data is read."""


class IngestError(UsageError):
    """A source file cannot be ingested. Names the file, line, column and token."""

    def __init__(self, message: str, hint: str = "", *, path=None, line=None, column=None,
                 token=None):
        self.path = None if path is None else str(path)
        self.line = line
        self.column = column
        self.token = token
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if column is not None:
            where.append(f"column {column}")
        prefix = ", ".join(where)
        if token is not None:
            message = f"{message} (token {token!r})"
        super().__init__(f"{prefix}: {message}" if prefix else message, hint)


class NonFiniteError(IngestError, ValueError):
    """A value or a label of the input is NaN or infinite (the store holds finite values
    only). Also a ``ValueError``, as scikit-learn's input checks raise for such data."""

    HINT = ("Impute or drop missing values before ingesting; the store holds finite float32 "
            "values only.")

    def __init__(self, message: str, hint: str = HINT, **where):
        super().__init__(message, hint, **where)


class StoreFormatError(UsageError):
    """A path is not a finished store, or was written by an incompatible format version."""


class StoreExistsError(UsageError):
    """The output store already exists and ``overwrite`` was not given."""


class BudgetExceededError(UsageError):
    """A component cannot fit its minimum within the memory cap. The hint names ``--memory``."""


class IndexStateError(UsageError):
    """The metric-forest index is missing, stale, of another version, or corrupted."""


class ModelMismatchError(UsageError):
    """A model does not fit the data it is applied to (feature count, label map)."""


class ClosedError(OOCError, ValueError):
    """An operation on a closed store, index or cache."""
