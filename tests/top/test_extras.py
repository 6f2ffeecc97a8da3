"""The core without the optional packages: ``pip install bevir`` brings numpy, onnx,
safetensors, networkx and pydantic only; every import of an optional package goes through
bevir.extras.require, which names the extra to install."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bevir.extras import EXTRAS, MissingExtraError, require

ROOT = Path(__file__).resolve().parents[2]

#: the optional packages' distributions (whose metadata is hidden too)
DISTRIBUTIONS = ["torch", "apache-tvm", "apache-tvm-ffi", "onnxruntime", "matplotlib", "ray",
                 "pandas", "pyarrow"]

#: a meta-path finder that makes the optional packages look uninstalled, and their
#: distributions' metadata absent
BLOCKER = """
import importlib.metadata, sys
from importlib.abc import MetaPathFinder
HIDDEN, DISTRIBUTIONS = {hidden!r}, {distributions!r}
class Hide(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hide())
_version = importlib.metadata.version
def version(name):
    if name in DISTRIBUTIONS:
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)
importlib.metadata.version = version
"""

CORE = """
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
import bevir
from bevir.extras import MissingExtraError
w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "W")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["X", "W"], ["m"]), helper.make_node("Relu", ["m"], ["Y"])],
    "core", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 2])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 3])], initializer=[w])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "m.onnx")
g = bevir.from_onnx("m.onnx")
x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(4, 2)
y = bevir.run(g, {"X": x})["Y"]
assert np.array_equal(y, np.maximum(x @ np.arange(6, dtype=np.float32).reshape(2, 3), 0))
bevir.save(g, "m.bevir")
try:
    bevir.from_torch
except MissingExtraError as e:
    print("from_torch:", e)
from bevir.cli import main
raise SystemExit(main(["compile", "m.bevir", "-o", "prog"]))
"""


def _optional_imports(path: Path) -> list[str]:
    """'file:line module' for each import of an optional package outside TYPE_CHECKING."""
    found = []
    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            names = ([a.name for a in child.names] if isinstance(child, ast.Import) else
                     [child.module or ""] if isinstance(child, ast.ImportFrom) and
                     not child.level else [])
            found.extend(f"{path.relative_to(ROOT)}:{child.lineno} {n}" for n in names
                         if n.partition(".")[0] in EXTRAS)
            visit(child)
    visit(ast.parse(path.read_text()))
    return found


def test_optional_packages_are_imported_through_require_only():
    found = [hit for path in sorted((ROOT / "bevir").rglob("*.py"))
             for hit in _optional_imports(path)]
    assert not found, "import these through bevir.extras.require: " + ", ".join(found)


def test_the_core_runs_without_the_extras(tmp_path):
    """numpy, onnx, safetensors, networkx and pydantic only: an ONNX model imports and the
    golden model runs it; what needs an extra says which, in one line."""
    script = BLOCKER.format(hidden=sorted(EXTRAS), distributions=DISTRIBUTIONS) + CORE
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1, r.stderr
    assert "from_torch: the PyTorch frontend and model zoo needs torch, which is not " \
           "installed: pip install 'bevir[torch]'" in r.stdout
    assert r.stderr == ("bevir: error: code generation (TVM) needs tvm, which is not "
                        "installed: pip install 'bevir[codegen]'\n")


def test_require_names_the_extra_of_a_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)           # import ray -> ModuleNotFoundError
    with pytest.raises(MissingExtraError, match=r"pip install 'bevir\[scale\]'$"):
        require("ray")
    assert require("onnxruntime").__name__ == "onnxruntime"


def test_the_extras_are_declared_in_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0] for d in meta["dependencies"]}
    assert core == {"numpy", "onnx", "safetensors", "networkx", "pydantic", "threadpoolctl"}
    extras = meta["optional-dependencies"]
    assert {extra for extra, _ in EXTRAS.values()} | {"all", "test"} == set(extras)
    assert extras["all"] == [f"bevir[{','.join(sorted(set(e for e, _ in EXTRAS.values())))}]"]
