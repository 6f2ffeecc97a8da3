"""Generated kernels against the golden model: every lowering, on the one-op graphs of
every fx op family partitioned for 1 to 4 cores and on inputs that hit rounding ties,
saturation at both ends and the extreme shifts, gives 0 differing elements; the check
names the first node whose kernel differs; an integer op without a lowering is a clear
error."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import DType, Layout, TensorType
from bevir.codegen.program import Program
from bevir.codegen.lower import kernel_def
from bevir.target import lowerable
from bevir.ir.types import AffineQuant
from bevir.ops.fixed_point import FxAdd
from bevir.testing import assert_bit_exact
from tests.shared import GRAPHS, I8, I16, I32, all_codes, fx, ints, partitioned


def lowered_ops(program: Program) -> set[str]:
    return {program.kernels[s].kd.op for s in program.node_kernel.values()}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("cores,target", [(1, "llvm"), (2, "llvm"), (4, "llvm"), (1, "c"), (3, "c")])
def test_generated_kernels_are_bit_exact(rng, name, cores, target):
    graph, inputs = GRAPHS[name](rng)
    g = partitioned(graph, cores)
    program = Program(g, target)
    report = program.check(inputs)
    assert report.ok, report.mismatch
    # the host build passes the operands of barriers (and transfers) on, running no kernel
    passed_on = target == "llvm" and cores > 1
    assert report.checked == sum(lowerable(n) and not (passed_on and n.op == "barrier")
                                 for n in g.nodes) > 0
    assert_bit_exact(program.run(inputs), bevir.run(graph, inputs))
    if cores > 1:           # the cores exchange pieces (no barriers: they wait on values)
        assert "core_gather" in lowered_ops(program) and "barrier" not in g.op_counts()


# one-op graphs at the edges: shifts at both ends of their range, every code
EDGE_CASES = {
    "requantize-right-62": lambda b, x: b.fx_requantize(x, out_frac_bits=-31, out_dtype="i32"),
    "requantize-left-31": lambda b, x: b.fx_requantize(x, out_frac_bits=31, out_dtype="i32"),
    "requantize-tie": lambda b, x: b.fx_requantize(x, out_frac_bits=0),
    "add-saturates": lambda b, x: b.fx_add(x, x, out_frac_bits=0),
    "sub-ties": lambda b, x: b.fx_sub(x, b.fx_relu(x), out_frac_bits=-1),
    "mul-square": lambda b, x: b.fx_mul(x, x, out_frac_bits=1, out_dtype="i16"),
    "relu-shift": lambda b, x: b.fx_relu(x, out_frac_bits=-2),
    "sigmoid-table": lambda b, x: b.fx_sigmoid(x, out_frac_bits=7),
    "dequantize": lambda b, x: b.fx_dequantize(x),
    "quantize-roundtrip": lambda b, x: b.fx_quantize(b.fx_dequantize(x), out_frac_bits=4),
    "pad-constant-crop": lambda b, x: b.pad(x, pads=[1, -3, 2, 4], value=-5.0),
    "pad-edge": lambda b, x: b.pad(x, pads=[2, 1, 1, 3], mode="edge"),
    "resize-nearest": lambda b, x: b.resize(x, size=[9, 100], mode="nearest"),
    "resize-linear": lambda b, x: b.resize(x, size=[7, 129], mode="linear"),
    "resize-linear-corners": lambda b, x: b.resize(
        x, size=[16, 514], mode="linear", coordinate_transformation_mode="align_corners"),
}


#: the operand dtypes each case takes (frac bits: 1 for i8, 31 for the wider ones)
I8_ONLY = ("relu-shift", "sigmoid-table", "sub-ties", "resize-linear", "resize-linear-corners")
EDGE_PARAMS = [(case, dtype) for case in EDGE_CASES for dtype in (I8, I16, I32)
               if dtype is I8 or (case not in I8_ONLY
                                  and not (case == "mul-square" and dtype is I32))]


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("case,dtype", EDGE_PARAMS, ids=[f"{c}-{d}" for c, d in EDGE_PARAMS])
def test_edge_codes_and_shifts(case, dtype, target):
    b = bevir.Builder("edge")
    x = b.input("x", fx((4, 257), 1 if dtype is I8 else 31, dtype))
    b.output("y", EDGE_CASES[case](b, x))
    codes = all_codes((4, 257), dtype.np)
    codes[0, :4] = [np.iinfo(dtype.np).min, np.iinfo(dtype.np).max, 0, -1]
    report = Program(b.graph, target).check({"x": codes})
    assert report.ok and report.checked >= 1, report.mismatch


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("dtype,axis", [(DType.u8, None), (DType.i8, 1)])
def test_affine_dequantize_is_bit_exact(rng, dtype, axis, target):
    """onnxruntime's dequantize, a device stage's way out to a group kept float inside the
    network: every code, per tensor and per channel."""
    channels = 1 if axis is None else 257
    quant = AffineQuant(tuple(rng.uniform(1e-4, 3.0, channels)),
                        tuple(rng.integers(0, 40, channels)), axis)
    b = bevir.Builder("dequantize")
    x = b.input("x", TensorType((4, 257), dtype, quant=quant))
    b.output("y", b.dequantize(x))
    report = Program(b.graph, target).check({"x": all_codes((4, 257), dtype.np)})
    assert report.ok and report.checked == 1, report.mismatch


def residual_block(rng):
    """conv -> requantize -> linear -> residual add -> dequantize."""
    b = bevir.Builder("block")
    x = b.input("x", fx((1, 6, 5, 4), 5, layout=Layout.nhwc))
    w = b.const(ints(rng, (8, 4, 3, 3)), "w", fx((8, 4, 3, 3), 7))
    y = b.fx_conv2d(x, w, pads=(1, 1, 1, 1), out_frac_bits=3, out_dtype="i16", loc="c/conv")
    y = b.reshape(b.fx_requantize(y, out_frac_bits=4, loc="c/requant"), shape=(6, 40))
    y = b.fx_linear(y, b.const(ints(rng, (16, 40)), "wl", fx((16, 40), 8)), out_frac_bits=4,
                    loc="c/proj")
    b.output("y", b.fx_dequantize(b.fx_add(y, y, out_frac_bits=3, loc="c/residual")))
    return b.graph, {"x": ints(rng, (1, 6, 5, 4))}


def test_check_names_the_first_node_whose_kernel_differs(rng, monkeypatch):
    graph, inputs = residual_block(rng)
    original = FxAdd.tvm_lowering

    def off_by_one(self, c, L, a, b):        # a deliberately broken lowering
        y = original(self, c, L, a, b)
        return L.compute(c.out_types[0], lambda *i: L.saturate(L.i64(y[i]) + L.i64(1), "int8"))
    monkeypatch.setattr(FxAdd, "tvm_lowering", off_by_one)
    report = Program(graph).check(inputs)
    assert not report.ok
    m = report.mismatch
    assert (m.op, m.loc) == ("fx_add", "c/residual") and m.differing > 0
    assert int(m.generated) != int(m.golden)
    assert "op 'fx_add'" in str(m) and "from 'c/residual'" in str(m)


def test_an_integer_op_without_a_lowering_is_a_clear_error(monkeypatch):
    b = bevir.Builder("nolower")
    x = b.input("x", fx((3, 4), 2))
    b.output("y", b.fx_add(x, x, out_frac_bits=1, loc="net/sum"))
    monkeypatch.setattr(FxAdd, "tvm_lowering", None)
    with pytest.raises(bevir.errors.CodegenError,
                       match="op 'fx_add' node %.* from 'net/sum': op 'fx_add' has no lowering"):
        Program(b.graph)


def test_equal_signatures_share_one_kernel(rng):
    b = bevir.Builder("shared")
    x = b.input("x", fx((5, 6), 3))
    y = b.fx_add(x, x, out_frac_bits=2)
    z = b.fx_add(y, y, out_frac_bits=2)         # another signature: y's frac bits differ
    b.output("u", b.fx_add(x, x, out_frac_bits=2))
    b.output("v", z)
    nodes = b.graph.nodes
    sigs = [kernel_def(n).signature for n in nodes]
    assert sigs[0] == sigs[2] != sigs[1]
    assert len(Program(b.graph).kernels) == 2


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_rank_0_operands_and_results(target):
    """A scalar index keeps rank 0 in both builds."""
    b = bevir.Builder("scalar")
    x = b.input("x", fx((18,), 3))
    i = b.input("i", TensorType((), DType.i64))
    b.output("y", b.gather(x, i, axis=0))
    inputs = {"x": np.arange(18, dtype=np.int8), "i": np.array(-2, np.int64)}
    program = Program(b.graph, target)
    assert program.check(inputs).checked == 1 and program.check(inputs).ok
    assert program.run(inputs)["y"].shape == () and program.run(inputs)["y"] == 16
