"""``solve_ibcd``: the truncated-loss relaxation (eq. 5) with Algorithm 1 as its inner solver."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ooc_learn.losses import get_loss

from .. import hinge_newton
from ..dcd_streamed import held_out
from ..relax import outer_loop
from .active_set import ActiveSet
from .check import Checker
from .config import IBCDConfig
from .inner import InnerLoop
from .rows import RowSource, row_sqn
from .solve import drop_outliers, objective_on_S, prune_inactive
from .start import sample_start, start_from_warm
from .state import IBCDState, IBCDStats

__all__ = ["IBCDResult", "solve_ibcd"]

log = logging.getLogger(__name__)


@dataclass
class IBCDResult:
    """Weights (``w[:d]``, bias weight ``w[d]``), the final active set and the work done."""

    w: np.ndarray
    sv_rows: np.ndarray
    sv_alpha: np.ndarray
    stats: dict = field(default_factory=dict)


def solve_ibcd(store, config: IBCDConfig | None = None, *, spill_dir=None,
               on_outer: Callable[[dict], None] | None = None, holdout=None, warm=None,
               **params) -> IBCDResult:
    """Train a linear SVM on an indexed store by IBCD (Yen et al., KDD 2013).

    Objective (2), the truncated SVM::

        min_w  1/2 |w|^2 + C sum_i R_s(y_i w^T x_i),   R_s(z) = min(L(z), 1 + s),

    L the hinge or squared hinge, the bias a regularized constant feature (LIBLINEAR ``-B
    1``). The outer relaxation (eq. 5, :func:`ooc_learn.solvers.relax.outer_loop`) fixes
    the loss of the outliers OUT(w_t) = {i : y_i w_t^T x_i < L^-1(1 + s)} at the cap and
    solves the convex problem (7) on the rest by Algorithm 1 out of core
    (:class:`~ooc_learn.solvers.ibcd.inner.InnerLoop`); it stops when no row changes side.
    w_0 is the solution on a random sample of ``init_sample`` rows, whose support vectors
    start the active set S.

    Parameters
    ----------
    store : Store
        An open store with a metric-forest index and labels in {-1, +1}.
    config : IBCDConfig, optional
        The run's configuration (default ``IBCDConfig()``); ``**params`` replace its
        fields (``loss``, ``C``, ``s``, ``n``, ``eps``, ``sample_eps``, ... : see
        :class:`IBCDConfig` for each one's meaning).
    spill_dir : path, optional
        Where the active set spills when it outgrows its share of the cap (§4.2); default:
        the folder holding the store (the data's own disk, not a RAM-backed /tmp).
    on_outer : callable, optional
        Called after every outer iteration with its log entry and ``w`` (read it at once:
        it changes in place).
    holdout : (start, stop) or bool array (n,), optional
        Rows left out of the problem (a cross-validation fold): the index and the checks
        pass over them as over rows already in S, and w_0's sample avoids them.
    warm : (rows, alpha), optional
        Start from a previous solution instead of w_0: its support vectors (store rows and
        their alpha) start S and w = sum alpha_i y_i [x_i, bias]. Rows inside ``holdout``
        are dropped from it (cross-validation's next fold).

    Returns
    -------
    IBCDResult
        ``stats``: the counters of :class:`~ooc_learn.solvers.ibcd.state.IBCDStats` and
        outer_iterations, converged, stop_reason, active_set, n_sv, rows_read, bytes_read,
        objective (of the convex problem on S: equal to the full objective after an exact
        stop, below it after a sampled stop), spills, rows_spilled, rows_read_back (the
        active set's disk traffic), seconds.
    """
    cfg = config if config is not None else IBCDConfig()
    if params:
        cfg = cfg.replace(**params)
    t0 = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    # counted from here: opening the forest already reads (and caches) pivot rows
    rows_read0, bytes_read0 = store.rows_read, store.bytes_read
    if cfg.newton_on_S and hinge_newton.applies(store.n_features):
        hinge_newton.load_kernels()  # while the cap has room (see load_kernels)
    rows = RowSource(store)
    forest = rows.open_forest()
    n_all = store.n_samples
    held = held_out(holdout, n_all, "holdout of solve_ibcd")
    m0, start = sample_start(store, cfg, rng, held, solve=warm is None)
    S = ActiveSet(store.n_features, store.layout == "csr", store.budget,
                  spill_dir=_spill_dir(store, spill_dir), resident_share=cfg.resident_share,
                  value_table=getattr(store, "value_table", None))
    in_S = np.zeros(n_all, bool)
    store.budget.reserve(n_all, "IBCD active-set mask")
    frozen = None
    if cfg.freezes:
        store.budget.reserve(n_all, "IBCD frozen-row mask")
        frozen = np.zeros(n_all, bool)
    checker = None
    try:
        if start is not None:
            w, sv, Xs, ys, alpha = start
            del start
            S.add(sv, Xs, ys, row_sqn(Xs), alpha)
            del Xs, ys
        else:
            w = start_from_warm(store, S, warm, m0, held, cfg.bias)
        in_S[S.rows[: S.m]] = True
        ho_a, ho_z, ho_mask = held
        if ho_mask is None:  # held out: neither asked for nor checked
            in_S[ho_a:ho_z] = True
        else:
            in_S |= ho_mask
        stats = IBCDStats()
        # L^-1(1 + s): the smallest y w_t^T x that is not an outlier (eq. 5)
        low = get_loss(cfg.loss).outlier_margin(cfg.s) if cfg.truncated else -np.inf
        checker = Checker(rows, in_S, low=low, cfg=cfg, stats=stats, frozen=frozen)
        st = IBCDState(cfg, store, rows, forest, S, in_S, w, checker, rng, stats, frozen)
        relaxation = _Relaxation(st, low, on_outer, t0, rows_read0)
        n_outer, converged = outer_loop(relaxation.step, cfg.max_outer)
        return _result(st, n_outer, converged, t0, rows_read0, bytes_read0)
    finally:
        if checker is not None:
            checker.clear()
        S.release()
        store.budget.release(n_all if frozen is None else 2 * n_all)
        forest.close()


class _Relaxation:
    """One outer iteration of the relaxation for :func:`outer_loop`: the rows of S that are
    outliers at w_t leave it (their loss is fixed at the cap), the inactive rows of the last
    problem too, and Algorithm 1 solves the convex problem on the rest."""

    def __init__(self, st, low, on_outer, t0, rows_read0):
        self.st, self.low, self.on_outer = st, low, on_outer
        self.t0, self.rows_read0 = t0, rows_read0
        self.w_prev = None  # the outer iterate before w_t
        self.base_loss = get_loss(st.cfg.loss).base()

    def step(self, t: int) -> int | None:
        st, cfg, S = self.st, self.st.cfg, self.st.S
        w_t = st.w.copy()
        removed = 0
        if cfg.truncated and S.m:
            removed = drop_outliers(st, w_t, self.low)
            if t > 1:
                # the rows the last convex problem left inactive (alpha = 0, y w^T x >= 1)
                # leave S: dual CD would pass over them in every solve of this problem, and
                # the check brings back any that the new w_t makes violate
                prune_inactive(st)
        added, came_back = InnerLoop(st, w_t, self.low, self.w_prev).run()
        self.w_prev = w_t
        obj = objective_on_S(S, st.w, self.base_loss, cfg.C, cfg.bias)
        if st.frozen is not None:
            # the frozen rows' loss, from the scan the stop rested on (at this w)
            obj += cfg.C * st.checker.frozen_loss
        entry = {"outer": t, "objective_S": obj, "active_set": S.m,
                 "n_sv": int((S.state()[2] > 0).sum()) + st.n_frozen, "added": added,
                 "removed": removed, "came_back": came_back,
                 "rows_read": st.store.rows_read - self.rows_read0,
                 "seconds": time.perf_counter() - self.t0}
        st.stats.outer_log.append(entry)
        log.info("ibcd outer %d: objective(S) %.6g, |S| %d, rows read %d", t, obj, S.m,
                 entry["rows_read"])
        if self.on_outer is not None:
            self.on_outer(dict(entry, w=st.w))
        if not cfg.truncated:
            return 0  # the convex SVM: one problem
        # OUT(w_t) == OUT(w_{t-1}) when no S row became an outlier and no outlier at w_{t-1}
        # joined S (rows that were not outliers may join S meanwhile: with the sampled rule,
        # every problem finds some near its margin)
        if t == 1:
            return None
        changed = removed + came_back
        if cfg.sample_eps > 0 and changed < cfg.sample_eps * entry["n_sv"]:
            # the sampled rule's outer stop: each problem was left with fresh violators below
            # sample_eps of the rows a query examined, so the outlier set is known to that
            # share; fewer rows changing side than sample_eps of the support vectors is the
            # fixed point within it
            return 0
        return changed


def _result(st, n_outer, converged, t0, rows_read0, bytes_read0) -> IBCDResult:
    cfg, S, stats = st.cfg, st.S, st.stats
    alpha = S.state()[2]
    nz = alpha > 0
    sv_rows, sv_alpha = S.rows[: S.m][nz], alpha[nz]
    if st.n_frozen:
        # the frozen rows' alpha is C: they are support vectors outside S
        fr = np.flatnonzero(st.frozen)
        sv_rows = np.concatenate([sv_rows, fr])
        sv_alpha = np.concatenate([sv_alpha, np.full(fr.size, cfg.frozen_alpha)])
    if not converged:
        why = f"max_outer ({n_outer} outer iterations) before the outlier set settled"
    elif cfg.truncated:
        why = ("the outlier set settled to the sampled rule (rows changing side / support "
               "vectors < sample_eps; each inner loop stopped by the sampled rule, no final "
               "check)" if cfg.sample_eps > 0 else
               "the outlier set settled (truncated-loss relaxation)")
    else:
        why = ("the sampled rule (fresh rows / rows examined < sample_eps; no final check)"
               if cfg.sample_eps > 0 else
               "certified: no row outside the active set violates the optimality conditions")
    if not stats.S_converged:
        why += "; the active set's dual CD stopped at its pass limit"
    out = stats.as_dict()
    # converged: the stop was met, not only the outer loop's (an S whose dual CD reached its
    # pass limit leaves an approximate solution, and says so)
    out.update(outer_iterations=n_outer, converged=converged and stats.S_converged,
               active_set=S.m,
               stop_reason=why, n_sv=int(sv_rows.size),
               frozen_rows=st.n_frozen,
               rows_read=st.store.rows_read - rows_read0,
               bytes_read=st.store.bytes_read - bytes_read0,
               # the last outer iteration's (w has not moved since; a spilled S is not
               # read back again for it)
               objective=stats.outer_log[-1]["objective_S"],
               spills=S.spills, rows_spilled=S.rows_spilled,
               rows_read_back=S.rows_read_back, seconds=time.perf_counter() - t0)
    if not stats.S_converged:
        warnings.warn(f"IBCD's dual CD on the active set reached its {cfg.max_iters} passes "
                      "before the projected-gradient spread fell to eps (as LIBLINEAR stops "
                      "at max_iter): the solution is approximate. Raise eps, lower C or scale the "
                      "features (e.g. to [0, 1]).",
                      RuntimeWarning, stacklevel=3)
    if not converged:
        warnings.warn(f"IBCD stopped after max_outer={n_outer} outer iterations before the "
                      f"outlier set settled. Raise max_outer.", RuntimeWarning, stacklevel=3)
    return IBCDResult(w=st.w, sv_rows=sv_rows.copy(), sv_alpha=sv_alpha.copy(), stats=out)


def _spill_dir(store, spill_dir) -> Path:
    if spill_dir is not None:
        return Path(spill_dir)
    parent = Path(store.path).resolve().parent
    return parent if os.access(parent, os.W_OK) else Path(tempfile.gettempdir())
