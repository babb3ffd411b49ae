"""Never lose a user's data: --overwrite replaces only what is ours, and a kill at every
rename, exchange, fsync or removal of a replace leaves the old or the new store (or model)
whole, never neither; the next run removes what the killed one left.

Faults are injected in a forked child: the file-system calls of a replace are wrapped so
that the k-th of them kills the process (SIGKILL) before it happens, for every k until a run
completes."""

import errno
import json
import os
import shutil
import signal
import sys

import numpy as np
import pytest
from sklearn.datasets import dump_svmlight_file

from ooc_learn.index.forest import open_forest
from ooc_learn.cli import index_main, ingest_main, predict_main, train_main
from ooc_learn.model import LinearModel, load_model
from ooc_learn.storage import replace as rp
from ooc_learn.storage.store import open_store

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forks; renameat2")


def write_source(path, n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    dump_svmlight_file(X, y, str(path), zero_based=False)
    return path


def leftovers(folder, name):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.ooc-tmp-"))


def tree_bytes(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- what --overwrite may replace ------------------------------------------------------------
@pytest.mark.parametrize("case", ["user folder", "folder holding the source", "foreign data.h5",
                                  "ordinary file", "the source itself", "link to a store"])
def test_overwrite_refuses_what_is_not_a_store(tmp_path, capsys, case):
    src = write_source(tmp_path / "train.svm", 60, 0)
    store = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(store), "--quiet"]) == 0
    if case == "user folder":
        out = tmp_path / "thesis"
        out.mkdir()
        (out / "chapter1.tex").write_text("years of work")
    elif case == "folder holding the source":
        out = tmp_path
    elif case == "foreign data.h5":
        import h5py

        out = tmp_path / "other"
        out.mkdir()
        with h5py.File(out / "data.h5", "w") as f:
            f["X"] = np.arange(3)
    elif case == "ordinary file":
        out = tmp_path / "notes.txt"
        out.write_text("keep me")
    elif case == "the source itself":
        out = src
    else:
        out = tmp_path / "link"
        out.symlink_to(store)
    before = tree_bytes(tmp_path)
    assert ingest_main([str(src), "-o", str(out), "--overwrite", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "ooc-ingest:" in err and "hint:" in err and str(out) in err
    assert tree_bytes(tmp_path) == before  # nothing touched, nothing left behind
    assert not leftovers(out.parent, out.name)


def test_overwrite_replaces_a_store_or_an_empty_folder(tmp_path):
    a, b = write_source(tmp_path / "a.svm", 60, 0), write_source(tmp_path / "b.svm", 90, 1)
    out = tmp_path / "s"
    out.mkdir()  # empty: nothing to lose
    assert ingest_main([str(a), "-o", str(out), "--quiet"]) == 2  # exists: --overwrite needed
    assert ingest_main([str(a), "-o", str(out), "--overwrite", "--quiet"]) == 0
    assert ingest_main([str(b), "-o", str(out), "--quiet"]) == 2
    with open_store(out) as s:
        assert s.n_samples == 60
    (out / "meta.json").write_text("{damaged")  # still ours: data.h5 names the format
    assert ingest_main([str(b), "-o", str(out), "--overwrite", "--quiet"]) == 0
    with open_store(out) as s:
        assert s.n_samples == 90
    assert not leftovers(tmp_path, "s")


def test_train_and_predict_write_only_over_their_own_files(tmp_path, capsys):
    src = write_source(tmp_path / "train.svm", 200, 0)
    store = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(store), "--quiet"]) == 0
    precious = tmp_path / "results.npz"
    np.savez(precious, data=np.arange(5))
    before = precious.read_bytes()
    assert train_main([str(store), "-o", str(precious), "--quiet"]) == 2
    assert precious.read_bytes() == before
    assert "not an ooc-learn model file" in capsys.readouterr().err
    model = tmp_path / "m.npz"
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet", "--C", "0.1"]) == 0  # ours
    assert load_model(model).meta["C"] == 0.1
    notes = tmp_path / "notes.csv"
    notes.write_text("a,b\n1,2\n")
    assert predict_main([str(model), str(src), "-o", str(notes), "--quiet"]) == 2
    assert notes.read_text() == "a,b\n1,2\n"
    pred = tmp_path / "pred.csv"
    for _ in range(2):  # the second run replaces its own file
        assert predict_main([str(model), str(src), "-o", str(pred), "--quiet"]) == 0
    assert len(pred.read_text().splitlines()) == 201
    assert not leftovers(tmp_path, "pred.csv") and not leftovers(tmp_path, "m.npz")


