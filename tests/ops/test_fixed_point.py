"""bevir's fixed-point ops (bevir/ops/fixed_point.py; the numerics in bevir/ops/numerics.py).

Three kinds of checks per op: exactness against an independent pure-Python (or int64
numpy) reference of the documented integer formulas (np.array_equal); accuracy against
bevir's float op on the dequantized operands, within a bound that follows from the
quantization step (docs/numerics.md ("bevir fixed-point ops")); the verifier rejecting bad types.
"""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import product

import numpy as np
import pytest

import bevir
from bevir import AffineQuant, DType, FixedPointQuant, TensorType
from bevir.errors import InterpreterError, VerifyError
from bevir.ops import get_op
from bevir.ops.common import pool_out_size
from bevir.ops.numerics import (div_table, lut_table, quantize_multiplier, rshift_round,
                                softmax_exp_table)

I8, I16, I32 = DType.i8, DType.i16, DType.i32


# ---- helpers -----------------------------------------------------------------------------
def fx(shape, frac, dtype=I8, axis=None) -> TensorType:
    fr = tuple(frac) if isinstance(frac, (list, tuple)) else (frac,)
    return TensorType(shape, dtype, quant=FixedPointQuant(fr, axis))


def ints(rng, shape, dtype=np.int8, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi + 1, shape, dtype=np.int64).astype(dtype)


def graph(op: str, operands, **attrs) -> bevir.Graph:
    """One node; each operand (array, type) a graph input, or None to omit it."""
    g = bevir.Graph("t")
    vals = [None if o is None else g.add_input(f"in{i}", o[1]) for i, o in enumerate(operands)]
    g.set_output("y", g.create_node(op, vals, attrs, loc="blk/op").outputs[0])
    bevir.verify(g)
    return g


def run(op: str, operands, **attrs) -> np.ndarray:
    g = graph(op, operands, **attrs)
    feeds = {f"in{i}": o[0] for i, o in enumerate(operands) if o is not None}
    return bevir.run(g, feeds)["y"]


def float_op(op: str, *arrays, **attrs) -> np.ndarray:
    """bevir's float op on float32 operands (None omits an operand)."""
    arrays = [None if a is None else np.asarray(a, np.float32) for a in arrays]
    ops = [None if a is None else (a, TensorType.of(a)) for a in arrays]
    return run(op, ops, **attrs)


def deq(q: np.ndarray, frac: int) -> np.ndarray:
    return np.ldexp(q.astype(np.float64), -frac)


def rhu(v: int, s: int) -> int:
    """round_half_up(v / 2**s) in exact rationals (s <= 0: v * 2**-s)."""
    return math.floor(Fraction(v) / Fraction(2) ** s + Fraction(1, 2))


def sat(v: int, bits: int = 8) -> int:
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, v))


def unsaturated(q: np.ndarray) -> np.ndarray:
    return (q > -128) & (q < 127)


# ---- rounding and multipliers ------------------------------------------------------------
def test_rshift_round_is_round_half_up_against_rationals():
    rng = np.random.default_rng(1)
    v = np.concatenate([ints(rng, 4000, np.int32).astype(np.int64),
                        np.array([-5, -3, -2, -1, 0, 1, 2, 3, 5, 2**31 - 1, -2**31])])
    for s in (-7, -1, 0, 1, 2, 5, 13, 31, 40):
        got = rshift_round(v, s)
        assert got.tolist() == [rhu(int(a), s) for a in v]
    # a shift per element (per channel, per row) takes the broadcasting path
    shifts = rng.integers(-7, 41, v.shape)
    assert rshift_round(v, shifts).tolist() == [rhu(int(a), int(s)) for a, s in zip(v, shifts)]
    # ties go toward +inf: 2.5 -> 3, -2.5 -> -2, -0.5 -> 0
    assert rshift_round(np.array([5, -5, -1, 3]), 1).tolist() == [3, -2, 0, 2]
    assert int(rshift_round(-5, 1)) == -2 and np.shape(rshift_round(np.int64(7), 2)) == ()


@pytest.mark.parametrize("ratio", [1.0, 0.75, 1 / 3, 2**-20 * 0.9, 12345.678, 1 - 2**-40,
                                   2**-31 * 1.5, 0.5 - 2**-45])
def test_quantize_multiplier_normalized_and_close(ratio):
    m, n = quantize_multiplier(ratio)
    assert 2**30 <= m < 2**31
    # m = round(ratio * 2**n): off by at most half a unit of the 31-bit mantissa
    assert abs(Fraction(m) - Fraction(ratio) * 2**n) <= Fraction(1, 2)


# ---- fx_requantize -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype,f_in,f_out", [(I32, 12, 5), (I32, 3, 7), (I16, 9, 2),
                                              (I8, 6, 6), (I8, 2, 4), (I32, 20, -2)])
def test_requantize_shift_matches_python(dtype, f_in, f_out):
    rng = np.random.default_rng(f_in * 31 + f_out)
    x = ints(rng, (8, 64), dtype.np)
    s = f_in - f_out
    if s > 0:   # exact ties k + 1/2 on both signs
        x[0, :10] = (np.arange(-5, 5) * 2 + 1) << (s - 1)
    y = run("fx_requantize", [(x, fx(x.shape, f_in, dtype))], out_frac_bits=f_out)
    assert y.dtype == np.int8
    assert y.ravel().tolist() == [sat(rhu(int(v), s)) for v in x.ravel()]
    assert (y == 127).any() or (y == -128).any() or s <= 0


def test_requantize_per_channel_input():
    rng = np.random.default_rng(2)
    x = ints(rng, (5, 4), np.int32, -2**20, 2**20)
    fr = [10, 12, 14, 16]
    y = run("fx_requantize", [(x, fx(x.shape, fr, I32, axis=1))], out_frac_bits=4)
    ref = [[sat(rhu(int(x[i, j]), fr[j] - 4)) for j in range(4)] for i in range(5)]
    assert y.tolist() == ref


def test_requantize_multiplier_matches_python_and_real_value():
    rng = np.random.default_rng(3)
    x = ints(rng, (4, 3), np.int32, -2**24, 2**24)
    scales = (0.0173, 3.1e-4, 0.0051)
    t = TensorType(x.shape, I32, quant=AffineQuant(scales, (0, 0, 0), axis=1))
    y = run("fx_requantize", [(x, t)], out_frac_bits=3)
    for j, s in enumerate(t.quant.scale):
        m, n = quantize_multiplier(math.ldexp(s, 3))
        assert y[:, j].tolist() == [sat(rhu(int(v) * m, n)) for v in x[:, j]]
        real = x[:, j] * s * 8
        ok = np.abs(real) < 127
        assert np.all(np.abs(y[ok, j] - real[ok]) <= 0.5 + 1e-6)


