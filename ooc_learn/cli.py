"""Command-line entry points: ``ooc-ingest``, ``ooc-info`` (and, as they land, the others).

Every command: ``--help``, ``--memory`` (or ``OOC_MEMORY``), ``--json`` for one JSON object on
stdout, tqdm progress on stderr unless ``--quiet``. The flow is parse -> validate -> call the
library -> print; failures print ``<prog>: <message>`` and the hint on stderr and exit with 2
for bad input or usage, 1 for runtime failures.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Callable

from ooc_learn.storage.budget import MemoryBudget, parse_size
from ooc_learn.storage.errors import OOCError, ParameterError

__all__ = ["ingest_main", "info_main", "run_command"]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", metavar="SIZE", default=None,
                   help="memory cap for the whole run, e.g. 512M or 4G "
                        "(default: $OOC_MEMORY, else 25%% of RAM)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with the results on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")


def _budget(args) -> MemoryBudget:
    return MemoryBudget(None if args.memory is None else parse_size(args.memory))


def run_command(prog: str, parser: argparse.ArgumentParser, body: Callable, argv=None) -> int:
    """Parse ``argv``, run ``body(args)`` and turn failures into messages and exit codes."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format=f"{prog}: %(message)s", stream=sys.stderr)
    try:
        result = body(args)
    except OOCError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"{prog}: hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    if result is None:
        return 0
    if getattr(args, "json", False):
        print(json.dumps(result["json"], default=_json_default))
    else:
        print(result["text"])
    return 0


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# ---- ooc-ingest ---------------------------------------------------------------------------
def _ingest_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-ingest",
        description="Ingest LIBSVM/CSV/npy sources into a block store (HDF5 blocks plus a "
                    "metric-forest index), streaming under the memory cap.")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="input files (.gz/.bz2/.xz read transparently); several are concatenated")
    p.add_argument("-o", "--output", required=True, metavar="STORE", help="store directory to create")
    p.add_argument("--format", default="auto", choices=["auto", "libsvm", "csv", "npy", "npz"])
    p.add_argument("--layout", default="auto", choices=["auto", "dense", "csr"],
                   help="storage layout (auto: dense when >= 40%% of entries are non-zero)")
    p.add_argument("--task", default="auto", choices=["auto", "binary", "regression", "multiclass"])
    p.add_argument("--positive-label", type=float, default=None, metavar="LABEL",
                   help="make the task binary: LABEL -> +1, every other label -> -1 "
                        "(default for two-label sources: the larger label is +1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--blocks", type=int, default=None, metavar="R", help="number of random blocks")
    g.add_argument("--block-rows", type=int, default=None, metavar="N", help="rows per block")
    p.add_argument("--n-features", type=int, default=None, metavar="D",
                   help="feature count (to match a training store when a test file has fewer)")
    p.add_argument("--label-column", default="0", metavar="COL",
                   help="CSV/npy: label column, an index (negative from the end) or a header name")
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
    p.add_argument("--width", type=int, default=10, metavar="K", help="index: children per node")
    p.add_argument("--leaf-size", type=int, default=None, metavar="L", help="index: rows per leaf")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the index")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    _add_common(p)
    return p


def _label_column(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def _ingest_body(args):
    from ooc_learn.api import ingest

    budget = _budget(args)
    store = ingest(args.sources, args.output, format=args.format, layout=args.layout,
                   task=args.task, n_blocks=args.blocks, block_rows=args.block_rows,
                   n_features=args.n_features, positive_label=args.positive_label,
                   label_column=_label_column(args.label_column), delimiter=args.delimiter,
                   header=args.header, zero_based=args.zero_based,
                   build_index=not args.no_index, width=args.width, leaf_size=args.leaf_size,
                   seed=args.seed, memory=budget, overwrite=args.overwrite,
                   progress=not args.quiet)
    st = store.ingest_stats
    out = {"store": str(store.path), "n_samples": store.n_samples,
           "n_features": store.n_features, "n_blocks": store.n_blocks, "layout": store.layout,
           "task": store.task, "nnz": store.nnz, "has_index": store.has_index,
           "seconds": round(st["seconds"], 4), "bytes_in": st["bytes_in"],
           "mb_per_second": round(st["bytes_in"] / 1e6 / max(st["seconds"], 1e-9), 2),
           "peak_rss_bytes": st["peak_rss_bytes"], "memory_cap_bytes": budget.limit}
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
    p = argparse.ArgumentParser(prog="ooc-info", description="Print a store's metadata.")
    p.add_argument("store", metavar="STORE")
    _add_common(p)
    return p


def _info_body(args):
    from ooc_learn.storage.store import open_store

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
             f"data.h5      {info['data_bytes']} bytes"]
    for s in meta.get("sources", []):
        lines.append(f"source       {s.get('name')}  {s.get('rows')} rows  "
                     f"{s.get('bytes')} bytes  sha256 {s.get('sha256')}")
    return {"json": info, "text": "\n".join(lines)}


def info_main(argv=None) -> int:
    return run_command("ooc-info", _info_parser(), _info_body, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(ingest_main())
