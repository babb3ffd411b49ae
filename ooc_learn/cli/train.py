"""``ooc-train``: train, test, cross-validate and select C on a store."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time

from ooc_learn.storage.errors import ParameterError
from ooc_learn.storage.stop import check_stop

from .common import add_common, any_text, command_budget, run_command
from .evaluate import check_model_output, eval_spec, open_eval_data


def _at_least_one(text: str) -> int:
    """``--jobs``: an int >= 1 (argparse's error, exit 2, names the flag)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 (1: one at a time), got "
                                         f"{text!r}")
    return value


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-train",
        description="Train a linear SVM on a store (IBCD by default), or cross-validate with "
                    "--cv.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  ooc-train a9a.store -o a9a.npz --test a9a.t\n"
               "  ooc-train a9a.store -o a9a.npz --truncate 1 --sample-eps 0.05 --memory 256M\n"
               "  ooc-train a9a.store --cv 5 --C 0.01,0.1,1,10 --plot cv.png\n"
               "  ooc-train fashion.store -o f.npz --loss squared_hinge --jobs 2\n"
               "  ooc-train a9a.store --cv 10 --cv-method tree --learner pegasos")
    p.add_argument("store", metavar="STORE")
    p.add_argument("-o", "--output", metavar="MODEL", default=None,
                   help="model file to write (.npz or .h5); required unless --cv")
    p.add_argument("--solver", default=None,
                   choices=["ibcd", "dcd", "bm", "pegasos", "exact", "cocoa"],
                   help="classification: ibcd (default), dcd, bm, pegasos, cocoa (CoCoA+ over "
                        "the blocks on a Dask cluster: with --workers / --scheduler; --eps is "
                        "then the relative duality gap); regression: exact "
                        "(least squares by the normal equations; the default where they fit "
                        "--memory) or dcd (dual CD SVR)")
    p.add_argument("--loss", default=None,
                   type=lambda v: "sqhinge" if v == "squared_hinge" else v,
                   choices=["hinge", "sqhinge", "squared_epsilon_insensitive",
                            "epsilon_insensitive"],
                   help="classification: hinge (default), sqhinge (or squared_hinge, "
                        "scikit-learn's name); regression: "
                        "squared_epsilon_insensitive (default; least squares at --epsilon 0) "
                        "or epsilon_insensitive (LIBLINEAR -s 12 / -s 13)")
    p.add_argument("--epsilon", type=float, default=0.0, metavar="P",
                   help="regression: the insensitive zone of the loss (LIBLINEAR -p; "
                        "default 0)")
    p.add_argument("--C", "-C", dest="C", type=_costs, default=None, metavar="C[,C...]",
                   help="SVM cost (default 1); with --cv a list, e.g. 0.01,0.1,1,10: one "
                        "cross-validation per C, and -o trains at the best")
    p.add_argument("--C-search", action="store_true",
                   help="with --cv: search C as LIBLINEAR -C does (from a small C, doubling, "
                        "each fold warm-started from the last C, until the CV score stops "
                        "improving or C passes 1024); -o trains at the best")
    tg = p.add_mutually_exclusive_group()
    tg.add_argument("--truncate", type=float, default=None, metavar="S",
                    help="truncate the loss at 1 + S, min(L(z), 1 + S) (ramp loss for the "
                         "hinge; IBCD only)")
    tg.add_argument("--no-truncate", action="store_true", help="convex loss (the default)")
    p.add_argument("--bias", type=float, default=1.0,
                   help="value of the augmented intercept feature (LIBLINEAR -B; 0: none)")
    p.add_argument("--eps", type=float, default=None,
                   help="stopping tolerance (default 0.1; --solver cocoa: 1e-3, the duality "
                        "gap relative to the primal objective)")
    p.add_argument("--max-outer", type=int, default=10,
                   help="IBCD relaxation steps / bm passes (dcd: x100 epochs)")
    p.add_argument("--block-size", type=int, default=1000, metavar="N",
                   help="IBCD: fresh rows asked of the index per step")
    p.add_argument("--block-solver", default="dual", choices=["dual", "primal"],
                   help="IBCD block sub-problem: dual CD or TRON on the primal (sqhinge)")
    p.add_argument("--sample-eps", type=float, default=0.0, metavar="EPS",
                   help="IBCD: stop when fresh rows / rows examined < EPS, and with "
                        "--truncate the outer loop when rows changing side / support vectors "
                        "< EPS (reads less; approximate; default 0: exact stop)")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="IBCD: where the active set spills when it outgrows its share of "
                        "--memory (default: the folder holding the store)")
    p.add_argument("--epochs", type=int, default=1, help="PEGASOS passes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--test", metavar="STORE_OR_FILE", default=None,
                   help="report accuracy on this store or source file")
    p.add_argument("--cv", type=str, default=None, metavar="K",
                   help="cross-validate the model this command trains with K folds of whole "
                        "blocks, each warm-started from the last (-o / --test: then train "
                        "on all rows); with --cv-method tree or --learner, TreeCV of an "
                        "incremental learner ('loo' for leave-one-out)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the CV folds, TreeCV's subtrees and the one-vs-rest classes as "
                        "tasks on a local Dask cluster of N worker processes (needs the [dask] "
                        "extra)")
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="... on the Dask cluster whose scheduler is at ADDRESS (tcp://host:8786); "
                        "the store's path must be visible to its workers")
    p.add_argument("--shards", type=int, default=None, metavar="K",
                   help="--solver cocoa: cut the store's blocks into K shards (a sharded "
                        "store from ooc-ingest --shards has its own; default: one "
                        "per worker thread; more shards than workers is fine)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw the run (needs the [plot] extra, matplotlib): with --cv, CV "
                        "accuracy against C with each fold's score; else the objective, rows "
                        "read and (with --test, ibcd / bm) test error against seconds")
    p.add_argument("--jobs", type=_at_least_one, default=1, metavar="N",
                   help="on a multiclass store (every solver) train or cross-validate up to "
                        "N classes at once in threads, as many as --memory holds; with --cv "
                        "on a binary or regression store (dual CD solvers dcd, bm; SVR) run "
                        "N folds at once; with --cv-method tree, N processes run TreeCV's "
                        "subtrees (default 1)")
    p.add_argument("--cv-method", default=None, choices=["warm", "tree", "standard"],
                   help="warm: folds of the SVM solver, warm-started (default; --solver "
                        "pegasos: tree); tree / standard: TreeCV / k-fold of --learner")
    p.add_argument("--learner", default=None, choices=["pegasos", "lsqsgd", "exact-ls"],
                   help="incremental learner for --cv-method tree / standard (default "
                        "pegasos)")
    p.add_argument("--lam", type=float, default=None,
                   help="--learner regularization (default 1/(C n))")
    add_common(p)
    return p




