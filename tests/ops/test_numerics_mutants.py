"""Tests written against the survivors of tools/mutate.py (docs/contributing.md).

Each test checks a documented property of bevir/ops/numerics.py, bevir/ops/fixed_point.py or bevir/ops/qlinear.py that
the rest of the suite left open, against an independent reference: Python ints and
fractions for the integer formulas, exact rational rounding for fma32, onnxruntime for the
QLinear ops, int64 numpy for the exact accumulators. Every generator is seeded by a
constant, one per test.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import bevir
from bevir import AffineQuant, DType, FixedPointQuant, TensorType
from bevir.ops.numerics import div_table, fma32, rsqrt_fixed, saturate_round, softmax_exp_table

I8, I16, I32 = DType.i8, DType.i16, DType.i32
F32_EXACT = 1 << 24


# ---- helpers -----------------------------------------------------------------------------
def fx(shape, frac, dtype=I8, axis=None) -> TensorType:
    fr = tuple(frac) if isinstance(frac, (list, tuple)) else (frac,)
    return TensorType(tuple(shape), dtype, quant=FixedPointQuant(fr, axis))


def run(op: str, operands, **attrs) -> np.ndarray:
    """One node; operands are (array, type) pairs or None (omitted)."""
    g = bevir.Graph("t")
    vals = [None if o is None else g.add_input(f"in{i}", o[1]) for i, o in enumerate(operands)]
    g.set_output("y", g.create_node(op, vals, attrs, loc="t/op").outputs[0])
    bevir.verify(g)
    return bevir.run(g, {f"in{i}": o[0] for i, o in enumerate(operands) if o is not None})["y"]


def ints(rng, shape, dtype=np.int8, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi + 1, shape, dtype=np.int64).astype(dtype)


def rhu(v: int, s: int) -> int:
    """round_half_up(v / 2**s) in exact rationals."""
    return math.floor(Fraction(v) / Fraction(2) ** s + Fraction(1, 2))


def sat(v: int, bits: int = 8) -> int:
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, v))


# ---- layer norm and its reciprocal square root ------------------------------------------
def layer_norm_ref(row, fx_, eps, g, fg, b, fb, fy):
    """docs/numerics.md's fx_layer_norm in Python ints: the normalized value in Q16."""
    c, xs = len(row), [int(v) for v in row]
    d = [c * v - sum(xs) for v in xs]
    n = sum(v * v for v in d) + max(1, math.floor(Fraction(eps) * 4 ** fx_ * c ** 3
                                                  + Fraction(1, 2)))
    k = (61 + n.bit_length() - c.bit_length()) // 2
    r = math.isqrt((c << (2 * k)) // n)
    out = []
    for i, v in enumerate(d):
        acc = rhu(v * r, k - 16) * (1 if g is None else int(g[i]))
        acc += 0 if b is None else int(b[i]) << (16 + fg - fb)
        out.append(sat(rhu(acc, 16 + fg - fy)))
    return out


def test_layer_norm_many_rows_round_in_q16():
    """Enough rows that a Q15 or Q17 normalized value would round some outputs otherwise."""
    rng = np.random.default_rng(101)
    c, fx_, fy = 64, 5, 4
    x = ints(rng, (600, c), lo=-100, hi=100)
    g, b = ints(rng, c, np.int16, 2**11, 2**13), ints(rng, c, np.int8, -60, 60)
    y = run("fx_layer_norm", [(x, fx(x.shape, fx_)), (g, fx((c,), 12, I16)), (b, fx((c,), 6))],
            out_frac_bits=fy, epsilon=1e-5)
    assert y.tolist() == [layer_norm_ref(r, fx_, 1e-5, g, 12, b, 6, fy) for r in x]


def test_layer_norm_saturates():
    rng = np.random.default_rng(102)
    x = ints(rng, (20, 16))
    g = np.full(16, 2**14 - 1, np.int16)                # gamma ~ 4: |y| up to ~16 > 8
    y = run("fx_layer_norm", [(x, fx(x.shape, 4)), (g, fx((16,), 12, I16)), None],
            out_frac_bits=4)
    ref = [layer_norm_ref(r, 4, 1e-5, g, 12, None, 0, 4) for r in x]
    assert y.tolist() == ref
    assert (y == 127).any() and (y == -128).any()


@pytest.mark.parametrize("eps,fx_,c", [(0.3, 2, 4), (0.7, 3, 2), (1e-9, 2, 2), (0.05, 4, 8)])
def test_layer_norm_epsilon_in_squared_units(eps, fx_, c):
    """Rows of tiny variance, where E = max(1, round_half_up(eps * 4**fx * C**3)) weighs."""
    rng = np.random.default_rng(103)
    x = ints(rng, (40, c), lo=-2, hi=2)
    y = run("fx_layer_norm", [(x, fx(x.shape, fx_)), None, None], out_frac_bits=5, epsilon=eps)
    assert y.tolist() == [layer_norm_ref(r, fx_, eps, None, 0, None, 0, 5) for r in x]


def test_rsqrt_fixed_contract():
    """R = floor(2**k * sqrt(c / n)) exactly, k = (61 + bitlen(n) - bitlen(c)) // 2, and R
    in [2**29, 2**31)."""
    rng = np.random.default_rng(104)
    n = np.concatenate([rng.integers(1, 2**40, 300), rng.integers(1, 300, 100),
                        2 ** np.arange(0, 50)]).astype(np.int64)
    for c in (1, 3, 64, 4096):
        r, k = rsqrt_fixed(n, c)
        for ni, ri, ki in zip(n.tolist(), r.tolist(), k.tolist()):
            assert ki == (61 + ni.bit_length() - c.bit_length()) // 2
            assert 2**29 <= ri < 2**31
            assert ri * ri * ni <= c << (2 * ki) < (ri + 1) ** 2 * ni


# ---- softmax -----------------------------------------------------------------------------
def test_softmax_table_contract():
    """i8: 256 entries round_half_up(exp(-k 2**-f) 2**15); i16: up to the first 0 entry."""
    for f in (2, 4, 7):
        t = softmax_exp_table(f)
        assert t.tolist() == [math.floor(math.exp(-k * 2.0**-f) * 2**15 + 0.5)
                              for k in range(256)]
    for f in (4, 8, 12, 13):
        t = softmax_exp_table(f, I16)
        first_zero = next(k for k in range(1 << 20) if math.exp(-k * 2.0**-f) * 2**15 < 0.5)
        assert t.size == min(first_zero + 1, 1 << 16)      # i16 differences end at 65535
        assert t.tolist() == [math.floor(math.exp(-k * 2.0**-f) * 2**15 + 0.5)
                              for k in range(t.size)]


def test_softmax_many_rows_with_reciprocal_2_pow_46():
    rng = np.random.default_rng(105)
    x = ints(rng, (300, 24))
    x[:, 0], x[:, 1] = 127, -128                       # a difference of 255 in every row
    for fin, fy in ((7, 7), (5, 6)):
        table = [math.floor(math.exp(-k * 2.0**-fin) * 2**15 + 0.5) for k in range(256)]
        y = run("fx_softmax", [(x, fx(x.shape, fin))], out_frac_bits=fy)
        ref = []
        for row in x.tolist():
            e = [table[max(row) - v] for v in row]
            r = 2**46 // sum(e)
            ref.append([min(127, rhu(v * r, 46 - fy)) for v in e])
        assert y.tolist() == ref


# ---- products ----------------------------------------------------------------------------
def test_matmul_by_vector_and_vector_by_matrix():
    rng = np.random.default_rng(106)
    a, b = ints(rng, (3, 5)), ints(rng, 5)
    y = run("fx_matmul", [(a, fx(a.shape, 4)), (b, fx(b.shape, 5))], out_frac_bits=3)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    assert y.shape == (3,) and y.tolist() == [sat(rhu(int(v), 6)) for v in acc]


def test_matmul_long_reduction_of_extreme_codes_is_exact():
    """1025 products of 2**14 and one of 1: a float32 sum of more than 1024 of them is
    inexact, so the reduction must be split."""
    a = np.full((1, 1026), -128, np.int8)
    b = np.full((1026, 1), -128, np.int8)
    a[0, -1], b[-1, 0] = 1, 1
    y = run("fx_matmul", [(a, fx(a.shape, 0)), (b, fx(b.shape, 0))], out_frac_bits=-17,
            out_dtype="i32")
    exact = 1025 * 2**14 + 1
    assert int(y[0, 0]) == rhu(exact, 17)
    y = run("fx_matmul", [(a, fx(a.shape, 0)), (b, fx(b.shape, 0))], out_frac_bits=-1,
            out_dtype="i32")
    assert int(y[0, 0]) == rhu(exact, 1)


def test_matmul_of_large_i16_is_exact():
    rng = np.random.default_rng(107)
    a = ints(rng, (4, 256), np.int16, 30000, 32767)
    b = ints(rng, (256, 3), np.int8, 100, 127)
    y = run("fx_matmul", [(a, fx(a.shape, 0, I16)), (b, fx(b.shape, 0))], out_frac_bits=-9,
            out_dtype="i32")
    acc = a.astype(np.int64) @ b.astype(np.int64)
    assert y.tolist() == [[rhu(int(v), 9) for v in row] for row in acc]


def test_requantize_two_channels():
    x = np.array([[1000, 1000], [-777, 333]], np.int32)
    y = run("fx_requantize", [(x, fx(x.shape, [6, 8], I32, axis=1))], out_frac_bits=2)
    assert y.tolist() == [[sat(rhu(int(r[0]), 4)), sat(rhu(int(r[1]), 6))] for r in x]


def test_linear_accumulator_saturates_to_int32():
    """acc + bias is saturated to int32 before requantization (not wrapped)."""
    x = np.full((2, 4), 127, np.int8)
    w = np.full((3, 4), 127, np.int8)
    bias = np.array([2**31 - 1, -(2**31), 5], np.int32)
    y = run("fx_linear", [(x, fx(x.shape, 0)), (w, fx(w.shape, 0)), (bias, TensorType((3,), I32))],
            out_frac_bits=-24)
    exact = [min(2**31 - 1, max(-(2**31), 4 * 127 * 127 + int(v))) for v in bias]
    assert y.tolist() == [[sat(rhu(v, 24)) for v in exact]] * 2


def test_linear_of_batched_rows():
    rng = np.random.default_rng(108)
    x, w = ints(rng, (2, 3, 6)), ints(rng, (4, 6))
    y = run("fx_linear", [(x, fx(x.shape, 3)), (w, fx(w.shape, 4))], out_frac_bits=2)
    acc = x.astype(np.int64) @ w.T.astype(np.int64)
    assert y.shape == (2, 3, 4)
    assert y.tolist() == [[[sat(rhu(int(v), 5)) for v in r] for r in m] for m in acc]


def test_conv2d_two_groups_is_exact():
    rng = np.random.default_rng(109)
    x, w = ints(rng, (1, 4, 5, 5)), ints(rng, (6, 2, 3, 3))
    y = run("fx_conv2d", [(x, fx(x.shape, 0)), (w, fx(w.shape, 0))], out_frac_bits=-6,
            groups=2, out_dtype="i32")
    ref = np.zeros((1, 6, 3, 3), np.int64)
    for o in range(6):
        gi = o // 3
        for i, j in np.ndindex(3, 3):
            ref[0, o, i, j] = int((x[0, 2 * gi:2 * gi + 2, i:i + 3, j:j + 3].astype(np.int64)
                                   * w[o].astype(np.int64)).sum())
    assert y.tolist() == [[[[rhu(int(v), 6) for v in r] for r in ch] for ch in n] for n in ref]


# ---- dequantize, division, reductions, tables --------------------------------------------
def test_dequantize_per_channel():
    rng = np.random.default_rng(110)
    x = ints(rng, (2, 3, 4))
    y = run("fx_dequantize", [(x, fx(x.shape, [1, 4, 7], axis=1))])
    ref = [[[float(Fraction(int(v), 2 ** f)) for v in r] for r, f in zip(m, (1, 4, 7))]
           for m in x]
    assert y.dtype == np.float32 and y.tolist() == ref
    x2 = ints(rng, (2, 2, 3))
    y = run("fx_dequantize", [(x2, fx(x2.shape, [3, 5], axis=1))])
    assert y.tolist() == [[[float(Fraction(int(v), 2 ** f)) for v in r] for r, f in zip(m, (3, 5))]
                          for m in x2]
    y = run("fx_dequantize", [(np.array(-77, np.int8), fx((), 3))])
    assert y.shape == () and float(y) == -77 / 8


def test_div_table_contract():
    """m_pos[d] = ceil(2**S / den), m_neg[d] = floor(2**S / den), S = bitlen(258 den_max**2),
    read-only. max_count values where 257, 258 and 259 differ in bit length
    are included."""
    counts = [c for c in range(1, 400) if len({(k * c * c).bit_length() for k in (257, 258, 259)})
              > 1][:6] + [1, 6, 255]
    for max_count in counts:
        for shift in (0, 2):
            m_pos, m_neg, s = div_table(max_count, shift)
            assert s == (258 * (max_count << shift) ** 2).bit_length()
            assert len(m_pos) == len(m_neg) == max_count + 1
            dens = [d << shift for d in range(1, max_count + 1)]
            assert m_pos[1:].tolist() == [-((-(1 << s)) // v) for v in dens]
            assert m_neg[1:].tolist() == [(1 << s) // v for v in dens]
            assert not m_pos.flags.writeable and not m_neg.flags.writeable


def test_div_of_large_i32_saturates():
    x = np.array([2**31 - 1, -(2**31), 2**30, -(2**30) - 7, 300, -300], np.int32)
    cnt = np.array([1, 1, 3, 255, 2, 2], np.int32)
    y = run("fx_div", [(x, fx(x.shape, 4, I32)), (cnt, TensorType(cnt.shape, I32))],
            out_frac_bits=4)
    assert y.tolist() == [sat(math.floor(Fraction(int(v), int(d)) + Fraction(1, 2)))
                          for v, d in zip(x, cnt)]


def test_div_of_large_i32_with_a_frac_change():
    """frac 12 -> 4 shifts the divisor by 8: the reciprocal needs S ~ 40 bits, and only the
    clamp of the numerator keeps num * m inside int64."""
    x = np.array([2**31 - 1, -(2**31), 2**29 + 12345, -(2**27), 70000, -70001], np.int32)
    cnt = np.array([1, 2, 3, 255, 7, 7], np.int32)
    y = run("fx_div", [(x, fx(x.shape, 12, I32)), (cnt, TensorType(cnt.shape, I32))],
            out_frac_bits=4)
    assert y.tolist() == [sat(math.floor(Fraction(int(v), int(d) * 256) + Fraction(1, 2)))
                          for v, d in zip(x, cnt)]


def test_reduce_mean_of_two():
    rng = np.random.default_rng(111)
    x = ints(rng, (7, 2))
    y = run("fx_reduce_mean", [(x, fx(x.shape, 4))], axes=[1], keepdims=False, out_frac_bits=4)
    assert y.tolist() == [sat(math.floor(Fraction(int(a) + int(b), 2) + Fraction(1, 2)))
                          for a, b in x]


def test_inverse_sigmoid_clamps_beyond_unit_interval():
    """fin = 5 codes reach [-4, 4): x is clamped to [0, 1] before the logit."""
    x = np.arange(-128, 128, dtype=np.int8)
    y = run("fx_inverse_sigmoid", [(x, fx(x.shape, 5))], out_frac_bits=3)
    eps = 1e-5
    ref = []
    for v in x.tolist():
        p = min(1.0, max(0.0, v / 32))
        t = math.log(max(p, eps) / max(1.0 - p, eps))
        ref.append(sat(math.floor(t * 8 + 0.5)))
    assert y.tolist() == ref


# ---- fma32: one rounding, against exact rationals ----------------------------------------
def _round_f32(q: Fraction) -> np.float32:
    """q rounded to the nearest float32, ties to even (normal and subnormal range)."""
    if q == 0:
        return np.float32(0.0)
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    m = round(a / ulp)                               # Fraction rounds half to even
    return np.float32(math.copysign(float(m * ulp), q))


def test_fma32_rounds_once():
    """a * b on a float32 midpoint (or near one) plus a tiny c: double rounding through
    float64 would get these wrong; so would a wrong sticky-bit fix."""
    rng = np.random.default_rng(112)
    i, j = rng.integers(1, 4096, 400), rng.integers(1, 4096, 400)
    a = (1 + i * 2.0**-12).astype(np.float32) * rng.choice([-1, 1], 400).astype(np.float32)
    b = (1 + j * 2.0**-12).astype(np.float32)
    c = (rng.choice([-1, 1], 400) * 2.0 ** -rng.integers(25, 90, 400)).astype(np.float32)
    c[:50] = rng.standard_normal(50).astype(np.float32)
    c[50:60] = 0
    # a * b = 1 + 2**-11 + 2**-24, a float32 midpoint; c moves the sum just off the midpoint
    # (2**-70), or to one float64 step past it minus a little (2**-52 - 2**-76), where the
    # float64 sum is odd and must not be nudged back onto the midpoint
    m = np.float32(1 + 2**-12)
    near = [2**-70, -(2**-70), 2**-52 - 2**-76, -(2**-52 - 2**-76), 2**-51 - 2**-75]
    a = np.concatenate([a, np.float32([m] * 5 + [-m] * 5)])
    b = np.concatenate([b, np.float32([m] * 10)])
    c = np.concatenate([c, np.float32(near + [-v for v in near])])
    got = fma32(a, b, c)
    ref = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
           for x, y, z in zip(a, b, c)]
    assert got.dtype == np.float32
    bad = [k for k, (g, r) in enumerate(zip(got, ref)) if g.tobytes() != r.tobytes()]
    assert not bad, [(float(a[k]), float(b[k]), float(c[k]), float(got[k]), float(ref[k]))
                     for k in bad[:3]]
    assert fma32(np.float32(1 + 2**-12), np.float32(1 + 2**-12), np.float32(2**-70)) == \
        np.float32(1 + 2**-11 + 2**-23)


# ---- saturate_round ----------------------------------------------------------------------
def test_saturate_round_leaves_its_input_alone_without_scratch():
    v = np.array([1.5, 2.5, -300.0, 200.0, np.nan], np.float32)
    keep = v.copy()
    for finite in (False, True):
        y = saturate_round(v[:4] if finite else v, 3, np.int8, finite=finite)
        assert y.tolist() == ([5, 5, -128, 127] if finite else [5, 5, -128, 127, -128])
        assert np.array_equal(v, keep, equal_nan=True)


def test_saturate_round_nan_is_the_minimum():
    v = np.array([np.nan, -np.nan, 0.5], np.float32)
    assert saturate_round(v, 3, np.int8).tolist() == [-128, -128, 3]
    assert saturate_round(v, 7, np.uint8).tolist() == [0, 0, 7]


def test_saturate_round_broadcasts_to_the_zero_points():
    v = np.array([0.4, 1.5, 2.5, 500.0], np.float32)
    zp = np.array([[0], [10]], np.int32)
    for scratch in (False, True):
        y = saturate_round(v.copy(), zp, np.int8, scratch=scratch)
        assert y.tolist() == [[0, 2, 2, 127], [10, 12, 12, 127]]


# ---- exact integer accumulators: the reduction split by the code span -------------------
@pytest.mark.parametrize("dt,zp_a,zp_b,k", [
    (np.uint8, None, None, 259), (np.int8, None, None, 1026), (np.uint8, 0, None, 259),
    (np.uint8, None, (0, 100), 259), (np.int8, 0, (-50, 50), 738)])
def test_matmul_integer_long_reductions_are_exact(dt, zp_a, zp_b, k):
    """Extreme codes (and, for i8, one product of 1): a column's exact int32 sum exceeds
    2**24 and is odd, so any chunk longer than the code span allows gives a wrong
    accumulator."""
    info = np.iinfo(dt)
    ext = info.min if dt == np.int8 else info.max
    za = 0 if zp_a is None else zp_a
    bz = np.zeros(2, np.int64) if zp_b is None else np.array(zp_b)
    a, b = np.full((1, k), ext, dt), np.full((k, 2), ext, dt)
    if dt == np.int8:
        a[0, -1], b[-1, :] = 1 + za, (1 + bz).astype(dt)
    name = "u8" if dt == np.uint8 else "i8"
    at = TensorType(a.shape, DType(name), quant=None if zp_a is None else AffineQuant((1.0,), (za,)))
    bq = None if zp_b is None else AffineQuant((1.0, 1.0), tuple(zp_b), 1)
    y = run("matmul_integer", [(a, at), (b, TensorType(b.shape, DType(name), quant=bq))])
    ref = (a.astype(np.int64) - za) @ (b.astype(np.int64) - bz[None, :])
    assert y.tolist() == ref.tolist()
    assert any(abs(v) > F32_EXACT and v % 2 for v in ref.ravel().tolist())


def test_conv_integer_long_reduction_is_exact():
    """A 1x1 convolution over 516 channels, u8 x of 255 by i8 w of -128 (unquantized) and
    one product of 1: the odd sum exceeds 2**24, so the reduction must be split by the
    span of x's codes times the largest |w|."""
    x = np.full((1, 516, 1, 1), 255, np.uint8)
    w = np.full((1, 516, 1, 1), -128, np.int8)
    x[0, -1], w[0, -1] = 1, 1
    y = run("conv_integer", [(x, TensorType(x.shape, DType.u8)), (w, TensorType(w.shape, I8))])
    assert int(y.ravel()[0]) == -515 * 255 * 128 + 1


def test_conv_integer_unquantized_x_with_quantized_w():
    rng = np.random.default_rng(113)
    x, w = ints(rng, (1, 3, 4, 4), np.uint8), ints(rng, (2, 3, 3, 3), np.uint8)
    wt = TensorType(w.shape, DType.u8, quant=AffineQuant((1.0,), (9,)))
    y = run("conv_integer", [(x, TensorType(x.shape, DType.u8)), (w, wt)])
    xc, wc = x.astype(np.int64), w.astype(np.int64) - 9
    ref = np.zeros((1, 2, 2, 2), np.int64)
    for o, i, j in np.ndindex(2, 2, 2):
        ref[0, o, i, j] = int((xc[0, :, i:i + 3, j:j + 3] * wc[o]).sum())
    assert y.tolist() == ref.tolist()


# ---- QLinear ops against onnxruntime ----------------------------------------------------
_ET = {np.uint8: TP.UINT8, np.int8: TP.INT8}


def _ort_vs_bevir(node, inputs, feeds, inits):
    g = oh.make_graph([node], "g", inputs, [oh.make_tensor_value_info("y", inputs[0].type.tensor_type.elem_type, None)], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = s.run(None, feeds)[0]
    got = bevir.run(bevir.from_onnx(m), feeds)["y"]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got, ref), f"{int(np.sum(got != ref))} of {ref.size} differ"


@pytest.mark.parametrize("a_shape,b_shape", [((7,), (2, 3, 7)), ((3, 1), (2, 3, 5)),
                                             ((1, 5), (4, 1)), ((2, 1, 6), (6,)),
                                             ((4, 6), (3, 4, 1)), ((1,), (64, 1)),
                                             ((16, 1), (1, 2)), ((64, 1), (1,)),
                                             ((1, 1), (3, 64, 1))])
def test_qlinear_add_lower_rank_operands(a_shape, b_shape):
    rng = np.random.default_rng(114)
    dt = np.uint8
    for _ in range(6):
        sa, sb, sc = rng.uniform(0.005, 0.2, 3).astype(np.float32)
        zs = rng.integers(0, 256, 3)
        inits = [nh.from_array(np.float32(v), n) for v, n in ((sa, "sa"), (sb, "sb"), (sc, "sc"))]
        inits += [nh.from_array(np.array(z, dt), n) for z, n in zip(zs, ("za", "zb", "zc"))]
        node = oh.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain="com.microsoft")
        ins = [oh.make_tensor_value_info("a", _ET[dt], list(a_shape)),
               oh.make_tensor_value_info("b", _ET[dt], list(b_shape))]
        feeds = {"a": ints(rng, a_shape, dt), "b": ints(rng, b_shape, dt)}
        _ort_vs_bevir(node, ins, feeds, inits)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_concat_same_scale_or_same_zero_point(dt):
    """An input sharing only the output's scale, or only its zero point, is requantized."""
    rng = np.random.default_rng(115)
    s, z = np.float32(0.05), np.array(3, dt)
    inits = [nh.from_array(s, "sy"), nh.from_array(z, "zy"), nh.from_array(np.float32(0.05), "s1"),
             nh.from_array(np.array(-7 if dt == np.int8 else 40, dt), "z1"),
             nh.from_array(np.float32(0.08), "s2"), nh.from_array(np.array(3, dt), "z2")]
    node = oh.make_node("QLinearConcat", ["sy", "zy", "a", "s1", "z1", "b", "s2", "z2"], ["y"],
                        domain="com.microsoft", axis=1)
    ins = [oh.make_tensor_value_info(n, _ET[dt], [2, 3, 4]) for n in "ab"]
    _ort_vs_bevir(node, ins, {n: ints(rng, (2, 3, 4), dt) for n in "ab"}, inits)


def test_qlinear_concat_of_one_operand():
    rng = np.random.default_rng(116)
    dt = np.uint8
    inits = [nh.from_array(np.float32(0.05), "sy"), nh.from_array(np.array(3, dt), "zy"),
             nh.from_array(np.float32(0.09), "s1"), nh.from_array(np.array(40, dt), "z1")]
    node = oh.make_node("QLinearConcat", ["sy", "zy", "a", "s1", "z1"], ["y"],
                        domain="com.microsoft", axis=-1)
    ins = [oh.make_tensor_value_info("a", _ET[dt], [2, 3, 4])]
    _ort_vs_bevir(node, ins, {"a": ints(rng, (2, 3, 4), dt)}, inits)


def test_qlinear_conv_bias_beyond_2_pow_24_rounds_once():
    """acc = 1 + bias with bias = 2**24 + 2**16 + 1: float32 holds neither the bias nor the
    sum; adding the rounded bias in float32 would round twice (onnxruntime rounds the int32
    accumulator once). The multiplier 2**-17 puts the result on a rounding boundary."""
    dt = np.uint8
    inits = [nh.from_array(np.float32(2.0**-8), "sx"), nh.from_array(np.array(10, dt), "zx"),
             nh.from_array(np.full((1, 1, 1, 1), 21, dt), "w"),
             nh.from_array(np.float32(2.0**-9), "sw"), nh.from_array(np.array(20, dt), "zw"),
             nh.from_array(np.float32(1.0), "sy"), nh.from_array(np.array(0, dt), "zy"),
             nh.from_array(np.array([2**24 + 2**16 + 1], np.int32), "b")]
    node = oh.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"], ["y"])
    ins = [oh.make_tensor_value_info("x", TP.UINT8, [1, 1, 2, 2])]
    _ort_vs_bevir(node, ins, {"x": np.array([[[[11, 10], [12, 9]]]], dt)}, inits)


def test_qlinear_conv_in_nhwc_with_a_non_square_output():
    """to-nhwc runs the convolution on NHWC data; a non-square output (6 x 10) tells its
    rows from its columns: the result, transposed back, is onnxruntime's."""
    rng = np.random.default_rng(117)
    dt = np.uint8
    inits = [nh.from_array(np.float32(0.02), "sx"), nh.from_array(np.array(7, dt), "zx"),
             nh.from_array(ints(rng, (5, 3, 3, 3), dt), "w"),
             nh.from_array(np.float32(0.01), "sw"), nh.from_array(np.array(120, dt), "zw"),
             nh.from_array(np.float32(0.3), "sy"), nh.from_array(np.array(5, dt), "zy")]
    node = oh.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"],
                        pads=[1, 1, 1, 1])
    ins = [oh.make_tensor_value_info("x", TP.UINT8, [1, 3, 6, 10])]
    g = oh.make_graph([node], "g", ins, [oh.make_tensor_value_info("y", TP.UINT8, None)], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])
    m.ir_version = 10
    feeds = {"x": ints(rng, (1, 3, 6, 10), dt)}
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(m.SerializeToString(), so,
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    graph = bevir.from_onnx(m)
    bevir.optimize(graph, "to-nhwc")
    conv = next(n for n in graph.nodes if n.op == "qlinear_conv")
    assert conv.output.type.layout is bevir.Layout.nhwc and conv.output.type.shape == (1, 6, 10, 5)
    got = bevir.run(graph, feeds)["y"]
    assert np.array_equal(got, ref), f"{int(np.sum(got != ref))} of {ref.size} differ"
