"""Quantized ONNX import: the integer ops of bevir.ops.qlinear against onnxruntime, bit for bit.

Every comparison asks for zero differing elements (np.array_equal). onnxruntime runs with
graph optimizations disabled (ORT_DISABLE_ALL) so that it runs the very nodes of the model;
the ResNet-like flow checks the default optimization level as well.
"""
from __future__ import annotations

import warnings
import zlib
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import bevir
from bevir.errors import BevirError, UnsupportedError
from bevir.frontends.onnx import NonConstantInputError
from bevir.ir.types import AffineQuant, DType, TensorType
from bevir.ops import get_op
from bevir.ops import numerics
from bevir.ops.numerics import lookup_table, mlas_logistic
from tests.shared import check_node_case, freeze_input, onnx_array, onnx_node_cases

F32 = np.float32
_ET = {np.uint8: TP.UINT8, np.int8: TP.INT8}


def _model(nodes, inputs, outputs, inits, ms: bool = False, opset: int = 21):
    g = oh.make_graph(nodes, "g", inputs, outputs, inits)
    ops = [oh.make_opsetid("", opset)] + ([oh.make_opsetid("com.microsoft", 1)] if ms else [])
    m = oh.make_model(g, opset_imports=ops)
    m.ir_version = 10
    return m


def _ort(model, feeds, optimize: bool = False):
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _assert_bit_exact(model, feeds, optimize: bool = False):
    ref = _ort(model, feeds, optimize)
    got = bevir.run(bevir.from_onnx(model), feeds)
    for name, r in ref.items():
        g = np.asarray(got[name])
        assert g.dtype == r.dtype and g.shape == r.shape, (name, g.dtype, g.shape, r.dtype, r.shape)
        diff = int(np.sum(g != r))
        assert np.array_equal(g, r), f"{name}: {diff} of {r.size} elements differ"


