"""Direct ingest of arrays on disk: the source read once and the store written once.

The bucket path (:mod:`.ingest_parse`, :mod:`.ingest_write`) writes a source larger than its
write buffer into bucket files and reads them back: two reads and two writes of the data.
Where every source is a dense array at a known place in a plain file (an uncompressed
``.npy``, or an ``.npz`` whose members are stored, not deflated, as ``numpy.savez`` writes
them), a row is found by arithmetic and no intermediate file is needed:

1. the rows are cut into *runs* of consecutive rows (:func:`plan_passes`; about 1/256 of a
   group, 64 KiB to 4 MiB) and dealt to the blocks' *slots* the way the
   :class:`~ooc_learn.storage.shuffle.Dealer` deals rows (every consecutive R runs one to each
   of the R blocks, in a fresh random order); a run belongs to the group of its slot's block.
   So each of the P groups (as many as the cap needs, each holding whole blocks) gets its
   blocks' share of every stretch of the input: a source sorted by class gives every group
   the global shares. A few runs are split so that every group holds exactly the rows of its
   blocks, whose sizes are the balanced ones of the bucket path;
2. pass g reads group g's runs in file order (one ``preadv`` each, the kernel's read-ahead
   off: the runs between belong to other passes), deals its rows into its blocks (a Dealer
   again: each block a stratified sample of the group), and orders and writes them as the
   bucket path does (:class:`~.ingest_write.StoreOutput`). The next group is read on a side
   thread meanwhile (two groups share the memory a group would have alone);
3. the task is known only when every label has been seen: the raw labels are spooled in
   store order (8 bytes a row) and every block's labels are written after the last pass.

An auto layout is decided on the first group (a 1/P sample of the rows): where it comes out
sparse, the bucket path takes over and that group is read once more. A source's digest here
is ``sha256_pieces``, the sha256 of the sha256 digests of its pieces of ``piece_rows`` rows
(about 32 KiB) in file order (an ``.npz``'s labels after its rows), the same whatever the cap:
the runs are read out of order, so the file's own sha256 would need a read of its own.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _parse_kernels as K
from ._array_sources import npz_pair
from .errors import IngestError, NonFiniteError
from .ingest_parse import IOCount, Parsed
from .ingest_plan import DENSE_THRESHOLD, Shape, check_block_fits
from .ingest_write import StoreOutput, store_metadata
from .labels import decide_task
from .shuffle import Dealer, balanced_sizes
from .source_io import label_index
from .stop import check_stop

__all__ = ["ArrayFile", "file_mapping", "memmap_array_file", "probe_array_files", "plan_passes",
           "ingest_direct", "RUN_BYTES"]

#: runs of a group: about this many, within RUN_BYTES
RUNS_PER_GROUP = 256
#: the smallest and largest run (a strided read of 64 KiB runs here: ~300 MB/s; 1 MiB: ~600)
RUN_BYTES = (64 << 10, 4 << 20)
#: at least this many runs a group however large its rows (the mixing of a group)
MIN_RUNS_PER_GROUP = 16
#: a source's digest is over pieces of about this many bytes of rows (see _GroupReader)
PIECE_BYTES = 32 << 10

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_LOCAL = b"PK\x03\x04"


@dataclass
class ArrayFile:
    """Where the rows of one array source are: ``n`` rows of ``width`` items of ``dtype`` from
    byte ``x_offset`` of ``path``; the label is column ``label_col`` of the rows, or (``label_col``
    None) item i of the ``y_dtype`` vector at ``y_offset``."""

    path: str
    fmt: str
    n: int
    width: int
    dtype: np.dtype
    x_offset: int
    label_col: int | None = None
    y_offset: int | None = None
    y_dtype: np.dtype | None = None
    y_array: np.ndarray | None = None  # labels in memory (a memory-mapped X's)

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize

    @property
    def source_bytes(self) -> int:
        """The source's size: its file, or a memory-mapped array's rows (a view may map a
        part of its file)."""
        return self.n * self.row_bytes if self.fmt == "memmap" else os.path.getsize(self.path)

    @property
    def n_features(self) -> int:
        return self.width - (self.label_col is not None)

    @property
    def layout_key(self) -> tuple:
        return (self.width, self.dtype.str, self.label_col, None if self.y_dtype is None
                else self.y_dtype.str, self.y_array is None)


def _npy_header(fh, offset: int):
    """``(shape, dtype, data offset)`` of the .npy array at ``offset`` of ``fh``, or None
    where it is not a plain C-order numeric array the direct path can read."""
    fh.seek(offset)
    try:
        version = np.lib.format.read_magic(fh)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(fh)
    except (ValueError, OSError, EOFError):
        return None  # the bucket path reports it
    if dtype.hasobject or dtype.kind not in "biuf" or (fortran and len(shape) > 1 and
                                                       min(shape) > 1):
        return None
    return shape, dtype, fh.tell()


def _zip_member_offset(fh, info: zipfile.ZipInfo) -> int | None:
    """Where a stored member's bytes start (after its local header), or None if deflated."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    fh.seek(info.header_offset)
    head = fh.read(30)
    if len(head) != 30 or head[:4] != _ZIP_LOCAL:
        return None
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _probe(path: Path, fmt: str, label_column, npz_keys) -> ArrayFile | None:
    p = os.fspath(path)
    try:
        fh = open(p, "rb")
    except OSError:
        return None
    with fh:
        magic = fh.read(6)
        size = os.fstat(fh.fileno()).st_size
        if magic == _NPY_MAGIC and fmt in ("auto", "npy"):
            head = _npy_header(fh, 0)
            if head is None or len(head[0]) != 2 or isinstance(label_column, str):
                return None
            (n, width), dtype, off = head
            if width < 2 or off + n * width * dtype.itemsize != size:
                return None
            return ArrayFile(p, "npy", n, width, dtype, off,
                             label_col=label_index(p, label_column, None, width))
        if magic[:4] != _ZIP_LOCAL or fmt not in ("auto", "npz"):
            return None
        try:
            with zipfile.ZipFile(fh) as zf:
                infos = {i.filename[:-4]: i for i in zf.infolist() if i.filename.endswith(".npy")}
        except (zipfile.BadZipFile, OSError):
            return None
        xk, yk = npz_pair(infos, npz_keys)
        if xk not in infos or yk not in infos:
            return None
        heads = []
        for key in (xk, yk):
            at = _zip_member_offset(fh, infos[key])
            head = None if at is None else _npy_header(fh, at)
            if head is None or at + infos[key].file_size > size:
                return None
            nbytes = int(np.prod(head[0], dtype=np.int64)) * head[1].itemsize
            if head[2] + nbytes != at + infos[key].file_size:
                return None
            heads.append(head)
        (xs, xdt, xoff), (ys, ydt, yoff) = heads
        if (len(xs) != 2 or xs[1] < 1 or len(ys) not in (1, 2) or ys[0] != xs[0]
                or int(np.prod(ys[1:], dtype=np.int64)) != 1):
            return None
        return ArrayFile(p, "npz", xs[0], xs[1], xdt, xoff, y_offset=yoff, y_dtype=ydt)


