"""sink-dequantize: data movement, relu and maxpool onto the integers; round trips cancelled."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import Builder, TensorType
from bevir.ir.types import AffineQuant, DType, FixedPointQuant
from bevir.passes import VerifyNumerics

I8_AFFINE = TensorType((2, 4, 6, 6), DType.i8, quant=AffineQuant((0.05,), (3,)))
I8_FIXED = TensorType((2, 4, 6, 6), DType.i8, quant=FixedPointQuant((5,)))


def _codes(seed=0):
    return np.random.default_rng(seed).integers(-128, 128, (2, 4, 6, 6), dtype=np.int8)


def _onnxruntime_style():
    """quantize(maxpool(relu(dequantize(q)))) -> transpose -> fx_quantize, as an INT8
    backbone's symmetric relu and the head's hand-over look after import."""
    b = Builder("ort")
    q = b.input("q", I8_AFFINE)
    x = b.maxpool2d(b.relu(b.dequantize(q)), kernel=[3, 3], strides=[2, 2],
                    pads=[1, 1, 1, 1])
    r = b.quantize(x, dtype="i8", scale=[0.05], zero_point=[3])
    y = b.reshape(b.transpose(b.dequantize(r), perm=[0, 2, 3, 1]), shape=[2, 9, 4])
    b.output("y", b.fx_quantize(y, out_frac_bits=4))
    return b.graph


def _fixed_point():
    """fx_dequantize -> slice / expand / concat / gather -> consumers, as the quantize pass
    leaves the head between its integer ops."""
    b = Builder("fx")
    q = b.input("q", I8_FIXED)
    dq = b.fx_dequantize(q)
    s = b.slice(dq, starts=[0], ends=[3], axes=[3], steps=[1])
    c = b.concat(s, b.slice(dq, starts=[3], ends=[6], axes=[3], steps=[1]), axis=3)
    e = b.expand(b.reshape(c, shape=[2, 1, 144]), shape=[2, 3, 144])
    g = b.gather(e, b.const(np.array([2, 0], np.int64), "idx"), axis=1)
    b.output("g", b.fx_quantize(g, out_frac_bits=5))
    b.output("f", b.relu(dq))                       # another user of the dequantize
    return b.graph


@pytest.mark.parametrize("build, feeds, floats", [
    (_onnxruntime_style, {"q": _codes()}, ["dequantize"]),     # left for insert-bridges
    (_fixed_point, {"q": _codes(1)}, ["fx_dequantize"])])      # the output conversion
def test_moves_onto_integers_exactly(build, feeds, floats):
    g = build()
    want = bevir.run(g, feeds)
    bevir.optimize(g, "sink-dequantize,dce", instruments=[check := VerifyNumerics(feeds)])
    assert check.checks[0].changed and not any(c.failing for c in check.checks)
    bevir.verify(g)
    got = bevir.run(g, feeds)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert "quantize" not in [n.op for n in g.nodes]          # the round trip cancelled
    assert [n.op for n in g.nodes if n.outputs[0].type.dtype is DType.f32] == floats


def test_relu_under_an_affine_dequantize_clips_at_the_zero_point():
    g = _onnxruntime_style()
    bevir.optimize(g, "sink-dequantize,dce")
    clip = next(n for n in g.nodes if n.op == "clip")
    assert clip.attrs["min"] == 3.0 and clip.inputs[0].type.dtype is DType.i8


def test_other_frac_bits_requantize_and_per_channel_stays_float():
    b = Builder("decline")
    q = b.input("q", I8_FIXED)
    w = b.input("w", TensorType((4, 3), DType.i8, quant=AffineQuant((0.1, 0.2, 0.3), (0, 0, 0), 1)))
    b.output("y", b.fx_quantize(b.reshape(b.fx_dequantize(q), shape=[2, 144]), out_frac_bits=6))
    b.output("z", b.transpose(b.dequantize(w), perm=[1, 0]))
    g = b.graph
    feeds = {"q": _codes(2), "w": _codes(3)[0, 0, :4, :3].copy()}
    want = bevir.run(g, feeds)
    bevir.optimize(g, "sink-dequantize,dce")
    ops = [n.op for n in g.nodes]
    assert "fx_requantize" in ops and "fx_quantize" not in ops     # frac bits 5 -> 6
    assert ops[-2:] == ["dequantize", "transpose"]          # per-channel: stays in float
    got = bevir.run(g, feeds)
    assert all(np.array_equal(want[k], got[k]) for k in want)
