"""The package's layers: the runtime never imports the tools, and no module imports itself back.

Imports point down only (``errors`` and the records, the contract, the registry and
configuration, the selector, the operators, the package face, and the tools last), lazy imports
inside functions included: a lazy import hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import opruntime

PACKAGE = Path(opruntime.__file__).resolve().parent
TOOLS = f"{PACKAGE.name}.tools"


def test_the_runtime_loads_no_tool_and_no_torch():
    code = ("import sys, opruntime as opr; opr.softmax([1.0, 2.0]); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('opruntime.tools') "
            "or m == 'torch' or m.startswith('torch.'))))")
    env = {**os.environ, "OPRUNTIME_DEVICE": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "", f"import opruntime and a call loaded {out.stdout.strip()}"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _under_type_checking(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at module level or inside functions (not under
    ``if TYPE_CHECKING:``). ``from pkg import name`` counts as importing ``pkg.name`` when that is a
    module, else ``pkg``; the package face itself (it only re-exports) is no dependency."""
    mods = _modules(root)
    package = root.name
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        skip = _under_type_checking(tree)
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in mods and target not in (mod, package):
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles_and_lazy_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import x\n")  # a lazy import counts
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n"
                              "import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import c\n")  # c -> d only under TYPE_CHECKING: no cycle
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.c"} and graph["pkg"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_no_import_cycles():
    found = cycles(import_graph(PACKAGE))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_runtime_never_imports_the_tools():
    graph = import_graph(PACKAGE)
    entry = f"{PACKAGE.name}.__main__"  # `python -m opruntime`: the command's entry, run and never imported
    wrong = sorted(f"{m} -> {t}" for m, ts in graph.items() if not m.startswith(TOOLS) and m != entry
                   for t in ts if t.startswith(TOOLS))
    assert not wrong, f"runtime modules import the tools: {wrong}"
