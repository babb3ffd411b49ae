"""Damaged copies of a store, for the corruption tests and ``scripts/bench_fuzz_stores.py``.

Each corruption takes a store directory (a copy), changes it in place and returns a short
description. ``FLIPS`` flip one byte inside a dataset's stored values (every such byte must
be detected by ``ooc-check``); ``STRUCTURAL`` rewrite the HDF5 file or the index as a hostile
or broken writer would (consistent HDF5, wrong contents; digests recomputed where that makes
the damage harder to see); ``truncate`` cuts ``data.h5``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from ooc_learn.storage.integrity import HASHED, block_digests

__all__ = ["flip_byte", "truncate", "STRUCTURAL", "corpus"]


def _data(store) -> Path:
    return Path(store) / "data.h5"


def flip_byte(store, name: str, rng) -> str:
    """Flip one bit pattern (xor 0xFF) of one byte of dataset ``name``'s stored values (of
    ``X_values``, one of the codes in use: the others decode nothing)."""
    with h5py.File(_data(store), "r") as f:
        ds = f[name]
        offset, size = ds.id.get_offset(), ds.id.get_storage_size()
        if name == "X_values":
            size = min(size, 4 * int(ds.attrs["distinct"]))
    if offset is None or size == 0:
        return f"{name}: empty, nothing to flip"
    pos = offset + int(rng.integers(size))
    with open(_data(store), "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0xFF]))
    return f"{name}: byte {pos - offset} of {size} flipped"


def truncate(store, fraction: float) -> str:
    p = _data(store)
    size = p.stat().st_size
    os.truncate(p, int(size * fraction))
    return f"data.h5 cut to {fraction:.3f} of {size} bytes"


def _rehash(f) -> None:
    """Recompute the block digests from what the file now holds (a hostile writer would)."""
    if "block_hash" not in f:
        return
    layout = str(f.attrs["layout"])
    off = f["block_offsets"][:]
    h = f["block_hash"][:]
    table = f["X_values"][:] if "X_values" in f else None  # value codes
    for b in range(len(off) - 1):
        lo, hi = int(off[b]), int(off[b + 1])
        parts = {k: f[k][lo:hi] for k in ("y", "row_id", "sqnorm", "X") if k in f}
        if table is not None and "X" in parts:  # the digest is of the codes' values
            parts["X"] = table[parts["X"]]
        if layout == "csr":
            ip = f["indptr"][lo:hi + 1]
            parts.update(indptr=ip, indices=f["indices"][int(ip[0]):int(ip[-1])],
                         data=f["data"][int(ip[0]):int(ip[-1])])
        h[b] = block_digests(parts, layout)
    f["block_hash"][...] = h


def _edit(fn, rehash=False):
    def run(store):
        with h5py.File(_data(store), "r+") as f:
            out = fn(f)
            if rehash:
                _rehash(f)
        return out
    return run


def _set_attr(name, value):
    def fn(f):
        f.attrs[name] = value
        return f"attribute {name} = {value!r}"
    return fn


def _del(name):
    def fn(f):
        del f[name]
        return f"dataset {name} removed"
    return fn


def _replace(name, make):
    def fn(f):
        old = f[name][:]
        del f[name]
        f[name] = make(old)
        return f"dataset {name} replaced"
    return fn


def _poke(name, index, value):
    def fn(f):
        if name not in f or f[name].shape[0] <= abs(index):
            return f"{name}: absent"
        f[name][index] = value
        return f"{name}[{index}] = {value}"
    return fn


def _index_file(name, change):
    def run(store):
        p = Path(store) / "index.lmdb" / name
        if not p.exists():
            return f"index {name}: absent"
        change(p)
        return f"index {name} damaged"
    return run


def _flip_file(p: Path):
    data = bytearray(p.read_bytes())
    if data:
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))


def _mid(f, name):
    return max(1, f[name].shape[0] // 2)


STRUCTURAL = {
    "metadata not JSON": _edit(_set_attr("metadata", "{not json")),
    "metadata a list": _edit(_set_attr("metadata", "[1, 2]")),
    "n_samples too large": _edit(lambda f: _set_attr("n_samples", int(f.attrs["n_samples"]) + 7)(f)),
    "n_features negative": _edit(_set_attr("n_features", -3)),
    "layout unknown": _edit(_set_attr("layout", "columnar")),
    "format version 99": _edit(_set_attr("format_version", 99)),
    "not complete": _edit(_set_attr("complete", False)),
    "format attribute gone": _edit(lambda f: f.attrs.__delitem__("format") or "format gone"),
    "y missing": _edit(_del("y")),
    "row_id missing": _edit(_del("row_id")),
    "y as integers": _edit(_replace("y", lambda a: a.astype(np.int64))),
    "y one row short": _edit(_replace("y", lambda a: a[:-1])),
    "block_offsets decreasing": _edit(_replace("block_offsets",
                                               lambda a: np.r_[a[:1], a[1:][::-1]])),
    "block_offsets past the end": _edit(_replace("block_offsets",
                                                 lambda a: np.r_[a[:-1], a[-1] + 50])),
    "block_offsets one short": _edit(_replace("block_offsets", lambda a: a[:-1])),
    "block_offsets as floats": _edit(_replace("block_offsets", lambda a: a.astype(float))),
    "block_hash wrong shape": _edit(_replace("block_hash", lambda a: a[:, :1])),
    "indptr decreasing (digests redone)": _edit(
        lambda f: _poke("indptr", _mid(f, "indptr") if "indptr" in f else 1, 0)(f), True),
    "indptr past nnz (digests redone)": _edit(
        lambda f: _poke("indptr", _mid(f, "indptr") if "indptr" in f else 1,
                        2 ** 40)(f), True),
    "indptr last entry wrong": _edit(lambda f: _poke("indptr", -1, 1)(f)),
    "column index too large (digests redone)": _edit(
        lambda f: _poke("indices", _mid(f, "indices") if "indices" in f else 1,
                        2 ** 30)(f), True),
    "column index negative (digests redone)": _edit(
        lambda f: _poke("indices", 0, -5)(f), True),
    "index data.mdb flipped": _index_file("data.mdb", _flip_file),
    "index data.mdb cut": _index_file("data.mdb", lambda p: os.truncate(p, p.stat().st_size // 3)),
    "index manifest not JSON": _index_file("manifest.json", lambda p: p.write_text("{")),
    "index manifest gone": _index_file("manifest.json", lambda p: p.unlink()),
    "index data.mdb gone": _index_file("data.mdb", lambda p: p.unlink()),
    "data.h5 gone": lambda s: (Path(s, "data.h5").unlink(), "data.h5 removed")[1],
    "data.h5 replaced by text": lambda s: (Path(s, "data.h5").write_text("hello"), "text")[1],
    "meta.json garbled": lambda s: (Path(s, "meta.json").write_text("{x"), "meta.json")[1],
}
# what leaves a store that still works (the damage is to a copy nothing reads)
BENIGN = {"meta.json garbled"}


def corpus(store, out, rng, flips_per_dataset: int = 2,
           cuts=(0.0, 0.01, 0.3, 0.7, 0.999)):
    """Damaged copies of ``store`` under ``out``: ``[(path, kind, description, benign)]``
    with kind "flip", "cut" or "structural"."""
    import shutil

    store, out = Path(store), Path(out)
    with h5py.File(_data(store), "r") as f:
        names = [k for k in HASHED[str(f.attrs["layout"])] if k in f]
        names += ["X_values"] if "X_values" in f else []  # checked by X's digests
    made = []

    def copy(tag):
        dst = out / f"{len(made):04d}-{tag}"
        shutil.copytree(store, dst)
        return dst

    for name in names:
        for _ in range(flips_per_dataset):
            dst = copy(f"flip-{name}")
            made.append((dst, "flip", flip_byte(dst, name, rng), False))
    for c in cuts:
        dst = copy("cut")
        made.append((dst, "cut", truncate(dst, c), False))
    for label, fn in STRUCTURAL.items():
        dst = copy("s")
        desc = fn(dst)
        made.append((dst, "structural", f"{label}: {desc}", label in BENIGN
                     or "absent" in str(desc)))
    return made


def describe(made) -> str:
    return json.dumps([(str(p), k, d, b) for p, k, d, b in made], indent=1)
