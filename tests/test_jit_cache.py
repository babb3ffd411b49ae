"""A fresh process compiles nothing that numba cannot cache.

Every kernel is compiled with ``cache=True``; numba's own helpers (``numba.typed.List``'s
methods called from Python, for one) are not, and were compiled in every process: 2.2 s of a
2.5 s ``ooc-train`` on a 3000-row store. The second child here finds the kernels the first
cached on disk, so any compile it still does is one no cache will ever save.
"""

import json
import subprocess
import sys

import numpy as np

import ooc_learn
from ooc_learn.storage.jit import PENDING, stop_helpers

CHILD = r"""
import json, sys
from numba.core import dispatcher

compiled = []
compile_for_args = dispatcher.Dispatcher._compile_for_args


def recording(self, *args, **kwargs):
    if type(self._cache).__name__ == "NullCache":  # a dispatcher without cache=True
        compiled.append(f"{self.py_func.__module__}.{self.py_func.__qualname__}")
    return compile_for_args(self, *args, **kwargs)


dispatcher.Dispatcher._compile_for_args = recording
import ooc_learn

for loss, block_solver in (("hinge", "dual"), ("sqhinge", "primal")):
    ooc_learn.train(sys.argv[1], loss=loss, block_solver=block_solver, s=1.0, sample_eps=0.05,
                    init_sample=500)
print(json.dumps(compiled))
"""


def test_training_compiles_nothing_numba_cannot_cache(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 20)).astype(np.float32)
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=3000) > 0, 1.0, -1.0)
    ooc_learn.ingest_arrays(X, y, tmp_path / "s", n_blocks=3, build_index=True).close()
    for run in ("fills the cache", "finds it filled"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_cold_cache_is_told_and_a_warm_one_is_not(tmp_path, monkeypatch, capsys):
    """The first run says it compiles (README command 1 spent ~25 s compiling, silently)."""
    check = ("from ooc_learn._jit import kernels_cached; "
             "from ooc_learn._warmup import _SEARCH, _DUAL_CD; "
             "from ooc_learn.storage.jit import start_jit; "
             "print(kernels_cached([_SEARCH, _DUAL_CD]), end=' '); start_jit(); "
             "print(kernels_cached([('ooc_learn.storage.jit', '_plus_one')]))")
    env = dict(__import__("os").environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["False", "True"]

    import ooc_learn._jit as jit
    from ooc_learn.cli import index_main

    monkeypatch.setattr(jit, "kernels_cached", lambda kernels: False)
    index_main([str(tmp_path / "missing.store")])
    assert "compiling kernels (first run only" in capsys.readouterr().err
    index_main([str(tmp_path / "missing.store"), "--quiet"])
    assert "compiling" not in capsys.readouterr().err


# ---- compiling ahead in a helper process (README command 1's first run) -------------------
def test_the_helpers_signatures_are_the_ones_the_commands_use(tmp_path):
    """The helpers compile kernels for fixed signatures (``_jit.AHEAD``, and ``AT_SCALE`` in
    a capped first run's warm-up): a stale one would compile code nobody calls, and the
    command would compile its own (beside its data, under its cap). Each is reached here as
    the commands reach it: IBCD on a dense and a CSR store (Newton's products, the active
    set's compaction as rows leave it), the capped index search that reads leaf rows, and a
    capped ingest of a .npy."""
    import scipy.sparse as sp

    import ooc_learn._jit as jit
    from ooc_learn.index.forest import open_forest
    from ooc_learn.storage.store import open_store

    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 8)).astype(np.float32)
    Xs = sp.random(3000, 60, density=0.1, random_state=1, format="csr", dtype=np.float32)
    for name, rows, y in (("dense", X, np.where(X[:, 0] > 0, 1.0, -1.0)),
                          ("csr", Xs, np.where(Xs @ np.random.default_rng(1).normal(size=60)
                                               > 0, 1.0, -1.0))):
        store = ooc_learn.ingest_arrays(rows, y, tmp_path / name, n_blocks=2,
                                        build_index=True)
        assert store.layout == name
        for s in (None, 1.0):
            ooc_learn.train(store, solver="ibcd", init_sample=100, s=s)
        store.close()
    # a store 7x the cap: the search reads leaf rows through the Python loop (scan_leaf),
    # and a bounded search's seen set grows past its first table
    big = rng.normal(size=(40000, 8)).astype(np.float32)
    ooc_learn.ingest_arrays(big, np.where(big[:, 0] > 0, 1.0, -1.0), tmp_path / "big",
                            n_blocks=2, build_index=True).close()
    with open_store(tmp_path / "big", memory="1M") as store, open_forest(store) as forest:
        found = forest.query(rng.normal(size=9), n=2000, s=1.0, bounded=True,
                             with_rows=True)
        assert len(found.rows) == 2000 and found.X.shape == (2000, 8)
    # a .npy larger than the ingest's buffer is read by row position (ingest_direct)
    np.save(tmp_path / "big.npy", np.column_stack([np.sign(big[:, :1]), big]))
    ooc_learn.ingest([str(tmp_path / "big.npy")], tmp_path / "direct", label_column=0,
                     memory="1M", build_index=False).close()
    for kernel in {*jit.AHEAD, *(k for ks in jit.AT_SCALE.values() for k in ks)}:
        dispatcher = jit._dispatcher(kernel)
        assert jit._signature(kernel) in dispatcher.signatures, (
            f"{kernel} is called with {dispatcher.signatures}; update _jit._signature")


