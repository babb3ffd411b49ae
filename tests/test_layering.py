"""The import graph stays layered and acyclic (issue 28): the check of scripts/check_imports.py.

Storage imports nothing above it, the index nothing that learns, no module imports another
module's private names, and no import cycle, function-level imports included.
"""

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checker():
    spec = importlib.util.spec_from_file_location("check_imports",
                                                  ROOT / "scripts" / "check_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_is_layered_acyclic_and_keeps_private_names_private(checker):
    assert checker.check() == []


def _tree(root: Path, files: dict) -> Path:
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code))
    for pkg in ("ooc_learn", "ooc_learn/solvers", "storage", "index"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").touch()
    return root


def test_each_kind_of_problem_is_found(checker, tmp_path):
    root = _tree(tmp_path, {
        "storage/errors.py": "",
        "storage/rows.py": """
            from .errors import *                          # the lowest layer: fine
            def f():
                from ooc_learn.index.forest import Forest  # upward, lazily
            """,
        "index/forest.py": """
            from ooc_learn.losses import get_loss          # the truncation: fine
            from ooc_learn.solvers import dcd              # upward
            """,
        "ooc_learn/losses.py": "from ooc_learn.storage.errors import ParameterError\n",
        "ooc_learn/solvers/_kernels.py": "def _inner(): pass\n",
        "ooc_learn/solvers/dcd.py": """
            from . import _kernels as K                    # its own kernels: fine
            from .tron import _step                        # a private name
            K._inner()                                     # a private name
            """,
        "ooc_learn/solvers/tron.py": """
            def _step(): pass
            def solve():
                from .dcd import K                         # a cycle, lazily
            """,
    })
    problems = checker.check(root)
    assert any("storage/rows.py" in p and "ooc_learn.index.forest" in p for p in problems)
    assert any("index/forest.py" in p and "ooc_learn.solvers.dcd" in p for p in problems)
    assert not any("ooc_learn.losses" in p or "storage.errors" in p for p in problems)
    assert any("imports private _step" in p for p in problems)
    assert any("uses private ooc_learn.solvers._kernels._inner" in p for p in problems)
    assert not any("imports ooc_learn.solvers._kernels" in p for p in problems)
    assert ("import cycle: ooc_learn.solvers.dcd <-> ooc_learn.solvers.tron" in problems)
    assert len(problems) == 5, problems