def probe_array_files(sources, fmt: str, label_column, npz_keys=("X", "y")):
    """The sources as :class:`ArrayFile` s where every one can be read by row arithmetic
    (uncompressed .npy, .npz of stored members, one row layout for all), else None."""
    files = []
    for s in sources:
        f = _probe(Path(s), fmt, label_column, npz_keys)
        if f is None or f.n == 0 or (files and f.layout_key != files[0].layout_key):
            return None
        files.append(f)
    return files or None


def file_mapping(X) -> np.memmap | None:
    """The memmap behind ``X`` where ``X`` is a 2-D, C-ordered, numeric (view of a) memmap of
    a file whose reads see it as it is (mode "r", "r+" or "w+", not the private "c"): the
    rows :func:`memmap_array_file` can read from the file; else None."""
    m = X
    while isinstance(m, np.ndarray) and not isinstance(m, np.memmap):
        m = m.base
    if (not isinstance(m, np.memmap) or getattr(m, "_mmap", None) is None
            or not m.filename or m.mode == "c" or not isinstance(X, np.ndarray)
            or X.ndim != 2 or X.shape[0] == 0 or X.shape[1] < 1 or not X.flags.c_contiguous
            or X.dtype.hasobject or X.dtype.kind not in "biuf"):
        return None
    return m


