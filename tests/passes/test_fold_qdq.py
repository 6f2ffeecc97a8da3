"""QDQ-format quantized ONNX import: fold-qdq against onnxruntime, bit for bit.

onnxruntime runs with its default SessionOptions (ORT_ENABLE_ALL). What it fuses is read
from its optimized model (SessionOptions.optimized_model_filepath) and compared with what
fold-qdq folded; outputs are compared with np.array_equal (zero differing elements).
"""
from __future__ import annotations

import logging
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import bevir
from bevir.errors import BevirError, PassError
from bevir.ir.types import DType
from bevir.passes import PassManager, Statistics, parse_pipeline
from bevir.passes.patterns import explain

_INT8_ALLOWED = "session.qdqisint8allowed"      # onnxruntime's session config key


# ---- onnxruntime and comparison helpers --------------------------------------------------
def _session(model: onnx.ModelProto, int8_allowed: bool = False, optimized: str | None = None):
    so = ort.SessionOptions()
    if int8_allowed:
        so.add_session_config_entry(_INT8_ALLOWED, "1")
    if optimized:
        so.optimized_model_filepath = optimized
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])


# onnxruntime's ops in its optimized model -> the bevir op computing the same
_ORT_TO_BEVIR = {
    "QLinearConv": "qlinear_conv", "QGemm": "qlinear_conv", "QLinearMatMul": "qlinear_matmul",
    "MatMulIntegerToFloat": "matmul_integer", "QLinearAdd": "qlinear_add",
    "QLinearMul": "qlinear_mul", "QLinearConcat": "qlinear_concat",
    "QLinearGlobalAveragePool": "qlinear_global_avgpool", "QLinearSigmoid": "qlinear_sigmoid",
    "QLinearLeakyRelu": "qlinear_leaky_relu", "Conv": "conv2d", "FusedConv": "conv2d",
    "MatMul": "matmul", "Gemm": "gemm", "Add": "add", "Mul": "mul", "Concat": "concat",
    "GlobalAveragePool": "global_avgpool", "Sigmoid": "sigmoid", "LeakyRelu": "where",
    "MaxPool": "maxpool2d", "NhwcMaxPool": "maxpool2d", "Relu": "relu",
    "QLinearAveragePool": "qlinear_avgpool", "AveragePool": "avgpool2d", "Resize": "resize",
}


def _ort_ops(model: onnx.ModelProto, tmp_path, int8_allowed: bool = False) -> Counter:
    """The compute ops of onnxruntime's optimized model, named as bevir's."""
    path = str(tmp_path / "ort_optimized.onnx")
    _session(model, int8_allowed, optimized=path)
    return Counter(_ORT_TO_BEVIR[n.op_type] for n in onnx.load(path).graph.node
                   if n.op_type in _ORT_TO_BEVIR)


def _bevir_ops(graph: bevir.Graph) -> Counter:
    """The compute ops of a bevir graph (MatMulIntegerToFloat's scaling mul not counted)."""
    def scaling(n):
        src = n.inputs[0].producer
        return n.op == "mul" and src is not None and src.op == "cast" \
            and src.inputs[0].producer is not None \
            and src.inputs[0].producer.op == "matmul_integer"
    wanted = set(_ORT_TO_BEVIR.values())
    return Counter(n.op for n in graph.nodes if n.op in wanted and not scaling(n))


def _import(model: onnx.ModelProto, int8_allowed: bool = False) -> bevir.Graph:
    if not int8_allowed:
        graph = bevir.from_onnx(model)
    else:
        graph = bevir.from_onnx(model, fold_qdq=False)
        bevir.optimize(graph, "fold-qdq{int8_allowed=true}")
    bevir.verify(graph)
    return graph


