"""``ooc-info`` (a store, a sharded store's manifest or a model) and ``ooc-check``."""

from __future__ import annotations

import argparse
import json
import os

from ooc_learn.storage.errors import OOCError

from .common import add_common, command_budget, run_command


def _info_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-info", description="Print what a store or a model file holds.",
        epilog="examples:  ooc-info train.store   ooc-info model.npz --json")
    p.add_argument("store", metavar="STORE|MODEL")
    add_common(p)
    return p


def _model_info(path) -> dict:
    from ooc_learn.model import class_text, load_model, model_format

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
             + (", classes " + ", ".join(class_text(c, meta.get("label_map", {}).get("names"))
                                        for c in info["classes"])
                if info["classes"] else ""),
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

    if args.memory is not None:  # checked for a model too, which needs no budget
        from ooc_learn.storage.budget import parse_size

        parse_size(args.memory)
    if os.path.isfile(args.store):
        if is_model_file(args.store):
            return _model_info(args.store)
        # a file is a model or nothing of ours: a damaged model (a zip or an HDF5 file) says
        # what is wrong with it
        from ooc_learn.model import load_model, model_container
        from ooc_learn.storage.errors import UsageError

        if model_container(args.store):
            load_model(args.store)
        raise UsageError(f"{args.store} is neither a store (a folder) nor a model file.",
                         "Pass a store written by ooc-ingest or a model written by "
                         "ooc-train.")
    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store

    if is_sharded_store(args.store, damaged=True):
        return _sharded_info(ShardedStore(args.store), command_budget(args))
    with open_store(args.store, memory=command_budget(args)) as store:
        info = store.info()
    info["index"] = _index_info(store.path)
    meta = info["metadata"]
    lines = [f"store        {info['store']}",
             f"rows         {info['n_samples']}",
             f"features     {info['n_features']}",
             f"layout       {info['layout']} (nnz {info['nnz']}, density "
             f"{meta.get('density', 0):.4f})"
             + (f", X as {info['value_codes']} codes of "
                f"{meta.get('value_codes', {}).get('distinct', '?')} values"
                if info.get("value_codes") else ""),
             f"task         {info['task']}  labels {json.dumps(meta.get('label_map', {}))}",
             f"blocks       {info['n_blocks']} ({info['block_rows']['min']}-"
             f"{info['block_rows']['max']} rows)",
             f"index        {_index_line(info['index'], store.path)}",
             f"data.h5      {info['data_bytes']} bytes",
             f"memory       a block {format_size(info['memory']['block_bytes'], up=True)}, "
             f"every row {format_size(info['memory']['all_rows_bytes'], up=True)} (data "
             f"alone: --memory also holds the process, ~150M)"]
    for s in meta.get("sources", []):
        digest = (f"  sha256 {s['sha256']}" if s.get("sha256") else
                  f"  sha256 of its {s['piece_rows']}-row pieces {s.get('sha256_pieces')}"
                  if s.get("sha256_pieces") else "")  # arrays from memory have none
        size = f"  {s['bytes']} bytes" if s.get("bytes") is not None else ""
        lines.append(f"source       {s.get('name')}  {s.get('rows')} rows{size}{digest}")
    return {"json": info, "text": "\n".join(lines)}


def _index_info(store_path) -> dict:
    from ooc_learn.index import index_summary
    from ooc_learn.storage.format import INDEX_DIR

    return index_summary(os.path.join(store_path, INDEX_DIR))


def _index_line(index: dict, store_path, shard: bool = False) -> str:
    if index["state"] == "ok":
        return (f"yes (width {index['width']}, leaf size {index['leaf_size']}, "
                f"{index['n_nodes']} nodes, {index['n_leaves']} leaves)")
    if index["state"] == "missing":
        return "no" if shard else (f"no (IBCD, the default solver, needs one: ooc-index "
                                   f"{store_path})")
    return (f"damaged ({index['reason']}): rebuild it with ooc-index {store_path} "
            f"--overwrite")


