"""IBCD's convergence check (Yen et al., KDD 2013, §4.3) and the pool that spares it a scan.

The check looks at every row outside the active set S for those satisfying eq. 10 at w
(not an outlier at the outer iterate w_t, y w^T x < 1) and hands the most violating ones to
IBCD (where it may admit fewer than it found, a uniform sample of them:
``IBCDConfig.admit``). Two sources answer it, cheapest first:

* the **pool**: rows (values included) that the last scan found near a boundary but did not
  admit. After the solve of S that follows a check, the rows the solve pushed over the
  margin were near it. No reads.
* the **scan**: a sequential pass over the store. It refreshes the pool, and it is the only
  answer a stop may rest on (``Answer.scanned``): the pool holds some rows only. Where
  violators are many beside the rows a check may admit (a tight cap), the pass ends once it
  has seen ``IBCDConfig.check_sample`` times as many (a *sample*: the blocks are iid shards),
  and the next pass starts at the block after it.

Keys: a row satisfying eq. 10 has key y w^T x - 1 < 0 (most violating first); another row
y w^T x - 1 >= 0, or, for an outlier at w_t, |y w^T x - low| (the next outer iterate may
bring it back into the problem). A row frozen at alpha = C outside S
(``IBCDConfig.freeze_margin``) violates where y w^T x > 1 (its alpha would fall): key
1 - y w^T x; a scan examines every frozen row, so a stop certifies them too.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ooc_learn.storage.resources import release_free_heap
from ooc_learn.storage.arrays import matrix_nbytes

from .._common import margins, rows_in_order
from .config import IBCDConfig

__all__ = ["Answer", "Checker", "Nearest", "Pool", "reserve_rows", "scan_rows"]

# rows a selection copies at a time into its answer (the one temporary beside it)
SELECT_STEP = 1024

# the fewest rows a check brings back where the cap holds fewer (more checks follow)
MIN_CHECK_ROWS = 64

# what a check's selection and pool leave free for the scan's chunks, at most (1/8 of the cap
# below 64 MiB): with room for 64 rows, the capped ramp loss on Fashion-MNIST (cap 17.9M)
# read its scans in chunks of 46 rows, 1,290 a pass, at 74 ms a pass against 22 ms for
# the reads and margins alone (bench-log 2026-11-29, session 43)
SCAN_ROOM = 8 << 20

# the bytes a row in a selection that gathers its rows after the pass (position and key, 3
# times while it merges)
GATHER_KEY_BYTES = 16


class Answer(NamedTuple):
    """A check's answer: the rows to admit (store order) with their values and labels, the
    largest violation 1 - y w^T x seen, rows examined, rows seen violating, and its source
    ("scan": a pass over every block; "sample": a pass that ended early; or "pool")."""

    rows: np.ndarray
    X: object
    y: np.ndarray | None
    worst: float
    examined: int
    n_viol: int
    source: str
    #: the largest y w^T x - 1 over the frozen rows (a scan's; 0 when none violates)
    thaw_worst: float = 0.0
    #: the frozen rows' summed hinge loss at w (over the blocks the pass read)
    frozen_loss: float = 0.0

    @property
    def scanned(self) -> bool:
        """Whether every row outside S was examined: only then may a stop rest on it."""
        return self.source == "scan"

    @property
    def from_pool(self) -> bool:
        """Whether the pool answered (no pass read the store)."""
        return self.source == "pool"

    @property
    def sampled(self) -> bool:
        """Whether a pass ended early, having seen many times the violators it may admit."""
        return self.source == "sample"


def reserve_rows(budget, k: int, per_row: int, what: str, *, extra: int = 0) -> int:
    """Reserve ``k * per_row + extra`` bytes, halving ``k`` down to MIN_CHECK_ROWS while the
    cap cannot hold them, by the account and by the RSS (``fit_rss``: the rows are a buffer
    that may shrink, as a read chunk is); return the ``k`` reserved. Below that floor the
    reservation raises the ``--memory`` error with the figures. By the account alone, two of
    18 exact-stop runs on the issue-23 store went to 832 and 862 MiB under ``--memory 768M``,
    in the check's selection; by the RSS too the peaks were 682-704 MiB in the same time
    (bench-log, 2026-11-27)."""
    return budget.reserve_shrinking(k, lambda j: j * per_row + extra, MIN_CHECK_ROWS, what)


class Checker:
    """The check of §4.3 for one IBCD run: :meth:`check` answers from the pool, else by a
    scan. The rows of an answer stay reserved from the budget until :meth:`drop_answer`
    (they have joined S)."""

    def __init__(self, rows_src, in_S, *, low: float, cfg: IBCDConfig, stats, frozen=None):
        self.src, self.store = rows_src, rows_src.store
        self.budget = self.store.budget
        self.in_S, self.low, self.bias = in_S, low, cfg.bias
        self.frozen = frozen
        # the frozen rows' summed loss at the last whole pass's w (their part of the objective)
        self.frozen_loss = 0.0
        self.pool_rows, self.pool_band = cfg.n, cfg.pool_band
        self.sample = cfg.check_sample
        self.next_block = 0  # where the next pass starts (a sample ends mid-store)
        self.stats = stats
        self.pool = Pool(self.budget, cfg.pool_share)
        self.row_bytes = max(1, self.store.estimated_bytes(1))
        # a row in a copied selection or the pool: its values, its position and its key
        self.kept_row_bytes = self.row_bytes + 16
        self.held = 0  # reserved for the last answer until its rows join S

    def clear(self) -> None:
        self.drop_answer()
        self.pool.clear()

    def drop_answer(self) -> None:
        self.budget.release(self.held)
        self.held = 0

    def check(self, w, w_t, want: int, thresh: float, *, keep_pool: bool = True,
              rng=None) -> Answer:
        """The rows satisfying eq. 10 at ``w``, at most ``want`` of them (a scan's: a
        uniform sample of those it found, drawn by ``rng``, or with None the most
        violating). The pool answers only with a violation of ``thresh`` or more; otherwise
        the store is scanned. ``keep_pool=False`` (S spilled): no pool is held."""
        self.drop_answer()
        return (self._from_pool(w, w_t, want, thresh)
                or self._scan(w, w_t, want, keep_pool, rng))

    def _from_pool(self, w, w_t, want, thresh):
        got = self.pool.take(w, w_t, self.low, self.bias, self.in_S, want, thresh)
        if got is None:
            return None
        self.stats.pool_hits += 1
        return Answer(*got, "pool")

    def _reserve_selection(self, want: int) -> tuple[int, bool]:
        """Room for a check's selection of ``want`` rows with a read chunk's room left beside
        it; returns the rows it holds and whether the rows are gathered after the pass.

        Copied as the pass goes (no second read), the selection holds up to 2 ``want`` rows
        and its answer ``want`` more. Where the cap cannot hold that, the selection keeps
        row positions and keys alone (48 bytes a row, merges included), and the admitted
        rows are read again after the pass (:meth:`Store.gather`: runs of rows, from the
        block cache where it holds them): 3 times as many rows a check in the same room."""
        per_row = self.kept_row_bytes
        room = scan_room_rows(self.store) * per_row
        if self.budget.try_reserve(3 * want * per_row + room, fit_rss=True):
            self.budget.release(room)
            self.held = 3 * want * per_row
            return want, False
        # the answer (CSR twice: the gather's parts and their concatenation) and the keys
        answer = per_row * (1 if self.store.layout == "dense" else 2) + 3 * GATHER_KEY_BYTES
        k = self.budget.reserve_shrinking(want, lambda j: j * answer + room, MIN_CHECK_ROWS,
                                          must=False)
        if k is None:
            return self._reserve_copied(want), False
        self.budget.release(room)
        self.held = k * answer
        return k, True

    def _reserve_copied(self, want: int) -> int:
        """Where neither selection leaves the scan its chunk: the copied one with room for
        MIN_CHECK_ROWS rows beside it (the scan's chunks halve to fit), halved down to that
        floor; below it, :meth:`MemoryBudget.reserve`'s error with the figures."""
        per_row = self.kept_row_bytes
        room = MIN_CHECK_ROWS * per_row
        want = reserve_rows(self.budget, want, 3 * per_row, "IBCD check's selection",
                            extra=room)
        self.budget.release(room)
        self.held = 3 * want * per_row
        return want

    def _keep_answer(self, X, rows) -> None:
        """Of the selection's reservation keep what the answer holds."""
        answer = 0 if X is None else matrix_nbytes(X) + 16 * len(rows)
        self.budget.release(self.held - min(self.held, answer))
        self.held = min(self.held, answer)

    def _scan(self, w, w_t, want, keep_pool, rng):
        """The check by a sequential pass; refreshes the pool. The pass may end once it has
        seen ``check_sample`` times ``want`` rows violating (a sample: a stop may not rest
        on it); where it never does, it reads every block, and a stop may rest on it."""
        self.pool.clear()
        # the selection, then the pool, each with room for the pass's chunks left beside it
        want, gather = self._reserve_selection(want)
        k_pool = (self.pool.reserve(self.pool_rows, self.kept_row_bytes,
                                    room=scan_room_rows(self.store) * self.kept_row_bytes)
                  if keep_pool and self.pool.wanted else 0)
        ans, pool, self.next_block = scan_rows(
            self.src, w, w_t, self.low, self.in_S, self.bias, want, k_pool, self.pool_band,
            frozen=self.frozen, start_block=self.next_block, enough=int(self.sample * want),
            gather=gather, rng=rng)
        self.stats.gathered_checks += int(gather)
        if ans.scanned:  # the frozen rows' loss at w is known only after a whole pass
            self.frozen_loss = ans.frozen_loss
        self._keep_answer(ans.X, ans.rows)
        # a pool only where the scan found at most twice the violators it may admit (else
        # the next scan finds them anyway, and the pool's rows are copied for nothing)
        self.pool.wanted = ans.n_viol <= 2 * want
        self.pool.hold(pool if self.pool.wanted else None)
        release_free_heap()  # the check and the solve before it freed many arrays
        self.stats.full_checks += int(ans.scanned)
        self.stats.sampled_checks += int(ans.sampled)
        self.stats.rows_examined += ans.examined
        return ans


def scan_chunk_rows(store) -> int:
    """The rows a scan asks to read at a time: 1/8 of the cap, at least 256."""
    return int(max(256, store.budget.limit // 8 // max(1, store.estimated_bytes(1))))


def scan_room_rows(store) -> int:
    """The rows of a scan's chunk that a check leaves room for beside its selection and
    pool: a whole chunk up to SCAN_ROOM bytes, at least MIN_CHECK_ROWS rows."""
    row = max(1, store.estimated_bytes(1))
    return int(max(MIN_CHECK_ROWS, min(scan_chunk_rows(store), SCAN_ROOM // row)))


def scan_rows(rows_src, w, w_t, low, in_S, bias, n, pool_rows=0,
              pool_band=IBCDConfig.pool_band, *, frozen=None, start_block=0, enough=0,
              gather=False, rng=None):
    """The check on every row outside S: a sequential pass over the blocks (the whole data
    must be examined, so the index's best-first order buys nothing here and a block scan
    avoids its per-leaf overhead). Returns ``(answer, pool, next_block)``: the
    :class:`Answer` with the (at most ``n``) rows satisfying eq. 10 that violate it most,
    their ``X`` and ``y``, the largest violation 1 - y w^T x over all rows (0 when none), the
    number of rows examined and of rows satisfying eq. 10; the pool: up to ``pool_rows`` of
    the other rows within ``pool_band`` of a boundary, nearest first, as ``(rows, X, y)`` (or
    None); and the block the next pass starts at. Rows are copied out of the chunks as the
    pass goes (no second read).

    ``frozen`` (a mask over the rows, marked in ``in_S`` too): the rows frozen at alpha = C
    are examined as well; one with y w^T x > 1 violates by y w^T x - 1 and competes for the
    ``n`` places (it comes back to S at alpha = C). Their summed hinge loss is the answer's
    ``frozen_loss``, their largest y w^T x - 1 (0 when none is above 1) its ``thaw_worst``.

    The pass reads the blocks from ``start_block`` on, cyclically. ``enough`` > 0 ends it
    at the end of the first block by which that many rows were seen violating (a sample of
    the store: its blocks are iid shards; the answer's source is then "sample", else
    "scan").

    ``gather``: the selection keeps positions and keys alone, and the admitted rows are
    read again after the pass (see :meth:`Checker._reserve_selection`).

    ``rng`` (a numpy Generator): where more rows violate than the ``n`` admitted, the
    admitted are a uniform sample of them (``IBCDConfig.admit = "random"``); None: the most
    violating. A frozen row that violates competes with its violation either way."""
    store = rows_src.store
    chunk = scan_chunk_rows(store)
    truncated = math.isfinite(low)
    admit = Nearest(n, 0.0, copy=not gather)
    near = Nearest(pool_rows, pool_band)
    worst = 0.0
    n_viol = examined = 0
    f_loss = f_worst = 0.0
    nb = store.n_blocks
    order = (int(start_block) + np.arange(nb)) % nb
    ends = store.block_offsets[order + 1]
    done = 0  # blocks read
    # every row kept is copied out of its chunk (the selections, the pool): the chunks of
    # a store with value codes share one buffer
    for a, X, y, _ in store.iter_chunks(chunk, ids=False, blocks=order, reuse=True):
        block_end = a + X.shape[0] == ends[done]
        done += int(block_end)
        free = ~in_S[a:a + X.shape[0]]
        y64 = y.astype(np.float64)
        m = margins(X, y64, w, bias)
        if frozen is not None:
            fz = np.flatnonzero(frozen[a:a + X.shape[0]])
            if fz.size:
                examined += int(fz.size)
                f_loss += float(np.maximum(0.0, 1.0 - m[fz]).sum())
                up = fz[m[fz] > 1.0]
                if up.size:
                    n_viol += int(up.size)
                    f_worst = max(f_worst, float(m[up].max() - 1.0))
                    worst = max(worst, f_worst)
                    admit.offer(a + up, 1.0 - m[up], X, y, up)
        hit = np.flatnonzero(free & (m < 1.0 + max(0.0, near.top)))
        examined += int(free.sum())
        if hit.size:
            key = m[hit] - 1.0
            v = key < 0.0
            if truncated:
                out = margins(X[hit], y64[hit], w_t, bias) < low
                key[out] = np.abs(key[out] + 1.0 - low)
                v &= ~out
            n_viol += int(v.sum())
            if v.any():
                worst = max(worst, float(-key[v].min()))
                # a uniform sample (random keys in (-1, 0)), or the most violating first
                admit.offer(a + hit[v], key[v] if rng is None else
                            -rng.uniform(1e-12, 1.0, int(v.sum())), X, y, hit[v])
            near.offer(a + hit[~v], key[~v], X, y, hit[~v])
        # the chunk goes before the next is read and before the selection's last merge
        # (its reservation ended when the loop asked for the next chunk)
        del X, y, y64, m, free, hit
        # a sample ends with a block (the next pass starts at the next one)
        if enough and block_end and n_viol >= enough and done < nb:
            break
    complete = done == nb
    # S takes its rows in store order: the selection writes them so (a reordering copy
    # beside it would be a fourth copy of the rows, beyond the three reserved)
    got, pool = admit.result(by_row=True), near.result()
    pool = None if pool is None else (pool[0], pool[2], pool[3])
    source, nxt = "scan" if complete else "sample", int(order[done % nb])
    if got is None:
        return (Answer(np.empty(0, np.int64), None, None, 0.0, examined, n_viol, source,
                       f_worst, f_loss), pool, nxt)
    rows, _, XN, yN = got
    if gather:
        XN, yN, _ = store.gather(rows, whole_blocks=False)
    return (Answer(rows, XN, yN, worst, examined, n_viol, source, f_worst, f_loss), pool,
            nxt)


class Nearest:
    """A running selection over a pass: the ``k`` rows of smallest key below ``top`` with
    copies of their ``X`` and ``y``, holding at most 2k, and 3k while it merges (``top``
    falls to the k-th key each time it merges)."""

    def __init__(self, k: int, top: float, *, copy: bool = True):
        self.k, self.top = int(k), float(top) if k else -np.inf
        self.copy = copy  # False: positions and keys alone (X and y come back None)
        self.parts, self.count = [], 0

    def offer(self, rows, key, X, y, local) -> None:
        c = np.flatnonzero(key < self.top)
        if not c.size:
            return
        if c.size > self.k:  # no more of one chunk's rows are copied than can be kept
            c = c[np.argpartition(key[c], self.k - 1)[:self.k]]
        if self.count + c.size > 2 * self.k:
            # merged before this chunk's rows are copied (then count > k): the parts never
            # pass 2k rows, and a merge holds them beside its k-row answer, 3k in all, the
            # check's reservation (merged after, they would reach 3k beside the answer)
            self.parts = [_select(self.parts, self.k)]
            self.count = self.k
            release_free_heap()  # the parts' pages (see result)
            self.top = min(self.top, float(self.parts[0][1].max()))
            c = c[key[c] < self.top]
            if not c.size:
                return
        self.parts.append((rows[c], key[c], X[local[c]], y[local[c]]) if self.copy
                          else (rows[c], key[c], None, None))
        self.count += c.size

    def result(self, *, by_row: bool = False):
        """(rows, keys, X, y), smallest key first (ties in store order; ``by_row``: in store
        order), or None. The parts are let go, and the heap pages they held go back to the
        OS (here and after each merge): parts of a few rows are small arrays from malloc's
        heap, whose pages stay resident once freed. With them kept, a check admitting 34-41k
        rows peaked at 4.3 copies of them where 3 are reserved (bench-log 2026-11-27,
        session 37)."""
        out = _select(self.parts, self.k, by_row) if self.parts else None
        self.parts, self.count = [], 0
        release_free_heap()
        return out


def _select(parts, k, by_row: bool = False):
    """The ``k`` rows of smallest key among a selection's parts, smallest first (ties in
    store order; ``by_row``: in store order), as one ``(rows, keys, X, y)``."""
    rows = np.concatenate([p[0] for p in parts])
    m = np.concatenate([p[1] for p in parts])
    sel = np.argpartition(m, k - 1)[:k] if rows.size > k else np.arange(rows.size)
    sel = sel[np.argsort(rows[sel], kind="stable") if by_row
              else np.lexsort((rows[sel], m[sel]))]
    if parts[0][2] is None:  # positions and keys alone
        return rows[sel], m[sel], None, None
    # the rows of X taken part by part (the parts' X are never concatenated whole)
    ends = np.cumsum([p[0].size for p in parts])
    which = np.searchsorted(ends, sel, side="right")
    dense = isinstance(parts[0][2], np.ndarray)
    if dense:
        # straight into the answer, a slice of rows at a time: copies of whole parts beside
        # it would take a fourth copy of the selection, beyond the three reserved
        X = np.empty((sel.size,) + parts[0][2].shape[1:], parts[0][2].dtype)
        y = np.empty(sel.size, parts[0][3].dtype)
    pieces = []
    for i in np.unique(which):
        pos = np.flatnonzero(which == i)
        local = sel[pos] - (ends[i - 1] if i else 0)
        if not dense:
            pieces.append((pos, parts[i][2][local], parts[i][3][local]))
            continue
        for j in range(0, pos.size, SELECT_STEP):
            X[pos[j:j + SELECT_STEP]] = parts[i][2][local[j:j + SELECT_STEP]]
        y[pos] = parts[i][3][local]
    if not dense:
        X, y = rows_in_order(pieces, sel.size)
    return rows[sel], m[sel], X, y


class Pool:
    """Rows a check found near the margin that did not join S (``IBCDConfig.pool_band``),
    held within a reservation from the budget until the next check replaces them; dropped
    when S needs the room."""

    def __init__(self, budget, share: int = IBCDConfig.pool_share):
        self.budget = budget
        self.share = int(share)
        self.rows = np.empty(0, np.int64)
        self.X = self.y = None
        self.nbytes = 0  # reserved: what the pool holds, or what a check gathering it may
        self.wanted = True  # whether the next check keeps a pool

    def __len__(self) -> int:
        return int(self.rows.size)

    def clear(self) -> None:
        self.rows = np.empty(0, np.int64)
        self.X = self.y = None
        self.budget.release(self.nbytes)
        self.nbytes = 0

    def reserve(self, k: int, row_bytes: int, room: int = 0) -> int:
        """Drop the pool and reserve room for a check to gather the next one: ``k`` rows in
        at most 1 / ``share`` of the cap, three times that while the check's running
        selection holds them (2k, and 3k while it merges: :class:`Nearest`; halved until the
        budget, by the account and the RSS, gives it with ``room`` bytes left beside it).
        Returns how many rows to gather."""
        self.clear()
        k = min(k, self.budget.limit // self.share // row_bytes)
        while k and not self.budget.try_reserve(3 * k * row_bytes + room, fit_rss=True):
            k //= 2
        if k:
            self.budget.release(room)
        self.nbytes = 3 * k * row_bytes
        return k

    def hold(self, pool) -> None:
        """Keep ``pool`` (rows, X, y, or None) from the check; the part of its reservation
        the pool does not need goes back."""
        keep = 0 if pool is None else min(
            self.nbytes, matrix_nbytes(pool[1]) + pool[2].nbytes + pool[0].nbytes)
        self.budget.release(self.nbytes - keep)
        self.nbytes = keep
        self.rows, self.X, self.y = (np.empty(0, np.int64), None, None) if pool is None else pool

    def take(self, w, w_t, low, bias, in_S, n, thresh):
        """The pool's rows satisfying eq. 10 at ``w`` (up to ``n``, most violating first;
        they leave the pool) when the worst violates by ``thresh`` or more, as the check's
        ``(rows, X, y, worst, examined, n_viol)``; else None."""
        if not len(self):
            return None
        y64 = self.y.astype(np.float64)
        m = margins(self.X, y64, w, bias)
        ok = ~in_S[self.rows] & (m < 1.0)
        if ok.any() and math.isfinite(low):
            ok[ok] = margins(self.X[ok], y64[ok], w_t, bias) >= low
        hit = np.flatnonzero(ok)
        if not hit.size or 1.0 - m[hit].min() < thresh:
            return None
        hit = hit[np.lexsort((self.rows[hit], m[hit]))]
        sel = np.sort(hit[:n])
        rest = np.ones(len(self), bool)
        rest[sel] = False
        rest &= ~in_S[self.rows]
        out = (self.rows[sel], self.X[sel], self.y[sel], float(1.0 - m[hit[0]]), len(self),
               int(hit.size))
        self.rows, self.X, self.y = self.rows[rest], self.X[rest], self.y[rest]
        return out
