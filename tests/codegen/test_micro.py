"""The host build's micro-kernels (bevir.codegen.micro): the VNNI convolution accumulator
against the golden op, bit for bit, on the shapes that exercise every path of the C
code (1-4 channel blocks of 16, column tiles of 6 and every remainder, NCHW results
transposed 16 x 16 in one or several passes, channels padded to 4), both layouts, both
8-bit input types with zero points at the ends of their range, strides, pads and
dilations. Each kernel must call the micro-kernel, and the build without it must agree."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import DType, Layout
from bevir.codegen import micro
from bevir.codegen.program import Program
from bevir.errors import CodegenError
from tests.shared import fx, q

I8, U8 = DType.i8, DType.u8

needs_vnni = pytest.mark.skipif(not micro.available(), reason="no AVX512-VNNI here")

CASES = {   # x dtype, x zero point, in, out channels, (h, w), kernel, stride, pads, dilations
    "i8-3x3-blocks2-rest5": (I8, 0, 5, 32, (9, 23), 3, 1, (1, 1, 1, 1), (1, 1)),
    "u8-zp255-blocks4+1-stride2-dilated": (U8, 255, 7, 80, (11, 37), 3, 2, (2, 1, 0, 1), (2, 1)),
    "u8-zp0-1x1-blocks3": (U8, 0, 8, 48, (5, 16), 1, 1, (0, 0, 0, 0), (1, 1)),
    "i8-zp-128-blocks4-rest1": (I8, -128, 4, 64, (5, 43), 3, 1, (1, 1, 1, 1), (1, 1)),
    "i8-zp127-two-nchw-passes": (I8, 127, 16, 1024, (3, 40), 1, 1, (0, 0, 0, 0), (1, 1)),
    "i8-7x7-c3-stride2": (I8, -3, 3, 16, (20, 30), 7, 2, (3, 3, 3, 3), (1, 1)),
}


def conv_graph(case, layout, rng, bias: bool):
    xd, xzp, ci, co, hw, k, s, pads, dil = CASES[case]
    info = np.iinfo(xd.np)
    shape = (2, ci, *hw) if layout is not Layout.nhwc else (2, *hw, ci)
    g = bevir.Graph()
    x = g.add_input("x", q(xd, shape, 1.0, xzp, layout))
    w = g.add_input("w", q(I8, (co, ci, k, k), rng.uniform(0.001, 0.01, co), np.zeros(co, int),
                           axis=0))
    feeds = {"x": rng.integers(info.min, info.max + 1, shape).astype(xd.np),
             "w": rng.integers(-128, 128, (co, ci, k, k)).astype(np.int8)}
    feeds["x"].reshape(-1)[:2] = info.min, info.max
    feeds["w"].reshape(-1)[:2] = -128, 127
    ins = [x, w]
    if bias:
        ins.append(g.add_input("b", bevir.TensorType((co,), DType.i32)))
        feeds["b"] = rng.integers(-5000, 5000, co).astype(np.int32)
    node = g.create_node("qlinear_conv", ins, dict(
        strides=(s, s), pads=pads, dilations=dil, groups=1, out_dtype="i8",
        out_scale=0.5, out_zero_point=3))
    g.set_output("y", node.output)
    return g, feeds


@needs_vnni
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc])
def test_vnni_conv_matches_golden(case, layout, rng):
    g, feeds = conv_graph(case, layout, rng, bias=case.startswith("i8"))
    program = Program(g, "llvm", micro=True)
    (kernel,) = program.kernels.values()
    assert "bevir_vnni_conv" in kernel.kd.func.script()
    report = program.check(feeds)
    assert report.ok and report.checked == 1, report.mismatch
    plain = Program(g, "llvm", micro=False)
    assert "bevir_vnni_conv" not in next(iter(plain.kernels.values())).kd.func.script()
    want = bevir.run(g, feeds)["y"]
    assert np.array_equal(plain.run(feeds)["y"], want)
    assert np.array_equal(program.run(feeds)["y"], want)


@needs_vnni
@pytest.mark.parametrize("wd,co,groups", [(U8, 16, 1), (I8, 12, 1), (I8, 16, 2)],
                         ids=["u8-weights", "12-channels", "grouped"])
def test_vnni_conv_not_used_where_it_does_not_apply(wd, co, groups, rng):
    """u8 weights, output channels not a multiple of 16, groups: the TE accumulator."""
    g = bevir.Graph()
    xd = U8 if wd is U8 else I8
    x = g.add_input("x", q(xd, (1, 4, 6, 6), 1.0, 0))
    w = g.add_input("w", q(wd, (co, 4 // groups, 3, 3), 0.1, 7 if wd is U8 else 0))
    node = g.create_node("qlinear_conv", [x, w], dict(
        strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), groups=groups, out_dtype=xd.value,
        out_scale=0.5, out_zero_point=0))
    g.set_output("y", node.output)
    program = Program(g, "llvm", micro=True)
    assert "bevir_vnni_conv" not in next(iter(program.kernels.values())).kd.func.script()
    info, winfo = np.iinfo(xd.np), np.iinfo(wd.np)
    feeds = {"x": rng.integers(info.min, info.max + 1, (1, 4, 6, 6)).astype(xd.np),
             "w": rng.integers(winfo.min, winfo.max + 1, (co, 4 // groups, 3, 3)).astype(wd.np)}
    assert program.check(feeds).ok


def test_micro_kernels_are_for_the_host_build():
    g = bevir.Graph()
    g.set_output("y", g.add_input("x", q(I8, (4,), 1.0, 0)))
    with pytest.raises(CodegenError, match="host build"):
        Program(g, "c", micro=True)


@needs_vnni
@pytest.mark.parametrize("x_shape,n,k", [((3, 37, 38), 48, 38), ((100, 256), 64, 256),
                                         ((7,), 16, 5)], ids=["batched-k38", "rows100", "vector"])
def test_vnni_linear_matches_golden(x_shape, n, k, rng):
    """fx_linear as a 1x1 convolution of one long row (48 columns per call; rows of 111,
    100 and 1): every code at the ends, K padded to 4, an i32 bias that saturates."""
    x_shape = x_shape[:-1] + (k,)
    b = bevir.Builder("linear")
    x = b.input("x", fx(x_shape, 5))
    w = b.const(rng.integers(-128, 128, (n, k)).astype(np.int8), "w", fx((n, k), 7))
    bias = np.full(n, 2 ** 31 - 1, np.int32)
    bias[1::2] = rng.integers(-3000, 3000, n // 2)
    y = b.fx_linear(x, w, b.const(bias, "b", bevir.TensorType((n,), DType.i32)),
                    out_frac_bits=3)
    b.output("y", y)
    feeds = {"x": rng.integers(-128, 128, x_shape).astype(np.int8)}
    feeds["x"].reshape(-1)[:2] = -128, 127
    program = Program(b.graph, "llvm", micro=True)
    assert "bevir_vnni_conv" in next(iter(program.kernels.values())).kd.func.script()
    assert program.check(feeds).ok
    assert np.array_equal(program.run(feeds)["y"], bevir.run(b.graph, feeds)["y"])


@needs_vnni
def test_vnni_fx_conv_matches_golden(rng):
    b = bevir.Builder("conv")
    x = b.input("x", fx((1, 6, 9, 11), 4))
    w = b.const(rng.integers(-128, 128, (32, 6, 3, 3)).astype(np.int8), "w", fx((32, 6, 3, 3), 7))
    b.output("y", b.fx_conv2d(x, w, strides=(2, 1), pads=(1, 1, 1, 1), dilations=(1, 1),
                              groups=1, out_frac_bits=2))
    program = Program(b.graph, "llvm", micro=True)
    assert "bevir_vnni_conv" in next(iter(program.kernels.values())).kd.func.script()
    feeds = {"x": rng.integers(-128, 128, (1, 6, 9, 11)).astype(np.int8)}
    assert program.check(feeds).ok
