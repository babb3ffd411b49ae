"""The numba search loop and what it reads in place: decoded trees, mirrored row slices,
cached store blocks. Its reference is the Python loop (the same search, entry by entry)."""

import gc
import struct
import weakref
import zlib

import numpy as np
import pytest
from _forest_helpers import blobs, brute_force, make_indexed

from ooc_learn.api import ingest_arrays
from ooc_learn.index._record_kernels import CRC_TABLE, decode_records
from ooc_learn.index.forest import Forest, open_forest
from ooc_learn.index.search_config import SearchConfig
from ooc_learn.index.kernel_args import NodeArrays
from ooc_learn.index.records import decode_node, encode_nodes
from ooc_learn.index.node_record import CHILD_BYTES as RECORD_CHILD_BYTES
from ooc_learn.index.node_record import FIXED_BYTES as RECORD_FIXED_BYTES
from ooc_learn.index.resident import CHILD_BYTES, NODE_SLOT_BYTES
from ooc_learn.index.tree import build_block_tree
from ooc_learn.storage.budget import MemoryBudget
from ooc_learn.storage.format import INDEX_DIR


def _python_only(f):
    """The forest without its resident arrays: every pop goes through Python."""
    f.node_cache.reset()
    f.node_cache.forget_rows()
    f.node_cache.enabled = False
    return f


def _under_8m(tmp_path, data_rng, n, n_blocks):
    """An indexed store of ``n`` blob rows under an 8M cap, the cap and a query w."""
    X, y = blobs(data_rng, n=n, d=6)
    budget = MemoryBudget("8M")
    store, _ = make_indexed(X, y, tmp_path, n_blocks=n_blocks, width=4, leaf_size=8,
                            budget=budget)
    return store, budget, data_rng.normal(size=6)


