"""The per-tensor caps (bevir.limits): checked before anything is allocated. A 131-byte
ONNX model whose ConstantOfShape would fold to 10 GB imports in milliseconds with the
constant kept as a node, and running it is refused by name; an op folded by onnx's
evaluator above the cap is one line; text nested 100,000 deep is a ParseError."""
from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import bevir
from bevir.cli import main
from bevir.ir.limits import FOLD_BYTES, fold_bytes, tensor_bytes


def constant_of_shape(shape, then: str = "ReduceSum") -> onnx.ModelProto:
    n1 = oh.make_node("ConstantOfShape", ["s"], ["c"],
                      value=oh.make_tensor("v", TP.FLOAT, [1], [1.0]))
    n2 = oh.make_node(then, ["c"], ["y"], keepdims=0)
    s = numpy_helper.from_array(np.array(shape, np.int64), "s")
    m = oh.make_model(oh.make_graph([n1, n2], "g", [], [oh.make_empty_tensor_value_info("y")],
                                    [s]), opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def peak_bytes(fn):
    """(fn's result, the most bytes Python and numpy held at once while it ran)."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_constant_too_large_to_fold_stays_a_node_and_is_refused_when_run(tmp_path, capsys):
    model = constant_of_shape([50000, 50000])
    assert len(model.SerializeToString()) < 200
    g, peak = peak_bytes(lambda: bevir.from_onnx(model))
    assert g.op_counts() == {"expand": 1, "reduce_sum": 1} and peak < 16 << 20
    with pytest.raises(bevir.InterpreterError, match="node %c from 'ConstantOfShape_0': result "
                       "%c: shape \\[50000, 50000\\] needs 10,000,000,000 bytes, more than the "
                       "per-tensor limit"):
        bevir.run(g, {})
    onnx.save(model, tmp_path / "big.onnx")
    assert main(["import", str(tmp_path / "big.onnx"), "-o", str(tmp_path / "big.bevir")]) == 0
    assert main(["run", str(tmp_path / "big.bevir")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than the per-tensor limit" in err


def test_below_the_caps_constants_fold_as_before():
    g = bevir.from_onnx(constant_of_shape([30, 20]))
    assert g.op_counts() == {} and bevir.run(g, {})["y"] == np.float32(600)
    with bevir.limits(fold_bytes=100):                  # the same model, a smaller cap
        g = bevir.from_onnx(constant_of_shape([30, 20]))
        assert g.op_counts() == {"expand": 1, "reduce_sum": 1}
        assert bevir.run(g, {})["y"] == np.float32(600)  # the node computes the same
    assert fold_bytes() == FOLD_BYTES                   # the block restored the cap


def test_the_caps_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("BEVIR_MAX_FOLD_BYTES", "100")
    monkeypatch.setenv("BEVIR_MAX_TENSOR_BYTES", "1000")
    assert (fold_bytes(), tensor_bytes()) == (100, 1000)
    g = bevir.from_onnx(constant_of_shape([30, 20]))
    with pytest.raises(bevir.InterpreterError, match="2,400 bytes, more than the per-tensor "
                                                     "limit \\(1,000 bytes"):
        bevir.run(g, {})
    with bevir.limits(tensor_bytes=1 << 20):            # the API wins over the environment
        assert bevir.run(g, {})["y"] == np.float32(600)
    monkeypatch.setenv("BEVIR_MAX_TENSOR_BYTES", "lots")
    with pytest.raises(bevir.BevirError, match="BEVIR_MAX_TENSOR_BYTES must be a number of "
                                               "bytes, got 'lots'"):
        tensor_bytes()
    with pytest.raises(bevir.BevirError, match="fold_bytes must be a number of bytes"):
        with bevir.limits(fold_bytes=-1):
            pass


def test_a_declared_type_above_the_cap_is_refused_before_allocating():
    with bevir.limits(tensor_bytes=1000):
        with pytest.raises(bevir.ParseError, match="tensor type shape \\[1000\\] needs 4,000 "
                                                   "bytes, more than the per-tensor limit"):
            bevir.parse('graph @g(%x: tensor<1000xf32>) {\n  return %x as "y"\n}\n')


def test_an_op_folded_by_onnx_evaluator_above_the_cap_is_one_line():
    """OneHot (no bevir node) of depth 50,000,000: 2 GB, refused from ONNX shape inference
    before onnx's evaluator allocates it."""
    inits = [numpy_helper.from_array(np.arange(10, dtype=np.int64), "i"),
             numpy_helper.from_array(np.array(50_000_000, np.int64), "d"),
             numpy_helper.from_array(np.array([0, 1], np.float32), "v")]
    nodes = [oh.make_node("OneHot", ["i", "d", "v"], ["o"]),
             oh.make_node("ReduceSum", ["o"], ["y"], keepdims=0)]
    m = oh.make_model(oh.make_graph(nodes, "g", [], [oh.make_empty_tensor_value_info("y")],
                                    inits), opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(bevir.UnsupportedError, match="folding 'OneHot': a constant of "
                       "2,000,000,000 bytes, above the folding limit") as e:
        peak_bytes(lambda: bevir.from_onnx(m))
    assert "\n" not in str(e.value)
    inits[1] = numpy_helper.from_array(np.array(4, np.int64), "d")    # a small one folds:
    m = oh.make_model(oh.make_graph(nodes, "g", [], [oh.make_empty_tensor_value_info("y")],
                                    inits), opset_imports=[oh.make_opsetid("", 17)])
    assert bevir.run(bevir.from_onnx(m), {})["y"] == np.float32(4)     # indices 0..3 hit


def test_canonicalize_folds_nothing_above_the_cap():
    b = bevir.Builder("g")
    x = b.input("x", bevir.TensorType((4,)))
    big = b.expand(b.const(np.float32(1), "one"), shape=(512, 512))
    b.output("y", b.add(b.reduce_sum(big, axes=(0,)), b.reduce_sum(x, axes=(0,))))
    with bevir.limits(fold_bytes=(1 << 20) - 1):         # the expanded constant is 1 MiB
        bevir.optimize(b.graph, "canonicalize")
        assert b.graph.op_counts()["expand"] == 1
    bevir.optimize(b.graph, "canonicalize")
    assert "expand" not in b.graph.op_counts()


@pytest.mark.parametrize("attr", ["[" * 100_000 + "]" * 100_000,
                                  "[" * 33 + "1" + "]" * 33])
def test_ir_text_nested_too_deep_is_a_parse_error(attr, tmp_path, capsys):
    text = f'graph @g(%x: tensor<4xf32>) {{\n  %0 = relu(%x) {{a = {attr}}} : tensor<4xf32>\n' \
           '  return %0 as "y"\n}\n'
    with pytest.raises(bevir.ParseError, match="2:55: attribute value nested deeper than 32 "
                                               "lists"):
        bevir.parse(text)
    (tmp_path / "deep.bevir").write_text(text)
    assert main(["show", str(tmp_path / "deep.bevir")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested deeper than 32 lists" in err
    with pytest.raises(bevir.ParseError, match="unknown attribute"):   # 32 deep: read, then
        bevir.parse(text.replace(attr, "[" * 32 + "1" + "]" * 32))     # refused as relu's
