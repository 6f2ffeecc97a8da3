"""INT8 for any CNN: small classifiers in the shape of the model zoo's CNNs (random weights,
untrained batch norms, a Linear head) and the CNNs of bevir.testing.zoo through
bevir.flows.quantize_backbone in both onnxruntime formats, per-tensor and per-channel,
imported bit for bit (ConvNeXt: its scalar GELU constants are quantized and fold at import);
the ops they need node by node against onnxruntime (the contrib ops, the float
GlobalAveragePool, the 8-bit Resize); and a failure inside onnxruntime's quantizer as one
line."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.numpy import save_file
from torch import nn

import bevir
from bevir.cli import main
from bevir.flows.backbone import QuantizeError, export_onnx, prepare_for_quantizer
from bevir.ir.types import DType
from bevir.testing.zoo import build

SHAPE = (1, 3, 64, 64)


# ---- the models ---------------------------------------------------------------------------
def cbn(cin: int, cout: int, k: int = 3, s: int = 1, groups: int = 1, act=nn.ReLU) -> nn.Module:
    """Conv + untrained BatchNorm (+ activation): zero biases after folding."""
    layers = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class AvgPoolNet(nn.Module):
    """Average pools with padding, ceil_mode and count_include_pad (QLinearAveragePool)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            cbn(3, 8, 3, 2), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
            cbn(8, 8), nn.AvgPool2d(3, 2, 1, ceil_mode=True), cbn(8, 16), nn.AvgPool2d(2))
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return AvgPoolNet().eval() if name == "avgpool" else build(name, untrained_norms=True)[0]


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]


# ---- the zoo through the flow -------------------------------------------------------------
ZOO_CNNS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "squeezenet1_1",
            "shufflenet_v2", "regnet_y_400mf", "convnext_tiny", "deeplabv3_mobilenet_v3")


@pytest.mark.parametrize("format", ["qoperator", "qdq"])
@pytest.mark.parametrize("name", ZOO_CNNS)
def test_zoo_cnn_int8_is_bit_exact(name, format, tmp_path):
    """Every CNN of the zoo through quantize_backbone: per-tensor weights with BatchNorm
    statistics like a trained model's, per-channel weights with untrained BatchNorm (whose
    zero biases the exporter shares, the quantizer's old crash); 0 differing elements
    against onnxruntime on an input outside the calibration data. QDQ with uint8
    activations: with int8 ones onnxruntime runs some convolutions in float (see
    docs/numerics.md, known deviations)."""
    rng = np.random.default_rng(1)
    activations = "int8" if format == "qoperator" else "uint8"
    for per_channel in (False, True):
        model, example = build(name, size="small", seed=0, untrained_norms=per_channel)
        calib = [rng.standard_normal(tuple(example.shape)).astype(np.float32) for _ in range(2)]
        qb = bevir.flows.quantize_backbone(model, calib, tmp_path / str(per_channel),
                                           format=format, per_channel=per_channel,
                                           activation_type=activations, progress=False)
        assert not any(n.op == "conv2d" for n in qb.graph.nodes)    # every conv integer
        if name not in ("squeezenet1_1", "deeplabv3_mobilenet_v3"):  # a Linear classifier
            ops = {n.op_type for n in onnx.load(str(qb.int8_onnx)).graph.node}
            assert ("QGemm" if format == "qoperator" else "Gemm") in ops
        assert qb.mismatches(example.numpy() * 2) == {"feats": 0}, (name, format, per_channel)


def test_untrained_batch_norm_biases_are_given_their_own(images, tmp_path):
    path = export_onnx(_model("resnet18"), images[0], tmp_path / "r.onnx")
    proto = onnx.load(str(path))
    # the exporter shares the folded zero biases through Identity nodes: the quantizer's crash
    assert any(n.op_type == "Identity" for n in proto.graph.node)
    prepared = prepare_for_quantizer(proto)
    inits = {t.name for t in prepared.graph.initializer}
    reads = [i for n in prepared.graph.node for i in n.input if i in inits]
    assert all(n.op_type != "Identity" for n in prepared.graph.node)
    assert len(reads) == len(set(reads))                 # each initializer read once
    assert [n.name for n in prepared.graph.node] == \
        [n.name for n in proto.graph.node if n.op_type != "Identity"]
    assert prepared.graph.value_info                     # shapes inferred


@pytest.mark.parametrize("format", ["qoperator", "qdq"])
def test_qlinear_average_pool_is_bit_exact(format, images, tmp_path):
    qb = bevir.flows.quantize_backbone(_model("avgpool"), images[:2], tmp_path, format=format,
                                       progress=False)
    assert sum(n.op == "qlinear_avgpool" for n in qb.graph.nodes) == 3   # QDQ: fold-qdq's
    assert qb.mismatches(images[2]) == {"feats": 0}


# ---- the contrib ops node by node ----------------------------------------------------------
_MS = "com.microsoft"


