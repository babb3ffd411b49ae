"""Command-line entry points: ``ooc-ingest``, ``ooc-info`` (and, as they land, the others).

Every command: ``--help``, ``--memory`` (or ``OOC_MEMORY``), ``--json`` for one JSON object on
stdout, tqdm progress on stderr unless ``--quiet``. The flow is parse -> validate -> call the
library -> print; failures print ``<prog>: <message>`` and the hint on stderr and exit with 2
for bad input or usage, 1 for runtime failures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Callable

from ooc_learn._json import jsonable
from ooc_learn.storage.budget import MemoryBudget, parse_size
from ooc_learn.storage.errors import OOCError, ParameterError
from ooc_learn.storage.resources import check_stop, request_stop

__all__ = ["ingest_main", "info_main", "run_command"]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", metavar="SIZE", default=None,
                   help="memory cap for the whole run, e.g. 512M or 4G "
                        "(default: $OOC_MEMORY, else 25%% of RAM)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with the results on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    from ooc_learn import __version__

    p.add_argument("--version", action="version", version=f"%(prog)s (ooc-learn) {__version__}")


def _budget(args, *, solvers: bool = False, parsers: bool = False) -> MemoryBudget:
    """The run's budget: ``--memory`` is the whole process, its fixed part charged first.

    ``for_process`` imports the libraries every command loads and sets numba's compiler up
    before it measures the fixed part, so the measurement holds them and the allowance covers
    only what loads later: the command's own compiled kernels, the solvers' (``solvers``) and
    the text parsers' (``parsers``) where it uses them.
    """
    from ooc_learn.storage.budget import late_load_bytes

    budget = MemoryBudget.for_process(None if args.memory is None else parse_size(args.memory),
                                      late_load=late_load_bytes(solvers=solvers,
                                                                parsers=parsers),
                                      start_peak=True)
    args.budget_ = budget  # run_command reports its figures in --json
    return budget


def _any_text(paths) -> bool:
    """Whether any of ``paths`` is a text source (its parsers' kernels will load)."""
    from ooc_learn.storage.store import is_store

    return any(p is not None and not is_store(p) and not str(p).endswith((".npy", ".npz"))
               for p in paths)


def _ahead_kernels(prog: str, args) -> list[str]:
    """The large kernel of ``prog``'s run that a helper process can compile in parallel on a
    first run (see ``_jit.compile_ahead``): the tree builder of an indexed ingest, the index
    search of IBCD."""
    if prog == "ooc-ingest" and not getattr(args, "no_index", False):
        return ["build_tree_kernel"]
    if prog == "ooc-train" and getattr(args, "solver", None) in (None, "ibcd") \
            and getattr(args, "workers", None) is None \
            and getattr(args, "scheduler", None) is None:
        return ["bbf_run"]
    return []


def run_command(prog: str, parser: argparse.ArgumentParser, body: Callable, argv=None) -> int:
    """Parse ``argv``, run ``body(args)`` and turn failures into messages and exit codes."""
    if "--json" in (sys.argv[1:] if argv is None else argv):
        _json_usage_errors(parser)
    args = parser.parse_args(argv)
    from ooc_learn.storage.resources import limit_allocator_retention

    limit_allocator_retention()
    from ooc_learn._jit import announce_first_run, compile_ahead

    if not getattr(args, "quiet", False):
        announce_first_run(prog)
    compile_ahead(_ahead_kernels(prog, args),
                  memory_given=getattr(args, "memory", None) is not None
                  or bool(os.environ.get("OOC_MEMORY")))
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format=f"{prog}: %(message)s", stream=sys.stderr)
    stop = _StopSignals()
    try:
        result = body(args)
    except BaseException as exc:
        if stop.signum is not None:
            # SIGINT or SIGTERM: whatever the exception became on its way out (h5py or numba
            # can wrap it), one line and 128 + the signal; the work's own cleanup (a
            # temporary store, a spill folder) ran while it unwound
            what = "interrupted" if stop.signum == signal.SIGINT else "terminated"
            print(f"{prog}: {what}; no partial output is left", file=sys.stderr)
            if getattr(args, "json", False):
                print(json.dumps({"error": what, "hint": "", "exit_code": 128 + stop.signum}))
            return 128 + stop.signum
        if isinstance(exc, OOCError):
            message, hint, code = exc.message, exc.hint, exc.exit_code
        elif isinstance(exc, OSError):  # the disk, not the data: the file and the fix
            message, hint, code = _os_error(exc)
        else:
            raise
        print(f"{prog}: {message}", file=sys.stderr)
        if hint:
            print(f"{prog}: hint: {hint}", file=sys.stderr)
        if getattr(args, "json", False):  # --json: the failure is JSON on stdout too
            print(json.dumps({"error": message, "hint": hint, "exit_code": code}))
        return code
    finally:
        stop.restore()
    if result is None:
        return 0
    budget = getattr(args, "budget_", None)
    if budget is not None and isinstance(result.get("json"), dict):
        from ooc_learn.storage.resources import peak_rss_bytes

        out = result["json"]
        out["memory_cap_bytes"] = budget.cap
        out["memory_fixed_bytes"] = budget.fixed  # charged first: interpreter, libraries
        out["memory_reserved_peak_bytes"] = budget.peak  # the most the buffers held at once
        out["memory_start_peak_bytes"] = budget.start_peak  # the least cap: the start's RSS
        if out.get("peak_rss_bytes") is None:
            out["peak_rss_bytes"] = peak_rss_bytes()
    try:
        if getattr(args, "json", False):
            print(json.dumps(jsonable(result["json"])))
        elif result.get("text_to_stderr"):  # stdout holds the command's data (-o -)
            if result["text"] is not None:
                print(result["text"], file=sys.stderr)
        else:
            print(result["text"])
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``| head``): the work is done and saved; no traceback
        _stdout_gone()
    return 0


