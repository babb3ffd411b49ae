"""One linear SVM over a store whose blocks are spread over Dask workers: CoCoA+ (Ma et al.
2015, "Adding vs. averaging in distributed primal-dual optimization").

The shards are a sharded store's (``ooc-ingest --shards K``: K stores, each where the workers
that train it can read it) or one store's blocks cut into K runs of consecutive blocks. A
shard runs on a worker that sees its path (shard p prefers worker p mod W where every worker
sees every shard; a worker that reads only its own shard keeps only that in its cache and page
cache). The dual variables of a shard live on its worker between rounds. Each round:

1. the driver sends w (d + 1 floats) to every shard's task;
2. each task measures, at that w, its rows' loss and its alphas' sums (for the duality gap),
   then runs ``epochs`` passes of local dual CD on CoCoA+'s sub-problem with sigma' = K
   (``_kernels.cocoa_epoch``: the same coordinate step as LIBLINEAR's dual CD, the curvature
   scaled by K and w seen as ``w + K dw``) and returns dw (d + 1 floats);
3. the driver adds every dw to w (CoCoA+ "adding", gamma = 1).

So a round ships one w to and one dw from each shard: 2 K 8 (d + 1) bytes. The duality gap
``P(w) - D(alpha)`` at the round's start w bounds ``P(w) - P*``; the run stops when it falls
below ``eps`` times ``P(w)`` (relative) and returns that w. The primal
``P(w) = |w|^2 / 2 + C sum_i L(y_i w^T [x_i, bias])`` and dual are LIBLINEAR's (``-s 3`` hinge,
``-s 1`` squared hinge), so the optimum is that of ``ooc-train --solver dcd``.

A shard whose worker died loses its alphas: the driver takes its part of w back out and the
shard starts again from alpha = 0 (w stays the sum of every shard's part, so the gap stays
valid). IBCD's index is not used yet: each round's local passes read the whole shard.
"""

from __future__ import annotations

import math
import secrets
import time

import numpy as np

from ooc_learn.storage.errors import ParameterError

__all__ = ["train_cocoa"]

# (run, shard) -> that shard's alphas and its rows' squared norms (read once, not each pass),
# on the worker that holds it
_STATE: dict = {}


def _shard_round(run: str, path: str, shard: int, blocks, w, fresh: bool, sigma: float,
                 C: float, loss: str, bias: float, epochs: int, seed: int):
    """On a worker: one CoCoA+ round of shard ``shard`` (see the module docstring)."""
    from ooc_learn.distributed import keep_open, task_budget
    from ooc_learn.solvers import _kernels as K
    from ooc_learn.storage.arrays import kernel_args
    from ooc_learn.storage.store import open_store

    keep_open(path)
    with open_store(path, memory=task_budget()) as st:
        off = np.asarray(st.block_offsets, dtype=np.int64)
        sizes = [int(off[b + 1] - off[b]) for b in blocks]
        held = _STATE.get((run, shard))
        if held is None:
            if not fresh:
                return {"lost": True}
            held = _STATE[(run, shard)] = (np.zeros(sum(sizes)), [
                np.asarray(st.sqnorms(int(off[b]), int(off[b + 1])), dtype=np.float64)
                for b in blocks])
        alpha, sqnorms = held
        sum_a, sum_a2 = float(alpha.sum()), float(alpha @ alpha)  # the dual's, at the start
        upper, diag = (C, 0.0) if loss == "hinge" else (math.inf, 1.0 / (2.0 * C))
        w = np.asarray(w, dtype=np.float64)
        w_loc, dw = w.copy(), np.zeros_like(w)
        state = np.array([np.uint64(seed) ^ np.uint64(shard * 0x9E3779B9 + 1)], np.uint64)
        loss_sum = updates = 0.0
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        for e in range(epochs):
            for k, b in enumerate(blocks):
                X, y, _ = st.read_block(int(b))
                args = kernel_args(X)
                yf = np.asarray(y, dtype=np.float64)
                rows = np.arange(sizes[k], dtype=np.int64)
                if e == 0:  # the loss at the round's w, before this shard moves it
                    z = np.empty(sizes[k])
                    K.rows_dot(*args, float(bias), rows, w, z)
                    margin = np.maximum(0.0, 1.0 - yf * z)
                    loss_sum += float(margin.sum() if loss == "hinge" else (margin ** 2).sum())
                a = alpha[starts[k]:starts[k + 1]]
                updates += K.cocoa_epoch(*args, float(bias), yf, sqnorms[k], rows, a, w_loc, dw,
                                         float(sigma), upper, diag, state)
        return {"dw": dw, "loss": loss_sum, "sum_alpha": sum_a, "sum_alpha2": sum_a2,
                "updates": int(updates)}


