"""Algorithm 1 (§3.1) on one convex problem of the relaxation: query, choose the block,
solve, check.

The convex problem is (7) on the rows that are not outliers at the outer iterate w_t. Each
step of :meth:`InnerLoop.run`:

1. **query** the metric forest for up to ``nq`` fresh rows N satisfying eq. 10 (not an
   outlier at w_t, y w^T x < 1), not in S; they join S with the values, labels and norms
   the query copied as it verified them (nothing is read again);
2. **choose the block** B = N ∪ the next n_e - |N| rows of the old S (a cyclic reader), n_e
   the rows the query examined;
3. **solve** the block problem (11) (dual CD, or TRON on its primal (16)); each time S has
   doubled, problem (13) on S itself, and S's inactive rows leave it;
4. **judge** the query: while it found rows as asked, go on asking (twice as many where
   they were dense); the sampled rule |N| / n_e < ``sample_eps`` (judged at a solution of
   S) stops here; a query that was cut (a limit of rows examined, read, or precision), or
   that cost more than a scan, hands over to
5. the **check** (§4.3): S is solved to eps and every row outside S is examined (the pool
   of rows near the margin first, else a sequential scan); the violators join S (at most
   |S| of them: then a uniform sample, ``IBCDConfig.admit``). The loop stops when a scan
   after a full solve of S finds no row violating by more than the tolerance: every row of
   the data has then been certified.
   Whether the index or the scan looks for the next rows is a cost comparison (in stored
   values touched; ``IBCDConfig.cost_model``).
"""

from __future__ import annotations

import numpy as np

from ooc_learn.index.found import Found

from .._common import margins
from .check import reserve_rows
from .rows import row_sqn
from .solve import prune_inactive, solve_block, solve_S

__all__ = ["InnerLoop"]

# what the loop does after a query is judged
_ASK_AGAIN, _STOP, _CHECK = range(3)
# the query's answer once the scan took over
_NOTHING = Found(np.empty(0, np.int64), 0, None, None, None)


