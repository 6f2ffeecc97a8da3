"""fx_quantize, fx_dequantize, fx_bridge and the insert-bridges pass."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import bevir
from bevir import AffineQuant, Builder, DType, FixedPointQuant, TensorType
from bevir.ops.numerics import bridge_table
from bevir.passes.patterns import explain


def _exact_bridge(code: int, zp: int, scale: float, frac: int, bits: int = 8) -> int:
    """round_half_up((code - zp) * scale * 2**frac) in exact rationals, saturated to
    ``bits``."""
    v = (code - zp) * Fraction(float(np.float32(scale))) * Fraction(2) ** frac
    r = (v + Fraction(1, 2)).__floor__()
    return max(-2 ** (bits - 1), min(2 ** (bits - 1) - 1, r))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_bridge_table_rounds_the_exact_product_once(dtype):
    rng = np.random.default_rng(0)
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(int)
    for _ in range(40):
        scale = float(np.float32(rng.uniform(1e-3, 0.5)))
        zp = int(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1))
        frac = int(rng.integers(0, 8))
        got = bridge_table(scale, zp, frac, dtype)
        want = [_exact_bridge(c, zp, scale, frac) for c in codes]
        assert got.tolist() == want


def test_bridge_to_16bit_codes():
    """A head reading 16-bit activations: the same single rounding, 8 more frac bits, the
    i16 saturation; insert-bridges keeps the width."""
    codes = np.arange(256, dtype=np.uint8).astype(int)
    for frac in (10, 14):
        got = bridge_table(0.037, 3, frac, np.uint8, np.int16)
        assert got.dtype == np.int16
        assert got.tolist() == [_exact_bridge(c, 3, 0.037, frac, 16) for c in codes]
    g = _graph(frac=12, out_dtype="i16")
    rng = np.random.default_rng(2)
    feed = _codes(g, rng)
    before = bevir.run(g, feed)["y"]
    bevir.optimize(g, "insert-bridges,dce")
    bevir.verify(g)
    assert [n.op for n in g.nodes] == ["fx_bridge", "reshape"]
    assert g.outputs["y"].type.dtype is DType.i16
    got = bevir.run(g, feed)["y"]
    assert got.dtype == np.int16 and np.abs(got.astype(int) - before.astype(int)).max() <= 1
    assert np.abs(got).max() > 127                      # beyond what 8 bits hold


def test_bridge_ties_round_up():
    # scale 0.25, frac 1: (code - 0) * 0.5 -> 1 -> 0.5 rounds to 1, -1 -> -0.5 rounds to 0
    t = bridge_table(0.25, 0, 1, np.int8)
    assert t[1] == 1 and t[np.uint8(255)] == 0 and t[3] == 2


def _graph(shape=(2, 4, 3, 5), scale=0.037, zp=3, frac=4, dtype=DType.u8, extra_use=False,
           out_dtype="i8"):
    b = Builder("bridge")
    x = b.input("x", TensorType(shape, dtype, quant=AffineQuant((scale,), (zp,))))
    f = b.dequantize(x)
    t = b.transpose(f, perm=[0, 2, 3, 1])
    r = b.reshape(t, shape=[shape[0], shape[2] * shape[3], shape[1]])
    q = b.fx_quantize(r, out_frac_bits=frac, out_dtype=out_dtype)
    b.output("y", q)
    if extra_use:
        b.output("t", t)
    return b.graph


def _codes(graph, rng):
    t = graph.inputs[0].type
    info = np.iinfo(t.dtype.np)
    return {"x": rng.integers(info.min, info.max + 1, t.shape).astype(t.dtype.np)}


def test_insert_bridges_leaves_one_bridge_and_integer_movement():
    g = _graph()
    rng = np.random.default_rng(1)
    feeds = [_codes(g, rng) for _ in range(3)]
    before = [bevir.run(g, f)["y"] for f in feeds]
    bevir.optimize(g, "insert-bridges,dce")
    bevir.verify(g)
    ops = [n.op for n in g.nodes]
    assert ops == ["fx_bridge", "reshape"]
    assert list(g.nodes[0].attrs["perm"]) == [0, 2, 3, 1]
    y = g.outputs["y"]
    assert y.type.dtype is DType.i8 and y.type.quant == FixedPointQuant((4,))
    for f, ref in zip(feeds, before):
        got = bevir.run(g, f)["y"]
        assert got.shape == ref.shape
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1   # one code at ties at most


def test_bridge_equals_the_exact_formula_on_the_whole_graph():
    x = np.arange(256, dtype=np.uint8).reshape(1, 4, 8, 8)
    g2 = _graph(shape=(1, 4, 8, 8), scale=0.05, zp=128, frac=3)
    bevir.optimize(g2, "insert-bridges,dce")
    y = bevir.run(g2, {"x": x})["y"]
    want = np.array([_exact_bridge(c, 128, 0.05, 3) for c in range(256)]).reshape(1, 4, 8, 8)
    assert np.array_equal(y, want.transpose(0, 2, 3, 1).reshape(1, 64, 4))


def test_a_transpose_read_elsewhere_is_not_hoisted_and_says_why():
    g = _graph(extra_use=True)
    bevir.optimize(g, "insert-bridges,dce")
    assert not any(n.op == "fx_bridge" for n in g.nodes)
    (q,) = [n for n in g.nodes if n.op == "fx_quantize"]
    assert q.inputs[0].producer.op == "transpose"           # the reshape moved above it
    assert "used outside the pattern" in explain(g, "hoist-quantize", q)


def test_per_channel_or_wide_codes_are_declined():
    b = Builder("g")
    x = b.input("x", TensorType((2, 3), DType.i32, quant=AffineQuant((0.1,), (0,))))
    b.output("y", b.fx_quantize(b.dequantize(x), out_frac_bits=2))
    g = b.graph
    assert "not u8/i8" in explain(g, "bridge-dequantize", g.nodes[-1])
    bevir.optimize(g, "insert-bridges")
    assert [n.op for n in g.nodes] == ["dequantize", "fx_quantize"]


def test_fx_quantize_and_dequantize():
    b = Builder("g")
    x = b.input("x", TensorType((6,), DType.f32))
    q = b.fx_quantize(x, out_frac_bits=2)
    b.output("q", q)
    b.output("d", b.fx_dequantize(q))
    x = np.array([0.125, -0.125, 0.3, 100.0, -100.0, np.nan], np.float32)
    out = bevir.run(b.graph, {"x": x})
    assert out["q"].tolist() == [1, 0, 1, 127, -128, -128]     # half up; saturate; NaN -> min
    assert out["d"].tolist() == [0.25, 0.0, 0.25, 31.75, -32.0, -32.0]


def test_bridge_rejects_bad_operands():
    b = Builder("g")
    x = b.input("x", TensorType((2, 3), DType.u8, quant=AffineQuant((0.1, 0.2), (0, 0), 0)))
    with pytest.raises(bevir.VerifyError, match="per-tensor affine"):
        b.fx_bridge(x, out_frac_bits=3)
    y = b.input("y", TensorType((2, 3), DType.u8, quant=AffineQuant((0.1,), (0,))))
    with pytest.raises(bevir.VerifyError, match="not a permutation"):
        b.fx_bridge(y, out_frac_bits=3, perm=[0, 0])