def test_a_helper_fills_the_cache_for_the_next_call(tmp_path):
    import os

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    check = ("from ooc_learn._jit import kernels_cached, MODULES; "
             "print(kernels_cached([(MODULES['build_tree_kernel'], 'build_tree_kernel')]))")
    before = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                            text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "ooc_learn._jit", "build_tree_kernel"], env=env,
                   check=True, timeout=300)
    after = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert (before, after) == ("False", "True")


def test_no_helper_under_a_memory_cap_switched_off_or_for_other_solvers(monkeypatch):
    import argparse

    import ooc_learn._jit as jit
    from ooc_learn.cli.common import ahead_kernels

    monkeypatch.setattr(jit, "kernels_cached", lambda kernels: False)
    assert jit.compile_ahead(["bbf_run"], memory_given=True) == []
    import ooc_learn.storage.measure as measure

    with monkeypatch.context() as m:  # too little free memory (the machine, or the cgroup)
        m.setattr(measure, "memory_headroom_bytes", lambda: jit.HELPER_ROOM - 1)
        assert jit.compile_ahead(["bbf_run"], memory_given=False) == []
    monkeypatch.setenv("OOC_COMPILE_AHEAD", "0")
    assert jit.compile_ahead(["bbf_run"], memory_given=False) == []
    assert not PENDING
    ns = argparse.Namespace
    assert ahead_kernels("ooc-train", ns(solver=None, workers=None, scheduler=None)) \
        == ["bbf_run"]
    assert ahead_kernels("ooc-train", ns(solver="dcd", workers=None, scheduler=None)) == []
    assert ahead_kernels("ooc-ingest", ns(no_index=True)) == []
    assert ahead_kernels("ooc-ingest", ns(no_index=False)) == ["build_tree_kernel"]


def test_a_helper_still_running_when_the_command_ends_is_stopped(monkeypatch, tmp_path):
    """Nothing outlives the command: a run that never needed the helper's kernel (an input
    error, say) stops it at exit."""
    import ooc_learn._jit as jit

    monkeypatch.setattr(jit, "kernels_cached", lambda kernels: False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))  # the helper's, not ours
    if len(__import__("os").sched_getaffinity(0)) < 2:
        import pytest

        pytest.skip("one CPU: no helper is started")
    assert jit.compile_ahead(["bbf_run"], memory_given=False) == ["bbf_run"]
    proc = PENDING["bbf_run"]
    assert proc.poll() is None
    stop_helpers()
    assert proc.poll() is not None and not PENDING
