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
