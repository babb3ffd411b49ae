"""Cross-validation: TreeCV, standard k-fold, and the shared result type."""

from .result import CVResult

__all__ = ["CVResult"]
