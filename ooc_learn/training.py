"""``ooc_learn.train``: fit a linear SVM on a store with one of the out-of-core solvers."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ooc_learn.model import LinearModel
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.store import Store, open_store

__all__ = ["train", "SOLVERS", "open_data"]

SOLVERS = ("ibcd", "dcd", "bm", "pegasos")


def _check(solver, loss, C, s, bias, eps, max_outer, block_size):
    def bad(name, cond, got, hint=""):
        raise ParameterError(f"The '{name}' parameter of train must be {cond}. "
                             f"Got {got!r} instead.", hint)

    if solver not in SOLVERS:
        bad("solver", f"one of {', '.join(SOLVERS)}", solver)
    if loss not in ("hinge", "sqhinge"):
        bad("loss", "'hinge' or 'sqhinge'", loss)
    if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
        bad("C", "> 0", C, "C is the SVM cost; try 1.")
    if s is not None and not (isinstance(s, (int, float)) and s >= 0):
        bad("s", ">= 0 or None", s, "--truncate 1 is the usual ramp loss.")
    if s is not None and solver != "ibcd":
        raise ParameterError("The truncated loss (--truncate) is solved by IBCD only.",
                             "Use --solver ibcd or --no-truncate.")
    if not (isinstance(bias, (int, float)) and bias >= 0):
        bad("bias", ">= 0", bias, "1 adds an intercept, 0 none.")
    if not (isinstance(eps, (int, float)) and eps > 0):
        bad("eps", "> 0", eps, "LIBLINEAR's default is 0.1.")
    if not (isinstance(max_outer, int) and max_outer >= 1):
        bad("max_outer", "an int >= 1", max_outer)
    if not (isinstance(block_size, int) and block_size >= 1):
        bad("block_size", "an int >= 1", block_size)


def open_data(data, memory=None) -> tuple[Store, bool]:
    """``(store, opened_here)`` for a Store or a store path."""
    if isinstance(data, Store):
        return data, False
    return open_store(data, memory=memory), True


def train(store, *, solver: str = "ibcd", loss: str = "hinge", C: float = 1.0,
          s: float | None = None, bias: float = 1.0, eps: float = 0.1, max_outer: int = 10,
          block_size: int = 1000, block_solver: str = "dual", epochs: int = 1,
          init_sample: int = 10000, sample_eps: float = 0.0, seed: int = 0, memory=None,
          spill_dir=None, on_outer=None) -> LinearModel:
    """Train a linear SVM on a binary store; returns a :class:`LinearModel`.

    Parameters
    ----------
    store : Store or path
    solver : "ibcd" | "dcd" | "bm" | "pegasos"
        IBCD (indexed block coordinate descent, needs the index); full dual CD streaming
        every block every epoch; block minimisation (Yu et al. 2010); PEGASOS (online).
    loss : "hinge" | "sqhinge"
    C : float
        The SVM cost (LIBLINEAR's -c).
    s : float or None
        Truncate the loss at L(-s) (IBCD only; None: the convex loss).
    bias : float
        The value of the augmented constant feature (LIBLINEAR -B); its weight is
        regularized like the others. 0: no intercept.
    eps : float
        Stopping tolerance (LIBLINEAR's projected-gradient spread for the dual solvers).
    max_outer : int
        Outer iterations: IBCD's relaxation steps, bm's passes over the blocks, dcd's epochs
        (x 100).
    block_size : int
        IBCD: fresh rows asked of the index per step (the paper's n).
    block_solver : "dual" | "primal"
        IBCD's block sub-problem solver (primal = TRON, squared hinge only).
    epochs : int
        PEGASOS passes.
    sample_eps : float
        IBCD's sampled stopping rule (§3.1): stop the inner loop when the share of fresh rows
        among those the index examined, |N| / n_e, falls below it (0: only |N| < n). Reads
        less; the final check over all rows is then skipped, so optimality is approximate.
    spill_dir : path, optional
        IBCD: where the active set spills to disk when it outgrows its share of ``memory``
        (§4.2; default: the folder holding the store).

    Returns
    -------
    LinearModel
        ``model.meta`` holds the solver's parameters, the store fingerprint and ``stats``
        (seconds of training, I/O included; rows and bytes read; objective; ...).

    Examples
    --------
    >>> model = ooc_learn.train("train.store", solver="ibcd", C=1.0)   # doctest: +SKIP
    >>> model.score("test.store")                                      # doctest: +SKIP
    """
    _check(solver, loss, C, s, bias, eps, max_outer, block_size)
    if not (isinstance(sample_eps, (int, float)) and 0 <= sample_eps < 1):
        raise ParameterError(f"The 'sample_eps' parameter of train must be in [0, 1). Got "
                             f"{sample_eps!r} instead.", "0 disables the sampled rule; try 0.01.")
    st, opened = open_data(store, memory)
    try:
        if st.task != "binary":
            raise ParameterError(
                f"train fits a binary classifier; the store {st.path} holds a {st.task} task.",
                "Ingest with --positive-label L to train L-vs-rest.")
        t0 = time.perf_counter()
        rows0, bytes0 = st.rows_read, st.bytes_read
        model_bytes = _model_state_bytes(solver, block_solver, st.n_features)
        st.budget.reserve(model_bytes, f"{solver} model state for {st.n_features:,} features "
                                       f"(w and the solver's per-feature vectors)",
                          hint="or check the source for a stray large feature index (the "
                               "store has as many features as the largest index)")
        try:
            stats = _run(st, solver=solver, loss=loss, C=C, s=s, bias=bias, eps=eps,
                         max_outer=max_outer, block_size=block_size,
                         block_solver=block_solver, epochs=epochs, init_sample=init_sample,
                         sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                         on_outer=on_outer)
        finally:
            st.budget.release(model_bytes)
        w = stats.pop("w")
        stats["seconds"] = time.perf_counter() - t0
        stats.setdefault("rows_read", st.rows_read - rows0)
        stats.setdefault("bytes_read", st.bytes_read - bytes0)
        stats["rows_read_per_outer"] = stats["rows_read"] / max(1, stats.get("outer_iterations", 1))
        classes = LinearModel.classes_from_label_map(st.label_map)
        return LinearModel.from_weights(
            w, bias=bias, classes=classes, solver=solver, loss=loss, C=C, s=s,
            eps=eps, block_solver=block_solver if solver == "ibcd" else None,
            store=str(st.path), store_fingerprint=st.fingerprint(),
            label_map=st.label_map, zero_based=st.metadata.get("zero_based"), stats=stats)
    finally:
        if opened:
            st.close()


# float64 vectors of d + 1 entries alive at once, per solver: IBCD holds w, the outer iterate,
# the previous one, the step's delta, w_0's sample solution and the index's query copies
# (float64 and float32); TRON (IBCD's primal block solver) adds its iterate, gradient, step,
# residual and Hessian-vector product; dcd/bm hold w and a copy; PEGASOS its scaled w, its
# average and a copy; every solver's result and the saved model add two more.
_MODEL_VECTORS = {"ibcd": 9, "ibcd-primal": 15, "dcd": 4, "bm": 4, "pegasos": 5}


def _model_state_bytes(solver: str, block_solver: str, d: int) -> int:
    key = "ibcd-primal" if solver == "ibcd" and block_solver == "primal" else solver
    return _MODEL_VECTORS[key] * 8 * (int(d) + 1)


def _run(st, *, solver, loss, C, s, bias, eps, max_outer, block_size, block_solver, epochs,
         init_sample, sample_eps, seed, spill_dir, on_outer) -> dict:
    # every solver reports one dict per outer iteration/epoch: {"outer": i, ...}
    report = on_outer
    step = None if on_outer is None else (lambda i, info: report(dict(info, outer=i)))
    if solver == "ibcd":
        from ooc_learn.solvers.ibcd import solve_ibcd

        res = solve_ibcd(st, loss=loss, C=C, s=s, bias=bias, n=block_size, eps=eps,
                         max_outer=max_outer, init_sample=init_sample, sample_eps=sample_eps,
                         block_solver=block_solver, seed=seed, spill_dir=spill_dir,
                         on_outer=on_outer)
        stats = dict(res.stats)
        stats.pop("outer_log", None)
        stats["w"] = res.w
        return stats
    if solver == "dcd":
        from ooc_learn.solvers.dcd import solve_dcd_store

        res = solve_dcd_store(st, loss=loss, C=C, bias=bias, eps=eps, max_iter=100 * max_outer,
                              seed=seed, on_epoch=step)
        return _dcd_stats(res, loss, C)
    if solver == "bm":
        from ooc_learn.solvers.dcd import solve_bm_streamed

        res = solve_bm_streamed(st.read_block, st.block_offsets, st.n_features, loss=loss, C=C,
                                bias=bias, eps=eps, max_outer=max_outer, seed=seed,
                                sqnorms=st.sqnorms, budget=st.budget, on_outer=step)
        return _dcd_stats(res, loss, C)
    from ooc_learn.solvers.pegasos import solve_pegasos_streamed

    res = solve_pegasos_streamed(st.read_block, st.block_offsets, st.n_features, loss=loss,
                                 C=C, bias=bias, epochs=epochs, seed=seed)
    return {"w": np.asarray(res.w, dtype=np.float64), "outer_iterations": epochs,
            "objective": None, "n_sv": None}


def _dcd_stats(res, loss, C) -> dict:
    st = res.stats
    # the dual value (-f(alpha)): a lower bound of the primal, equal to it at the optimum
    dual = -float(getattr(st, "objective", float("nan")))
    return {"w": res.w, "outer_iterations": int(getattr(st, "epochs", 0)),
            "objective": dual, "dual_objective": dual,
            "n_sv": int(np.count_nonzero(res.alpha)), "converged": bool(getattr(st, "converged", True))}
