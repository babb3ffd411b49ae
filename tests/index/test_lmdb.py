"""Persistence: records, map size, atomic build, concurrent readers, and every bad state."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import zlib

import lmdb
import numpy as np
import pytest
from _forest_helpers import blobs, make_indexed

from ooc_learn.index.lmdb_io import MANIFEST, ForestWriter, index_nbytes
from ooc_learn.index.records import (INDEX_FORMAT_VERSION, META_KEY, decode_node, encode_node,
                                     encode_nodes)
from ooc_learn.index.tree import build_block_tree
from ooc_learn.storage.errors import IndexStateError, ParameterError

FIX = r"ooc-index .* --overwrite"


def _records(path):
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        out = {bytes(k): bytes(v) for k, v in txn.cursor()}
    env.close()
    return out


@pytest.mark.parametrize("density", [0.2, 1.0])  # CSR and dense rows
def test_node_record_round_trip(data_rng, density):
    X, _ = blobs(data_rng, n=400, d=6, csr=True, density=density)
    perm, tree = build_block_tree(X, width=4, leaf_size=10, seed=2)
    for v in np.flatnonzero(tree.n_children > 0):
        node = decode_node(encode_node(3, tree, int(v), 1000), 3, int(v))
        kids = np.arange(tree.first_child[v], tree.first_child[v] + tree.n_children[v])
        assert node.start == tree.start[v] + 1000 and node.stop == tree.stop[v] + 1000
        assert np.array_equal(node.child_id, kids)
        assert np.array_equal(node.child_start, tree.start[kids] + 1000)
        assert np.array_equal(node.child_leaf, tree.n_children[kids] == 0)
        assert np.array_equal(node.pivot_row, tree.pivot_row[kids] + 1000)
        assert np.array_equal(node.child_stop, tree.stop[kids] + 1000)
        assert np.array_equal(node.pivot_sqnorm, tree.pivot_sqnorm[kids])
        # format 2: no pivot vectors (rows live in data.h5), the covering radii instead
        for got, want in ((node.radius, tree.radius[kids]),
                          (node.radius_aug, tree.radius_aug[kids])):
            # float16 rounded down: never a tighter radius than the true one
            assert np.all(got <= want) and np.allclose(got, want, rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("n", [400, 5])  # internal nodes; a root that is a leaf
def test_whole_tree_encoding_equals_node_by_node(data_rng, n):
    X, _ = blobs(data_rng, n=400, d=6)
    _, tree = build_block_tree(X[:n], width=4, leaf_size=10, seed=2)
    got = dict(encode_nodes(7, tree, 300))
    want = {v: encode_node(7, tree, v, 300) for v in range(tree.n_nodes)
            if v == 0 or tree.n_children[v] > 0}
    assert got == want


def test_build_is_byte_identical_for_a_seed(tmp_path, data_rng):
    X, y = blobs(data_rng, n=900, d=7)
    make_indexed(X, y, tmp_path / "a", n_blocks=3, seed=5)
    make_indexed(X, y, tmp_path / "b", n_blocks=3, seed=5)
    make_indexed(X, y, tmp_path / "c", n_blocks=3, seed=6)
    a, b, c = (_records(tmp_path / p / "index.lmdb") for p in "abc")
    assert a == b and a != c
    meta = json.loads(a[META_KEY])
    assert meta["n_samples"] == 900 and meta["block_offsets"] == [0, 300, 600, 900]


def test_map_size_is_computed_and_the_index_is_small(tmp_path, data_rng):
    # wide dense rows: every internal node record spills into overflow pages
    X = data_rng.random((6000, 500), dtype=np.float32)
    X[X < 0.5] = 0
    n_blocks, offs = 3, [0, 2000, 4000, 6000]
    w = ForestWriter(tmp_path / "index.lmdb", n_blocks=n_blocks, n_samples=6000,
                     n_features=500, width=10, leaf_size=50, seed=0)
    for b in range(n_blocks):
        _, tree = build_block_tree(X[offs[b]:offs[b + 1]], width=10, leaf_size=50, seed=b)
        w.add_tree(b, offs[b], tree)
    assert w.transactions == 3 and w.map_retries == 0 and w.map_grows >= 1
    w.close()
    # rows live in data.h5, not here: the index holds pivots only
    assert index_nbytes(tmp_path / "index.lmdb") < 0.25 * X.nbytes


def test_incomplete_writer_refuses_and_leaves_nothing(tmp_path, data_rng):
    X, _ = blobs(data_rng, n=100, d=3)
    _, tree = build_block_tree(X, width=3, leaf_size=10)
    w = ForestWriter(tmp_path / "index.lmdb", n_blocks=2, n_samples=200, n_features=3,
                     width=3, leaf_size=10, seed=0)
    w.add_tree(0, 0, tree)
    with pytest.raises(ParameterError, match="'block_id' parameter of ForestWriter.add_tree"):
        w.add_tree(0, 0, tree)
    with pytest.raises(IndexStateError, match=r"incomplete: trees of blocks \[1\]"):
        w.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ParameterError, match="'width' parameter of ForestWriter"):
        ForestWriter(tmp_path / "x", n_blocks=1, n_samples=1, n_features=1, width=1,
                     leaf_size=1, seed=0)


def test_store_without_index(tmp_path, data_rng):
    X, y = blobs(data_rng, n=100, d=3)
    store, _ = make_indexed(X, y, tmp_path)
    # a folder without its data: damaged, not missing (ooc-info said "index yes" of it)
    (tmp_path / "index.lmdb" / "data.mdb").unlink()
    with pytest.raises(IndexStateError, match=f"store {tmp_path} is damaged .*a folder without "
                                              f"the index's data.mdb.*Rebuild it with "
                                              f"`ooc-index {tmp_path} --overwrite`"):
        store.forest()
    import shutil

    shutil.rmtree(tmp_path / "index.lmdb")
    with pytest.raises(IndexStateError, match=f"store {tmp_path} has no index.*Build it with "
                                              f"`ooc-index {tmp_path} --overwrite`"):
        store.forest()


def _rewrite(path, manifest_version=INDEX_FORMAT_VERSION, **changes):
    """Edit the meta record and reseal the files as a writer of that version would."""
    env = lmdb.open(str(path), map_size=1 << 24)
    with env.begin(write=True) as txn:
        meta = json.loads(txn.get(META_KEY))
        meta.update(changes)
        txn.put(META_KEY, json.dumps(meta).encode())
    env.close()
    raw = (path / "data.mdb").read_bytes()
    (path / MANIFEST).write_text(json.dumps({
        "format_version": manifest_version,
        "data.mdb": {"size": len(raw), "crc32": zlib.crc32(raw) & 0xFFFFFFFF}}))


@pytest.mark.parametrize("where", ["manifest", "meta"])
def test_index_of_another_format_version(tmp_path, data_rng, where):
    X, y = blobs(data_rng, n=100, d=3)
    store, _ = make_indexed(X, y, tmp_path)
    if where == "manifest":
        _rewrite(tmp_path / "index.lmdb", manifest_version=99)
    else:
        _rewrite(tmp_path / "index.lmdb", format_version=99)
    with pytest.raises(IndexStateError, match=f"written by index format 99; this is format "
                                              f"{INDEX_FORMAT_VERSION}.*{FIX}"):
        store.forest()


def test_edited_files_fail_the_manifest(tmp_path, data_rng):
    X, y = blobs(data_rng, n=100, d=3)
    store, _ = make_indexed(X, y, tmp_path)
    env = lmdb.open(str(tmp_path / "index.lmdb"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"x", b"y")
    env.close()
    with pytest.raises(IndexStateError, match=f"corrupted or incomplete: .*{FIX}"):
        store.forest()
    (tmp_path / "index.lmdb" / MANIFEST).unlink()
    with pytest.raises(IndexStateError, match="manifest is missing"):
        store.forest()


@pytest.mark.parametrize("change, match", [
    (dict(n_samples=101), "index n_samples=100, store n_samples=101"),
    (dict(n_features=4), "index n_features=3, store n_features=4"),
    (dict(block_offsets=[0, 50, 100]), "index n_blocks=3, store n_blocks=2"),
    (dict(block_offsets=[0, 30, 70, 100]), "block row offsets differ"),
])
def test_index_that_does_not_match_the_store(tmp_path, data_rng, change, match):
    X, y = blobs(data_rng, n=100, d=3)
    store, _ = make_indexed(X, y, tmp_path, leaf_size=4)
    if "n_samples" in change:
        store.n_samples = 101
    if "n_features" in change:
        store.n_features = 4
    if "block_offsets" in change:
        store.block_offsets = np.array(change["block_offsets"])
    with pytest.raises(IndexStateError, match=f"does not match the store: .*{match}.*{FIX}"):
        store.forest()


def test_rows_rewritten_after_the_index_was_built(tmp_path, data_rng):
    X, y = blobs(data_rng, n=300, d=4)
    store, _ = make_indexed(X, y, tmp_path, leaf_size=8)
    store.X = store.X[::-1].copy()  # same shape, other row order: offsets alone cannot tell
    with pytest.raises(IndexStateError, match=f"pivot row .* differs from the stored row.*{FIX}"):
        store.forest()


def _corrupt(path, how, rng):
    f = path / "index.lmdb" / "data.mdb"
    raw = bytearray(f.read_bytes())
    if how == "truncate":
        raw = raw[: len(raw) // 3]
    elif how == "zeros":
        raw = bytearray(len(raw))
    elif how == "garbage":
        raw = bytearray(rng.integers(0, 256, len(raw), dtype=np.uint8).tobytes())
    elif how == "flip_values":
        # damage record payloads (never the B-tree pages): bytes inside node records
        env = lmdb.open(str(path / "index.lmdb"), readonly=True, lock=False)
        with env.begin() as txn:
            vals = [bytes(v) for k, v in txn.cursor() if k.startswith(b"N")]
        env.close()
        for v in vals:
            at = raw.find(v)
            if at >= 0:
                raw[at + len(v) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["truncate", "zeros", "garbage", "flip_values"])
def test_corrupted_lmdb(tmp_path, data_rng, how):
    X, y = blobs(data_rng, n=3000, d=20)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=4, leaf_size=20)
    _corrupt(tmp_path, how, data_rng)
    with pytest.raises(IndexStateError, match=f"index of store {tmp_path} is corrupted.*{FIX}"):
        with store.forest() as f:
            f.query(np.ones(20), n=None)


_KILLED_BUILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from ooc_learn.index.lmdb_io import ForestWriter
    from ooc_learn.index.tree import build_block_tree
    X = np.random.default_rng(0).random((400, 5), dtype=np.float32)
    w = ForestWriter(sys.argv[1], n_blocks=2, n_samples=400, n_features=5, width=3,
                     leaf_size=10, seed=0)
    w.add_tree(0, 0, build_block_tree(X[:200], width=3, leaf_size=10)[1])
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_sigkill_during_build_leaves_no_index_and_rebuild_works(tmp_path, data_rng):
    X, y = blobs(data_rng, n=400, d=5)
    proc = subprocess.run([sys.executable, "-c", _KILLED_BUILD, str(tmp_path / "index.lmdb")],
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "index.lmdb").exists()
    assert any(p.name.startswith(".index.lmdb.ooc-tmp-") for p in tmp_path.iterdir())
    store, _ = make_indexed(X, y, tmp_path, n_blocks=2, width=3, leaf_size=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.lmdb"]  # stale build gone
    with store.forest() as f:
        assert len(f.query(np.ones(5), n=None)[0]) > 0


def _query_worker(store, w, barrier, queue):
    with store.forest() as f:
        barrier.wait(timeout=60)
        out = [f.query(w, n=n, seed=sd) for n in (5, 50, None) for sd in range(5)]
    queue.put([(r.tolist(), e) for r, e in out])


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork")
def test_two_processes_query_at_once(tmp_path, data_rng):
    X, y = blobs(data_rng, n=2000, d=8, csr=True)
    store, _ = make_indexed(X, y, tmp_path, n_blocks=4, width=5, leaf_size=20)
    w = data_rng.normal(size=8)
    with store.forest() as f:  # closed before forking: LMDB handles must not cross a fork
        want = [(r.tolist(), e) for r, e in
                (f.query(w, n=n, seed=sd) for n in (5, 50, None) for sd in range(5))]
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_query_worker, args=(store, w, barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0] == want and got[1] == want


def test_damaged_records_fail_their_checksum(data_rng):
    X, _ = blobs(data_rng, n=300, d=4)
    _, tree = build_block_tree(X, width=3, leaf_size=10)
    raw = bytearray(encode_node(0, tree, 0, 0))
    raw[len(raw) // 2] ^= 0x01
    with pytest.raises(ValueError, match="node 0 of tree 0 fails its checksum"):
        decode_node(bytes(raw), 0, 0)
    with pytest.raises(ValueError, match="is missing or truncated"):
        decode_node(b"", 0, 0)


def test_forests_of_one_index_share_its_environment(tmp_path, data_rng):
    # one-vs-rest classes in threads each open the store's index: LMDB allows one open
    # environment per process, so they share it, each with its own forest state; a remap
    # (dropping the map's pages) and closing one leave the other's reads intact
    import gc

    from ooc_learn.index.lmdb_io import SharedReader

    X, y = blobs(data_rng, n=600, d=6)
    store, _ = make_indexed(X, y, tmp_path / "s", n_blocks=3)
    where = tmp_path / "s" / "index.lmdb"
    w = data_rng.normal(size=6)
    with store.forest() as alone:
        want = alone.query(w, n=None)[0]
    assert not SharedReader.is_open(where)
    with store.forest() as a, store.forest() as b:
        assert a._reader is b._reader and a._reader._users == 2
        a._reader.remap()
        got_a = a.query(w, n=None)[0]
        a.close()
        assert not b.closed and b._reader._users == 1
        got_b = b.query(w, n=None)[0]
    np.testing.assert_array_equal(np.sort(got_a), np.sort(want))
    np.testing.assert_array_equal(np.sort(got_b), np.sort(want))
    assert not SharedReader.is_open(where)  # the last one closed it
    # a forest dropped without close() does not keep the environment open
    leaked = store.forest()
    assert SharedReader.is_open(where)
    del leaked
    gc.collect()
    assert not SharedReader.is_open(where)
