"""The solves of Algorithm 1: the block problem (11) and problem (13) on the active set S.

Both run dual CD on rows of S with w kept equal to sum alpha_i y_i [x_i, bias] (eq. 8), so a
block's solve sees every other row of S (and of the data: their alpha is 0) through w. A
spilled S (§4.2) is read back a window at a time.
"""

from __future__ import annotations

import numpy as np

from ooc_learn.losses import get_loss
from ooc_learn.storage.arrays import kernel_args
from ooc_learn.storage.resources import release_free_heap

from .. import _kernels as K
from .. import hinge_newton
from .._common import margins
from ..dcd import dcd_subproblem
from ..tron import L2LossPrimal, tron

__all__ = ["QUICK_H", "QUICK_MIN_BYTES", "QUICK_POLISH", "S_margins", "drop_outliers",
           "objective_on_S", "primal_eps", "prune_inactive", "solve_S", "solve_block"]

# A solve of S on the way (IBCDConfig.quick_newton_steps): Newton's steps on the hinge
# smoothed over this width, then this many passes of dual CD. On the issue-23 store (S of
# 10-80k rows near the margin) 100 passes of dual CD alone left a projected-gradient spread
# of 3-7 in 0.4-5 s each; 10 steps at this width take 0.3-1.6 s (bench-log 2026-11-27,
# session 37). A width of 0.01 needs 40-60 steps; 0.3 was faster still, but its one run
# ended at 93.83 % test accuracy against 94.1-94.4 %.
QUICK_H = 0.1
QUICK_POLISH = 10
# ... where a pass over S reads this many bytes at least (ActiveSet.row_bytes): below, dual
# CD's passes are cheap, and the few passes after Newton's steps left a spread that kept
# the checks from asking for full solves (w8a at C = 10: 397 checks, 46.6 s against
# 0.35 s; LIBSVM's a9a, w8a and ijcnn1 hold S in 0.03-0.3M values)
QUICK_MIN_BYTES = 16 << 20
# rounds of a spilled S's solve on the way after its Newton steps (a sweep and a working set)
SPILLED_QUICK_POLISH = 2
# Newton steps at most in a final solve of a resident S: warm from IBCD's w, the issue-23
# store's take 17-67; Fashion-MNIST class 1 at C = 100 needed 277, and at 100 the point left
# to dual CD was so far off (objective 28,110 against 15,849 on that S) that no solve of the
# run converged (bench-log 2026-11-28, session 42). It costs a 2,048-feature run 47-52 s
# against 37-40 s, where dual CD finished the point of 100 steps (retrying with 400 only
# where the polish failed was slower at C = 100 and left a run approximate). A spilled S
# keeps newton_hinge's 100 (a step is a pass over its file)
FINAL_NEWTON_STEPS = 400


def S_margins(S, w, bias) -> np.ndarray:
    """y_i [x_i, bias]^T w over S, window by window when S is spilled."""
    y = S.state()[0]
    out = np.empty(S.m)
    for a, b, X in S.windows():
        out[a:b] = margins(X, y[a:b], w, bias)
    return out


def objective_on_S(S, w, base_loss, C, bias) -> float:
    """1/2|w|^2 + C sum over S of L(y w^T x): rows outside S have zero loss at a solution."""
    if S.m == 0:
        return 0.5 * float(w @ w)
    z = S_margins(S, w, bias)
    return 0.5 * float(w @ w) + C * float(np.sum(base_loss.value(z)))


def drop_outliers(st, w_t, low) -> int:
    """Remove the rows of S that are outliers at w_t (eq. 5), taking their alpha out of w;
    returns how many left."""
    S, w, bias = st.S, st.w, st.cfg.bias
    keep = S_margins(S, w_t, bias) >= low
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
    st.in_S[S.rows[: S.m][~keep]] = False
    S.keep(keep)
    return removed


def prune_inactive(st, *, inactive: bool = True) -> None:
    """Drop the rows of S at alpha = 0 with y w^T x >= 1 (``inactive``), and, where the run
    freezes (``IBCDConfig.freezes``), freeze the rows at alpha = C with y w^T x <
    1 - ``freeze_margin``: they leave S and keep their alpha in w. The check brings back any
    that violate again."""
    S, cfg = st.S, st.cfg
    if not S.m or not inactive and st.frozen is None:
        return
    alpha = S.state()[2]
    z = S_margins(S, st.w, cfg.bias)
    leave = (alpha <= 0) & (z >= 1.0) if inactive else np.zeros(S.m, bool)
    st.in_S[S.rows[: S.m][leave]] = False
    st.stats.pruned += int(leave.sum())
    if st.frozen is not None:
        bounded = (alpha >= cfg.frozen_alpha) & (z < 1.0 - cfg.freeze_margin)
        st.frozen[S.rows[: S.m][bounded]] = True  # in_S stays marked
        st.stats.frozen += int(bounded.sum())
        leave |= bounded
    if not leave.any():
        return
    S.keep(~leave)
    release_free_heap()