# ---- products: fx_matmul, fx_linear, fx_conv2d -------------------------------------------
def product_ref(acc: np.ndarray, bias, shifts, mults, axis: int) -> np.ndarray:
    """Python-int requantization of an int64 accumulator, per channel on ``axis``."""
    acc = np.moveaxis(acc, axis, -1)
    out = np.empty(acc.shape, np.int64)
    for idx in np.ndindex(acc.shape):
        ch = idx[-1]
        a = int(acc[idx]) + (0 if bias is None else int(bias[ch]))
        a = max(-2**31, min(2**31 - 1, a))
        out[idx] = sat(rhu(a * mults[ch % len(mults)], shifts[ch % len(shifts)]))
    return np.moveaxis(out, -1, axis).astype(np.int8)


@pytest.mark.parametrize("case", ["per_tensor", "per_column", "affine", "batched", "vector"])
def test_matmul_exact_against_int64_einsum(case):
    rng = np.random.default_rng(len(case))
    fa, fy = 5, 3
    a_shape, b_shape = {"batched": ((2, 3, 7, 40), (3, 40, 6)), "vector": ((40,), (40, 6))
                        }.get(case, ((7, 40), (40, 6)))
    a, b = ints(rng, a_shape), ints(rng, b_shape)
    n = b_shape[-1]
    bias = ints(rng, n, np.int32, -3000, 3000)
    if case == "affine":
        scales = tuple(float(s) for s in rng.uniform(0.002, 0.02, n))
        bt = TensorType(b.shape, I8, quant=AffineQuant(scales, (0,) * n, axis=1))
        pairs = [quantize_multiplier(math.ldexp(s, fy - fa)) for s in bt.quant.scale]
        shifts, mults = [nn for _, nn in pairs], [m for m, _ in pairs]
    else:
        fb = [6] if case != "per_column" else list(rng.integers(4, 9, n))
        bt = fx(b.shape, fb, axis=1 if case == "per_column" else None)
        shifts, mults = [fa + f - fy for f in fb], [1]
    y = run("fx_matmul", [(a, fx(a.shape, fa)), (b, bt), (bias, TensorType((n,), I32))],
            out_frac_bits=fy)
    acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
    assert np.array_equal(y, product_ref(acc, bias, shifts, mults, acc.ndim - 1))


def test_matmul_long_reduction_needs_the_split():
    """K = 3000 of (-128)*(-128): the sum 3000 * 2**14 is far beyond float32's 2**24."""
    k = 3000
    a = np.full((2, k), -128, np.int8)
    b = np.full((k, 3), -128, np.int8)
    b[::7, 1] = 127
    y = run("fx_matmul", [(a, fx(a.shape, 0)), (b, fx(b.shape, 0))], out_frac_bits=-18)
    acc = np.einsum("mk,kn->mn", a.astype(np.int64), b.astype(np.int64))
    assert np.array_equal(y, product_ref(acc, None, [18], [1], 1))
    assert acc.max() > 2**24


def test_linear_equals_matmul_of_transposed_weight_with_per_channel_shifts():
    rng = np.random.default_rng(4)
    x, w = ints(rng, (2, 5, 48)), ints(rng, (10, 48))
    bias = ints(rng, 10, np.int32, -2**12, 2**12)
    fw = list(rng.integers(5, 9, 10))
    xt = fx(x.shape, 4)
    bt = TensorType((10,), I32, quant=FixedPointQuant(tuple(4 + f for f in fw), 0))
    y = run("fx_linear", [(x, xt), (w, fx(w.shape, fw, axis=0)), (bias, bt)], out_frac_bits=2)
    y2 = run("fx_matmul", [(x, xt), (w.T.copy(), fx((48, 10), fw, axis=1)), (bias, bt)],
             out_frac_bits=2)
    acc = np.einsum("bqk,nk->bqn", x.astype(np.int64), w.astype(np.int64))
    assert np.array_equal(y, y2)
    assert np.array_equal(y, product_ref(acc, bias, [4 + f - 2 for f in fw], [1], 2))


def conv_ref(x, w, stride, pad, groups):
    """Direct int64 NCHW convolution loops."""
    n, ch, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                rows, cols = slice(i * stride, i * stride + kh), slice(j * stride, j * stride + kw)
                win = xp[:, g * cg:(g + 1) * cg, rows, cols]
                out[:, oc, i, j] = (win * w[oc].astype(np.int64)).sum((1, 2, 3))
    return out