@pytest.mark.parametrize("csr", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_numba_loop_equals_the_python_loop(tmp_path, data_rng, csr, bias):
    X, y = blobs(data_rng, n=2500, d=7, csr=csr)
    store, _ = make_indexed(X, y, tmp_path / "a", n_blocks=3, width=5, leaf_size=6)
    twin, _ = make_indexed(X, y, tmp_path / "b", n_blocks=3, width=5, leaf_size=6)
    d = 8 if bias else 7
    with store.forest() as fast, _python_only(twin.forest()) as slow:
        for i in range(6):
            w = data_rng.normal(size=d)
            wt = w + 0.3 * data_rng.normal(size=d)
            kw = dict(w_outer=wt, s=0.5, n=[1, 40, 300, None, 50, 200][i], seed=i,
                      loss="sqhinge" if i % 2 else "hinge")
            if i == 4:
                kw["min_precision"] = 0.6
            if i == 2:
                kw["max_read"] = 500
            if i == 5:
                fast.shrink(threshold=0.5)
                slow.shrink(threshold=0.5)
            rows_f, ne_f = fast.query(w, **kw)
            rows_s, ne_s = slow.query(w, **kw)
            assert np.array_equal(rows_f, rows_s) and ne_f == ne_s
            for key in ("nodes_expanded", "leaves_scanned", "nodes_skipped", "pivots_scored",
                        "pivots_examined", "rows_shrunk", "low_precision", "rows_read",
                        "read_limited"):
                assert fast.last_query[key] == slow.last_query[key], key
        rows, n_e = fast.query(w, n=None, s=None)
        shrunk = np.flatnonzero(fast._shrunk)
        assert np.array_equal(np.sort(rows), brute_force(store, w, s=None, exclude=shrunk))
        # the fast forest served (nearly) every pop itself: its trees are decoded
        assert fast.node_cache.loaded.all() and len(fast.node_cache) > 0
        assert len(slow.node_cache) == 0


def _tree_records(rng, n=500):
    X, _ = blobs(rng, n=n, d=6)
    _, tree = build_block_tree(X, width=4, leaf_size=10, seed=2)
    return tree, dict(encode_nodes(5, tree, 1000))


def _decode(recs, n_nodes):
    vids = np.array(list(recs), np.int64)
    parts = list(recs.values())
    offs = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offs[1:])
    buf = np.frombuffer(b"".join(parts), np.uint8)
    kids = sum(max(0, (len(p) - RECORD_FIXED_BYTES) // RECORD_CHILD_BYTES) for p in parts)
    nodes = len(parts)
    arrs = [np.zeros(nodes, np.int64) for _ in range(4)] + [
        np.zeros(kids, t) for t in (np.int32, np.int64, np.int64, np.bool_, np.int64,
                                    np.float32, np.float32, np.float32)]
    node_slot = np.full(n_nodes, -1, np.int32)
    base = np.zeros(6, np.int64)  # tree 5 starts at node_slot[0]
    bad, used, pos = decode_records(buf, offs, vids, 5, n_nodes, CRC_TABLE, 0, 0,
                                    NodeArrays(base, node_slot, *arrs))
    return bad, node_slot, arrs


def test_bulk_decoder_equals_decode_node(data_rng):
    tree, recs = _tree_records(data_rng)
    bad, node_slot, arrs = _decode(recs, tree.n_nodes)
    assert bad == -1
    first, k, start, stop = arrs[:4]
    for v, raw in recs.items():
        want = decode_node(raw, 5, v)
        ns = node_slot[v]
        assert ns >= 0 and start[ns] == want.start and stop[ns] == want.stop
        a, z = first[ns], first[ns] + k[ns]
        for got, col in zip(arrs[4:], (want.child_id, want.child_start, want.child_stop,
                                       want.child_leaf, want.pivot_row, want.pivot_sqnorm,
                                       want.radius, want.radius_aug)):
            assert np.array_equal(got[a:z], col)  # float16 radii too: exactly the same value
    assert (node_slot >= 0).sum() == len(recs)


def _reseal(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF)


@pytest.mark.parametrize("damage", ["flip", "tree", "bounds", "pivot", "short", "k"])
def test_bulk_decoder_finds_the_record_decode_node_refuses(data_rng, damage):
    tree, recs = _tree_records(data_rng)
    v = list(recs)[len(recs) // 2]
    raw = bytearray(recs[v])
    body = raw[:-4]
    k = struct.unpack_from("<i", body, 32)[0]
    if damage == "flip":
        raw[40] ^= 0x10
    elif damage == "tree":
        struct.pack_into("<i", body, 8, 6)
        raw = _reseal(bytes(body))
    elif damage == "bounds":  # child 1 ends before it starts
        struct.pack_into("<i", body, 36 + 8, struct.unpack_from("<i", body, 36 + 4)[0] - 1)
        raw = _reseal(bytes(body))
    elif damage == "pivot":  # a pivot outside the node's rows
        struct.pack_into("<i", body, 36 + 4 * (k + 1) + k, 10 ** 6)
        raw = _reseal(bytes(body))
    elif damage == "short":
        raw = raw[:20]
    else:  # a child count that does not match the record's length
        struct.pack_into("<i", body, 32, k + 1)
        raw = _reseal(bytes(body))
    recs[v] = bytes(raw)
    bad, _, _ = _decode(recs, tree.n_nodes)
    assert list(recs)[bad] == v
    with pytest.raises(ValueError, match=f"node {v} of tree 5"):
        decode_node(recs[v], 5, v)


def test_cached_blocks_are_read_in_place_and_let_go_when_evicted(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 9)).astype(np.float32)
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=3000) > 0, 1.0, -1.0).astype(np.float32)
    with ingest_arrays(X, y, tmp_path / "s", build_index=True, n_blocks=3, width=4,
                       leaf_size=12, seed=1, memory="256M") as store:
        w = rng.normal(size=9)
        # rows taken from cached blocks count as read as the Python loop counts rows it
        # caches (once per span while cached): what IBCD's cost model was tuned on
        plain = Forest(store.path / INDEX_DIR, read_range=store.read_range,
                       n_samples=store.n_samples, n_features=store.n_features,
                       block_offsets=store.block_offsets, budget=store.budget)
        with plain:
            plain.query(w, n=200)
            want_read = plain.last_query["rows_read"]
        for b in range(store.n_blocks):
            store.read_block(b)
        with open_forest(store) as f:
            f.query(w, n=200)
            assert f.last_query["rows_read"] == want_read > 0
            Xa, ya, _ = store.read_range(0, store.n_samples)
            m = ya * (Xa @ w)
            want = np.flatnonzero((m < 1) & (m >= -1))
            rows, _ = f.query(w, n=None)
            assert np.array_equal(np.sort(rows), want)
            reads = store.rows_read
            rows, _ = f.query(w, n=None, seed=4)
            # every tree decoded, every block cached: nothing read, no row cached by the forest
            assert np.array_equal(np.sort(rows), want)
            assert store.rows_read == reads and f.last_query["rows_read"] == 0
            assert (f.node_cache.blk_slot >= 0).all()
            # a block the store's cache lets go is let go by the search as well
            ref = weakref.ref(store.read_block(1)[0])
            store.block_cache.pop(("block", 1))
            gc.collect()
            assert ref() is None and f.node_cache.blk_slot[1] == -1
            rows, _ = f.query(w, n=None, seed=5)
            assert np.array_equal(np.sort(rows), want) and f.last_query["rows_read"] > 0