def _sharded_info(sh, budget) -> dict:
    """The manifest, and of each shard on this machine what ``ooc-info SHARD`` says of its
    memory and index; the memory of the whole is the largest block and every shard's rows."""
    from ooc_learn.storage.budget import format_size
    from ooc_learn.storage.store import open_store

    info = dict(sh.manifest, store=str(sh.path), shards=[])
    for k, entry in enumerate(sh.shards):
        path = sh.shard_path(k)
        shard = dict(entry, path=str(path), present=os.path.isdir(path))
        if shard["present"]:
            with open_store(path, memory=budget) as store:
                shard["memory"] = store.info()["memory"]
            shard["index"] = _index_info(path)
        info["shards"].append(shard)
    here = [s for s in info["shards"] if s["present"]]
    info["memory"] = ({"block_bytes": max(s["memory"]["block_bytes"] for s in here),
                       "all_rows_bytes": sum(s["memory"]["all_rows_bytes"] for s in here)}
                      if len(here) == len(info["shards"]) else None)
    lines = [f"sharded store {info['store']}",
             f"rows         {sh.n_samples}",
             f"features     {sh.n_features}",
             f"layout       {sh.layout}",
             f"task         {sh.task}  labels {json.dumps(sh.label_map)}",
             f"shards       {sh.n_shards}"]
    if info["memory"] is not None:
        lines.append(f"memory       a block {format_size(info['memory']['block_bytes'], up=True)}"
                     f", every row {format_size(info['memory']['all_rows_bytes'], up=True)} "
                     f"(a worker holds its shards' rows only)")
    for k, s in enumerate(info["shards"]):
        where = (f"  index {_index_line(s['index'], s['path'], shard=True)}" if s["present"] else
                 "  (not on this machine)")
        lines.append(f"shard {k:<6} {s['n_samples']} rows, {s['n_blocks']} blocks  "
                     f"{s['path']}{where}")
    return {"json": info, "text": "\n".join(lines)}


def info_main(argv=None) -> int:
    return run_command("ooc-info", _info_parser(), _info_body, argv)


def _check_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ooc-check",
        description="Verify a store: its header, every block against its digest, the row "
                    "pointers and column indices, and the index's files and records. Exit 0 "
                    "when whole, 2 when damaged (one line for each fault).",
        epilog="example:  ooc-check a9a.store --json")
    p.add_argument("store", metavar="STORE")
    add_common(p)
    return p


def _check_body(args):
    from tqdm.auto import tqdm

    from ooc_learn.storage.errors import StoreFormatError
    from ooc_learn.storage.integrity import REBUILD_HINT
    from ooc_learn.storage.store import open_store

    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store

    # a sharded store: each shard's store in turn
    sharded = ShardedStore(args.store) if is_sharded_store(args.store, damaged=True) else None
    paths = sharded.shard_paths if sharded is not None else [args.store]
    budget = command_budget(args)
    problems, blocks, digests, unindexed, bad_index = [], 0, True, [], []
    for k, path in enumerate(paths):
        with open_store(path, memory=budget) as store:
            if sharded is not None:  # the shard the manifest lists, not another store
                problems += sharded.shard_problems(k, store)
            with tqdm(total=store.n_blocks, desc="check", unit="block", disable=args.quiet,
                      leave=False) as bar:
                problems += store.verify(progress=lambda b: bar.update(1))
            if store.has_index:
                from ooc_learn.index.forest import open_forest

                try:
                    with open_forest(store) as forest:
                        forest.verify()
                except OOCError as exc:
                    problems.append(exc.message)
                    bad_index.append(str(path))
            else:  # whole, and not what ooc-train's IBCD can train from: said, not refused
                unindexed.append(str(path))
            blocks += store.n_blocks
            digests &= store.has_digests
    if problems:
        # the index alone damaged: rebuilt from the data, which are whole (ooc-train says so)
        index_only = len(problems) == len(bad_index)
        raise StoreFormatError("\n".join(problems), (
            f"The data are whole: rebuild the index with ooc-index {bad_index[0]} --overwrite"
            + (" (and the other shards' likewise)." if len(bad_index) > 1 else ".")
            if index_only else REBUILD_HINT))
    out = {"store": args.store, "ok": True, "digests": digests, "blocks": blocks,
           "indexed": not unindexed}
    if len(paths) > 1:
        out["shards"] = len(paths)
    shards = f"{len(paths)} shards, " if len(paths) > 1 else ""
    text = f"{args.store}: whole ({shards}{blocks} blocks, " + (
        "digests checked)" if digests else "structure only: written before block digests)")
    if unindexed:
        more = " and the other shards without one" if len(unindexed) > 1 else ""
        text += (f"; no metric-forest index (IBCD, the default solver, needs one: ooc-index "
                 f"{unindexed[0]}{more})")
    return {"json": out, "text": text}


def check_main(argv=None) -> int:
    return run_command("ooc-check", _check_parser(), _check_body, argv)
