"""The helper's side of a first run's warm-up under ``--memory`` (the command's side, and
why: :mod:`ooc_learn._warmup`): the command, same options, on the head of its input in a
folder of the command's, compiling its kernels into numba's cache.

Run as ``python -m ooc_learn.cli.warmup PROG ARGV_JSON FOLDER``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ooc_learn._warmup import AGAIN

HEAD_ROWS = 6000
HEAD_FEATURES = 32
HEAD_LINES = 4000
# ... and of wide data no more than this many bytes (at least 64 rows of a store, 2 lines or
# rows of a source): 6,000 rows of 100,000 dense features would be 2.4 GB
HEAD_BYTES = 16 << 20


def _store_head(path, out: Path, *, min_blocks: int = 1, index: bool | None = None,
                all_features: bool = False) -> Path:
    """The first HEAD_ROWS rows (HEAD_BYTES at most) of the store at ``path``, its first
    HEAD_FEATURES features (``all_features``: every one, as a model's input), as a store at
    ``out``, indexed where the store is (``index`` None) or as asked."""
    import numpy as np

    from ooc_learn.index.orderer import forest_orderer
    from ooc_learn.storage.ingest import ingest_arrays
    from ooc_learn.storage.store import open_store

    with open_store(path) as st:
        n = min(HEAD_ROWS, st.n_samples, max(64, HEAD_BYTES // st.estimated_bytes(1)))
        X, y, _ = st.read_range(0, n, ids=False, stored_labels=True)
        task, layout, indexed, blocks = st.stored_task, st.layout, st.has_index, st.n_blocks
    X = X if all_features else X[:, :HEAD_FEATURES]
    if not hasattr(X, "tocsr"):
        X = np.ascontiguousarray(X)
    index = indexed if index is None else index
    ingest_arrays(X, y, out, task=task, layout=layout,
                  n_blocks=max(min(blocks, 8), min_blocks),
                  block_orderer=forest_orderer() if index else None)
    return out


def _source_head(path: str, tmp: Path) -> Path | None:
    """The first HEAD_LINES lines of a text source (decompressed) or HEAD_ROWS rows of a
    .npy, HEAD_BYTES at most, in ``tmp`` under the source's name; None for what cannot be cut
    (stdin, idx, .npz)."""
    from ooc_learn.storage.sniff import detect_format
    from ooc_learn.storage.source_io import open_binary

    if path == "-":
        return None
    fmt = detect_format(path)
    name = Path(path).name
    for suffix in (".gz", ".bz2", ".xz"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    out = tmp / f"{len(list(tmp.iterdir()))}-{name}"
    if fmt == "npy":
        import numpy as np

        a = np.load(path, mmap_mode="r")
        rows = min(HEAD_ROWS, max(2, HEAD_BYTES // max(1, a[:1].nbytes)))
        np.save(out if out.suffix == ".npy" else out.with_suffix(".npy"),
                np.ascontiguousarray(a[:rows]))
        return out if out.suffix == ".npy" else out.with_suffix(".npy")
    if fmt not in ("libsvm", "csv"):
        return None
    with open_binary(path) as f, open(out, "wb") as g:
        lines = written = 0
        while lines < HEAD_LINES and (written < HEAD_BYTES or lines < 2):
            chunk = f.read(1 << 20)
            if not chunk:
                break
            end, pos = len(chunk), -1  # the chunk up to the end of the line that ends the head
            while (pos := chunk.find(b"\n", pos + 1)) >= 0:
                lines += 1
                if lines >= HEAD_LINES or (written + pos + 1 >= HEAD_BYTES and lines >= 2):
                    end = pos + 1
                    break
            g.write(chunk[:end])
            written += end
    return out


def _plain_store(path) -> bool:
    """Whether ``path`` is a store whose head can be cut (not a sharded one)."""
    from ooc_learn.storage.sharded import is_sharded_store
    from ooc_learn.storage.store import is_store

    return is_store(path) and not is_sharded_store(path)


def _prepare_train(args, tmp: Path) -> bool:
    from ooc_learn._warmup import searches_index
    from ooc_learn.storage.store import is_store

    if not _plain_store(args.store):
        return False
    k = int(args.cv) if args.cv is not None and str(args.cv).isdigit() else 1
    # the head indexed only for IBCD: building its index loads the tree builder's kernels
    # into every helper (a TreeCV first run's helpers stalled on them in the 10x setting)
    args.store = str(_store_head(args.store, tmp / "head.store", min_blocks=k,
                                 index=None if searches_index(args) else False))
    if args.test is not None:
        if is_store(args.test):
            args.test = str(_store_head(args.test, tmp / "test.store", index=False))
        else:
            # the test file's parsers compile by ingesting its head (its features may be more
            # than the head store keeps, so it is not scored)
            from ooc_learn.storage.ingest import ingest

            src = _source_head(args.test, tmp)
            if src is not None:
                ingest([str(src)], tmp / "test-head.store")
            args.test = None
    if args.output is not None:
        args.output = str(tmp / ("model" + (Path(args.output).suffix or ".npz")))
    args.plot = args.spill_dir = None
    args.jobs = 1
    return True


def _prepare_ingest(args, tmp: Path) -> bool:
    heads = [_source_head(s, tmp) for s in args.sources]
    if any(h is None for h in heads):
        return False
    args.sources = [str(h) for h in heads]
    if args.labels is not None:
        args.labels = str(_source_head(args.labels, tmp))
    args.output = str(tmp / "out.store")
    args.blocks = args.block_rows = None
    args.overwrite = True
    return True


def _prepare_index(args, tmp: Path) -> bool:
    if not _plain_store(args.store):
        return False
    args.store = str(_store_head(args.store, tmp / "head.store", index=False))
    return True


def _prepare_predict(args, tmp: Path) -> bool:
    if _plain_store(args.data):  # the model's features, every one
        args.data = str(_store_head(args.data, tmp / "head.store", index=False,
                                    all_features=True))
    else:
        src = _source_head(args.data, tmp)
        if src is None:
            return False
        args.data = str(src)
    if args.output not in (None, "-"):
        args.output = str(tmp / "predictions.csv")
    elif args.output == "-":
        args.output = None
    return True


def _command(prog: str):
    """(parser, body, prepare) of ``prog``."""
    if prog == "ooc-train":
        from .train import train_command

        return (*train_command(), _prepare_train)
    if prog == "ooc-predict":
        from .predict import predict_command

        return (*predict_command(), _prepare_predict)
    from .ingest import index_command, ingest_command

    if prog == "ooc-ingest":
        return (*ingest_command(), _prepare_ingest)
    return (*index_command(), _prepare_index)


def _watch_rss(limit: int) -> None:
    """End this process with ``AGAIN`` once its RSS passes ``limit`` bytes (a thread polling
    every 20 ms) after LLVM's code pages were handed back (they fault back in as the compiler
    needs them): numba has cached every kernel compiled so far, and a fresh helper goes on."""
    import threading
    import time

    from ooc_learn.storage.resources import current_rss_bytes, release_compiler_pages

    def watch():
        while True:
            if current_rss_bytes() > limit:
                release_compiler_pages(min_interval=0.25)
                if current_rss_bytes() > limit:
                    os._exit(AGAIN)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()


def main(prog: str, argv: list[str], folder: str) -> int:
    """Run ``prog argv`` on the head of its input, in ``folder`` (the caller's to remove),
    after compiling the kernels the head does not reach (``_jit.AT_SCALE``); 0 when it ran,
    3 when the input cannot be cut, 1 when the run failed (the command then
    compiles what is left itself). ``OOC_WARMUP_RSS``: the RSS, in bytes, past which it
    stops (:func:`_watch_rss`)."""
    from ooc_learn.storage.resources import limit_allocator_retention

    limit_allocator_retention()  # as the command itself does (run_command)
    if os.environ.get("OOC_WARMUP_RSS"):
        _watch_rss(int(os.environ["OOC_WARMUP_RSS"]))
    parser, body, prepare = _command(prog)
    args = parser.parse_args(argv)
    if not prepare(args, Path(folder)):
        return 3
    # first, what the head's run does not reach: here they are compiled within the share,
    # where after the run they could fall to the last helper, the one without a limit
    from ooc_learn._jit import compile_at_scale

    compile_at_scale(prog)
    if os.environ.get("OOC_WARMUP_SEARCH_LOOP") == "python":
        from ooc_learn.index import view

        view.HOLDS_DATA = False  # as the command's (see ooc_learn._warmup.first_run_kernels)
    args.memory, args.quiet, args.json, args.verbose = None, True, False, False
    body(args)
    return 0


if __name__ == "__main__":  # a helper of ooc_learn._warmup.warm_up_first
    os.environ.pop("OOC_MEMORY", None)
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))