def _costs(text: str) -> list[float]:
    """``--C``: one cost or a comma-separated list, each a finite number > 0."""
    out = []
    for part in text.split(","):
        try:
            c = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a number (use e.g. 1 "
                                             "or 0.01,0.1,1,10)") from None
        if not (c > 0 and c != float("inf")):
            raise argparse.ArgumentTypeError(f"{part.strip()} is not > 0 (C is the SVM cost)")
        out.append(c)
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"{text} lists a cost twice")
    return out


def _train_body(args):
    import contextlib

    incremental = args.learner is not None or args.cv_method in ("tree", "standard")
    from ooc_learn.storage.replace import folder_write_error

    if args.spill_dir is not None and folder_write_error(args.spill_dir) is not None:
        # checked where a spill happens only: a run under a tight cap failed there, late
        raise ParameterError(f"--spill-dir {args.spill_dir} is not a folder this user can "
                             "write.", "Create it, or leave --spill-dir out (the system's "
                             "temporary folder).")
    if incremental and args.truncate is not None and not args.no_truncate:
        # TreeCV's learners train the convex loss: the flag was dropped without a word
        raise ParameterError("--truncate is the SVM solvers' truncated loss (ibcd); TreeCV's "
                             "learners (--cv-method tree / standard, --learner) train the "
                             "convex loss.", "Drop --truncate, or cross-validate with "
                             "--cv-method warm (the default).")
    if args.C_search and args.C is not None:
        raise ParameterError("--C-search picks C itself; it does not take --C.",
                             "Drop --C, or give --C a list to cross-validate those values.")
    if args.C_search and (args.cv is None or incremental or args.solver == "pegasos"):
        raise ParameterError("--C-search needs --cv K and an SVM solver (ibcd, dcd, bm) or a "
                             "regression store.", "Add --cv 5.")
    args.C = [1.0] if args.C is None else args.C
    if args.eps is None:
        from ooc_learn.training import default_eps

        args.eps = default_eps(args.solver)
    if args.plot is not None:
        if incremental or args.solver == "pegasos":
            raise ParameterError("--plot draws an SVM's cross-validation against C or a "
                                 "training run (ibcd, dcd, bm, regression).",
                                 "Drop --plot for TreeCV and PEGASOS.")
        from ooc_learn.plots import check_plot_target

        # a bad name, a file not ours, the model's -o, or no matplotlib: before the work
        check_plot_target(args.plot, other_output=args.output)
    if args.cv is None:
        for flag, given in (("--cv-method", args.cv_method is not None),
                            ("--learner", args.learner is not None),
                            ("--lam", args.lam is not None)):
            if given:
                raise ParameterError(f"{flag} applies to cross-validation only.",
                                     f"Add --cv K, or drop {flag}.")
        if len(args.C) > 1:
            raise ParameterError(f"--C {','.join(f'{c:g}' for c in args.C)} lists "
                                 f"{len(args.C)} costs; one model is trained at one C.",
                                 "Add --cv K to cross-validate each C and train at the best.")
    elif incremental or args.solver == "pegasos":
        return _cv_incremental_body(args)
    if args.cv is None and args.output is None:
        raise ParameterError("ooc-train needs -o MODEL (or --cv K to cross-validate).",
                             "Add -o model.npz.")
    if args.output is not None:
        check_model_output(args.output)  # before the work: a model of ours only is replaced
    budget = command_budget(args, solvers=True, parsers=any_text([args.test]))
    stack = contextlib.ExitStack()
    with stack:
        args.client_ = _dask_client(args, stack)
        test = None
        if args.test is not None:  # opened (a text file ingested) and checked before the work
            from ooc_learn.storage.sharded import ShardedStore, is_sharded_store
            from ooc_learn.storage.store import open_store

            where = args.store
            if is_sharded_store(where):  # its shards share features and labels: the first's
                where = ShardedStore(where).shard_path(0)
            with open_store(where, memory=budget) as st:
                spec = eval_spec(store=st)
            test = open_eval_data(args.test, spec, budget, stack)
        return _train_and_test(args, budget, test)