def _assert_bit_exact(model, feeds_list, graph=None, int8_allowed=False) -> int:
    """bevir's golden model equals onnxruntime on every output; returns elements compared."""
    graph = graph or _import(model, int8_allowed)
    sess = _session(model, int8_allowed)
    names = [o.name for o in sess.get_outputs()]
    compared = 0
    for feeds in feeds_list:
        got = bevir.run(graph, feeds)
        for name, ref in zip(names, sess.run(None, feeds)):
            g = np.asarray(got[name])
            assert g.dtype == ref.dtype and g.shape == ref.shape, (name, g.dtype, g.shape)
            assert np.array_equal(g, ref), f"{name}: {int(np.sum(g != ref))} of {ref.size} differ"
            compared += ref.size
    return compared


def _assert_folds_as_onnxruntime(model, tmp_path, int8_allowed=False) -> bevir.Graph:
    graph = _import(model, int8_allowed)
    assert _bevir_ops(graph) == _ort_ops(model, tmp_path, int8_allowed)
    return graph


def _producers(graph: bevir.Graph, op: str) -> list[list[str | None]]:
    """For each node of ``op``: the ops producing its present operands (None: no node)."""
    return [[None if v.producer is None else v.producer.op for v in n.inputs if v is not None]
            for n in graph.nodes if n.op == op]


# ---- hand-built QDQ models ---------------------------------------------------------------
def _c(name, value, dtype=None):
    return nh.from_array(np.asarray(value, dtype), name)


