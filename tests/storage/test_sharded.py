"""A sharded store (``ooc-ingest --shards K``): K complete stores that partition the rows, each
with its index, and a manifest written last; refusals leave nothing behind."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from ooc_learn.api import ingest, ingest_arrays
from ooc_learn.cli import info_main, ingest_main, train_main
from ooc_learn.storage.errors import IngestError, ParameterError
from ooc_learn.storage.replace import is_store_dir
from ooc_learn.storage.sharded import MANIFEST_FILE, ShardedStore, is_sharded_store
from ooc_learn.storage.store import open_store


def _rows(store, n_features):
    X, y, ids = store.read_range(0, store.n_samples)
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    return X[:, :n_features], np.asarray(y), np.asarray(ids)


@pytest.mark.parametrize("sparse", [True, False])
def test_the_shards_partition_the_rows_of_the_unsharded_store(tmp_path, sparse):
    rng = np.random.default_rng(0)
    n, d = 1200, 40
    X = sp.random(n, d, density=0.1, random_state=2, format="csr", dtype=np.float32)
    if not sparse:
        X = X.toarray() + rng.normal(size=(n, d)).astype(np.float32)
    y = np.where(rng.normal(size=n) > 0, 1.0, -1.0)
    one = ingest_arrays(X, y, tmp_path / "one", n_blocks=6)
    Xo, yo, io = _rows(one, d)
    one.close()
    sh = ingest_arrays(X, y, tmp_path / "sh", n_blocks=6, shards=3, build_index=True)
    assert isinstance(sh, ShardedStore) and is_sharded_store(tmp_path / "sh")
    assert (sh.n_shards, sh.n_samples, sh.n_features, sh.task) == (3, n, d, "binary")
    assert sh.layout == ("csr" if sparse else "dense")
    seen, fingerprints = [], set()
    for k, entry in enumerate(sh.shards):
        with open_store(sh.shard_path(k)) as st:
            assert st.has_index and st.n_blocks == entry["n_blocks"] == 2
            assert st.n_samples == entry["n_samples"] and st.nnz == entry["nnz"]
            assert st.metadata["shard"]["index"] == k and st.metadata["shard"]["of"] == 3
            assert st.verify() == []  # digests, pointers, labels
            Xs, ys, ids = _rows(st, d)
            fingerprints.add(st.fingerprint())
        order = np.argsort(io)
        pos = order[np.searchsorted(io[order], ids)]
        np.testing.assert_array_equal(Xs, Xo[pos])  # every row, value for value
        np.testing.assert_array_equal(ys, yo[pos])
        seen.append(ids)
    seen = np.concatenate(seen)
    assert np.array_equal(np.sort(seen), np.arange(n))  # each row in exactly one shard
    nnz = [s["nnz"] for s in sh.shards]  # each shard's own count, summing to the whole
    assert sum(nnz) == int(np.count_nonzero(X.toarray() if sparse else X)) and min(nnz) > 0
    assert len(fingerprints) == 3
    assert sh.ingest_stats["buckets"] % 3 == 0 and sh.ingest_stats["redealt_buckets"] == 0
    assert is_store_dir(tmp_path / "sh")  # so --overwrite may replace it
    assert not list(tmp_path.glob("**/*.spool"))


def test_the_cli_writes_reports_and_replaces_a_sharded_store(tmp_path, capsys):
    src = tmp_path / "a.svm"
    rng = np.random.default_rng(1)
    with open(src, "w") as f:
        for i in range(500):
            cols = sorted(rng.choice(50, 5, replace=False) + 1)
            feats = " ".join(f"{j}:{rng.random():.3f}" for j in cols)
            f.write(f"{1 if rng.random() > 0.5 else -1} {feats}\n")
    out = tmp_path / "a.sharded"
    assert ingest_main([str(src), "-o", str(out), "--shards", "2", "--json", "--quiet"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert len(j["shards"]) == 2 and sum(s["n_samples"] for s in j["shards"]) == 500
    assert ingest_main([str(src), "-o", str(out), "--shards", "4", "--quiet"]) == 2  # exists
    assert "already exists" in capsys.readouterr().err
    assert ingest_main([str(src), "-o", str(out), "--shards", "4", "--overwrite",
                        "--quiet"]) == 0
    capsys.readouterr()
    assert ShardedStore(out).n_shards == 4 and not (out / "shard-4").exists()
    assert info_main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "shards       4" in text and "shard 3" in text
    # the memory fields ooc-info STORE has, for the whole and for each shard; each index
    assert info_main([str(out), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    per = []
    for k in range(4):
        with open_store(out / f"shard-{k}") as st:
            per.append(st.info()["memory"])
        assert j["shards"][k]["memory"] == per[-1]
        assert j["shards"][k]["index"]["state"] == "ok"
    assert j["memory"] == {"block_bytes": max(m["block_bytes"] for m in per),
                           "all_rows_bytes": sum(m["all_rows_bytes"] for m in per)}
    # one model over the shards is CoCoA+'s: any other solver is refused, naming the way
    assert train_main([str(out), "-o", str(tmp_path / "m.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "sharded store (4 shards)" in err and "--solver cocoa" in err


def test_bad_shard_counts_are_refused_and_leave_nothing(tmp_path):
    X = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array([1, -1] * 3)
    with pytest.raises(ParameterError, match="'shards' parameter"):
        ingest_arrays(X, y, tmp_path / "z", shards=0)
    with pytest.raises(IngestError, match="too few for 7 shards"):
        ingest_arrays(X, y, tmp_path / "z", shards=7)
    assert list(tmp_path.iterdir()) == []  # no store, no temporary folder


def test_a_damaged_manifest_is_a_clear_error(tmp_path):
    X = np.random.default_rng(2).normal(size=(40, 3)).astype(np.float32)
    ingest_arrays(X, np.where(X[:, 0] > 0, 1, -1), tmp_path / "sh", shards=2)
    (tmp_path / "sh" / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(Exception, match="not valid JSON"):
        ShardedStore(tmp_path / "sh")
    assert not is_sharded_store(tmp_path / "sh")


def test_ingest_from_a_file_gives_the_same_shards_as_from_arrays(tmp_path):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    y = np.where(X[:, 1] > 0, 1.0, -1.0)
    np.save(tmp_path / "d.npy", np.c_[y, X].astype(np.float32))
    a = ingest([tmp_path / "d.npy"], tmp_path / "a", shards=2, seed=3)
    b = ingest_arrays(X, y, tmp_path / "b", shards=2, seed=3)
    assert [s["n_samples"] for s in a.shards] == [s["n_samples"] for s in b.shards]


def test_a_sharded_store_is_predicted_and_scored_whole_and_refused_where_one_is_read(
        tmp_path, capsys):
    # a model scored on the sharded store gets the unsharded store's figures and per-row
    # predictions (ooc-predict, --test); commands that read one store name the sharding
    from ooc_learn.cli import check_main, predict_main

    rng = np.random.default_rng(3)
    X = rng.normal(size=(900, 6)).astype(np.float32)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=900) > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "one", n_blocks=3).close()
    ingest_arrays(X, y, tmp_path / "sh", n_blocks=3, shards=3).close()
    m = str(tmp_path / "m.npz")
    assert train_main([str(tmp_path / "one"), "-o", m, "--solver", "dcd", "--quiet",
                       "--test", str(tmp_path / "sh"), "--json"]) == 0
    on_shards = json.loads(capsys.readouterr().out)["test_accuracy"]
    lines = {}
    for name in ("one", "sh"):
        out = tmp_path / f"{name}.csv"
        assert predict_main([m, str(tmp_path / name), "-o", str(out), "--quiet",
                             "--json"]) == 0
        lines[name] = (json.loads(capsys.readouterr().out), sorted(out.read_text().splitlines()))
    assert lines["sh"][1] == lines["one"][1] and len(lines["sh"][1]) == 901
    assert lines["sh"][0]["accuracy"] == lines["one"][0]["accuracy"] == on_shards
    for argv in ([str(tmp_path / "sh"), "--cv", "3"], [str(tmp_path / "sh"), "--cv", "3",
                                                        "--cv-method", "tree"]):
        assert train_main(argv + ["--quiet"]) == 2
        err = capsys.readouterr().err
        assert "is a sharded store (3 shards)" in err and "--solver cocoa" in err
    # ooc-check checks every shard
    assert check_main([str(tmp_path / "sh"), "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["shards"] == 3 and out["blocks"] == 3
    data = tmp_path / "sh" / "shard-2" / "data.h5"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert check_main([str(tmp_path / "sh"), "--quiet"]) == 2
    assert "shard-2" in capsys.readouterr().err


def test_a_shard_swapped_or_missing_is_refused_by_check_predict_and_test(tmp_path, capsys):
    # shard 1 replaced by a copy of shard 0: ooc-check said whole, and ooc-predict / --test
    # scored shard 0's rows twice (exit 0); a missing shard was found after training
    import shutil

    from ooc_learn.cli import check_main, predict_main

    rng = np.random.default_rng(4)
    X = rng.normal(size=(900, 6)).astype(np.float32)
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    ingest_arrays(X, y, tmp_path / "one", n_blocks=3).close()
    ingest_arrays(X, y, tmp_path / "sh", n_blocks=3, shards=3).close()
    m = str(tmp_path / "m.npz")
    assert train_main([str(tmp_path / "one"), "-o", m, "--solver", "dcd", "--quiet"]) == 0
    swapped, missing = tmp_path / "swapped", tmp_path / "missing"
    for bad in (swapped, missing):
        shutil.copytree(tmp_path / "sh", bad)
        shutil.rmtree(bad / "shard-1")
    shutil.copytree(swapped / "shard-0", swapped / "shard-1")
    capsys.readouterr()
    assert check_main([str(swapped), "--quiet"]) == 2
    assert "shard 1" in capsys.readouterr().err
    for bad, said in ((swapped, "shard 1"), (missing, "Shard 1")):
        assert predict_main([m, str(bad), "--quiet"]) == 2
        assert said in capsys.readouterr().err
        out = tmp_path / "m2.npz"
        assert train_main([str(tmp_path / "one"), "-o", str(out), "--solver", "dcd",
                           "--test", str(bad), "--quiet"]) == 2  # before the work
        assert said in capsys.readouterr().err and not out.exists()