def _quiet_dask(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not record.name.startswith("distributed")


def _dask_client(args, stack):
    """The Dask client of --workers / --scheduler (closed with ``stack``), or None."""
    if args.workers is None and args.scheduler is None:
        return None
    if args.workers is not None and args.workers < 1:
        raise ParameterError(f"--workers must be >= 1. Got {args.workers}.",
                             "Pass the number of worker processes, e.g. --workers 2.")
    from ooc_learn.distributed import make_client

    if not getattr(args, "verbose", False):  # Dask's own INFO lines (nanny, scheduler)
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_dask)
    client, cluster = make_client(args.scheduler, args.workers, prog="ooc-train",
                                  quiet_logs=not getattr(args, "verbose", False))
    # the client first, then its cluster (the stack runs last in, first out): workers
    # removed under a live client's results make the scheduler warn of tasks "lost"
    if cluster is not None:
        stack.callback(cluster.close)
    stack.callback(client.close)
    return client


def _train_and_test(args, budget, test):
    from ooc_learn.storage.resources import peak_rss_bytes
    from ooc_learn.training import train

    cv = None
    if args.cv is not None:
        cv = _cv_svm(args, budget)
        args.C = [cv["best_C"]]
        if args.plot is not None:
            from ooc_learn.plots import plot_cv

            j = cv["json"]
            plot_cv(j["grid"], j["metric"], j["best_C"], args.plot,
                    f"{j['solver']} {j['k']}-fold CV of {os.path.basename(str(args.store))}")
        if args.output is None and args.test is None:
            return {"json": cv["json"], "text": cv["text"]}
    args.C = args.C[0]
    from tqdm.auto import tqdm

    bar = tqdm(desc="train", unit="outer", disable=args.quiet, leave=False)
    log, t0 = [], time.perf_counter()
    trace = args.plot is not None and cv is None

    def on_outer(entry):
        check_stop()  # a safe point for SIGINT / SIGTERM, one an outer iteration or epoch
        bar.update(1)
        w = entry.pop("w", None)
        if trace:
            point = {k: entry[k] for k in ("objective", "objective_S", "rows_read", "class")
                     if k in entry}
            point["seconds"] = time.perf_counter() - t0
            if w is not None and test is not None and "class" not in entry and \
                    test.task == "binary":
                from ooc_learn.model import LinearModel

                point["test_error"] = 1.0 - LinearModel.from_weights(
                    w, bias=args.bias).score(test)
            log.append(point)
        if isinstance(entry, dict):
            bar.set_postfix({k: entry[k] for k in ("objective_S", "active_set", "rows_read")
                             if k in entry})
            if not args.quiet:
                parts = [f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in entry.items() if k != "outer"]
                tqdm.write(f"ooc-train: outer {entry.get('outer')}: " + ", ".join(parts),
                           file=sys.stderr)

    s = None if args.no_truncate else args.truncate
    model = train(args.store, solver=args.solver, loss=args.loss, C=args.C, s=s,
                  bias=args.bias, eps=args.eps, max_outer=args.max_outer,
                  block_size=args.block_size, block_solver=args.block_solver,
                  epochs=args.epochs, sample_eps=args.sample_eps, seed=args.seed,
                  memory=budget, spill_dir=args.spill_dir, on_outer=on_outer,
                  epsilon=args.epsilon, n_jobs=args.jobs,
                  client=getattr(args, "client_", None), shards=args.shards)
    bar.close()
    test_figures = {}
    if test is not None:  # kept in the model file: ooc-info shows it on record
        if model.regression:
            from ooc_learn.model import regression_errors

            err = regression_errors(model, test)
            test_figures = {"rmse": err["rmse"], "r2": err["r2"], "mae": err["mae"]}
        else:
            test_figures = {"accuracy": model.score(test)}
        test_figures.update(rows=test.n_samples, data=str(args.test))
        model.meta["test"] = test_figures
    model.save(args.output)
    if trace:
        from ooc_learn.plots import plot_training

        plot_training(log, args.plot, f"{model.meta.get('solver')}/{model.meta.get('loss')} "
                                      f"C={args.C:g} on {os.path.basename(str(args.store))}")
    st = model.meta["stats"]
    solver, loss = model.meta.get("solver"), model.meta.get("loss")
    out = {"model": str(args.output), "solver": solver, "loss": loss, "C": args.C,
           "truncate": s, "seconds": round(st["seconds"], 4), "objective": st.get("objective"),
           "n_sv": st.get("n_sv"), "outer_iterations": st.get("outer_iterations"),
           "converged": st.get("converged"), "stop_reason": st.get("stop_reason"),
           "rows_read": st.get("rows_read"), "bytes_read": st.get("bytes_read"),
           "peak_rss_bytes": None}
    if "rows_read_back" in st:  # IBCD: its active set's rows spilled to disk and read back
        out.update(spills=st["spills"], rows_spilled=st["rows_spilled"],
                   rows_read_back=st["rows_read_back"])
    if model.regression:
        out["epsilon"] = args.epsilon
    elif model.multiclass:
        out["classes"] = model.classes_.tolist()
    if test is not None:
        if model.regression:
            out.update(test_rmse=test_figures["rmse"], test_r2=test_figures["r2"],
                       test_mae=test_figures["mae"])
        else:
            out["test_accuracy"] = test_figures["accuracy"]
        out["test_rows"] = test.n_samples
    out["peak_rss_bytes"] = peak_rss_bytes()
    obj = out["objective"]
    parts = [f"{solver}/{loss} C={args.C:g}", f"{out['seconds']:.2f} s"]
    parts += [] if obj is None else [f"objective {round(obj, 6)}"]
    parts += [] if out["n_sv"] is None else [f"{out['n_sv']} support vectors"]
    parts += [] if out["rows_read"] is None else [f"{out['rows_read']} rows read"]
    if out.get("rows_read_back"):
        parts += [f"{out['rows_read_back']} rows of the spilled active set read back"]
    parts += [f"{st['rounds']} rounds over {st['shards']} shards"] if solver == "cocoa" else []
    text = f"{args.output}: " + ", ".join(parts)
    if model.multiclass:
        text += f", one-vs-rest over {len(model.classes_)} classes"
    if "test_accuracy" in out:
        text += f"\ntest accuracy {100 * out['test_accuracy']:.2f}% on {out['test_rows']} rows"
    if "test_rmse" in out:
        text += (f"\ntest RMSE {out['test_rmse']:.6g}, R^2 {out['test_r2']:.4f} on "
                 f"{out['test_rows']} rows")
    if cv is not None:
        out = dict(cv["json"], final_model=out)
        text = cv["text"] + "\n" + text
    return {"json": out, "text": text}