def _json_usage_errors(parser: argparse.ArgumentParser) -> None:
    """Under ``--json`` a usage error (an unknown flag, a bad choice) is JSON on stdout too,
    as every other failure is; argparse still prints the usage and exits 2."""
    usage_error = parser.error

    def error(message):
        print(json.dumps({"error": message, "hint": f"See {parser.prog} --help.",
                          "exit_code": 2}))
        sys.stdout.flush()
        usage_error(message)

    parser.error = error


def _stdout_gone() -> None:
    """Point stdout at /dev/null after its reader went away, so the interpreter's own flush
    at exit stays quiet (no BrokenPipeError traceback)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _StopSignals:
    """SIGINT and SIGTERM stop the work at its next safe point by a KeyboardInterrupt
    (SIGTERM's default would kill the process before any cleanup) and are remembered, so that
    ``run_command`` answers one line and 130 / 143 whatever exception the stop became."""

    def __init__(self):
        self.signum = None
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._raise)
            except ValueError:  # not the main thread: leave the handlers alone
                pass

    def _raise(self, signum, frame):
        # the first signal is a request, taken at the work's next safe point (a reservation,
        # a store read, a parsed chunk: resources.check_stop); raising here could land inside
        # a helper a numba kernel calls back into, and crash the process; a second one
        # raises at once
        if self.signum is None:
            self.signum = signum
            request_stop(signum)
            return
        raise KeyboardInterrupt

    def restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _os_error(exc: OSError) -> tuple[str, str, int]:
    """A message, a hint and an exit code for a failure of the file system."""
    import errno

    where = exc.filename or "a file"
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC or exc.errno == getattr(errno, "EDQUOT", None):
        return (f"{where}: {what} (nothing already stored was replaced).",
                "Free disk space, or write to another disk (-o, --spill-dir, TMPDIR).", 1)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{where}: {what}.", "Choose a folder you can write to (-o).", 2)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{where}: {what}.", "Check the path.", 2
    return f"{where}: {what}.", "Check the disk and the path, then run the command again.", 1


# ---- ooc-ingest ---------------------------------------------------------------------------
def _ingest_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-ingest",
        description="Ingest LIBSVM/CSV/npy/npz/idx sources into a block store (HDF5 blocks "
                    "plus a metric-forest index), streaming under the memory cap.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  ooc-ingest a9a.svm -o a9a.store\n"
               "  ooc-ingest train.csv -o train.store --label-column price --task regression\n"
               "  ooc-ingest train-images-idx3-ubyte.gz -o fashion.store --memory 512M\n"
               "  zcat big.svm.gz | ooc-ingest - -o big.store --json")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="input files (.gz/.bz2/.xz read transparently; - reads standard "
                        "input); several are concatenated")
    p.add_argument("-o", "--output", required=True, metavar="STORE", help="store directory to create")
    p.add_argument("--format", default="auto",
                   choices=["auto", "libsvm", "csv", "npy", "npz", "idx"],
                   help="source format (auto: detected; idx: MNIST images, labels found "
                        "beside them as X-labels-idx1-ubyte[.gz])")
    p.add_argument("--layout", default="auto", choices=["auto", "dense", "csr"],
                   help="storage layout (auto: dense when >= 40%% of entries are non-zero)")
    p.add_argument("--task", default="auto", choices=["auto", "binary", "regression", "multiclass"],
                   help="auto: two labels -> binary, up to 20 integer labels -> multiclass, "
                        "real-valued labels -> regression; more than 20 distinct integers "
                        "are refused until --task says which")
    p.add_argument("--positive-label", type=_label_column, default=None, metavar="LABEL",
                   help="make the task binary: LABEL (a number or a class name) -> +1, every "
                        "other label -> -1 (default for two-label sources: the larger label "
                        "or the later class name is +1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--blocks", type=int, default=None, metavar="R", help="number of random blocks")
    g.add_argument("--block-rows", type=int, default=None, metavar="N", help="rows per block")
    p.add_argument("--n-features", type=int, default=None, metavar="D",
                   help="feature count (to match a training store when a test file has fewer)")
    p.add_argument("--label-column", default=None, metavar="COL",
                   help="CSV/npy: label column, an index (negative from the end) or a header "
                        "name (default: the CSV header's column named label, y, target or "
                        "class, else the first column)")
    p.add_argument("--delimiter", default=None, help="CSV delimiter (default: detected)")
    hg = p.add_mutually_exclusive_group()
    hg.add_argument("--header", dest="header", action="store_true", default=None,
                    help="CSV: the first line is a header")
    hg.add_argument("--no-header", dest="header", action="store_false",
                    help="CSV: the first line is data")
    zg = p.add_mutually_exclusive_group()
    zg.add_argument("--zero-based", dest="zero_based", action="store_const", const=True,
                    default="auto", help="LIBSVM indices are 0-based (default: detected)")
    zg.add_argument("--one-based", dest="zero_based", action="store_const", const=False,
                    help="LIBSVM indices are 1-based")
    p.add_argument("--no-index", action="store_true", help="skip building the metric-forest index")
    p.add_argument("--shards", type=int, default=None, metavar="K",
                   help="write a sharded store: K complete stores (block c into shard c mod K, "
                        "each with its index) and a manifest, for ooc-train --solver cocoa "
                        "on a Dask cluster (each shard can live on the disk of the workers "
                        "that train it)")
    p.add_argument("--width", type=int, default=None, metavar="K",
                   help="index: children per node (default 10)")
    p.add_argument("--leaf-size", type=int, default=None, metavar="L",
                   help="index: rows per leaf (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the index")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    _add_common(p)
    return p


@contextlib.contextmanager
def _stdin_spooled(sources, output):
    """``(sources, names)``: ``-`` replaced by a copy of standard input, written beside the
    output (format detection and the CSV layout read the head of a source again, which a
    pipe cannot give back) and removed afterwards, and ``names`` mapping the copy to
    ``<stdin>`` for the store's metadata; errors name ``<stdin>`` too."""
    if "-" not in sources:
        yield list(sources), {}
        return
    import shutil
    import tempfile

    from ooc_learn.storage.errors import IngestError

    parent = os.path.dirname(os.path.abspath(output))
    fd, spool = tempfile.mkstemp(prefix=".ooc-stdin-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        try:
            yield [spool if s == "-" else s for s in sources], {spool: "<stdin>"}
        except IngestError as exc:
            exc.message = exc.message.replace(spool, "<stdin>")
            exc.path = "<stdin>" if exc.path == spool else exc.path
            raise
    finally:
        if os.path.exists(spool):
            os.unlink(spool)


def _label_column(text):
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return text


def _ingest_body(args):
    from ooc_learn.api import ingest

    if args.sources.count("-") > 1:
        raise ParameterError("'-' (standard input) can be given once.", "Pass it once.")
    budget = _budget(args, parsers=_any_text(args.sources))
    with _stdin_spooled(args.sources, args.output) as (sources, names):
        store = ingest(sources, args.output, format=args.format, layout=args.layout,
                       task=args.task, n_blocks=args.blocks, block_rows=args.block_rows,
                       n_features=args.n_features, positive_label=args.positive_label,
                       label_column=_label_column(args.label_column),
                       delimiter=args.delimiter, header=args.header,
                       zero_based=args.zero_based, build_index=not args.no_index,
                       width=args.width, leaf_size=args.leaf_size, seed=args.seed,
                       memory=budget, overwrite=args.overwrite, progress=not args.quiet,
                       source_names=names, shards=args.shards)
    st = store.ingest_stats
    if args.shards is not None:
        out = {"store": str(store.path), "n_samples": store.n_samples,
               "n_features": store.n_features, "shards": [
                   dict(s, path=str(store.shard_path(k))) for k, s in enumerate(store.shards)],
               "layout": store.layout, "task": store.task, "seconds": round(st["seconds"], 4),
               "bytes_in": st["bytes_in"], "bytes_read": st["bytes_read"],
               "bytes_written": st["bytes_written"], "peak_rss_bytes": st["peak_rss_bytes"]}
        text = (f"{out['store']}: {out['n_samples']} rows x {out['n_features']} features in "
                f"{store.n_shards} shards ({', '.join(str(s['n_samples']) for s in store.shards)}"
                f" rows), {out['layout']}, {out['task']} ({out['seconds']:.2f} s)")
        return {"json": out, "text": text}
    out = {"store": str(store.path), "n_samples": store.n_samples,
           "n_features": store.n_features, "n_blocks": store.n_blocks, "layout": store.layout,
           "task": store.task, "nnz": store.nnz, "has_index": store.has_index,
           "seconds": round(st["seconds"], 4), "bytes_in": st["bytes_in"],
           "bytes_read": st["bytes_read"], "bytes_written": st["bytes_written"],
           "mb_per_second": round(st["bytes_in"] / 1e6 / max(st["seconds"], 1e-9), 2),
           "peak_rss_bytes": st["peak_rss_bytes"]}
    store.close()
    text = (f"{out['store']}: {out['n_samples']} rows x {out['n_features']} features, "
            f"{out['n_blocks']} blocks, {out['layout']}, {out['task']}"
            f"{', indexed' if out['has_index'] else ''} "
            f"({out['seconds']:.2f} s, {out['mb_per_second']} MB/s)")
    return {"json": out, "text": text}


def ingest_main(argv=None) -> int:
    return run_command("ooc-ingest", _ingest_parser(), _ingest_body, argv)


# ---- ooc-info -----------------------------------------------------------------------------
def _info_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-info", description="Print what a store or a model file holds.",
        epilog="examples:  ooc-info train.store   ooc-info model.npz --json")
    p.add_argument("store", metavar="STORE|MODEL")
    _add_common(p)
    return p


def _model_info(path) -> dict:
    from ooc_learn.model import load_model, model_format

    m = load_model(path)
    meta, stats = m.meta, m.meta.get("stats", {})
    task = "regression" if m.regression else ("multiclass" if m.multiclass else "binary")
    info = {"model": str(path), "format": model_format(path), "task": task,
            "n_features": int(m.n_features_in_), "classes": m.classes_.tolist(),
            **{k: meta.get(k) for k in ("solver", "loss", "C", "s", "bias", "epsilon", "eps",
                                        "store", "store_fingerprint")},
            "train": {k: stats.get(k) for k in ("seconds", "rows_read", "outer_iterations",
                                                "converged", "n_sv", "objective")},
            "test": meta.get("test")}
    lines = [f"model        {info['model']} ({info['format']})",
             f"task         {task}, {info['n_features']} features"
             + (f", classes {info['classes']}" if info["classes"] else ""),
             f"trained      {info['solver']}/{info['loss']} C={info['C']}"
             + ("" if info["s"] is None else f" truncate {info['s']}")
             + f" bias {info['bias']} eps {info['eps']}",
             f"on store     {info['store']} (fingerprint {info['store_fingerprint']})",
             "training     " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in info["train"].items() if v is not None)]
    test = info["test"]
    if test:
        lines.append("on record    " + ", ".join(
            f"{k} {v:.2%}" if k == "accuracy" else f"{k} {v:.6g}" if isinstance(v, float)
            else f"{k} {v}" for k, v in test.items()))
    return {"json": info, "text": "\n".join(lines)}


