"""The package layout promised by pyproject.toml and the public API."""

import tomllib
from pathlib import Path

import ooc_learn

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_for_installation():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = conf["package-dir"]
    found = set()
    for top, name in (("ooc_learn", "ooc_learn"), ("storage", "ooc_learn.storage"),
                      ("index", "ooc_learn.index")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name,) + rel))
    assert found == listed
    assert dirs == {"ooc_learn.storage": "storage", "ooc_learn.index": "index"}


def test_public_names_resolve_lazily():
    for name in ooc_learn.__all__:
        assert getattr(ooc_learn, name) is not None


def test_no_submodule_shadows_a_public_name():
    # importing a submodule binds it on the package: a module ooc_learn/train.py made
    # ``ooc_learn.train`` that module, not the function, once anything had imported it first
    # (``import ooc_learn.train; ooc_learn.train(...)``: "'module' object is not callable")
    import importlib.util
    import subprocess
    import sys

    for name in ooc_learn.__all__:
        assert importlib.util.find_spec(f"ooc_learn.{name}") is None, name
    # the case as a user meets it, in a fresh interpreter: every module imported first
    code = ("import pkgutil, importlib, ooc_learn\n"
            "for m in pkgutil.walk_packages(ooc_learn.__path__, 'ooc_learn.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(callable(ooc_learn.train), callable(ooc_learn.svm_cv))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_every_command_prints_its_version(capsys):
    import pytest

    import ooc_learn
    from ooc_learn import cli

    for main in (cli.ingest_main, cli.train_main, cli.predict_main, cli.index_main,
                 cli.info_main, cli.check_main):
        with pytest.raises(SystemExit) as e:
            main(["--version"])
        assert e.value.code == 0
        assert capsys.readouterr().out.strip().endswith(f"(ooc-learn) {ooc_learn.__version__}")
