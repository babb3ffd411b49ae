"""The metric forest search's tunables, named once and validated."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ooc_learn.storage.errors import ParameterError

__all__ = ["SearchConfig"]


@dataclass(frozen=True)
class SearchConfig:
    """The search's tunables, validated (the measurements behind each default are in the
    benchmark log, not here).

    span_bytes : int
        Bytes: a node whose rows take at most this much is read whole (one slice of data.h5
        serving its pivots and every leaf below it) when expanded; larger nodes read their
        pivot rows.
    span_read_share : float
        A span is also at most 1/span_read_share of the rows a query may read (max_read).
    rank_mu : float
        Ranking of an internal child, in [0, 1]: max(parent, (1 − μ)·α + μ·max(α − r, 0)),
        α its pivot's angle to the hyperplane and r its covering radius (1: the exact bound).
    rank_lam : float
        Ranking of a leaf, no unit: α + λ·r.
    pivot_candidates : "qualifying" | "reached" | "none"
        Which pivot rows are candidates (their margins are computed to rank their
        partitions): "qualifying": one satisfying eq. 10 is returned, and counted in n_e, as
        its parent is expanded, the others are left to the leaf scans; "reached": the pivot
        of each partition the search pops is examined, qualifying or not; "none": pivots only
        rank, every row is examined in its leaf.
    """

    span_bytes: int = 128 << 10
    span_read_share: float = 4.0
    rank_mu: float = 0.5
    rank_lam: float = 0.0
    pivot_candidates: str = "qualifying"

    def __post_init__(self):
        checks = (("span_bytes", self.span_bytes >= 0, ">= 0"),
                  ("span_read_share", self.span_read_share > 0, "> 0"),
                  ("rank_mu", 0.0 <= self.rank_mu <= 1.0, "in [0, 1]"),
                  ("rank_lam", math.isfinite(self.rank_lam), "finite"),
                  ("pivot_candidates",
                   self.pivot_candidates in ("qualifying", "reached", "none"),
                   "'qualifying', 'reached' or 'none'"))
        for name, ok, want in checks:
            if not ok:
                raise ParameterError(f"The '{name}' parameter of SearchConfig must be {want}. "
                                     f"Got {getattr(self, name)!r} instead.", "")