def _info_body(args):
    from ooc_learn.model import is_model_file
    from ooc_learn.storage.budget import format_size
    from ooc_learn.storage.store import open_store

    if os.path.isfile(args.store) and is_model_file(args.store):
        return _model_info(args.store)
    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store

    if is_sharded_store(args.store):
        sh = ShardedStore(args.store)
        info = dict(sh.manifest, store=str(sh.path), shards=[
            dict(s, path=str(sh.shard_path(k)), present=os.path.isdir(sh.shard_path(k)))
            for k, s in enumerate(sh.shards)])
        lines = [f"sharded store {info['store']}",
                 f"rows         {sh.n_samples}",
                 f"features     {sh.n_features}",
                 f"layout       {sh.layout}",
                 f"task         {sh.task}  labels {json.dumps(sh.label_map)}",
                 f"shards       {sh.n_shards}"]
        for k, s in enumerate(info["shards"]):
            lines.append(f"shard {k:<6} {s['n_samples']} rows, {s['n_blocks']} blocks  "
                         f"{s['path']}{'' if s['present'] else '  (not on this machine)'}")
        return {"json": info, "text": "\n".join(lines)}
    with open_store(args.store, memory=_budget(args)) as store:
        info = store.info()
    meta = info["metadata"]
    lines = [f"store        {info['store']}",
             f"rows         {info['n_samples']}",
             f"features     {info['n_features']}",
             f"layout       {info['layout']} (nnz {info['nnz']}, density "
             f"{meta.get('density', 0):.4f})",
             f"task         {info['task']}  labels {json.dumps(meta.get('label_map', {}))}",
             f"blocks       {info['n_blocks']} ({info['block_rows']['min']}-"
             f"{info['block_rows']['max']} rows)",
             f"index        {'yes' if info['has_index'] else 'no'}",
             f"data.h5      {info['data_bytes']} bytes",
             f"memory       a block {format_size(info['memory']['block_bytes'], up=True)}, "
             f"every row {format_size(info['memory']['all_rows_bytes'], up=True)} (data "
             f"alone: --memory also holds the process, ~150M)"]
    for s in meta.get("sources", []):
        lines.append(f"source       {s.get('name')}  {s.get('rows')} rows  "
                     f"{s.get('bytes')} bytes  sha256 {s.get('sha256')}")
    return {"json": info, "text": "\n".join(lines)}