def _ints(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _zp(rng, dtype, shape=()):
    info = np.iinfo(dtype)
    return rng.integers(info.min // 2, info.max // 2 + 1, shape).astype(dtype)


def _vi(name, et, shape):
    return oh.make_tensor_value_info(name, et, shape)


def _c(name, value, dtype=None):
    return nh.from_array(np.asarray(value, dtype), name)


# ---- (a) the onnx backend node tests of the quantized ops --------------------------------------
_NODE_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
             "MatMulInteger"}
_NODE_CASES = [
    c for c in onnx_node_cases() if {n.op_type for n in c.model.graph.node} & _NODE_OPS]


def test_node_cases_of_every_quantized_op_are_collected():
    names = " ".join(c.name for c in _NODE_CASES)
    for op in ("quantizelinear", "dequantizelinear", "qlinearconv", "qlinearmatmul",
               "convinteger", "matmulinteger"):
        assert f"test_{op}" in names


@pytest.mark.parametrize("case", _NODE_CASES, ids=[c.name for c in _NODE_CASES])
def test_node_case(case):
    """The backend case through the node-case runner (tests.shared.check_node_case: freezing of
    parameters passed as inputs into initializers; a skip gives the importer's reason:
    float8/int4/uint16 dtypes, float16 scales, blocked quantization)."""
    check_node_case(case)


_MUST_PASS = ["test_quantizelinear", "test_quantizelinear_axis", "test_dequantizelinear",
              "test_dequantizelinear_axis", "test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32",
              "test_qlinearmatmul_3D_int8_float32", "test_convinteger_with_padding",
              "test_convinteger_without_padding", "test_matmulinteger"]


@pytest.mark.parametrize("name", _MUST_PASS)
def test_node_case_imports(name):
    """These cases import (none may be skipped) and match."""
    case = next(c for c in _NODE_CASES if c.name == name)
    model = case.model
    inits = {t.name for t in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in inits]
    inputs, expected = case.data_sets[0]
    feeds = dict(zip(in_names, (np.asarray(a) for a in inputs)))
    while True:
        try:
            graph = bevir.from_onnx(model)
            break
        except NonConstantInputError as e:
            model = freeze_input(model, e.value_name, feeds.pop(e.value_name))
    got = bevir.run(graph, feeds)
    for o, ref in zip(model.graph.output, expected):
        ref = onnx_array(ref)
        np.testing.assert_array_equal(np.asarray(got[o.name]), ref)
        assert np.asarray(got[o.name]).dtype == ref.dtype


# ---- (b) hand-built models, bit-exact against onnxruntime ------------------------------------
def _qlinear_conv_model(rng, xdt, wdt, per_channel, groups=1, stride=1, pad=1, bias=True,
                        c=8, o=16, k=3, hw=12, dilation=1, n=2):
    xs, ys = np.float32(rng.uniform(0.01, 0.1)), np.float32(rng.uniform(0.05, 0.5))
    wshape = (o, c // groups, k, k)
    chans = o if per_channel else ()
    w = _ints(rng, wdt, wshape)
    ws = rng.uniform(0.001, 0.05, chans).astype(np.float32)
    wz = np.zeros(chans, wdt) if wdt == np.int8 else _zp(rng, wdt, chans) + 64
    inits = [_c("xs", xs), _c("xz", _zp(rng, xdt)), _c("w", w), _c("ws", ws), _c("wz", wz, wdt),
             _c("ys", ys), _c("yz", _zp(rng, xdt))]
    ins = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if bias:
        inits.append(_c("b", rng.integers(-20000, 20000, o).astype(np.int32)))
        ins.append("b")
    node = oh.make_node("QLinearConv", ins, ["y"], group=groups, strides=[stride, stride],
                        pads=[pad] * 4, dilations=[dilation, dilation])
    m = _model([node], [_vi("x", _ET[xdt], [n, c, hw, hw])], [_vi("y", _ET[xdt], None)], inits)
    return m, {"x": _ints(rng, xdt, (n, c, hw, hw))}


_CONV_CASES = {
    "u8s8_tensor": dict(xdt=np.uint8, wdt=np.int8, per_channel=False),
    "u8s8_channel": dict(xdt=np.uint8, wdt=np.int8, per_channel=True),
    "s8s8_channel": dict(xdt=np.int8, wdt=np.int8, per_channel=True),
    "s8s8_tensor_nobias": dict(xdt=np.int8, wdt=np.int8, per_channel=False, bias=False),
    "u8u8_tensor": dict(xdt=np.uint8, wdt=np.uint8, per_channel=False),
    "u8u8_channel": dict(xdt=np.uint8, wdt=np.uint8, per_channel=True),
    "stride2_groups2": dict(xdt=np.uint8, wdt=np.int8, per_channel=True, groups=2, stride=2),
    "depthwise": dict(xdt=np.uint8, wdt=np.int8, per_channel=True, groups=8, o=8),
    "depthwise_s8": dict(xdt=np.int8, wdt=np.int8, per_channel=False, groups=8, o=16),
    "pointwise_wide": dict(xdt=np.uint8, wdt=np.int8, per_channel=False, pad=0, k=1, c=64,
                           o=96, bias=False),
    "stem_5x5_pad2": dict(xdt=np.uint8, wdt=np.int8, per_channel=True, c=3, o=16, k=5, pad=2,
                          stride=2, hw=17),
    "dilated": dict(xdt=np.int8, wdt=np.int8, per_channel=True, dilation=2, pad=2),
    "deep_k": dict(xdt=np.uint8, wdt=np.int8, per_channel=True, c=256, o=32, hw=6, n=1),
}


@pytest.mark.parametrize("name", list(_CONV_CASES))
def test_qlinear_conv_bit_exact(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    for _ in range(2):
        _assert_bit_exact(*_qlinear_conv_model(rng, **_CONV_CASES[name]))


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape,per_column", [((16, 10), False), ((16, 10), True),
                                                ((2, 16, 10), False), ((16,), False)])
def test_qlinear_matmul_bit_exact(dt, b_shape, per_column):
    rng = np.random.default_rng(1)
    for _ in range(3):
        cols = b_shape[-1] if per_column else ()
        inits = [_c("sa", np.float32(rng.uniform(0.01, 0.1))), _c("za", _zp(rng, dt)),
                 _c("b", _ints(rng, dt, b_shape)),
                 _c("sb", rng.uniform(0.001, 0.02, cols).astype(np.float32)),
                 _c("zb", _zp(rng, dt, cols)), _c("sy", np.float32(rng.uniform(0.05, 0.3))),
                 _c("zy", _zp(rng, dt))]
        node = oh.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
        m = _model([node], [_vi("a", _ET[dt], [2, 7, 16])], [_vi("y", _ET[dt], None)], inits)
        _assert_bit_exact(m, {"a": _ints(rng, dt, (2, 7, 16))})


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape", [(2, 8, 5, 7), (1, 8, 1, 1), (2, 8, 5, 1), (7,), (1,)])
def test_qlinear_add_mul_bit_exact(op, dt, b_shape):
    """Random scales and zero points; broadcasting either way round (onnxruntime's kernel
    variant, a or b scalar per span, changes the float rounding)."""
    rng = np.random.default_rng(2)
    for _ in range(4):
        sa, sb, sc = rng.uniform(0.005, 0.2, 3).astype(np.float32)
        inits = [_c("sa", sa), _c("sb", sb), _c("sc", sc), _c("za", _zp(rng, dt)),
                 _c("zb", _zp(rng, dt)), _c("zc", _zp(rng, dt))]
        feeds = {"a": _ints(rng, dt, (2, 8, 5, 7)), "b": _ints(rng, dt, b_shape)}
        ins = [_vi("a", _ET[dt], [2, 8, 5, 7]), _vi("b", _ET[dt], list(b_shape))]
        for order in (["a", "sa", "za", "b", "sb", "zb"], ["b", "sb", "zb", "a", "sa", "za"]):
            node = oh.make_node(op, order + ["sc", "zc"], ["y"], domain="com.microsoft")
            _assert_bit_exact(_model([node], ins, [_vi("y", _ET[dt], None)], inits, ms=True),
                              feeds)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape", [(2, 64, 32, 33), (1, 64, 1, 1), (1,)])
def test_qlinear_add_mul_on_large_tensors_bit_exact(op, dt, b_shape):
    """Above TABLE_MIN results come from the table of all code pairs: still onnxruntime's."""
    from bevir.ops.qlinear import QLinearAdd
    shape = (2, 64, 32, 33)
    assert np.prod(shape) >= QLinearAdd.TABLE_MIN
    rng = np.random.default_rng(3)
    sa, sb, sc = rng.uniform(0.005, 0.2, 3).astype(np.float32)
    inits = [_c("sa", sa), _c("sb", sb), _c("sc", sc), _c("za", _zp(rng, dt)),
             _c("zb", _zp(rng, dt)), _c("zc", _zp(rng, dt))]
    feeds = {"a": _ints(rng, dt, shape), "b": _ints(rng, dt, b_shape)}
    ins = [_vi("a", _ET[dt], list(shape)), _vi("b", _ET[dt], list(b_shape))]
    for order in (["a", "sa", "za", "b", "sb", "zb"], ["b", "sb", "zb", "a", "sa", "za"]):
        node = oh.make_node(op, order + ["sc", "zc"], ["y"], domain="com.microsoft")
        _assert_bit_exact(_model([node], ins, [_vi("y", _ET[dt], None)], inits, ms=True), feeds)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_quantize_dequantize_bit_exact(dt):
    rng = np.random.default_rng(3)
    for _ in range(3):
        s = rng.uniform(0.01, 0.1, 6).astype(np.float32)
        z = _zp(rng, dt, 6)
        x = (rng.standard_normal((3, 6, 5)) * 5).astype(np.float32)
        x[0, 0, :4] = np.float32(s[0]) * np.float32([2.5, 3.5, -0.5, -1.5])   # ties
        for axis_scale in (True, False):
            sc, zc = (s, z) if axis_scale else (s[0], z[0])
            q = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)
            d = oh.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)
            m = _model([q, d], [_vi("x", TP.FLOAT, [3, 6, 5])],
                       [_vi("q", _ET[dt], None), _vi("y", TP.FLOAT, None)],
                       [_c("s", sc), _c("z", zc, dt)])
            _assert_bit_exact(m, {"x": x})


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_quantize_non_finite_values_as_onnxruntime(dt):
    """NaN saturates to the type's minimum (MLAS's MAXPS keeps the bound), +-inf to the
    bounds, whatever the zero point."""
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.5, -2.5, 0.0], np.float32)
    for z in (0, np.iinfo(dt).min // 2 + 7, np.iinfo(dt).max - 3):
        q = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])
        m = _model([q], [_vi("x", TP.FLOAT, [7])], [_vi("q", _ET[dt], None)],
                   [_c("s", np.float32(0.1)), _c("z", z, dt)])
        _assert_bit_exact(m, {"x": x})
        assert bevir.run(bevir.from_onnx(m), {"x": x})["q"][0] == np.iinfo(dt).min


