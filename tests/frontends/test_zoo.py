"""The models users bring: every zoo family (bevir.testing.zoo, reduced configs) through the
TorchScript exporter (opset 17), the dynamo exporter (opset 20) and from_torch; each import
verifies and matches torch (and onnxruntime for the ONNX paths), and the standard pipeline
(canonicalize, fuse, to-nhwc) adds at most two layout changes and keeps every rewrite's
numeric claim (VerifyNumerics: a rewrite claimed exact changes no bit). The suite ends with
the table (model x path: max relative difference, layout changes before / after, exact
claims checked)."""
from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import bevir
from bevir.passes import PassManager, VerifyNumerics
from bevir.passes.layout import count_transposes
from bevir.testing.zoo import MODELS, build

PATHS = ("torchscript", "dynamo", "from_torch")
PIPELINE = "canonicalize,fuse,to-nhwc,canonicalize,cse,dce"
ROWS: dict[tuple[str, str], str] = {}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def import_model(name: str, path: str, tmp_path) -> tuple[bevir.Graph, np.ndarray, str | None]:
    model, x = build(name)
    if path == "from_torch":
        return bevir.from_torch(model, [x]), x.numpy(), None
    f = str(tmp_path / f"{name}.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, input_names=["x"], dynamo=path == "dynamo",
                          opset_version=20 if path == "dynamo" else 17)
    return bevir.from_onnx(f), x.numpy(), f


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_imports_and_matches(name, path, tmp_path):
    graph, x, onnx_file = import_model(name, path, tmp_path)
    bevir.verify(graph)
    model, _ = build(name)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    (out,) = bevir.run(graph, {graph.inputs[0].name: x}).values()
    err = rel(out, ref)
    assert err <= 1e-4, f"{name} via {path}: relative difference {err:.2e} to torch"
    if onnx_file:
        sess = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
        (want,) = sess.run(None, {"x": x})
        assert rel(out, want) <= 1e-4
    before = count_transposes(graph)
    claims = VerifyNumerics({graph.inputs[0].name: x})      # each rewrite held to its claim
    optimized = graph.clone()
    PassManager(PIPELINE, instruments=[claims]).run(optimized)
    exact = sum(c.changed and all(b == 0.0 for b in c.bounds.values()) for c in claims.checks)
    after = count_transposes(optimized)
    (opt_out,) = bevir.run(optimized, {optimized.inputs[0].name: x}).values()
    assert rel(opt_out, ref) <= 1e-4
    assert after <= before + 2, f"{name} via {path}: {before} layout changes -> {after}"
    ROWS[name, path] = f"{err:.1e} {before}->{after} {exact}="


def table() -> str:
    """The zoo table of this session's runs (printed at the end of the suite by conftest)."""
    lines = [f"{'model':24s}" + "".join(f"{p:>20s}" for p in PATHS)]
    for name in MODELS:
        lines.append(f"{name:24s}" + "".join(f"{ROWS.get((name, p), '-'):>20s}" for p in PATHS))
    return ("zoo (reduced configs): max relative difference to torch, layout changes "
            "before->after the pipeline, and N= its claims held, N of them exact (a pass, or "
            "a pass's rewrites that claim exactness, kept every bit)\n" + "\n".join(lines))