def info_main(argv=None) -> int:
    return run_command("ooc-info", _info_parser(), _info_body, argv)


# ---- ooc-check ----------------------------------------------------------------------------
def _check_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-check",
        description="Verify a store: its header, every block against its digest, the row "
                    "pointers and column indices, and the index's files and records. Exit 0 "
                    "when whole, 2 when damaged (one line for each fault).",
        epilog="example:  ooc-check a9a.store --json")
    p.add_argument("store", metavar="STORE")
    _add_common(p)
    return p


def _check_body(args):
    from tqdm.auto import tqdm

    from ooc_learn.storage.errors import StoreFormatError
    from ooc_learn.storage.store import REBUILD_HINT, open_store

    with open_store(args.store, memory=_budget(args)) as store:
        with tqdm(total=store.n_blocks, desc="check", unit="block", disable=args.quiet,
                  leave=False) as bar:
            problems = store.verify(progress=lambda b: bar.update(1))
        if store.has_index:
            from ooc_learn.index.forest import open_forest

            try:
                with open_forest(store) as forest:
                    forest.verify()
            except OOCError as exc:
                problems.append(exc.message)
    if problems:
        raise StoreFormatError("\n".join(problems), REBUILD_HINT)
    out = {"store": args.store, "ok": True, "digests": store.has_digests,
           "blocks": store.n_blocks}
    return {"json": out, "text": f"{args.store}: whole ({store.n_blocks} blocks, "
            + ("digests checked)" if store.has_digests else
               "structure only: written before block digests)")}


