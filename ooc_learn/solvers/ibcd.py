"""Indexed Block Coordinate Descent with truncated-loss relaxation (Yen et al., KDD 2013).

Objective (2), the truncated SVM::

    min_w  1/2 |w|^2 + C sum_i R_s(y_i w^T x_i),   R_s(z) = min(L(z), 1 + s),

L the hinge (L1) or squared hinge (L2), the bias a regularized constant feature (LIBLINEAR
``-B 1``). The outer relaxation (eq. 5) fixes the loss of the outliers
OUT(w_t) = {i : y_i w_t^T x_i < L^-1(1+s)} at the cap and solves the convex problem (7) on
IN(w_t); it stops when no row changes side (OUT(w_t) = OUT(w_{t-1})). ``s=None`` solves the
plain convex SVM (one outer iteration).

Each convex problem is solved by Algorithm 1 (§3.1) out of core: an active set S of rows in
memory (every row with alpha > 0 stays in S); each step asks the metric-forest index for up to
``n`` fresh rows satisfying eq. 10 (not an outlier at w_t, y w^T x < 1), forms the block
B = N ∪ the next n_e - |N| rows of S (a cyclic reader; n doubles while queries find violators
densely, ``DENSE_QUERY``), solves the block sub-problem (11) by
dual CD (or TRON on the primal (16) for the L2 loss), and grows S by N. Each time S has
doubled, the block is S itself (problem (13), at most ``QUICK_ITERS`` passes) and S's
inactive rows leave it (``RESOLVE_GROWTH``). The inner loop stops when |N| < n (every
qualifying row not in S was found: the index search is exhaustive when it runs out of
candidates) or by the sampled rule |N| / n_e < ``sample_eps``, judged by a query at a
solution of (13) on S (one that meets it elsewhere is followed by that solve and a second
query, whose answer counts). A query examines at
most ``QUERY_SHARE`` of the rows, and stops at 2n examined if fewer than ``MIN_PRECISION`` of
them qualified: one cut so with fewer than n/2 rows ends the loop (finding the last, sparse
violators through the index costs more than the check below), and so does a query that cost
more than ``SCAN_MARGIN`` scans (a cost model in stored values touched, ``VISIT_COST`` per
node or leaf visited; off with the sampled rule). Then problem (13) on S is solved to ``eps``
(in ``QUICK_ITERS`` dual CD passes first) and every row outside S is checked against eq. 10
with shrinking undone (§4.3), by a sequential block scan since the whole data is examined; the
most violating rows it finds (at most |S|) join S. The index is asked again unless a query was
cut or the scan finds rows ``SCAN_MARGIN`` times cheaper, in which case the scans alone find
the rest of this convex problem's violators. Only when a check finds nothing (or violations
below the tolerance) after a solve of S to ``eps`` within 1000 passes (``MAX_ITERS``) is the
convex problem solved on all rows. For the squared hinge, a solve of S that dual CD has not
finished in 300 passes goes on by TRON, as LIBLINEAR's -s 1 does (``DUAL_SWITCH_ITERS``).

w_0 is the convex solution on a random sample of ``init_sample`` rows (§3.1), whose support
vectors and alphas start S.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ooc_learn.losses import get_loss
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.resources import release_free_heap
from ooc_learn.storage.store import matrix_nbytes

from ._common import margins, rows_in_order
from .active_set import ActiveSet
from .dcd import dcd_subproblem, held_out, solve_dcd
from .ibcd_check import Checker, reserve_rows

__all__ = ["solve_ibcd", "IBCDResult"]

log = logging.getLogger(__name__)

# dual CD passes over the initial sample: w_0 only starts the search, its precision is not
# the answer's (1000 passes cost seconds on 10,000 rows of Fashion-MNIST)
INIT_ITERS = 50
# dual CD passes for a solve of S (problem 13): on the way (S doubled, or a check follows) at
# most QUICK_ITERS; the solve a stop rests on gets MAX_ITERS, LIBLINEAR's limit before 2.42
# and scikit-learn's LinearSVC default. (LIBLINEAR >= 2.42 stops its dual solvers at 300,
# train_one's dual_solver_max_iter. Tried here: the README's 20k-row example then ends with
# S unconverged and a warning, where 1000 converges; the sampled rule at 1g, 768M, took
# 25-34 s against 33-36 s, within this machine's noise, objective no lower.) Where dual CD
# converges slowly (Fashion-MNIST and the generated store, C = 1) S's solves stop at the
# limit before most checks, which then find more rows anyway
QUICK_ITERS = 100
MAX_ITERS = 1000
# the leaves a query read are remembered for the fetch that follows in at most 1/8 of the cap
MEMO_SHARE = 8
# a query examines at most this share of the rows (and at least 2n): once qualifying rows are
# sparse, finding the last ones through the index costs more than the sequential check, which
# examines every row at a small fraction of a leaf visit's cost (measured on Fashion-MNIST:
# ~20x cheaper per row with the data cached, ~80x under a 1/10 cap). It also bounds the rows a
# query may read. 0.1 -> 0.05, paper setting (s = 1, sample_eps 0.05) at the 1/10 caps: rows
# read per outer iteration Fashion-MNIST 0.24-0.28 -> 0.13-0.16 (6 seeds), the generated store
# 0.25-0.36 -> 0.14-0.20 (3 seeds; its queries all stopped at the read bound), test accuracy
# within 0.03 points, capped runs 15-40 % faster; the exact stop alike (3 and 2 seeds). At
# 0.025 the generated store's L1 runs lost 0.1 points (worst seed -0.2).
QUERY_SHARE = 0.05
# ... and stops early once, past 2n rows examined, fewer than this share of them qualified: at
# ~20x a scanned row's cost per examined row, the check finds sparser violators cheaper (on
# Fashion-MNIST with s = 1, the queries after w leaves w_t's band found 5-45 rows in 6000)
MIN_PRECISION = 0.05
# whether the query-or-scan choice below is made (off: the index is asked until a query is
# cut, as the paper's Algorithm 1; the sampled rule turns it off too)
COST_MODEL = True
# the query-or-scan choice in one unit, stored values touched: a scan check touches each row
# outside S once; a query the rows it examines and the pivots it scores, plus this much per
# node or leaf it visits (the best-first loop runs in Python: ~40 us a visit, measured on
# Fashion-MNIST and the generated store, against 0.3-1.2 ns a stored value in the scan)
VISIT_COST = 100_000
# ... and the scan is chosen only where it is this many times cheaper: a query's rows go into
# S through block solves of n_e rows, a check's through a solve of all of S, which costs more
# where dual CD on S converges slowly (the generated store's L1 problem: 7.5 s against 6.1 s
# at a margin of 1)
SCAN_MARGIN = 2.0
# a row read from the store rather than the cache costs this much more per stored value: a
# scan reads long sequential runs (a check of Fashion-MNIST under a 1/10 cap took 0.04-0.06 s
# against 0.011-0.022 s cached), a query scattered leaves and pivots (~14 us a row of 784
# values under that cap, ~60x a value scanned). Under the caps of scripts/bench_train.py (CPU
# s, without -> with READ_COST = 2, QUERY_READ_COST = 20): Fashion L1 1.02 -> 1.13, Fashion
# s = 1 2.33 -> 1.92, generated 4.08 -> 2.90; QUERY_READ_COST 20 -> 60: Fashion L1 1.08 ->
# 0.65 (3 queries -> 1), Fashion s = 1 2.05 -> 1.92, generated unchanged (same path)
READ_COST = 2.0
QUERY_READ_COST = 60.0
# a query that returns all the rows asked with at least this share of the rows it examined
# qualifying means violators are dense: the next asks twice as many (up to QUERY_SHARE / 2 of
# the rows; back to n after a short query), so S is not built 1000 rows at a time when a third
# of the data are support vectors (generated store, squared hinge: 126 queries -> 17)
DENSE_QUERY = 0.4
# problem (13) on S is solved (B = S) each time S has doubled since it last was, and the rows
# left inactive (alpha = 0, y w^T x >= 1) leave S: blocks of fresh rows pull w towards them,
# rows near the margin flip in and out, and without it S swallows them all (generated 419k x
# 100 store: |S| 331k of which 32k support vectors; with it 14k, 54 s -> 15 s); the doubling
# keeps the extra solves within about one more solve of the final S
RESOLVE_GROWTH = 2.0
CHECK_GROWTH = 1
# TRON's stopping rule for the primal block solver, on blocks and on S: LIBLINEAR's -s 2
# default |grad f(w)| <= PRIMAL_EPS max(min(pos, neg), 1) / l |grad f(0)|, pos and neg the
# problem's rows of each class (on Fashion-MNIST's class 1, without the class factor S's TRON
# stopped 2.7 % above the optimum, 952 against 927; with it 0.01 %)
PRIMAL_EPS = 0.01
# LIBLINEAR's -s 1 (2.40 on): dual CD on the squared hinge stops at 300 passes and, not yet
# converged, finishes by TRON on the primal (-s 2) from the w it reached. A full solve of S
# (the one a stop rests on) does the same: where the dual is ill-conditioned (the generated
# store, a third of its 419k rows support vectors, C = 1) dual CD needed ~1000 passes over
# S's 165-197k rows, 35-39 s of a 57-75 s run, where TRON on S takes under a second. (A
# spilled S stays with dual CD: TRON needs S's rows in memory)
DUAL_SWITCH_ITERS = 300
# a spilled S is solved in rounds of a working set read back from disk (one pass over S's
# windows for the gradients, one window solved in memory): SPILLED_ROUNDS on the way, and for
# the solve a stop rests on up to SPILLED_FINAL_ROUNDS, ended early once the spread has not
# fallen by 1 % in SPILLED_STALL rounds. Ten rounds left such a solve far from the optimum
# where the window holds a tenth of S (augmented Fashion-MNIST, 60k rows, a 15 MB working
# share: |S| 15k, windows of ~1.5k rows, test accuracy 85.4 % against 97.8 % uncapped)
SPILLED_ROUNDS = 10
SPILLED_FINAL_ROUNDS = 300
SPILLED_STALL = 20
# dual CD passes over one window in a sweep of a spilled S
SPILLED_WINDOW_ITERS = 20
# working-set rounds of the solve of a spilled S each time it doubles (its inactive rows are
# pruned after it): 120k rows of tops-vs-rest, s = 1, sampled rule, 5 seeds, 10 -> 30 rounds:
# 8M cap 11.5-17 s -> 14.6-19 s, mean test accuracy 96.62 -> 96.65 %; 16M cap 5.5-7 s ->
# 6.7-7.8 s, 96.61 -> 96.74 % (without these solves 96.71 and 96.86 %, 29-44 s and 12-17 s)
SPILLED_RESOLVE_ROUNDS = 30


@dataclass
class IBCDResult:
    """Weights (``w[:d]``, bias weight ``w[d]``), the final active set and the work done."""

    w: np.ndarray
    sv_rows: np.ndarray
    sv_alpha: np.ndarray
    stats: dict = field(default_factory=dict)


def _check(C, n, eps, sample_eps, max_outer, init_sample, s, block_iters, loss, solver):
    def bad(name, cond, got, hint):
        raise ParameterError(f"The '{name}' parameter of solve_ibcd must be {cond}. "
                             f"Got {got!r} instead.", hint)

    if not (isinstance(C, (int, float)) and C > 0 and math.isfinite(C)):
        bad("C", "> 0", C, "C is the SVM cost; try 1.")
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        bad("n", "an int >= 1", n, "The paper queries about 1000 rows per step.")
    if not eps > 0:
        bad("eps", "> 0", eps, "LIBLINEAR's dual CD default is 0.1.")
    if not 0 <= sample_eps < 1:
        bad("sample_eps", "in [0, 1)", sample_eps, "0 disables the sampled stopping rule.")
    if not (isinstance(max_outer, (int, np.integer)) and max_outer >= 1):
        bad("max_outer", "an int >= 1", max_outer, "Try 10.")
    if not (isinstance(init_sample, (int, np.integer)) and init_sample >= 1):
        bad("init_sample", "an int >= 1", init_sample, "The paper uses 10000.")
    if s is not None and not s >= 0:
        bad("s", ">= 0 or None", s, "s = 1 is the usual truncation; None disables it.")
    if not (isinstance(block_iters, (int, np.integer)) and block_iters >= 1):
        bad("block_iters", "an int >= 1", block_iters, "Try 10.")
    if loss not in ("hinge", "sqhinge"):
        bad("loss", "'hinge' or 'sqhinge'", loss, "")
    if solver not in ("dual", "primal"):
        bad("block_solver", "'dual' or 'primal'", solver, "")
    if solver == "primal" and loss != "sqhinge":
        raise ParameterError("The primal block solver (TRON, eq. 16) needs the squared hinge.",
                             "Use --loss sqhinge or the dual block solver.")


def solve_ibcd(store, *, loss: str = "hinge", C: float = 1.0, s: float | None = None,
               bias: float = 1.0, n: int = 1000, eps: float = 0.1, sample_eps: float = 0.0,
               max_outer: int = 10, init_sample: int = 10000, block_iters: int = 10,
               block_solver: str = "dual", shrink_threshold: float = 1.0, seed: int = 0,
               spill_dir=None, on_outer: Callable[[dict], None] | None = None,
               holdout=None, warm=None) -> IBCDResult:
    """Train a linear SVM on an indexed store by IBCD (see the module docstring).

    Parameters
    ----------
    store : Store
        An open store with a metric-forest index and labels in {-1, +1}.
    loss : "hinge" | "sqhinge"
    C : float
        The SVM cost.
    s : float or None
        The truncation of the loss (None: the convex SVM).
    n : int
        Fresh rows asked of the index per step.
    eps : float
        Dual CD stopping tolerance on S (LIBLINEAR's projected-gradient spread).
    sample_eps : float
        The sampled stopping rule |N| / n_e < sample_eps (0: only |N| < n).
    block_iters : int
        Dual CD passes over each block B.
    block_solver : "dual" | "primal"
        Dual CD on (11), or TRON on the primal (16) (squared hinge only).
    shrink_threshold : float
        Shrinking on the index (§4.3): rows with y w^T x > 1 + T are not visited again until
        the convergence check.
    spill_dir : path, optional
        Where the active set spills when it outgrows its share of the cap (§4.2); default:
        the folder holding the store (the data's own disk, not a RAM-backed /tmp).
    holdout : (start, stop) or bool array (n,), optional
        Rows left out of the problem (a cross-validation fold; a range, or a mask True on
        them): the index and the checks pass over them as over rows already in S, and w_0's
        sample avoids them.
    warm : (rows, alpha), optional
        Start from a previous solution instead of w_0 (§3.1's sample): its support vectors
        (store rows and their alpha) start S and w = sum alpha_i y_i [x_i, bias].
        Rows inside ``holdout`` are dropped from it (cross-validation's next fold).

    Returns
    -------
    IBCDResult
        ``stats``: outer_iterations, inner_iterations, active_set, n_sv, rows_read,
        bytes_read, rows_examined, objective (of the convex problem on S: equal to the full
        objective after an exact stop, below it after a sampled stop), spills, rows_spilled,
        rows_read_back (the active set's disk traffic), seconds.
    """
    _check(C, n, eps, sample_eps, max_outer, init_sample, s, block_iters, loss, block_solver)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    # counted from here: opening the forest already reads (and caches) pivot rows
    rows_read0, bytes_read0 = store.rows_read, store.bytes_read
    rows_src = _RowSource(store)
    forest = rows_src.open_forest()
    N_all, d = store.n_samples, store.n_features
    base_loss = get_loss(loss).base()
    ho_a, ho_z, ho_mask = held_out(holdout, N_all, "holdout of solve_ibcd")
    held = (ho_a, ho_z, ho_mask)

    # ---- w_0 from a random sample (§3.1) -------------------------------------------------
    # the sample, its dual CD state and a copy must fit the cap: shrink it if they do not.
    # Sized from the cap, not from what is free now: the free part depends on what the
    # caches happen to hold (opening the forest, the index's decoded trees), and w_0 from
    # another sample size takes another path (Fashion-MNIST at 1/10, L1, seed 0: 1406 rows
    # gave 4 outer iterations and 60k rows read; 1352 rows, 10 and 441k). Cache entries are
    # evicted for it; only what cannot be (a cap nearly full of buffers) shrinks it further
    row_bytes = sample_row_bytes(store)
    N_train = N_all - (ho_z - ho_a if ho_mask is None else int(ho_mask.sum()))
    m0 = int(min(init_sample, N_train, max(100, store.budget.limit // (4 * row_bytes))))
    if not store.budget.try_reserve(2 * m0 * row_bytes):
        m0 = int(max(100, min(m0, store.budget.available // (2 * row_bytes))))
        store.budget.reserve(2 * m0 * row_bytes, "IBCD initial sample")
    start = None
    try:
        if warm is None:
            start = _sample_start(store, rng, m0, held, loss=loss, C=C, bias=bias, eps=eps)
    finally:
        store.budget.release(2 * m0 * row_bytes)
    S = ActiveSet(d, store.layout == "csr", store.budget,
                  spill_dir=_spill_dir(store, spill_dir))
    in_S = np.zeros(N_all, bool)
    store.budget.reserve(N_all, "IBCD active-set mask")
    checker = None
    try:
        if start is not None:
            w, rows, Xs, ys, alpha = start
            del start
            S.add(rows, Xs, ys, _row_sqn(Xs), alpha)
            del Xs, ys
        else:
            w = _start_from_warm(store, S, warm, m0, row_bytes, held, bias)
        in_S[S.rows[: S.m]] = True
        if ho_mask is None:  # held out: neither asked for nor checked
            in_S[ho_a:ho_z] = True
        else:
            in_S |= ho_mask
        stats = {"inner_iterations": 0, "rows_examined": 0, "block_updates": 0,
                 "queries": 0, "queries_cut": 0, "queries_truncated": 0,
                 "queries_imprecise": 0, "queries_grown": 0, "scans_preferred": 0,
                 "queries_slow": 0, "full_solves_skipped": 0, "pruned": 0,
                 "S_resolves": 0, "switched_to_primal": 0, "stopped_by_sample_rule": 0,
                 "sample_rule_rechecks": 0, "fetches_cut": 0, "outer_log": []}
        from ooc_learn.index.forest import outlier_margin

        checker = Checker(rows_src, in_S, low=outlier_margin(loss, s), bias=bias, pool_rows=n,
                          stats=stats)
        return _outer_loop(rows_src, forest, S, in_S, checker, w, stats=stats, loss=loss,
                           base_loss=base_loss, C=C, s=s, bias=bias, n=n, eps=eps, sample_eps=sample_eps,
                           max_outer=max_outer, block_iters=block_iters,
                           block_solver=block_solver, shrink_threshold=shrink_threshold,
                           rng=rng, on_outer=on_outer, t0=t0, rows_read0=rows_read0,
                           bytes_read0=bytes_read0)
    finally:
        if checker is not None:
            checker.clear()
        S.release()
        store.budget.release(N_all)
        forest.close()
        rows_src.clear()


def sample_row_bytes(store) -> int:
    """What a row of w_0's sample holds while it is solved: the row and its dual state
    (IBCD reserves twice this per sampled row: the rows and the copy S takes)."""
    return max(1, store.estimated_bytes(1)) + 40


def _sample_start(store, rng, m0, holdout, *, loss, C, bias, eps):
    """w_0 from dual CD on a random sample of m0 training rows (§3.1); returns ``(w_0, rows,
    X, y, alpha)`` of its support vectors, which start S."""
    a, z, mask = holdout
    if mask is None:
        sample = rng.choice(store.n_samples - (z - a), m0, replace=False)
        sample[sample >= a] += z - a  # the held-out rows are skipped
    else:
        sample = rng.choice(np.flatnonzero(~mask), m0, replace=False)
    sample.sort()
    Xs, ys, _ = store.gather(sample, whole_blocks=False)
    ys = ys.astype(np.float64)
    res0 = solve_dcd(Xs, ys, loss=loss, C=C, bias=bias, eps=eps, max_iter=INIT_ITERS,
                     seed=int(rng.integers(1 << 31)), warn=False)  # INIT_ITERS is meant
    sv = np.flatnonzero(res0.alpha > 0)
    return res0.w.copy(), sample[sv], Xs[sv], ys[sv], res0.alpha[sv]


def _start_from_warm(store, S, warm, chunk: int, row_bytes: int, holdout, bias) -> np.ndarray:
    """S from a previous solution's support vectors outside ``holdout``, read ``chunk`` rows
    at a time (each paid from the budget while it is copied into S); returns their
    w = sum alpha_i y_i [x_i, bias]."""
    from . import _kernels as K
    from ._common import kernel_args

    rows, alpha = (np.asarray(v) for v in warm)
    order = np.argsort(rows, kind="stable")
    rows, alpha = rows.astype(np.int64)[order], alpha.astype(np.float64)[order]
    if rows.shape != alpha.shape or (rows.size and (np.any(np.diff(rows) <= 0)
                                                    or rows[0] < 0
                                                    or rows[-1] >= store.n_samples)):
        raise ParameterError("The 'warm' parameter of solve_ibcd must be (rows, alpha): "
                             "distinct store rows and one alpha each.",
                             "Pass a previous result's (sv_rows, sv_alpha).")
    a, z, mask = holdout
    keep = (((rows < a) | (rows >= z)) if mask is None else ~mask[rows]) & (alpha > 0)
    rows, alpha = rows[keep], alpha[keep]
    w = np.zeros(store.n_features + 1)
    for i in range(0, rows.size, chunk):
        r, al = rows[i:i + chunk], alpha[i:i + chunk]
        with store.budget.reservation(2 * r.size * row_bytes, "IBCD warm start"):
            X, y, _ = store.gather(r, whole_blocks=False)
            y = y.astype(np.float64)
            K.rebuild_w(*kernel_args(X), float(bias), y, np.arange(r.size, dtype=np.int64),
                        al, w)
            S.add(r, X, y, _row_sqn(X), al)
            del X, y
    return w


def _spill_dir(store, spill_dir) -> Path:
    if spill_dir is not None:
        return Path(spill_dir)
    parent = Path(store.path).resolve().parent
    return parent if os.access(parent, os.W_OK) else Path(tempfile.gettempdir())


class _RowSource:
    """One reader for the index's leaf reads and the active set's row fetches (§4.2).

    The forest IBCD queries reads its leaves through :meth:`read_range`: from the store's
    block cache when the block is cached, else as a range read that is also remembered (bytes
    paid from the budget, never evicting) until the next :meth:`fetch`. :meth:`fetch` then
    takes the rows a query returned from those cached blocks and remembered leaves, so a row
    the index just read is not read again; only rows of leaves the forest had cached earlier
    are gathered, as runs (``whole_blocks=False``).

    Neither loads a block whole where the cap would allow it (``Store.reads_whole_block``):
    a query wants a few leaves of a block, and the forest caches the leaves it read. Loading
    whole blocks made an uncapped run read the store once whatever it needed (generated
    store, s = 1, sampled rule, 3 seeds: rows read 0.95-1.08 of the store in 2-6 outer
    iterations, 0.31-0.49 of it per outer iteration; reading leaves and runs, 0.28-0.73 in
    total, 0.10-0.14 per outer iteration, the same test accuracy and times, and the same
    paths but one: an L1 seed whose blocks were no longer all cached went on asking the
    index instead of scanning, 10 outer iterations -> 5). The scan check still reads whole
    blocks through the cache.
    """

    def __init__(self, store):
        self.store = store
        self.offsets = np.asarray(store.block_offsets, dtype=np.int64)
        self._memo: dict = {}  # start -> (stop, X, y) of leaves read since the last fetch
        self._memo_bytes = 0

    def open_forest(self):
        from ooc_learn.index.forest import Forest, view_labels
        from ooc_learn.storage.format import INDEX_DIR

        st = self.store
        if not st.has_index:
            return st.index  # raises the store's own "no index" error
        return Forest(Path(st.path) / INDEX_DIR, read_range=self.read_range,
                      n_samples=st.n_samples, n_features=st.n_features,
                      block_offsets=st.block_offsets, budget=st.budget, name=str(st.path),
                      read_rows=self.read_rows, block_cache=st.block_cache,
                      block_labels=view_labels(st))

    def read_range(self, start: int, stop: int):
        b = int(np.searchsorted(self.offsets, start, side="right") - 1)
        if (0 <= b < len(self.offsets) - 1 and stop <= self.offsets[b + 1]
                and self.store.block_is_cached(b)):
            X, y, ids = self.store.read_block(b)
            lo = int(self.offsets[b])
            return X[start - lo:stop - lo], y[start - lo:stop - lo], ids[start - lo:stop - lo]
        X, y, ids = self.store.read_range(start, stop, ids=False)  # the index needs no ids
        nb = matrix_nbytes(X) + y.nbytes
        # remembered only within a share of the cap: a long search must not starve the rest
        if (self._memo_bytes + nb <= self.store.budget.limit // MEMO_SHARE
                and self.store.budget.try_reserve(nb, evict=False)):
            self._memo[int(start)] = (int(stop), X, y)
            self._memo_bytes += nb
        return X, y, ids

    def read_rows(self, rows):
        """Sorted scattered rows (a node's pivot rows): from the block cache when their block
        is cached, else one direct read each."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size:
            b = int(np.searchsorted(self.offsets, rows[0], side="right") - 1)
            if rows[-1] < self.offsets[b + 1] and self.store.block_is_cached(b):
                X, y, _ = self.store.read_block(b)
                return X[rows - self.offsets[b]], y[rows - self.offsets[b]]
        return self.store.read_rows(rows)

    def clear(self) -> None:
        self._memo.clear()
        self.store.budget.release(self._memo_bytes)
        self._memo_bytes = 0

    def fetch(self, rows):
        """``(X, y)`` of store rows, in the order given; reads only what is not at hand."""
        rows = np.asarray(rows, dtype=np.int64)
        parts = []  # (positions in rows, X, y)
        left = np.ones(rows.size, bool)
        blocks = np.searchsorted(self.offsets, rows, side="right") - 1
        order = np.argsort(blocks, kind="stable")
        ub, first = np.unique(blocks[order], return_index=True)
        for b, a, z in zip(ub, first, np.r_[first[1:], rows.size]):
            if not self.store.block_is_cached(int(b)):
                continue
            pos = order[a:z]
            X, y, _ = self.store.read_block(int(b))
            local = rows[pos] - self.offsets[b]
            parts.append((pos, X[local], y[local]))
            left[pos] = False
        if self._memo and left.any():
            starts = np.fromiter(self._memo.keys(), np.int64, len(self._memo))
            starts.sort()
            stops = np.array([self._memo[int(a)][0] for a in starts], np.int64)
            pos = np.flatnonzero(left)
            i = np.searchsorted(starts, rows[pos], side="right") - 1
            hit = (i >= 0) & (rows[pos] < stops[np.maximum(i, 0)])
            for j in np.unique(i[hit]):
                sel = pos[hit & (i == j)]
                _, X, y = self._memo[int(starts[j])]
                local = rows[sel] - starts[j]
                parts.append((sel, X[local], y[local]))
                left[sel] = False
        self.clear()
        if left.any():
            pos = np.flatnonzero(left)
            X, y, _ = self.store.gather(rows[pos], whole_blocks=False)
            parts.append((pos, X, y))
        if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(rows.size)):
            return parts[0][1], parts[0][2]
        return rows_in_order(parts, rows.size)


def _row_sqn(X) -> np.ndarray:
    """Squared row norms for the active set, accumulated in float64 by the solvers' kernel
    (no float64 copy of X: the store's routine made one, 0.12 s of a 1.3 s run)."""
    from . import _kernels as K
    from ._common import kernel_args

    return K.row_sqnorms(*kernel_args(X), X.shape[0])


def _outer_loop(rows_src, forest, S, in_S, checker, w, *, stats, loss, base_loss, C, s, bias,
                n, eps, sample_eps, max_outer, block_iters, block_solver, shrink_threshold, rng,
                on_outer, t0, rows_read0, bytes_read0):
    from ooc_learn.index.forest import outlier_margin

    store = rows_src.store
    low = outlier_margin(loss, s)
    outer = 0
    converged_outer = False
    w_prev = None  # the outer iterate before w_t
    while outer < max_outer:
        outer += 1
        w_t = w.copy()
        removed = 0
        if s is not None and S.m:
            removed = _drop_outliers(S, in_S, w, w_t, low, bias)
            if outer > 1:
                # the rows the last convex problem left inactive (alpha = 0, y w^T x >= 1)
                # leave S: dual CD would pass over them in every solve of this problem, and
                # the check brings back any that the new w_t makes violate (Fashion-MNIST,
                # s = 1: S ended at 7549 rows for 467 support vectors without this)
                _prune_inactive(S, in_S, w, bias, stats)
        added, came_back = _inner_loop(
            rows_src, forest, S, in_S, checker, w, w_t, loss=loss, C=C, s=s, bias=bias, n=n,
            eps=eps, sample_eps=sample_eps, block_iters=block_iters, block_solver=block_solver,
            shrink_threshold=shrink_threshold, rng=rng, stats=stats, w_prev=w_prev)
        w_prev = w_t
        obj = _primal_on_S(S, w, base_loss, C, bias)
        entry = {"outer": outer, "objective_S": obj, "active_set": S.m,
                 "n_sv": int((S.state()[2] > 0).sum()), "added": added, "removed": removed,
                 "came_back": came_back,
                 "rows_read": store.rows_read - rows_read0,
                 "seconds": time.perf_counter() - t0}
        stats["outer_log"].append(entry)
        log.info("ibcd outer %d: objective(S) %.6g, |S| %d, rows read %d", outer, obj, S.m,
                 entry["rows_read"])
        if on_outer is not None:
            on_outer(dict(entry, w=w))  # the iterate too (read it now: it changes in place)
        if s is None:
            converged_outer = True
            break
        # OUT(w_t) == OUT(w_{t-1}) (problem t was problem t-1, whose answer w_{t+1} is) when
        # no S row became an outlier and no outlier at w_{t-1} joined S. Rows that were not
        # outliers may have joined S meanwhile: with the sampled rule, every problem finds
        # some near its margin (the test was ``added == 0``, and on both benchmark stores at
        # s = 1 the relaxation ran to max_outer)
        if outer > 1 and removed == 0 and came_back == 0:
            converged_outer = True
            break
    alpha = S.state()[2]
    nz = alpha > 0
    if not converged_outer:
        why = f"max_outer ({outer} outer iterations) before the outlier set settled"
    elif s is not None:
        why = "the outlier set settled (truncated-loss relaxation)" + (
            "; each inner loop stopped by the sampled rule, no final check"
            if sample_eps > 0 else "")
    else:
        why = ("the sampled rule (fresh rows / rows examined < sample_eps; no final check)"
               if sample_eps > 0 else
               "certified: no row outside the active set violates the optimality conditions")
    if not stats.get("S_converged", True):
        why += "; the active set's dual CD stopped at its pass limit"
    stats.update(outer_iterations=outer, converged=converged_outer, active_set=S.m,
                 stop_reason=why,
                 n_sv=int(nz.sum()), rows_read=store.rows_read - rows_read0,
                 bytes_read=store.bytes_read - bytes_read0,
                 objective=_primal_on_S(S, w, base_loss, C, bias),
                 spills=S.spills, rows_spilled=S.rows_spilled,
                 rows_read_back=S.rows_read_back, seconds=time.perf_counter() - t0)
    if not stats.get("S_converged", True):
        warnings.warn(f"IBCD's dual CD on the active set reached its {MAX_ITERS} passes before "
                      "the projected-gradient spread fell to eps (as LIBLINEAR stops at max_iter): "
                      "the solution is approximate. Raise eps or lower C.", RuntimeWarning,
                      stacklevel=3)
    if not converged_outer:
        warnings.warn(f"IBCD stopped after max_outer={outer} outer iterations before the "
                      f"outlier set settled. Raise max_outer.", RuntimeWarning, stacklevel=3)
    return IBCDResult(w=w, sv_rows=S.rows[: S.m][nz].copy(), sv_alpha=alpha[nz].copy(),
                      stats=stats)


def _primal_on_S(S, w, base_loss, C, bias):
    """1/2|w|^2 + C sum over S of L(y w^T x): rows outside S have zero loss at a solution."""
    if S.m == 0:
        return 0.5 * float(w @ w)
    z = _S_margins(S, w, bias)
    return 0.5 * float(w @ w) + C * float(np.sum(base_loss.value(z)))


def _S_margins(S, w, bias) -> np.ndarray:
    """y_i [x_i, bias]^T w over S, window by window when S is spilled."""
    y = S.state()[0]
    out = np.empty(S.m)
    for a, b, X in S.windows():
        out[a:b] = margins(X, y[a:b], w, bias)
    return out


def _drop_outliers(S, in_S, w, w_t, low, bias) -> int:
    """Remove the rows of S that are outliers at w_t (eq. 5), taking their alpha out of w."""
    from . import _kernels as K
    from ._common import kernel_args

    keep = _S_margins(S, w_t, bias) >= low
    removed = int((~keep).sum())
    if not removed:
        return 0
    y, _, alpha = S.state()
    # w -= sum over leaving rows of alpha y [x, bias], without a float64 copy of X
    delta = np.zeros_like(w)
    for a, b, X in S.windows():
        out = np.flatnonzero(~keep[a:b])
        if out.size:
            K.rows_tdot(*kernel_args(X), float(bias), out,
                        -(alpha[a:b][out] * y[a:b][out]), delta)
    w += delta
    in_S[S.rows[: S.m][~keep]] = False
    S.keep(keep)
    return removed


def _inner_loop(rows_src, forest, S, in_S, checker, w, w_t, *, loss, C, s, bias, n, eps,
                sample_eps, block_iters, block_solver, shrink_threshold, rng, stats,
                w_prev=None) -> tuple[int, int]:
    """Algorithm 1 on the convex problem at w_t; return how many rows joined S, and how
    many of them were outliers at the previous outer iterate ``w_prev`` (rows that left
    OUT: OUT(w_t) != OUT(w_prev))."""
    from ooc_learn.index.forest import outlier_margin

    low = outlier_margin(loss, s)
    added = came_back = 0
    r = 0  # the cyclic reader over S
    _reshrink(forest, S, shrink_threshold)
    max_ex = max(2 * n, int(QUERY_SHARE * forest.n_samples))
    m_solved = max(S.m, n)

    def join(rows, XN, yN) -> bool:
        """Rows join S (``_admit``); returns whether S was rearranged."""
        nonlocal added, came_back
        added += len(rows)
        if w_prev is not None:
            came_back += int((margins(XN, yN.astype(np.float64), w_prev, bias) < low).sum())
        rearranged = _admit(S, in_S, forest, rows, XN, yN, w, bias, shrink_threshold, stats,
                            resolve, checker)
        checker.drop_answer()  # the rows are S's now
        return rearranged

    def resolve():  # problem (13) on S: B = S, on the way (a check follows later)
        _solve_S(S, w, loss=loss, C=C, bias=bias, eps=eps, rng=rng, stats=stats,
                 solver=block_solver, max_iter=QUICK_ITERS, max_rounds=SPILLED_RESOLVE_ROUNDS)

    # scan-only: the scan check has taken the index's place for the rest of this convex
    # problem (a query was cut, or cost more than a scan; see VISIT_COST)
    scan_only = False
    # w solves problem (13) on S (to eps): a sampled stop is judged by a query at such a w
    at_solution = False
    converges = False  # the last full solve of S converged
    # the sampled rule is there to stop without scans: with it, the index keeps being asked
    cost_model = COST_MODEL and sample_eps == 0
    q_cost = q_found = None  # the last query's cost (stored values touched) and rows found
    row_work = (rows_src.store.n_features if rows_src.store.layout == "dense"
                else rows_src.store.nnz / max(1, forest.n_samples)) + 1.0
    budget = rows_src.store.budget
    nq = n  # rows asked of the next query: grows while the index finds violators densely
    nq_max = max(n, int(QUERY_SHARE * forest.n_samples) // 2)
    row_bytes = max(1, rows_src.store.estimated_bytes(1))

    def unread():
        """Rows of the blocks the cache does not hold: what a scan check reads."""
        st = rows_src.store
        off = st.block_offsets
        return sum(int(off[b + 1] - off[b]) for b in range(st.n_blocks)
                   if not st.block_is_cached(b))

    def scan_cost():
        """A scan check in stored values touched (see VISIT_COST): the rows outside S, and
        READ_COST more for each row it reads."""
        return (forest.n_samples - S.m + READ_COST * unread()) * row_work

    def check_size():
        want = max(n, CHECK_GROWTH * S.m)
        if S.spilled:  # the rows pass through memory on their way to S's file
            want = max(n, min(want, S.window_rows()))
        return want

    def check(thresh):
        """The check of §4.3 (the pool or a scan; see ibcd_check): at most |S| rows (S at
        most doubles), at least n, as many as fit without spilling (the rows read and S's
        grown buffers coexist for a moment, so room for twice as many is asked)."""
        rows_src.clear()
        want = check_size()
        per_row = S.nnz / max(1, S.m) if S.sparse else 0.0
        while want > n and not S.fits(2 * want, int(2 * want * per_row)):
            want = max(n, want // 2)
        return checker.check(w, w_t, want, thresh, keep_pool=not S.spilled)

    def solve_S(max_iter):
        """Problem (13) on S to eps in at most ``max_iter`` passes; returns what dual CD
        left (0 when converged)."""
        nonlocal r
        if S.spilled:
            # shrinking before the solve (§4.2): the inactive rows (alpha = 0, y w^T x >= 1)
            # leave S, and the check brings back any that violate later; what is left comes
            # back into memory when it fits
            r = _prune_inactive(S, in_S, w, bias, stats)
            _reshrink(forest, S, shrink_threshold)
        if not S.m:
            return 0.0
        return _solve_S(S, w, loss=loss, C=C, bias=bias, eps=eps, rng=rng, stats=stats,
                        solver=block_solver, max_iter=max_iter)

    while True:
        rows_src.clear()
        if scan_only:
            rows_N, n_e = np.empty(0, np.int64), 0
        else:
            rows_N, n_e = forest.query(w, w_outer=w_t, s=s, n=nq, exclude=in_S,
                                       seed=int(rng.integers(1 << 31)), loss=loss,
                                       max_examined=max_ex, bounded=True,
                                       min_precision=MIN_PRECISION, max_read=max_ex)
            lq = forest.last_query
            q_cost = ((lq["rows_examined"] + lq["pivots_scored"]
                       + QUERY_READ_COST * lq["rows_read"]) * row_work
                      + VISIT_COST * (lq["nodes_expanded"] + lq["leaves_scanned"]))
            q_found = len(rows_N)
            stats["queries"] += 1
        stats["rows_examined"] += int(n_e)
        k = len(rows_N)
        queried_at_solution, at_solution = at_solution, False
        m_old = S.m
        if k:
            # the fetched rows and the copy that assembles them in query order live until
            # S holds them: reserved (evicting cache entries), not taken beside the cap. Where
            # the cap cannot hold them all, as many as it can (halving, down to
            # MIN_CHECK_ROWS) join now; a later query or check finds the others again (1.02M
            # rows at --memory 224M: 1000 rows needed 6.3 MB where 6.28 MB was free, and the
            # run stopped after 110 s)
            # (three copies at most: the parts from cached blocks and the read, a read's
            # permutation into the order asked, the copy in query order; a 1g run's RSS
            # passed its account by 60 MiB there with two reserved)
            k_in = reserve_rows(budget, k, 3 * row_bytes, "IBCD fresh rows")
            stats["fetches_cut"] += int(k_in < k)
            try:
                XN, yN = rows_src.fetch(rows_N[:k_in])
                rearranged = join(rows_N[:k_in], XN, yN)
                del XN, yN
            finally:
                budget.release(3 * k_in * row_bytes)
            if rearranged:
                r, m_old = 0, S.m - k_in  # S was rearranged: the new rows are its last k_in
        # the block: N and the next n_e - |N| rows of the old S, cyclically
        extra = min(max(0, int(n_e) - k), m_old)
        if S.spilled:
            # B is read back into memory: at most a window of rows (the cap stays kept)
            extra = min(extra, max(0, S.window_rows() - k))
        if m_old:
            cyc = (r + np.arange(extra, dtype=np.int64)) % m_old
            r = int((r + extra) % m_old) if m_old else 0
        else:
            cyc = np.empty(0, np.int64)
        B = np.concatenate([np.arange(m_old, S.m, dtype=np.int64), cyc])
        if B.size:
            _solve_block(S, B, w, loss=loss, C=C, bias=bias, eps=eps, iters=block_iters,
                         solver=block_solver, rng=rng, stats=stats)
        stats["inner_iterations"] += 1
        if S.m >= RESOLVE_GROWTH * m_solved:
            # a spilled S too (§4.2): it was left to grow unsolved and unpruned until the
            # stop, and each solve of it then read a large S back many times (120k rows of
            # tops-vs-rest at s = 1, sampled rule, 5 seeds: 8M cap 29-44 s -> 12-17 s, 16M cap
            # 12-17 s -> 5.5-7 s; test accuracy 96.71 -> 96.62 and 96.86 -> 96.61 mean, the
            # uncapped run 96.96-97.11)
            resolve()
            r = _prune_inactive(S, in_S, w, bias, stats)
            _reshrink(forest, S, shrink_threshold)
            m_solved = max(S.m, n)
            stats["S_resolves"] += 1
        sampled = False
        if not scan_only:
            # the query stopped at max_ex before finding n rows (or at 2n rows examined with
            # fewer than MIN_PRECISION of them qualifying, or once it had read QUERY_SHARE
            # of the rows): the index is no longer the cheap way to find the rest; while it
            # still found half of n (n, not a grown nq: a query grown to 1382 rows that
            # found 578 sent the generated store's capped L2-primal run to 4 scans), it
            # keeps being asked. With the sampled rule it is also kept where the scan would
            # read more of the store than a query may (blocks the cache does not hold): the
            # rule decides the stop (Fashion-MNIST at the 1/10 cap, 8 seeds: rows read per
            # outer iteration L1 0.66 -> 0.28, L2 0.36-0.38 -> 0.24, test accuracy within
            # 0.03; where blocks are cached, the scan costs no reads and stays: without it,
            # uncapped accuracy fell 0.03-0.07). A query that stopped where the cap held no
            # larger search frontier has not reached the leaves worth reading: the scan
            # takes over at once
            truncated = k < nq and lq["truncated"]
            cut = k < nq and (n_e >= max_ex or truncated or lq["low_precision"]
                              or lq["read_limited"])
            stats["queries_cut"] += int(cut)
            stats["queries_truncated"] += int(truncated)
            stats["queries_imprecise"] += int(cut and lq["low_precision"])
            # n_e of the rule counts the instances the search traversed (the paper's n_e):
            # the rows examined and the pivots scored to rank partitions (a query on the
            # generated store scored 21k pivots for 19 rows examined, all of them fresh)
            n_trav = n_e + lq["pivots_scored"]
            sampled = ((k >= nq or cut) and sample_eps > 0 and n_trav > 0
                       and k / n_trav < sample_eps)
            if sampled and not queried_at_solution:
                # the rule speaks for the w it was asked at, and the stop returns the
                # solution of (13) on S: S is solved first and the index asked again there
                # (w moves the most in that solve where rows left S, the prune at each outer
                # iteration's start: on the generated store, squared hinge, s = 1, stopping
                # at once left S at 20-27 rows of 5122 and the test accuracy 13-37 points
                # below LIBLINEAR's in 2 seeds of 4)
                solve_S(MAX_ITERS)
                at_solution = True
                stats["sample_rule_rechecks"] += 1
                continue
            # a query that cost more than SCAN_MARGIN scans: the check comes next (it finds
            # every row the query would; the costs compared there decide what follows)
            slow = cost_model and q_cost > SCAN_MARGIN * scan_cost()
            stats["queries_slow"] += int(slow)
            if ((k >= nq or (cut and not truncated and (2 * k >= n or (
                    sample_eps > 0 and unread() > max_ex)))) and not sampled and not slow):
                # the rows a query returns are read into memory (with a copy or two on the
                # way into S): a larger query only where the free part of the cap holds that
                # 4 times
                room = rows_src.store.budget.available // (4 * row_bytes)
                top = n if S.spilled else min(nq_max, max(n, min(S.window_rows(), room)))
                if k >= nq and k >= DENSE_QUERY * n_e and nq < top:
                    nq = min(top, 2 * nq)
                    stats["queries_grown"] += 1
                elif S.spilled or k < nq:
                    nq = n
                continue
            scan_only = cut
        if sampled:
            # the paper's sampled rule: few fresh rows per row examined means the rest of the
            # data is (nearly) inactive; stop without scanning all of it
            solve_S(MAX_ITERS)
            stats["stopped_by_sample_rule"] += 1
            checker.drop_answer()
            return added, came_back
        # problem (13) on S to eps (at first in QUICK_ITERS passes), then a full check
        # without shrinking (§4.3)
        resid = solve_S(QUICK_ITERS)
        full = resid == 0.0
        ans = check(max(eps, resid))
        # every row outside S violates y w^T x >= 1 by less than the dual CD tolerance (its
        # projected gradient is within eps of 0), or by less than what dual CD left on S
        # when it stopped at its pass limit (as LIBLINEAR does): adding rows cannot do
        # better. A solve cut at QUICK_ITERS passes is first carried on to MAX_ITERS, and
        # the check repeated; unless the last full solve converged (dual CD on S is not stuck
        # at its pass limit) and the check still finds |S| / 2 violators or more: then it
        # is not the end, and they join S without that solve (generated store, squared
        # hinge: 65 -> 51 s; no other benchmark run changes)
        # (only a scan's answer comes here: the pool answers with a violation of
        # max(eps, resid) or more, else the check scans)
        while len(ans.rows) == 0 or (ans.worst < max(eps, resid) and not (
                converges and not full and 2 * ans.n_viol >= S.m)):
            if full:
                assert ans.scanned  # a stop rests on every row examined
                checker.drop_answer()
                return added, came_back
            if 0 < len(ans.rows) < n:
                # the few rows that violate join S before the full solve, which the next
                # check then certifies (else they cost a solve and a scan of their own)
                if join(ans.rows, ans.X, ans.y):
                    r = 0
            resid, full = solve_S(MAX_ITERS), True
            converges = resid == 0.0
            ans = check(max(eps, resid))
        stats["full_solves_skipped"] += int(not full and ans.worst < max(eps, resid))
        if join(ans.rows, ans.X, ans.y):
            r = 0
        # the index or the scan for the rows still violating? The next scan finds at least
        # min(left, |S|) of them; the last query found q_found at q_cost. Where the scan
        # finds rows SCAN_MARGIN times cheaper, or fewer than n/2 are left (a query would be
        # cut), the rest of this problem is scan-only
        left = ans.n_viol - len(ans.rows)
        if cost_model and not scan_only and ans.scanned and (
                2 * left < n or min(left, S.m) * q_cost >= SCAN_MARGIN * max(1, q_found)
                * scan_cost()):
            scan_only = True
            stats["scans_preferred"] += 1
        # shrinking starts afresh after a check (§4.3): only S stays marked
        _reshrink(forest, S, shrink_threshold)


def _reshrink(forest, S, threshold) -> None:
    """Restart shrinking on the index (§4.3) with the rows of S marked: S is excluded from
    every query anyway, and marked rows let the search skip a node S covers without
    visiting its leaves (once S holds most of the data that was most of a query's time)."""
    forest.unshrink()
    forest.shrink(threshold, rows=S.rows[: S.m])


def _admit(S, in_S, forest, rows, XN, yN, w, bias, threshold, stats, resolve, checker) -> bool:
    """Rows ``rows`` (``XN``, ``yN``) join S and are marked on the index. §4.2 under a tight
    cap: when they do not fit, the inactive rows (alpha = 0, y w^T x >= 1) leave S first (the
    index brings them back if they violate again; the final check examines every row); if S
    still does not fit, it spills to disk. Returns whether S was rearranged (the cyclic
    reader restarts). ``resolve()`` solves problem (13) on S (tried once before spilling);
    the check's pool gives its room up first."""
    k = XN.shape[0]
    nnz = int(XN.indptr[-1]) if S.sparse else 0
    if not S.fits(k, nnz):
        checker.pool.clear()
    moved = not S.fits(k, nnz)
    if moved:
        _prune_inactive(S, in_S, w, bias, stats)
        if not S.fits(k, nnz) and not S.spilled:
            # before spilling, problem (13) on S (still in memory) and a second prune: the
            # rows a block's solve left at alpha > 0 on the way often settle at 0
            resolve()
            _prune_inactive(S, in_S, w, bias, stats)
            stats["S_resolves_before_spill"] = stats.get("S_resolves_before_spill", 0) + 1
        if not S.fits(k, nnz):
            S.spill()
    S.add(rows, XN, yN.astype(np.float64), _row_sqn(XN))
    in_S[rows] = True
    if moved:  # rows left S: their marks must go
        _reshrink(forest, S, threshold)
    else:
        forest.shrink(threshold, rows=rows)
    return moved


def _prune_inactive(S, in_S, w, bias, stats) -> int:
    """Drop the rows of S at alpha = 0 with y w^T x >= 1; return the cyclic reader's new
    position (0)."""
    alpha = S.state()[2]
    keep = (alpha > 0) | (_S_margins(S, w, bias) < 1.0)
    if keep.all():
        return 0
    in_S[S.rows[: S.m][~keep]] = False
    stats["pruned"] += int((~keep).sum())
    S.keep(keep)
    release_free_heap()
    return 0


def _solve_S(S, w, *, loss, C, bias, eps, rng, stats, max_iter=MAX_ITERS, max_rounds=None,
             solver="dual") -> float:
    """Problem (13) on S to ``eps`` (LIBLINEAR's projected-gradient spread) within
    ``max_iter`` dual CD passes; returns the spread reached (below ``eps`` when converged).
    With the primal block solver (squared hinge) a resident S is solved by TRON instead; with
    the dual one too, once dual CD on it has not converged in ``DUAL_SWITCH_ITERS`` passes.

    In memory: dual CD with shrinking over S. A spilled S is solved by rounds of a working
    set: one pass over its windows computes every projected gradient; if the spread is below
    ``eps`` S is solved; else a sweep over S's windows reads back each window's rows that can
    move (alpha > 0, or a violated bound) and solves them by dual CD with shrinking (at most
    SPILLED_WINDOW_ITERS passes) while the others stay fixed in w; at most ``max_rounds``
    rounds (default: SPILLED_ROUNDS on the way, SPILLED_FINAL_ROUNDS
    for a solve a stop rests on, which also ends once the spread has not fallen for
    SPILLED_STALL rounds).
    """
    final = max_iter >= MAX_ITERS
    if max_rounds is None:
        max_rounds = SPILLED_FINAL_ROUNDS if final else SPILLED_ROUNDS
    y, sqn, alpha = S.state()
    if solver == "dual" and stats["switched_to_primal"]:
        # dual CD stalled on S once: it stalls again on the S that follows, and a 100-pass
        # dual solve from TRON's answer cost as much as the switch had saved
        solver = "primal"
    if solver == "dual" and not S.spilled:
        # LIBLINEAR's -s 1 switch (DUAL_SWITCH_ITERS) for a solve of S a stop may rest on
        switch = max_iter > DUAL_SWITCH_ITERS and get_loss(loss).base().name == "sqhinge"
        st = dcd_subproblem(S.X, y, alpha, w, loss=loss, C=C, bias=bias, eps=eps,
                            max_iter=DUAL_SWITCH_ITERS if switch else max_iter,
                            shrinking=True, rng=int(rng.integers(1 << 31)), sqnorms=sqn)
        if st.converged or not switch:
            stats["S_converged"] = bool(st.converged)
            return 0.0 if st.converged else float(st.pg_max - st.pg_min)
        stats["switched_to_primal"] += 1
        solver = "primal"
    if solver == "primal" and not S.spilled:
        # the L2 primal by TRON on all of S (rows outside S have alpha = 0: v_B̄ = 0), to
        # LIBLINEAR's primal rule (PRIMAL_EPS); alpha from the KKT of (16)
        from .tron import L2LossPrimal, tron

        prob = L2LossPrimal(S.X, y, C=C, loss="sqhinge", bias=bias)
        res = tron(prob, w.copy(), eps=_primal_eps(y), max_iter=max_iter)
        w[:] = res.w
        alpha[:] = prob.dual(res.w)
        stats["S_converged"] = bool(res.stats.converged)
        return 0.0
    base = get_loss(loss).base()
    upper, diag = base.dual_upper(C), base.dual_diag(C)
    rounds, last, best, since_best = 0, np.inf, np.inf, 0
    while True:
        G = _S_margins(S, w, bias) - 1.0 + diag * alpha
        PG = np.where(alpha <= 0, np.minimum(G, 0), np.where(alpha >= upper, np.maximum(G, 0), G))
        spread = float(PG.max() - PG.min())
        stats["spilled_rounds"] = stats.get("spilled_rounds", 0) + 1
        best, since_best = (spread, 0) if spread < 0.99 * best else (best, since_best + 1)
        if spread < eps or rounds >= max_rounds or (final and since_best >= SPILLED_STALL):
            stats["S_converged"] = spread < eps
            # like the in-memory solve: the spread its last (working-set) pass left
            return 0.0 if spread < eps else min(spread, last)
        # a sweep over S's windows in order (block minimisation over S, Yu et al. 2010): each
        # window's rows that can move are read back and solved by dual CD while the rest stay
        # fixed in w. One window a round (the most violating rows of S) read all of S for
        # each window solved and did not converge where a window holds a small share of S:
        # 250k rows of augmented Fashion-MNIST at --memory 330M, |S| 84k -> 166k, |w| fell
        # from 6.5 to 0.86 and the stop (resting on the spread left) returned w ~ 0, 50 %
        # test accuracy
        # Rounds alternate with the most violating rows of all of S in one window, which
        # finishes where the sweep zigzags between windows (a 3000-row S at eps 0.01)
        can_move = (alpha > 0) | (PG != 0)
        cap = S.window_rows()
        worst = 0.0
        if rounds % 2 == 0:
            starts = range(0, S.m, cap)
            blocks = (a + np.flatnonzero(can_move[a:a + cap]) for a in starts)
        else:
            free = np.flatnonzero(can_move)
            if free.size > cap:
                free = np.sort(free[np.argsort(-np.abs(PG[free]), kind="stable")[:cap]])
            blocks = (free,)
        for B in blocks:
            if B.size:
                st = _solve_block(S, B, w, loss=loss, C=C, bias=bias, eps=eps,
                                  iters=max_iter, solver="dual",
                                  rng=rng, stats=stats, shrinking=True)
                if not st.converged:
                    worst = max(worst, float(st.pg_max - st.pg_min))
        rounds += 1
        last = worst


def _primal_eps(y) -> float:
    """TRON's relative tolerance by LIBLINEAR's -s 2 rule for a problem with labels ``y``."""
    pos = int((y > 0).sum())
    return PRIMAL_EPS * max(min(pos, len(y) - pos), 1) / max(len(y), 1)


def _solve_block(S, B, w, *, loss, C, bias, eps, iters, solver, rng, stats, shrinking=False):
    if S.spilled:
        return _solve_block_spilled(S, B, w, loss=loss, C=C, bias=bias, eps=eps, iters=iters,
                                    solver=solver, rng=rng, stats=stats, shrinking=shrinking)
    X, y, sqn, alpha = S.view()
    if solver == "primal":
        from .tron import L2LossPrimal, tron

        # eq. (16): the rows outside B enter through v_B̄ = w - sum_{l in B} alpha_l y_l x_l
        XB, yB = X[B], y[B]
        coef = alpha[B] * yB
        v = w.copy()
        v[: S.d] -= np.asarray(XB.T @ coef).ravel()
        v[S.d] -= bias * coef.sum()
        prob = L2LossPrimal(XB, yB, C=C, loss="sqhinge", bias=bias, v_fixed=v)
        res = tron(prob, w.copy(), eps=_primal_eps(yB), max_iter=iters)
        w[:] = res.w
        alpha[B] = prob.dual(res.w)
        stats["block_updates"] += len(B)
    else:
        st = dcd_subproblem(X, y, alpha, w, rows=B, loss=loss, C=C, bias=bias, eps=eps,
                            max_iter=iters, shrinking=shrinking,
                            rng=int(rng.integers(1 << 31)), sqnorms=sqn)
        stats["block_updates"] += st.updates
        return st


def _solve_block_spilled(S, B, w, *, loss, C, bias, eps, iters, solver, rng, stats,
                         shrinking=False):
    """The block sub-problem when S is on disk: B's rows are read back (the fresh rows and
    the cyclic reader's next run of S), solved as a small problem, and their alpha written
    back; w carries every other row's contribution."""
    y, sqn, alpha = S.state()
    # reserved before the read (a run read and the block coexist): 2x the block's rows
    with S.budget.reservation(2 * S.bytes_of(B), "IBCD block"):
        XB = S.take(B)
        sub = _BlockView(XB, y[B], sqn[B], alpha[B].copy())
        st = _solve_block(sub, np.arange(B.size, dtype=np.int64), w, loss=loss, C=C,
                          bias=bias, eps=eps, iters=iters, solver=solver, rng=rng,
                          stats=stats, shrinking=shrinking)
        alpha[B] = sub.alpha
    return st


class _BlockView:
    """A block read back from a spilled S, shaped like a resident active set."""

    spilled = False

    def __init__(self, X, y, sqn, alpha):
        self.X, self.y, self.sqn, self.alpha = X, y, sqn, alpha
        self.d = X.shape[1]

    def view(self):
        return self.X, self.y, self.sqn, self.alpha
