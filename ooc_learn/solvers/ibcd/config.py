"""What decides an IBCD run: the problem, Algorithm 1's parameters and the tuned constants.

Every tunable is named once, here, with its meaning and unit. The measurements behind the
defaults are in ``docs/bench-log.md``; this module says what each one is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.resources import last_level_cache_bytes

__all__ = ["IBCDConfig"]


@dataclass(frozen=True)
class IBCDConfig:
    """A validated, immutable IBCD configuration.

    The problem (objective (2) of the paper)
    ----------------------------------------
    loss : "hinge" | "sqhinge"
        L, the loss truncated by ``s``.
    C : float
        The SVM cost.
    s : float or None
        The truncation R_s(z) = min(L(z), 1 + s); None solves the convex SVM (one outer
        iteration).
    bias : float
        The value of the regularized constant feature (LIBLINEAR's ``-B``).

    Algorithm 1 (§3.1)
    ------------------
    n : int
        Fresh rows asked of the index per step (rows).
    eps : float
        Dual CD's stopping tolerance on S: LIBLINEAR's projected-gradient spread.
    sample_eps : float
        The sampled stopping rule |N| / n_e < sample_eps (fresh rows per row the search
        traversed); 0 stops only when a check of every row finds none (the exact stop).
        With the truncated loss it also ends the outer loop once fewer rows changed side
        than sample_eps of the support vectors (the exact stop: none).
    max_outer : int
        Outer iterations of the truncated-loss relaxation at most.
    init_sample : int
        Rows of the random sample whose solution is w_0 (rows).
    block_iters : int
        Dual CD passes over each block B (passes).
    block_solver : "dual" | "primal"
        Dual CD on the block problem (11), or TRON on its primal (16) (squared hinge only).
    shrink_threshold : float
        Shrinking on the index (§4.3): rows with y w^T x > 1 + T are skipped until the next
        check (margin units).
    seed : int
        The random stream (w_0's sample, the queries' and dual CD's orders).

    Solves of the active set S (problem (13))
    -----------------------------------------
    init_iters : int
        Dual CD passes over w_0's sample: w_0 only starts the search (passes).
    quick_iters : int
        Passes for a solve of S on the way (S doubled, or a check follows).
    max_iters : int
        Passes for a solve of S that a stop rests on (LIBLINEAR's limit before 2.42).
    newton : bool
        S of the hinge is solved first by Newton's method on the smoothed hinge
        (:mod:`ooc_learn.solvers.hinge_newton`: d + 1 unknowns, where dual CD needs
        thousands of passes over S's correlated rows near the margin; a spilled S is read
        window by window, a pass a step), then by dual CD from the dual point it leaves (a
        spilled S: its working-set rounds); off: dual CD alone.
    quick_newton_steps : int
        Where ``newton`` holds, a solve of S on the way takes at most this many Newton steps
        on a wider smoothing (``solve.QUICK_H``) and then ``solve.QUICK_POLISH`` passes of
        dual CD (a spilled S: ``solve.SPILLED_QUICK_POLISH`` rounds), instead of
        ``quick_iters`` passes (which leave S's correlated rows far from solved); 0:
        ``quick_iters`` passes of dual CD alone.
    dual_switch_iters : int
        A resident squared-hinge solve of S that dual CD has not finished in this many
        passes goes on by TRON from the w reached (LIBLINEAR's ``-s 1``).
    primal_eps : float
        TRON's relative gradient tolerance, scaled by LIBLINEAR's ``-s 2`` class factor.
    resolve_growth : float
        S is solved (B = S) and its inactive rows pruned each time it has grown by this
        factor since it last was (ratio).
    check_growth : float
        A check brings back at most this many times |S| rows (and at least n; the frozen
        rows count in |S| here).
    check_sample : float
        A check's pass ends at the end of the first block by which it has seen this many
        times the rows it may admit violating: the blocks are iid
        shards, so the violators of that sample stand for the store's, and the
        check costs the share of the store it read. A pass that never sees as many reads
        every block; only such a pass may certify a stop. 0: every pass reads every block
        (ratio).
    admit : str
        Which violators a check's scan admits where it found more than it may admit:
        "random", a uniform sample of them; "worst", the most violating first. The solve of
        S that follows sees the violators' mix rather than their extreme: on the issue-23
        store under a cap the admitted extreme swung w (test accuracy 94 -> 17 %) and the
        exact stop took more checks (bench-log, 2026-11-29, session 48).
    freeze_margin : float
        The convex hinge SVM with the exact stop: a row of S at alpha = C with
        y w^T x < 1 - freeze_margin leaves S with its alpha (frozen at C, kept in w). Every
        scan of the check examines it again and brings it back where y w^T x > 1 (its alpha
        would fall); ``inf`` freezes none (margin units).
    thaw_stalls : int
        After a full solve of S a frozen row comes back where y w^T x > 1 + eps (after a
        quick one, where it exceeds 1 + the spread that solve left); once this many full
        solves in a row have stopped at their passes short of eps, where it exceeds 1 + the
        spread they left, as any row outside S is held to then (with eps alone, rows thawed and
        froze again without end on Fashion-MNIST class 1 at C = 100; not at once, because a
        first stalled solve is often followed by converged ones).
    prune_bytes : int or None
        A freezing run whose S holds more than this many bytes of rows also drops S's rows
        at alpha = 0 with y w^T x >= 1 after every solve (a pass of dual CD then streams S
        from memory, and the scan that follows examines those rows anyway); below it they
        stay until S doubles (on the small stores measured, the pruned rows came back and
        cost more checks than the passes saved). None: the CPU's last-level cache (32 MiB
        where the system does not say); 0: always (bytes).

    The index's queries and the choice between query and scan
    ---------------------------------------------------------
    query_share : float
        A query examines at most this share of the rows (and at least 2n), and reads at
        most as many (share of n).
    min_precision : float
        A query stops once, past 2n rows examined, fewer than this share of them qualified.
    dense_query : float
        A query that found every row asked, with at least this share of the rows it examined
        qualifying, doubles the next query's n (up to query_share / 2 of the rows).
    cost_model : bool
        Whether the query-or-scan choice is made (off: the index is asked until a query is
        cut, as Algorithm 1 is written; the sampled rule turns it off too).
    visit_cost : float
        A node or leaf visited by a query, in stored values touched (the unit of the cost
        model: a scanned row costs its stored values).
    read_cost : float
        Extra cost per stored value a scan reads from the store rather than the cache
        (multiplier).
    query_read_cost : float
        Extra cost per stored value a query reads from the store (multiplier).
    scan_margin : float
        The scan replaces the index only where it is this many times cheaper (ratio).

    The check (§4.3) and its pool
    -----------------------------
    pool_band : float
        Rows within this margin of a boundary that a scan saw but did not admit are kept for
        the next check (margin units).
    pool_share : int
        The pool holds at most n rows in 1 / pool_share of the cap.

    The active set under the cap (§4.2)
    -----------------------------------
    resident_share : float
        The share of the cap S may hold in memory before it spills to disk.
    spilled_rounds : int
        Working-set rounds of a solve of a spilled S on the way.
    spilled_final_rounds : int
        Rounds at most of the solve of a spilled S that a stop rests on ...
    spilled_stall : int
        ... which also ends once the spread has not fallen by 1 % in this many rounds.
    spilled_window_iters : int
        Dual CD passes over one window in a sweep of a spilled S.
    spilled_resolve_rounds : int
        Rounds of the solve of a spilled S each time it has grown by ``resolve_growth``.

    Examples
    --------
    >>> IBCDConfig(C=0.5, s=1.0).replace(n=200).n
    200
    """

    # the problem
    loss: str = "hinge"
    C: float = 1.0
    s: float | None = None
    bias: float = 1.0
    # Algorithm 1
    n: int = 1000
    eps: float = 0.1
    sample_eps: float = 0.0
    max_outer: int = 10
    init_sample: int = 10000
    block_iters: int = 10
    block_solver: str = "dual"
    shrink_threshold: float = 1.0
    seed: int = 0
    # solves of S
    init_iters: int = 50
    quick_iters: int = 100
    max_iters: int = 1000
    newton: bool = True
    quick_newton_steps: int = 10
    dual_switch_iters: int = 300
    primal_eps: float = 0.01
    resolve_growth: float = 2.0
    check_growth: float = 1.0
    check_sample: float = 2.0
    admit: str = "random"
    freeze_margin: float = 0.2
    thaw_stalls: int = 3
    prune_bytes: int | None = None
    # queries, and query or scan
    query_share: float = 0.05
    min_precision: float = 0.05
    dense_query: float = 0.4
    cost_model: bool = True
    visit_cost: float = 100_000.0
    read_cost: float = 2.0
    query_read_cost: float = 60.0
    scan_margin: float = 2.0
    # the check's pool
    pool_band: float = 1.0
    pool_share: int = 8
    # the active set under the cap
    resident_share: float = 0.8
    spilled_rounds: int = 10
    spilled_final_rounds: int = 300
    spilled_stall: int = 20
    spilled_window_iters: int = 20
    spilled_resolve_rounds: int = 30

    def __post_init__(self):
        for name, cond, hint in _RULES:
            value = getattr(self, name)
            if not cond(value):
                raise ParameterError(f"The '{name}' parameter of solve_ibcd must be "
                                     f"{_WANT[name]}. Got {value!r} instead.", hint)
        if self.block_solver == "primal" and self.loss != "sqhinge":
            raise ParameterError("The primal block solver (TRON, eq. 16) needs the squared "
                                 "hinge.", "Use --loss sqhinge or the dual block solver.")

    def replace(self, **changes) -> "IBCDConfig":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def truncated(self) -> bool:
        return self.s is not None

    @property
    def freezes(self) -> bool:
        """Whether rows at alpha = C leave S frozen (``freeze_margin``): the convex hinge
        SVM solved by dual CD with the exact stop, whose scans examine every frozen row."""
        return (self.s is None and self.loss == "hinge" and self.sample_eps == 0
                and self.block_solver == "dual" and math.isfinite(self.freeze_margin))

    @property
    def newton_on_S(self) -> bool:
        """Whether solves of S begin with Newton's method on the smoothed hinge (``newton``,
        for the hinge: to convergence in a solve a stop rests on, ``quick_newton_steps`` on
        the way; where S is large enough: ``solve.solve_S``)."""
        return self.newton and self.loss == "hinge"

    @property
    def prune_above(self) -> int:
        """``prune_bytes``, with None read as the CPU's last-level cache."""
        return last_level_cache_bytes() if self.prune_bytes is None else int(self.prune_bytes)

    @property
    def frozen_alpha(self) -> float:
        """A frozen row's alpha: the hinge's upper bound U = C."""
        return float(self.C)


def _int(lo):
    return lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo


def _num(lo, *, open_lo=False, hi=math.inf, open_hi=False, inf_ok=False):
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            return False
        v = float(v)
        if not (math.isfinite(v) or inf_ok and v == math.inf):
            return False
        return (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
    return ok


# (field, condition, hint); _WANT says the condition in words
_RULES = [
    ("C", _num(0, open_lo=True, hi=1e300), "C is the SVM cost; try 1."),
    ("n", _int(1), "The paper queries about 1000 rows per step."),
    ("eps", _num(0, open_lo=True), "LIBLINEAR's dual CD default is 0.1."),
    ("sample_eps", _num(0, hi=1, open_hi=True), "0 disables the sampled stopping rule."),
    ("max_outer", _int(1), "Try 10."),
    ("init_sample", _int(1), "The paper uses 10000."),
    ("s", lambda v: v is None or _num(0)(v),
     "s = 1 is the usual truncation; None disables it."),
    ("bias", _num(-math.inf), "Use 1 (a bias feature) or 0 (none)."),
    ("block_iters", _int(1), "Try 10."),
    ("loss", lambda v: v in ("hinge", "sqhinge"), ""),
    ("block_solver", lambda v: v in ("dual", "primal"), ""),
    ("shrink_threshold", _num(0, inf_ok=True), "The paper's T is 1."),
    ("seed", _int(0), "Any int >= 0."),
    ("init_iters", _int(1), "Try 50."),
    ("quick_iters", _int(1), "Try 100."),
    ("max_iters", _int(1), "LIBLINEAR stops at 1000."),
    ("dual_switch_iters", _int(1), "LIBLINEAR's -s 1 switches at 300."),
    ("primal_eps", _num(0, open_lo=True), "LIBLINEAR's -s 2 default is 0.01."),
    ("resolve_growth", _num(1, open_lo=True), "Try 2."),
    ("check_growth", _num(0, open_lo=True), "Try 1."),
    ("check_sample", _num(0), "Try 2; 0 reads every row at every check."),
    ("admit", lambda v: v in ("random", "worst"), "'random' or 'worst'."),
    ("freeze_margin", _num(0, inf_ok=True), "Try 0.2; inf freezes no row."),
    ("thaw_stalls", _int(1), "Try 3."),
    ("prune_bytes", lambda v: v is None or _int(0)(v),
     "None takes the CPU's last-level cache."),
    ("query_share", _num(0), "Try 0.05."),
    ("min_precision", _num(0, hi=1), "Try 0.05."),
    ("dense_query", _num(0, hi=1), "Try 0.4."),
    ("cost_model", lambda v: isinstance(v, (bool, np.bool_)), "True or False."),
    ("newton", lambda v: isinstance(v, (bool, np.bool_)), "True or False."),
    ("quick_newton_steps", _int(0), "Try 10; 0 solves S on the way by dual CD alone."),
    ("visit_cost", _num(0), "Try 100000."),
    ("read_cost", _num(0), "Try 2."),
    ("query_read_cost", _num(0), "Try 60."),
    ("scan_margin", _num(0, open_lo=True), "Try 2."),
    ("pool_band", _num(0), "Try 1."),
    ("pool_share", _int(1), "Try 8."),
    ("resident_share", _num(0, open_lo=True, hi=1), "Try 0.8."),
    ("spilled_rounds", _int(1), "Try 10."),
    ("spilled_final_rounds", _int(1), "Try 300."),
    ("spilled_stall", _int(1), "Try 20."),
    ("spilled_window_iters", _int(1), "Try 20."),
    ("spilled_resolve_rounds", _int(1), "Try 30."),
]
_WANT = {
    "C": "> 0", "eps": "> 0", "sample_eps": "in [0, 1)", "s": ">= 0 or None",
    "loss": "'hinge' or 'sqhinge'", "block_solver": "'dual' or 'primal'",
    "admit": "'random' or 'worst'",
    "cost_model": "a bool", "newton": "a bool", "min_precision": "in [0, 1]",
    "dense_query": "in [0, 1]",
    "resident_share": "in (0, 1]", "resolve_growth": "> 1", "check_growth": "> 0",
    "primal_eps": "> 0", "scan_margin": "> 0",
    **{k: "an int >= 1" for k in ("n", "max_outer", "init_sample", "block_iters", "init_iters",
                                 "quick_iters", "max_iters", "dual_switch_iters",
                                 "pool_share", "thaw_stalls", "spilled_rounds",
                                 "spilled_final_rounds",
                                 "spilled_stall", "spilled_window_iters",
                                 "spilled_resolve_rounds")},
    "seed": "an int >= 0", "quick_newton_steps": "an int >= 0", "bias": "a finite number",
    "prune_bytes": "an int >= 0 or None",
}
for _name, _, _ in _RULES:
    _WANT.setdefault(_name, ">= 0")
del _name