def memmap_array_file(X, y) -> ArrayFile | None:
    """``X``'s rows as an :class:`ArrayFile` where ``X`` is (a C-ordered view of) a numpy
    memmap of a file that the file's reads see as it is (mode "r", "r+" or "w+", not the
    private "c"), with ``y`` its labels in memory; else None."""
    import mmap

    m = file_mapping(X)
    if m is None:
        return None
    y = np.asarray(y)
    if y.dtype.kind not in "biuf" or y.reshape(-1).shape[0] != X.shape[0]:
        return None
    # where X's first row lies in the file: the mapping starts at the offset rounded down
    # to the allocation granularity (as np.memmap maps it), X at its distance from there
    mapped = np.frombuffer(m._mmap, np.uint8).ctypes.data
    start = m.offset - m.offset % mmap.ALLOCATIONGRANULARITY
    y = np.ascontiguousarray(y.reshape(-1))  # no copy where it is one already
    return ArrayFile(str(m.filename), "memmap", X.shape[0], X.shape[1], X.dtype,
                     start + X.ctypes.data - mapped, y_dtype=y.dtype, y_array=y)


@dataclass
class PassPlan:
    """Runs and groups of a direct ingest (see module doc). Runs are in file order."""

    run_file: np.ndarray    # the file of each run
    run_start: np.ndarray   # its first row in that file
    run_rows: np.ndarray    # its rows
    run_group: np.ndarray   # its group
    group_blocks: np.ndarray  # blocks of each group, in block order
    block_sizes: np.ndarray  # rows of every block
    rows_per_run: int

    @property
    def n_groups(self) -> int:
        return int(self.group_blocks.shape[0])

    @property
    def first_block(self) -> np.ndarray:
        """The first block of each group (and the block count last)."""
        return np.concatenate(([0], np.cumsum(self.group_blocks)))

    def group_rows(self, g: int) -> int:
        """Rows of group g: its blocks'."""
        first = self.first_block
        return int(self.block_sizes[first[g]:first[g + 1]].sum())