class QDQ:
    """A small QDQ model under construction: float inputs, Q/DQ pairs, float ops."""

    def __init__(self, rng: np.random.Generator, dtype=np.uint8):
        self.rng, self.dtype = rng, dtype
        self.nodes, self.inits, self.inputs, self.feeds = [], [], [], {}
        self.scales: dict[str, np.ndarray] = {}       # dequantized value -> its scale
        self.k = 0

    def fresh(self, hint: str) -> str:
        self.k += 1
        return f"{hint}{self.k}"

    def input(self, shape, scale=3.0) -> str:
        name = self.fresh("in")
        self.inputs.append(oh.make_tensor_value_info(name, TP.FLOAT, list(shape)))
        self.feeds[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def params(self, scale=None, zp=None, dtype=None, axis_len=None) -> tuple[str, str]:
        dtype = dtype or self.dtype
        info = np.iinfo(dtype)
        shape = () if axis_len is None else (axis_len,)
        s = self.rng.uniform(0.01, 0.05, shape) if scale is None else scale
        z = self.rng.integers(info.min // 4, info.max // 4 + 1, shape) if zp is None else zp
        sn, zn = self.fresh("s"), self.fresh("z")
        self.inits += [_c(sn, np.asarray(s, np.float32)), _c(zn, z, dtype)]
        self.scales[sn] = np.asarray(s, np.float32)
        return sn, zn

    def node(self, op_type, inputs, name=None, domain="", **attrs) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(oh.make_node(op_type, inputs, [out], name=name or out, domain=domain,
                                       **attrs))
        return out

    def dequantize(self, x, params, axis=None, name=None) -> str:
        ax = {} if axis is None else {"axis": axis}
        out = self.node("DequantizeLinear", [x, *params], name=name, **ax)
        self.scales[out] = self.scales[params[0]]
        return out

    def qdq(self, x, params=None, axis=None, name=None) -> str:
        """x -> QuantizeLinear -> DequantizeLinear with the same parameters."""
        params = params or self.params()
        ax = {} if axis is None else {"axis": axis}
        q = self.node("QuantizeLinear", [x, *params], name=name and f"{name}_q", **ax)
        return self.dequantize(q, params, axis, name)

    def weight(self, shape, per_channel_axis=None, dtype=np.int8, name=None) -> str:
        """A constant integer tensor and its DequantizeLinear (per tensor or per axis)."""
        info = np.iinfo(dtype)
        wn = self.fresh("w")
        self.inits.append(_c(wn, self.rng.integers(info.min, info.max + 1, shape), dtype))
        n = None if per_channel_axis is None else shape[per_channel_axis]
        p = self.params(zp=np.zeros(() if n is None else (n,)) if dtype == np.int8 else None,
                        dtype=dtype, axis_len=n,
                        scale=self.rng.uniform(0.002, 0.02, () if n is None else (n,)))
        return self.dequantize(wn, p, per_channel_axis, name)

    def bias(self, n: int, x: str, w: str, factor: float = 1.0) -> str:
        """An int32 bias dequantized with scale x_scale * w_scale (times ``factor``)."""
        scale = self.scales[x] * self.scales[w] * np.float32(factor)
        bn, zn = self.fresh("b"), self.fresh("bz")
        self.inits += [_c(bn, self.rng.integers(-3000, 3000, n), np.int32),
                       _c(zn, np.zeros(scale.shape), np.int32)]
        self.scales[sn := self.fresh("bs")] = scale
        self.inits.append(_c(sn, scale))
        return self.dequantize(bn, (sn, zn), 0 if scale.ndim else None)

    def model(self, *outputs, opset=17) -> onnx.ModelProto:
        outs = [oh.make_empty_tensor_value_info(o) for o in outputs]
        g = oh.make_graph(self.nodes, "qdq", self.inputs, outs, self.inits)
        m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
        m.ir_version = 8
        return m

    def more_feeds(self, n: int) -> list[dict]:
        """n random feeds like the first."""
        return [self.feeds] + [{k: (self.rng.standard_normal(v.shape) * 3).astype(np.float32)
                                for k, v in self.feeds.items()} for _ in range(n - 1)]


def _conv_model(rng, dtype, per_channel, bias=True, out_dtype=None):
    b = QDQ(rng, dtype)
    x = b.qdq(b.input((2, 4, 9, 9)))
    w = b.weight((8, 4, 3, 3), 0 if per_channel else None)
    ins = [x, w] + ([b.bias(8, x, w)] if bias else [])
    y = b.node("Conv", ins, pads=[1, 1, 1, 1], strides=[2, 1])
    y = b.qdq(y, b.params(dtype=out_dtype or dtype))
    return b, b.model(y)


# ---- (a) each fold, against onnxruntime --------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv_folds_to_qlinear_conv(dtype, per_channel, bias, tmp_path):
    """An int8 Q/DQ pair read by one consumer becomes uint8 (onnxruntime on x86-64), so
    the int8 model folds too, with uint8 activations."""
    b, m = _conv_model(np.random.default_rng(1), dtype, per_channel, bias)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    (conv,) = [n for n in g.nodes if n.op == "qlinear_conv"]
    assert conv.inputs[0].type.dtype is DType.u8 and conv.inputs[1].type.dtype is DType.i8
    assert (conv.inputs[2] is not None) == bias and "conv2d" not in g.op_counts()
    assert conv.inputs[1].type.quant.axis == (0 if per_channel else None)
    assert _assert_bit_exact(m, b.more_feeds(3), g) == 3 * 2 * 8 * 5 * 9


def test_int8_conv_stays_float_on_x86_and_folds_with_int8_allowed(tmp_path):
    """The int8 input pair has two consumers (the conv and a graph output), so it stays
    int8; onnxruntime on x86-64 then keeps the conv in float, with int8_allowed it folds.
    A 1x1 convolution of one channel computes one product per element, exactly in float."""
    b = QDQ(np.random.default_rng(2), np.int8)
    x = b.qdq(b.input((2, 1, 5, 6)))
    y = b.qdq(b.node("Conv", [x, b.weight((3, 1, 1, 1))]))
    m = b.model(y, x)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert _producers(g, "conv2d") == [["dequantize", "dequantize"]]
    _assert_bit_exact(m, b.more_feeds(3), g)
    g8 = _assert_folds_as_onnxruntime(m, tmp_path, int8_allowed=True)
    (conv,) = [n for n in g8.nodes if n.op == "qlinear_conv"]
    assert conv.inputs[0].type.dtype is DType.i8
    _assert_bit_exact(m, b.more_feeds(3), g8, int8_allowed=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("per_column", [False, True], ids=["tensor", "column"])
def test_matmul_folds_to_qlinear_matmul(dtype, per_column, tmp_path):
    b = QDQ(np.random.default_rng(3), dtype)
    a = b.qdq(b.input((2, 5, 16)))
    y = b.qdq(b.node("MatMul", [a, b.weight((16, 10), 1 if per_column else None)]))
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert g.op_counts()["qlinear_matmul"] == 1
    _assert_bit_exact(m, b.more_feeds(3), g)


@pytest.mark.parametrize("per_column", [False, True], ids=["tensor", "column"])
def test_matmul_without_quantize_folds_to_integer_product_times_scale(per_column, tmp_path):
    """DQ -> MatMul with a float result: onnxruntime's MatMulIntegerToFloat."""
    b = QDQ(np.random.default_rng(4))
    a = b.qdq(b.input((3, 32)))
    y = b.node("MatMul", [a, b.weight((32, 7), 1 if per_column else None)])
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert [n.op for n in g.nodes] == ["quantize", "matmul_integer", "cast", "mul"]
    _assert_bit_exact(m, b.more_feeds(3), g)


@pytest.mark.parametrize("trans_b", [True, False], ids=["transB", "noTransB"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_gemm_folds_to_qgemm(trans_b, per_channel, dtype, tmp_path):
    """Gemm -> QGemm, computed as a 1x1 qlinear_conv between reshapes."""
    b = QDQ(np.random.default_rng(5), dtype)
    a = b.qdq(b.input((3, 24)))
    shape, axis = ((10, 24), 0) if trans_b else ((24, 10), 1)
    w = b.weight(shape, axis if per_channel else None)
    y = b.qdq(b.node("Gemm", [a, w, b.bias(10, a, w)], transB=int(trans_b)))
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert [n.op for n in g.nodes] == ["quantize", "reshape", "qlinear_conv", "reshape",
                                       "dequantize"]
    assert g.nodes[2].loc == m.graph.node[-3].name       # the Gemm's name
    _assert_bit_exact(m, b.more_feeds(4), g)


@pytest.mark.parametrize("op_type", ["Add", "Mul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
@pytest.mark.parametrize("b_shape", [(2, 6, 5, 7), (1, 6, 1, 1)], ids=["same", "bcast"])
def test_add_mul_fold(op_type, dtype, b_shape, tmp_path):
    b = QDQ(np.random.default_rng(6), dtype)
    x = b.qdq(b.input((2, 6, 5, 7)))
    z = b.qdq(b.input(b_shape))
    y = b.qdq(b.node(op_type, [x, z]), b.params(scale=0.1))
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert g.op_counts()[f"qlinear_{op_type.lower()}"] == 1
    _assert_bit_exact(m, b.more_feeds(3), g)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_concat_folds_to_qlinear_concat(dtype, tmp_path):
    b = QDQ(np.random.default_rng(7), dtype)
    shared = b.params()
    xs = [b.qdq(b.input((2, c, 4, 5)), shared if c == 2 else None) for c in (2, 3, 1)]
    y = b.qdq(b.node("Concat", xs, axis=1), shared)
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert g.op_counts()["qlinear_concat"] == 1
    _assert_bit_exact(m, b.more_feeds(3), g)


@pytest.mark.parametrize("op_type,attrs,fused", [
    ("GlobalAveragePool", {}, "qlinear_global_avgpool"),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                     "ceil_mode": 1}, "qlinear_avgpool"),
    ("AveragePool", {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 1],
                     "count_include_pad": 1}, "qlinear_avgpool"),
    ("Sigmoid", {}, "qlinear_sigmoid"),
    ("LeakyRelu", {"alpha": 0.1}, "qlinear_leaky_relu")])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_unary_folds(op_type, attrs, fused, dtype, tmp_path):
    b = QDQ(np.random.default_rng(8), dtype)
    x = b.qdq(b.input((2, 8, 7, 9)))
    y = b.qdq(b.node(op_type, [x], **attrs), b.params(scale=0.004))
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert [n.op for n in g.nodes] == ["quantize", fused, "dequantize"]
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_average_pool_over_the_whole_image_folds_to_qlinear_global_avgpool():
    # onnxruntime's QLinearAveragePool computes such a window as QLinearGlobalAveragePool
    b = QDQ(np.random.default_rng(8), np.uint8)
    x = b.qdq(b.input((2, 8, 7, 9)))
    m = b.model(b.qdq(b.node("AveragePool", [x], kernel_shape=[7, 9]), b.params(scale=0.004)))
    g = _import(m)
    assert [n.op for n in g.nodes] == ["quantize", "qlinear_global_avgpool", "dequantize"]
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_linear_resize_keeps_its_qdq_as_in_onnxruntime(tmp_path):
    b = QDQ(np.random.default_rng(9), np.uint8)
    p = b.params()
    b.inits.append(_c("sizes", np.int64([2, 4, 9, 11])))
    x = b.qdq(b.input((2, 4, 6, 6)), p)
    m = b.model(b.qdq(b.node("Resize", [x, "", "", "sizes"], mode="linear"), p))
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert [n.inputs[0].type.dtype for n in g.nodes if n.op == "resize"] == [DType.f32]


@pytest.mark.parametrize("op_type,attrs,extra", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, []),
    ("Resize", {"mode": "nearest"}, ["", "", "sizes"]),
    ("Transpose", {"perm": [0, 2, 3, 1]}, []),
    ("Flatten", {"axis": 1}, []),
    ("Reshape", {}, ["shape"]),
    ("Unsqueeze", {}, ["axes"])])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_data_movement_runs_on_the_integers(op_type, attrs, extra, dtype, tmp_path):
    b = QDQ(np.random.default_rng(9), dtype)
    p = b.params()
    x = b.qdq(b.input((2, 4, 6, 6)), p)
    consts = {"shape": np.int64([2, 24, 6]), "axes": np.int64([1]),
              "sizes": np.int64([2, 4, 9, 13])}
    for e in filter(None, extra):
        b.inits.append(_c(e, consts[e]))
    y = b.qdq(b.node(op_type, [x] + extra, **attrs), p)
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    moved = [n for n in g.nodes if n.op not in ("quantize", "dequantize")]
    assert len(moved) == 1 and moved[0].inputs[0].type.dtype is DType.u8
    assert [n.op for n in g.nodes].count("dequantize") == 1
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_relu_before_a_saturating_quantize_is_dropped(tmp_path):
    """Relu -> Q with zero point 0 (uint8): ReluQuantFusion drops the relu; the conv then
    folds. A relu before a zero point of 128 stays, between a dequantize and a quantize."""
    b = QDQ(np.random.default_rng(10))
    x = b.qdq(b.input((1, 3, 8, 8)))
    w = b.weight((4, 3, 3, 3))
    c = b.node("Conv", [x, w, b.bias(4, x, w)], pads=[1, 1, 1, 1])
    y = b.qdq(b.node("Relu", [c]), b.params(zp=0))
    z = b.qdq(b.node("Relu", [y]), b.params(zp=128))
    m = b.model(z)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert [n.op for n in g.nodes] == ["quantize", "qlinear_conv", "dequantize", "relu",
                                       "quantize", "dequantize"]
    _assert_bit_exact(m, b.more_feeds(3), g)
    stats = Statistics()
    PassManager("fold-qdq", instruments=[stats]).run(bevir.from_onnx(m, fold_qdq=False))
    assert stats.by_pass()["fold-qdq"]["relu-dropped"] == 1


def test_dedicated_pairs_of_one_tensor_merge_as_in_onnxruntime(tmp_path):
    """Two Q/DQ pairs of one int8 tensor (one per consumer) are one quantize after CSE,
    read by two dequantizes: the pair stays int8 and both int8 convs stay float."""
    b = QDQ(np.random.default_rng(11), np.int8)
    x, p = b.input((1, 1, 4, 4)), b.params()
    ys = [b.qdq(b.node("Conv", [b.qdq(x, p), b.weight((2, 1, 1, 1))])) for _ in range(2)]
    m = b.model(*ys)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert g.op_counts()["conv2d"] == 2 and g.op_counts().get("qlinear_conv", 0) == 0
    _assert_bit_exact(m, b.more_feeds(2), g)


# ---- (b) declined folds stay explicit and exact -------------------------------------------
def test_maxpool_with_other_output_params_stays_float(tmp_path):
    b = QDQ(np.random.default_rng(12))
    x = b.qdq(b.input((2, 3, 6, 6)))
    y = b.qdq(b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]))   # new params
    m = b.model(y)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert _producers(g, "maxpool2d") == [["dequantize"]]
    _assert_bit_exact(m, b.more_feeds(3), g)
    stats = Statistics()
    PassManager("fold-qdq", instruments=[stats]).run(bevir.from_onnx(m, fold_qdq=False))
    assert stats.by_pass()["fold-qdq"]["qdq-drop.declined"] == 1