@pytest.mark.parametrize("op", ["QLinearConv", "QLinearMatMul"])
def test_i8_activations_with_u8_weights_are_rejected_as_by_onnxruntime(op):
    conv = op == "QLinearConv"
    w = np.ones((4, 3, 1, 1) if conv else (5, 4), np.uint8)
    x_shape = [1, 3, 4, 4] if conv else [3, 5]
    inits = [_c("sx", np.float32(0.1)), _c("zx", 0, np.int8), _c("w", w), _c("sw", np.float32(0.1)),
             _c("zw", 0, np.uint8), _c("sy", np.float32(0.2)), _c("zy", 0, np.int8)]
    node = oh.make_node(op, ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"], name="bad_pair")
    m = _model([node], [_vi("x", TP.INT8, x_shape)], [_vi("y", TP.INT8, None)], inits)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        _ort(m, {"x": np.ones(x_shape, np.int8)})
    with pytest.raises(BevirError, match="bad_pair.*onnxruntime has no kernel"):
        bevir.from_onnx(m)


def test_global_avgpool_multiplier_out_of_range_is_an_error_as_in_onnxruntime():
    inits = [_c("sx", np.float32(1.0)), _c("zx", 0, np.uint8), _c("sy", np.float32(1e-3)),
             _c("zy", 0, np.uint8)]
    node = oh.make_node("QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"],
                        domain="com.microsoft", name="gap")
    m = _model([node], [_vi("x", TP.UINT8, [1, 4, 1, 1])], [_vi("y", TP.UINT8, None)], inits,
               ms=True)
    with pytest.raises(Exception, match="out of computation range"):
        _ort(m, {"x": np.ones((1, 4, 1, 1), np.uint8)})
    with pytest.raises(BevirError, match=r"gap.*outside onnxruntime's range \[2\*\*-32, 256\)"):
        bevir.from_onnx(m)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("op,attrs", [("QLinearGlobalAveragePool", {}),
                                      ("QLinearGlobalAveragePool", {"channels_last": 1}),
                                      ("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
def test_qlinear_unary_contrib_bit_exact(dt, op, attrs):
    rng = np.random.default_rng(4)
    for _ in range(6):
        inits = [_c("sx", np.float32(rng.uniform(0.01, 0.3))), _c("zx", _zp(rng, dt)),
                 _c("sy", np.float32(rng.uniform(0.002, 0.05))), _c("zy", _zp(rng, dt))]
        node = oh.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
                            **attrs)
        m = _model([node], [_vi("x", _ET[dt], [2, 8, 7, 9])], [_vi("y", _ET[dt], None)], inits,
                   ms=True)
        x = _ints(rng, dt, (2, 8, 7, 9))
        x.reshape(-1)[:256] = np.arange(256, dtype=np.uint8).view(dt)   # every code
        _assert_bit_exact(m, {"x": x})


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_concat_bit_exact(dt):
    rng = np.random.default_rng(5)
    for _ in range(3):
        s = rng.uniform(0.01, 0.1, 3).astype(np.float32)
        z = _zp(rng, dt, 3)
        inits = [_c("sy", s[0]), _c("zy", z[0], dt), _c("s1", s[1]), _c("z1", z[1], dt),
                 _c("s2", s[2]), _c("z2", z[2], dt)]
        node = oh.make_node("QLinearConcat", ["sy", "zy", "a", "s1", "z1", "b", "sy", "zy",
                                              "c", "s2", "z2"], ["y"], domain="com.microsoft",
                            axis=1)
        m = _model([node], [_vi(n, _ET[dt], [2, 3, 4]) for n in "abc"],
                   [_vi("y", _ET[dt], None)], inits, ms=True)
        _assert_bit_exact(m, {n: _ints(rng, dt, (2, 3, 4)) for n in "abc"})


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_conv_matmul_integer_bit_exact(dt):
    rng = np.random.default_rng(6)
    w = _ints(rng, dt, (6, 4, 3, 3))
    conv = oh.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1],
                        strides=[2, 1])
    m = _model([conv], [_vi("x", _ET[dt], [2, 4, 9, 9])], [_vi("y", TP.INT32, None)],
               [_c("w", w), _c("xz", _zp(rng, dt)), _c("wz", _zp(rng, dt))])
    _assert_bit_exact(m, {"x": _ints(rng, dt, (2, 4, 9, 9))})
    mm = oh.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    m = _model([mm], [_vi("a", _ET[dt], [3, 5, 36])], [_vi("y", TP.INT32, None)],
               [_c("b", w.reshape(6, 36).T.copy()), _c("az", _zp(rng, dt)),
                _c("bz", _zp(rng, dt, 6))])
    _assert_bit_exact(m, {"a": _ints(rng, dt, (3, 5, 36))})


