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

**Working sets** (IBCD's active set, Yen et al. 2013 §3, applied to each shard's local
problem). A *full* round reads every row of the shard: the loss above, one pass of local dual
CD, and the rows nearest the margin (alpha > 0 first, then y w^T x < 1 + ``WORK_BAND``, as
many as ``WORK_SHARE`` of the worker's budget holds) kept resident as the shard's working
set; its other passes run over that set. The rounds that follow run over the working sets
only and read nothing but the index's leaves (below): any subset of a shard's coordinates is
a valid CoCoA+ local solver, so the dual still rises every round; the loss over the sets is
a lower bound of P(w), so the gap it gives only tells when a full round should confirm it.
A full round comes next where that gap falls below ``eps``, or after ``CHECK_EVERY`` rounds;
only a full round's gap stops the run. Under a cap that holds less than the shard, this
replaces ``epochs`` reads of it a round by one every few rounds.

**The index** (where the store has one). A round over the working sets first asks the
shard's index (its blocks' trees) for up to ``QUERY_ROWS`` rows outside the set with
y w^T x < 1, most violating first, examining at most ``QUERY_SHARE`` of the shard's rows
(IBCD's query step, eq. 10): they join the set, read as leaves, not as the shard. The index
cannot replace a full round: the gap needs every row's loss at w, which it gives only by
examining every row (asked for every row with y w^T x < 1 at the optimum, it examined all
of them on Fashion-MNIST and on a generated 419k x 100 store, 0.44 s against 0.05 s for a
plain pass there), while a query for 1000 violators outside a working set of 60,000 rows
there examined 0.3 % of the rows.

A shard whose worker died loses its alphas and its working set: the driver takes its part of
w back out and the shard starts again from alpha = 0 with a full round (w stays the sum of
every shard's part, so the gap stays valid).
"""

from __future__ import annotations

import math
import secrets
import time
from typing import NamedTuple

import numpy as np

from ooc_learn.losses import get_loss
from ooc_learn.storage.arrays import matrix_nbytes, stack_rows
from ooc_learn.storage.errors import ParameterError

from ._common import margins
from .ibcd.check import Nearest

__all__ = ["train_cocoa"]

# (run, shard) -> that shard's _Shard, on the worker that holds it
_STATE: dict = {}

# a full round keeps the rows with alpha > 0 or y w^T x < 1 + WORK_BAND at the round's w as
# the shard's working set; rows further out do not move in the rounds that follow
WORK_BAND = 1.0
# at most this many rounds over the working sets between two full rounds
CHECK_EVERY = 10
# a working set takes at most this share of the worker's budget (the block cache the rest),
# and is not kept below MIN_WORK_ROWS rows
WORK_SHARE = 0.5
MIN_WORK_ROWS = 64
# a round over the working sets first asks the shard's index (where the store has one) for
# up to QUERY_ROWS rows outside the set with y w^T x < 1, most violating first (IBCD's query
# step), examining at most QUERY_SHARE of the shard's rows
QUERY_ROWS = 1000
QUERY_SHARE = 0.05


class _WorkingSet(NamedTuple):
    """A shard's working set, resident: its rows' values, labels, squared norms, and their
    positions among the shard's alphas; ``nbytes`` reserved from the worker's budget."""

    X: object
    y: np.ndarray
    sqn: np.ndarray
    pos: np.ndarray
    nbytes: int


class _Shard:
    """One shard's state on its worker between rounds: the alphas of its rows, their squared
    norms (read once), and its working set (None until a full round made one, or where the
    worker's budget could not hold it)."""

    def __init__(self, st, blocks):
        off = np.asarray(st.block_offsets, dtype=np.int64)
        self.blocks = np.asarray(sorted(int(b) for b in blocks), dtype=np.int64)
        sizes = [int(off[b + 1] - off[b]) for b in self.blocks]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.alpha = np.zeros(int(self.starts[-1]))
        self.sqnorms = np.concatenate(
            [np.asarray(st.sqnorms(int(off[b]), int(off[b + 1])), dtype=np.float64)
             for b in self.blocks])
        self.offsets = off
        self.work = None
        self.budget = None
        self.in_work = None  # a store-wide mask of the working set's rows (the queries')
        # the index, open on the worker's kept store across rounds (a forest opened afresh
        # each round re-read its roots and nodes: 18.6 ms a query against 2.3 ms on the
        # 200,000 x 100 store of bench_cocoa.py)
        self.forest = self.forest_store = None

    def close(self) -> None:
        self.drop_work()
        if self.forest is not None:
            self.forest.close()
        self.forest = self.forest_store = None

    def open_forest(self, kept):
        """The shard's index on the kept store ``kept`` (opened again if that changed)."""
        if self.forest is None or self.forest_store is not kept or kept.closed:
            if self.forest is not None:
                self.forest.close()
            from ooc_learn.index.forest import open_forest

            self.forest, self.forest_store = open_forest(kept), kept
        return self.forest

    def drop_work(self) -> None:
        if self.work is not None:
            self.budget.release(self.work.nbytes)
        if self.in_work is not None:
            self.budget.release(self.in_work.nbytes)
        self.work = self.in_work = None

    def store_rows(self, pos) -> np.ndarray:
        """The store rows at shard positions ``pos`` (the inverse of :meth:`positions`)."""
        k = np.searchsorted(self.starts, pos, side="right") - 1
        return self.offsets[self.blocks[k]] + (pos - self.starts[k])

    def positions(self, rows) -> np.ndarray:
        """The shard positions (into ``alpha``) of store rows of its blocks."""
        b = np.searchsorted(self.offsets, rows, side="right") - 1
        k = np.searchsorted(self.blocks, b)  # blocks ascending
        assert np.all(self.blocks[np.minimum(k, len(self.blocks) - 1)] == b), \
            "a row outside the shard's blocks"
        return self.starts[k] + (rows - self.offsets[b])

    def grow(self, X, y, sqn, pos) -> bool:
        """Rows found by a query join the working set where the budget holds them."""
        ws = self.work
        nb = matrix_nbytes(X) + y.nbytes + sqn.nbytes + pos.nbytes
        if not self.budget.try_reserve(nb + matrix_nbytes(ws.X)):  # the stacked copy too
            return False
        self.work = _WorkingSet(stack_rows([ws.X, X]), np.concatenate([ws.y, y]),
                                np.concatenate([ws.sqn, sqn]), np.concatenate([ws.pos, pos]),
                                ws.nbytes + nb)
        self.budget.release(matrix_nbytes(ws.X))
        return True


def _shard_round(run: str, path: str, shard: int, blocks, w, fresh: bool, sigma: float,
                 C: float, loss: str, bias: float, epochs: int, seed: int, full: bool = True,
                 keep_work: bool = True, query: bool = True):
    """On a worker: one CoCoA+ round of shard ``shard`` (see the module docstring): a full
    round (``full``, or a shard with no working set) over every row, else a round over the
    working set only (``keep_work=False``: no working set, every pass over every row)."""
    from ooc_learn.distributed import keep_open, task_budget
    from ooc_learn.storage.store import open_store

    kept = keep_open(path)
    with open_store(path, memory=task_budget()) as st:
        sh = _STATE.get((run, shard))
        if sh is None:
            if not fresh:
                return {"lost": True}
            sh = _STATE[(run, shard)] = _Shard(st, blocks)
        sum_a, sum_a2 = float(sh.alpha.sum()), float(sh.alpha @ sh.alpha)  # at the start
        w = np.asarray(w, dtype=np.float64)
        local = _Local(w, float(sigma), float(C), float(bias), loss,
                       np.array([np.uint64(seed) ^ np.uint64(shard * 0x9E3779B9 + 1)],
                                np.uint64))
        restricted = not full and sh.work is not None
        found = queried = 0
        if restricted:
            if query and st.has_index:
                before = kept.rows_read
                found = _query(kept, sh, w, bias, loss, seed)
                queried = kept.rows_read - before
            loss_sum = local.on_work(sh, epochs)
        else:
            loss_sum = local.full(st, sh, epochs, keep_work)
        return {"dw": local.dw, "loss": loss_sum, "sum_alpha": sum_a, "sum_alpha2": sum_a2,
                "updates": local.updates, "restricted": restricted, "found": found,
                "rows_read": int(st.rows_read + queried),
                "work_rows": 0 if sh.work is None else int(sh.work.pos.shape[0])}


class _Local:
    """A round's local dual CD on one shard: ``w_loc = w + sigma dw`` (CoCoA+'s sub-problem,
    ``_kernels.cocoa_epoch``) and the loss at the round's ``w``."""

    def __init__(self, w, sigma, C, bias, loss, state):
        self.w, self.w_loc, self.dw = w, w.copy(), np.zeros_like(w)
        self.loss = get_loss(loss)
        self.sigma, self.bias, self.state = sigma, bias, state
        self.upper, self.diag = self.loss.dual_upper(C), self.loss.dual_diag(C)
        self.updates = 0

    def epoch(self, X, y, sqn, alpha) -> None:
        from ooc_learn.solvers import _kernels as K
        from ooc_learn.storage.arrays import kernel_args

        rows = np.arange(X.shape[0], dtype=np.int64)
        self.updates += int(K.cocoa_epoch(*kernel_args(X), self.bias, y, sqn, rows, alpha,
                                          self.w_loc, self.dw, self.sigma, self.upper,
                                          self.diag, self.state))

    def margins(self, X, y) -> np.ndarray:
        """y x^T w at the round's w (before this shard moves it)."""
        return margins(X, y, self.w, self.bias)

    def loss_of(self, z) -> float:
        return float(self.loss.value(z).sum())

    def full(self, st, sh: _Shard, epochs: int, keep_work: bool = True) -> float:
        """Every row of the shard: the loss at w and a pass of local dual CD, block by block,
        the rows nearest the margin (up to what the budget holds) kept as the new working
        set; the other passes over that set (over every block again without one)."""
        sh.drop_work()
        sh.budget = st.budget
        near, held = _selection(st, sh) if keep_work else (None, 0)
        loss_sum = 0.0
        for k, b in enumerate(sh.blocks):
            X, y, _ = st.read_block(b)
            yf = np.asarray(y, dtype=np.float64)
            z = self.margins(X, yf)
            loss_sum += self.loss_of(z)
            a = sh.alpha[sh.starts[k]:sh.starts[k + 1]]
            self.epoch(X, yf, sh.sqnorms[sh.starts[k]:sh.starts[k + 1]], a)
            if near is not None:
                # key: the margin at w, rows with alpha > 0 first
                sel = np.flatnonzero((a > 0.0) | (z < 1.0 + WORK_BAND))
                key = np.where(a[sel] > 0.0, -np.inf, z[sel])
                near.offer(sh.starts[k] + sel, key, X, yf, sel)
        got = near.result() if near is not None else None
        if got is not None:
            pos, _, X, y = got
            nb = matrix_nbytes(X) + y.nbytes + 16 * pos.shape[0]
            sh.work = _WorkingSet(X, y, sh.sqnorms[pos], pos, min(nb, held))
        st.budget.release(held - (sh.work.nbytes if sh.work is not None else 0))
        for _ in range(epochs - 1):
            if sh.work is not None:
                self._work_epoch(sh)
                continue
            for k, b in enumerate(sh.blocks):
                X, y, _ = st.read_block(b)
                self.epoch(X, np.asarray(y, dtype=np.float64),
                           sh.sqnorms[sh.starts[k]:sh.starts[k + 1]],
                           sh.alpha[sh.starts[k]:sh.starts[k + 1]])
        return loss_sum

    def on_work(self, sh: _Shard, epochs: int) -> float:
        """The working set only: its loss at w and ``epochs`` passes over it (the rows
        outside it keep their alphas: beyond the band at the last full round, or beyond
        what the budget held)."""
        loss_sum = self.loss_of(self.margins(sh.work.X, sh.work.y))
        for _ in range(epochs):
            self._work_epoch(sh)
        return loss_sum

    def _work_epoch(self, sh: _Shard) -> None:
        ws = sh.work
        a = sh.alpha[ws.pos]
        self.epoch(ws.X, ws.y, ws.sqn, a)
        sh.alpha[ws.pos] = a


def _query(kept, sh: _Shard, w, bias: float, loss: str, seed: int) -> int:
    """IBCD's query step for a round over the working set: up to ``QUERY_ROWS`` rows of the
    shard outside the set with y w^T x < 1, from its index on the worker's kept store
    ``kept`` (the trees of the shard's blocks), join the set; returns how many."""
    if sh.in_work is None:  # the set's rows, marked for the search to pass over
        if not sh.budget.try_reserve(kept.n_samples):
            return 0
        sh.in_work = np.zeros(kept.n_samples, np.uint8)
        sh.in_work[sh.store_rows(sh.work.pos)] = 1
    # the search's bias is the weight of a constant feature 1: here it is bias * w_d
    wq = np.append(w[:-1], w[-1] * bias) if bias else w[:-1]
    got = sh.open_forest(kept).query(
        wq, s=None, n=QUERY_ROWS, exclude=sh.in_work, seed=seed, loss=loss, bounded=True,
        with_rows=True, max_examined=max(2 * QUERY_ROWS, int(QUERY_SHARE * sh.alpha.shape[0])),
        trees=sh.blocks)
    if not len(got.rows):
        return 0
    pos = sh.positions(got.rows)
    if not sh.grow(got.X, np.asarray(got.y, dtype=np.float64), sh.sqnorms[pos], pos):
        return 0
    sh.in_work[got.rows] = 1
    return int(len(got.rows))


def _selection(st, sh: _Shard):
    """The running selection of a full round's working set and the bytes reserved for it:
    as many rows as ``WORK_SHARE`` of the budget holds three times over (the selection
    holds up to three copies while it merges), halved until the budget gives it (None
    below ``MIN_WORK_ROWS`` rows: the shard then reads every block every pass)."""
    per_row = max(1, st.estimated_bytes(1)) + 24  # values, label, norm, position
    k = min(sh.alpha.shape[0], int(WORK_SHARE * st.budget.limit) // (3 * per_row))
    while k >= MIN_WORK_ROWS:
        if st.budget.try_reserve(3 * k * per_row):
            return Nearest(k, math.inf), 3 * k * per_row
        k //= 2
    return None, 0


def _drop(run: str) -> None:
    for key in [k for k in _STATE if k[0] == run]:
        _STATE.pop(key).close()


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
                max_rounds: int = 200, epochs: int = 1, seed: int = 0, on_round=None,
                working_set: bool = True, query: bool = True):
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
    max_rounds, epochs : rounds, and local passes per round.
    working_set : bool
        Rounds between full ones over each shard's working set only (resident; see the
        module docstring). False: every round reads every row, every pass.
    query : bool
        Rounds over the working sets first ask each shard's index for rows outside the set
        that violate the margin (where the store has an index).

    Returns
    -------
    LinearModel
        ``meta["stats"]``: rounds, ``full_rounds`` (over every row), the duality gap of each
        full round, the dual of every round, converged, ``rows_read`` (from the stores, all
        shards), ``work_rows`` (the working sets' rows after the last full round),
        ``rows_found`` (rows the index queries brought into the sets), bytes shipped per
        round, seconds.
    """
    from ooc_learn.distributed import result
    from ooc_learn.model import LinearModel
    from ooc_learn.storage.labels import check_two_classes
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
        check_two_classes(st)
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
    n_lost = full_rounds = rows_read = work_rows = found = 0
    converged = False
    full, since_full = True, 0
    primal = None
    try:
        for r in range(max_rounds):
            futs = [client.submit(_shard_round, run, layout[p][0], p, layout[p][1], w,
                                  fresh[p], float(k), float(C), loss, float(bias), int(epochs),
                                  int(seed) + r, full, working_set, query,
                                  workers=placement[p][0],
                                  allow_other_workers=placement[p][1], pure=False)
                    for p in range(k)]
            outs = [result(f) for f in futs]  # a Ctrl-C honoured while it waits
            for f in futs:  # nothing of a finished round is kept on the cluster
                f.release()
            lost = [p for p, o in enumerate(outs) if o.get("lost")]
            n_lost += len(lost)
            for p in lost:  # its alphas are gone: its part of w goes too, it starts again
                w = w - w_parts[p]
                w_parts[p] = 0.0
                fresh[p] = True
            if lost:
                # the others moved their alphas in this round: their dw joins w, which stays
                # the sum of every shard's part (the dual of the gap is D(alpha) at that w)
                for p, o in enumerate(outs):
                    if p not in lost:
                        w_parts[p] += o["dw"]
                w = w_parts.sum(axis=0)
                full = True
                continue
            fresh = [False] * k
            rows_read += sum(o["rows_read"] for o in outs)
            found += sum(o["found"] for o in outs)
            restricted = any(o["restricted"] for o in outs)
            ww = float(w @ w)
            # over the working sets: the loss of the rows in them (a lower bound of P(w))
            loss_w = 0.5 * ww + C * sum(o["loss"] for o in outs)
            dual = (sum(o["sum_alpha"] for o in outs) - 0.5 * ww
                    - (sum(o["sum_alpha2"] for o in outs) / (4.0 * C)
                       if loss == "sqhinge" else 0.0))
            gap = loss_w - dual
            duals.append(dual)
            if not restricted:
                primal = loss_w
                gaps.append(gap)
                full_rounds += 1
                work_rows = sum(o["work_rows"] for o in outs)
            if on_round is not None:
                on_round({"round": r, "primal": None if restricted else loss_w,
                          "dual": dual, "gap": gap, "full": not restricted})
            if gap <= eps * abs(loss_w) and not restricted:
                converged = True
                break
            # a full round next where the working sets' gap is closed (it certifies, or
            # brings the rows that moved into the sets), or after CHECK_EVERY rounds
            since_full = 0 if not restricted else since_full + 1
            full = gap <= eps * abs(loss_w) or since_full >= CHECK_EVERY
            for p, o in enumerate(outs):
                w_parts[p] += o["dw"]
            w = w_parts.sum(axis=0)
    finally:
        client.run(_drop, run)
    if not converged:  # as every solver stopped at its limit says (a new-user run: silent)
        import warnings

        rel = gaps[-1] / abs(primal) if gaps and primal else float("nan")
        warnings.warn(f"CoCoA+ reached max_rounds={max_rounds} before the duality gap fell to "
                      f"eps={eps:g} of the primal (it is {rel:.3g}): the solution is "
                      "approximate. Raise max_rounds (ooc-train: --max-outer, 100 rounds "
                      "each) or eps (--eps).", RuntimeWarning, stacklevel=2)
    stats = {"rounds": len(duals), "gaps": gaps, "duals": duals, "converged": converged,
             "shards_lost": n_lost, "full_rounds": full_rounds, "rows_read": rows_read,
             "work_rows": work_rows, "rows_found": found,
             "outer_iterations": len(duals), "shards": k, "objective": primal,
             "bytes_per_round": 2 * k * 8 * (d + 1), "seconds": time.perf_counter() - t0,
             "stop_reason": "the duality gap fell to eps of the primal" if converged
             else f"max_rounds ({max_rounds})"}
    return LinearModel.from_weights(w, bias=bias, classes=classes, solver="cocoa", loss=loss,
                                    C=C, eps=eps, store=path, store_fingerprint=fingerprint,
                                    label_map=label_map, stats=stats)
