"""Passes 2 and 3 of ingest: the buckets of pass 1 become the store's blocks.

Pass 2 deals again every bucket larger than a block (:func:`redeal`: the first chunk
underestimated the source). Pass 3 (:func:`write_store`) plans the blocks from the buckets
(:func:`~ooc_learn.storage.shuffle.plan_blocks`), loads the buckets of one block at a time
(each bucket file read once, a shared one split at random), orders the block's rows (the
index's leaf order when ``block_orderer`` builds one, else a random permutation) and writes it
as block c of ``data.h5``, or of shard c mod K of a sharded store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .arrays import row_sqnorms
from .ingest_parse import IOCount, Parsed
from .ingest_plan import Shape
from .sharded import shard_name, write_manifest
from .shuffle import BucketWriter, Dealer, deal_chunk, iter_records, plan_blocks, read_bucket
from .stop import check_stop
from .store import Store
from .writer import StoreWriter

__all__ = ["StoreOutput", "redeal", "store_metadata", "write_store"]


def redeal(tmp: Path, buckets: list, max_rows: int, min_rows: int, *, buffer_bytes, rng,
            counter: IOCount) -> tuple[list, int]:
    """Deal every bucket of more than ``max_rows`` rows into sub-buckets of at most
    ``min_rows`` (so no bucket spans more than two blocks); ``(buckets, how many)``."""
    out, redealt = [], 0
    for i, (path, rows) in enumerate(buckets):
        if rows <= max_rows:
            out.append((path, rows))
            continue
        k = -(-rows // min_rows)
        writer = BucketWriter(tmp / "redeal" / f"{i:06d}", k, buffer_bytes=buffer_bytes)
        dealer = Dealer(k, rng)
        for rec in iter_records(path, counter.add_read):
            indptr, indices, values = rec.csr()
            writer.add(dealer.deal(rec.n_rows), rec.labels, rec.row_ids, indptr, indices,
                       values)
        writer.close()
        path.unlink()
        counter.written += writer.bytes_written
        out.extend((writer.path(j), int(writer.rows[j])) for j in range(k))
        redealt += 1
    return out, redealt


def _load_bucket(path, rows: int, blocks, counts, pending: dict, *, shape: Shape, rng,
                 counter: IOCount, drop=None) -> None:
    """Read one bucket and hand its rows, in the store's layout, to the blocks of the plan
    (a random share to each when it is shared); ``drop(path)`` deletes the file (default:
    at once)."""
    labels, row_ids, X = read_bucket(path, shape.layout, shape.d, shape.base, counter.add_read)
    if labels.shape[0] != rows:  # pragma: no cover - the writer counted what it wrote
        raise OSError(f"bucket file {path} holds {labels.shape[0]} rows, expected {rows}")
    if len(blocks) == 1:
        pending.setdefault(int(blocks[0]), []).append((labels, row_ids, X))
    else:
        dest = deal_chunk(counts.copy(), rows, rng)
        for i in range(len(blocks)):
            sel = np.flatnonzero(dest == i)
            pending.setdefault(int(blocks[i]), []).append((labels[sel], row_ids[sel], X[sel]))
    (drop or (lambda q: q.unlink()))(path)


def _stack(parts, layout: str):
    labels = np.concatenate([q[0] for q in parts])
    row_ids = np.concatenate([q[1] for q in parts])
    if len(parts) == 1:
        X = parts[0][2]
    elif layout == "dense":
        X = np.concatenate([q[2] for q in parts])
    else:
        X = sp.vstack([q[2] for q in parts], format="csr")
    if layout == "csr":
        X.sort_indices()
    return labels, row_ids, X


class StoreOutput:
    """The store ingest writes, block after block: ``data.h5`` with the orderer's files (the
    index), or with ``shards`` K one such store per shard, block c going to shard c mod K as
    its block c // K, and the manifest written last (see :mod:`~ooc_learn.storage.sharded`).

    ``block_sizes`` are the rows of every block, in order. ``nnz`` None: counted as the
    blocks come. Labels given to :meth:`write` as None are set later by :meth:`set_labels`
    (the direct ingest learns the task only after its last pass).
    """

    def __init__(self, tmp: Path, block_sizes, *, shape: Shape, task, metadata: dict, nnz,
                 block_orderer, seed: int, shards: int | None, value_codes="auto"):
        self.tmp, self.shape, self.shards = tmp, shape, shards
        K = self.K = shards or 1
        block_sizes = np.asarray(block_sizes, np.int64)
        self.writers, self.forests = [], []
        try:
            for k in range(K):
                blocks = np.arange(k, block_sizes.size, K)
                local = np.zeros(blocks.size + 1, np.int64)
                np.cumsum(block_sizes[blocks], out=local[1:])
                where, meta, nnz_k = tmp, metadata, nnz
                if shards:
                    where = tmp / shard_name(k)
                    meta = dict(metadata, nnz=None,
                                shard={"index": k, "of": K, "blocks": blocks.tolist()},
                                params=dict(metadata["params"], n_blocks=int(blocks.size),
                                            shard=k, shards=K))
                    nnz_k = None  # counted as the blocks come
                self.writers.append(StoreWriter(where, n_samples=int(local[-1]),
                                                n_features=shape.d, nnz=nnz_k,
                                                layout=shape.layout, block_offsets=local,
                                                task=task, metadata=meta,
                                                value_codes=value_codes))
                if block_orderer is not None:
                    self.forests.append(block_orderer(where, n_blocks=int(blocks.size),
                                                      n_samples=int(local[-1]),
                                                      n_features=shape.d, seed=seed + k))
        except BaseException:
            self.abort()
            raise

    def write(self, c: int, X, y, row_ids, rng, sq=None, nnz=None) -> np.ndarray:
        """Order block ``c``'s rows (its tree's leaf order, else at random), write them, and
        return the order (``sq``, ``nnz``: the rows' float32 squared norms and a dense
        block's non-zeros, where the caller has them)."""
        if sq is None:
            with np.errstate(over="ignore"):
                sq = row_sqnorms(X).astype(np.float32)
        if not np.isfinite(sq).all():  # every solver divides by it: refused, not inf
            from .errors import NonFiniteError

            row = int(row_ids[np.flatnonzero(~np.isfinite(sq))[0]])
            raise NonFiniteError(
                f"Row {row} of the sources (0-based, in their order) has a squared norm "
                "beyond float32's range: its values reach ~1.8e19 or more.",
                "Scale the features (e.g. to [0, 1]) before ingesting.")
        k, b = c % self.K, c // self.K
        if self.forests:
            perm = self.forests[k].order(b, int(self.writers[k].block_offsets[b]), X, sq)
        else:
            perm = rng.permutation(X.shape[0])
        self.writers[k].write_block(b, X[perm], None if y is None else y[perm], row_ids[perm],
                                    sq[perm], nnz=nnz)
        return perm

    def set_labels(self, c: int, y, task: str | None = None) -> None:
        """The stored labels of block ``c`` (in its written order), where :meth:`write` had
        none; ``task``, where given, is the store's (it decides the labels' type)."""
        writer = self.writers[c % self.K]
        if task is not None:
            writer.task = task
        writer.set_labels(c // self.K, y)

    def finish(self, counter: IOCount, **metadata) -> None:
        """Close the index, stamp and close the stores (``metadata`` updates theirs: what the
        last pass decided), and write the manifest of a sharded store."""
        for forest in self.forests:
            forest.close()
        self.forests = []
        for writer in self.writers:
            for key, value in metadata.items():
                if key == "task":
                    writer.task = value
                    writer.metadata["params"]["task"] = value
                elif not (key == "nnz" and self.shards):  # a shard counts its own
                    writer.metadata[key] = value
            writer.finish()
            counter.written += writer.spooled_bytes
            counter.read += writer.spooled_bytes
        if self.shards:
            listed = []
            for k, writer in enumerate(self.writers):
                with Store(writer.directory) as st:
                    listed.append({"path": shard_name(k), "n_samples": st.n_samples,
                                   "n_blocks": st.n_blocks, "nnz": st.nnz,
                                   "fingerprint": st.fingerprint()})
            w = self.writers[0]
            write_manifest(self.tmp, listed, n_features=self.shape.d, task=w.task,
                           layout=self.shape.layout, label_map=w.metadata["label_map"])

    def abort(self) -> None:
        for writer in self.writers:
            writer.abort()
        for forest in self.forests:
            if hasattr(forest, "abort"):
                forest.abort()
        self.forests = []


def store_metadata(p: Parsed, shape: Shape, *, task, label_map, seed, positive_label,
                   n_features) -> dict:
    """The metadata every ingest writes into its store (``data.h5`` and ``meta.json``)."""
    return {
        "label_map": label_map, "sources": p.sources, "formats": sorted(p.formats),
        "feature_names": p.feature_names,  # a CSV header's, where every source has it
        "label_name": p.label_name if p.feature_names else None,  # its label column's
        # a LIBSVM file's index base; columns (CSV, arrays) have none
        "zero_based": shape.base == 0 if "libsvm" in p.formats else None, "nnz": int(p.nnz), "density": shape.density,
        "params": {"n_blocks": int(shape.n_blocks), "seed": int(seed), "layout": shape.layout,
                   "task": task, "positive_label": positive_label,
                   "n_features": n_features},
    }


def write_store(tmp: Path, p: Parsed, shape: Shape, buckets: list, *, task, label_map,
                 mapper, seed, positive_label, n_features, block_orderer, rng, counter,
                 progress, shards: int | None = None, value_codes="auto") -> None:
    """Pass 3: plan the blocks from the buckets, then build block after block from them
    (each bucket read once, a shared one split at random) and write it into a
    :class:`StoreOutput`."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    plan = plan_blocks([r for _, r in buckets], shape.n_blocks)
    offsets = np.zeros(shape.n_blocks + 1, np.int64)
    np.cumsum(plan.block_sizes, out=offsets[1:])
    metadata = store_metadata(p, shape, task=task, label_map=label_map, seed=seed,
                              positive_label=positive_label, n_features=n_features)
    out = StoreOutput(tmp, plan.block_sizes, shape=shape, task=task, metadata=metadata,
                      nnz=None if shards else p.nnz, block_orderer=block_orderer, seed=seed,
                      shards=shards, value_codes=value_codes)
    starts = np.concatenate(([0], np.cumsum([r for _, r in buckets])))
    pending: dict = {}
    nxt = 0
    # read buckets are deleted by a side thread: freeing a bucket file's extents is slow, and
    # the GIL is released meanwhile
    dropped = []
    try:
        with ThreadPoolExecutor(1) as unlinker, tqdm(
                total=shape.n_blocks, unit="block", desc="write", disable=not progress,
                leave=False) as bar:

            def drop(path):
                dropped.append(unlinker.submit(path.unlink))

            for c in range(shape.n_blocks):
                check_stop()  # a safe point for SIGINT / SIGTERM, one a block
                while nxt < len(buckets) and starts[nxt] < offsets[c + 1]:
                    path, rows = buckets[nxt]
                    if rows:
                        _load_bucket(path, rows, plan.bucket_blocks[nxt],
                                     plan.bucket_counts[nxt], pending, shape=shape, rng=rng,
                                     counter=counter, drop=drop)
                    nxt += 1
                labels, row_ids, X = _stack(pending.pop(c), shape.layout)
                out.write(c, X, mapper(labels).astype(np.float64), row_ids, rng)
                del X
                bar.update(1)
        for f in dropped:
            f.result()  # an unlink that failed is an error like any other
        out.finish(counter)
    except BaseException:
        out.abort()
        raise