def test_sigmoid_table_matches_onnxruntime_over_many_scales():
    """The whole 256-entry table of QLinearSigmoid for 40 random scale pairs."""
    rng = np.random.default_rng(7)
    x = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    for _ in range(40):
        inits = [_c("sx", np.float32(rng.uniform(0.005, 0.2))), _c("zx", _zp(rng, np.uint8)),
                 _c("sy", np.float32(rng.uniform(0.001, 0.01))), _c("zy", _zp(rng, np.uint8))]
        node = oh.make_node("QLinearSigmoid", ["x", "sx", "zx", "sy", "zy"], ["y"],
                            domain="com.microsoft")
        m = _model([node], [_vi("x", TP.UINT8, [1, 1, 16, 16])], [_vi("y", TP.UINT8, None)],
                   inits, ms=True)
        _assert_bit_exact(m, {"x": x})


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("kind", ["ab", "a", "b"])
def test_qlinear_add_every_code_pair(dt, kind):
    """All 65536 code pairs, for each MLAS kernel variant (both vary; a or b the single value
    of its spans), over random scales and zero points: the FMA steps of the AVX2 kernel."""
    rng = np.random.default_rng({"ab": 11, "a": 12, "b": 13}[kind])
    codes = np.arange(256, dtype=np.uint8).view(dt)
    a, b = {"ab": (np.repeat(codes, 256), np.tile(codes, 256)),
            "a": (codes.reshape(256, 1), codes.reshape(1, 256)),
            "b": (codes.reshape(1, 256), codes.reshape(256, 1))}[kind]
    node = oh.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                        domain="com.microsoft")
    for _ in range(16):
        inits = [_c(n, np.float32(rng.uniform(0.002, 0.3))) for n in ("sa", "sb", "sc")]
        inits += [_c(n, _zp(rng, dt)) for n in ("za", "zb", "zc")]
        m = _model([node], [_vi("a", _ET[dt], a.shape), _vi("b", _ET[dt], b.shape)],
                   [_vi("y", _ET[dt], None)], inits, ms=True)
        _assert_bit_exact(m, {"a": a, "b": b})


