"""Model selection on a Dask cluster (LocalCluster, 2 worker processes): the folds, TreeCV's
subtrees and the one-vs-rest classes as tasks give the local run's answers; a task whose
worker is killed is run again with the same result; the CLI's --workers."""

import json
import logging
import os
import signal
import threading
import time

import numpy as np
import pytest
from sklearn.datasets import load_digits, make_classification

distributed = pytest.importorskip("dask.distributed")

from ooc_learn.api import ingest_arrays  # noqa: E402
from ooc_learn.cli import train_main  # noqa: E402
from ooc_learn.cv.linear import linear_cv_grid  # noqa: E402
from ooc_learn.training import train  # noqa: E402


@pytest.fixture(scope="module")
def client():
    from ooc_learn.distributed import make_client

    c, cluster = make_client(workers=2)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dask")
    X, y = make_classification(n_samples=3000, n_features=20, n_informative=8, flip_y=0.05,
                               random_state=0)
    ingest_arrays(X.astype(np.float32), y, tmp / "bin", n_blocks=6, build_index=True).close()
    D, t = load_digits(return_X_y=True)
    keep = t < 4
    ingest_arrays((D[keep] / 16).astype(np.float32), t[keep].astype(float), tmp / "mc",
                  n_blocks=4, task="multiclass", build_index=True).close()
    return tmp


def test_cv_folds_on_the_cluster_equal_the_local_run(client, stores):
    Cs = [0.1, 1.0]
    remote = linear_cv_grid(stores / "bin", 5, Cs, solver="dcd", client=client)
    local = linear_cv_grid(stores / "bin", 5, Cs, solver="dcd", n_jobs=2)
    for r, l in zip(remote, local):
        np.testing.assert_array_equal(r.fold_scores, l.fold_scores)
        np.testing.assert_array_equal(r.predictions, l.predictions)
        assert r.estimate == l.estimate and r.stats["jobs"] == 2
    # IBCD folds from scratch on the workers: the warm-started local run's answer within
    # the solver's tolerance
    ibcd = linear_cv_grid(stores / "bin", 5, [1.0], client=client)[0]
    warm = linear_cv_grid(stores / "bin", 5, [1.0])[0]
    assert np.abs(ibcd.fold_scores - warm.fold_scores).max() <= 0.01


def test_one_vs_rest_on_the_cluster_equals_the_local_run(client, stores):
    remote = train(stores / "mc", C=0.5, client=client)
    local = train(stores / "mc", C=0.5)
    np.testing.assert_array_equal(remote.coef_, local.coef_)
    np.testing.assert_array_equal(remote.intercept_, local.intercept_)
    assert remote.meta["stats"]["jobs"] == 2
    cv_remote = linear_cv_grid(stores / "mc", 3, [0.5], client=client)[0]
    cv_local = linear_cv_grid(stores / "mc", 3, [0.5])[0]
    np.testing.assert_array_equal(cv_remote.predictions, cv_local.predictions)
    assert cv_remote.estimate == cv_local.estimate


def test_a_killed_workers_task_runs_again_with_the_same_result(client, stores):
    want = linear_cv_grid(stores / "bin", 4, [1.0], solver="dcd", n_jobs=2)[0]
    pids = list(client.run(os.getpid).values())
    got = {}
    run = threading.Thread(target=lambda: got.update(
        r=linear_cv_grid(stores / "bin", 4, [1.0], solver="dcd", client=client)[0]))
    run.start()
    deadline = time.time() + 30
    while time.time() < deadline and not any(client.processing().values()):
        time.sleep(0.01)
    os.kill(pids[0], signal.SIGKILL)  # the nanny starts a new worker; its task runs again
    run.join(120)
    assert not run.is_alive()
    np.testing.assert_array_equal(got["r"].fold_scores, want.fold_scores)
    client.wait_for_workers(2, timeout=60)