def check_main(argv=None) -> int:
    return run_command("ooc-check", _check_parser(), _check_body, argv)


# ---- ooc-train ----------------------------------------------------------------------------
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
    p.add_argument("--eps", type=float, default=0.1, help="stopping tolerance (default 0.1)")
    p.add_argument("--max-outer", type=int, default=10,
                   help="IBCD relaxation steps / bm passes (dcd: x100 epochs)")
    p.add_argument("--block-size", type=int, default=1000, metavar="N",
                   help="IBCD: fresh rows asked of the index per step")
    p.add_argument("--block-solver", default="dual", choices=["dual", "primal"],
                   help="IBCD block sub-problem: dual CD or TRON on the primal (sqhinge)")
    p.add_argument("--sample-eps", type=float, default=0.0, metavar="EPS",
                   help="IBCD: stop when fresh rows / rows examined < EPS (reads less; "
                        "approximate; default 0: exact stop)")
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
    p.add_argument("--jobs", type=int, default=1, metavar="N",
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
    _add_common(p)
    return p


EVAL_PREFIX = "ooc-eval-"


def _eval_prefix() -> str:
    """The prefix of this process's temporary evaluation store (``--test`` / ooc-predict on a
    text file), named after its pid; those of processes that are gone (a killed run cannot
    remove its own) are removed first."""
    import tempfile

    from ooc_learn.storage.resources import remove_dead_owned

    remove_dead_owned(tempfile.gettempdir(), EVAL_PREFIX)
    return f"{EVAL_PREFIX}{os.getpid()}-"


def _eval_spec(model=None, store=None) -> dict:
    """What evaluation data must match, from a model or from the training store (before
    training): feature count, task, the positive label and the LIBSVM index base."""
    if model is not None:
        task = ("regression" if model.regression else "multiclass" if model.multiclass
                else "binary")
        label_map = model.meta.get("label_map", {})
        return {"n_features": model.n_features_in_, "task": task,
                "positive": label_map.get("positive"), "label_map": label_map,
                "zero_based": model.meta.get("zero_based"), "what": "The model"}
    return {"n_features": store.n_features, "task": store.task,
            "positive": store.label_map.get("positive"), "label_map": store.label_map,
            "zero_based": store.metadata.get("zero_based"),
            "what": f"The training store {store.path}"}


def _names_kw(label_map: dict) -> dict:
    """How evaluation data with class names get the training codes: the same names in the
    same order, or (one class against the rest) that class as the positive label."""
    names = (label_map or {}).get("names")
    if not names:
        return {}
    if label_map.get("one_vs_rest"):
        return {"positive_label": names[1], "label_names": None}
    return {"positive_label": None, "label_names": list(names)}


def _open_eval_data(path, spec, budget, stack):
    """A store for evaluation: an existing store, or a source file ingested to a temp dir;
    its feature count and task checked against ``spec`` (:func:`_eval_spec`)."""
    import tempfile
    from pathlib import Path

    from ooc_learn.storage.errors import ModelMismatchError
    from ooc_learn.storage.store import is_store, open_store

    if is_store(path):
        data = stack.enter_context(open_store(path, memory=budget))
    else:
        from ooc_learn.api import ingest

        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=_eval_prefix()))
        pos = spec["positive"]
        # a LIBSVM file is read with the training store's index base, decided once at its
        # ingest (auto-detected apart, a stray "0:" in either file shifted every feature of
        # one of them: 57 % test accuracy, exit 0); a contradiction is refused with the file
        # and line
        base = spec["zero_based"]
        task = spec["task"] if spec["task"] != "binary" else "binary" if pos is None else "auto"
        kw = {"positive_label": pos, **_names_kw(spec.get("label_map"))}
        data = stack.enter_context(ingest(
            [path], Path(tmp) / "eval.store", build_index=False, memory=budget,
            n_features=spec["n_features"], task=task,
            zero_based="auto" if base is None else bool(base), **kw))
    if data.n_features != spec["n_features"]:
        raise ModelMismatchError(
            f"{spec['what']} has {spec['n_features']} features; {path} has "
            f"{data.n_features}.", "Use data ingested from the same feature space (same "
            "--n-features), or retrain on this data.")
    if data.task != spec["task"]:
        raise ModelMismatchError(f"{spec['what']} is for a {spec['task']} task; {path} holds "
                                 f"a {data.task} task.",
                                 f"Ingest the evaluation data with --task {spec['task']}.")
    return data


