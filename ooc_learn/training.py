"""``ooc_learn.train``: fit a linear SVM on a store with one of the out-of-core solvers."""

from __future__ import annotations

import math
import os
import time

import numpy as np

from ooc_learn.model import LinearModel
from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.labels import check_two_classes
from ooc_learn.storage.store import open_data, open_store

__all__ = ["train", "train_regression", "train_classes", "SOLVERS", "check_params",
           "run_solver", "model_state_bytes"]

SOLVERS = ("ibcd", "dcd", "bm", "pegasos", "cocoa")
#: the stopping tolerances ``eps=None`` stands for: LIBLINEAR's projected-gradient spread for
#: the dual solvers; CoCoA+'s duality gap relative to the primal (0.1 there left a9a's
#: objective 1.9 % above the optimum)
DEFAULT_EPS, COCOA_EPS = 0.1, 1e-3


def default_eps(solver: str | None) -> float:
    """The stopping tolerance ``solver`` runs to where none is given."""
    return COCOA_EPS if solver == "cocoa" else DEFAULT_EPS


def check_params(solver, loss, C, s, bias, eps, max_outer, block_size):
    """Refuse a parameter of :func:`train` that no solver takes, before any data are read."""
    def bad(name, cond, got, hint=""):
        raise ParameterError(f"The '{name}' parameter of train must be {cond}. "
                             f"Got {got!r} instead.", hint)

    if solver not in SOLVERS:
        bad("solver", f"one of {', '.join(SOLVERS)}", solver,
            "--solver exact is least squares, for a regression store (ingested with --task "
            "regression)." if solver == "exact" else "")
    if loss not in ("hinge", "sqhinge"):
        bad("loss", "'hinge' or 'sqhinge'", loss,
            f"{loss} is a regression loss, for a store ingested with --task regression."
            if loss in ("epsilon_insensitive", "squared_epsilon_insensitive") else "")
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


