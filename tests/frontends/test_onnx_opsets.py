"""Opsets 10..28: the version notes stay in step with the installed onnx, the user reports
(an opset-22+ model, an opset-10 QLinearConv model, Clip with bounds given as inputs)
import and match onnxruntime, and absurd sizes are refused before anything is allocated."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import bevir
from bevir.frontends.onnx import MAX_OPSET, MIN_OPSET, VERSION_NOTES, supported_ops


def _signature(schema) -> tuple:
    opt = onnx.defs.OpSchema.FormalParameterOption.Optional
    return ([(i.name, i.option == opt) for i in schema.inputs],
            [o.name for o in schema.outputs], sorted(schema.attributes))


def test_max_opset_is_the_installed_onnx_newest():
    assert MAX_OPSET == onnx.defs.onnx_opset_version()


def test_every_signature_change_of_a_supported_op_has_a_version_note():
    missing = []
    for op in sorted(supported_ops()):
        prev = None
        for opset in range(MIN_OPSET, MAX_OPSET + 1):
            try:
                s = onnx.defs.get_schema(op, opset, "")
            except onnx.defs.SchemaError:
                continue
            if prev is not None and s.since_version != prev.since_version \
                    and _signature(s) != _signature(prev) \
                    and s.since_version not in VERSION_NOTES.get(op, {}):
                missing.append(f"{op}-{s.since_version}")
            prev = s
    assert missing == []


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, dt, shape):
    return oh.make_tensor_value_info(name, dt, shape)


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _check(model, feeds, exact):
    want = _ort(model, feeds)
    got = bevir.run(bevir.from_onnx(model), feeds)
    for k, v in want.items():
        assert np.asarray(got[k]).dtype == v.dtype
        if exact:
            np.testing.assert_array_equal(got[k], v)
        else:
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [22, 23, 25, 28])
def test_current_exporter_opsets_import(opset):
    rng = np.random.default_rng(opset)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             oh.make_node("Relu", ["c"], ["r"]),
             oh.make_node("GlobalAveragePool", ["r"], ["y"])]
    m = _model(nodes, [_vi("x", TP.FLOAT, [1, 3, 8, 8])], [_vi("y", TP.FLOAT, [1, 4, 1, 1])],
               [w], opset=opset)
    _check(m, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}, exact=False)


def test_opset10_qlinear_conv_is_bit_exact():
    rng = np.random.default_rng(10)
    consts = {"xs": np.float32(0.05), "xz": np.uint8(120), "ws": np.float32(0.02),
              "wz": np.int8(0), "ys": np.float32(0.3), "yz": np.uint8(100),
              "w": rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8),
              "b": rng.integers(-500, 500, 8).astype(np.int32)}
    node = oh.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                        ["y"], pads=[1] * 4, strides=[2, 2])
    m = _model([node], [_vi("x", TP.UINT8, [1, 4, 9, 9])], [_vi("y", TP.UINT8, None)],
               [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
               opset=10)
    _check(m, {"x": rng.integers(0, 256, (1, 4, 9, 9)).astype(np.uint8)}, exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_clip_with_bounds_as_graph_inputs(dtype):
    onnx_dt = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = oh.make_node("Clip", ["x", "lo", "hi"], ["y"])
    m = _model([node], [_vi("x", onnx_dt, [3, 5]), _vi("lo", onnx_dt, []),
                        _vi("hi", onnx_dt, [])], [_vi("y", onnx_dt, [3, 5])], opset=13)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5)) * 10).astype(dtype)
    for lo, hi in ((-3, 4), (2, -1)):      # min > max: ONNX gives max everywhere
        _check(m, {"x": x, "lo": np.array(lo, dtype), "hi": np.array(hi, dtype)},
               exact=True)


def test_opset10_pad_and_resize_attribute_forms():
    nodes = [oh.make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 2, 0, 0, 2, 1], value=1.5),
             oh.make_node("Resize", ["p", "s"], ["y"], mode="nearest")]
    s = numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "s")
    m = _model(nodes, [_vi("x", TP.FLOAT, [1, 2, 3, 4])], [_vi("y", TP.FLOAT, None)], [s],
               opset=10)
    _check(m, {"x": np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)}, exact=True)


def test_old_opset_model_imports_when_its_ops_are_unchanged():
    m = _model([oh.make_node("And", ["a", "b"], ["y"])],
               [_vi("a", TP.BOOL, [4]), _vi("b", TP.BOOL, [4])], [_vi("y", TP.BOOL, [4])],
               opset=7)
    a = np.array([True, True, False, False])
    np.testing.assert_array_equal(bevir.run(bevir.from_onnx(m), {"a": a, "b": a[::-1].copy()})
                                  ["y"], a & a[::-1])


def test_op_not_defined_at_the_models_opset_is_refused():
    m = _model([oh.make_node("Gelu", ["x"], ["y"], name="g")], [_vi("x", TP.FLOAT, [2])],
               [_vi("y", TP.FLOAT, [2])], opset=17)
    with pytest.raises(bevir.UnsupportedError, match="not defined in opset 17") as e:
        bevir.from_onnx(m)
    assert e.value.node == "g"


# ---- resource limits ------------------------------------------------------------------------

def test_absurd_declared_input_shape_is_refused():
    m = _model([oh.make_node("Relu", ["x"], ["y"])], [_vi("x", TP.FLOAT, [1 << 20] * 3)],
               [_vi("y", TP.FLOAT, None)])
    with pytest.raises(bevir.UnsupportedError, match="more than the per-tensor limit"):
        bevir.from_onnx(m)


def test_constant_larger_than_its_bytes_is_refused():
    t = onnx.TensorProto(name="w", data_type=TP.FLOAT, dims=[1 << 40, 1 << 10],
                         raw_data=b"\0" * 16)
    m = _model([oh.make_node("Add", ["x", "w"], ["y"])], [_vi("x", TP.FLOAT, [1])],
               [_vi("y", TP.FLOAT, None)], [t])
    with pytest.raises(bevir.UnsupportedError, match="initializer 'w'"):
        bevir.from_onnx(m)
    t2 = onnx.TensorProto(name="w", data_type=TP.FLOAT, dims=[1000], raw_data=b"\0" * 16)
    m.graph.initializer[0].CopyFrom(t2)
    with pytest.raises(bevir.UnsupportedError, match="declares shape .1000. .1000 elements. "
                                                      "but holds 16 bytes"):
        bevir.from_onnx(m)


def test_constant_of_shape_too_large_stays_a_node_refused_when_run():
    """Nothing is allocated at import (the constant is too large to fold: an expand node);
    running it is refused by name before anything runs."""
    shape = numpy_helper.from_array(np.array([1 << 30, 1 << 30], np.int64), "shape")
    m = _model([oh.make_node("ConstantOfShape", ["shape"], ["y"], name="cos")], [],
               [_vi("y", TP.FLOAT, None)], [shape])
    g = bevir.from_onnx(m)
    assert g.op_counts() == {"expand": 1}
    with pytest.raises(bevir.InterpreterError, match="node %y from 'cos': result %y: shape "
                                                     ".* more than the per-tensor limit"):
        bevir.run(g, {})


def test_text_with_absurd_dims_is_refused():
    text = ("graph @g(%x: tensor<99999999x99999999x99999999xf32>) {\n"
            "  %y = relu(%x) : tensor<99999999x99999999x99999999xf32>\n  return %y\n}\n")
    with pytest.raises(bevir.ParseError, match="more than the per-tensor limit"):
        bevir.parse(text)