PREDICTIONS_HEADER = "row_id,label,decision\n"


def _check_model_output(path) -> None:
    """Refuse, before any work, a model path that is not one or holds a file not ours."""
    from ooc_learn.model import is_model_file
    from ooc_learn.storage.replace import check_file_target

    check_file_target(path, is_ours=is_model_file, kind="model")


def _is_predictions_file(path) -> bool:
    try:
        with open(path) as fh:
            return fh.readline() == PREDICTIONS_HEADER
    except (OSError, UnicodeDecodeError):
        return False


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
    if args.C_search and args.C is not None:
        raise ParameterError("--C-search picks C itself; it does not take --C.",
                             "Drop --C, or give --C a list to cross-validate those values.")
    if args.C_search and (args.cv is None or incremental or args.solver == "pegasos"):
        raise ParameterError("--C-search needs --cv K and an SVM solver (ibcd, dcd, bm) or a "
                             "regression store.", "Add --cv 5.")
    args.C = [1.0] if args.C is None else args.C
    if args.plot is not None:
        if incremental or args.solver == "pegasos":
            raise ParameterError("--plot draws an SVM's cross-validation against C or a "
                                 "training run (ibcd, dcd, bm, regression).",
                                 "Drop --plot for TreeCV and PEGASOS.")
        from ooc_learn.plots import check_plot_target

        check_plot_target(args.plot)  # a bad name or a missing matplotlib: before the work
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
        _check_model_output(args.output)  # before the work: a model of ours only is replaced
    budget = _budget(args, solvers=True, parsers=_any_text([args.test]))
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
                spec = _eval_spec(store=st)
            test = _open_eval_data(args.test, spec, budget, stack)
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
    client, cluster = make_client(args.scheduler, args.workers)
    stack.callback(client.close)
    if cluster is not None:
        stack.callback(cluster.close)
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
                             f"the {args.solver} SVM is regularized by --C.",
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
        from ooc_learn.cv.linear import linear_c_search

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
    grid = [{"C": r.stats["C"], "estimate": r.estimate,
             "fold_scores": [float(v) for v in r.fold_scores], "seconds": r.stats["seconds"],
             "rows_read": r.stats["rows_read"], "folds": r.stats["folds"]} for r in results]
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
           if "classes" in best.stats else "one pass, a Gram matrix per fold"
           if solver == "exact" else "C search, each fold warm-started from the last C"
           if args.C_search else f"{best.stats['jobs']} folds at a time in threads"
           if best.stats.get("jobs", 1) > 1 else "folds warm-started"
           if best.stats["warm_start"] else "folds from scratch")
    fmt = (lambda v: f"{v:>12.6g}") if rmse else (lambda v: f"{100 * v:>11.2f}%")
    lines = [f"{solver} {best.k}-fold cross-validation of {args.store} ({how})",
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
    budget = _budget(args, solvers=True)
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


def train_main(argv=None) -> int:
    return run_command("ooc-train", _train_parser(), _train_body, argv)


# ---- ooc-predict --------------------------------------------------------------------------
def _predict_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ooc-predict",
                                description="Apply a trained model to a store or a source file.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="examples:\n"
                                       "  ooc-predict a9a.npz a9a.t\n"
                                       "  ooc-predict a9a.npz test.store -o - | head\n"
                                       "  ooc-predict f.npz fashion-test.store --json")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("data", metavar="STORE_OR_FILE")
    p.add_argument("-o", "--output", metavar="PREDICTIONS", default=None,
                   help="write 'row_id,label,decision' lines in source order (CSV); '-': "
                        "to stdout, the summary then on stderr")
    _add_common(p)
    return p