class InnerLoop:
    """Algorithm 1 on the convex problem at the outer iterate ``w_t``.

    ``w_prev`` is the outer iterate before it: rows joining S that were outliers at w_prev
    are counted (they left OUT, so the outlier set changed).
    """

    def __init__(self, st, w_t, low: float, w_prev=None):
        self.st, self.cfg = st, st.cfg
        self.w_t, self.low, self.w_prev = w_t, low, w_prev
        self.added = 0        # rows that joined S
        self.came_back = 0    # ... of them outliers at w_prev
        n_all = st.forest.n_samples
        n = self.cfg.n
        self.max_examined = max(2 * n, int(self.cfg.query_share * n_all))
        self.nq = n           # rows asked of the next query: grows while violators are dense
        self.nq_max = max(n, int(self.cfg.query_share * n_all) // 2)
        self.r = 0            # the cyclic reader's position in S
        self.m_solved = max(st.S.m, n)  # |S| when (13) was last solved on it
        # the scan check has taken the index's place for the rest of this problem
        self.scan_only = False
        # w solves (13) on S (to eps, or quick_iters passes): a sampled stop is judged by a
        # query at such a w
        self.at_solution = False
        self.queried_at_solution = False
        self.converges = False  # the last full solve of S converged
        self.stalls = 0  # full solves of S in a row that stopped at their passes
        # the sampled rule is there to stop without scans: with it, the index keeps being
        # asked
        self.cost_model = self.cfg.cost_model and self.cfg.sample_eps == 0
        self.q_cost = self.q_found = None  # the last query's cost and the rows it found
        self.last = None  # the last query's report (Forest.last_query)
        store = st.store
        # stored values per row: the cost model's unit
        self.row_work = (store.n_features if store.layout == "dense"
                         else store.nnz / max(1, n_all)) + 1.0
        self.row_bytes = max(1, store.estimated_bytes(1))

    # ---- the loop -----------------------------------------------------------------------
    def run(self) -> tuple[int, int]:
        """Solve the convex problem; return how many rows joined S and how many of them
        were outliers at ``w_prev``."""
        reshrink(self.st)
        while True:
            found = self.query()
            m_old = self.take_rows(found)
            k, n_e = len(found.rows), found.n_examined
            del found
            self.solve_step(m_old, k, n_e)
            if not self.scan_only:
                then = self.judge_query(k, n_e)
                if then == _ASK_AGAIN:
                    continue
                if then == _STOP:
                    return self.added, self.came_back
            if self.check():
                return self.added, self.came_back

    # ---- 1. query -------------------------------------------------------------------------
    def query(self) -> Found:
        """Fresh rows satisfying eq. 10 from the index with their values (none once the scan
        took over), and the rows the search examined."""
        st, cfg = self.st, self.cfg
        if self.scan_only:
            found = _NOTHING
        else:
            found = st.forest.query(
                st.w, w_outer=self.w_t, s=cfg.s, n=self.nq, exclude=st.in_S,
                seed=st.draw_seed(), loss=cfg.loss, max_examined=self.max_examined,
                bounded=True, min_precision=cfg.min_precision, max_read=self.max_examined,
                with_rows=True)
            lq = self.last = st.forest.last_query
            self.q_cost = ((lq["rows_examined"] + lq["pivots_scored"]
                            + cfg.query_read_cost * lq["rows_read"]) * self.row_work
                           + cfg.visit_cost * (lq["nodes_expanded"] + lq["leaves_scanned"]))
            self.q_found = len(found.rows)
            st.stats.queries += 1
        st.stats.rows_examined += found.n_examined
        self.queried_at_solution, self.at_solution = self.at_solution, False
        return found

    def take_rows(self, found: Found) -> int:
        """The query's rows join S with their values; returns |S| before them (the rows from
        that position on are new). They are reserved first, three times over (what the fetch
        they replace took, its rows and their copies in query order: kept, so that a cap
        presses the caches as before); where the cap cannot hold them all, as many as it can
        join now, and a later query or check finds the others again."""
        st = self.st
        m_old = st.S.m
        k = len(found.rows)
        if not k:
            return m_old
        budget = st.store.budget
        k_in = reserve_rows(budget, k, 3 * self.row_bytes, "IBCD fresh rows")
        st.stats.fetches_cut += int(k_in < k)
        try:
            rearranged = self.join(found.rows[:k_in], found.X[:k_in], found.y[:k_in],
                                   found.sqnorm[:k_in])
        finally:
            budget.release(3 * k_in * self.row_bytes)
        if rearranged:  # the new rows are S's last k_in
            self.r, m_old = 0, st.S.m - k_in
        return m_old

    # ---- 2-3. the block and its solve ------------------------------------------------------
    def solve_step(self, m_old: int, k: int, n_e: int) -> None:
        """B = the new rows and the next n_e - |N| rows of the old S, cyclically; solve
        (11) on B; and (13) on S when S has doubled since it last was solved."""
        st, cfg, S = self.st, self.cfg, self.st.S
        extra = min(max(0, int(n_e) - k), m_old)
        if S.spilled:  # B is read back into memory: at most a window of rows
            extra = min(extra, max(0, S.window_rows() - k))
        if m_old:
            cyc = (self.r + np.arange(extra, dtype=np.int64)) % m_old
            self.r = int((self.r + extra) % m_old)
        else:
            cyc = np.empty(0, np.int64)
        B = np.concatenate([np.arange(m_old, S.m, dtype=np.int64), cyc])
        if B.size:
            solve_block(st, S, B, iters=cfg.block_iters, solver=cfg.block_solver)
        st.stats.inner_iterations += 1
        if S.m >= cfg.resolve_growth * self.m_solved:
            # blocks of fresh rows pull w towards them and rows near the margin flip in and
            # out: without this S swallows them all (a spilled S too)
            self.resolve()
            prune_inactive(st)
            self.r = 0
            reshrink(st)
            self.m_solved = max(S.m, cfg.n)
            st.stats.S_resolves += 1

    # ---- 4. judge the query -------------------------------------------------------------
    def judge_query(self, k: int, n_e: int) -> int:
        """What follows a query that found ``k`` rows: ask again, stop (the sampled rule),
        or check."""
        st, cfg, lq, stats = self.st, self.cfg, self.last, self.st.stats
        n = cfg.n
        # cut: the query stopped at its limit of rows examined, of rows read or of
        # precision, or where the cap held no larger frontier (truncated), before finding
        # nq rows
        truncated = k < self.nq and lq["truncated"]
        cut = k < self.nq and (n_e >= self.max_examined or truncated or lq["low_precision"]
                               or lq["read_limited"])
        stats.queries_cut += int(cut)
        stats.queries_truncated += int(truncated)
        stats.queries_imprecise += int(cut and lq["low_precision"])
        # n_e of the sampled rule counts the instances the search traversed (the paper's
        # n_e): the rows examined and the pivots scored to rank partitions
        n_trav = n_e + lq["pivots_scored"]
        sampled = ((k >= self.nq or cut) and cfg.sample_eps > 0 and n_trav > 0
                   and k / n_trav < cfg.sample_eps)
        if sampled:
            # the rule speaks for the w it was asked at, and the stop returns the solution
            # of (13) on S: unless asked at one, S is solved (quick_iters passes, as a check
            # solves it first) and the index asked again there; where the rule holds again,
            # the solve goes on to max_iters and the loop stops. A resident S whose dual CD
            # does not reach eps spends max_iters passes on each full solve: one per stop,
            # not one per time the rule held
            if not self.queried_at_solution:
                self.solve_S(cfg.quick_iters)
                self.at_solution = True
                stats.sample_rule_rechecks += 1
                return _ASK_AGAIN
            self.solve_S(cfg.max_iters)
            stats.stopped_by_sample_rule += 1
            st.checker.drop_answer()
            return _STOP
        # a query that cost more than scan_margin scans: the check comes next (it finds
        # every row the query would; the costs compared there decide what follows)
        slow = self.cost_model and self.q_cost > cfg.scan_margin * self.scan_cost()
        stats.queries_slow += int(slow)
        # the index stays asked while the query found nq rows, or was cut but still found
        # n/2 (not nq/2) rows, or, under the sampled rule, where the scan would read more of
        # the store than a query may (blocks the cache does not hold)
        if (k >= self.nq or (cut and not truncated and (
                2 * k >= n or (cfg.sample_eps > 0 and self.unread() > self.max_examined)))) \
                and not slow:
            self.size_next_query(k, n_e)
            return _ASK_AGAIN
        self.scan_only = cut
        return _CHECK

    def size_next_query(self, k: int, n_e: int) -> None:
        """Double the next query's n where violators were dense (the rows it returns, with a
        copy or two on their way into S, must fit 4 times in the free part of the cap);
        back to n after a short query or while S is spilled."""
        S, cfg = self.st.S, self.cfg
        room = self.st.store.budget.available // (4 * self.row_bytes)
        top = cfg.n if S.spilled else min(self.nq_max, max(cfg.n, min(S.window_rows(), room)))
        if k >= self.nq and k >= cfg.dense_query * n_e and self.nq < top:
            self.nq = min(top, 2 * self.nq)
            self.st.stats.queries_grown += 1
        elif S.spilled or k < self.nq:
            self.nq = cfg.n

    # ---- 5. the check -----------------------------------------------------------------------
    def check(self) -> bool:
        """Problem (13) on S to eps (in ``quick_iters`` passes first), then the check of
        every row outside S (§4.3); its rows join S. Returns whether the problem is solved.

        Every row outside S violates y w^T x >= 1 by less than the dual CD tolerance (its
        projected gradient is within eps of 0), or by less than what dual CD left on S when
        it stopped at its pass limit (as LIBLINEAR does): adding rows cannot do better. A
        solve cut at ``quick_iters`` passes is first carried on to ``max_iters``, and the
        check repeated; unless the last full solve converged and the check still finds |S|
        / 2 violators or more: then they join S without that solve. (Only a scan's answer
        comes to the stop: the pool answers with a violation of max(eps, resid) or more,
        else the check scans. A sample's rows join S whatever their violation: the pass saw
        ``check_sample`` times the rows it may admit violating, so the store holds many.)
        """
        st, cfg, S = self.st, self.cfg, self.st.S
        resid = self.solve_S(cfg.quick_iters)
        full = resid == 0.0
        self.freeze()
        ans = self.check_rows(max(cfg.eps, resid))
        # a frozen row is ours to certify: after a full solve it comes back where it
        # violates by more than eps, whatever dual CD left on S, until thaw_stalls full
        # solves in a row have stalled; then, and after a quick solve (a full one follows
        # before any stop), it is held to the spread S was left with, as the others are
        while len(ans.rows) == 0 or (not ans.sampled and ans.worst < max(cfg.eps, resid)
                                     and ans.thaw_worst <= self.thaw_limit(resid, full)
                                     and not (
                self.converges and not full and 2 * ans.n_viol >= S.m)):
            if full:
                assert ans.scanned  # a stop rests on every row examined
                st.checker.drop_answer()
                return True
            if 0 < len(ans.rows) < cfg.n:
                # the few rows that violate join S before the full solve, which the next
                # check then certifies
                if self.join(ans.rows, ans.X, ans.y):
                    self.r = 0
            resid, full = self.solve_S(cfg.max_iters), True
            self.converges = resid == 0.0
            self.stalls = 0 if self.converges else self.stalls + 1
            self.freeze()
            ans = self.check_rows(max(cfg.eps, resid))
        st.stats.full_solves_skipped += int(not full and ans.worst < max(cfg.eps, resid))
        if self.join(ans.rows, ans.X, ans.y):
            self.r = 0
        # the index or the scan for the rows still violating? The next scan finds at least
        # min(left, |S|) of them; the last query found q_found at q_cost. Where the scan
        # finds rows scan_margin times cheaper, or fewer than n/2 are left (a query would be
        # cut), the rest of this problem is scan-only. A sample's count is of the blocks it
        # read: the store holds more, and the next pass finds them at no more than a scan's
        # cost
        left = ans.n_viol - len(ans.rows)
        if self.cost_model and not self.scan_only and not ans.from_pool and (
                2 * left < cfg.n or min(left, S.m) * self.q_cost
                >= cfg.scan_margin * max(1, self.q_found) * self.scan_cost()):
            self.scan_only = True
            st.stats.scans_preferred += 1
        reshrink(st)  # shrinking starts afresh after a check (§4.3): only S stays marked
        return False

    def thaw_limit(self, resid: float, full: bool) -> float:
        """The violation above which a frozen row comes back after a solve of S that left
        the spread ``resid`` (``full``: to eps or ``max_iters`` passes; see
        ``IBCDConfig.thaw_stalls``)."""
        eps = self.cfg.eps
        return max(eps, resid) if not full or self.stalls >= self.cfg.thaw_stalls else eps

    def check_rows(self, thresh: float):
        """The check's answer (the pool or a scan; see ``check.Checker``): at most
        ``check_growth`` |S| rows, at least n, as many as fit without spilling (the rows
        read and S's grown buffers coexist for a moment, so room for twice as many is
        asked)."""
        st, cfg, S = self.st, self.cfg, self.st.S
        want = max(cfg.n, int(cfg.check_growth * (S.m + st.n_frozen)))
        if S.spilled:  # the rows pass through memory on their way to S's file
            want = max(cfg.n, min(want, S.window_rows()))
        per_row = S.nnz / max(1, S.m) if S.sparse else 0.0
        while want > cfg.n and not S.fits(2 * want, int(2 * want * per_row)):
            want = max(cfg.n, want // 2)
        # IBCDConfig.admit: a uniform sample drawn from the run's stream, or the most violating
        rng = np.random.default_rng(st.draw_seed()) if cfg.admit == "random" else None
        return st.checker.check(st.w, self.w_t, want, thresh, keep_pool=not S.spilled,
                                rng=rng)

    def freeze(self) -> None:
        """After a solve of S, the rows it left at alpha = C far inside the margin leave S
        frozen (where the run freezes; the scan that follows examines them again), and, where
        S's rows outgrow ``IBCDConfig.prune_bytes``, so do its rows at alpha = 0 with
        y w^T x >= 1."""
        st = self.st
        if st.frozen is not None:
            prune_inactive(st, inactive=st.S.row_bytes() > self.cfg.prune_above)
            self.r = 0

    # ---- S --------------------------------------------------------------------------------
    def join(self, rows, XN, yN, sqn=None) -> bool:
        """Rows join S (:func:`admit`; ``sqn`` their squared norms, if known); returns
        whether S was rearranged."""
        self.added += len(rows)
        if self.w_prev is not None:
            self.came_back += int((margins(XN, yN.astype(np.float64), self.w_prev,
                                           self.cfg.bias) < self.low).sum())
        rearranged = admit(self.st, rows, XN, yN, self.resolve, sqn)
        self.st.checker.drop_answer()  # the rows are S's now
        return rearranged

    def resolve(self) -> None:
        """Problem (13) on S on the way (a check follows later)."""
        solve_S(self.st, self.cfg.quick_iters, max_rounds=self.cfg.spilled_resolve_rounds)

    def solve_S(self, max_iter: int) -> float:
        """Problem (13) on S to eps in at most ``max_iter`` passes; returns what dual CD
        left (0 when converged). A spilled S first loses its inactive rows (§4.2), and what
        is left comes back into memory when it fits."""
        st = self.st
        if st.S.spilled:
            prune_inactive(st)
            self.r = 0
            reshrink(st)
        if not st.S.m:
            return 0.0
        return solve_S(st, max_iter)

    # ---- the cost model -------------------------------------------------------------------
    def unread(self) -> int:
        """Rows of the blocks the cache does not hold: what a scan check reads."""
        store = self.st.store
        off = store.block_offsets
        return sum(int(off[b + 1] - off[b]) for b in range(store.n_blocks)
                   if not store.block_is_cached(b))

    def scan_cost(self) -> float:
        """A scan check in stored values touched: the rows outside S, and ``read_cost``
        more for each row it reads."""
        return ((self.st.forest.n_samples - self.st.S.m + self.cfg.read_cost * self.unread())
                * self.row_work)


def reshrink(st) -> None:
    """Restart shrinking on the index (§4.3) with the rows of S marked: S is excluded from
    every query anyway, and marked rows let the search skip a node S covers without
    visiting its leaves."""
    st.forest.unshrink()
    st.forest.shrink(st.cfg.shrink_threshold, rows=st.S.rows[: st.S.m])


def admit(st, rows, XN, yN, resolve, sqn=None) -> bool:
    """Rows ``rows`` (``XN``, ``yN``; squared norms ``sqn``, computed here if None) join S and
    are marked on the index. Under a tight cap
    (§4.2): when they do not fit, the check's pool gives its room up, then the inactive rows
    (alpha = 0, y w^T x >= 1) leave S, then (13) is solved on S (``resolve()``) and pruned
    again, and only then S spills to disk. Returns whether S was rearranged (the cyclic
    reader restarts)."""
    S = st.S
    k = XN.shape[0]
    nnz = int(XN.indptr[-1]) if S.sparse else 0
    if not S.fits(k, nnz):
        st.checker.pool.clear()
    moved = not S.fits(k, nnz)
    if moved:
        prune_inactive(st)
        if not S.fits(k, nnz) and not S.spilled:
            # the rows a block's solve left at alpha > 0 on the way often settle at 0
            resolve()
            prune_inactive(st)
            st.stats.S_resolves_before_spill += 1
        if not S.fits(k, nnz):
            S.spill()
    alpha = None
    if st.frozen is not None:
        thaw = st.frozen[rows]
        if thaw.any():  # frozen rows a check brought back keep their alpha = C
            alpha = np.where(thaw, st.cfg.frozen_alpha, 0.0)
            st.frozen[rows[thaw]] = False
            st.stats.thawed += int(thaw.sum())
    S.add(rows, XN, yN.astype(np.float64), row_sqn(XN) if sqn is None else sqn, alpha)
    st.in_S[rows] = True
    if moved:  # rows left S: their marks must go
        reshrink(st)
    else:
        st.forest.shrink(st.cfg.shrink_threshold, rows=rows)
    return moved