def test_add_of_uint8_and_int8_stays_float(tmp_path):
    """QLinearAdd takes one dtype: an int8 operand kept int8 (its pair has a second
    consumer) next to a uint8 one declines the fold; the float add is exact."""
    b = QDQ(np.random.default_rng(13), np.int8)
    s8 = b.qdq(b.input((2, 3, 4, 4)))
    u8 = b.qdq(b.input((2, 3, 4, 4)), b.params(dtype=np.uint8))
    y = b.qdq(b.node("Add", [u8, s8]), b.params(dtype=np.uint8))
    m = b.model(y, s8)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert _producers(g, "add") == [["dequantize", "dequantize"]]
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_conv_with_another_output_dtype_stays_float(tmp_path):
    """A uint8 input and an int8 result (kept int8: the quantized value is a graph output)."""
    b = QDQ(np.random.default_rng(14))
    x = b.qdq(b.input((2, 1, 5, 5)))
    p = b.params(dtype=np.int8)
    q = b.node("QuantizeLinear", [b.node("Conv", [x, b.weight((2, 1, 1, 1))]), *p])
    m = b.model(b.dequantize(q, p), q)
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert _producers(g, "conv2d") == [["dequantize", "dequantize"]]
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_conv_whose_bias_scale_is_not_x_scale_times_w_scale_stays_float(tmp_path):
    """onnxruntime folds a conv bias only with a scale within 1% of x_scale * w_scale (per
    channel). The float conv left is not compared: its sums need not round as MLAS's."""
    for factor, folded in ((1.005, True), (1.5, False)):
        b = QDQ(np.random.default_rng(19))
        x = b.qdq(b.input((1, 4, 6, 6)))
        w = b.weight((8, 4, 3, 3), 0)
        m = b.model(b.qdq(b.node("Conv", [x, w, b.bias(8, x, w, factor)])))
        g = _assert_folds_as_onnxruntime(m, tmp_path)
        assert ("qlinear_conv" in g.op_counts()) == folded
    why = explain(bevir.from_onnx(m, fold_qdq=False), "qdq-conv")
    assert "declined: the bias scale is not x_scale * w_scale" in why