@pytest.mark.parametrize("channels,groups,stride", [(3, 1, 1), (20, 1, 2), (8, 4, 1)])
def test_conv2d_exact_in_both_layouts(channels, groups, stride):
    rng = np.random.default_rng(channels)
    x = ints(rng, (2, channels, 7, 6))
    w = ints(rng, (8, channels // groups, 3, 3))
    bias = ints(rng, 8, np.int32, -2**10, 2**10)
    fw = list(rng.integers(5, 8, 8))
    attrs = dict(strides=(stride, stride), pads=(1, 1, 1, 1), groups=groups, out_frac_bits=1)
    wt, bt = fx(w.shape, fw, axis=0), TensorType((8,), I32)
    y = run("fx_conv2d", [(x, fx(x.shape, 3)), (w, wt), (bias, bt)], **attrs)
    ref = product_ref(conv_ref(x, w, stride, 1, groups), bias, [3 + f - 1 for f in fw], [1], 1)
    assert np.array_equal(y, ref)
    xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xt = TensorType(xh.shape, I8, bevir.Layout.nhwc, FixedPointQuant((3,)))
    yh = run("fx_conv2d", [(xh, xt), (w, wt), (bias, bt)], **attrs)
    assert np.array_equal(yh, ref.transpose(0, 2, 3, 1))


def test_linear_accuracy_against_float_matmul():
    """Shift path: error <= half an output step; multiplier path adds < 2**-29 relative."""
    rng = np.random.default_rng(5)
    x, w = ints(rng, (64, 256)), ints(rng, (32, 256), lo=-40, hi=40)
    fxb, fw, fy = 6, 8, 4
    y = run("fx_linear", [(x, fx(x.shape, fxb)), (w, fx(w.shape, fw))], out_frac_bits=fy)
    ref = float_op("matmul", deq(x, fxb), deq(w, fw).T)
    ok = unsaturated(y)
    assert ok.mean() > 0.9
    assert np.abs(deq(y, fy) - ref)[ok].max() <= 2.0 ** -(fy + 1) + 1e-6
    scales = tuple(float(s) for s in rng.uniform(0.001, 0.004, 32))
    wa = TensorType(w.shape, I8, quant=AffineQuant(scales, (0,) * 32, axis=0))
    ya = run("fx_linear", [(x, fx(x.shape, fxb)), (w, wa)], out_frac_bits=fy)
    refa = deq(x, fxb) @ (w * np.asarray(wa.quant.scale)[:, None]).T
    ok = unsaturated(ya)
    assert np.abs(deq(ya, fy) - refa)[ok].max() <= 2.0 ** -(fy + 1) * (1 + 2**-28)


def test_product_macs():
    rng = np.random.default_rng(6)
    x, w = ints(rng, (3, 5, 16)), ints(rng, (8, 16))
    g = graph("fx_linear", [(x, fx(x.shape, 4)), (w, fx(w.shape, 6))], out_frac_bits=3)
    assert g.nodes[0].opdef.cost(g.nodes[0])["macs"] == 3 * 5 * 8 * 16


# ---- elementwise -------------------------------------------------------------------------
def all_pairs():
    codes = np.arange(-128, 128, dtype=np.int8)
    return np.repeat(codes, 256).reshape(256, 256), np.tile(codes, 256).reshape(256, 256)


@pytest.mark.parametrize("op,sign", [("fx_add", 1), ("fx_sub", -1)])
@pytest.mark.parametrize("fa,fb,fy", [(4, 4, 4), (6, 3, 5), (2, 7, 1), (5, 5, 7)])
def test_add_sub_exhaustive(op, sign, fa, fb, fy):
    a, b = all_pairs()
    y = run(op, [(a, fx(a.shape, fa)), (b, fx(b.shape, fb))], out_frac_bits=fy)
    f = max(fa, fb)
    ref = np.array([sat(rhu((int(p) << (f - fa)) + sign * (int(q) << (f - fb)), f - fy))
                    for p, q in zip(a.ravel(), b.ravel())]).reshape(a.shape)
    assert np.array_equal(y, ref)
    real = deq(a, fa) + sign * deq(b, fb)
    ok = unsaturated(y)
    assert np.abs(deq(y, fy) - real)[ok].max() <= 2.0 ** -(fy + 1)


def test_add_broadcasts():
    rng = np.random.default_rng(7)
    a, b = ints(rng, (3, 1, 5)), ints(rng, (4, 1))
    y = run("fx_add", [(a, fx(a.shape, 3)), (b, fx(b.shape, 3))], out_frac_bits=2)
    assert y.shape == (3, 4, 5)
    assert np.array_equal(y, np.clip(rshift_round(a.astype(np.int64) + b, 1), -128, 127))


@pytest.mark.parametrize("fa,fb,fy,bdtype", [(5, 7, 5, I8), (3, 3, 6, I8), (6, 14, 4, I16)])
def test_mul_exhaustive_and_by_constant(fa, fb, fy, bdtype):
    a, b = all_pairs()
    if bdtype is I16:
        b = (b.astype(np.int16) * 211).astype(np.int16)
    y = run("fx_mul", [(a, fx(a.shape, fa)), (b, fx(b.shape, fb, bdtype))], out_frac_bits=fy)
    ref = np.array([sat(rhu(int(p) * int(q), fa + fb - fy)) for p, q in
                    zip(a.ravel(), b.ravel())]).reshape(a.shape)
    assert np.array_equal(y, ref)
    ok = unsaturated(y)
    assert np.abs(deq(y, fy) - deq(a, fa) * deq(b, fb))[ok].max() <= 2.0 ** -(fy + 1)


def test_mul_by_constant_in_a_graph():
    b = bevir.Builder("g")
    x = b.input("x", fx((4,), 4))
    half = b.const(np.array(64, np.int8), "half", fx((), 7))
    b.output("y", b.fx_mul(x, half, out_frac_bits=4))
    y = bevir.run(b.graph, {"x": np.array([3, -3, 7, -128], np.int8)})["y"]
    assert y.tolist() == [2, -1, 4, -64]       # 1.5 -> 2, -1.5 -> -1 (half up)


@pytest.mark.parametrize("dtype,f_in,f_out,max_count", [(I8, 4, 4, 6), (I8, 7, 3, 255),
                                                        (I16, 6, 4, 6), (I8, 2, 6, 6),
                                                        (I32, 10, 5, 6)])
def test_div_is_exactly_rounded(dtype, f_in, f_out, max_count):
    rng = np.random.default_rng(max_count + f_in)
    if dtype is I8:
        x = np.repeat(np.arange(-128, 128, dtype=np.int8)[:, None], max_count + 1, 1)
    else:
        x = ints(rng, (512, max_count + 1), dtype.np)
        x[:, :] = np.where(rng.random(x.shape) < 0.5, x, x >> 12)    # also small values
    counts = np.tile(np.arange(0, max_count + 1, dtype=np.int32), (x.shape[0], 1))
    y = run("fx_div", [(x, fx(x.shape, f_in, dtype)), (counts, TensorType.of(counts))],
            out_frac_bits=f_out, max_count=max_count)
    t = f_out - f_in
    ref = [[sat(math.floor(Fraction(int(v) * 2**t) / max(int(d), 1) + Fraction(1, 2)))
            for v, d in zip(row, crow)] for row, crow in zip(x, counts)]
    assert y.tolist() == ref


def test_div_table_and_limits():
    m_pos, m_neg, s = div_table(6, 0)
    assert s == (258 * 36).bit_length()
    assert [m_pos[d] * d >= 2**s >= m_neg[d] * d for d in range(1, 7)] == [True] * 6
    assert m_pos[4] == m_neg[4] == 2**s // 4
    x = np.array([1, 2], np.int8)
    with pytest.raises(InterpreterError, match="exceeds max_count 6") as e:
        run("fx_div", [(x, fx((2,), 4)), (np.array([3, 7], np.int32), TensorType((2,), I32))],
            out_frac_bits=4, max_count=6)
    assert e.value.op == "fx_div" and e.value.loc == "blk/op"


@pytest.mark.parametrize("fy", [None, 3, 6])
def test_relu(fy):
    x = np.arange(-128, 128, dtype=np.int8)
    attrs = {} if fy is None else {"out_frac_bits": fy}
    y = run("fx_relu", [(x, fx(x.shape, 5))], **attrs)
    f = 5 if fy is None else fy
    assert y.tolist() == [sat(rhu(max(int(v), 0), 5 - f)) for v in x]


# ---- lookup tables -----------------------------------------------------------------------
def _gelu(v):
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def _inv_sigmoid(v, eps=1e-5):
    v = min(max(v, 0.0), 1.0)
    return math.log(max(v, eps) / max(1 - v, eps))


# op, in frac, out frac, python reference, bevir float op (or None), extra attrs
LUTS = [("fx_sigmoid", 4, 7, lambda v: 1 / (1 + math.exp(-v)), "sigmoid", {}),
        ("fx_sigmoid", 6, 7, lambda v: 1 / (1 + math.exp(-v)), "sigmoid", {}),
        ("fx_exp", 5, 3, math.exp, "exp", {}),
        ("fx_log", 7, 4, lambda v: math.log(v) if v > 0 else -math.inf, "log", {}),
        ("fx_inverse_sigmoid", 7, 4, _inv_sigmoid, None, {}),
        ("fx_inverse_sigmoid", 7, 5, lambda v: _inv_sigmoid(v, 0.01), None, {"eps": 0.01}),
        ("fx_gelu", 5, 5, _gelu, "gelu", {}),
        ("fx_gelu", 4, 6, lambda v: 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (
            v + 0.044715 * v ** 3))), "gelu", {"approximate": "tanh"}),
        ("fx_silu", 4, 5, lambda v: v / (1 + math.exp(-v)), "silu", {}),
        ("fx_hardswish", 4, 4, lambda v: v * min(max(v / 6 + 0.5, 0.0), 1.0), "hardswish", {}),
        ("fx_hardsigmoid", 3, 7, lambda v: min(max(v / 6 + 0.5, 0.0), 1.0), "hardsigmoid",
         {"alpha": 1 / 6, "beta": 0.5}),
        ("fx_tanh", 5, 7, math.tanh, "tanh", {}),
        ("fx_sqrt", 4, 5, lambda v: math.sqrt(v) if v >= 0 else -math.inf, "sqrt", {}),
        ("fx_reciprocal", 4, 3, lambda v: 1 / v if v else math.inf, "reciprocal", {})]


