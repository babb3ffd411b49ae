"""What an IBCD run holds while it runs: its counters and its state."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from .config import IBCDConfig

__all__ = ["IBCDStats", "IBCDState"]


@dataclass
class IBCDStats:
    """Counters of a run (``IBCDResult.stats`` holds them as a dict, with the totals)."""

    inner_iterations: int = 0      #: steps of Algorithm 1 (query, block, solve)
    rows_examined: int = 0         #: rows the queries and checks looked at
    block_updates: int = 0         #: coordinate updates in the block solves
    queries: int = 0               #: index queries
    queries_cut: int = 0           #: ... stopped before n rows (a limit reached)
    queries_truncated: int = 0     #: ... stopped where the cap held no larger frontier
    queries_imprecise: int = 0     #: ... stopped for too few qualifying rows
    queries_grown: int = 0         #: times the next query's n doubled
    queries_slow: int = 0          #: queries that cost more than a scan
    scans_preferred: int = 0       #: times the scan took the index's place
    full_checks: int = 0           #: checks that scanned every row
    sampled_checks: int = 0        #: ... whose pass ended once it had seen enough violators
    pool_hits: int = 0             #: checks answered by the pool
    gathered_checks: int = 0       #: scans whose admitted rows were read after the pass
    full_solves_skipped: int = 0   #: checks whose rows joined S without a full solve first
    pruned: int = 0                #: inactive rows that left S
    frozen: int = 0                #: rows that left S frozen at alpha = C
    thawed: int = 0                #: ... that a check brought back
    S_resolves: int = 0            #: solves of S after it doubled
    S_resolves_before_spill: int = 0  #: solves of S tried before it spilled
    spilled_rounds: int = 0        #: working-set rounds over a spilled S
    switched_to_primal: int = 0    #: dual CD on S handed over to TRON
    newton_solves: int = 0         #: solves of S begun by Newton's method (hinge)
    newton_steps: int = 0          #: ... its Newton steps
    newton_after_stall: int = 0    #: final solves of S whose dual CD stalled, then Newton's
    stopped_by_sample_rule: int = 0
    sample_rule_rechecks: int = 0  #: queries repeated at a solution of S for the sampled rule
    fetches_cut: int = 0           #: query answers cut to what the cap held
    S_converged: bool = True       #: the last solve of S reached eps
    outer_log: list = field(default_factory=list)  #: one dict per outer iteration

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class IBCDState:
    """One run's state, shared by its parts: the configuration, the store and its row
    reader, the forest, the active set S and its mask over the store's rows (held-out and
    frozen rows marked too), the iterate w (changed in place), the check, the random stream,
    the counters and the frozen rows."""

    cfg: IBCDConfig
    store: object
    rows: object          #: the RowSource the forest and the check read rows through
    forest: object
    S: object             #: the ActiveSet
    in_S: np.ndarray
    w: np.ndarray
    checker: object
    rng: np.random.Generator
    stats: IBCDStats
    #: rows frozen at alpha = C outside S (``IBCDConfig.freeze_margin``; marked in in_S
    #: too), or None where the run freezes none
    frozen: np.ndarray | None = None

    @property
    def n_frozen(self) -> int:
        """Rows frozen outside S now (those that left S frozen less those brought back)."""
        return self.stats.frozen - self.stats.thawed

    def draw_seed(self) -> int:
        """A seed for one solve or query, from the run's stream."""
        return int(self.rng.integers(1 << 31))
