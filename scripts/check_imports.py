#!/usr/bin/env python
"""Check the package's import graph: layers, cycles and private names (issue 28).

Every module under ``ooc_learn/``, ``storage/`` (``ooc_learn.storage``) and ``index/``
(``ooc_learn.index``) is parsed; every import counts, the ones inside functions too. Three rules:

* layers: ``storage`` imports nothing else of ``ooc_learn`` (it knows bytes and rows); ``index``
  imports ``storage`` and nothing that learns (solvers, cv, learners, kernel, rls, cli, ...)
  but the one definition of the truncated loss (``ooc_learn.losses``, which imports only
  ``storage``);
* no cycle among modules (a strongly connected component of more than one module, or a module
  importing itself);
* no private name across modules: ``from .x import _helper`` and ``x._helper`` are refused; a
  private module imported as a module (``from . import _kernels as K``) is fine inside its
  package. Numba kernel modules (``_kernels``, ``_parse_kernels``) are shared by kernels of
  other packages too: kernels compose only by calling each other.

Exceptions: ``ooc_learn/__init__.py`` (its PEP 562 lazy re-exports are strings, not imports)
is left out, and ``ooc_learn.storage.errors`` is below every layer (everyone may import it).

Usage::

    python scripts/check_imports.py          # prints each problem; exit status 1 if any

``tests/test_layering.py`` runs the same check.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject.toml's package-dir)
TOPS = {"ooc_learn": "ooc_learn", "storage": "ooc_learn.storage", "index": "ooc_learn.index"}
SKIP = {"ooc_learn"}  # the package's __init__: lazy re-exports only
LOWEST = {"ooc_learn.storage.errors"}
# ooc_learn.losses is on the index layer: the index's query keeps the rows that the paper's
# truncated loss keeps (L^-1(1 + s), defined once, there); it imports nothing above storage
ON_INDEX_LAYER = {"ooc_learn.losses"}


def layer(module: str) -> str:
    """``storage``, ``index`` or ``learning`` (all of ``ooc_learn`` above the two)."""
    if module in ON_INDEX_LAYER:
        return "index"
    for name in ("storage", "index"):
        if module == f"ooc_learn.{name}" or module.startswith(f"ooc_learn.{name}."):
            return name
    return "learning"


ALLOWED = {"storage": {"storage"}, "index": {"storage", "index"},
           "learning": {"storage", "index", "learning"}}


def find_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    modules = {}
    for folder, package in TOPS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package,) + parts)] = path
    return modules


def _is_package(module: str, modules: dict[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None, modules: dict[str, Path]) -> str:
    """The absolute name of ``from <level dots><target> import ...`` inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not _is_package(module, modules):
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scan(module: str, path: Path, modules: dict[str, Path]):
    """The modules ``module`` imports and its private-name uses across modules.

    Returns ``(edges, problems)``: ``edges`` maps each imported module of the package to the
    first line importing it, ``problems`` lists ``(line, message)``.
    """
    tree = ast.parse(path.read_text(), str(path))
    edges: dict[str, int] = {}
    problems = []
    aliases: dict[str, str] = {}  # local name -> module of the package it is bound to

    def add(target: str, line: int) -> None:
        # the deepest module of the package that the dotted name names
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module:
            edges.setdefault(target, line)
            owner, _, name = target.rpartition(".")
            if (_private(name) and not name.endswith("kernels")
                    and not module.startswith(owner + ".")):
                problems.append((line, f"imports {target}, private to {owner}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node.level, node.module, modules)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in modules:  # a module imported as a module
                    add(full, node.lineno)
                    aliases[alias.asname or alias.name] = full
                    continue
                add(source, node.lineno)
                if _private(alias.name) and source in modules and source != module:
                    problems.append((node.lineno, f"imports private {alias.name} from {source}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _private(node.attr)
                and f"{aliases[node.value.id]}.{node.attr}" not in modules):
            problems.append((node.lineno, f"uses private {aliases[node.value.id]}.{node.attr}"))
    return edges, problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def check(root: Path = ROOT) -> list[str]:
    """Every problem of the import graph, one line each (empty when there is none)."""
    modules = find_modules(root)
    graph: dict[str, set[str]] = defaultdict(set)
    problems = []
    for module, path in sorted(modules.items()):
        if module in SKIP:
            continue
        edges, private = scan(module, path, modules)
        rel = path.relative_to(root)
        problems += [f"{rel}:{line}: {message}" for line, message in dict.fromkeys(private)]
        for target, line in sorted(edges.items(), key=lambda e: e[1]):
            if target in SKIP:
                continue
            graph[module].add(target)
            if target not in LOWEST and layer(target) not in ALLOWED[layer(module)]:
                problems.append(f"{rel}:{line}: {layer(module)} imports {target} "
                                f"({layer(target)} is above it)")
    for component in cycles(graph):
        problems.append("import cycle: " + " <-> ".join(component))
    return problems


def main() -> int:
    problems = check()
    for line in problems:
        print(line)
    print(f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