@pytest.mark.parametrize("op,fin,fout,ref,_f,attrs", LUTS, ids=lambda v: str(v)[:20])
def test_lut_table_entries(op, fin, fout, ref, _f, attrs):
    """Entry i: the code i - 128, f in float64, round half up, saturated."""
    table = lut_table(op, fin, fout, **attrs)
    want = []
    for code in range(-128, 128):
        v = ref(math.ldexp(code, -fin)) * 2**fout
        want.append(sat(math.floor(v + 0.5)) if math.isfinite(v) else (127 if v > 0 else -128))
    assert table.dtype == np.int8 and table.tolist() == want
    assert lut_table(op, fin, fout, **attrs) is table and not table.flags.writeable
    x = np.arange(-128, 128, dtype=np.int8)[::-1].copy()
    assert np.array_equal(run(op, [(x, fx(x.shape, fin))], out_frac_bits=fout, **attrs),
                          table[x.astype(int) + 128])


@pytest.mark.parametrize("op,fin,fout,_r,fop,attrs", [c for c in LUTS if c[4]],
                         ids=lambda v: str(v)[:20])
def test_lut_accuracy_against_float_op(op, fin, fout, _r, fop, attrs):
    """Half an output step, plus float32 error of the float op, where not saturated."""
    x = np.arange(-128, 128, dtype=np.int8)
    real = deq(x, fin)
    keep = real > 0 if op == "fx_log" else np.ones(256, bool)
    y = run(op, [(x, fx(x.shape, fin))], out_frac_bits=fout, **attrs)
    ref = float_op(fop, real[keep], **attrs).astype(np.float64)
    step = 2.0**-fout
    inside = (ref <= 127.5 * step) & (ref >= -128.5 * step)
    err = np.abs(deq(y[keep], fout) - ref)
    assert err[inside].max() <= step / 2 + 1e-6
    # beyond the range: saturated
    assert np.array_equal(y[keep][~inside], np.where(ref[~inside] > 0, 127, -128))


# ---- softmax -----------------------------------------------------------------------------
def softmax_ref(row, fin, fy):
    table = [math.floor(math.exp(-k * 2.0**-fin) * 2**15 + 0.5) for k in range(256)]
    m = max(int(v) for v in row)
    e = [table[m - int(v)] for v in row]
    r = 2**46 // sum(e)
    return [min(127, rhu(v * r, 46 - fy)) for v in e]


@pytest.mark.parametrize("fin,n,fy", [(4, 4, 7), (3, 8, 7), (5, 32, 7), (2, 900, 7), (4, 8, 5)])
def test_softmax_exact_and_accurate(fin, n, fy):
    rng = np.random.default_rng(n)
    x = ints(rng, (40, n))
    x[0] = 0
    x[1, :] = -128
    x[1, 0] = 127                        # one dominant element: 127/128 after saturation
    y = run("fx_softmax", [(x, fx(x.shape, fin))], out_frac_bits=fy)
    assert y.tolist() == [softmax_ref(r, fin, fy) for r in x]
    err = np.abs(deq(y, fy) - float_op("softmax", deq(x, fin)))
    # 2**-(fy+1) final rounding + (n+1) * 2**-16 from the exp table; 2**-7 caps at 1.0
    assert err.max() <= max(2.0 ** -(fy + 1) + (n + 1) * 2.0**-16, 2.0 ** -fy)
    assert err.max() <= 2.0**-6


def test_softmax_other_axis_and_table():
    rng = np.random.default_rng(8)
    x = ints(rng, (3, 6, 2))
    y = run("fx_softmax", [(x, fx(x.shape, 4))], axis=1)
    ref = np.moveaxis(np.array([[softmax_ref(x[i, :, j], 4, 7) for j in range(2)]
                                for i in range(3)]), 2, 1)
    assert np.array_equal(y, ref)
    t = softmax_exp_table(4)
    assert t[0] == 2**15 and np.all(np.diff(t) <= 0) and not t.flags.writeable