def test_mlas_logistic_equals_onnxruntime_sigmoid_bit_for_bit():
    """onnxruntime's float Sigmoid runs the same MLAS logistic kernel the QLinearSigmoid
    table is built from: a million values over and beyond the clamp range."""
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.uniform(-20, 20, 600_000), rng.standard_normal(400_000) * 3,
                        [0.0, -0.0, 18.0, -18.0, 1e-30, -1e-30]]).astype(np.float32)
    m = _model([oh.make_node("Sigmoid", ["x"], ["y"])], [_vi("x", TP.FLOAT, [x.size])],
               [_vi("y", TP.FLOAT, None)], [])
    ref = _ort(m, {"x": x})["y"]
    assert int(np.sum(mlas_logistic(x) != ref)) == 0
    assert np.all(mlas_logistic(np.float32([-30, 0, 30])) == np.float32([0, 0.5, 1]))


# ---- fma32: a*b + c rounded once, as the FMA3 instruction ---------------------------------
def _nearest_f32(q: Fraction) -> np.float32:
    """The float32 nearest to the rational ``q``, ties to even. float(q) is the nearest
    float64; rounding that to float32 lands on the answer or on one of its neighbours."""
    r = np.float32(float(q))
    near = [r, np.nextafter(r, F32(np.inf)), np.nextafter(r, F32(-np.inf))]
    return min(near, key=lambda f: (abs(Fraction(float(f)) - q),
                                    int(np.asarray(f).view(np.int32)) & 1))