def _cv_svm(args, budget) -> dict:
    """``ooc-train STORE --cv K [--C c1,c2,...]``: K-fold CV of the solver's SVM, per C."""
    import numpy as np
    from tqdm.auto import tqdm

    from ooc_learn.cv.linear import linear_cv_grid
    from ooc_learn.storage.resources import peak_rss_bytes

    if args.lam is not None:
        raise ParameterError("--lam applies to --learner (TreeCV of an incremental learner); "
                             f"the {args.solver or 'ibcd'} SVM is regularized by --C.",
                             "Drop --lam, or add --learner pegasos.")
    k = _cv_folds(args.cv)
    from ooc_learn.storage.store import open_store

    with open_store(args.store, memory=budget) as st:  # one-vs-rest: a fold per class
        per_fold = len(st.label_map.get("classes") or []) if st.task == "multiclass" else 1
    bar = tqdm(desc="cv", unit="fold", disable=args.quiet, leave=False,
               total=(k if isinstance(k, int) else None) and k * len(args.C) * per_fold)

    def on_fold(entry):
        check_stop()
        bar.update(1)
        bar.set_postfix(C=f"{entry['C']:g}", fold=entry["fold"])

    s = None if args.no_truncate else args.truncate
    common = dict(solver=args.solver, loss=args.loss, s=s, bias=args.bias, eps=args.eps,
                  max_outer=args.max_outer, block_size=args.block_size,
                  block_solver=args.block_solver, sample_eps=args.sample_eps, seed=args.seed,
                  memory=budget, spill_dir=args.spill_dir, on_fold=on_fold,
                  epsilon=args.epsilon)
    if args.jobs != 1 and (args.C_search or (args.solver not in ("dcd", "bm")
                                             and per_fold == 1)):
        raise ParameterError("--jobs runs the folds of the dual CD solvers (--solver dcd or "
                             "bm, without --C-search), or the classes of a multiclass "
                             "store, in threads.", "Add --solver dcd, or drop --jobs.")
    if args.C_search:
        from ooc_learn.cv.c_search import linear_c_search

        bar.total = None
        results = linear_c_search(args.store, k, **common)
    else:
        results = linear_cv_grid(args.store, k, args.C, caller="ooc-train --cv",
                                 n_jobs=args.jobs, client=getattr(args, "client_", None),
                                 **common)
    bar.close()
    metric = results[0].metric
    rmse = metric == "rmse"
    # the first (smallest C) of equals
    best = (min if rmse else max)(results, key=lambda r: r.estimate)
    loo = bool(best.stats.get("loo"))  # a score per row: not listed
    grid = [{"C": r.stats["C"], "estimate": r.estimate, "seconds": r.stats["seconds"],
             "rows_read": r.stats["rows_read"]}
            | ({} if loo else {"fold_scores": [float(v) for v in r.fold_scores],
                               "folds": r.stats["folds"]}) for r in results]
    solver = best.stats["solver"]
    loss = args.loss or ("squared_epsilon_insensitive" if rmse else "hinge")
    out = {"store": str(args.store), "solver": solver, "loss": loss,
           "truncate": s, "k": best.k, "metric": metric, "best_C": best.stats["C"],
           "estimate": best.estimate, "grid": grid,
           "seconds": sum(r.stats["seconds"] for r in results),
           "peak_rss_bytes": peak_rss_bytes()}
    if "classes" in best.stats:
        out["classes"] = best.stats["classes"]
    how = ("one-vs-rest over " + str(len(best.stats["classes"])) + " classes"
           if "classes" in best.stats else "two passes, in closed form" if loo
           else "one pass, a Gram matrix per fold" if solver == "exact"
           else "C search, each fold warm-started from the last C"
           if args.C_search else f"{best.stats['jobs']} runs of folds as Dask tasks"
           if best.stats.get("jobs", 1) > 1 and getattr(args, "client_", None) is not None
           else f"{best.stats['jobs']} folds at a time in threads"
           if best.stats.get("jobs", 1) > 1 else "folds warm-started"
           if best.stats["warm_start"] else "folds from scratch")
    fmt = (lambda v: f"{v:>12.6g}") if rmse else (lambda v: f"{100 * v:>11.2f}%")
    kind = "leave-one-out" if loo else f"{best.k}-fold cross-validation"
    lines = [f"{solver} {kind} of {args.store} ({how})",
             f"{'C':>10} {'cv ' + metric:>12} {'fold std':>9} {'seconds':>9} {'rows read':>11}"]
    for r in results:
        mark = "  <- best" if r is best and len(results) > 1 else ""
        spread = np.std(r.fold_scores) * (1 if rmse else 100)
        lines.append(f"{r.stats['C']:>10g} {fmt(r.estimate)} {spread:>9.3g} "
                     f"{r.stats['seconds']:>9.2f} {r.stats['rows_read']:>11}{mark}")
    if len(results) > 1:
        lines.append(f"best C {best.stats['C']:g}: {metric} {fmt(best.estimate).strip()}")
    return {"json": out, "text": "\n".join(lines), "best_C": best.stats["C"]}