def test_add_of_an_int8_constant_stays_float(tmp_path):
    """onnxruntime turns the activation pair into uint8 but not the int8 constant, so the
    dtypes differ and the add stays float (exact: one float32 add)."""
    b = QDQ(np.random.default_rng(20), np.int8)
    x = b.qdq(b.input((2, 3, 4, 4)))
    b.inits.append(_c("cst", b.rng.integers(-128, 128, (1, 3, 1, 1)), np.int8))
    m = b.model(b.qdq(b.node("Add", [x, b.dequantize("cst", b.params())])))
    g = _assert_folds_as_onnxruntime(m, tmp_path)
    assert _producers(g, "add") == [["dequantize", "dequantize"]]
    _assert_bit_exact(m, b.more_feeds(3), g)


def test_fold_qdq_off_keeps_the_groups():
    _, m = _conv_model(np.random.default_rng(15), np.uint8, True)
    g = bevir.from_onnx(m, fold_qdq=False)
    assert _producers(g, "conv2d") == [["dequantize"] * 3]
    assert str(parse_pipeline("fold-qdq{int8_allowed=true}")[0]) == "fold-qdq{int8_allowed=true}"
    bevir.optimize(g, "fold-qdq")
    assert g.op_counts() == {"quantize": 1, "qlinear_conv": 1, "dequantize": 1}