def _naive_fma32(a, b, c) -> np.ndarray:
    """Double rounding: a*b + c rounded to float64, then to float32."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)
            ).astype(F32)


def _exact_fma32(a, b, c) -> np.ndarray:
    """a*b + c computed exactly (rationals), rounded once to float32."""
    return np.array([_nearest_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a.ravel(), b.ravel(), c.ravel())], F32).reshape(a.shape)


def _check_fma32(a, b, c) -> None:
    """bevir's fma32 (looked up at call time, so a replaced one is what runs) against the
    exact a*b + c rounded once, bit for bit."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, F32) for v in (a, b, c)))
    want = _exact_fma32(a, b, c)
    got = np.asarray(numerics.fma32(a, b, c))
    bad = np.flatnonzero(got.view(np.int32) != want.view(np.int32))
    assert got.dtype == F32 and bad.size == 0, \
        f"{bad.size} of {want.size} differ, first a={a.flat[bad[0]]!r} b={b.flat[bad[0]]!r} " \
        f"c={c.flat[bad[0]]!r}: {got.flat[bad[0]]!r} != {want.flat[bad[0]]!r}"


def _midpoint_cases(rng, n: int):
    """a*b exactly halfway between two float32 neighbours and c a float32 far below
    float64's resolution there, pushing the exact sum towards the odd neighbour: one rounding
    gives the odd one; rounding to float64 first lands on the midpoint, which then ties to
    the even one. a = +-(1 + i/2**12) * 2**e, b = (1 + j/2**12) * 2**f with i, j odd below
    2**10: a*b = 2**(e+f) * (1 + k/2**24), k odd."""
    i, j = (rng.integers(0, 2**9, n) * 2 + 1 for _ in range(2))
    e, f = rng.integers(-15, 16, n), rng.integers(-15, 16, n)
    sign = rng.choice([-1.0, 1.0], n)
    k = (i + j) * 2**12 + i * j
    towards_lo = ((k - 1) // 2) % 2 == 1            # the lower neighbour's mantissa is odd
    push = np.where(towards_lo, -1.0, 1.0) * sign
    tiny = (1 + rng.integers(0, 2**23, n) / 2**23) * np.exp2(-55.0 - rng.integers(0, 30, n))
    a = (sign * (1 + i / 2**12) * np.exp2(e)).astype(F32)
    b = ((1 + j / 2**12) * np.exp2(f)).astype(F32)
    c = (push * tiny * np.exp2(e + f)).astype(F32)
    return a, b, c


def test_fma32_rounds_once(rng):
    # issue 23's case: a*b = 1 + 2**-11 + 2**-24, a float32 midpoint; + 2**-70 lies above it
    x = F32(1 + 2**-12)
    _check_fma32(x, x, F32(2**-70))
    assert numerics.fma32(x, x, F32(2**-70)) == F32(1 + 2**-11 + 2**-23)    # 1.0004884
    assert _naive_fma32(x, x, F32(2**-70)) == F32(1 + 2**-11)                # 1.0004883
    a, b, c = _midpoint_cases(rng, 400)
    assert np.all(_naive_fma32(a, b, c) != _exact_fma32(a, b, c))   # each case tells apart
    _check_fma32(a, b, c)
    # ordinary values, products cancelled by c, and broadcasting
    a = (rng.standard_normal(300) * np.exp2(rng.integers(-30, 30, 300))).astype(F32)
    b = rng.standard_normal(300).astype(F32)
    near = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(300) * 1e-6)).astype(F32)
    _check_fma32(a, b, np.where(rng.random(300) < 0.5, near, rng.standard_normal(300)))
    _check_fma32(a[:40, None], b[None, :20], F32(0.1))


