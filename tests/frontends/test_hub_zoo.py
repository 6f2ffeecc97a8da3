"""The models users bring from timm and Hugging Face transformers (bevir.testing.hub_zoo:
the libraries' own classes, random weights, small configs, nothing downloaded) through
``from_torch``, the TorchScript ONNX exporter (opset 17) and the dynamo ONNX exporter (opset
20): each import verifies and matches torch within float rounding. Where torch's dynamo
exporter itself fails, the case expects that failure (its message, in
``DYNAMO_EXPORT_FAILS``) and is an xfail; when torch exports it, the case fails until it is
taken off the list. Through ``from_torch`` the standard pipeline then runs under
VerifyNumerics: each rewrite keeps its numeric claim (an exact one, every bit). The suite
ends with the table (model, family, path, max relative difference to torch, exact claims
checked).

The dynamo exporter takes about 3 s a model (twice the other paths): by default it runs on
``DYNAMO_SUBSET``, and on every model with ``--full-zoo`` (tests/conftest.py)."""
from __future__ import annotations

import contextlib
import io
import re
import warnings

import numpy as np
import pytest
import torch

import bevir
from bevir.passes import PassManager, VerifyNumerics
from bevir.testing.hub_zoo import MODELS, available, build

pytestmark = pytest.mark.skipif(available() is not None,
                                reason=f"timm and transformers (the test extra's): {available()}")

PATHS = ("from_torch", "torchscript", "dynamo")
PIPELINE = "canonicalize,fuse,to-nhwc,canonicalize,cse,dce"      # as test_zoo's
ROWS: dict[tuple[str, str], str] = {}

#: the models torch's dynamo exporter (torch 2.13) fails on, with its one-line error: its
#: decomposition step turns the ``reshape`` after the attention's transpose into a ``view``
#: of a non-contiguous tensor (torch's failure, before bevir sees a graph)
DYNAMO_EXPORT_FAILS = {
    "hf/t5_encoder": "ValueError: Cannot view a tensor with shape torch.Size([1, 16, 2, 16]) "
                     "and strides (512, 16, 256, 1) as a tensor with shape (1, 16, 32)!",
    "hf/beit": "ValueError: Cannot view a tensor with shape torch.Size([1, 17, 2, 16]) and "
               "strides (544, 16, 272, 1) as a tensor with shape (1, 17, 32)!",
    "hf/swin": "ValueError: Cannot view a tensor with shape torch.Size([4, 16, 2, 16]) and "
               "strides (512, 16, 256, 1) as a tensor with shape (4, 16, 32)!",
}

#: the dynamo path's models in the default run: one of each kind of architecture (a plain
#: CNN, a mobile CNN with hard activations, a ConvNeXt-style hybrid, MobileViT, Swin's
#: windows, PoolFormer's pooling, SegFormer's decoder, ViT, DETR, text and audio
#: encoders), which together emit every ONNX op type (40) the exporter writes for the whole
#: zoo, and the models the exporter fails on
DYNAMO_SUBSET = ["timm/densenet", "timm/lcnet_050", "timm/edgenext_xx_small",
                 "hf/mobilevit", "timm/swin_tiny", "timm/poolformer", "hf/segformer",
                 "timm/vit_tiny", "hf/detr", "hf/roberta", "hf/albert", "hf/whisper_encoder",
                 *DYNAMO_EXPORT_FAILS]


def pytest_generate_tests(metafunc):
    """(model, path) for the import test: every model through from_torch and TorchScript,
    through dynamo those of ``DYNAMO_SUBSET`` (all with ``--full-zoo``)."""
    if metafunc.function is not test_hub_model_imports_and_matches_torch:
        return
    full = metafunc.config.getoption("--full-zoo")
    cases = [(name, path) for name in MODELS for path in PATHS
             if path != "dynamo" or full or name in DYNAMO_SUBSET]
    metafunc.parametrize(("name", "path"), cases, ids=[f"{n}-{p}" for n, p in cases])


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def record(name: str, path: str, result: str) -> None:
    """The table's row for ``name`` through ``path``."""
    ROWS[name, path] = f"{name:28} {MODELS[name].family:18} {path:12} {result:>9}"


