"""Fixed-point normalizations: ``fx_softmax`` (a table of exponentials, an exact sum, one
reciprocal) and ``fx_layer_norm`` (exact integer mean and variance, an exact integer
reciprocal square root)."""
from __future__ import annotations

import math

import numpy as np

from ..ir.opdef import Float, Int, OpDef
from ..ir.types import DType, FixedPointQuant
from .common import norm_axis, require
from .cost import per_element
from .fixed_point import (ACT_DTYPE, I8, I16, I32, OUT, WIDE_DTYPE, fixed_type, frac_of,
                          out_dtype, require_out_frac)
from .numerics import (NORM_FRAC, RECIP_BITS, Rescale, rshift_round, rsqrt_fixed, saturate,
                       softmax_exp_table)
from .onnx_export import qdq


class FxSoftmax(OpDef):
    """Softmax along ``axis`` of i8 or i16 fixed x (i16: e.g. attention scores straight
    from an fx_matmul) -> out_dtype (i8, default, or i16) fixed<out_frac_bits> (1..7 for
    i8, default 7; 1..15 for i16): e = softmax_exp_table[min(max - x, len - 1)], S = sum e,
    R = floor(2**46 / S), y = saturate(rshift_round(e * R, 46 - out_frac_bits))."""

    name = "fx_softmax"
    onnx_export = qdq("softmax")
    # max, subtract, table, sum, reciprocal multiply, shift: per element
    cycle_cost = per_element(6, "softmax")
    operands = ("x",)
    attrs = {"axis": Int(-1), "out_frac_bits": Int(7), **WIDE_DTYPE}
    splits = ("rows",)

    def row_axes(self, c):
        axis = norm_axis(c.axis, c.out_types[0].rank)
        return tuple(a for a in range(c.out_types[0].rank) if a != axis)

    def infer(self, c, x):
        frac_of(x, "x", (I8, I16))
        axis = norm_axis(c.axis, x.rank)
        require(1 <= x.shape[axis] < 1 << 16, f"softmax length {x.shape[axis]} outside [1, 65535]")
        dtype = out_dtype(c)
        require(dtype in (I8, I16), f"out_dtype {dtype} must be i8 or i16")
        require_out_frac(c.out_frac_bits, 1, 7 if dtype is I8 else 15)
        return fixed_type(x.shape, c.out_frac_bits, x.layout, dtype)

    def compute(self, c, x):
        axis = norm_axis(c.axis, x.ndim)
        xi = x.astype(np.intp)
        t = c.in_types[0]
        table = softmax_exp_table(t.quant.frac_bits[0], t.dtype)
        e = table[np.minimum(xi.max(axis, keepdims=True) - xi, table.size - 1)]
        r = (1 << RECIP_BITS) // e.sum(axis, keepdims=True)
        return saturate(rshift_round(e * r, RECIP_BITS - c.out_frac_bits), out_dtype(c).np)

    def tvm_lowering(self, c, L, x):
        t, out = c.in_types[0], c.out_types[0]
        axis = norm_axis(c.axis, t.rank)
        table = L.const(softmax_exp_table(t.quant.frac_bits[0], t.dtype), "exp")
        last = L.i64(int(table.shape[0]) - 1)
        row = tuple(1 if a == axis else s for a, s in enumerate(t.shape))

        def at(i, j):           # index i with the softmax axis set to j
            return tuple(i[:axis]) + (j,) + tuple(i[axis + 1:])

        def exp(i, mx):
            return table[L.min(L.i64(mx[at(i, 0)]) - L.i64(x[i]), last)]

        k, k2 = L.reduce_axis(t.shape[axis]), L.reduce_axis(t.shape[axis])
        mx = L.te.compute(row, lambda *i: L.te.max(L.cast(x[at(i, k)], "int32"), axis=k),
                          name="max")
        total = L.te.compute(row, lambda *i: L.sum(exp(at(i, k2), mx), axis=k2), name="sum")
        recip = L.te.compute(row, lambda *i: L.i64(1 << RECIP_BITS) // total[i], name="recip")
        dtype = out_dtype(c).np
        return L.compute(out, lambda *i: L.saturate(L.rshift_round(
            exp(i, mx) * recip[at(i, 0)], RECIP_BITS - c.out_frac_bits), dtype))


# ---- layer norm --------------------------------------------------------------------------
def _ln_eps(epsilon: float, fx: int, ch: int) -> int:
    """fx_layer_norm's epsilon in the units of V = sum(d**2): max(1, round(eps * 4**fx * C**3))."""
    return max(1, math.floor(epsilon * 4.0 ** fx * ch ** 3 + 0.5))


def _product_le(L, a, b, c: int, s):
    """[a * b <= c * 2**s] exactly, for int64 expressions 0 <= a, b < 2**63, s >= 0 and a
    Python int 0 <= c < 2**21 with c * 2**s < 2**126: both sides as six 21-bit limbs (limb
    products and their column sums stay far below 2**63), compared from the top limb down."""
    bits, mask = 21, L.i64((1 << 21) - 1)
    al = [(a >> L.i64(bits * j)) & mask for j in range(3)]
    bl = [(b >> L.i64(bits * j)) & mask for j in range(3)]
    le, carry = None, L.i64(0)
    for col in range(6):
        v = carry
        for j in range(max(0, col - 2), min(col, 2) + 1):
            v = v + al[j] * bl[col - j]
        p, carry = (v if col == 5 else v & mask), v >> L.i64(bits)
        t = s - L.i64(bits * col)          # where c's bits start, relative to this limb
        y = L.select(t >= L.i64(0), L.i64(c) << L.min(t, L.i64(42)),
                     L.i64(c) >> L.min(-t, L.i64(42))) & mask
        le = p <= y if le is None else L.tirx.any(p < y, L.tirx.all(p == y, le))
    return le


def _rsqrt_shift(L, n, c: int):
    """k of numerics.rsqrt_fixed(n, c) for an int64 load 0 < n < 2**62 and the Python int c:
    (61 + bitlen(n) - bitlen(c)) // 2, the bit length exact as a sum of comparisons."""
    bitlen = sum(L.cast(n >= L.i64(1 << j), "int64") for j in range(62))
    return (L.i64(61 - c.bit_length()) + bitlen) // L.i64(2)


def _rsqrt_estimate(L, n, k, c: int):
    """floor(2**k * sqrt(c / n)) in float64: R of rsqrt_fixed or off by one (R < 2**31)."""
    return L.cast(L.tirx.floor(L.tirx.sqrt(L.cast(L.i64(c), "float64") / L.cast(n, "float64"))
                               * L.cast(L.i64(1) << k, "float64")), "int64")


def _rsqrt_root(L, n, k, r0, c: int):
    """R of numerics.rsqrt_fixed(n, c) from the loads n, k and the estimate r0: R is r0 - 1,
    r0 or r0 + 1, the largest r with r**2 * n <= c * 4**k (exact tests)."""
    ok = [L.cast(_product_le(L, r * r, n, c, k + k), "int64") for r in (r0, r0 + L.i64(1))]
    return r0 - L.i64(1) + ok[0] + ok[1]


#: the longest row an i16 layer norm takes: V = sum d**2 <= C**3 * 2**32 stays below 2**62
LN_I16_MAX_CHANNELS = 512


class FxLayerNorm(OpDef):
    """Layer norm over the last axis (C <= 4096; i16 x: C <= 512) of i8 or i16 fixed x, then
    * scale (i8/i16 fixed [C]) + bias (i8/i16/i32 fixed [C]) -> out_dtype (i8, default, or
    i16) fixed<out_frac_bits>. Exact integer mean and
    variance (d = C*x - sum x, V = sum d**2), E = max(1, round(eps * 4**fx * C**3)),
    (R, k) = rsqrt_fixed(V + E, C), z = rshift_round(d * R, k - 16) (the normalized value
    in Q16), y = rshift_round(z * g + (b << (16 + fg - fb)), 16 + fg - out_frac_bits)."""

    name = "fx_layer_norm"
    onnx_export = qdq("layer_norm")
    # sum, d = C*x - sum, d*d, rsqrt share, d*R, shift, *g, +b, shift, saturate
    cycle_cost = per_element(10, "norm")
    operands = ("x", "scale?", "bias?")
    attrs = {"epsilon": Float(1e-5), **OUT, **ACT_DTYPE}
    splits = ("rows",)
    x_dtypes = (I8, I16)

    @staticmethod
    def max_channels(dtype: DType) -> int:
        """The longest row whose exact integer variance fits int64, for ``dtype`` codes."""
        return 4096 if dtype is I8 else LN_I16_MAX_CHANNELS

    def takes_x(self, dtype: DType, shape: tuple[int, ...]) -> bool:
        """Whether an x of ``dtype`` codes and ``shape`` fits the op (the quantize pass asks
        before it picks 16-bit activations)."""
        ch = shape[-1] if shape else 0
        return dtype in self.x_dtypes and 1 <= ch <= self.max_channels(dtype)

    def infer(self, c, x, scale=None, bias=None):
        fx = frac_of(x, "x", self.x_dtypes)
        ch = x.shape[-1] if x.rank else 0
        top = self.max_channels(x.dtype)
        require(1 <= ch <= top, f"normalized length {ch} outside [1, {top}] for {x.dtype} x")
        fg = 0 if scale is None else frac_of(scale, "scale", (I8, I16))
        for p, what in ((scale, "scale"), (bias, "bias")):
            require(p is None or p.shape == (ch,), f"{what} must be [{ch}], got {p}")
        if bias is not None:
            fb = frac_of(bias, "bias", (I8, I16, I32))
            require(0 <= NORM_FRAC + fg - fb <= 31,
                    f"bias frac bits {fb} cannot be aligned to {NORM_FRAC + fg}")
        require(0 < c.epsilon and _ln_eps(c.epsilon, fx, ch) < 1 << 60,
                f"epsilon {c.epsilon} must be positive and below 2**60 in x's squared units")
        require_out_frac(c.out_frac_bits)
        Rescale.of(FixedPointQuant((NORM_FRAC + fg,)), c.out_frac_bits)
        return fixed_type(x.shape, c.out_frac_bits, x.layout, out_dtype(c))

    def normalized(self, c, x: np.ndarray) -> np.ndarray:
        """z: (x - mean) / sqrt(var + eps) in Q16 (int64)."""
        ch, fx = x.shape[-1], c.in_types[0].quant.frac_bits[0]
        xi = x.astype(np.int64)
        d = ch * xi - xi.sum(-1, keepdims=True)
        n = (d * d).sum(-1, keepdims=True) + _ln_eps(c.epsilon, fx, ch)
        r, k = rsqrt_fixed(n, ch)
        return rshift_round(d * r, k - NORM_FRAC)

    def compute(self, c, x, scale=None, bias=None):
        z = self.normalized(c, x)
        _, st, bt = c.in_types + [None] * (3 - len(c.in_types))
        fg = 0 if scale is None else st.quant.frac_bits[0]
        acc = z if scale is None else z * scale.astype(np.int64)
        if bias is not None:
            acc = acc + (bias.astype(np.int64) << (NORM_FRAC + fg - bt.quant.frac_bits[0]))
        return saturate(rshift_round(acc, NORM_FRAC + fg - c.out_frac_bits), out_dtype(c).np)

    def tvm_lowering(self, c, L, x, scale=None, bias=None):
        t, out = c.in_types[0], c.out_types[0]
        ch, fx, rows = t.shape[-1], t.quant.frac_bits[0], t.shape[:-1]
        eps = _ln_eps(c.epsilon, fx, ch)

        def row(fn, name):      # a per-row stage (the row's index: all but the last axis)
            return L.te.compute(rows, lambda *r: fn(r), name=name)

        def dev(i, total):      # d = C*x - sum x
            return L.i64(ch) * L.i64(x[i]) - total[i[:-1]]
        k1, k2 = L.reduce_axis(ch), L.reduce_axis(ch)
        total = row(lambda r: L.sum(L.i64(x[r + (k1,)]), axis=k1), "sum")

        def square(r):          # d**2 of element k2 of the row
            d = dev(r + (k2,), total)
            return d * d
        var = row(lambda r: L.sum(square(r), axis=k2), "var")
        n = row(lambda r: var[r] + L.i64(eps), "n")
        k = row(lambda r: _rsqrt_shift(L, n[r], ch), "shift")
        r0 = row(lambda r: _rsqrt_estimate(L, n[r], k[r], ch), "estimate")
        root = row(lambda r: _rsqrt_root(L, n[r], k[r], r0[r], ch), "rsqrt")
        fg = 0 if scale is None else c.in_types[1].quant.frac_bits[0]

        def fn(*i):
            r = i[:-1]
            acc = L.rshift_round(dev(i, total) * root[r], k[r] - L.i64(NORM_FRAC))
            if scale is not None:
                acc = acc * L.i64(scale[i[-1]])
            if bias is not None:
                acc = acc + L.shl(bias[i[-1]], NORM_FRAC + fg - c.in_types[2].quant.frac_bits[0])
            return L.saturate(L.rshift_round(acc, NORM_FRAC + fg - c.out_frac_bits),
                              out_dtype(c).np)
        return L.compute(out, fn)