def test_fma32_test_fails_on_double_rounding(rng, monkeypatch):
    """The check above can fail: with fma32 replaced by double rounding it does, on the
    issue's case and on the constructed midpoint cases alike."""
    monkeypatch.setattr(numerics, "fma32", _naive_fma32)
    x = F32(1 + 2**-12)
    with pytest.raises(AssertionError):
        _check_fma32(x, x, F32(2**-70))
    with pytest.raises(AssertionError, match="400 of 400 differ"):
        _check_fma32(*_midpoint_cases(rng, 400))
    with pytest.raises(AssertionError):
        test_fma32_rounds_once(rng)


# ---- (c) a ResNet-like torch model, quantized by onnxruntime ------------------------------------
@pytest.fixture(scope="module")
def float_resnet(tmp_path_factory):
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, ch):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(ch, ch, 3, padding=1, bias=False), torch.nn.BatchNorm2d(ch)
            self.c2, self.b2 = torch.nn.Conv2d(ch, ch, 3, padding=1, bias=False), torch.nn.BatchNorm2d(ch)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
            self.bn = torch.nn.BatchNorm2d(16)
            self.pool = torch.nn.MaxPool2d(3, 2, 1)
            self.block1 = Block(16)
            self.down = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2)
            self.block2 = Block(32)
            self.head = torch.nn.Conv2d(32, 10, 1)

        def forward(self, x):
            x = self.pool(torch.relu(self.bn(self.stem(x))))
            x = self.block2(torch.relu(self.down(self.block1(x))))
            return self.head(torch.nn.functional.adaptive_avg_pool2d(x, 1)).flatten(1)

    net = Net().eval()
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    path = tmp_path_factory.mktemp("resnet") / "float.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.randn(1, 3, 32, 32), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)
    return path


def _quantized_resnet(float_path, activation, per_channel):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": np.random.default_rng(i).standard_normal((1, 3, 32, 32))
                             .astype(np.float32)} for i in range(8)])

        def get_next(self):
            return next(self.it, None)

    out = float_path.with_name(f"q_{activation}_{per_channel}.onnx")
    act = {"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[activation]
    import logging
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=per_channel, activation_type=act, weight_type=QuantType.QInt8)
    model = onnx.load(str(out))
    # every quantized intermediate becomes an output too, so that all of them are compared
    have = {o.name for o in model.graph.output}
    for n in model.graph.node:
        if n.op_type in ("QLinearConv", "QLinearAdd", "MaxPool", "QLinearGlobalAveragePool",
                         "QuantizeLinear"):
            for o in n.output:
                if o not in have:
                    model.graph.output.append(oh.make_empty_tensor_value_info(o))
                    have.add(o)
    return model