def _drop(run: str) -> None:
    for key in [k for k in _STATE if k[0] == run]:
        del _STATE[key]


def _cut(client, path: str, nb: int, shards) -> list:
    """One store's blocks cut into K shards of consecutive blocks: ``[(path, blocks)]``."""
    from ooc_learn.distributed import n_workers, shipped_path

    path = shipped_path(client, path)
    k = max(1, min(int(shards or n_workers(client)), nb))
    return [(path, p.tolist()) for p in np.array_split(np.arange(nb), k)]


def _place(client, paths) -> list:
    """``(workers, allow_other_workers)`` of each shard's tasks: its data stay where they are.

    A shard every worker sees (one machine, a shared file system) prefers worker p mod W and
    may move if that one is gone; a shard that only some workers see (their local disks) runs
    on those only. One that no worker sees is refused before any round.
    """
    from ooc_learn.distributed import stores_seen

    addrs = sorted(client.scheduler_info()["workers"])
    seen = stores_seen(client, set(paths))
    out = []
    for p, path in enumerate(paths):
        who = [a for a in addrs if a in seen[path]]
        if not who:
            raise ParameterError(f"No worker of the cluster sees the shard {path} (shard {p} "
                                 f"of {len(paths)}).", "Put each shard where a worker can read "
                                 "it at the manifest's path, or fix the path in shards.json.")
        if len(who) == len(addrs):
            out.append(([addrs[p % len(addrs)]], True))
        else:
            out.append((who, False))
    return out