# ---- layer norm --------------------------------------------------------------------------
def layer_norm_ref(row, fx_, eps, g, fg, b, fb, fy, bits=8):
    """The documented integer layer norm in Python ints, one row, saturated to ``bits``."""
    c = len(row)
    xs = [int(v) for v in row]
    s = sum(xs)
    d = [c * v - s for v in xs]
    n = sum(v * v for v in d) + max(1, math.floor(eps * 4.0**fx_ * c**3 + 0.5))
    k = (61 + n.bit_length() - c.bit_length()) // 2
    r = math.isqrt((c << (2 * k)) // n)
    assert 2**29 <= r < 2**31
    out = []
    for i, v in enumerate(d):
        z = rhu(v * r, k - 16)
        acc = z * (1 if g is None else int(g[i]))
        acc += 0 if b is None else int(b[i]) << (16 + fg - fb)
        out.append(sat(rhu(acc, 16 + fg - fy), bits))
    return out


@pytest.mark.parametrize("c,fx_,fy,affine", [(16, 4, 5, True), (256, 5, 4, True),
                                             (64, 3, 5, False), (512, 6, 4, True)])
def test_layer_norm_exact_and_accurate(c, fx_, fy, affine):
    rng = np.random.default_rng(c)
    x = ints(rng, (12, c), lo=-90, hi=90)
    x[0] = 17                                    # a constant row: only epsilon remains
    x[1] = np.where(np.arange(c) % 2 == 0, -128, 127).astype(np.int8)
    g = ints(rng, c, np.int16, 2**11, 2**13) if affine else None
    b = ints(rng, c, np.int8, -60, 60) if affine else None
    fg, fb = 12, 6
    ops = [(x, fx(x.shape, fx_)),
           None if g is None else (g, fx((c,), fg, I16)),
           None if b is None else (b, fx((c,), fb))]
    y = run("fx_layer_norm", ops, out_frac_bits=fy, epsilon=1e-5)
    ref = [layer_norm_ref(r, fx_, 1e-5, g, fg if affine else 0, b, fb, fy) for r in x]
    assert y.tolist() == ref
    fl = float_op("layer_norm", deq(x, fx_), None if g is None else deq(g, fg),
                  None if b is None else deq(b, fb), epsilon=1e-5)
    ok = unsaturated(y)
    assert ok.mean() > 0.95
    # half an output step + Q16 rounding of the normalized value times |gamma| (< 2)
    assert np.abs(deq(y, fy) - fl)[ok].max() <= 2.0 ** -(fy + 1) + 2.0**-14


def test_layer_norm_bias_only():
    rng = np.random.default_rng(9)
    x, b = ints(rng, (3, 32)), ints(rng, 32, np.int32, -2**10, 2**10)
    y = run("fx_layer_norm", [(x, fx(x.shape, 4)), None, (b, fx((32,), 8, I32))], out_frac_bits=4)
    assert y.tolist() == [layer_norm_ref(r, 4, 1e-5, None, 0, b, 8, 4) for r in x]


# ---- deformable attention ----------------------------------------------------------------
def deform_ref(value, shapes, loc, aw, fl, fv, fa, fy, bits, coords):
    """Per-sample Python loops of the documented fx_ms_deform_attn formulas."""
    bs, _, heads, d = value.shape
    _, nq, _, levels, points, _ = loc.shape
    out = np.zeros((bs, nq, heads * d), np.int64)
    for b_, q, h in np.ndindex(bs, nq, heads):
        acc = [0] * d
        start = 0
        for lvl in range(levels):
            hh, ww = shapes[2 * lvl], shapes[2 * lvl + 1]
            for p in range(points):
                pix = []
                for axis, size in ((0, ww), (1, hh)):
                    v = int(loc[b_, q, h, lvl, p, axis])
                    v = v * size - 2 ** (fl - 1) if coords == "normalized" else v
                    pix.append(rhu(v, fl - bits))
                ux, uy = pix[0] % 2**bits, pix[1] % 2**bits
                x0, y0 = pix[0] // 2**bits, pix[1] // 2**bits
                for xi, wx in ((x0, 2**bits - ux), (x0 + 1, ux)):
                    for yi, wy in ((y0, 2**bits - uy), (y0 + 1, uy)):
                        if 0 <= xi < ww and 0 <= yi < hh:
                            cw = rhu(int(aw[b_, q, h, lvl, p]) * wx * wy, bits)
                            for k in range(d):
                                acc[k] += int(value[b_, start + yi * ww + xi, h, k]) * cw
            start += hh * ww
        out[b_, q, h * d:(h + 1) * d] = [sat(rhu(a, fv + fa + bits - fy)) for a in acc]
    return out.astype(np.int8)


def deform_case(rng, bs=2, nq=5, heads=2, shapes=(3, 4, 2, 3), points=3, d=4, fl=12):
    levels = len(shapes) // 2
    nv = sum(shapes[i] * shapes[i + 1] for i in range(0, len(shapes), 2))
    value = ints(rng, (bs, nv, heads, d))
    loc = rng.uniform(-0.2, 1.2, (bs, nq, heads, levels, points, 2))
    loc_q = np.floor(loc * 2**fl).astype(np.int16)
    aw = rng.uniform(0, 1, (bs, nq, heads, levels * points))
    aw = aw / aw.sum(-1, keepdims=True)
    aw_q = np.floor(aw * 127 + 0.5).astype(np.int8).reshape(bs, nq, heads, levels, points)
    return value, loc_q, aw_q


def deform_ops(value, loc_q, aw_q, fv, fl, fa, ldtype=I16):
    return [(value, fx(value.shape, fv)), (loc_q, fx(loc_q.shape, fl, ldtype)),
            (aw_q, fx(aw_q.shape, fa))]


@pytest.mark.parametrize("coords,bits", [("normalized", 8), ("normalized", 4), ("pixel", 8)])
def test_ms_deform_attn_exact(coords, bits):
    rng = np.random.default_rng(bits)
    shapes, fl = (3, 4, 2, 3), 12
    value, loc_q, aw_q = deform_case(rng, shapes=shapes, fl=fl)
    if coords == "pixel":       # pixel coordinates with 6 fraction bits (fewer than B)
        fl = 6
        loc_q = rng.integers(-2 * 2**6, 5 * 2**6, loc_q.shape).astype(np.int16)
    y = run("fx_ms_deform_attn", deform_ops(value, loc_q, aw_q, 6, fl, 7),
            spatial_shapes=shapes, out_frac_bits=5, weight_bits=bits, coordinates=coords)
    assert np.array_equal(y, deform_ref(value, shapes, loc_q, aw_q, fl, 6, 7, 5, bits, coords))


def test_ms_deform_attn_accuracy_against_float():
    """Float op on the dequantized operands: max error <= half an output step + location
    rounding (2**-(B+1) px, Lipschitz 2*max|v| per axis) + corner-weight rounding."""
    rng = np.random.default_rng(10)
    shapes, fl, fv, fa, fy, bits = (15, 25), 14, 7, 7, 7, 8
    value, loc_q, aw_q = deform_case(rng, bs=6, nq=50, heads=8, shapes=shapes, points=8,
                                     d=8, fl=fl)
    # features as a feature map has them: a level per channel, smooth variation, noise
    yy, xx = np.divmod(np.arange(15 * 25), 25)
    wave = np.sin(xx / 4.0)[:, None, None] * np.cos(yy[:, None] / 3.0 + np.arange(8))[:, :, None]
    level = rng.uniform(-70, 70, (8, 8))
    value = np.clip(np.floor(level + 40 * wave + rng.uniform(-8, 8, (6,) + value.shape[1:]) + 0.5),
                    -128, 127).astype(np.int8)
    y = run("fx_ms_deform_attn", deform_ops(value, loc_q, aw_q, fv, fl, fa),
            spatial_shapes=shapes, out_frac_bits=fy)
    ref = float_op("ms_deform_attn", deq(value, fv), deq(loc_q, fl), deq(aw_q, fa),
                   spatial_shapes=shapes).astype(np.float64)
    vmax = np.abs(deq(value, fv)).max()
    a_sum = np.abs(deq(aw_q, fa)).sum(-1).max()
    samples = aw_q.shape[-1]
    bound = (2.0 ** -(fy + 1) + a_sum * 2 * vmax * 2 * 2.0 ** -(bits + 1)
             + samples * 4 * vmax * 2.0 ** -(fa + bits + 1))
    err = np.abs(deq(y, fy) - ref)
    assert err.max() <= bound
    assert np.linalg.norm(err) / np.linalg.norm(ref) < 0.02


def test_ms_deform_attn_far_outside_is_zero_and_macs():
    rng = np.random.default_rng(11)
    value, loc_q, aw_q = deform_case(rng)
    loc_q[...] = 3 * 2**12                         # x = y = 3.0: far right/below
    g = graph("fx_ms_deform_attn", deform_ops(value, loc_q, aw_q, 6, 12, 7),
              spatial_shapes=(3, 4, 2, 3), out_frac_bits=5)
    y = bevir.run(g, {"in0": value, "in1": loc_q, "in2": aw_q})["y"]
    assert not y.any()
    assert g.nodes[0].opdef.cost(g.nodes[0])["macs"] == aw_q.size * value.shape[3] * 4


# ---- determinism and the text format -----------------------------------------------------
def encoder_like_graph(rng) -> bevir.Graph:
    b = bevir.Builder("blk")
    x = b.input("x", fx((10, 32), 5))
    w = b.const(ints(rng, (32, 32)), "w", fx((32, 32), [7] * 32, axis=0))
    bias = b.const(ints(rng, 32, np.int32, -500, 500), "b")
    g = b.const(ints(rng, 32, np.int8, 60, 127), "g", fx((32,), 7))
    with b.loc("layer0"):
        h = b.fx_linear(x, w, bias, out_frac_bits=4)
        h = b.fx_add(h, x, out_frac_bits=4)
        h = b.fx_layer_norm(h, g, out_frac_bits=5)
        s = b.fx_softmax(b.fx_gelu(h, out_frac_bits=5))
    b.output("h", h)
    b.output("s", s)
    return b.graph


def test_bit_identical_across_runs_and_after_parse():
    rng = np.random.default_rng(12)
    g = encoder_like_graph(rng)
    bevir.verify(g)
    x = {"x": ints(rng, (10, 32))}
    r1, r2 = bevir.run(g, x), bevir.run(g, x)
    text = str(g)
    assert "fx_layer_norm" in text and "fixed<frac_bits=5>" in text
    r3 = bevir.run(bevir.parse(text), x)
    for k in r1:
        assert np.array_equal(r1[k], r2[k]) and np.array_equal(r1[k], r3[k])


# ---- verifier errors ---------------------------------------------------------------------
A8 = np.zeros((2, 4), np.int8)
PLAIN_I8 = TensorType((2, 4), I8)
F32 = TensorType((2, 4), DType.f32)
AFF = TensorType((2, 4), I8, quant=AffineQuant((0.1,), (0,)))
W = fx((3, 4), 6)

BAD = [
    ("fx_linear", [PLAIN_I8, W], {"out_frac_bits": 3}, "x must carry fixed-point"),
    ("fx_linear", [F32, W], {"out_frac_bits": 3}, "x must be i8"),
    ("fx_linear", [AFF, W], {"out_frac_bits": 3}, "x must carry fixed-point"),
    ("fx_linear", [fx((2, 4), 5, I32), W], {"out_frac_bits": 3}, "x must be i8/i16"),
    ("fx_linear", [fx((2, 4), 5), fx((3, 4), 6, I16)], {"out_frac_bits": 3}, "w must be i8"),
    ("fx_relu", [fx((2, 4), 5, I32)], {}, "x must be i8/i16"),
    ("fx_sigmoid", [fx((2, 4), 5, I32)], {"out_frac_bits": 7}, "x must be i8/i16"),
    ("fx_linear", [fx((2, 4), 5), fx((3, 4), [6, 6], axis=1)], {"out_frac_bits": 3},
     "per tensor or per channel on axis 0"),
    ("fx_linear", [fx((2, 4), 5), TensorType((3, 4), I8, quant=AffineQuant((0.1,), (3,)))],
     {"out_frac_bits": 3}, "symmetric"),
    ("fx_linear", [fx((2, 4), 5), W, TensorType((3,), I32, quant=FixedPointQuant((12,)))],
     {"out_frac_bits": 3}, "bias quantization"),
    ("fx_linear", [fx((2, 4), 5), W, TensorType((3,), DType.i64)], {"out_frac_bits": 3},
     "bias must be i32"),
    ("fx_linear", [fx((2, 4), 5), W], {"out_frac_bits": 40}, "out_frac_bits 40"),
    ("fx_linear", [fx((2, 4), 30), fx((3, 4), 30)], {"out_frac_bits": -10}, "outside [-31, 62]"),
    ("fx_linear", [fx((2, 4), [5, 5, 5, 5], axis=1), W],
     {"out_frac_bits": 3}, "x must be quantized per tensor"),
    ("fx_matmul", [fx((2, 4), 5), fx((5, 3), 6)], {"out_frac_bits": 3}, "inner dimensions"),
    ("fx_add", [fx((2, 4), 5), PLAIN_I8], {"out_frac_bits": 3}, "b must carry fixed-point"),
    ("fx_add", [fx((2, 4), 5), fx((3, 4), 5)], {"out_frac_bits": 3}, "do not broadcast"),
    ("fx_mul", [fx((2, 4), 5), fx((2, 4), 5, I32)], {"out_frac_bits": 3}, "b must be i8/i16"),
    ("fx_requantize", [TensorType((2, 4), I32)], {"out_frac_bits": 3}, "must carry quantization"),
    ("fx_div", [fx((2, 4), 5), fx((2, 4), 0)], {"out_frac_bits": 3},
     "count must be an unquantized"),
    ("fx_requantize", [TensorType((2, 4), I32, quant=AffineQuant((0.1,), (5,)))],
     {"out_frac_bits": 3}, "symmetric"),
    ("fx_div", [fx((2, 4), -20), TensorType((2, 4), I32)], {"out_frac_bits": 20},
     "shift out of range"),
    ("fx_softmax", [fx((2, 4), 5)], {"out_frac_bits": 8}, "out_frac_bits 8 outside [1, 7]"),
    ("fx_layer_norm", [fx((2, 4), 5)], {"out_frac_bits": 4, "epsilon": 0.0}, "epsilon 0.0"),
    ("fx_sigmoid", [TensorType((2, 4), DType.u8, quant=FixedPointQuant((4,)))],
     {"out_frac_bits": 7}, "x must be i8"),
    ("fx_layer_norm", [fx((2, 4), 5), fx((3,), 7)], {"out_frac_bits": 4}, "scale must be [4]"),
    ("fx_layer_norm", [fx((2, 4), 5), fx((4,), 7), fx((4,), 30)], {"out_frac_bits": 4},
     "cannot be aligned"),
    ("fx_ms_deform_attn", [fx((1, 6, 2, 4), 6), fx((1, 3, 2, 1, 4, 2), 12, I8),
                           fx((1, 3, 2, 1, 4), 7)],
     {"out_frac_bits": 5, "spatial_shapes": (2, 3)}, "sampling_locations must be i16/i32"),
    ("fx_ms_deform_attn", [fx((1, 6, 2, 4), 6), fx((1, 3, 2, 1, 4, 2), 12, I16),
                           fx((1, 3, 2, 1, 4), 7)],
     {"out_frac_bits": 5, "spatial_shapes": (2, 2)}, "spatial_shapes"),
    ("fx_ms_deform_attn", [fx((1, 6, 2, 4), 6), fx((1, 3, 2, 1, 600, 2), 12, I16),
                           fx((1, 3, 2, 1, 600), 7)],
     {"out_frac_bits": 5, "spatial_shapes": (2, 3)}, "overflow the int32 accumulator"),
]


@pytest.mark.parametrize("op,types,attrs,message", BAD, ids=[f"{b[0]}:{b[3][:24]}" for b in BAD])
def test_verifier_rejects(op, types, attrs, message):
    g = bevir.Graph("bad")
    vals = [g.add_input(f"in{i}", t) for i, t in enumerate(types)]
    with pytest.raises(VerifyError) as e:
        g.create_node(op, vals, attrs, loc="enc/layer0")
    assert message in str(e.value)
    assert e.value.op == op and e.value.loc == "enc/layer0"
    assert f"op '{op}'" in str(e.value) and "enc/layer0" in str(e.value)


def test_declared_type_with_wrong_frac_bits_fails_verify():
    g = bevir.Graph("t")
    x = g.add_input("x", fx((2, 4), 5))
    n = g.create_node("fx_relu", [x], {}, loc="m")
    n.outputs[0].type = fx((2, 4), 4)
    g.set_output("y", n.outputs[0])
    with pytest.raises(VerifyError, match="differ from inferred") as e:
        bevir.verify(g)
    assert e.value.op == "fx_relu" and e.value.loc == "m"


@pytest.mark.parametrize("kernel,strides,pads,ceil,include", [
    ((3, 3), (1, 1), (1, 1, 1, 1), False, False), ((3, 3), (1, 1), (1, 1, 1, 1), False, True),
    ((2, 2), (2, 2), (0, 0, 0, 0), True, False), ((3, 2), (2, 1), (1, 0, 0, 1), True, True)])
@pytest.mark.parametrize("f_in,f_out", [(4, 4), (6, 3), (2, 7)])
def test_avgpool_is_each_windows_sum_over_its_count_rounded_once(kernel, strides, pads, ceil,
                                                                   include, f_in, f_out):
    """y = round_half_up(sum * 2**(f_out - f_in) / count) in exact rationals, window by
    window; the count as ONNX AveragePool counts (the input's taps, or with
    count_include_pad the taps inside input + pads, ceil_mode's overhang never)."""
    x = np.random.default_rng(5).integers(-128, 128, (2, 3, 7, 6)).astype(np.int8)
    y = run("fx_avgpool2d", [(x, fx(x.shape, f_in))], out_frac_bits=f_out, kernel=kernel,
            strides=strides, pads=pads, ceil_mode=ceil, count_include_pad=include)
    windows = [_windows(n, k, s, lo, hi, ceil)
               for n, k, s, lo, hi in zip(x.shape[2:], kernel, strides, pads[:2], pads[2:])]
    want = np.zeros(y.shape, np.int64)
    for (i, (h0, h1, hn)), (j, (w0, w1, wn)) in product(*map(enumerate, windows)):
        total = x[:, :, h0:h1, w0:w1].astype(np.int64).sum(axis=(2, 3))
        count = hn * wn if include else (h1 - h0) * (w1 - w0)
        want[:, :, i, j] = [[sat(math.floor(Fraction(int(v)) * Fraction(2) ** (f_out - f_in)
                                             / count + Fraction(1, 2))) for v in row]
                            for row in total]
    assert y.tolist() == want.tolist()


def _windows(n: int, k: int, s: int, lo: int, hi: int, ceil: bool) -> list[tuple[int, int, int]]:
    """Per output position along an axis of n: (first, end) of the window's taps inside the
    input, and how many of its taps lie inside input + pads."""
    starts = [o * s - lo for o in range(pool_out_size(n, k, s, lo, hi, 1, ceil))]
    return [(max(a, 0), min(a + k, n), min(a + k, n + hi) - a) for a in starts]


def test_every_fx_op_has_a_definition():
    names = {"fx_requantize", "fx_matmul", "fx_linear", "fx_conv2d", "fx_add", "fx_sub",
             "fx_mul", "fx_div", "fx_relu", "fx_sigmoid", "fx_exp", "fx_log",
             "fx_inverse_sigmoid", "fx_gelu", "fx_softmax", "fx_layer_norm", "fx_ms_deform_attn",
             "fx_reduce_sum", "fx_reduce_mean", "fx_quantize", "fx_dequantize", "fx_bridge",
             "fx_silu", "fx_hardswish", "fx_hardsigmoid", "fx_tanh", "fx_avgpool2d", "fx_sqrt",
             "fx_reciprocal"}
    assert names <= set(bevir.ops.all_ops())
    assert all(get_op(n).__doc__ for n in names)


# ---- widened results, reductions, 16-bit softmax -----------------------------------------
@pytest.mark.parametrize("op", ["fx_add", "fx_mul", "fx_quantize"])
def test_wide_results_are_exact_where_i8_saturates(op):
    rng = np.random.default_rng(21)
    a, b = ints(rng, (64,)), ints(rng, (64,))
    if op == "fx_quantize":
        x = rng.standard_normal(64).astype(np.float32) * 1e4
        y = run(op, [(x, TensorType.of(x))], out_frac_bits=8, out_dtype="i32")
        assert y.dtype == np.int32
        assert y.tolist() == [math.floor(float(v) * 256 + 0.5) for v in x]
        return
    ops = [(a, fx(a.shape, 3)), (b, fx(b.shape, 5))]
    y = run(op, ops, out_frac_bits=10, out_dtype="i32")
    exact = [(Fraction(int(p), 8) + Fraction(int(q), 32)) if op == "fx_add"
             else Fraction(int(p), 8) * Fraction(int(q), 32) for p, q in zip(a, b)]
    assert y.dtype == np.int32 and y.tolist() == [int(v * 1024) for v in exact]   # exact
    narrow = run(op, ops, out_frac_bits=10)                     # default i8: saturates
    assert narrow.dtype == np.int8 and np.array_equal(narrow, np.clip(y, -128, 127))


@pytest.mark.parametrize("op, mean", [("fx_reduce_sum", False), ("fx_reduce_mean", True)])
@pytest.mark.parametrize("f_in, f_out", [(5, 5), (6, 3), (2, 7)])
def test_reductions_round_once(op, mean, f_in, f_out):
    rng = np.random.default_rng(f_in * 8 + f_out)
    x = ints(rng, (3, 6, 5), lo=-40, hi=40)
    y = run(op, [(x, fx(x.shape, f_in))], axes=[0, 2], keepdims=False, out_frac_bits=f_out)
    n = 15 if mean else 1
    for j in range(6):
        exact = Fraction(int(x[:, j, :].astype(np.int64).sum()), n * 2**f_in) * 2**f_out
        want = max(-128, min(127, math.floor(exact + Fraction(1, 2))))
        assert y[j] == want, (j, y[j], want)
    assert y.shape == (6,)


def test_softmax_of_i16_scores_and_i16_probabilities():
    rng = np.random.default_rng(30)
    f_in = 10
    x = ints(rng, (20, 40), np.int16, lo=-16000, hi=16000)
    x[0] = 0
    x[1, 5] = 32767                                   # one dominant score
    y = run("fx_softmax", [(x, fx(x.shape, f_in, I16))], out_frac_bits=15, out_dtype="i16")
    t = softmax_exp_table(f_in, I16)
    assert t[-1] == 0 and t[-2] > 0 and t.size == math.ceil(16 * math.log(2) * 2**f_in) + 1
    for row, got in zip(x, y):
        m = int(row.max())
        e = [int(t[min(m - int(v), t.size - 1)]) for v in row]
        r = 2**46 // sum(e)
        assert got.tolist() == [min(32767, rhu(v * r, 46 - 15)) for v in e]
    err = np.abs(deq(y, 15) - float_op("softmax", deq(x, f_in)))
    assert err.max() <= 2.0**-14 + 41 * 2.0**-16


def test_matmul_of_i16_probabilities_is_exact():
    rng = np.random.default_rng(31)
    p, v = ints(rng, (2, 7, 40), np.int16, lo=0, hi=2000), ints(rng, (2, 40, 8))
    y = run("fx_matmul", [(p, fx(p.shape, 15, I16)), (v, fx(v.shape, 5))], out_frac_bits=6)
    acc = np.einsum("bik,bkj->bij", p.astype(np.int64), v.astype(np.int64))
    assert np.array_equal(y, np.clip(rshift_round(acc, 15 + 5 - 6), -128, 127))


# ---- 16-bit activations by 8-bit weights ---------------------------------------------------
def wide_ref(acc, bias, shift):
    """acc (+ bias) saturated to int32, rshift_round by ``shift``, saturated to int16."""
    a = acc + (0 if bias is None else bias.astype(np.int64))
    a = np.clip(a, -2**31, 2**31 - 1)
    return np.clip(rshift_round(a, shift), -2**15, 2**15 - 1).astype(np.int16)


@pytest.mark.parametrize("op", ["fx_linear", "fx_conv2d"])
def test_16bit_activations_by_8bit_weights_exact(op):
    """Every i16 extreme in x, i8 weights: int64-exact accumulators, saturated to int32 as
    the int8 products are, rounded once into an i16 result."""
    rng = np.random.default_rng(40)
    if op == "fx_linear":
        x, w = ints(rng, (3, 5, 600), np.int16), ints(rng, (7, 600))
        x[0, 0] = -32768                                       # reaches int32 saturation
        w[0] = -128
        acc = np.einsum("bqk,nk->bqn", x.astype(np.int64), w.astype(np.int64))
        attrs = {}
    else:
        x, w = ints(rng, (2, 6, 5, 4), np.int16), ints(rng, (8, 3, 3, 3))
        attrs = dict(strides=(1, 1), pads=(1, 1, 1, 1), groups=2)
        acc = conv_ref(x, w, 1, 1, 2)
    n = w.shape[0]
    bias = ints(rng, n, np.int32, -2**20, 2**20)
    axis = -1 if op == "fx_linear" else 1
    y = run(op, [(x, fx(x.shape, 9, I16)), (w, fx(w.shape, 6)), (bias, TensorType((n,), I32))],
            out_frac_bits=11, out_dtype="i16", **attrs)
    assert y.dtype == np.int16
    shape = [1] * acc.ndim
    shape[axis] = n
    assert np.array_equal(y, wide_ref(acc, bias.reshape(shape), 9 + 6 - 11))
    if op == "fx_linear":
        assert acc.max() > 2**31                               # the int32 saturation was hit


def test_relu_and_tables_of_16bit_codes():
    x = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16)
    y = run("fx_relu", [(x, fx(x.shape, 12, I16))], out_frac_bits=10, out_dtype="i16")
    assert y.dtype == np.int16
    assert np.array_equal(y, np.clip(rshift_round(np.maximum(x.astype(np.int64), 0), 2),
                                     -2**15, 2**15 - 1))
    narrow = run("fx_relu", [(x, fx(x.shape, 12, I16))], out_frac_bits=5)   # i16 -> i8
    assert narrow.dtype == np.int8 and narrow.max() == 127
    for op, fin, fout, ref in [("fx_sigmoid", 12, 15, lambda v: 1 / (1 + math.exp(-v))),
                               ("fx_inverse_sigmoid", 15, 11, _inv_sigmoid)]:
        table = lut_table(op, fin, fout, "int16", "int16")
        assert table.shape == (65536,) and table.dtype == np.int16
        y = run(op, [(x, fx(x.shape, fin, I16))], out_frac_bits=fout, out_dtype="i16")
        assert np.array_equal(y, table[x.astype(int) + 32768])
        for code in list(range(-32768, 32768, 997)) + [-32768, -1, 0, 1, 32767]:
            v = ref(math.ldexp(code, -fin)) * 2**fout
            assert int(y[code + 32768]) == max(-32768, min(32767, math.floor(v + 0.5))), code
        # a 16-bit table is 256 times finer than an 8-bit one over the same range
        y8 = run(op, [(x, fx(x.shape, fin, I16))], out_frac_bits=fout - 8)
        assert y8.dtype == np.int8