@pytest.mark.parametrize("activation", ["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantized_resnet_bit_exact(float_resnet, activation, per_channel):
    model = _quantized_resnet(float_resnet, activation, per_channel)
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert {("", "QLinearConv"), ("com.microsoft", "QLinearAdd"),
            ("com.microsoft", "QLinearGlobalAveragePool"), ("", "MaxPool")} <= ops
    graph = bevir.from_onnx(model)
    compared = 0
    for seed in range(4):
        x = (np.random.default_rng(100 + seed).standard_normal((1, 3, 32, 32)) * 1.2
             ).astype(np.float32)
        got = bevir.run(graph, {"x": x})
        for optimize in (False, True):
            ref = _ort(model, {"x": x}, optimize)
            for name, r in ref.items():
                g = np.asarray(got[name])
                assert g.dtype == r.dtype and g.shape == r.shape, name
                assert np.array_equal(g, r), f"{name}: {int(np.sum(g != r))} differ " \
                                             f"(ORT optimizations {'on' if optimize else 'off'})"
                compared += r.size
    assert compared > 10000


# ---- types and errors ---------------------------------------------------------------------------
def test_quant_params_are_in_the_types():
    rng = np.random.default_rng(9)
    m, _ = _qlinear_conv_model(rng, np.uint8, np.int8, per_channel=True)
    g = bevir.from_onnx(m)
    (node,) = g.nodes
    assert node.op == "qlinear_conv"
    x, w = node.inputs[:2]
    assert isinstance(x.type.quant, AffineQuant) and x.type.quant.axis is None
    assert w.type.quant.axis == 0 and w.type.quant.channels == 16
    y = node.outputs[0].type
    assert y.dtype is DType.u8 and y.quant.axis is None
    assert "affine<scale=" in str(y)
    assert get_op("qlinear_conv").cost(node)["macs"] == 2 * 16 * 12 * 12 * 8 * 9


def test_relu_keeps_integer_type_and_quant():
    t = TensorType((2, 3), DType.i8, quant=AffineQuant((0.1,), (-3,)))
    g = bevir.Graph("g")
    x = g.add_input("x", t)
    y = g.create_node("relu", [x]).outputs[0]
    assert y.type == t
    g.set_output("y", y)
    out = bevir.run(g, {"x": np.array([[-5, 0, 7], [1, -1, 127]], np.int8)})["y"]
    assert out.dtype == np.int8 and out.tolist() == [[0, 0, 7], [1, 0, 127]]


def _conv_node_model(**over):
    rng = np.random.default_rng(10)
    m, _ = _qlinear_conv_model(rng, np.uint8, np.int8, per_channel=True)
    inits = {t.name: t for t in m.graph.initializer}
    for k, v in over.items():
        inits[k] = nh.from_array(v, k)
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits.values())
    return m


@pytest.mark.parametrize("over,match", [
    ({"xs": np.float32([0.1, 0.2])}, "x_scale must be a scalar"),
    ({"ws": np.float32([0.1, 0.2, 0.3])}, "w_scale must be a scalar or 16 values"),
    ({"xz": np.int8(3)}, "x_zero_point must be u8"),
    ({"yz": np.int32(3)}, "y_zero_point must be int8 or uint8"),
    ({"ys": np.float64(0.1)}, "y_scale must be float32"),
    ({"ys": np.float32(-1)}, "y_scale must be positive"),
])
def test_bad_quant_params_raise_naming_the_node(over, match):
    m = _conv_node_model(**over)
    m.graph.node[0].name = "conv_7"
    with pytest.raises(UnsupportedError, match=match) as e:
        bevir.from_onnx(m)
    assert e.value.node == "conv_7"


def test_non_constant_scale_raises():
    m = _conv_node_model()
    init = [t for t in m.graph.initializer if t.name == "ys"]
    m.graph.initializer.remove(init[0])
    m.graph.input.append(_vi("ys", TP.FLOAT, []))
    with pytest.raises(NonConstantInputError, match="y_scale"):
        bevir.from_onnx(m)


def test_producer_quant_disagreeing_with_node_raises():
    q = oh.make_node("QuantizeLinear", ["x", "s1", "z"], ["q"])
    d = oh.make_node("DequantizeLinear", ["q", "s2", "z"], ["y"], name="dq")
    m = _model([q, d], [_vi("x", TP.FLOAT, [4])], [_vi("y", TP.FLOAT, None)],
               [_c("s1", np.float32(0.1)), _c("s2", np.float32(0.2)), _c("z", np.uint8(3))])
    with pytest.raises(BevirError, match="does not insert requantization") as e:
        bevir.from_onnx(m)
    assert e.value.node == "dq"


def test_lookup_table_is_indexed_by_byte():
    q = AffineQuant((0.5,), (0,))
    t = lookup_table(q, q, np.dtype(np.int8), lambda v: v)
    assert t.dtype == np.int8 and t[255] == -1 and t[127] == 127 and t[128] == -128