def train_cocoa(store, client, *, shards: int | None = None, C: float = 1.0,
                loss: str = "hinge", bias: float = 1.0, eps: float = 1e-3,
                max_rounds: int = 200, epochs: int = 1, seed: int = 0, on_round=None):
    """Train the linear SVM of a binary store by CoCoA+ on a Dask cluster.

    Parameters
    ----------
    store : Store, ShardedStore or path (the workers must see the path; of a sharded store,
        each shard's path must be seen by the workers that train it)
    client : dask.distributed.Client
    shards : int, optional
        K, the shards of consecutive blocks of one store (default: the cluster's worker
        threads, at most the store's blocks). A sharded store has its own.
    C, loss, bias : LIBLINEAR's ``-c``, ``-s 3`` (hinge) / ``-s 1`` (sqhinge), ``-B``.
    eps : float
        Stop when the duality gap is at most ``eps`` times the primal objective.
    max_rounds, epochs : rounds, and local passes over its shard per round.

    Returns
    -------
    LinearModel
        ``meta["stats"]``: rounds, the duality gap of each round, converged, bytes shipped
        per round, seconds.
    """
    from ooc_learn.model import LinearModel
    from ooc_learn.storage.sharded import ShardedStore, is_sharded_store
    from ooc_learn.storage.store import open_data

    if loss not in ("hinge", "sqhinge"):
        raise ParameterError(f"CoCoA+ trains the hinge or squared hinge SVM. Got {loss!r}.",
                             "Use --loss hinge or sqhinge.")
    sharded = store if isinstance(store, ShardedStore) else (
        ShardedStore(store) if not hasattr(store, "read_block") and is_sharded_store(store)
        else None)
    if sharded is not None:
        if shards is not None and shards != sharded.n_shards:
            raise ParameterError(f"{sharded.path} is a store of {sharded.n_shards} shards; "
                                 f"--shards {shards} cuts one store.", "Drop --shards.")
        st, opened = sharded, False
    else:
        st, opened = open_data(store)
    try:
        if st.task != "binary":
            raise ParameterError(f"CoCoA+ trains a binary store; {st.path} holds a {st.task} "
                                 "task.", "Train multiclass stores one class per task "
                                 "(--workers without --solver cocoa).")
        d = st.n_features
        classes = LinearModel.classes_from_label_map(st.label_map)
        label_map, fingerprint = st.label_map, st.fingerprint()
        if sharded is not None:
            layout = [(str(sharded.shard_path(p)), list(range(int(s["n_blocks"]))))
                      for p, s in enumerate(sharded.shards)]
            path = str(sharded.path)
        else:
            path, nb = str(st.path), st.n_blocks
    finally:
        if opened:
            st.close()
    if sharded is None:
        layout = _cut(client, path, nb, shards)
        path = layout[0][0]  # absolute, as the tasks got it
    k = len(layout)
    placement = _place(client, [p for p, _ in layout])
    run = secrets.token_hex(6)
    w = np.zeros(d + 1)
    w_parts = np.zeros((k, d + 1))
    fresh = [True] * k
    gaps, duals, t0 = [], [], time.perf_counter()
    n_lost = 0
    converged = False
    try:
        for r in range(max_rounds):
            futs = [client.submit(_shard_round, run, layout[p][0], p, layout[p][1], w,
                                  fresh[p], float(k), float(C), loss, float(bias), int(epochs),
                                  int(seed) + r, workers=placement[p][0],
                                  allow_other_workers=placement[p][1], pure=False)
                    for p in range(k)]
            outs = [f.result() for f in futs]
            for f in futs:  # nothing of a finished round is kept on the cluster
                f.release()
            lost = [p for p, o in enumerate(outs) if o.get("lost")]
            n_lost += len(lost)
            for p in lost:  # its alphas are gone: its part of w goes too, it starts again
                w = w - w_parts[p]
                w_parts[p] = 0.0
                fresh[p] = True
            if lost:
                continue
            fresh = [False] * k
            ww = float(w @ w)
            primal = 0.5 * ww + C * sum(o["loss"] for o in outs)
            dual = (sum(o["sum_alpha"] for o in outs) - 0.5 * ww
                    - (sum(o["sum_alpha2"] for o in outs) / (4.0 * C)
                       if loss == "sqhinge" else 0.0))
            gap = primal - dual
            gaps.append(gap)
            duals.append(dual)
            if on_round is not None:
                on_round({"round": r, "primal": primal, "dual": dual, "gap": gap})
            if gap <= eps * abs(primal):
                converged = True
                break
            for p, o in enumerate(outs):
                w_parts[p] += o["dw"]
            w = w_parts.sum(axis=0)
    finally:
        client.run(_drop, run)
    stats = {"rounds": len(gaps), "gaps": gaps, "duals": duals, "converged": converged,
             "shards_lost": n_lost,
             "outer_iterations": len(gaps), "shards": k, "objective": primal if gaps else None,
             "bytes_per_round": 2 * k * 8 * (d + 1), "seconds": time.perf_counter() - t0,
             "stop_reason": "the duality gap fell to eps of the primal" if converged
             else f"max_rounds ({max_rounds})"}
    return LinearModel.from_weights(w, bias=bias, classes=classes, solver="cocoa", loss=loss,
                                    C=C, eps=eps, store=path, store_fingerprint=fingerprint,
                                    label_map=label_map, stats=stats)
