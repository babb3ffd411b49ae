"""A sharded store: K complete stores (each with its own index) and a manifest.

``ooc-ingest SOURCE -o OUT --shards K`` deals the source's rows into blocks as a store does,
then writes every K-th block into shard ``OUT/shard-k`` (block c into shard c mod K), each a
store of its own (``data.h5``, ``meta.json``, its index), and ``OUT/shards.json`` last. The
shards can then live on the disks of the machines that train on them: CoCoA+
(``ooc-train OUT --solver cocoa --workers N`` / ``--scheduler ADDRESS``) runs each shard's
round on a worker that sees that shard's path, and ships only w and its update.

The manifest (JSON)::

    {"format": "ooc-learn-sharded-store", "format_version": 1,
     "n_samples": N, "n_features": d, "task": ..., "layout": ..., "label_map": {...},
     "shards": [{"path": "shard-0", "n_samples": n_0, "n_blocks": b_0,
                 "fingerprint": ...}, ...]}

A shard's ``path`` is relative to the manifest's folder unless absolute: a user who moves
shard k to a worker's local disk (the same absolute path on every machine that should train
it) writes that path into the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ParameterError, StoreFormatError

MANIFEST_FILE = "shards.json"
SHARDED_FORMAT = "ooc-learn-sharded-store"
SHARDED_VERSION = 1

__all__ = ["MANIFEST_FILE", "SHARDED_FORMAT", "ShardedStore", "is_sharded_store",
           "shard_name", "write_manifest"]


def shard_name(k: int) -> str:
    return f"shard-{k}"


def is_sharded_store(path, *, damaged: bool = False) -> bool:
    """Whether ``path`` is a folder holding a sharded store's manifest; with ``damaged``,
    also one whose manifest cannot be read but whose folder holds no store of its own (the
    commands then say what is wrong with the manifest, not that no data.h5 is there)."""
    try:
        with open(Path(path) / MANIFEST_FILE) as fh:
            return json.load(fh).get("format") == SHARDED_FORMAT
    except FileNotFoundError:
        return False
    except (OSError, ValueError, AttributeError):
        from .format import DATA_FILE

        return (damaged and (Path(path) / MANIFEST_FILE).is_file()
                and not (Path(path) / DATA_FILE).exists())


def write_manifest(directory, shards: list[dict], *, n_features: int, task: str, layout: str,
                   label_map) -> dict:
    """Write ``shards.json`` in ``directory`` (the shards' stores complete already)."""
    manifest = {"format": SHARDED_FORMAT, "format_version": SHARDED_VERSION,
                "n_samples": int(sum(s["n_samples"] for s in shards)),
                "n_features": int(n_features), "task": task, "layout": layout,
                "label_map": label_map, "shards": shards}
    with open(Path(directory) / MANIFEST_FILE, "w") as fh:
        json.dump(manifest, fh, indent=1)
    return manifest


class ShardedStore:
    """The manifest of a sharded store, read (nothing of the shards is opened here)."""

    def __init__(self, path):
        self.path = Path(path)
        where = self.path / MANIFEST_FILE
        try:
            with open(where) as fh:
                m = json.load(fh)
        except FileNotFoundError:
            raise ParameterError(f"{self.path} is not a sharded store (no {MANIFEST_FILE}).",
                                 "Make one with ooc-ingest SOURCE -o OUT --shards K.") from None
        except ValueError as e:
            raise StoreFormatError(f"The manifest {where} is not valid JSON ({e}).",
                                   "Ingest the source again with --shards.") from None
        if not isinstance(m, dict) or m.get("format") != SHARDED_FORMAT:
            raise StoreFormatError(f"The manifest {where} does not name the format "
                                   f"{SHARDED_FORMAT!r}.", "Ingest again with --shards.")
        if m.get("format_version") != SHARDED_VERSION:
            raise StoreFormatError(
                f"The manifest {where} has format_version {m.get('format_version')!r}; this "
                f"ooc-learn reads version {SHARDED_VERSION}.", "Ingest again with --shards.")
        shards = m.get("shards")
        if not isinstance(shards, list) or not shards or not all(
                isinstance(s, dict) and isinstance(s.get("path"), str) for s in shards):
            raise StoreFormatError(f"The manifest {where} lists no shards (field 'shards': "
                                   f"a list of {{'path': ...}}).", "Ingest again with --shards.")
        self.manifest = m
        self.n_samples, self.n_features = int(m["n_samples"]), int(m["n_features"])
        self.task, self.layout, self.label_map = m["task"], m["layout"], m["label_map"]
        self.shards = shards
        self.ingest_stats = None

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def shard_path(self, k: int) -> Path:
        """Shard k's store folder (the manifest's path, relative to the manifest's folder)."""
        p = Path(self.shards[k]["path"])
        return p if p.is_absolute() else (self.path / p).absolute()

    @property
    def shard_paths(self) -> list[Path]:
        return [self.shard_path(k) for k in range(self.n_shards)]

    @property
    def n_blocks(self) -> int:
        return sum(int(s.get("n_blocks", 0)) for s in self.shards)

    def shard_problems(self, k: int, store) -> list[str]:
        """What differs between shard k's open ``store`` and the manifest's entry for it
        (rows, features, fingerprint): a shard replaced by other data was read as if it
        were the one listed (rows counted twice, a wrong score, exit 0)."""
        s, out = self.shards[k], []
        if "n_samples" in s and store.n_samples != int(s["n_samples"]):
            out.append(f"{store.n_samples} rows where the manifest lists {s['n_samples']}")
        if store.n_features != self.n_features:
            out.append(f"{store.n_features} features where the manifest lists "
                       f"{self.n_features}")
        if s.get("fingerprint") and store.fingerprint() != s["fingerprint"]:
            out.append("other data than the manifest names (its fingerprint differs)")
        return [f"shard {k} ({self.shard_path(k)}): {p}" for p in out]

    def fingerprint(self) -> str:
        """One text naming every shard's fingerprint (a model records what it was fit on)."""
        return ";".join(str(s.get("fingerprint")) for s in self.shards)

    def close(self) -> None:  # nothing held open; a Store's interface
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