def primal_eps(cfg, y) -> float:
    """TRON's relative tolerance by LIBLINEAR's -s 2 rule for a problem with labels ``y``."""
    pos = int((y > 0).sum())
    return cfg.primal_eps * max(min(pos, len(y) - pos), 1) / max(len(y), 1)


def solve_S(st, max_iter: int, max_rounds: int | None = None) -> float:
    """Problem (13) on S to ``eps`` (LIBLINEAR's projected-gradient spread) within
    ``max_iter`` dual CD passes; returns the spread reached (0 when converged).

    A resident S: dual CD with shrinking. For the hinge, a solve a stop may rest on
    (``max_iter`` >= ``max_iters``) first runs Newton's method on the smoothed hinge
    (:mod:`~ooc_learn.solvers.hinge_newton`, ``IBCDConfig.newton``), and dual CD polishes
    the dual point it leaves: on S's correlated rows near the margin dual CD alone spends
    its 1000 passes short of eps. A final solve of an S with fewer rows than Newton's rule
    asks runs dual CD first; where its passes run out short of eps, Newton's method goes on
    from there and dual CD polishes again, and every later final solve of the run begins
    with Newton (``IBCDStats.newton_after_stall``; Fashion-MNIST class 1 at C = 10 ended
    9 % above the optimum without, bench-log 2026-11-28); a final solve's Newton phase of
    a resident S takes up to ``FINAL_NEWTON_STEPS`` steps. A solve on the way of an S whose
    pass reads ``QUICK_MIN_BYTES`` or more takes ``IBCDConfig.quick_newton_steps`` Newton
    steps on a wider smoothing (``QUICK_H``) and ``QUICK_POLISH`` passes of dual CD, an
    approximate solve (Newton to convergence there took as long as the passes it replaced,
    session 36);
    a smaller S, ``quick_iters`` passes (bench-log 2026-11-27, session 37). With the primal
    block solver (squared hinge) TRON instead; with the dual one too, once dual CD
    has not converged in ``dual_switch_iters`` passes of a solve a stop may rest on
    (LIBLINEAR's ``-s 1``), and from then on.

    A spilled S of the hinge begins likewise by Newton's method, read window by window
    (:func:`~ooc_learn.solvers.hinge_newton.newton_hinge_windows`: a traversal of S's file a
    step): to convergence for a solve a stop rests on, ``quick_newton_steps`` on the way,
    followed there by ``SPILLED_QUICK_POLISH`` rounds only (10x setting of issue 23: the
    spilled solves took 13.8 s instead of 32 s, bench-log 2026-11-28). Then it is solved
    by rounds of a working set. Even rounds sweep S window by window
    (block minimisation over S, Yu et al. 2010; :func:`_sweep_spilled`): each window is read
    once, its projected gradients taken and its rows that can move (alpha > 0, or a violated
    bound) solved by dual CD with shrinking while the others stay fixed in w; a sweep whose
    spread is below ``eps`` ends the solve. Odd rounds solve the most violating rows of all
    of S (by the last sweep's gradients) in one window, which finishes where the sweep
    zigzags between windows. At most ``max_rounds`` rounds (default: ``spilled_rounds`` on
    the way, ``spilled_final_rounds`` for a solve a stop rests on, which also ends once the
    spread has not fallen for ``spilled_stall`` rounds).
    """
    cfg, S, w, stats = st.cfg, st.S, st.w, st.stats
    final = max_iter >= cfg.max_iters
    if max_rounds is None:
        max_rounds = cfg.spilled_final_rounds if final else cfg.spilled_rounds
    y, sqn, alpha = S.state()
    solver = cfg.block_solver
    if solver == "dual" and stats.switched_to_primal:
        # dual CD stalled on S once: it stalls again on the S that follows
        solver = "primal"
    # Newton's method first (a spilled S: a traversal of its file a step); dual CD, or a
    # spilled S's rounds, polish its dual point
    quick, newton = _newton_first(st, S, final) if solver == "dual" else (False, False)
    if solver == "dual" and not S.spilled:
        if quick:
            max_iter = min(max_iter, QUICK_POLISH)
        switch = max_iter > cfg.dual_switch_iters and get_loss(cfg.loss).base().name == "sqhinge"

        def dual_cd():
            return dcd_subproblem(S.X, y, alpha, w, loss=cfg.loss, C=cfg.C, bias=cfg.bias,
                                  eps=cfg.eps,
                                  max_iter=cfg.dual_switch_iters if switch else max_iter,
                                  shrinking=True, rng=st.draw_seed(), sqnorms=sqn)

        res = dual_cd()
        if (not res.converged and final and not newton
                and _newton(st, S, any_rows=True, final=True)):
            # dual CD stalled on an S too small for Newton's rule: Newton's method from
            # where it stopped, and dual CD polishes; the run's later final solves begin so
            stats.newton_after_stall += 1
            res = dual_cd()
        if res.converged or not switch:
            stats.S_converged = bool(res.converged)
            return 0.0 if res.converged else float(res.pg_max - res.pg_min)
        stats.switched_to_primal += 1
        solver = "primal"
    if solver == "primal" and not S.spilled:
        # the L2 primal by TRON on all of S (rows outside S have alpha = 0: v_B̄ = 0); alpha
        # from the KKT conditions of (16)
        prob = L2LossPrimal(S.X, y, C=cfg.C, loss="sqhinge", bias=cfg.bias)
        res = tron(prob, w.copy(), eps=primal_eps(cfg, y), max_iter=max_iter)
        w[:] = res.w
        alpha[:] = prob.dual(res.w)
        stats.S_converged = bool(res.stats.converged)
        return 0.0
    if quick:
        max_rounds = min(max_rounds, SPILLED_QUICK_POLISH)
    base = get_loss(cfg.loss).base()
    upper, diag = base.dual_upper(cfg.C), base.dual_diag(cfg.C)
    rounds, last, spread, best, since_best = 0, np.inf, np.inf, np.inf, 0
    PG = None
    while True:
        stats.spilled_rounds += 1
        if rounds % 2 == 0:
            PG, last = _sweep_spilled(st, S, max_iter, upper, diag)
            spread = float(PG.max() - PG.min()) if PG.size else 0.0
            best, since_best = (spread, 0) if spread < 0.99 * best else (best, since_best + 2)
        else:
            free = np.flatnonzero((alpha > 0) | (PG != 0))
            cap = S.window_rows()
            if free.size > cap:
                free = np.sort(free[np.argsort(-np.abs(PG[free]), kind="stable")[:cap]])
            last = 0.0
            if free.size:
                res = solve_block(st, S, free, iters=max_iter, solver="dual", shrinking=True)
                last = 0.0 if res.converged else float(res.pg_max - res.pg_min)
        rounds += 1
        if spread < cfg.eps or rounds >= max_rounds or (final and since_best >= cfg.spilled_stall):
            stats.S_converged = spread < cfg.eps
            # like the in-memory solve: the spread its last (working-set) pass left, but
            # never 0 (converged) unless a sweep measured S's spread below eps (a working
            # set's rows, or a sweep's windows, can each be solved while S is not)
            return 0.0 if spread < cfg.eps else max(min(spread, last), cfg.eps)


