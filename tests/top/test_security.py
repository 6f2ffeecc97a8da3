"""Nothing from a model, checkpoint, IR text or config file is unpickled or evaluated: a
malicious pickle is refused with a clear error and nothing it asks for runs."""
import ast
import pathlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import bevir

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this creates the file ``marker``: what an attacker's code would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_malicious_checkpoint_is_refused_and_runs_nothing(tmp_path, capsys):
    from examples.bevformer import e2e
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Payload(marker)}, evil)
    pickle.loads(pickle.dumps(Payload(tmp_path / "control")))   # the payload is real:
    assert (tmp_path / "control").exists()                      # plain pickle runs it
    assert e2e.main(["--config", "test", "--checkpoint", str(evil), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot load checkpoint {evil}") and err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "o").exists()


def test_a_pickle_in_place_of_constants_is_refused(tmp_path):
    b = bevir.Builder("g")
    x = b.input("x", bevir.TensorType((4,)))
    b.output("y", b.add(x, b.const(np.ones(64, np.float32)[:4].copy(), "c")))
    path = bevir.save(b.graph, tmp_path / "m.bevir")
    sidecar = bevir.ir.serialize.constants_path(path)
    marker = tmp_path / "pwned"
    sidecar.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(bevir.BevirError, match="cannot read constants"):
        bevir.load(path)
    assert not marker.exists()


def _calls(tree: ast.AST):
    """(call, owner, name): ``pickle.load(...)`` gives owner "pickle", a bare ``eval(...)``
    owner "", a method call on an expression (``model.eval()``) owner "?"."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                yield node, getattr(f.value, "id", "?"), f.attr
            elif isinstance(f, ast.Name):
                yield node, "", f.id


def test_no_code_path_unpickles_or_evaluates():
    """bevir and the examples: no pickle / marshal / yaml loads, eval or exec, and every
    torch.load passes weights_only=True."""
    bad = []
    for path in sorted((ROOT / "bevir").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.py")):
        for node, owner, name in _calls(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if owner in ("pickle", "marshal", "dill", "cloudpickle") and name.startswith("load") \
                    or owner == "yaml" and name == "load" or name in ("eval", "exec") and not owner:
                bad.append(f"{where} {owner}.{name}")
            if owner == "torch" and name == "load" and not any(
                    k.arg == "weights_only" and getattr(k.value, "value", None) is True
                    for k in node.keywords):
                bad.append(f"{where} torch.load without weights_only=True")
    assert bad == []