# ---- (c) bad parameters ---------------------------------------------------------------------
def _per_channel_activation_model(rng, where: str) -> onnx.ModelProto:
    b = QDQ(rng)
    x = b.input((1, 4, 5, 5))
    if where == "input":
        x = b.qdq(x, b.params(axis_len=4), axis=1, name="x_dq")
    else:
        x = b.qdq(x)
    c = b.node("Conv", [x, b.weight((4, 4, 1, 1))])
    p = b.params(axis_len=4) if where == "output" else b.params()
    return b.model(b.qdq(c, p, axis=1, name="y_dq"))


@pytest.mark.parametrize("where,node", [("input", "x_dq"), ("output", "y_dq_q")])
def test_per_channel_activation_where_a_scalar_is_required_raises(where, node):
    """onnxruntime fuses the group into QLinearConv, which takes one x and y scale, and
    fails; bevir names the node."""
    m = _per_channel_activation_model(np.random.default_rng(16), where)
    with pytest.raises(PassError, match="must have one scale and zero point") as e:
        bevir.from_onnx(m)
    assert e.value.loc == node and e.value.op in ("dequantize", "quantize")
    feeds = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
             for i in m.graph.input}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="QLinearConv"):
        _session(m).run(None, feeds)        # onnxruntime fuses it and cannot run it


