"""``ooc-ingest`` and ``ooc-index``: raw files into a store, and its metric-forest index."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ooc_learn.storage.errors import ParameterError

from .common import add_common, any_text, command_budget, run_command


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
    p.add_argument("-o", "--output", required=True, metavar="STORE",
                   help="store directory to create")
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
    p.add_argument("--labels", default=None, metavar="FILE",
                   help=".npy of features only (X.npy): the labels, one per row, from the "
                        ".npy FILE (y.npy); the features are read from the source by row")
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
    p.add_argument("--value-codes", choices=("auto", "uint8", "uint16", "none"),
                   default="auto",
                   help="a dense X with few distinct values (pixels, 0/1, small counts) as "
                        "1- or 2-byte codes and a table of its values: the same float32 "
                        "rows read back from 2-4x fewer bytes on disk (auto: where the first "
                        "block shows at most 256, or 16,384 repeating, distinct values; none: "
                        "float32)")
    p.add_argument("--width", type=int, default=None, metavar="K",
                   help="index: children per node (default 10)")
    p.add_argument("--leaf-size", type=int, default=None, metavar="L",
                   help="index: rows per leaf (default 16, or 32 for wide rows: over ~800 "
                        "bytes each, e.g. 205+ dense features)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle and the index")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    add_common(p)
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
    if args.sources.count("-") > 1:
        raise ParameterError("'-' (standard input) can be given once.", "Pass it once.")
    budget = command_budget(args, parsers=any_text(args.sources))
    if args.labels is not None:
        store = _ingest_with_labels(args, budget)
    else:
        store = _ingest_sources(args, budget)
    return _report(args, store)


def _ingest_with_labels(args, budget):
    """``X.npy --labels y.npy``: the features memory-mapped (read from the file by row
    position, as a .npy source), the labels in memory (paid from the budget)."""
    import numpy as np

    from ooc_learn.api import ingest_arrays
    from ooc_learn.storage.errors import IngestError

    if len(args.sources) != 1 or not str(args.sources[0]).endswith(".npy"):
        raise ParameterError("--labels gives the labels of one .npy source of features.",
                             "Pass one X.npy with --labels y.npy, or put the labels in a "
                             "column of the source (--label-column).")
    if args.label_column is not None:
        raise ParameterError("--labels and --label-column both name the labels.",
                             "Give one of them.")
    from ooc_learn.storage.sniff import detect_format

    src, lab = args.sources[0], args.labels
    arrays = []
    for path, what in ((src, "features"), (lab, "labels")):
        if detect_format(path) != "npy":  # numpy's own error speaks of pickled data
            raise IngestError(f"the {what} file is not a .npy array (no .npy header)",
                              "Save them with numpy.save (np.save(f, y)).", path=path)
        try:  # allow_pickle=False: a .npy that would run code is refused
            arrays.append(np.load(path, mmap_mode="r" if what == "features" else None,
                                  allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise IngestError(f"the {what} cannot be read as a .npy array ({exc})",
                              "Save them with numpy.save.", path=path) from None
    X, y = arrays
    if X.ndim != 2:
        raise IngestError(f"the features are a {X.ndim}-d array; they are rows x features",
                          "Save a 2-d array (np.save(f, X)).", path=src)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise IngestError(f"{y.shape[0] if y.ndim else 0} labels (shape {y.shape}) for the "
                          f"{X.shape[0]} rows of {src}", "Save one label per row, in the "
                          "rows' order (np.save(f, y)).", path=lab)
    with budget.reservation(y.nbytes, f"the labels of {lab}"):
        return ingest_arrays(X, y, args.output, layout=args.layout, task=args.task,
                             n_blocks=args.blocks, block_rows=args.block_rows,
                             n_features=args.n_features, positive_label=args.positive_label,
                             build_index=not args.no_index, width=args.width,
                             leaf_size=args.leaf_size, seed=args.seed, memory=budget,
                             overwrite=args.overwrite, progress=not args.quiet,
                             shards=args.shards, value_codes=_value_codes(args),
                             _source_name=f"{src} (labels {lab})")


def _labels_beside(path) -> str | None:
    """``y.npy`` beside ``X.npy`` (``y_train.npy`` beside ``X_train.npy``, ...), if there."""
    from pathlib import Path

    p = Path(path)
    if p.suffix != ".npy" or p.name[:1] not in "Xx":
        return None
    twin = p.with_name("y" + p.name[1:])
    return str(twin) if twin.is_file() else None


def _ingest_sources(args, budget):
    import warnings

    from ooc_learn.api import ingest

    for src in args.sources:
        twin = None if args.label_column is not None else _labels_beside(src)
        if twin:
            warnings.warn(f"the labels are column 0 of {src}; {twin} beside it is not read. If "
                          f"it holds the labels, ingest with --labels {twin}.", RuntimeWarning,
                          stacklevel=2)

    with _stdin_spooled(args.sources, args.output) as (sources, names):
        return ingest(sources, args.output, format=args.format, layout=args.layout,
                       task=args.task, n_blocks=args.blocks, block_rows=args.block_rows,
                       n_features=args.n_features, positive_label=args.positive_label,
                       label_column=_label_column(args.label_column),
                       delimiter=args.delimiter, header=args.header,
                       zero_based=args.zero_based, build_index=not args.no_index,
                       width=args.width, leaf_size=args.leaf_size, seed=args.seed,
                      memory=budget, overwrite=args.overwrite, progress=not args.quiet,
                      source_names=names, shards=args.shards,
                      value_codes=_value_codes(args))


def _value_codes(args):
    return None if args.value_codes == "none" else args.value_codes


def _report(args, store):
    st = store.ingest_stats
    one = store.label_map.get("one_class") if store.task == "binary" else None
    if one is not None:
        import warnings

        warnings.warn(f"every row has the label {float(one):g}: the store serves as a test "
                      "set (ooc-predict, --test); training on it is refused (one class).",
                      RuntimeWarning, stacklevel=2)
    if args.shards is not None:
        out = {"store": str(store.path), "n_samples": store.n_samples,
               "n_features": store.n_features, "shards": [
                   dict(s, path=str(store.shard_path(k))) for k, s in enumerate(store.shards)],
               "layout": store.layout, "task": store.task, "seconds": round(st["seconds"], 4),
               "bytes_in": st["bytes_in"], "bytes_read": st["bytes_read"],
               "bytes_written": st["bytes_written"], "direct_passes": st["direct_passes"],
               "peak_rss_bytes": st["peak_rss_bytes"]}
        text = (f"{out['store']}: {out['n_samples']} rows x {out['n_features']} features in "
                f"{store.n_shards} shards ({', '.join(str(s['n_samples']) for s in store.shards)}"
                f" rows), {out['layout']}, {out['task']} ({out['seconds']:.2f} s)")
        return {"json": out, "text": text}
    out = {"store": str(store.path), "n_samples": store.n_samples,
           "n_features": store.n_features, "n_blocks": store.n_blocks, "layout": store.layout,
           "task": store.task, "nnz": store.nnz, "has_index": store.has_index,
           "seconds": round(st["seconds"], 4), "bytes_in": st["bytes_in"],
           "bytes_read": st["bytes_read"], "bytes_written": st["bytes_written"],
           "direct_passes": st["direct_passes"], "value_codes": store.value_codes,
           "restarts": st.get("restarts", 0),
           "mb_per_second": round(st["bytes_in"] / 1e6 / max(st["seconds"], 1e-9), 2),
           "peak_rss_bytes": st["peak_rss_bytes"]}
    store.close()
    text = (f"{out['store']}: {out['n_samples']} rows x {out['n_features']} features, "
            f"{out['n_blocks']} blocks, {out['layout']}"
            f"{' (' + out['value_codes'] + ' value codes)' if out['value_codes'] else ''}, "
            f"{out['task']}{', indexed' if out['has_index'] else ''} "
            f"({out['seconds']:.2f} s, {out['mb_per_second']} MB/s)")
    return {"json": out, "text": text}


def ingest_command():
    """ooc-ingest's parser and body (a first run's warm-up runs them: ``cli.warmup``)."""
    return _ingest_parser(), _ingest_body


def ingest_main(argv=None) -> int:
    return run_command("ooc-ingest", _ingest_parser(), _ingest_body, argv)




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
                   help="rows per leaf (default 16, or 32 for wide rows: over ~800 bytes "
                        "each, e.g. 205+ dense features)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing index")
    add_common(p)
    return p


def _index_body(args):
    from ooc_learn.index.build import build_index
    from ooc_learn.index.tree import DEFAULT_WIDTH

    out = build_index(args.store, width=DEFAULT_WIDTH if args.width is None else args.width,
                      leaf_size=args.leaf_size, seed=args.seed, memory=command_budget(args),
                      overwrite=args.overwrite)
    out = dict(out, store=str(args.store))
    return {"json": out, "text": f"{args.store}: index built over {out.get('n_blocks')} blocks "
                                 f"in {out.get('seconds', 0):.2f} s"}


def index_command():
    """ooc-index's parser and body (a first run's warm-up runs them: ``cli.warmup``)."""
    return _index_parser(), _index_body


def index_main(argv=None) -> int:
    return run_command("ooc-index", _index_parser(), _index_body, argv)