def _cv_folds(text: str):
    k = text.strip().lower()
    if k == "loo":
        return k
    try:
        return int(k)
    except ValueError:
        raise ParameterError(f"--cv must be a number of folds or 'loo'. Got {text!r}.",
                             "Use e.g. --cv 10 or --cv loo.") from None


def _cv_incremental_body(args):
    """``ooc-train STORE --cv K --cv-method tree|standard``: TreeCV (or standard k-fold) of
    an incremental learner (PEGASOS by default, as ``--solver pegasos``)."""
    from ooc_learn.cv import kfold_cv, tree_cv
    from ooc_learn.learners import ExactLeastSquares, LeastSquaresSGD, Pegasos
    from ooc_learn.storage.resources import peak_rss_bytes
    from ooc_learn.storage.store import open_store

    if args.solver not in (None, "pegasos"):
        raise ParameterError(
            f"--cv-method {args.cv_method or 'tree'} / --learner cross-validate an incremental "
            f"learner, not --solver {args.solver}.",
            f"Drop --cv-method and --learner to cross-validate the {args.solver} SVM itself.")
    if args.cv_method == "warm":
        raise ParameterError("--cv-method warm cross-validates the SVM solvers (ibcd, dcd, "
                             "bm); PEGASOS and --learner run TreeCV.",
                             "Use --cv-method tree or standard.")
    for flag, given in (("-o", args.output is not None), ("--test", args.test is not None)):
        if given:
            raise ParameterError(f"{flag} does not apply to TreeCV / k-fold CV of an "
                                 "incremental learner: it estimates, it trains no model.",
                                 f"Drop {flag}, or train with ooc-train -o without --cv.")
    if len(args.C) > 1:
        raise ParameterError("A list of C is cross-validated for the SVM solvers (ibcd, dcd, "
                             "bm), not for TreeCV.", "Give one --C, or --lam.")
    if args.lam is not None and not args.lam > 0:
        raise ParameterError(f"--lam must be > 0. Got {args.lam!r}.", "Try 1e-6.")
    k = _cv_folds(args.cv)
    learner_name = args.learner or "pegasos"
    method = args.cv_method or "tree"
    budget = command_budget(args, solvers=True)
    dask_asked = args.workers is not None or args.scheduler is not None
    if method != "tree" and (dask_asked or args.jobs != 1):
        raise ParameterError("--jobs, --workers and --scheduler run TreeCV's subtrees in "
                             "parallel; --cv-method standard runs here.",
                             "Use --cv-method tree, or drop the flag.")
    with contextlib.ExitStack() as stack, open_store(args.store, memory=budget) as store:
        client = _dask_client(args, stack)
        # PEGASOS minimizes lam/2 |w|^2 + mean hinge: lam = 1 / (C n) is the SVM at C
        lam = 1.0 / (args.C[0] * store.n_samples) if args.lam is None else args.lam
        if learner_name == "pegasos":
            learner = Pegasos(lam=lam)
        elif learner_name == "lsqsgd":
            learner = LeastSquaresSGD()
        else:
            learner = ExactLeastSquares(ridge=1e-6 if args.lam is None else args.lam)
        if method == "tree":
            res = tree_cv(store, learner, k, seed=args.seed, memory=budget,
                          progress=not args.quiet, n_jobs=max(1, args.jobs), client=client)
        else:
            res = kfold_cv(store, learner, k, seed=args.seed, memory=budget)
    out = res.to_dict()
    out.update(store=str(args.store), learner=learner_name, cv_method=method,
               peak_rss_bytes=peak_rss_bytes())
    return {"json": out, "text": res.summary()}


def train_command():
    """ooc-train's parser and body (a first run's warm-up runs them: ``cli.warmup``)."""
    return _train_parser(), _train_body


def train_main(argv=None) -> int:
    return run_command("ooc-train", _train_parser(), _train_body, argv)