@pytest.mark.parametrize("c", [1, 256, 512])
def test_layer_norm_of_16bit_codes(c):
    """i16 x (the extremes, a constant row) to an i16 result: the same exact integer
    formula; the normalized value is finer than from 8-bit codes; C <= 512 for i16."""
    rng = np.random.default_rng(c + 1)
    x = ints(rng, (6, c), np.int16)
    x[0] = 1234
    x[1] = np.where(np.arange(c) % 2 == 0, -32768, 32767)
    g = ints(rng, c, np.int16, 2**11, 2**13)
    b = ints(rng, c, np.int32, -2**12, 2**12)
    ops = [(x, fx(x.shape, 12, I16)), (g, fx((c,), 12, I16)), (b, fx((c,), 20, I32))]
    y = run("fx_layer_norm", ops, out_frac_bits=12, out_dtype="i16", epsilon=1e-5)
    assert y.dtype == np.int16
    assert y.tolist() == [layer_norm_ref(r, 12, 1e-5, g, 12, b, 20, 12, bits=16) for r in x]
    if c > 1:
        fl = float_op("layer_norm", deq(x, 12), deq(g, 12), deq(b, 20), epsilon=1e-5)
        assert np.abs(deq(y, 12) - fl)[2:].max() <= 2.0 ** -13 + 2.0 ** -14
    with pytest.raises(VerifyError, match="outside \\[1, 512\\] for i16"):
        graph("fx_layer_norm", [(np.zeros((2, 513), np.int16), fx((2, 513), 12, I16))],
              out_frac_bits=4)