def test_the_cli_runs_folds_on_local_workers(stores, capsys):
    assert train_main([str(stores / "bin"), "--cv", "3", "--C", "0.1,1", "--solver", "dcd",
                       "--workers", "2", "--json", "--quiet"]) == 0
    remote = json.loads(capsys.readouterr().out)
    assert train_main([str(stores / "bin"), "--cv", "3", "--C", "0.1,1", "--solver", "dcd",
                       "--jobs", "2", "--json", "--quiet"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert [g["fold_scores"] for g in remote["grid"]] == [g["fold_scores"] for g in local["grid"]]
    assert remote["best_C"] == local["best_C"]
    # one C: the workers' reads are counted (the table said 0 rows read), the header says
    # Dask tasks, not threads
    assert train_main([str(stores / "bin"), "--cv", "3", "--workers", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "as Dask tasks" in out and "threads" not in out, out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["1"])
    assert int(row[-1]) >= 3000, out  # rows read: every row once at least


def test_a_task_warning_on_local_workers_is_one_line_of_the_command(stores, capfd):
    # 20 passes of streamed dual CD do not reach eps: each fold's task warns on its worker,
    # whose stderr is the command's; the line reads as the command's own warnings do
    assert train_main([str(stores / "bin"), "--cv", "3", "--solver", "dcd", "--eps", "1e-9",
                       "--max-outer", "1", "--workers", "2", "--quiet"]) == 0
    err = capfd.readouterr().err
    assert "ooc-train: warning: Streamed dual CD reached max_iter" in err
    assert "RuntimeWarning" not in err and "dcd_streamed.py" not in err


def test_treecv_subtrees_on_the_cluster_equal_the_sequential_run(client, stores):
    from ooc_learn.cv.treecv import tree_cv
    from ooc_learn.learners import Pegasos
    from ooc_learn.storage.store import open_store

    with open_store(stores / "bin") as st:  # 6 blocks, 10 folds: dealt blocks too
        for k in (4, 10):
            seq = tree_cv(st, Pegasos(1e-3), k)
            remote = tree_cv(st, Pegasos(1e-3), k, client=client)
            np.testing.assert_array_equal(remote.fold_scores, seq.fold_scores)
            np.testing.assert_array_equal(remote.predictions, seq.predictions)
            np.testing.assert_array_equal(remote.folds, seq.folds)
            assert remote.stats["updates"] == seq.stats["updates"]
    with open_store(stores / "mc", positive=2.0) as view:  # a class against the rest
        seq = tree_cv(view, Pegasos(1e-3), 5)
        remote = tree_cv(view, Pegasos(1e-3), 5, client=client)
        np.testing.assert_array_equal(remote.fold_scores, seq.fold_scores)
    with pytest.raises(Exception, match="runs on a store"):
        tree_cv((np.zeros((10, 2)), np.ones(10)), Pegasos(1e-3), 2, client=client)


def test_the_cli_runs_treecv_on_local_workers(stores, capsys, caplog):
    for name in ("bin", "mc"):  # mc: PEGASOS one model per class, in every subtree task
        base = [str(stores / name), "--cv", "8", "--cv-method", "tree", "--json", "--quiet"]
        assert train_main(base) == 0
        seq = json.loads(capsys.readouterr().out)
        with caplog.at_level(logging.WARNING):
            assert train_main(base + ["--workers", "2"]) == 0
        remote = json.loads(capsys.readouterr().out)
        # the client closes before its cluster: no "lost" tasks when the workers go
        assert not [r for r in caplog.records if "lose" in r.getMessage()]
        assert train_main(base + ["--jobs", "2"]) == 0
        local = json.loads(capsys.readouterr().out)
        assert remote["fold_scores"] == seq["fold_scores"] == local["fold_scores"]
    assert seq["stats"]["one_vs_rest_classes"] and seq["estimate"] < 0.5
    assert train_main(base[:4] + ["standard", "--jobs", "2", "--quiet"]) == 2
    assert "runs here" in capsys.readouterr().err


def test_no_dask_is_a_clear_refusal(stores, capsys, without_module):
    without_module("dask")
    assert train_main([str(stores / "bin"), "--cv", "3", "--workers", "2", "--quiet"]) == 2
    assert "ooc-learn[dask]" in capsys.readouterr().err


def test_a_scheduler_address_that_cannot_be_one_is_refused_at_once(stores, capsys):
    # "nonsense" (no port) ended in distributed's ValueError traceback, exit 1; a port
    # beyond 65535 waited 20 s to say that no scheduler answers
    import time

    for address, said in (("nonsense", "is not a Dask scheduler's address"),
                          ("tcp://127.0.0.1:99999", "the port 99999 is not one")):
        t0 = time.perf_counter()
        assert train_main([str(stores / "bin"), "--cv", "3", "--scheduler", address,
                           "--quiet"]) == 2
        assert said in capsys.readouterr().err and time.perf_counter() - t0 < 15


def test_a_closed_client_is_refused_with_a_hint(stores):
    # linear_cv(..., client=c) after c.close() ended in "RuntimeError: IOLoop is closed"
    from ooc_learn.distributed import make_client
    from ooc_learn.learners import Pegasos
    from ooc_learn.storage.errors import ParameterError
    from ooc_learn.storage.store import open_store
    from ooc_learn.cv.treecv import tree_cv

    c, cluster = make_client(workers=1)
    c.close()
    cluster.close()
    with pytest.raises(ParameterError, match="client is closed"):
        linear_cv_grid(str(stores / "bin"), 3, [1.0], solver="dcd", client=c)
    with pytest.raises(ParameterError, match="client is closed"):
        train(str(stores / "mc"), client=c)
    with open_store(stores / "bin") as st, pytest.raises(ParameterError,
                                                         match="client is closed"):
        tree_cv(st, Pegasos(), 4, client=c)


def test_ctrl_c_on_a_local_cluster_stops_the_command_at_once(stores):
    # a terminal's Ctrl-C reaches the whole process group: the local workers died of it
    # mid-task (tracebacks), and the command waited on their tasks for ever (killed at
    # 60 s). The workers now ignore it and the command's wait looks at the stop it asked
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "import sys; from ooc_learn.cli import train_main; "
           "sys.exit(train_main())", str(stores / "bin"), "--cv", "5", "--solver", "dcd",
           "--C", ",".join(str(2.0 ** e) for e in range(-8, 12)), "--workers", "2",
           "--quiet"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:  # the workers are up and working
        kids = subprocess.run(["pgrep", "-g", str(p.pid), "-f", "multiprocessing"],
                              capture_output=True, text=True).stdout.split()
        if len(kids) >= 3:  # the resource tracker and two workers
            break
        time.sleep(0.2)
    time.sleep(2.0)
    assert p.poll() is None, "the run ended before it could be interrupted"
    t0 = time.time()
    os.killpg(p.pid, signal.SIGINT)
    try:
        err = p.communicate(timeout=60)[1]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err[-2000:]
    assert time.time() - t0 < 30
    assert "interrupted" in err and "Traceback" not in err


def _primal(store_path, model, C, loss):
    from ooc_learn.storage.store import open_store

    with open_store(store_path) as st:
        X, y, _ = st.read_range(0, st.n_samples)
    w = np.append(model.coef_, model.intercept_ / model.meta.get("bias", 1.0))
    z = np.asarray(X @ model.coef_ + model.intercept_).ravel() * np.asarray(y)
    m = np.maximum(0.0, 1.0 - z)
    return 0.5 * float(w @ w) + C * float(m.sum() if loss == "hinge" else (m ** 2).sum())



def test_more_worker_threads_than_folds_cut_the_cs_into_tasks_too(client, stores, monkeypatch):
    """A cluster with more threads than folds: each run of folds at each run of Cs is a task
    (2 folds x 3 Cs: 6 tasks), and every C's fold scores are the local run's within the
    solver's tolerance (a run of Cs starts cold where the local run is warm along C)."""
    from ooc_learn import distributed as dist

    monkeypatch.setattr(dist, "n_workers", lambda c: 6)
    sent = []
    gather = dist.gather

    def spy(c, fn, args_list):
        sent.extend(args_list)
        return gather(c, fn, args_list)

    monkeypatch.setattr(dist, "gather", spy)
    Cs = [0.003, 0.01, 0.1]  # where dual CD converges (from C = 1 on it stops at max_iter)
    remote = linear_cv_grid(stores / "bin", 2, Cs, solver="dcd", client=client)
    local = linear_cv_grid(stores / "bin", 2, Cs, solver="dcd", n_jobs=2)
    assert len(sent) == 6 and sorted(len(a[4]) for a in sent) == [1] * 6
    for r, l in zip(remote, local):
        assert np.abs(r.fold_scores - l.fold_scores).max() <= 0.01
        assert np.mean(np.sign(r.predictions) == np.sign(l.predictions)) >= 0.99
        assert r.stats["jobs"] == 2

@pytest.fixture(scope="module")
def sparse_store(tmp_path_factory):
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    X = sp.random(2000, 3000, density=0.01, random_state=1, format="csr", dtype=np.float32)
    X.data[:] = 1.0
    y = np.where(X @ rng.normal(size=3000) + 0.3 * rng.normal(size=2000) > 0, 1, -1)
    path = tmp_path_factory.mktemp("cocoa") / "sp"
    ingest_arrays(X, y, path, n_blocks=6).close()
    return path


@pytest.mark.parametrize("shards,loss", [(1, "hinge"), (2, "sqhinge"), (4, "sqhinge")])
def test_cocoa_reaches_the_single_machine_optimum(client, sparse_store, shards, loss):
    """CoCoA+ over 1, 2 and 4 shards of the blocks: the dual rises every round, the run stops
    on the relative duality gap, and its primal objective is within 1e-3 of the single
    machine's optimum (dual CD to 1e-6); a round ships one w each way per shard."""
    from ooc_learn.solvers.cocoa import train_cocoa

    ref = train(sparse_store, solver="dcd", loss=loss, eps=1e-6, max_outer=100)
    p_ref = _primal(sparse_store, ref, 1.0, loss)
    m = train_cocoa(sparse_store, client, shards=shards, loss=loss, eps=1e-3, epochs=5,
                    max_rounds=400)
    st = m.meta["stats"]
    assert st["converged"] and st["shards"] == shards
    assert np.all(np.diff(st["duals"]) >= -1e-9 * abs(st["duals"][-1]))
    p = _primal(sparse_store, m, 1.0, loss)
    assert p == pytest.approx(st["objective"], rel=1e-9)  # the reported objective is P(w)
    assert abs(p - p_ref) <= 1e-3 * p_ref
    assert st["bytes_per_round"] == 2 * shards * 8 * (3000 + 1)


def test_cocoa_stopped_at_its_round_limit_says_so(client, sparse_store):
    # the run ended at max_rounds, 0.18 % off, with "converged": false and no warning
    from ooc_learn.solvers.cocoa import train_cocoa

    with pytest.warns(RuntimeWarning, match="max_rounds=2 before the duality gap"):
        m = train_cocoa(sparse_store, client, shards=2, eps=1e-9, max_rounds=2)
    assert not m.meta["stats"]["converged"]


def test_cocoa_over_a_sharded_store_reaches_the_single_machine_optimum(client, tmp_path):
    """The same rows ingested as 3 shards (each a store with its index): CoCoA+ over the
    shards, each round on a worker that sees its shard, reaches the optimum of dual CD on
    the unsharded store within 1e-3; through the CLI too."""
    import scipy.sparse as sp

    from ooc_learn.solvers.cocoa import train_cocoa
    from ooc_learn.storage.sharded import ShardedStore

    rng = np.random.default_rng(0)  # the rows of sparse_store
    X = sp.random(2000, 3000, density=0.01, random_state=1, format="csr", dtype=np.float32)
    X.data[:] = 1.0
    y = np.where(X @ rng.normal(size=3000) + 0.3 * rng.normal(size=2000) > 0, 1, -1)
    one = ingest_arrays(X, y, tmp_path / "one", n_blocks=3)
    one.close()
    sharded = ingest_arrays(X, y, tmp_path / "sh", shards=3, build_index=True)
    assert isinstance(sharded, ShardedStore) and sharded.n_shards == 3
    ref = train(tmp_path / "one", solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    p_ref = _primal(tmp_path / "one", ref, 1.0, "sqhinge")
    m = train_cocoa(tmp_path / "sh", client, loss="sqhinge", eps=1e-3, epochs=5,
                    max_rounds=400)
    assert m.meta["stats"]["converged"] and m.meta["stats"]["shards"] == 3
    assert abs(_primal(tmp_path / "one", m, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref
    # the CLI: a sharded store trains with --solver cocoa only
    assert train_main([str(tmp_path / "sh"), "-o", str(tmp_path / "s.npz"), "--solver", "cocoa",
                       "--loss", "sqhinge", "--workers", "2", "--quiet", "--json"]) == 0
    # its default stop is the relative gap 1e-3 (the other solvers' 0.1 left it 2 % short)
    from ooc_learn.model import load_model

    cli = load_model(tmp_path / "s.npz")
    assert cli.meta["eps"] == 1e-3
    assert abs(_primal(tmp_path / "one", cli, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref
    assert train_main([str(tmp_path / "sh"), "-o", str(tmp_path / "t.npz"), "--quiet"]) == 2


def test_a_shard_no_worker_sees_is_refused_before_any_round(client, tmp_path):
    import json as json_

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 5)).astype(np.float32)
    ingest_arrays(X, np.where(X[:, 0] > 0, 1, -1), tmp_path / "sh", shards=2)
    manifest = tmp_path / "sh" / "shards.json"
    m = json_.loads(manifest.read_text())
    m["shards"][1]["path"] = str(tmp_path / "elsewhere" / "shard-1")  # on another machine
    manifest.write_text(json_.dumps(m))
    from ooc_learn.solvers.cocoa import train_cocoa

    with pytest.raises(Exception, match="No worker of the cluster sees the shard"):
        train_cocoa(tmp_path / "sh", client)


def test_cocoa_from_the_cli(sparse_store, tmp_path, capsys):
    assert train_main([str(sparse_store), "-o", str(tmp_path / "c.npz"), "--solver", "cocoa",
                       "--loss", "sqhinge", "--eps", "0.001", "--epochs", "5", "--workers",
                       "2", "--shards", "4", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["solver"] == "cocoa" and out["converged"]
    from ooc_learn.model import load_model

    assert load_model(tmp_path / "c.npz").meta["stats"]["shards"] == 4
    assert train_main([str(sparse_store), "-o", str(tmp_path / "e.npz"), "--shards", "2",
                       "--quiet"]) == 2
    assert "--solver cocoa" in capsys.readouterr().err
    assert train_main([str(sparse_store), "-o", str(tmp_path / "d.npz"), "--solver",
                       "cocoa", "--quiet"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_cocoa_survives_a_shard_that_loses_its_alphas(client, sparse_store):
    """A worker that loses a shard's alphas (restarted): the shard's part of w is taken out,
    it starts again from zero, and the run still ends at the optimum."""
    from ooc_learn.solvers import cocoa

    ref = train(sparse_store, solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    seen = []

    def forget(info):
        seen.append(info["round"])
        if len(seen) == 3:
            client.run(lambda: cocoa._STATE.clear())

    m = cocoa.train_cocoa(sparse_store, client, shards=2, loss="sqhinge", eps=1e-3, epochs=5,
                          max_rounds=400, on_round=forget)
    st = m.meta["stats"]
    assert st["converged"] and st["shards_lost"] == 2
    p_ref = _primal(sparse_store, ref, 1.0, "sqhinge")
    assert abs(_primal(sparse_store, m, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref


def test_cocoa_keeps_the_surviving_shards_moves_when_one_shard_is_lost(client, sparse_store):
    """One shard of two loses its alphas: the other's move in that round stays in w (its
    alphas moved), so w remains the sum of the shards' parts: every dual stays below the
    optimum (weak duality) and the run ends there."""
    from ooc_learn.solvers import cocoa

    ref = train(sparse_store, solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    p_ref = _primal(sparse_store, ref, 1.0, "sqhinge")
    seen = []

    def forget_shard_0():
        for key in [k for k in cocoa._STATE if k[1] == 0]:
            cocoa._STATE.pop(key).close()

    def forget(info):
        seen.append(info["round"])
        if len(seen) in (2, 5):
            client.run(forget_shard_0)

    m = cocoa.train_cocoa(sparse_store, client, shards=2, loss="sqhinge", eps=1e-3, epochs=5,
                          max_rounds=400, on_round=forget, working_set=False)
    st = m.meta["stats"]
    assert st["converged"] and st["shards_lost"] == 2
    assert max(st["duals"]) <= p_ref * (1 + 1e-9)
    assert abs(_primal(sparse_store, m, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref


def test_a_store_the_workers_cannot_see_is_refused_before_any_task(client, stores, tmp_path):
    from ooc_learn.distributed import check_store_visible
    from ooc_learn.storage.errors import ParameterError

    check_store_visible(client, stores / "bin")  # seen by both
    with pytest.raises(ParameterError, match="not visible to 2 of the cluster's 2 workers"):
        check_store_visible(client, tmp_path / "nowhere.store")


def test_cocoa_rounds_over_working_sets_reach_the_optimum_reading_nothing(client, sparse_store):
    """Between full rounds each shard's passes run over its resident working set (the rows
    nearest the margin): those rounds read no row, the dual still rises every round, and the
    run stops only on a full round's gap, at the optimum; the same as every round over every
    row."""
    from ooc_learn.solvers.cocoa import train_cocoa

    ref = train(sparse_store, solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    p_ref = _primal(sparse_store, ref, 1.0, "sqhinge")
    seen = []
    m = train_cocoa(sparse_store, client, shards=2, loss="sqhinge", eps=1e-3, epochs=5,
                    max_rounds=400, on_round=seen.append)
    every = train_cocoa(sparse_store, client, shards=2, loss="sqhinge", eps=1e-3, epochs=5,
                        max_rounds=400, working_set=False)
    st = m.meta["stats"]
    assert st["converged"] and every.meta["stats"]["converged"]
    assert 0 < st["full_rounds"] < st["rounds"]
    assert every.meta["stats"]["full_rounds"] == every.meta["stats"]["rounds"]
    assert seen[-1]["full"] and sum(not s["full"] for s in seen) == st["rounds"] - st["full_rounds"]
    assert np.all(np.diff(st["duals"]) >= -1e-9 * abs(st["duals"][-1]))
    assert 0 < st["work_rows"] <= 2000
    for model in (m, every):
        assert abs(_primal(sparse_store, model, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref



def test_cocoa_queries_a_cut_stores_index_for_each_shards_blocks(client, tmp_path):
    """One indexed store cut into 2 shards: the rounds over the working sets ask the index for
    violators of the shard's own blocks only (each found row joins its shard's set), and the
    run reaches the optimum as without the queries."""
    import scipy.sparse as sp

    from ooc_learn.solvers.cocoa import train_cocoa

    rng = np.random.default_rng(0)  # the rows of sparse_store
    X = sp.random(2000, 3000, density=0.01, random_state=1, format="csr", dtype=np.float32)
    X.data[:] = 1.0
    y = np.where(X @ rng.normal(size=3000) + 0.3 * rng.normal(size=2000) > 0, 1, -1)
    ingest_arrays(X, y, tmp_path / "ix", n_blocks=6, build_index=True).close()
    ref = train(tmp_path / "ix", solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    p_ref = _primal(tmp_path / "ix", ref, 1.0, "sqhinge")

    def band(v):  # working sets of the rows inside the margin only: violators stay outside
        from ooc_learn.solvers import cocoa

        cocoa.WORK_BAND = v

    from ooc_learn.solvers import cocoa

    client.run(band, 0.0)
    try:
        runs = [train_cocoa(tmp_path / "ix", client, shards=2, loss="sqhinge", eps=1e-3,
                            epochs=5, max_rounds=400, query=q) for q in (True, False)]
    finally:
        client.run(band, cocoa.WORK_BAND)
    assert runs[0].meta["stats"]["rows_found"] > 0 == runs[1].meta["stats"]["rows_found"]
    for m in runs:
        assert m.meta["stats"]["converged"]
        assert abs(_primal(tmp_path / "ix", m, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref

def test_cocoa_working_sets_stay_within_a_small_worker_budget(client, sparse_store, tmp_path):
    """Workers whose budget holds a part of their shard keep the rows nearest the margin
    that fit (fewer than the shard's), and the run still reaches the optimum."""
    import shutil

    from ooc_learn import distributed as dist
    from ooc_learn.solvers.cocoa import train_cocoa

    path = tmp_path / "copy"  # opened afresh under the small budget
    shutil.copytree(sparse_store, path)

    def small(limit):
        from ooc_learn.storage.budget import MemoryBudget

        dist._WORKER_BUDGET.clear()
        if limit:
            dist._WORKER_BUDGET[os.getpid()] = MemoryBudget(limit)

    client.run(small, 1 << 20)
    try:
        m = train_cocoa(path, client, shards=2, loss="sqhinge", eps=1e-3, epochs=5,
                        max_rounds=400)
    finally:
        client.run(small, None)
    st = m.meta["stats"]
    assert st["converged"] and 0 < st["work_rows"] < 2000
    ref = train(sparse_store, solver="dcd", loss="sqhinge", eps=1e-6, max_outer=100)
    p_ref = _primal(sparse_store, ref, 1.0, "sqhinge")
    assert abs(_primal(path, m, 1.0, "sqhinge") - p_ref) <= 1e-3 * p_ref


def test_a_worker_budget_caps_the_whole_process_below_dasks_pause():
    """A worker's tasks share a budget for the whole worker process below the share of its
    memory limit at which Dask pauses it (their caches must not take it there: a paused
    worker holding them would never run the next task)."""
    from ooc_learn.distributed import PAUSE_MARGIN, make_client, task_budget

    c, cluster = make_client(workers=1, memory="1G")
    try:
        cap, fixed, limit = c.submit(
            lambda: (task_budget().cap, task_budget().fixed, task_budget().limit)).result()
    finally:
        c.close()
        cluster.close()
    assert cap == int(PAUSE_MARGIN * 0.8 * (1 << 30))
    assert fixed > 50 << 20 and limit == cap - fixed