def _newton_first(st, S, final: bool) -> tuple[bool, bool]:
    """Newton's method on S before dual CD: to convergence for a solve a stop rests on
    (where S has rows enough for it to pay, or dual CD stalled in a final solve of this run
    before), ``quick_newton_steps`` on a wider smoothing on the way (where S's rows are
    large enough). Returns whether the quick steps ran (the polish that follows is short)
    and whether Newton's method ran at all."""
    cfg = st.cfg
    if final:
        return False, _newton(st, S, any_rows=st.stats.newton_after_stall > 0, final=True)
    quick = bool(cfg.quick_newton_steps and S.row_bytes() >= QUICK_MIN_BYTES
                 and _newton(st, S, h=QUICK_H, max_newton=cfg.quick_newton_steps))
    return quick, quick


def _newton(st, S, any_rows: bool = False, final: bool = False, **kw) -> bool:
    """Newton's method on the smoothed hinge before dual CD (``IBCDConfig.newton``), where the
    loss is the hinge, S has enough rows for it to pay (any number with ``any_rows``) and a
    Hessian small enough (:func:`hinge_newton.applies`), and the cap holds its working
    memory (else dual CD alone); ``final``: a resident S's solve takes up to
    ``FINAL_NEWTON_STEPS`` steps; ``kw`` go to :func:`hinge_newton.newton_hinge`. Returns
    whether it ran."""
    cfg = st.cfg
    if not (cfg.newton_on_S and S.m and hinge_newton.applies(S.d, None if any_rows else S.m)):
        return False
    if final and not S.spilled:
        kw["max_newton"] = FINAL_NEWTON_STEPS
    budget = st.store.budget
    need = hinge_newton.newton_hinge_bytes(
        S.m, S.d, read_row_bytes=-(-S.row_bytes() // S.m) if S.spilled else 0)
    if not budget.try_reserve(need, fit_rss=True):
        return False
    try:
        if S.spilled:
            y, _, alpha = S.state()
            res = hinge_newton.newton_hinge_windows(S.windows, S.take, y, alpha, st.w,
                                                    C=cfg.C, bias=cfg.bias, **kw)
        else:
            X, y, _, alpha = S.view()
            res = hinge_newton.newton_hinge(X, y, alpha, st.w, C=cfg.C, bias=cfg.bias, **kw)
    finally:
        budget.release(need)
        # its arrays of n went to malloc's heap, which keeps them (the RSS the budget reads)
        release_free_heap()
    st.stats.newton_solves += 1
    st.stats.newton_steps += res.iterations
    return True


def _sweep_spilled(st, S, max_iter: int, upper: float, diag: float):
    """One pass of block minimisation over a spilled S: each window is read once, its
    projected gradients taken with w as it stands and its movable rows (alpha > 0, or a
    violated bound) solved by dual CD with the rest fixed in w. Returns the projected
    gradients as the pass saw them (their spread is the stop test, as dual CD's pass measures
    each coordinate's before moving it) and the largest spread a window's solve left."""
    cfg, w = st.cfg, st.w
    y, _, alpha = S.state()
    PG = np.empty(S.m)
    worst = 0.0
    for a, b, X in S.windows():
        al = alpha[a:b]
        G = margins(X, y[a:b], w, cfg.bias) - 1.0 + diag * al
        PG[a:b] = np.where(al <= 0, np.minimum(G, 0), np.where(al >= upper, np.maximum(G, 0), G))
        B = np.flatnonzero((al > 0) | (PG[a:b] != 0))
        if not B.size:
            continue
        res = _solve_block_spilled(st, S, a + B, iters=max_iter, solver="dual",
                                   shrinking=True, window=(a, X))
        if not res.converged:
            worst = max(worst, float(res.pg_max - res.pg_min))
    return PG, worst


def solve_block(st, S, B, *, iters: int, solver: str, shrinking: bool = False):
    """The block problem (11) on the rows ``B`` of ``S`` (positions), the rest of S fixed
    in w: dual CD (``iters`` passes), or TRON on its primal (16). Returns dual CD's state
    (None for TRON)."""
    cfg, w = st.cfg, st.w
    if S.spilled:
        return _solve_block_spilled(st, S, B, iters=iters, solver=solver, shrinking=shrinking)
    X, y, sqn, alpha = S.view()
    if solver == "primal":
        # eq. (16): the rows outside B enter through v_B̄ = w - sum_{l in B} alpha_l y_l x_l
        XB, yB = X[B], y[B]
        coef = alpha[B] * yB
        v = w.copy()
        v[: S.d] -= np.asarray(XB.T @ coef).ravel()
        v[S.d] -= cfg.bias * coef.sum()
        prob = L2LossPrimal(XB, yB, C=cfg.C, loss="sqhinge", bias=cfg.bias, v_fixed=v)
        res = tron(prob, w.copy(), eps=primal_eps(cfg, yB), max_iter=iters)
        w[:] = res.w
        alpha[B] = prob.dual(res.w)
        st.stats.block_updates += len(B)
        return None
    res = dcd_subproblem(X, y, alpha, w, rows=B, loss=cfg.loss, C=cfg.C, bias=cfg.bias,
                         eps=cfg.eps, max_iter=iters, shrinking=shrinking,
                         rng=st.draw_seed(), sqnorms=sqn)
    st.stats.block_updates += res.updates
    return res


def _solve_block_spilled(st, S, B, *, iters, solver, shrinking, window=None):
    """The block problem when S is on disk: B's rows are read back (reserved first: a run
    read and the block coexist), or copied from ``window`` = ``(a, X)``, rows a.. of S a
    sweep holds; solved as a small problem, and their alpha written back."""
    y, sqn, alpha = S.state()
    with S.budget.reservation((2 if window is None else 1) * S.bytes_of(B), "IBCD block"):
        rows = S.take(B) if window is None else window[1][B - window[0]]
        sub = _Block(rows, y[B], sqn[B], alpha[B].copy())
        res = solve_block(st, sub, np.arange(B.size, dtype=np.int64), iters=iters,
                          solver=solver, shrinking=shrinking)
        alpha[B] = sub.alpha
    return res


class _Block:
    """Rows read back from a spilled S, shaped like a resident active set."""

    spilled = False

    def __init__(self, X, y, sqn, alpha):
        self.X, self.y, self.sqn, self.alpha = X, y, sqn, alpha
        self.d = X.shape[1]

    def view(self):
        return self.X, self.y, self.sqn, self.alpha
