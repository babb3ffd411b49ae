"""Every Python snippet of README.md runs as written, in order, in one namespace, on the
example data of README command 1 (generated here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_snippets_this_test_runs():
    assert len(snippets()) >= 3


def test_readme_python_snippets_run_as_written(tmp_path, monkeypatch):
    subprocess.run([sys.executable, "-m", "ooc_learn.datasets", "example.svm", "--rows",
                    "20000", "--test", "example.t.svm"], cwd=tmp_path, check=True,
                   capture_output=True)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, code in enumerate(snippets()):
        try:
            exec(compile(code, f"README.md snippet {i + 1}", "exec"), namespace)
        except Exception as exc:  # name the snippet and its line
            pytest.fail(f"README snippet {i + 1} fails: {type(exc).__name__}: {exc}")