def test_the_zoo_covers_the_families():
    """At least 30 models; the architecture families the issue names each present."""
    families = {e.family for e in MODELS.values()}
    assert len(MODELS) >= 30
    assert {"ResNet-D", "EfficientNet", "MobileNetV3", "RegNet", "GhostNet", "RepVGG", "ConvNeXt",
            "FastViT", "ViT", "DeiT", "Swin", "LeViT", "MobileViT", "EdgeNeXt", "PoolFormer",
            "SegFormer", "DETR", "BERT", "DistilBERT", "GPT-2", "T5", "Whisper"} <= families


@contextlib.contextmanager
def quiet():
    """The exporters' deprecation notes and progress lines left out."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def export(model: torch.nn.Module, inputs: tuple, path: str, f: str) -> None:
    """Export ``model`` to ONNX file ``f`` through the exporter of ``path`` (opset 17 for
    TorchScript, 20 for dynamo, as tests/frontends/test_zoo.py)."""
    dynamo = path == "dynamo"
    with quiet():
        torch.onnx.export(model, inputs, f, input_names=[f"in{i}" for i in range(len(inputs))],
                          dynamo=dynamo, opset_version=20 if dynamo else 17)


def import_model(name: str, model: torch.nn.Module, inputs: tuple, path: str,
                 tmp_path) -> bevir.Graph:
    """``model`` imported through ``path``; an xfail where torch's dynamo exporter fails as
    ``DYNAMO_EXPORT_FAILS`` records (and a failure where it no longer does)."""
    if path == "from_torch":
        with quiet():
            return bevir.from_torch(model, list(inputs))
    f = str(tmp_path / "model.onnx")
    if path == "dynamo" and name in DYNAMO_EXPORT_FAILS:
        why = DYNAMO_EXPORT_FAILS[name]
        with pytest.raises(Exception, match=re.escape(why.split(": ", 1)[1])):
            export(model, inputs, path, f)
        record(name, path, "torch's exporter fails")
        pytest.xfail(f"torch's dynamo exporter fails: {why}")
    export(model, inputs, path, f)
    return bevir.from_onnx(f)


def test_hub_model_imports_and_matches_torch(name, path, tmp_path):
    model, inputs = build(name)
    with torch.no_grad():
        want = model(*inputs).numpy()
    graph = import_model(name, model, inputs, path, tmp_path)
    bevir.verify(graph)
    (got,) = bevir.run(graph, {v.name: a.numpy() for v, a in zip(graph.inputs, inputs)}).values()
    err = rel(got, want)
    record(name, path, f"{err:.1e}")
    assert got.shape == want.shape and err <= 1e-4, f"{name} via {path}: {err:.2e} relative"
    if path == "from_torch":        # the standard pipeline keeps each rewrite's claim
        claims = VerifyNumerics({v.name: a.numpy() for v, a in zip(graph.inputs, inputs)})
        PassManager(PIPELINE, instruments=[claims]).run(graph)
        exact = sum(c.changed and all(b == 0.0 for b in c.bounds.values())
                    for c in claims.checks)
        record(name, path, f"{err:.1e} {exact}=")


def test_the_dynamo_subset_is_of_the_zoo():
    assert set(DYNAMO_SUBSET) <= set(MODELS)
    assert len(set(DYNAMO_SUBSET)) == len(DYNAMO_SUBSET)


def test_build_is_a_pure_function_of_the_seed():
    a, xa = build("hf/bert", seed=3)
    b, xb = build("hf/bert", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.equal(xa[0], xb[0])
    with pytest.raises(KeyError, match="unknown hub zoo model"):
        build("timm/no_such_model")


def table() -> str:
    """The rows of the models imported in this session (from_torch's with N= after the
    difference: the standard pipeline held every rewrite to its numeric claim, N of the
    checks exact, every bit kept)."""
    return "\n".join([f"{'model':28} {'family':18} {'path':12} {'rel. diff':>9}", *ROWS.values()])