def test_decoded_trees_are_given_back_under_pressure_and_decoded_again(tmp_path, data_rng):
    store, budget, w = _under_8m(tmp_path, data_rng, 1500, 3)
    with store.forest() as f:
        rows, _ = f.query(w, n=None)
        res = f.node_cache
        assert res.loaded.all() and res.nbytes > res.fixed
        # rows, then every tree
        pressure = budget.available + f.cache.nbytes + res.arr_bytes
        budget.reserve(pressure, "pressure")
        assert f.cache.nbytes == 0 and res.nbytes == res.fixed and not res.loaded.any()
        assert res.n_slots >= 0 and not res._slots  # no row slice mirrored any more
        budget.release(pressure)
        again, _ = f.query(w, n=None)
        assert np.array_equal(np.sort(again), np.sort(rows)) and res.loaded.all()


def test_pressure_gives_back_the_trees_decoded_first_and_keeps_the_rest(tmp_path, data_rng):
    store, budget, w = _under_8m(tmp_path, data_rng, 3000, 4)
    with store.forest() as f:
        res = f.node_cache
        want = {}
        for t in range(4):
            res.load_tree(t)
        for t in range(4):
            for v in range(int(res.n_nodes[t])):
                ns = res.node_slot[res.base[t] + v]
                if ns >= 0:
                    want[t, v] = res.record(ns)
        first = res.trees[0][1] * NODE_SLOT_BYTES + res.trees[0][3] * CHILD_BYTES
        f.cache.clear()
        pressure = budget.available + 1  # one byte: tree 0 goes
        budget.reserve(pressure, "pressure")
        assert not res.loaded[0] and res.loaded[1:].all() and list(res.trees) == [1, 2, 3]
        assert res.nbytes == res.fixed + sum(sn * NODE_SLOT_BYTES + pn * CHILD_BYTES
                                             for _, sn, _, pn in res.trees.values())
        assert res.nbytes <= budget.used and first > 0
        for (t, v), rec in want.items():
            if t:  # the trees kept were moved down intact
                got = res.record(res.node_slot[res.base[t] + v])
                assert all(np.array_equal(a, b) for a, b in zip(got, rec))
        budget.release(pressure)
        rows, _ = f.query(w, n=None)
        assert np.array_equal(np.sort(rows), brute_force(store, w)) and res.loaded.all()


def test_roots_are_cached_apart_from_the_rows_and_given_back_last(tmp_path, data_rng):
    # every query starts from every root: their records and pivot rows stay in a cache of
    # their own, which the slices a capped query reads (the row cache) do not push out
    roots_read_pivots = SearchConfig(span_bytes=4096)  # no root is read whole
    store, budget, w = _under_8m(tmp_path, data_rng, 3000, 4)
    off = store.block_offsets
    with _python_only(store.forest(search=roots_read_pivots)) as f:
        read = []
        pivots = f._read_pivots
        f._read_pivots = lambda node: read.append((node.start, node.stop)) or pivots(node)
        rows, _ = f.query(w, n=None)
        roots = {(int(off[t]), int(off[t + 1])) for t in range(4)}
        assert roots <= set(read)
        assert all(("node", t) in f.roots and ("pivots", t, 0) in f.roots for t in range(4))
        f.cache.clear()  # as the slices of a capped query's reads would
        read.clear()
        again, _ = f.query(w, n=None, seed=1)
        assert np.array_equal(np.sort(again), np.sort(rows))
        assert read and not roots & set(read)  # inner nodes' pivots read again, no root's
        # pressure takes the row cache first, the roots last
        f.query(w, n=None, seed=2)
        assert f.cache.nbytes > 0 and f.roots.nbytes > 0
        held = f.roots.nbytes
        pressure = budget.available + f.cache.nbytes
        budget.reserve(pressure, "pressure")
        assert f.cache.nbytes == 0 and f.roots.nbytes == held
        budget.reserve(1, "more pressure")
        assert f.roots.nbytes < held
        budget.release(pressure + 1)
        again, _ = f.query(w, n=None, seed=3)
        assert np.array_equal(np.sort(again), brute_force(store, w))
    with store.forest(search=roots_read_pivots) as f:  # the numba loop reads the roots' pivot rows in place
        f.query(w, n=None)
        res = f.node_cache
        assert all(res.pv_slot[res.base[t]] >= 0 for t in range(4))