def test_an_output_folder_that_does_not_exist_is_refused_before_the_work(tmp_path, capsys,
                                                                         monkeypatch):
    # the model was trained in full, then lost: the save named its temporary file
    import ooc_learn.training as training

    src = write_source(tmp_path / "train.svm", 200, 0)
    store = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(store), "--quiet"]) == 0
    trained = []
    real = training.train
    monkeypatch.setattr(training, "train", lambda *a, **k: trained.append(1) or real(*a, **k))
    capsys.readouterr()
    assert train_main([str(store), "-o", str(tmp_path / "no" / "m.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "folder" in err and "does not exist" in err and "ooc-tmp" not in err, err
    assert not trained
    model = tmp_path / "m.npz"
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    assert predict_main([str(model), str(src), "-o", str(tmp_path / "no" / "p.csv"),
                         "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz", "s", "train.svm"]


def test_disk_full_during_model_save_keeps_the_old_model(tmp_path, monkeypatch, capsys):
    src = write_source(tmp_path / "train.svm", 200, 0)
    store = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(store), "--quiet"]) == 0
    model = tmp_path / "m.npz"
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    before = model.read_bytes()

    def full(fh, **arrays):
        fh.write(b"PK\x03\x04" + b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fh.name))

    monkeypatch.setattr(np, "savez", full)
    assert train_main([str(store), "-o", str(model), "--quiet", "--C", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "hint: Free disk space" in err
    assert model.read_bytes() == before and not leftovers(tmp_path, "m.npz")


# -- a kill at every step of a replace -------------------------------------------------------
_STEPS = [(os, "rename"), (os, "replace"), (os, "fsync"), (os, "unlink"), (shutil, "rmtree"),
          (rp, "_exchange")]


def _run_killed_at(k, fn, args, exchange=True):
    """Run ``fn(args)`` in a forked child that SIGKILLs itself just before its k-th file-system
    step of a replace (k = 0: no kill). Returns (killed, steps seen)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            if not exchange:
                os.environ["OOC_NO_EXCHANGE"] = "1"
            seen = [0]

            def wrap(mod, name):
                real = getattr(mod, name)

                def step(*a, **kw):
                    seen[0] += 1
                    os.write(w, b".")
                    if seen[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*a, **kw)
                setattr(mod, name, step)

            for mod, name in _STEPS:
                wrap(mod, name)
            code = fn(args)
        except BaseException:
            code = 99
        os._exit(code)
    os.close(w)
    steps = 0
    while chunk := os.read(r, 4096):
        steps += len(chunk)
    os.close(r)
    status = os.waitpid(pid, 0)[1]
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert killed or os.waitstatus_to_exitcode(status) == 0, status
    return killed, steps


def _kill_everywhere(fn, args, check, exchange):
    """Kill at step 1, 2, ... until a run finishes; ``check()`` after each kill."""
    k, kills = 1, 0
    while True:
        killed, steps = _run_killed_at(k, fn, args, exchange)
        check()
        if not killed:
            return kills
        kills += 1
        k += 1
        assert k < 200


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_kill_at_every_step_of_ingest_overwrite(tmp_path, exchange):
    old_src, new_src = write_source(tmp_path / "a.svm", 80, 0), write_source(tmp_path / "b.svm",
                                                                             120, 1)
    out = tmp_path / "s"
    assert ingest_main([str(old_src), "-o", str(out), "--quiet"]) == 0
    sizes = []

    def check():
        with open_store(out) as s:  # opens (recovering a replace killed mid-way)
            sizes.append(s.n_samples)
            X, y, _ = s.read_range(0, s.n_samples)
            assert X.shape[0] == s.n_samples and set(np.unique(y)) <= {-1.0, 1.0}
        assert sizes[-1] in (80, 120)

    kills = _kill_everywhere(ingest_main, [str(new_src), "-o", str(out), "--overwrite",
                                           "--quiet"], check, exchange)
    assert kills >= 4  # fsyncs, the swap, the removal of the old store
    assert sizes[0] == 80 and sizes[-1] == 120  # old before the swap, new at the end
    assert ingest_main([str(old_src), "-o", str(out), "--overwrite", "--quiet"]) == 0
    assert not leftovers(tmp_path, "s")  # the next run removed what the killed ones left


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_kill_at_every_step_of_index_rebuild(tmp_path, exchange):
    src = write_source(tmp_path / "a.svm", 300, 0)
    out = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(out), "--quiet", "--leaf-size", "20"]) == 0

    def check():
        with open_store(out) as s:
            assert s.n_samples == 300
            with open_forest(s) as f:  # the old index or the new one, always whole
                rows, _ = f.query(np.ones(7), n=None)
                assert len(rows) > 0

    kills = _kill_everywhere(index_main, [str(out), "--overwrite", "--quiet", "--leaf-size",
                                          "30"], check, exchange)
    assert kills >= 3
    assert index_main([str(out), "--overwrite", "--quiet"]) == 0
    assert not leftovers(out, "index.lmdb") and not leftovers(tmp_path, "s")


def test_kill_at_every_step_of_model_save(tmp_path):
    old = LinearModel(np.arange(4.0), 1.0)
    new = LinearModel(-np.arange(4.0), -1.0)
    path = tmp_path / "m.h5"
    old.save(path)
    seen = []

    def check():
        m = load_model(path)  # never partial
        seen.append(m.intercept_)
        assert (m.intercept_, list(m.coef_)) in ((1.0, [0, 1, 2, 3]), (-1.0, [0, -1, -2, -3]))

    def save(_):
        new.save(path)
        return 0

    kills = _kill_everywhere(save, None, check, True)
    assert kills >= 2 and seen[0] == 1.0 and seen[-1] == -1.0
    old.save(path)
    assert not leftovers(tmp_path, "m.h5")


def test_recover_puts_an_old_store_set_aside_back(tmp_path):
    src = write_source(tmp_path / "a.svm", 50, 0)
    out = tmp_path / "s"
    assert ingest_main([str(src), "-o", str(out), "--quiet"]) == 0
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    aside = tmp_path / f".s.ooc-tmp-{dead}-old"
    os.rename(out, aside)  # a replace killed between its two renames
    half = tmp_path / f".s.ooc-tmp-{dead}-abcd"
    half.mkdir()  # ... and the new store it had not moved in
    with open_store(out) as s:
        assert s.n_samples == 50
    rp.remove_stale(out)
    assert not leftovers(tmp_path, "s")


def test_a_killed_runs_eval_store_is_removed_by_the_next(tmp_path, capsys):
    import tempfile

    src = write_source(tmp_path / "train.svm", 200, 0)
    store, model = tmp_path / "s", tmp_path / "m.npz"
    assert ingest_main([str(src), "-o", str(store), "--quiet"]) == 0
    assert train_main([str(store), "-o", str(model), "--quiet"]) == 0
    dead = 2 ** 22 + 4321
    stale = os.path.join(tempfile.gettempdir(), f"ooc-eval-{dead}-abc")
    os.makedirs(os.path.join(stale, "eval.store"), exist_ok=True)
    assert predict_main([str(model), str(src), "--quiet"]) == 0  # a text file: an eval store
    assert not os.path.exists(stale)
    mine = [p for p in os.listdir(tempfile.gettempdir()) if p.startswith(f"ooc-eval-{os.getpid()}-")]
    assert not mine  # this run's own is gone too


def test_json_failures_are_json(tmp_path, capsys):
    import json

    assert ingest_main([str(tmp_path / "missing.svm"), "-o", str(tmp_path / "s"),
                        "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 2 and "missing.svm" in out["error"] and out["hint"]


def test_usage_errors_are_json_under_json(capsys):
    import json

    from ooc_learn.cli import train_main

    with pytest.raises(SystemExit) as exc:
        train_main(["some.store", "--loss", "squared", "--json"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["exit_code"] == 2 and "'squared'" in out["error"] and "--help" in out["hint"]
    assert "usage:" in captured.err


def _tiny_model(tmp_path, capsys):
    """A four-row source, its store ``s`` and a model ``m.npz`` of it, in ``tmp_path``."""
    src = tmp_path / "t.svm"
    src.write_text("1 1:1\n-1 2:1\n1 1:2\n-1 2:3\n")
    assert ingest_main([str(src), "-o", str(tmp_path / "s"), "--quiet"]) == 0
    assert train_main([str(tmp_path / "s"), "-o", str(tmp_path / "m.npz"), "--quiet"]) == 0
    capsys.readouterr()
    return src


def test_an_output_path_ending_in_a_separator_is_refused_before_the_work(tmp_path, capsys):
    # `-o out/` (a folder that does not exist) had written a file named "out"
    _tiny_model(tmp_path, capsys)
    out = str(tmp_path / "out") + os.sep
    assert train_main([str(tmp_path / "s"), "-o", out, "--quiet"]) == 2
    assert "names a folder" in capsys.readouterr().err
    assert predict_main([str(tmp_path / "m.npz"), str(tmp_path / "s"), "-o", out,
                         "--quiet"]) == 2
    assert "names a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_folder_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys):
    # os.access says yes to root for /proc: ooc-train trained first, then failed naming its
    # temporary file (/proc/.m.npz.ooc-tmp-...), exit 2 after the work
    src = _tiny_model(tmp_path, capsys)
    for main, args in ((ingest_main, [str(src), "-o", "/proc/x.store"]),
                       (train_main, [str(tmp_path / "s"), "-o", "/proc/m.npz"]),
                       (train_main, [str(tmp_path / "s"), "-o", str(tmp_path / "m2.npz"),
                                     "--spill-dir", "/proc"]),
                       (predict_main, [str(tmp_path / "m.npz"), str(tmp_path / "s"), "-o",
                                       "/proc/p.csv"])):
        assert main(args + ["--quiet", "--json"]) == 2
        out = capsys.readouterr()
        # the check before the work speaks, not a failure after it
        assert "ooc-tmp" not in out.err and "/proc" in json.loads(out.out)["error"]
        assert "cannot be written" in out.err or "--spill-dir /proc" in out.err
    assert not (tmp_path / "m2.npz").exists()