def _differing(node, x: np.ndarray, inits: dict, optimize: bool = True) -> int:
    """bevir against onnxruntime on a one-node model (ONNX or com.microsoft) with input x;
    ``optimize=False``: onnxruntime runs the node's own kernel (no graph optimizations)."""
    t = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    g = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", t, list(x.shape))],
        [onnx.helper.make_tensor_value_info("y", t, None)],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                     onnx.helper.make_opsetid(_MS, 1)])
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), so,
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = bevir.run(bevir.from_onnx(model), {"x": x})["y"]
    return int(np.count_nonzero(got != ref)) if got.shape == ref.shape else got.size


def _codes(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("a_type,b_type", [(np.int8, np.int8), (np.uint8, np.int8),
                                           (np.uint8, np.uint8)])
def test_qgemm_is_bit_exact(a_type, b_type):
    rng = np.random.default_rng(0)
    m, k, n = 3, 37, 11
    for trans_b, per_column, bias in itertools.product((0, 1), (False, True),
                                                      (None, (n,), (1, n))):
        cols = n if per_column else ()
        inits = {"a_s": np.float32(0.031), "a_z": _codes(rng, a_type, ()) // 4,
                 "b": _codes(rng, b_type, (n, k) if trans_b else (k, n)),
                 "b_s": rng.uniform(0.001, 0.01, cols).astype(np.float32),
                 "b_z": _codes(rng, b_type, cols) // 4, "y_s": np.float32(0.27),
                 "y_z": _codes(rng, a_type, ()) // 4}
        if bias:
            inits["c"] = rng.integers(-5000, 5000, bias).astype(np.int32)
        node = onnx.helper.make_node(
            "QGemm", ["x", "a_s", "a_z", "b", "b_s", "b_z", "c" if bias else "", "y_s", "y_z"],
            ["y"], domain=_MS, transB=trans_b)
        assert _differing(node, _codes(rng, a_type, (m, k)), inits) == 0, (trans_b, bias)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_average_pool_node_is_bit_exact(dtype):
    rng = np.random.default_rng(0)
    cases = [((2, 2), (2, 2), (0, 0, 0, 0), 0, 0, 7), ((3, 3), (2, 2), (1, 1, 1, 1), 0, 1, 9),
             ((3, 3), (2, 2), (1, 1, 1, 1), 1, 0, 10), ((3, 3), (2, 2), (1, 1, 1, 1), 1, 1, 10),
             ((3, 2), (1, 2), (1, 0, 1, 1), 1, 0, 11), ((6, 6), (1, 1), (0, 0, 0, 0), 0, 0, 6)]
    for kernel, strides, pads, ceil_mode, include_pad, size in cases:
        inits = {"x_s": np.float32(0.037), "x_z": dtype(3), "y_s": np.float32(0.0213),
                 "y_z": dtype(-2 if dtype is np.int8 else 120)}
        node = onnx.helper.make_node(
            "QLinearAveragePool", ["x", "x_s", "x_z", "y_s", "y_z"], ["y"], domain=_MS,
            kernel_shape=kernel, strides=strides, pads=pads, ceil_mode=ceil_mode,
            count_include_pad=include_pad)
        x = _codes(rng, dtype, (2, 5, size, size))
        assert _differing(node, x, inits) == 0, (kernel, pads, ceil_mode, include_pad)


# ---- float GlobalAveragePool and 8-bit Resize as onnxruntime computes them ------------------
def test_global_average_pool_sums_as_onnxruntime():
    # the GlobalAveragePool kernel itself: onnxruntime's NCHWc optimizer replaces it (with a
    # plain sequential sum) for a graph input whose channels are a multiple of its block
    rng = np.random.default_rng(0)
    node = onnx.helper.make_node("GlobalAveragePool", ["x"], ["y"])
    for shape in [(2, 3, 1, 1), (2, 5, 2, 3), (1, 13, 7, 7), (2, 100, 13, 13), (1, 6, 56, 56),
                  (2, 6, 11), (1, 3, 2, 3, 5)]:
        x = (rng.standard_normal(shape) * 10).astype(np.float32)
        assert _differing(node, x, {}, optimize=False) == 0, shape
    # and in NHWC: the same sums, for each S % 4 (no 4-lane body at all for S = 1..3)
    for shape in [(2, 7, 5, 24), (1, 4, 4, 8), (2, 3, 3, 5), (1, 2, 3, 6), (1, 3, 1, 3),
                  (1, 2, 1, 1)]:
        x = (rng.standard_normal(shape) * 10).astype(np.float32)
        ys = []
        for layout, a in ((bevir.Layout.nchw, x), (bevir.Layout.nhwc, x.transpose(0, 2, 3, 1))):
            g = bevir.Graph()
            g.set_output("y", g.create_node("global_avgpool", [g.add_input(
                "x", bevir.TensorType.of(np.ascontiguousarray(a), layout))]).output)
            ys.append(bevir.run(g, {"x": np.ascontiguousarray(a)})["y"].reshape(shape[:2]))
        assert ys[0].tobytes() == ys[1].tobytes(), shape
        assert _differing(node, x, {}, optimize=False) == 0, shape


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_8bit_resize_is_bit_exact(dtype):
    # linear on channels-last tensors: onnxruntime's integer kernel runs there (its NHWC
    # transformer moves a Resize between quantized convolutions there too)
    rng = np.random.default_rng(0)
    cases = [("linear", "half_pixel", "round_prefer_floor", (2, 3, 5, 4), (2, 8, 11, 4)),
             ("linear", "pytorch_half_pixel", "round_prefer_floor", (1, 7, 7, 3), (1, 64, 64, 3)),
             ("linear", "align_corners", "round_prefer_floor", (1, 8, 8, 2), (1, 5, 3, 2)),
             ("linear", "asymmetric", "round_prefer_floor", (1, 3, 3, 5), (1, 2.5, 1.7, 1)),
             ("linear", "half_pixel", "round_prefer_floor", (1, 1, 1, 6), (1, 4, 4, 6)),
             ("nearest", "half_pixel", "round_prefer_floor", (2, 3, 5, 4), (2, 3, 9, 7)),
             ("nearest", "asymmetric", "floor", (2, 3, 4, 4), (2, 3, 8, 8)),
             ("nearest", "align_corners", "round_prefer_ceil", (1, 2, 6, 5), (1, 2, 3, 11))]
    for mode, ct, nearest, shape, out in cases:
        scales = any(isinstance(o, float) for o in out)
        inits = {"scales": np.float32(out)} if scales else {"sizes": np.int64(out)}
        node = onnx.helper.make_node("Resize", ["x", "", *(["scales"] if scales else
                                                          ["", "sizes"])], ["y"], mode=mode,
                                     coordinate_transformation_mode=ct, nearest_mode=nearest)
        assert _differing(node, _codes(rng, dtype, shape), inits) == 0, (mode, ct, shape)


def test_float_bilinear_resize_is_bit_exact():
    """float32 linear resize over two axes: onnxruntime's UpsampleBilinear, bit for bit."""
    rng = np.random.default_rng(1)
    for ct in ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"):
        for shape, out in [((2, 3, 5, 4), (2, 3, 11, 9)), ((1, 4, 7, 7), (1, 4, 64, 64)),
                           ((1, 2, 8, 8), (1, 2, 5, 3)), ((6, 5), (13, 2)),
                           ((1, 3, 3, 5), (1, 1, 2.5, 1.7))]:
            scales = any(isinstance(o, float) for o in out)
            inits = {"scales": np.float32(out)} if scales else {"sizes": np.int64(out)}
            node = onnx.helper.make_node("Resize", ["x", "", *(["scales"] if scales else
                                                              ["", "sizes"])], ["y"],
                                         mode="linear", coordinate_transformation_mode=ct)
            x = (rng.standard_normal(shape) * 10).astype(np.float32)
            if not (scales and ct == "align_corners"):    # there bevir follows ONNX
                assert _differing(node, x, inits) == 0, (ct, shape, out)


def test_8bit_linear_resize_runs_on_the_codes():
    g = bevir.Graph()
    x = g.add_input("x", bevir.TensorType((1, 2, 3, 4), DType.i8))
    g.set_output("y", g.create_node("resize", [x], {"size": (1, 2, 6, 8),
                                                      "mode": "linear"}).output)
    y = bevir.run(g, {"x": np.arange(-12, 12, dtype=np.int8).reshape(1, 2, 3, 4)})["y"]
    assert y.dtype == np.int8 and y.min() == -12 and y.max() == 11
    with pytest.raises(bevir.VerifyError, match="at most 2"):   # onnxruntime: bilinear only
        g.create_node("resize", [x], {"size": (1, 4, 6, 8), "mode": "linear"})


# ---- a failure inside onnxruntime's quantizer ---------------------------------------------
def test_quantizer_failure_is_one_quantize_error(images, tmp_path):
    path = export_onnx(_model("resnet18"), images[0], tmp_path / "r.onnx")
    small = [x[..., :32, :32] for x in images[:2]]     # not the model's input shape
    with pytest.raises(QuantizeError) as e:
        bevir.flows.quantize_backbone(path, small, tmp_path, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "onnxruntime's quantize_static failed" in msg
    assert "InvalidArgument" in msg and "Got invalid dimensions" in msg


def test_cli_quantizer_failure_is_one_line(images, tmp_path, monkeypatch, capsys):
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer

    def crash(self):
        raise AttributeError("'NoneType' object has no attribute 'data_type'")
    monkeypatch.setattr(ONNXQuantizer, "quantize_model", crash)
    path = export_onnx(_model("resnet18"), images[0], tmp_path / "r.onnx")
    save_file({"img": np.stack(images[:2])}, str(tmp_path / "calib.safetensors"))
    rc = main(["quantize-backbone", str(path), "--calibration", str(tmp_path / "calib.safetensors"),
               "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "Traceback" not in err[0]
    assert err[0].startswith("bevir: error: quantizing ") and "quantize_static failed in crash" \
        in err[0] and "AttributeError: 'NoneType' object has no attribute 'data_type'" in err[0]