def train(store, *, solver: str | None = None, loss: str | None = None, C: float = 1.0,
          s: float | None = None, bias: float = 1.0, eps: float | None = None,
          max_outer: int = 10,
          block_size: int = 1000, block_solver: str = "dual", epochs: int = 1,
          init_sample: int = 10000, sample_eps: float = 0.0, seed: int = 0, memory=None,
          spill_dir=None, on_outer=None, epsilon: float = 0.0, n_jobs: int = 1,
          client=None, shards: int | None = None) -> LinearModel:
    """Train a linear model on a store; returns a :class:`LinearModel`.

    A binary store trains a linear SVM, a multiclass store one SVM per class against the
    rest (one model, ``predict`` the class of the largest value), a regression store linear
    SVR / least squares (see ``loss``).

    Parameters
    ----------
    store : Store or path
    solver : "ibcd" | "dcd" | "bm" | "pegasos" | "exact", optional
        IBCD (indexed block coordinate descent, needs the index; the default for
        classification); full dual CD streaming every block every epoch; block minimisation
        (Yu et al. 2010); PEGASOS (online). Regression: "exact" (the normal equations in one
        pass; the default for least squares where the (d+1)^2 Gram matrix fits the cap) or
        "dcd" (dual CD for SVR, LIBLINEAR -s 12 / -s 13).
    loss : "hinge" | "sqhinge" | "squared_epsilon_insensitive" | "epsilon_insensitive"
        Classification: hinge (default) or squared hinge. Regression: the squared
        (default; with ``epsilon=0`` least squares) or the absolute epsilon-insensitive loss.
    epsilon : float
        Regression: the width of the insensitive zone (LIBLINEAR's -p; scikit-learn
        LinearSVR's epsilon). 0 (default) with the squared loss is least squares.
    n_jobs : int
        Multiclass: train up to this many classes at once in threads (every solver; the
        kernels release the GIL and the classes share the index's one LMDB environment),
        as many as the free budget holds two of each one's state for.
    client : dask.distributed.Client, optional
        Multiclass: train the classes as tasks on this Dask cluster (the store's path must be
        visible to the workers; each task reads it as its class against the rest, under a
        cap from its worker's memory limit); the model equals the local one's. With
        ``solver="cocoa"`` (a binary store): one model by CoCoA+ over the cluster.
    shards : int, optional
        CoCoA+: the shards of consecutive blocks (default: the cluster's worker threads).
    C : float
        The SVM cost (LIBLINEAR's -c).
    s : float or None
        Truncate the loss at 1 + s, R_s(z) = min(L(z), 1 + s) (IBCD only; None: the convex
        loss).
    bias : float
        The value of the augmented constant feature (LIBLINEAR -B); its weight is
        regularized like the others. 0: no intercept.
    eps : float, optional
        Stopping tolerance (LIBLINEAR's projected-gradient spread for the dual solvers,
        CoCoA+'s relative duality gap); default :func:`default_eps` of the solver.
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
    eps = default_eps(solver) if eps is None else eps
    if shards is not None and solver != "cocoa":
        raise ParameterError("--shards cuts the store for --solver cocoa.",
                             "Add --solver cocoa (with --workers or --scheduler), or drop "
                             "--shards.")
    if shards is not None and not (isinstance(shards, int) and shards >= 1):
        raise ParameterError(f"--shards must be an int >= 1. Got {shards!r}.",
                             "Pass e.g. --shards 4.")
    if not (isinstance(sample_eps, (int, float)) and 0 <= sample_eps < 1):
        raise ParameterError(f"The 'sample_eps' parameter of train must be in [0, 1). Got "
                             f"{sample_eps!r} instead.", "0 disables the sampled rule; try 0.01.")
    if solver == "cocoa":  # one model over a cluster: a store cut into shards, or a sharded one
        loss = "hinge" if loss is None else loss
        check_params(solver, loss, C, s, bias, eps, max_outer, block_size)
        if client is None or epsilon != 0.0:
            raise ParameterError("--solver cocoa trains one binary model over the store's "
                                 "blocks spread on a Dask cluster.",
                                 "Add --workers N or --scheduler ADDRESS (client=), on a "
                                 "binary store (no --epsilon).")
        from ooc_learn.solvers.cocoa import train_cocoa

        return train_cocoa(store, client, shards=shards, C=C, loss=loss, bias=bias, eps=eps,
                           max_rounds=100 * max_outer, epochs=epochs, seed=seed,
                           on_round=on_outer)
    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store

    if isinstance(store, ShardedStore) or (isinstance(store, (str, os.PathLike))
                                           and is_sharded_store(store)):
        sharded = store if isinstance(store, ShardedStore) else ShardedStore(store)
        raise ParameterError(
            f"{sharded.path} is a sharded store ({sharded.n_shards} shards): one model "
            "over its shards is trained by CoCoA+ on a Dask cluster.",
            "Add --solver cocoa --workers N (or --scheduler ADDRESS), or train one "
            f"shard's store alone ({sharded.shard_path(0)}).")
    st, opened = open_data(store, memory)
    try:
        if st.task == "regression":
            return train_regression(st, solver=solver, loss=loss, C=C, epsilon=epsilon,
                                    bias=bias, eps=eps, max_outer=max_outer, seed=seed,
                                    on_outer=on_outer, s=s)
        solver = "ibcd" if solver is None else solver
        loss = "hinge" if loss is None else loss
        check_params(solver, loss, C, s, bias, eps, max_outer, block_size)
        if epsilon != 0.0:
            raise ParameterError("epsilon (--epsilon) is the insensitive zone of regression; "
                                 f"the store {st.path} holds a {st.task} task.",
                                 "Drop --epsilon.")
        if st.task == "multiclass":
            return _train_one_vs_rest(
                st, solver=solver, loss=loss, C=C, s=s, bias=bias, eps=eps,
                max_outer=max_outer, block_size=block_size, block_solver=block_solver,
                epochs=epochs, init_sample=init_sample, sample_eps=sample_eps, seed=seed,
                spill_dir=spill_dir, on_outer=on_outer, n_jobs=n_jobs, client=client)
        if st.task != "binary":
            raise ParameterError(f"train fits binary, multiclass and regression stores; "
                                 f"{st.path} holds a {st.task} task.",
                                 "Re-ingest it with --task binary, multiclass or regression.")
        check_two_classes(st)
        t0 = time.perf_counter()
        rows0, bytes0 = st.rows_read, st.bytes_read
        model_bytes = model_state_bytes(solver, block_solver, st.n_features)
        st.budget.reserve(model_bytes, f"{solver} model state for {st.n_features:,} features "
                                       f"(w and the solver's per-feature vectors)",
                          hint="or check the source for a stray large feature index (the "
                               "store has as many features as the largest index)")
        try:
            stats = run_solver(st, solver=solver, loss=loss, C=C, s=s, bias=bias, eps=eps,
                         max_outer=max_outer, block_size=block_size,
                         block_solver=block_solver, epochs=epochs, init_sample=init_sample,
                         sample_eps=sample_eps, seed=seed, spill_dir=spill_dir,
                         on_outer=on_outer)
        finally:
            st.budget.release(model_bytes)
        w = stats.pop("w")
        stats.pop("warm", None)
        stats["seconds"] = time.perf_counter() - t0
        stats.setdefault("rows_read", st.rows_read - rows0)
        stats.setdefault("bytes_read", st.bytes_read - bytes0)
        stats["rows_read_per_outer"] = stats["rows_read"] / max(1, stats.get("outer_iterations", 1))
        classes = LinearModel.classes_from_label_map(st.label_map)
        return LinearModel.from_weights(
            w, bias=bias, classes=classes, solver=solver, loss=loss, C=C, s=s,
            eps=eps, block_solver=block_solver if solver == "ibcd" else None,
            store=str(st.path), store_fingerprint=st.fingerprint(),
            label_map=st.label_map, zero_based=st.libsvm_base,
            feature_names=st.metadata.get("feature_names"),
            label_name=st.metadata.get("label_name"), stats=stats)
    finally:
        if opened:
            st.close()


REGRESSION_LOSSES = ("squared_epsilon_insensitive", "epsilon_insensitive")
REGRESSION_SOLVERS = ("exact", "dcd")


def regression_solver(st, solver, loss, epsilon) -> str:
    """The regression solver to run: as asked, or "exact" for least squares where the Gram
    matrix fits half of what the cap leaves free, else "dcd"."""
    from ooc_learn.solvers.least_squares import gram_bytes

    if solver is not None:
        if solver not in REGRESSION_SOLVERS:
            raise ParameterError(
                f"--solver {solver} trains classifiers; {st.path} holds a regression task.",
                "Use --solver exact (least squares, normal equations) or dcd (dual CD SVR), "
                "or leave --solver out.")
        if solver == "exact" and (loss != "squared_epsilon_insensitive" or epsilon != 0):
            raise ParameterError("--solver exact solves least squares (the squared loss at "
                                 "--epsilon 0).", "Use --solver dcd for an epsilon-"
                                 "insensitive loss.")
        return solver
    exact = loss == "squared_epsilon_insensitive" and epsilon == 0
    if exact and gram_bytes(st.n_features) <= st.budget.available // 2:
        return "exact"
    return "dcd"


def train_regression(st, *, solver=None, loss=None, C=1.0, epsilon=0.0, bias=1.0, eps=0.1,
                     max_outer=10, seed=0, on_outer=None, s=None, holdout=None,
                     warm=None, stats_only=False, reference=None):
    """Linear regression on a regression store: least squares by the normal equations
    (solver "exact") or SVR by dual CD (solver "dcd"; LIBLINEAR -s 12 / -s 13)."""
    from ooc_learn.solvers.least_squares import (fold_grams, gram_bytes,
                                                 solve_normal_equations)
    from ooc_learn.solvers.svr import solve_svr_store

    loss = "squared_epsilon_insensitive" if loss is None else loss
    if loss not in REGRESSION_LOSSES:
        raise ParameterError(f"--loss {loss} is a classification loss; {st.path} holds a "
                             "regression task.", "Use --loss squared_epsilon_insensitive "
                             "(least squares at --epsilon 0) or epsilon_insensitive.")
    if s is not None:
        raise ParameterError("The truncated loss (--truncate) is for classification.",
                             "Drop --truncate.")
    if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
        raise ParameterError(f"The 'C' parameter of train must be > 0. Got {C!r} instead.",
                             "C is the cost; try 1.")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon >= 0):
        raise ParameterError(f"--epsilon must be >= 0. Got {epsilon!r}.",
                             "0 fits least squares; LIBLINEAR's -p default is 0.1.")
    solver = regression_solver(st, solver, loss, epsilon)
    t0 = time.perf_counter()
    rows0, bytes0 = st.rows_read, st.bytes_read
    if solver == "exact":
        from ooc_learn.solvers.dcd_streamed import held_out

        n, d = st.n_samples, st.n_features
        a, z, mask = held_out(holdout, n)
        with st.budget.reservation(gram_bytes(d) + n, "normal equations "
                                   f"((d+1)^2 Gram matrix of {d:,} features)",
                                   hint="or train with --solver dcd (dual CD: no Gram matrix)"):
            folds = np.zeros(n, dtype=np.int8)  # 0: trained on, -1: held out
            if mask is not None:
                folds[mask] = -1
            else:
                folds[a:z] = -1
            G, b = fold_grams(st, folds, 1, bias=bias)
            w = solve_normal_equations(G[0], b[0], C)
        stats = {"w": w, "warm": None, "outer_iterations": 1, "converged": True,
                 "stop_reason": "solved (the normal equations)"}
    else:
        res = solve_svr_store(st, loss=loss, C=C, epsilon=epsilon, bias=bias, eps=eps,
                              max_iter=100 * max_outer, seed=seed, holdout=holdout, warm=warm,
                              reference=reference,
                              on_epoch=None if on_outer is None else
                              (lambda i, info: on_outer(dict(info, outer=i))))
        stats = {"w": res.w, "warm": (res.beta, res.w), "outer_iterations": res.stats.epochs,
                 "converged": res.stats.converged, "violation": res.stats.violation,
                 "stop_reason": ("the violation fell to eps of its start"
                                 if res.stats.converged else "the epoch limit (max_iter)"),
                 "reference": res.stats.reference,
                 "n_sv": int(np.count_nonzero(res.beta))}
    stats.update(seconds=time.perf_counter() - t0, rows_read=st.rows_read - rows0,
                 bytes_read=st.bytes_read - bytes0, objective=None)
    if stats_only:
        return stats
    w = stats.pop("w")
    stats.pop("warm", None)
    stats.pop("reference", None)
    stats["rows_read_per_outer"] = stats["rows_read"] / max(1, stats["outer_iterations"])
    return LinearModel.from_weights(
        w, bias=bias, classes=None, solver=solver, loss=loss, C=C, epsilon=epsilon, eps=eps,
        task="regression", store=str(st.path), store_fingerprint=st.fingerprint(),
        label_map=st.label_map, zero_based=st.libsvm_base,
        feature_names=st.metadata.get("feature_names"),
        label_name=st.metadata.get("label_name"), stats=stats)


def _train_one_vs_rest(st, on_outer=None, n_jobs=1, client=None, **params) -> LinearModel:
    """One binary model per class of a multiclass store (the class against the rest), each
    on the same store file read as that binary task (``open_store(..., positive=c)``) under
    the one budget, one after the other or (``n_jobs``) several at once in threads;
    combined into one one-vs-rest model."""
    classes = st.label_map.get("classes")
    if not classes or len(classes) < 2:
        raise ParameterError(f"The multiclass store {st.path} lists no classes.",
                             "Re-ingest it with --task multiclass.")
    if not (isinstance(n_jobs, int) and not isinstance(n_jobs, bool) and n_jobs >= 1):
        raise ParameterError(f"The 'n_jobs' parameter of train must be an int >= 1. Got "
                             f"{n_jobs!r} instead.", "1 trains the classes one at a time.")
    t0 = time.perf_counter()
    # two classes: one model, the second class against the first, is the binary classifier
    todo = classes if len(classes) > 2 else classes[1:]

    def one(c):
        report = None if on_outer is None else (
            lambda info: on_outer(dict(info, **{"class": c})))
        with open_store(st.path, memory=st.budget, positive=c) as view:
            m = train(view, on_outer=report, **params)
        return m, dict(m.meta["stats"], **{"class": c})

    jobs = concurrent_jobs(st.budget, n_jobs, len(todo), solver_state_bytes(
        st, params.get("solver") or "ibcd", params.get("block_solver") or "dual",
        params.get("init_sample") or 10000))
    if client is not None:  # each class a task on the Dask cluster
        from ooc_learn.distributed import n_workers

        jobs = n_workers(client)
        done = train_classes(client, st, todo, params)
    elif jobs == 1:
        done = [one(c) for c in todo]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(one, todo))
    models = [m for m, _ in done]
    per_class = [x for _, x in done]
    if len(classes) == 2:
        return LinearModel(models[0].coef_, models[0].intercept_, classes=classes,
                           meta=dict(models[0].meta, label_map=st.label_map,
                                     store=str(st.path), store_fingerprint=st.fingerprint()))
    stats = {"seconds": time.perf_counter() - t0,
             "rows_read": sum(x.get("rows_read") or 0 for x in per_class),
             "bytes_read": sum(x.get("bytes_read") or 0 for x in per_class),
             "objective": None,
             # None where the solver counts none (PEGASOS), as for one class
             "n_sv": (None if any(x.get("n_sv") is None for x in per_class)
                      else sum(x["n_sv"] for x in per_class)),
             "outer_iterations": max(x.get("outer_iterations") or 0 for x in per_class),
             "converged": all(x.get("converged", True) for x in per_class),
             "stop_reason": _one_reason([x.get("stop_reason") for x in per_class]),
             "jobs": jobs, "per_class": per_class}
    meta = {k: v for k, v in models[0].meta.items() if k not in ("stats", "label_map")}
    meta.update(multiclass="one-vs-rest", label_map=st.label_map, stats=stats,
                store=str(st.path), store_fingerprint=st.fingerprint())
    return LinearModel.one_vs_rest(models, np.asarray(classes), **meta)


def _train_class_task(path, c, params):
    """On a Dask worker: the model of class c against the rest."""
    from ooc_learn.distributed import keep_open, task_budget

    keep_open(path)
    with open_store(path, memory=task_budget(), positive=c) as view:
        m = train(view, **params)
    return m, dict(m.meta["stats"], **{"class": c})


def train_classes(client, st, classes, params: dict) -> list:
    """``[(model, stats)]`` of each class against the rest, each a task on the Dask cluster
    of ``client`` (:mod:`ooc_learn.distributed`), in class order."""
    from ooc_learn.distributed import gather, shipped_path

    path = shipped_path(client, st.path)
    plain = {k: v for k, v in params.items() if k not in ("on_outer", "n_jobs", "memory")}
    return list(gather(client, _train_class_task, [(path, c, plain) for c in classes]))


def _one_reason(reasons: list) -> str | None:
    """The classes' stop reasons as one: the reason they share, or each class's."""
    known = [r for r in reasons if r]
    if not known:
        return None
    if len(set(known)) == 1:
        return known[0]
    return "; ".join(f"class {k}: {r}" for k, r in enumerate(reasons) if r)


# float64 vectors of d + 1 entries alive at once, per solver: IBCD holds w, the outer iterate,
# the previous one, the step's delta, w_0's sample solution and the index's query copies
# (float64 and float32); TRON (IBCD's primal block solver) adds its iterate, gradient, step,
# residual and Hessian-vector product; dcd/bm hold w and a copy; PEGASOS its scaled w, its
# average and a copy; every solver's result and the saved model add two more.
_MODEL_VECTORS = {"ibcd": 9, "ibcd-primal": 15, "dcd": 4, "bm": 4, "pegasos": 5}


def solver_state_bytes(st, solver: str, block_solver: str = "dual",
                       init_sample: int = 10000) -> int:
    """What one training of ``solver`` on ``st`` holds beside the shared caches: IBCD its
    in-S mask, w_0's sample (twice) and its model state; the dual CD solvers 20 B a row and
    theirs (PEGASOS less)."""
    if solver == "ibcd":
        from ooc_learn.solvers.ibcd import sample_row_bytes

        sample = min(int(init_sample), st.n_samples)
        return (st.n_samples + 2 * sample * sample_row_bytes(st)
                + model_state_bytes("ibcd", block_solver, st.n_features))
    return 20 * st.n_samples + model_state_bytes(solver, "dual", st.n_features)


def concurrent_jobs(budget, n_jobs: int, n_tasks: int, each: int) -> int:
    """How many of ``n_tasks`` to run at once in threads: up to ``n_jobs``, as many as the
    free budget holds two of each one's ``each`` bytes for (at least one)."""
    return int(max(1, min(n_jobs, n_tasks, budget.available // max(1, 2 * int(each)))))


def model_state_bytes(solver: str, block_solver: str, d: int) -> int:
    """Bytes of the float64 vectors of d + 1 entries ``solver`` holds at once."""
    key = "ibcd-primal" if solver == "ibcd" and block_solver == "primal" else solver
    return _MODEL_VECTORS[key] * 8 * (int(d) + 1)


def run_solver(st, *, solver, loss, C, s, bias, eps, max_outer, block_size, block_solver, epochs,
         init_sample, sample_eps, seed, spill_dir, on_outer, holdout=None, warm=None) -> dict:
    """Run one solver; the stats dict holds ``w`` and ``warm``, the state a later solve on
    other rows (the next cross-validation fold) starts from: ``(alpha, w)`` of the dual CD
    solvers over all rows, ``(rows, alpha)`` of IBCD's support vectors. ``holdout`` (a row
    range) is left out of the problem; PEGASOS takes neither. ``eps`` None: the solver's
    :func:`default_eps`."""
    eps = default_eps(solver) if eps is None else eps
    # every solver reports one dict per outer iteration/epoch: {"outer": i, ...}
    report = on_outer
    step = None if on_outer is None else (lambda i, info: report(dict(info, outer=i)))
    if solver == "ibcd":
        from ooc_learn.solvers.ibcd import solve_ibcd

        res = solve_ibcd(st, loss=loss, C=C, s=s, bias=bias, n=block_size, eps=eps,
                         max_outer=max_outer, init_sample=init_sample, sample_eps=sample_eps,
                         block_solver=block_solver, seed=seed, spill_dir=spill_dir,
                         on_outer=on_outer, holdout=holdout, warm=warm)
        stats = dict(res.stats)
        stats.pop("outer_log", None)
        stats["w"] = res.w
        stats["warm"] = (res.sv_rows, res.sv_alpha)
        return stats
    if solver == "dcd":
        from ooc_learn.solvers.dcd_streamed import solve_dcd_store

        res = solve_dcd_store(st, loss=loss, C=C, bias=bias, eps=eps, max_iter=100 * max_outer,
                              seed=seed, on_epoch=step, holdout=holdout, warm=warm)
        return _dcd_stats(res, loss, C, st if holdout is None else None, bias)
    if solver == "bm":
        from ooc_learn.solvers.dcd_streamed import solve_bm_streamed

        res = solve_bm_streamed(st.read_block, st.block_offsets, st.n_features, loss=loss, C=C,
                                bias=bias, eps=eps, max_outer=max_outer, seed=seed,
                                sqnorms=st.sqnorms, budget=st.budget, on_outer=step,
                                holdout=holdout, warm=warm)
        return _dcd_stats(res, loss, C, st if holdout is None else None, bias)
    if holdout is not None or warm is not None:
        raise ParameterError("PEGASOS is cross-validated by TreeCV, not by warm-started "
                             "folds.", "Use ooc_learn.cv.tree_cv with a Pegasos learner.")
    from ooc_learn.solvers.dcd_streamed import store_primal_objective
    from ooc_learn.solvers.pegasos import solve_pegasos_streamed

    res = solve_pegasos_streamed(st.read_block, st.block_offsets, st.n_features, loss=loss,
                                 C=C, bias=bias, epochs=epochs, seed=seed)
    w = np.asarray(res.w, dtype=np.float64)
    # the primal as every solver reports it (one more pass, as dual CD's): comparable
    return {"w": w, "outer_iterations": epochs,
            "objective": store_primal_objective(st, w, loss, C, bias), "n_sv": None,
            "stop_reason": f"{epochs} epochs (PEGASOS)"}


def _dcd_stats(res, loss, C, store=None, bias=1.0) -> dict:
    """The stats of a dual CD solve; with ``store`` (a model of all its rows) ``objective``
    is the primal, as IBCD's, from one more pass over the store (the dual value alone, a
    lower bound, read as the objective made block minimisation stopped at its pass limit look
    better than IBCD: 11420.96 against 11434.73 on a9a, its primal 11451.76); CV folds keep
    the dual value (their primal would be over the other folds' rows)."""
    from ooc_learn.solvers.dcd_streamed import store_primal_objective

    st = res.stats
    # the dual value (-f(alpha)): a lower bound of the primal, equal to it at the optimum
    dual = -float(getattr(st, "objective", float("nan")))
    converged = bool(getattr(st, "converged", True))
    primal = (dual if store is None
              else store_primal_objective(store, res.w, loss, C, bias))
    return {"w": res.w, "warm": (res.alpha, res.w),
            "outer_iterations": int(getattr(st, "epochs", 0)),
            "objective": primal, "dual_objective": dual,
            "n_sv": int(np.count_nonzero(res.alpha)), "converged": converged,
            "stop_reason": ("the projected-gradient spread fell to eps" if converged
                            else "the epoch limit (max_iter)")}