def _predict_body(args):
    import contextlib

    import numpy as np

    from pathlib import Path

    from ooc_learn.model import load_model
    from ooc_learn.storage.replace import atomic_file, check_file_target

    to_stdout = args.output == "-"
    if to_stdout and args.json:
        raise ParameterError("-o - writes the predictions to stdout, where --json writes its "
                             "object.", "Drop --json, or write the predictions to a file.")
    if args.output and not to_stdout:  # before the work: only a file of ours is replaced
        check_file_target(args.output, is_ours=_is_predictions_file, kind="predictions")
    budget = _budget(args, parsers=_any_text([args.data]))
    # the weights as stored, read and converted (an upper bound that needs no parsing)
    model_bytes = 3 * Path(args.model).stat().st_size if Path(args.model).is_file() else 0
    budget.reserve(model_bytes, f"model {args.model}",
                   hint="or check the training source for a stray large feature index")
    model = load_model(args.model)
    with contextlib.ExitStack() as stack:
        data = _open_eval_data(args.data, _eval_spec(model=model), budget, stack)
        # row ids, decisions, labels, the sort order and the predicted labels of every row
        # (and, one-vs-rest, each row's winning class)
        budget.reserve(48 * data.n_samples, f"predictions of {data.n_samples:,} rows",
                       hint="or predict a part of the rows at a time")
        ids, dec, ys, pred = [], [], [], []
        from tqdm.auto import tqdm

        for X, y, row_ids in tqdm(data.iter_blocks(), total=data.n_blocks, desc="predict",
                                  unit="block", disable=args.quiet, leave=False):
            ids.append(row_ids)
            dv = model.decision_function(X)
            if model.multiclass:  # the winning class's value, not the whole row
                k = np.argmax(dv, axis=1)
                pred.append(k)
                dv = dv[np.arange(dv.shape[0]), k]
            dec.append(dv)
            ys.append(y)
        ids, dec, ys = np.concatenate(ids), np.concatenate(dec), np.concatenate(ys)
        pred = (np.concatenate(pred) if pred else np.zeros(dec.size, np.intp)
                if model.regression else (dec > 0).astype(np.intp))
    order = np.argsort(ids)
    ids, dec, ys, pred = ids[order], dec[order], ys[order], pred[order]
    labels = dec if model.regression else model.classes_[pred]
    names = model.meta.get("label_map", {}).get("names")
    shown = labels if not names else np.asarray(names, dtype=object)[labels.astype(np.intp)]
    out = {"model": args.model, "data": args.data, "n_samples": int(ids.size)}
    if model.regression:
        from ooc_learn.model import error_figures

        err = error_figures([(dec, ys)])
        out.update(rmse=err["rmse"], mae=err["mae"], r2=err["r2"])
        accuracy = None
    elif model.multiclass:
        accuracy = float(np.mean(labels.astype(np.float64) == ys))
        classes = np.asarray(model.classes_, dtype=np.float64)  # sorted, as ingest lists them
        truth = np.minimum(np.searchsorted(classes, ys), classes.size - 1)
        known = classes[truth] == ys
        confusion = np.zeros((classes.size, classes.size), np.int64)
        np.add.at(confusion, (truth[known], pred[known]), 1)
        out["classes"] = list(names) if names else model.classes_.tolist()
        out["confusion_matrix"] = confusion.tolist()  # rows: true class, columns: predicted
        out["unknown_labels"] = int((~known).sum())
    else:
        accuracy = float(np.mean(np.where(dec > 0, 1.0, -1.0) == ys))
    if not model.regression:
        out["accuracy"] = accuracy
    out["output"] = args.output

    def write(fh):
        fh.write(PREDICTIONS_HEADER)
        for i, lab, dv in zip(ids, shown, dec):
            fh.write(f"{i},{lab},{dv:.9g}\n")

    if to_stdout:  # the CSV on stdout, the summary on stderr (unless --quiet)
        try:
            write(sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (| head)
            _stdout_gone()
    elif args.output:
        with atomic_file(args.output) as tmp, open(tmp, "w") as fh:
            write(fh)
    if model.regression:
        text = f"{ids.size} rows, RMSE {out['rmse']:.6g}, R^2 {out['r2']:.4f}"
    else:
        text = f"{ids.size} rows, accuracy {100 * accuracy:.2f}%"
    text += f", predictions in {args.output}" if args.output and not to_stdout else ""
    if model.multiclass:
        text += "\n" + _confusion_text(out["classes"], out["confusion_matrix"])
    if to_stdout:
        return {"json": out, "text": None if args.quiet else text, "text_to_stderr": True}
    return {"json": out, "text": text}


def _confusion_text(classes, confusion) -> str:
    """The confusion matrix as a table: a row per true class, a column per predicted one."""
    import numpy as np

    names = [f"{c:g}" if isinstance(c, float) else str(c) for c in np.asarray(classes).tolist()]
    width = max(6, max(len(n) for n in names) + 1,
                max(len(str(v)) for row in confusion for v in row) + 1)
    lines = ["confusion matrix (rows: true class, columns: predicted)",
             " " * width + "".join(f"{n:>{width}}" for n in names)]
    for n, row in zip(names, confusion):
        lines.append(f"{n:>{width}}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def predict_main(argv=None) -> int:
    return run_command("ooc-predict", _predict_parser(), _predict_body, argv)


# ---- ooc-index ----------------------------------------------------------------------------
def _index_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-index",
        description="Build the metric-forest index of an existing store (rewrites every block "
                    "in leaf order; the old store stays intact until the new one is complete).",
        epilog="example:  ooc-index a9a.store --width 10 --leaf-size 16")
    p.add_argument("store", metavar="STORE")
    p.add_argument("--width", type=int, default=None, metavar="K",
                   help="children per node (default 10)")
    p.add_argument("--leaf-size", type=int, default=None, metavar="L",
                   help="rows per leaf (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")
    _add_common(p)
    return p


def _index_body(args):
    from ooc_learn.index.build import build_index
    from ooc_learn.index.tree import DEFAULT_LEAF_SIZE, DEFAULT_WIDTH

    out = build_index(args.store, width=DEFAULT_WIDTH if args.width is None else args.width,
                      leaf_size=DEFAULT_LEAF_SIZE if args.leaf_size is None else args.leaf_size,
                      seed=args.seed, memory=_budget(args), overwrite=args.overwrite)
    out = dict(out, store=str(args.store))
    return {"json": out, "text": f"{args.store}: index built over {out.get('n_blocks')} blocks "
                                 f"in {out.get('seconds', 0):.2f} s"}


def index_main(argv=None) -> int:
    return run_command("ooc-index", _index_parser(), _index_body, argv)


_MAINS = {"ingest": ingest_main, "info": info_main, "train": train_main,
          "predict": predict_main, "index": index_main}

if __name__ == "__main__":  # python -m ooc_learn.cli COMMAND ARGS...
    if len(sys.argv) < 2 or sys.argv[1] not in _MAINS:
        print(f"usage: python -m ooc_learn.cli {{{','.join(_MAINS)}}} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(_MAINS[sys.argv.pop(1)]())