def test_weight_quantized_along_the_wrong_axis_raises():
    b = QDQ(np.random.default_rng(17))
    x = b.qdq(b.input((1, 4, 5, 5)))
    c = b.node("Conv", [x, b.weight((6, 4, 1, 1), per_channel_axis=1, name="w_dq")])
    with pytest.raises(PassError, match="axis 1") as e:
        bevir.from_onnx(b.model(b.qdq(c)))
    assert e.value.loc == "w_dq"


def test_inconsistent_quantize_and_dequantize_params_raise():
    b = QDQ(np.random.default_rng(18))
    x = b.input((4,))
    q = b.node("QuantizeLinear", [x, *b.params()])
    y = b.node("DequantizeLinear", [q, *b.params()], name="dq_other")
    with pytest.raises(BevirError, match="does not insert requantization") as e:
        bevir.from_onnx(b.model(y))
    assert e.value.node == "dq_other"


# ---- (d) ResNet-shaped torch models quantized by onnxruntime --------------------------------
_SHAPE = (2, 3, 32, 48)


@pytest.fixture(scope="module")
def float_resnet(tmp_path_factory):
    torch.manual_seed(0)
    nn = torch.nn

    def conv_bn(cin, cout, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, ch):
            super().__init__()
            self.a, self.b = conv_bn(ch, ch), conv_bn(ch, ch)

        def forward(self, x):
            return torch.relu(self.b(torch.relu(self.a(x))) + x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.pool = conv_bn(3, 16, 2), nn.MaxPool2d(3, 2, 1)
            self.block1, self.down, self.block2 = Block(16), conv_bn(16, 32, 2), Block(32)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.pool(torch.relu(self.stem(x)))
            x = self.block2(torch.relu(self.down(self.block1(x))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    net = Net().eval()
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    path = tmp_path_factory.mktemp("qdq_resnet") / "float.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.randn(*_SHAPE), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    return path


def _images(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(_SHAPE) * 1.2).astype(np.float32)


def _quantized(float_path, activation: str, per_channel: bool, symmetric: bool):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": _images(i)} for i in range(4)])

        def get_next(self):
            return next(self.it, None)

    out = float_path.with_name(f"qdq_{activation}_{per_channel}_{symmetric}.onnx")
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, weight_type=QuantType.QInt8,
                    activation_type={"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[activation],
                    extra_options={"ActivationSymmetric": symmetric})
    return onnx.load(str(out))


def _with_dequantized_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every dequantized activation becomes a graph output too, so that all are compared."""
    inits = {t.name for t in model.graph.initializer}
    have = {o.name for o in model.graph.output}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] not in inits and n.output[0] not in have:
            model.graph.output.append(oh.make_empty_tensor_value_info(n.output[0]))
            have.add(n.output[0])
    return model


_CONFIGS = [(pc, sym) for pc in (False, True) for sym in (False, True)]
_IDS = [f"{'channel' if pc else 'tensor'}-{'sym' if sym else 'asym'}" for pc, sym in _CONFIGS]


@pytest.mark.parametrize("per_channel,symmetric", _CONFIGS, ids=_IDS)
def test_uint8_resnet_folds_completely_and_is_bit_exact(float_resnet, per_channel, symmetric,
                                                        tmp_path):
    model = _with_dequantized_outputs(_quantized(float_resnet, "u8", per_channel, symmetric))
    graph = _assert_folds_as_onnxruntime(model, tmp_path)
    ops = graph.op_counts()
    assert ops["qlinear_conv"] == 7 and ops["qlinear_add"] == 2      # 6 convs and the head
    assert ops["qlinear_global_avgpool"] == 1 and "conv2d" not in ops and "gemm" not in ops
    assert _producers(graph, "maxpool2d") == [["quantize" if symmetric else "qlinear_conv"]]
    assert ops.get("relu", 0) == (6 if symmetric else 0)    # zero point 128: relu stays
    assert str(bevir.parse(str(graph))) == str(graph)
    compared = _assert_bit_exact(model, [{"x": _images(100 + i)} for i in range(3)], graph)
    assert compared > 100000


@pytest.mark.parametrize("per_channel,symmetric", _CONFIGS, ids=_IDS)
def test_int8_resnet_folds_as_onnxruntime(float_resnet, per_channel, symmetric, tmp_path):
    """Int8 activations on x86-64: pairs with one consumer become uint8 and fold; the convs
    reading a residual input (two consumers) stay int8 and float, in onnxruntime too (their
    float sums are not bit-exact to MLAS's, so only the structure is compared here). With
    int8 allowed (onnxruntime's session.qdqisint8allowed) everything folds, bit-exact."""
    model = _quantized(float_resnet, "s8", per_channel, symmetric)
    graph = _assert_folds_as_onnxruntime(model, tmp_path)
    assert graph.op_counts()["conv2d"] >= 2 and "gemm" not in graph.op_counts()
    int8 = _assert_folds_as_onnxruntime(model, tmp_path, int8_allowed=True)
    ops = int8.op_counts()
    assert ops["qlinear_conv"] == 7 and ops["qlinear_add"] == 2 and "conv2d" not in ops
    convs = [n for n in int8.nodes if n.op == "qlinear_conv"]
    assert {n.inputs[0].type.dtype for n in convs} == {DType.i8}
    compared = _assert_bit_exact(model, [{"x": _images(200 + i)} for i in range(3)], int8,
                                 int8_allowed=True)
    assert compared == 3 * 2 * 10
