"""The models users bring from timm and Hugging Face transformers (bevir.testing.hub_zoo:
the libraries' own classes, random weights, small configs, nothing downloaded) through
``from_torch`` and the TorchScript ONNX exporter (opset 17): each import verifies and
matches torch within float rounding. The suite ends with the table (model, family, path,
max relative difference to torch)."""
from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import pytest
import torch

import bevir
from bevir.testing.hub_zoo import MODELS, available, build

pytestmark = pytest.mark.skipif(available() is not None,
                                reason=f"timm and transformers (the test extra's): {available()}")

ROWS: dict[tuple[str, str], str] = {}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def test_the_zoo_covers_the_families():
    """At least 30 models; the architecture families the issue names each present."""
    families = {e.family for e in MODELS.values()}
    assert len(MODELS) >= 30
    assert {"ResNet-D", "EfficientNet", "MobileNetV3", "RegNet", "GhostNet", "RepVGG", "ConvNeXt",
            "FastViT", "ViT", "DeiT", "Swin", "LeViT", "MobileViT", "EdgeNeXt", "PoolFormer",
            "SegFormer", "DETR", "BERT", "DistilBERT", "GPT-2", "T5", "Whisper"} <= families


def import_model(model: torch.nn.Module, inputs: tuple, path: str, tmp_path) -> bevir.Graph:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")            # the exporters' deprecation notes
        if path == "from_torch":
            return bevir.from_torch(model, list(inputs))
        f = str(tmp_path / "model.onnx")
        torch.onnx.export(model, inputs, f, input_names=[f"in{i}" for i in range(len(inputs))],
                          dynamo=False, opset_version=17)
    return bevir.from_onnx(f)


@pytest.mark.parametrize("path", ["from_torch", "torchscript"])
@pytest.mark.parametrize("name", list(MODELS))
def test_hub_model_imports_and_matches_torch(name, path, tmp_path):
    model, inputs = build(name)
    with torch.no_grad():
        want = model(*inputs).numpy()
    graph = import_model(model, inputs, path, tmp_path)
    bevir.verify(graph)
    (got,) = bevir.run(graph, {v.name: a.numpy() for v, a in zip(graph.inputs, inputs)}).values()
    err = rel(got, want)
    ROWS[name, path] = f"{name:28} {MODELS[name].family:18} {path:12} {err:9.1e}"
    assert got.shape == want.shape and err <= 1e-4, f"{name} via {path}: {err:.2e} relative"


def test_build_is_a_pure_function_of_the_seed():
    a, xa = build("hf/bert", seed=3)
    b, xb = build("hf/bert", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.equal(xa[0], xb[0])
    with pytest.raises(KeyError, match="unknown hub zoo model"):
        build("timm/no_such_model")


def table() -> str:
    """The rows of the models imported in this session."""
    return "\n".join([f"{'model':28} {'family':18} {'path':12} {'rel. diff':>9}", *ROWS.values()])