def plan_passes(file_rows, row_bytes: int, n_blocks: int, group_bytes: int,
                rng: np.random.Generator, align: int = 1) -> PassPlan | None:
    """Cut the rows of files of ``file_rows`` rows into runs (of a multiple of ``align``
    rows where the groups are large enough) and deal the runs into the fewest groups of at most
    ``group_bytes`` (``row_bytes`` a row in memory) that hold whole blocks of ``n_blocks``;
    None where one block does not fit ``group_bytes``.

    The block sizes are the balanced ones of the bucket path. The runs are dealt to the blocks'
    *slots* (every consecutive ``n_blocks`` runs one to each, in a fresh random order) and a
    run goes to the group of its slot's block, so group g gets its share of runs from every
    part of the input; then the last rows of runs of groups over their block sizes' sum move
    to groups under it (a run split in two pieces), so that every group holds its blocks
    exactly.
    """
    n = int(sum(file_rows))
    group_rows = max(1, group_bytes // row_bytes)
    sizes = balanced_sizes(n, n_blocks)
    if sizes[0] > group_rows:  # a group of one block would not fit
        return None
    n_groups = min(n_blocks, -(-n // group_rows))
    while True:
        group_blocks = balanced_sizes(n_blocks, n_groups)
        target = np.add.reduceat(sizes, np.concatenate(([0], np.cumsum(group_blocks)[:-1])))
        if target.max() <= group_rows:
            break
        n_groups += 1
    run_bytes = min(max(group_bytes // RUNS_PER_GROUP, RUN_BYTES[0]), RUN_BYTES[1])
    most = int(target.min()) // MIN_RUNS_PER_GROUP
    per_run = max(1, min(run_bytes // row_bytes, most))
    if align <= most:  # whole pieces: each read by one pass
        per_run = max(align, per_run - per_run % align)
    files, starts, rows = [], [], []
    for i, m in enumerate(file_rows):
        st = np.arange(0, m, per_run, dtype=np.int64)
        files.append(np.full(st.shape, i, np.int64))
        starts.append(st)
        rows.append(np.minimum(per_run, m - st))
    run_file, run_start, run_rows = (np.concatenate(v) for v in (files, starts, rows))
    slot = Dealer(n_blocks, rng).deal(run_rows.shape[0])
    run_group = np.repeat(np.arange(n_groups), group_blocks)[slot]
    run_file, run_start, run_rows, run_group = _even_out(run_file, run_start, run_rows,
                                                         run_group, target)
    return PassPlan(run_file, run_start, run_rows, run_group, group_blocks, sizes, per_run)


def _even_out(run_file, run_start, run_rows, run_group, target):
    """Move the last rows of runs of groups over their ``target`` rows to groups under it
    (each move splits a run), and return the runs in file order."""
    have = np.bincount(run_group, weights=run_rows, minlength=target.shape[0]).astype(np.int64)
    short = [[int(g), int(target[g] - have[g])] for g in np.flatnonzero(have < target)]
    pieces = []  # (file, start, rows, group) cut off the end of runs
    rows = run_rows.copy()
    for g in np.flatnonzero(have > target).tolist():
        extra = int(have[g] - target[g])
        for r in np.flatnonzero(run_group == g)[::-1].tolist():
            while extra and rows[r] and short:
                k = min(extra, int(rows[r]), short[0][1])
                rows[r] -= k
                pieces.append((int(run_file[r]), int(run_start[r] + rows[r]), k, short[0][0]))
                extra -= k
                short[0][1] -= k
                if not short[0][1]:
                    short.pop(0)
            if not extra:
                break
    if pieces:
        pf, ps, pr, pg = (np.array(v, np.int64) for v in zip(*pieces))
        run_file, run_start = np.concatenate((run_file, pf)), np.concatenate((run_start, ps))
        rows, run_group = np.concatenate((rows, pr)), np.concatenate((run_group, pg))
    keep = rows > 0
    order = np.lexsort((run_start[keep], run_file[keep]))
    return (run_file[keep][order], run_start[keep][order], rows[keep][order],
            run_group[keep][order])


def _pread_into(fd: int, buf: memoryview, offset: int, path: str) -> None:
    while len(buf):
        if hasattr(os, "preadv"):
            got = os.preadv(fd, [buf], offset)
        else:  # pragma: no cover - platforms without preadv
            data = os.pread(fd, len(buf), offset)
            got = len(data)
            buf[:got] = data
        if got <= 0:
            raise IngestError("the file ended early (truncated while ingest read it)",
                              "Re-create the file and ingest again.", path=path)
        buf, offset = buf[got:], offset + got


class _GroupReader:
    """Reads one group's runs from the files into one array, and the sources' digests.

    A source's digest does not depend on the plan: it is the sha256 of the sha256 digests of
    its *pieces* of ``piece_rows`` rows (about 32 KiB), in order (an .npz's labels after its
    rows). A piece is hashed on a side thread by the pass that reads its first row; where
    that run ends inside the piece, the rest of the piece is read beside it (a run split to
    even out the groups: a few pieces an ingest).
    """

    def __init__(self, files: list[ArrayFile], plan: PassPlan, piece_rows: int,
                 counter: IOCount, bar):
        self.files, self.plan, self.counter, self.bar = files, plan, counter, bar
        self.piece_rows = piece_rows
        self.fds = []
        for f in files:
            self.fds.append(os.open(f.path, os.O_RDONLY))
            # the runs between ours belong to other passes: no read-ahead
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self.fds[-1], 0, 0, os.POSIX_FADV_RANDOM)
        self.file_row0 = np.concatenate(([0], np.cumsum([f.n for f in files])))
        self.pieces = [[[None] * -(-f.n // piece_rows) for f in files] for _ in range(2)]
        self.hasher = ThreadPoolExecutor(1)
        self.pending: dict = {}  # group -> its pieces' hash futures

    def _read(self, buf: memoryview, i: int, offset: int) -> int:
        _pread_into(self.fds[i], buf, offset, self.files[i].path)
        self.counter.add_read(len(buf))
        self.bar.update(len(buf))
        return len(buf)

    def _hash_run(self, g: int, part: int, i: int, a: int, k: int, buf: memoryview,
                  item: int, offset: int) -> None:
        """Hash the pieces of file i whose first row is in rows a..a+k (``buf``, ``item``
        bytes a row, row 0 at ``offset`` in the file)."""
        h, n = self.piece_rows, self.files[i].n
        q0, q1 = -(-a // h), -(-(a + k) // h)
        if q0 == q1:
            return
        hi = min(n, q1 * h)
        rest = None
        if hi > a + k:  # the last piece runs past this run: its rest is read here too
            rest = memoryview(bytearray((hi - a - k) * item))
            self._read(rest, i, offset + (a + k) * item)
        self.pending.setdefault(g, []).append(self.hasher.submit(
            self._hash, self.pieces[part][i], q0, q1, buf[(q0 * h - a) * item:], rest,
            h * item))

    @staticmethod
    def _hash(into, q0, q1, buf, rest, step):
        for q in range(q0, q1):
            piece = buf[(q - q0) * step:(q - q0 + 1) * step]
            h = hashlib.sha256(piece)
            if q == q1 - 1 and rest is not None:
                h.update(rest)
            into[q] = h.digest()

    def read(self, g: int):
        """``(rows, labels or None, row ids)`` of group g, the rows as stored in the files."""
        f0 = self.files[0]
        runs = np.flatnonzero(self.plan.run_group == g)
        m = self.plan.group_rows(g)
        X = np.empty((m, f0.width), f0.dtype)
        y = None if f0.y_dtype is None else np.empty(m, f0.y_dtype)
        ids = np.empty(m, np.int64)
        xb = memoryview(X.reshape(-1).view(np.uint8))
        yb = None if y is None else memoryview(y.view(np.uint8))
        at = 0
        for r in runs.tolist():
            check_stop()
            i = int(self.plan.run_file[r])
            f = self.files[i]
            a, k = int(self.plan.run_start[r]), int(self.plan.run_rows[r])
            piece = xb[at * f.row_bytes:(at + k) * f.row_bytes]
            self._read(piece, i, f.x_offset + a * f.row_bytes)
            self._hash_run(g, 0, i, a, k, piece, f.row_bytes, f.x_offset)
            if f.y_array is not None:  # labels in memory: hashed whole in digests()
                y[at:at + k] = f.y_array[a:a + k]
            elif y is not None:
                s = f.y_dtype.itemsize
                ypiece = yb[at * s:(at + k) * s]
                self._read(ypiece, i, f.y_offset + a * s)
                self._hash_run(g, 1, i, a, k, ypiece, s, f.y_offset)
            ids[at:at + k] = self.file_row0[i] + np.arange(a, a + k)
            at += k
        return X, y, ids

    def wait(self, g: int) -> None:
        """Every piece group g read is hashed (its buffer may go)."""
        for fut in self.pending.pop(g, ()):
            fut.result()

    def digests(self) -> list[str]:
        for g in list(self.pending):
            self.wait(g)
        out = []
        for i, f in enumerate(self.files):
            h = hashlib.sha256()
            for part in (0, 1) if f.y_dtype is not None else (0,):
                if part == 1 and f.y_array is not None:
                    step = self.piece_rows * f.y_array.itemsize
                    labels = memoryview(f.y_array.view(np.uint8))
                    self.pieces[1][i] = [hashlib.sha256(labels[a:a + step]).digest()
                                         for a in range(0, len(labels), step)]
                for d in self.pieces[part][i]:
                    h.update(d)
            out.append(h.hexdigest())
        return out

    def close(self) -> None:
        self.hasher.shutdown(wait=True, cancel_futures=True)
        for fd in self.fds:
            os.close(fd)


def _block_values(X_raw, sel, f: ArrayFile, d: int, ids, files, file_row0):
    """Block rows ``sel`` of a group: ``(X, labels, sq, nnz)``, the features as float32
    (columns padded to ``d``), the raw labels (float64, or None where they are not in the
    rows), the float32 squared norms and the non-zeros; a NaN or infinite value is refused
    naming its file, row and column."""
    if f.label_col is None:
        keep = slice(None)
    elif f.label_col in (0, f.width - 1):
        keep = slice(1, None) if f.label_col == 0 else slice(0, -1)
    else:
        keep = np.r_[0:f.label_col, f.label_col + 1:f.width]
    labels = None if f.label_col is None else X_raw[sel, f.label_col].astype(np.float64)
    with np.errstate(over="ignore"):  # via float64 as the parsers do: overflow is infinite
        if f.dtype == np.float32 and d == f.n_features:
            X = X_raw[sel, keep] if isinstance(keep, slice) else X_raw[sel][:, keep]
        else:
            src = X_raw[sel][:, keep]
            X = np.zeros((sel.shape[0], d), np.float32)
            X[:, :f.n_features] = src.astype(np.float64, copy=False)
    sq = np.empty(X.shape[0], np.float64)
    nnz, bad = K.dense_row_stats(np.ascontiguousarray(X), sq)
    if bad >= 0:
        c = int(np.flatnonzero(~np.isfinite(X[bad]))[0])
        path, row = _source_row(int(ids[bad]), files, file_row0)
        raise NonFiniteError(f"a value in row {row} is NaN or infinite", path=path,
                             column=c + 1)
    with np.errstate(over="ignore"):  # inf where it overflows: StoreOutput.write refuses it
        return X, labels, sq.astype(np.float32), int(nnz)


@dataclass
class _Layout:
    """What the direct ingest decides before it reads: the store's shape and the plan."""

    parsed: Parsed
    shape: Shape
    plan: PassPlan
    row_bytes: int    # a row of a group in memory (as stored in the file, label, row id)
    piece_rows: int   # rows of a digest piece
    block_need: int   # bytes a block takes while it is built (its balanced size's)


def _decide_layout(files: list[ArrayFile], budget, *, layout, n_blocks, block_rows,
                   n_features, shards, rng) -> _Layout | None:
    """The store's shape and the passes' plan, from the files' headers alone; None where the
    bucket path must take over (a CSR layout asked for, too few rows for the shards, or a
    group that does not fit beside a block)."""
    f0 = files[0]
    p = Parsed()
    p.formats = {f.fmt for f in files}
    p.n = sum(f.n for f in files)
    p.n_columns, p.min_index, p.max_index = f0.n_features, 0, f0.n_features - 1
    p.nnz = p.n * f0.n_features  # dense, until the first group says otherwise
    shape = Shape(p, layout="dense" if layout == "auto" else layout, n_features=n_features,
                  zero_based="auto", n_blocks=n_blocks, block_rows=block_rows,
                  limit=budget.limit, check=True)
    if shape.layout != "dense" or (shards and p.n < shards):
        return None
    if shards:  # whole rounds of K blocks, as the bucket path has them
        shape.n_blocks = min(p.n, shards * -(-shape.n_blocks // shards))
    # a group shares the cap with the block being built (x3, as the bucket path's) and an
    # eighth kept spare
    block_need = check_block_fits(budget, -(-p.n // shape.n_blocks), shape.bytes_per_row)
    row_bytes = f0.row_bytes + (0 if f0.y_dtype is None else f0.y_dtype.itemsize) + 8
    group_bytes = budget.limit - budget.used - block_need - budget.limit // 8
    if p.n * row_bytes > group_bytes:  # passes: the next group is read while one is written
        group_bytes //= 2
    piece_rows = max(1, PIECE_BYTES // f0.row_bytes)
    plan = None if group_bytes <= 0 else plan_passes(
        [f.n for f in files], row_bytes, shape.n_blocks, group_bytes, rng, align=piece_rows)
    if plan is None:
        return None
    return _Layout(p, shape, plan, row_bytes, piece_rows, block_need)


def _write_group(out: StoreOutput, lay: _Layout, g: int, first_block: int, rows, labels_raw,
                 ids, files, file_row0, spool, rng) -> int:
    """Deal group g's rows into its blocks, write them (first block ``first_block``), spool
    their raw labels in the written order; returns the non-zeros written."""
    f0, d = files[0], lay.shape.d
    k, m = int(lay.plan.group_blocks[g]), ids.shape[0]
    deal = Dealer(k, rng).deal(m)
    # the blocks of one more row first, as the plan's balanced sizes have them
    rank = np.argsort(-np.bincount(deal, minlength=k), kind="stable")
    deal = np.argsort(rank)[deal]
    order = np.argsort(deal, kind="stable")
    bounds = np.searchsorted(deal[order], np.arange(k + 1))
    nnz = 0
    for j in range(k):
        check_stop()
        sel = order[bounds[j]:bounds[j + 1]]
        X, labels, sq, block_nnz = _block_values(rows, sel, f0, d, ids[sel], files, file_row0)
        if labels is None:
            labels = labels_raw[sel].astype(np.float64)
        _check_labels(labels, ids[sel], files, file_row0)
        lay.parsed.tracker.add(labels)
        nnz += block_nnz
        perm = out.write(first_block + j, X, None, ids[sel], rng, sq=sq, nnz=block_nnz)
        labels[perm].tofile(spool)
    return nnz


def ingest_direct(tmp: Path, files: list[ArrayFile], *, budget, layout, task, n_blocks,
                  block_rows, n_features, positive_label, source_names, block_orderer, seed,
                  rng, counter: IOCount, progress, shards=None, value_codes="auto"):
    """Write the store into ``tmp`` in group passes (see module doc).

    Returns ``(parsed, shape, task, info)`` (``info``: ``passes``, ``run_rows``,
    ``read_seconds``: the time spent waiting for reads), or None where the bucket path must
    take over (see :func:`_decide_layout`; or an auto layout that
    the first group shows sparse: nothing is written then).
    """
    from tqdm.auto import tqdm

    lay = _decide_layout(files, budget, layout=layout, n_blocks=n_blocks,
                         block_rows=block_rows, n_features=n_features, shards=shards, rng=rng)
    if lay is None:
        return None
    p, shape, plan = lay.parsed, lay.shape, lay.plan
    first_block = plan.first_block
    spool_path = tmp / "labels.spool"
    bar = tqdm(total=sum(f.source_bytes for f in files), unit="B", unit_scale=True,
               desc="ingest", disable=not progress, leave=False)
    reader = _GroupReader(files, plan, lay.piece_rows, counter, bar)
    prefetch = ThreadPoolExecutor(1)
    held: dict = {}  # group -> the bytes reserved for it while it is in memory

    def start_reading(g):
        held[g] = plan.group_rows(g) * lay.row_bytes
        budget.reserve(held[g], f"ingest group {g + 1} of {plan.n_groups}")
        return prefetch.submit(reader.read, g)

    out = None
    waited = 0.0
    try:
        with budget.reservation(lay.block_need, "ingest block"), \
                open(spool_path, "wb") as spool:
            reading = start_reading(0)
            for g in range(plan.n_groups):
                t0 = time.perf_counter()
                X_raw, y_raw, ids = reading.result()
                waited += time.perf_counter() - t0
                if out is None:  # the first group decides an auto layout
                    if layout == "auto" and (_nonzero_features(X_raw, files[0])
                                             < DENSE_THRESHOLD * ids.shape[0] * shape.d):
                        return None
                    out = StoreOutput(tmp, plan.block_sizes, shape=shape, task=task,
                                      metadata=store_metadata(
                                          p, shape, task=task, label_map={}, seed=seed,
                                          positive_label=positive_label,
                                          n_features=n_features),
                                      nnz=None, block_orderer=block_orderer, seed=seed,
                                      shards=shards, value_codes=value_codes)
                if g + 1 < plan.n_groups:
                    reading = start_reading(g + 1)
                p.nnz = (0 if g == 0 else p.nnz) + _write_group(
                    out, lay, g, int(first_block[g]), X_raw, y_raw, ids, files,
                    reader.file_row0, spool, rng)
                reader.wait(g)  # the runs' digests are taken before their memory goes
                del X_raw, y_raw, ids
                budget.release(held.pop(g))
        for f, digest in zip(files, reader.digests()):
            shown = source_names.get(f.path)
            p.sources.append({"name": shown or Path(f.path).name,
                              "path": shown or str(Path(f.path).resolve()), "rows": f.n,
                              "sha256_pieces": digest, "piece_rows": lay.piece_rows,
                              "bytes": f.source_bytes})
            p.bytes_in += p.sources[-1]["bytes"]
        # every label seen: the task, and the stored labels block by block from the spool
        task_, label_map, mapper = decide_task(p.tracker, task, positive_label,
                                               ", ".join(f.path for f in files[:3]))
        counter.written += os.path.getsize(spool_path)
        with open(spool_path, "rb") as spool:
            for c, rows in enumerate(plan.block_sizes.tolist()):
                raw = np.fromfile(spool, np.float64, rows)
                counter.add_read(raw.nbytes)
                out.set_labels(c, mapper(raw), task=task_)
        shape.density = p.nnz / float(max(p.n, 1) * shape.d)
        out.finish(counter, task=task_, label_map=label_map, nnz=p.nnz, density=shape.density,
                   sources=p.sources)
        out = None
    except BaseException:
        if out is not None:
            out.abort()
        raise
    finally:
        prefetch.shutdown(wait=True, cancel_futures=True)
        for nbytes in held.values():
            budget.release(nbytes)
        reader.close()
        bar.close()
        spool_path.unlink(missing_ok=True)
    return p, shape, task_, {"passes": plan.n_groups, "run_rows": plan.rows_per_run,
                             "read_seconds": waited}


def _nonzero_features(X_raw, f: ArrayFile) -> int:
    nz = int(np.count_nonzero(X_raw))
    if f.label_col is not None:
        nz -= int(np.count_nonzero(X_raw[:, f.label_col]))
    return nz


def _check_labels(labels, ids, files, file_row0) -> None:
    bad = ~np.isfinite(labels)
    if bad.any():
        path, row = _source_row(int(ids[np.flatnonzero(bad)[0]]), files, file_row0)
        raise NonFiniteError(f"the label in row {row} is NaN or infinite", path=path)


def _source_row(row_id: int, files, file_row0) -> tuple[str, int]:
    """The file and 1-based row (as an error names them) of the store row id ``row_id``."""
    i = int(np.searchsorted(file_row0, row_id, "right")) - 1
    return files[i].path, row_id - int(file_row0[i]) + 1
