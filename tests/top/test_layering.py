"""bevir's import graph runs one way: each layer imports only the layers below it, no module
takes part in an import cycle (function-level imports count), and no module imports
another module's private names.

The layers, lowest first (``bevir/<layer>/...`` or ``bevir/<layer>.py``)::

    errors < extras < fsutil < progress < plugins < ir < ops < target < sim < passes
    < frontends < codegen < flows < scale < testing < cli, __init__, __main__

Frontends sit above passes in the order but may not import them: an importer builds a
graph, a flow (``bevir/flows``) decides what runs on it. Code generation may not import
the planning passes (partition, plan-memory, the target pipeline): it generates the graph
it is given, and a flow plans it.

The code, the tests, the examples, the benches and the tools also pass ruff with the
configuration in pyproject.toml (``[tool.ruff]``: 100 columns, the rules chosen there).
"""
from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "bevir"

LAYERS = ["errors", "extras", "fsutil", "progress", "plugins", "ir", "ops", "target", "sim",
          "passes", "frontends", "codegen", "flows", "scale", "testing", "top"]
#: layers that may not import a lower layer although the order would allow it
FORBIDDEN = {("frontends", "passes"), ("frontends", "sim")}
#: modules a layer may not import although the order would allow it: code generation
#: generates what it is given, planning happens before (bevir/flows/target.py)
FORBIDDEN_MODULES = {("codegen", m) for m in ("bevir.passes.partition",
                                              "bevir.passes.memory_plan",
                                              "bevir.passes.target")}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "top"
    return parts[1]


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(path: Path, root: Path, modules: set[str]) -> list[tuple[str, str, int]]:
    """(imported bevir module, imported name or '', line) for every import in ``path``."""
    module = module_name(path, root)
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("bevir")]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            if not target.startswith("bevir"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub, "", node.lineno) if sub in modules
                             else (target, a.name, node.lineno))
    return found


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[str, str, int]]]:
    """module -> its imports of bevir modules (see :func:`imports_of`)."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, root, modules) for p in files}


def back_edges(graph: dict[str, list[tuple[str, str, int]]]) -> list[str]:
    """Imports that go up the layer order, or across a forbidden pair."""
    bad = []
    for mod, imports in graph.items():
        lo = layer_of(mod)
        for target, _, line in imports:
            hi = layer_of(target)
            if (LAYERS.index(hi) > LAYERS.index(lo) or (lo, hi) in FORBIDDEN
                    or (lo, target) in FORBIDDEN_MODULES):
                bad.append(f"{mod}:{line} ({lo}) imports {target} ({hi})")
    return bad


def private_imports(graph: dict[str, list[tuple[str, str, int]]]) -> list[str]:
    """``from other_module import _name`` across modules."""
    return [f"{mod}:{line} imports {target}.{name}" for mod, imports in graph.items()
            for target, name, line in imports
            if name.startswith("_") and not name.startswith("__") and target != mod]


def cycles(graph: dict[str, list[tuple[str, str, int]]]) -> list[list[str]]:
    """The import cycles between modules (each as a list of modules, smallest first).
    A package's ``__init__`` importing its own submodules is not counted as an edge back
    from those submodules."""
    edges = {m: sorted({t for t, _, _ in imps if t in graph and t != m
                        and not m.startswith(t + ".")})
             for m, imps in graph.items()}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:                 # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return sorted(out)


GRAPH = import_graph()


def test_imports_run_down_the_layers():
    assert back_edges(GRAPH) == []


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_no_private_names_across_modules():
    assert private_imports(GRAPH) == []


def test_every_module_has_a_known_layer():
    assert {layer_of(m) for m in GRAPH} <= set(LAYERS)


@pytest.mark.parametrize("case", ["back-edge", "cycle", "private"])
def test_the_checks_can_fail(tmp_path, case):
    pkg = tmp_path / "bevir"
    files = {"__init__.py": "", "errors.py": "", "ir/__init__.py": "", "ops/__init__.py": "",
             "ir/graph.py": "from ..errors import BevirError\n",
             "ops/nn.py": "from ..ir.graph import Graph\n"}
    if case == "back-edge":
        files["ir/graph.py"] += "from ..ops.nn import Relu\n"
    elif case == "cycle":
        files["ops/a.py"] = "from .b import x\n"
        files["ops/b.py"] = "def f():\n    from .a import y\n"
    else:
        files["ops/nn.py"] += "from ..ir.graph import _helper\n"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    found = {"back-edge": back_edges, "cycle": cycles, "private": private_imports}[case](graph)
    assert found, case
    others = [f for k, f in (("back-edge", back_edges), ("private", private_imports)) if k != case]
    assert all(f(graph) == [] for f in others)


# ---- lint ---------------------------------------------------------------------------------
#: the folders ruff checks (with pyproject.toml's [tool.ruff])
LINTED = ("bevir", "tests", "examples", "bench", "tools")


def ruff_command() -> list[str]:
    """How to run ruff here (the test extra installs it); skips the test without it."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")


def test_ruff_finds_nothing():
    done = subprocess.run([*ruff_command(), "check", "--no-cache", "--output-format", "concise",
                           *LINTED], cwd=ROOT.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reads_the_project_configuration(tmp_path):
    """A line of 101 columns and an unused import are findings, a line of 100 is not."""
    (tmp_path / "bad.py").write_text(f"import os\n\nX = '{'x' * 94}'\nY = '{'y' * 95}'\n")
    done = subprocess.run([*ruff_command(), "check", "--no-cache", "--output-format", "concise",
                           "--config", str(ROOT.parent / "pyproject.toml"), "bad.py"],
                          cwd=tmp_path, capture_output=True, text=True)
    found = {line.split(" ")[0] + line.split(" ")[1] for line in done.stdout.splitlines()
             if line.startswith("bad.py:")}
    assert done.returncode == 1 and found == {"bad.py:1:8:F401", "bad.py:4:101:E501"}, done.stdout
