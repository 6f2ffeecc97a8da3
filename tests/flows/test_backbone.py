"""The backbone flow (bevir.flows.quantize_backbone, ``bevir quantize-backbone``): a reduced
ResNet-50 + FPN through real torch export, onnxruntime's quantize_static and bevir's import,
its golden model bit for bit against onnxruntime."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from safetensors.numpy import save_file

import bevir
from bevir.cli import main
from bevir.flows.backbone import QuantizeError, module_path
from bevir.passes.calibrate import Ranges, ranges_of

from examples.bevformer.backbone import ResNetFPN, randomize_bn

SHAPE = (2, 3, 64, 96)          # 6x3x480x800 in the real flow


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    m = ResNetFPN(blocks=(1, 1, 1, 1)).eval()       # one bottleneck per stage
    randomize_bn(m, torch.Generator().manual_seed(0))
    return m


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]


@pytest.fixture(scope="module")
def flow(backbone, samples, tmp_path_factory):
    """The reference flow: forced scales from a checkpoint, QOperator, per-tensor weights."""
    d = tmp_path_factory.mktemp("flow")
    ckpt = d / "scales.safetensors"
    save_file({"img_backbone.conv1.x_scale": np.array([0.03125], np.float32),
               "img_backbone.conv1.w_scale": np.array([0.004], np.float32),
               "img_backbone.layer2.0.conv2.x_scale": np.array([0.02], np.float32),
               "img_backbone.conv1.weight": np.zeros((64, 3, 7, 7), np.float32),  # not a scale
               "pts_bbox_head.cls.x_scale": np.array([0.1], np.float32)}, str(ckpt))  # elsewhere
    return bevir.flows.quantize_backbone(backbone, samples, d, scales=ckpt, progress=False)


def _inits(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_flow_writes_the_reference_files(flow):
    assert flow.fp32_onnx.name == "backbone_fp32.onnx" and flow.fp32_onnx.is_file()
    ops = {n.op_type for n in onnx.load(str(flow.int8_onnx)).graph.node}
    assert {"QuantizeLinear", "QLinearConv", "QLinearAdd", "MaxPool", "DequantizeLinear"} <= ops
    assert "Conv" not in ops                             # QOperator: every conv quantized
    n_convs = sum(n.op_type == "QLinearConv" for n in onnx.load(str(flow.int8_onnx)).graph.node)
    assert n_convs == 1 + 4 * 3 + 4 + 2                  # stem, 4 bottlenecks + shortcuts, FPN


def test_forced_scales_are_the_int8_models(flow):
    inits = _inits(flow.int8_onnx)
    assert len(flow.overrides) == 3                      # the two unrelated keys are skipped
    for tensor, want in flow.overrides.items():
        got = inits[f"{tensor}_scale"]
        assert got.dtype == np.float32 and got.reshape(-1).tolist() == [np.float32(w) for w in want]
    assert sorted(np.float32(v[0]) for v in flow.overrides.values()) == \
        sorted(np.float32([0.03125, 0.004, 0.02]))
    # symmetric int8: every zero point of the model is 0
    zps = [v for k, v in inits.items() if k.endswith("_zero_point")]
    assert zps and all(z.dtype == np.int8 and not z.any() for z in zps)


def test_golden_model_is_bit_exact_with_onnxruntime(flow, samples):
    for s in samples[:2]:
        assert flow.mismatches(s) == {"feats": 0}
    other = np.random.default_rng(7).uniform(-4, 4, SHAPE).astype(np.float32)   # unseen range
    assert flow.mismatches(other) == {"feats": 0}


def test_tranges_are_measured_and_attached(flow, samples):
    doc = json.loads(flow.tranges.read_text())
    assert doc["format"] == "bevir-tranges" and doc["version"] == 1
    assert len(doc["ranges"]) == flow.from_data > 0 and flow.from_scales == 0
    lo, hi = doc["ranges"]["img"]
    assert lo == float(min(s.min() for s in samples)) and hi == float(max(s.max() for s in samples))
    for lo, hi in doc["ranges"].values():
        assert lo <= hi
    assert ranges_of(flow.graph) is flow.ranges and len(flow.ranges) == len(doc["ranges"])
    assert flow.ranges[flow.graph.inputs[0]].lo == doc["ranges"]["img"][0]
    assert Ranges.load(flow.tranges) == Ranges.from_tranges(flow.tranges)


def test_summary_names_what_was_made(flow):
    text = flow.summary()
    assert "QLinearConv" in text and "3 forced" in text and f"{len(flow.ranges)} entries" in text


@pytest.mark.parametrize("fmt,per_channel,act", [("qoperator", True, "int8"),
                                                 ("qoperator", False, "uint8"),
                                                 ("qdq", False, "uint8"), ("qdq", True, "uint8")])
def test_other_formats_from_an_onnx_file_are_bit_exact(flow, samples, tmp_path, fmt,
                                                       per_channel, act):
    qb = bevir.flows.quantize_backbone(flow.fp32_onnx, samples[:1], tmp_path, format=fmt,
                                 per_channel=per_channel, activation_type=act,
                                 symmetric=act == "int8", progress=False)
    ops = {n.op_type for n in onnx.load(str(qb.int8_onnx)).graph.node}
    assert ("QLinearConv" in ops) == (fmt == "qoperator")
    w = [v for k, v in _inits(qb.int8_onnx).items() if "weight" in k and k.endswith("_scale")]
    assert w and all((v.size > 1) == per_channel for v in w)
    assert qb.float_ops() == {}                          # every conv and add folded
    assert qb.mismatches(samples[2]) == {"feats": 0}


def test_qdq_int8_shared_inputs_keep_float_convs_as_onnxruntime_does(flow, samples, tmp_path):
    """With int8 activations onnxruntime (x86-64) folds a QDQ conv only when its input pair
    is not shared: the first conv of each bottleneck and its shortcut stay float, in bevir
    as in onnxruntime. The summary says so."""
    qb = bevir.flows.quantize_backbone(flow.fp32_onnx, samples[:1], tmp_path, format="qdq",
                                 progress=False)
    assert qb.float_ops() == {"conv2d": 8}
    assert "8 float ops" in qb.summary()


def test_calibration_inputs_from_safetensors_with_a_sample_axis(flow, samples, tmp_path):
    f = tmp_path / "calib.safetensors"
    save_file({"img": np.stack(samples)}, str(f))
    qb = bevir.flows.quantize_backbone(flow.fp32_onnx, f, tmp_path / "out", progress=False)
    assert qb.ranges["img"].lo == float(min(s.min() for s in samples))
    assert qb.mismatches(samples[0]) == {"feats": 0}


def test_module_path_of_exported_node_names():
    assert module_path("/img_backbone/layer1/layer1.0/conv1/Conv") == "img_backbone.layer1.0.conv1"
    assert module_path("/img_neck/fpn_convs.0/conv/Conv") == "img_neck.fpn_convs.0.conv"
    assert module_path("/img_backbone/conv1/Conv") == "img_backbone.conv1"


@pytest.mark.parametrize("kwargs,match", [
    (dict(scales={"img_backbone.nope.x_scale": 0.1}), "names no tensor and no convolution"),
    (dict(scales={"img_backbone.conv1.x_scale": -1.0}), "must be a positive number"),
    (dict(scales={"img_backbone.conv1.x_scale": [0.1, 0.2]}), "is an activation"),
    (dict(scales={"img_backbone.conv1.w_scale": [0.1, 0.2]}), "without per_channel"),
    (dict(scales={"img_backbone.conv1.w_scale": [0.1, 0.2]}, per_channel=True), "64 output"),
    (dict(scales="missing.json"), "no such file"),
    (dict(format="qoperatr"), "format must be one of"),
    (dict(input_name="image"), "no input 'image'"),
])
def test_bad_arguments_raise_quantize_error(flow, samples, tmp_path, kwargs, match):
    with pytest.raises(QuantizeError, match=match):
        bevir.flows.quantize_backbone(flow.fp32_onnx, samples[:1], tmp_path, progress=False, **kwargs)
    assert not (tmp_path / "backbone_int8.onnx").exists() or kwargs.get("input_name") is None


def test_bad_files_raise_quantize_error(flow, tmp_path):
    bad = tmp_path / "calib.safetensors"
    bad.write_bytes(b"\x00" * 16)
    with pytest.raises(QuantizeError, match="cannot read calibration inputs"):
        bevir.flows.quantize_backbone(flow.fp32_onnx, bad, tmp_path, progress=False)
    wrong = tmp_path / "wrong.safetensors"
    save_file({"img": np.zeros((3, 64, 96), np.float32)}, str(wrong))
    with pytest.raises(QuantizeError, match="has rank 4"):
        bevir.flows.quantize_backbone(flow.fp32_onnx, wrong, tmp_path, progress=False)
    truncated = tmp_path / "cut.onnx"
    truncated.write_bytes(flow.fp32_onnx.read_bytes()[:1000])
    with pytest.raises(bevir.BevirError):
        bevir.flows.quantize_backbone(truncated, wrong, tmp_path, progress=False)


def test_cli_quantize_backbone_and_import(flow, samples, tmp_path, capsys):
    calib = tmp_path / "calib.safetensors"
    save_file({"img": np.stack(samples[:2])}, str(calib))
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"img_backbone.conv1.x_scale": 0.03125}))
    out = tmp_path / "out"
    assert main(["quantize-backbone", str(flow.fp32_onnx), "--calibration", str(calib),
                 "--scales", str(scales), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 forced" in text and "wrote" in text
    graph = bevir.load(out / "backbone_int8.bevir")
    assert any(n.op == "qlinear_conv" for n in graph.nodes)
    assert main(["import", str(out / "backbone_int8.onnx"), "-o", str(tmp_path / "m.bevir")]) == 0
    assert "nodes" in capsys.readouterr().out

    scales.write_text(json.dumps({"img_backbone.conv9.x_scale": 0.1}))
    assert main(["quantize-backbone", str(flow.fp32_onnx), "--calibration", str(calib),
                 "--scales", str(scales), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bevir: error:") and err.count("\n") == 1 and "conv9" in err
