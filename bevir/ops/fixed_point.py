"""bevir's own fixed-point integer ops: the INT8 scheme of the BEVFormer encoder, decoder
and heads.

Activations are ``i8`` with a per-tensor power-of-two scale, ``FixedPointQuant((f,))`` in
the type: real = q * 2**-f. Weights are ``i8`` per tensor or per output channel, either
``FixedPointQuant`` or symmetric ``AffineQuant`` (zero point 0) where a scale is not a
power of two. Biases and accumulators are ``i32``. Every op takes its result's frac bits as
the attribute ``out_frac_bits`` and builds the result type from it.

The integer conventions (round half up, Rescale requantization, saturation, the tables)
are defined once in :mod:`bevir.ops.numerics`, shared with the code generator.

docs/numerics.md ("bevir fixed-point ops") gives each op's formulas and error bounds. This
module holds the type rules every fixed-point op shares, the conversions (requantize;
quantize and dequantize at the float boundary; the bridge from onnxruntime's codes) and
the elementwise arithmetic and reductions. The other families have modules of their own:
:mod:`.fixed_products` (matmul, linear, conv2d), :mod:`.fixed_norms` (softmax, layer
norm), :mod:`.fixed_attention` (deformable attention), :mod:`.fixed_pool` (average
pooling) and :mod:`.fixed_tables` (functions as tables).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import InterpreterError
from ..ir.opdef import Bool, Int, Ints, OpDef, Str
from ..ir.types import AffineQuant, DType, FixedPointQuant, Layout, Quant, TensorType
from .common import RangeMap, broadcast_types, norm_axis, require
from .cost import per_element
from .numerics import Rescale, bridge_table, div_table, quantize_fixed, rshift_round, saturate
from .onnx_export import bridge, divide_by_count, identity, qdq
from .reduce import reduced_index

I8, I16, I32 = DType.i8, DType.i16, DType.i32
INT_TYPES = (DType.i8, DType.i16, DType.i32, DType.i64, DType.u8)


# ---- type helpers ------------------------------------------------------------------------
def fixed_quant(t: TensorType, what: str, dtypes=(I8,), axis: int | None = None) -> FixedPointQuant:
    """The operand's fixed-point quantization, per tensor (or per channel along ``axis``
    where given); raises VerifyError for another dtype or quantization."""
    require(t is not None and t.dtype in dtypes,
            f"{what} must be {'/'.join(str(d) for d in dtypes)}, got {t}")
    q = t.quant
    require(isinstance(q, FixedPointQuant),
            f"{what} must carry fixed-point quantization (fixed<frac_bits=...>), got {t}")
    require(q.axis is None or (axis is not None and q.axis == axis),
            f"{what} must be quantized per tensor" +
            ("" if axis is None else f" or per channel on axis {axis}") + f", got {t}")
    return q


def frac_of(t: TensorType, what: str, dtypes=(I8,)) -> int:
    """The frac bits of a per-tensor fixed-point operand."""
    return fixed_quant(t, what, dtypes).frac_bits[0]


def weight_quant(t: TensorType, what: str, axis: int | None) -> Quant:
    """An i8 weight's quantization: fixed point or symmetric affine, per tensor or per
    channel along ``axis``."""
    require(t.dtype is I8, lambda: f"{what} must be i8, got {t}")
    q = t.quant
    if isinstance(q, AffineQuant):
        require(all(z == 0 for z in q.zero_point),
                lambda: f"{what} must be symmetric (zero point 0), got {t}")
        require(q.axis is None or q.axis == axis, lambda: f"{what} must be quantized per "
                f"tensor or per channel on axis {axis}, got {t}")
        return q
    return fixed_quant(t, what, (I8,), axis)


def fixed_type(shape, frac: int, layout: Layout = Layout.plain, dtype: DType = I8) -> TensorType:
    """A per-tensor fixed-point type (the layout kept only on rank-4 shapes)."""
    shape = tuple(shape)
    return TensorType(shape, dtype, layout if len(shape) == 4 else Layout.plain,
                      FixedPointQuant((frac,)))


@functools.lru_cache(maxsize=4096)
def acc_quant(x_frac: int, wq: Quant) -> Quant:
    """The quantization of the int32 accumulator of an x (frac ``x_frac``) by w product,
    one parameter per tensor or per output channel."""
    if isinstance(wq, FixedPointQuant):
        return FixedPointQuant(tuple(x_frac + f for f in wq.frac_bits))
    return AffineQuant(tuple(math.ldexp(s, -x_frac) for s in wq.scale), (0,) * wq.channels)


def _params(q: Quant, n: int) -> tuple:
    """A quantization's parameters as a tuple of n per-channel entries (for comparison)."""
    if isinstance(q, FixedPointQuant):
        vals = tuple(("fixed", f) for f in q.frac_bits)
    else:
        vals = tuple(("affine", s, z) for s, z in zip(q.scale, q.zero_point))
    return vals * n if len(vals) == 1 else vals


def check_bias(b: TensorType | None, n: int, acc: Quant) -> None:
    """A bias is i32 [n], in the accumulator's units: unquantized, or quantized exactly as
    the accumulator (per tensor or per channel on axis 0)."""
    if b is None:
        return
    require(b.dtype is I32 and b.shape == (n,), lambda: f"bias must be i32 [{n}], got {b}")
    require(b.quant is None or _params(b.quant, n) == _params(acc, n),
            lambda: f"bias quantization {b.quant} differs from the accumulator's {acc}")


def require_out_frac(frac: int, lo: int = -31, hi: int = 31) -> None:
    require(lo <= frac <= hi, f"out_frac_bits {frac} outside [{lo}, {hi}]")


OUT = {"out_frac_bits": Int()}
#: the result's integer type, where an op may widen (sampling locations: i32)
WIDE_DTYPE = {"out_dtype": Str("i8", ("i8", "i16", "i32"))}
#: the result's integer type, where an op may give 16-bit activations
ACT_DTYPE = {"out_dtype": Str("i8", ("i8", "i16"))}
FIXED = (I8, I16, I32)


def out_dtype(c) -> DType:
    """The result dtype an op's ``out_dtype`` attribute names."""
    return DType[c.out_dtype]


# ---- requantization ----------------------------------------------------------------------
class FxRequantize(OpDef):
    """x (i8/i16/i32; fixed point or symmetric affine, per tensor or per channel) ->
    out_dtype (default i8) fixed<out_frac_bits>: Rescale.of(x's quantization, out_frac_bits)."""

    name = "fx_requantize"
    onnx_export = qdq(identity)
    cycle_cost = per_element(4)    # multiply, round, shift, saturate
    operands = ("x",)
    attrs = {**OUT, **WIDE_DTYPE}
    splits = ("rows",)

    def infer(self, c, x):
        require(x.dtype in (I8, I16, I32), f"x must be i8/i16/i32, got {x}")
        require(x.quant is not None, f"x must carry quantization, got {x}")
        require_out_frac(c.out_frac_bits)
        Rescale.of(x.quant, c.out_frac_bits)
        return fixed_type(x.shape, c.out_frac_bits, x.layout, out_dtype(c))

    def compute(self, c, x):
        q = c.in_types[0].quant
        return Rescale.of(q, c.out_frac_bits).apply(x, q.axis, out_dtype(c).np)

    def tvm_lowering(self, c, L, x):
        q, out = c.in_types[0].quant, c.out_types[0]
        r = Rescale.of(q, c.out_frac_bits)
        return L.compute(out, lambda *i: L.rescale(x[i], r, None if q.axis is None else i[q.axis],
                                                   out_dtype(c).np))


# ---- boundaries: float, onnxruntime's affine codes ---------------------------------------


class FxQuantize(OpDef):
    """x (f32) -> out_dtype (default i8) fixed<out_frac_bits>: quantize_fixed(x,
    out_frac_bits), round half up in float64 (exact), saturated; NaN becomes the minimum."""

    name = "fx_quantize"
    onnx_export = qdq(identity)
    cycle_cost = per_element(4)
    operands = ("x",)
    attrs = {**OUT, **WIDE_DTYPE}
    splits = ("rows",)
    pointwise = True

    def infer(self, c, x):
        require(x.dtype is DType.f32, f"x must be f32, got {x}")
        require_out_frac(c.out_frac_bits)
        return fixed_type(x.shape, c.out_frac_bits, x.layout, out_dtype(c))

    def compute(self, c, x):
        return quantize_fixed(x, c.out_frac_bits, out_dtype(c).np)

    def tvm_lowering(self, c, L, x):
        info = np.iinfo(out_dtype(c).np)

        def fn(*i):
            v = L.cast(x[i], "float64") * L.tirx.const(math.ldexp(1.0, c.out_frac_bits), "float64")
            v = L.min(L.max(v, L.tirx.const(info.min - 1.0, "float64")),
                      L.tirx.const(info.max + 1.0, "float64"))
            v = L.select(L.tirx.isnan(v), L.tirx.const(info.min - 1.0, "float64"), v)
            return L.saturate(L.cast(L.tirx.floor(v + L.tirx.const(0.5, "float64")), "int64"),
                              out_dtype(c).np)
        return L.compute(c.out_types[0], fn)


class FxDequantize(OpDef):
    """x (i8/i16/i32 fixed, per tensor or per channel) -> f32: x * 2**-frac_bits, computed
    in float64 and rounded once to float32 (exact for |x| <= 2**24)."""

    name = "fx_dequantize"
    onnx_export = qdq(identity)
    cycle_cost = per_element(4)
    operands = ("x",)
    splits = ("rows",)

    def infer(self, c, x):
        require(x.dtype in (I8, I16, I32), f"x must be i8/i16/i32, got {x}")
        fixed_quant(x, "x", (I8, I16, I32), axis=x.quant.axis if x.quant else None)
        return TensorType(x.shape, DType.f32, x.layout)

    def compute(self, c, x):
        q = c.in_types[0].quant
        f = np.asarray(q.frac_bits, np.int64)
        if f.size > 1:
            shape = [1] * x.ndim
            shape[q.axis] = -1
            f = f.reshape(shape)
        return np.ldexp(x.astype(np.float64), -f.reshape(f.shape if f.size > 1 else ())
                        ).astype(np.float32)

    def tvm_lowering(self, c, L, x):
        q = c.in_types[0].quant
        scale = L.const(np.ldexp(1.0, -np.asarray(q.frac_bits, np.int64)), "scale")
        return L.compute(c.out_types[0], lambda *i: L.cast(
            L.cast(x[i], "float64") * scale[0 if q.axis is None else i[q.axis]], "float32"))


class FxBridge(OpDef):
    """The hand-over from onnxruntime's INT8 backbone to the fixed-point head: x (u8/i8,
    per-tensor affine scale s, zero point z) -> out_dtype (i8, default, or i16)
    fixed<out_frac_bits>, transposed by
    ``perm`` (default: none). y = saturate(rshift_round((x - z) * m, n)) with
    (m, n) = Rescale.of(affine s, out_frac_bits); since s is a float32, m * 2**-n equals
    s * 2**out_frac_bits exactly, so y is (x - z) * s * 2**out_frac_bits rounded half up
    once. A table of the 256 codes."""

    name = "fx_bridge"
    onnx_export = staticmethod(bridge)
    operands = ("x",)
    attrs = {"out_frac_bits": Int(), "perm": Ints(()), **ACT_DTYPE}

    def infer(self, c, x):
        require(x.dtype in (DType.u8, I8), f"x must be u8/i8, got {x}")
        q = x.quant
        require(isinstance(q, AffineQuant) and q.axis is None,
                f"x must carry per-tensor affine quantization, got {x}")
        require_out_frac(c.out_frac_bits)
        Rescale.of(AffineQuant(q.scale, (0,)), c.out_frac_bits)
        if not c.perm:
            return fixed_type(x.shape, c.out_frac_bits, x.layout, out_dtype(c))
        require(sorted(c.perm) == list(range(x.rank)),
                f"perm {list(c.perm)} is not a permutation of {x.rank} axes")
        return fixed_type((x.shape[p] for p in c.perm), c.out_frac_bits, dtype=out_dtype(c))

    def compute(self, c, x):
        q = c.in_types[0].quant
        table = bridge_table(q.scale[0], q.zero_point[0], c.out_frac_bits, x.dtype,
                             out_dtype(c).np)
        y = table[x.view(np.uint8)]
        return np.ascontiguousarray(y.transpose(c.perm)) if c.perm else y

    def tvm_lowering(self, c, L, x):
        q = c.in_types[0].quant
        t = L.const(bridge_table(q.scale[0], q.zero_point[0], c.out_frac_bits,
                                 c.in_types[0].dtype.np, out_dtype(c).np), "bridge")
        perm = c.perm or tuple(range(c.in_types[0].rank))

        def fn(*i):
            idx = [None] * len(perm)
            for a, p in enumerate(perm):
                idx[p] = i[a]
            return t[L.cast(L.cast(x[tuple(idx)], "uint8"), "int32")]
        return L.compute(c.out_types[0], fn)


# ---- elementwise arithmetic --------------------------------------------------------------
def _broadcast(a: TensorType, b: TensorType) -> TensorType:
    return broadcast_types(a.with_(quant=None, dtype=I8), b.with_(quant=None, dtype=I8))


class _FxAddSub(OpDef):
    """a +/- b for i8/i16/i32 fixed operands: both shifted left to the larger frac bits F
    (exact), summed, then rshift_round by F - out_frac_bits and saturated to out_dtype
    (default i8); broadcasting."""

    cycle_cost = per_element(3)    # align shifts, add, saturate

    operands = ("a", "b")
    attrs = {**OUT, **WIDE_DTYPE}
    sign = 1
    splits = ("rows",)
    x_dtypes = FIXED

    def infer(self, c, a, b):
        fa, fb = frac_of(a, "a", self.x_dtypes), frac_of(b, "b", self.x_dtypes)
        require(abs(fa - fb) <= 31, f"frac bits {fa} and {fb} differ by more than 31")
        require_out_frac(c.out_frac_bits)
        Rescale.of(FixedPointQuant((max(fa, fb),)), c.out_frac_bits)
        t = _broadcast(a, b)
        return fixed_type(t.shape, c.out_frac_bits, t.layout, out_dtype(c))

    def compute(self, c, a, b):
        fa, fb = (t.quant.frac_bits[0] for t in c.in_types)
        f = max(fa, fb)
        s = (a.astype(np.int64) << (f - fa)) + self.sign * (b.astype(np.int64) << (f - fb))
        return saturate(rshift_round(s, f - c.out_frac_bits), out_dtype(c).np)

    def tvm_lowering(self, c, L, a, b):
        (ta, tb), out = c.in_types, c.out_types[0]
        fa, fb = ta.quant.frac_bits[0], tb.quant.frac_bits[0]
        f = max(fa, fb)

        def fn(*i):
            va = L.shl(a[L.broadcast_index(ta, out.shape, i)], f - fa)
            vb = L.shl(b[L.broadcast_index(tb, out.shape, i)], f - fb)
            s = va + vb if self.sign > 0 else va - vb
            return L.saturate(L.rshift_round(s, f - c.out_frac_bits), out_dtype(c).np)
        return L.compute(out, fn)


class FxAdd(_FxAddSub):
    """a + b (see _FxAddSub)."""

    name = "fx_add"
    onnx_export = qdq("add")
    result_over_operand = True


class FxSub(_FxAddSub):
    """a - b (see _FxAddSub)."""

    name = "fx_sub"
    onnx_export = qdq("sub")
    sign = -1


class FxMul(OpDef):
    """a (i8/i16/i32 fixed) * b (i8/i16 fixed; e.g. a constant): the exact product (frac
    fa + fb), rshift_round by fa + fb - out_frac_bits, saturated to out_dtype (default
    i8); broadcasting."""

    name = "fx_mul"
    onnx_export = qdq("mul")
    cycle_cost = per_element(3)    # multiply, rounding shift, saturate
    operands = ("a", "b")
    attrs = {**OUT, **WIDE_DTYPE}
    splits = ("rows",)
    x_dtypes = FIXED

    def infer(self, c, a, b):
        fa, fb = frac_of(a, "a", self.x_dtypes), frac_of(b, "b", (I8, I16))
        require_out_frac(c.out_frac_bits)
        Rescale.of(FixedPointQuant((fa + fb,)), c.out_frac_bits)
        t = _broadcast(a, b)
        return fixed_type(t.shape, c.out_frac_bits, t.layout, out_dtype(c))

    def compute(self, c, a, b):
        f = sum(t.quant.frac_bits[0] for t in c.in_types)
        return saturate(rshift_round(a.astype(np.int64) * b, f - c.out_frac_bits),
                        out_dtype(c).np)

    def tvm_lowering(self, c, L, a, b):
        (ta, tb), out = c.in_types, c.out_types[0]
        f = ta.quant.frac_bits[0] + tb.quant.frac_bits[0]
        return L.compute(out, lambda *i: L.saturate(L.rshift_round(
            L.i64(a[L.broadcast_index(ta, out.shape, i)])
            * L.i64(b[L.broadcast_index(tb, out.shape, i)]),
            f - c.out_frac_bits), out_dtype(c).np))


class FxDiv(OpDef):
    """x (i8/i16/i32 fixed) / count (an integer tensor, e.g. the cameras that see a query;
    broadcast to x; divisor max(count, 1) <= max_count) -> i8 fixed<out_frac_bits>: the
    exactly rounded (half up) quotient through a reciprocal multiplier (div_table)."""

    name = "fx_div"
    onnx_export = qdq(divide_by_count)
    cycle_cost = per_element(12)   # fixed-point division: reciprocal steps
    operands = ("x", "count")
    attrs = {**OUT, "max_count": Int(255)}
    splits = ("rows",)

    def _shifts(self, c, fx: int) -> tuple[int, int]:
        """(left shift of x, left shift of the divisor) from the frac-bit change."""
        t = c.out_frac_bits - fx
        return max(t, 0), max(-t, 0)

    def infer(self, c, x, count):
        fx = frac_of(x, "x", (I8, I16, I32))
        require(count.dtype in INT_TYPES and count.quant is None,
                f"count must be an unquantized integer tensor, got {count}")
        require(np.broadcast_shapes(x.shape, count.shape) == x.shape,
                f"count {list(count.shape)} does not broadcast to x {list(x.shape)}")
        require(1 <= c.max_count <= 1 << 16, f"max_count {c.max_count} outside [1, 65536]")
        require_out_frac(c.out_frac_bits)
        xs, ds = self._shifts(c, fx)
        require(xs <= 31 and div_table(c.max_count, ds)[2] <= 54,
                f"frac bits {fx} -> {c.out_frac_bits} with max_count {c.max_count}: "
                "shift out of range")
        return fixed_type(x.shape, c.out_frac_bits, x.layout)

    def compute(self, c, x, count):
        xs, ds = self._shifts(c, c.in_types[0].quant.frac_bits[0])
        d = np.broadcast_to(np.maximum(count.astype(np.int64), 1), x.shape)
        if d.max(initial=1) > c.max_count:
            raise InterpreterError(f"count {int(d.max())} exceeds max_count {c.max_count}")
        m_pos, m_neg, s = div_table(c.max_count, ds)
        den = d << ds
        num = np.clip(x.astype(np.int64) << xs, -129 * den, 129 * den)
        m = np.where(num >= 0, m_pos[d], m_neg[d])
        return saturate((num * m + (1 << (s - 1))) >> s)

    def tvm_lowering(self, c, L, x, count):
        (tx, tc), out = c.in_types, c.out_types[0]
        xs, ds = self._shifts(c, tx.quant.frac_bits[0])
        m_pos, m_neg, s = div_table(c.max_count, ds)
        tp, tn = L.const(m_pos, "m_pos"), L.const(m_neg, "m_neg")

        def fn(*i):
            # the golden model rejects counts above max_count; clamp so no load is out of range
            d = L.min(L.max(L.i64(count[L.broadcast_index(tc, out.shape, i)]), L.i64(1)),
                      L.i64(c.max_count))
            den = L.shl(d, ds)
            num = L.min(L.max(L.shl(x[i], xs), L.i64(-129) * den), L.i64(129) * den)
            m = L.select(num >= L.i64(0), tp[d], tn[d])
            return L.saturate(L.rshift_round(num * m, s), "int8")
        return L.compute(out, fn)


class FxReduceSum(RangeMap, OpDef):
    """Sum of i8 fixed x over ``axes`` (exact, int64), rshift_round to out_frac_bits and
    saturated: y = round_half_up(sum * 2**(out_frac_bits - f))."""

    name = "fx_reduce_sum"
    onnx_export = qdq("reduce_sum")
    cycle_cost = per_element(1, "reduce")
    operands = ("x",)
    attrs = {"axes": Ints(), "keepdims": Bool(True), **OUT}
    mean = False

    def row_axes(self, c) -> tuple[int, ...]:
        """The result axes but the last that are the operand's axis of the same index and
        not reduced: the axes not reduced where the reduced ones are kept, those before
        the first reduced axis where they are dropped ((2500, 256, 1, 2) -> (2500, 256, 1)
        over its last axis cuts the 2500 or the 256)."""
        rank, out = c.in_types[0].rank, c.out_types[0].rank
        axes = {norm_axis(a, rank) for a in c.axes}
        if c.keepdims:
            return tuple(a for a in range(rank - 1) if a not in axes)
        return tuple(range(min(min(axes, default=0), out - 1)))


    def infer(self, c, x):
        frac_of(x, "x")
        axes = {norm_axis(a, x.rank) for a in c.axes}
        require(self._count(x.shape, axes) < 1 << 24, "reduction longer than 2**24")
        require_out_frac(c.out_frac_bits)
        shape = [1 if i in axes else s for i, s in enumerate(x.shape)]
        if not c.keepdims:
            shape = [s for i, s in enumerate(shape) if i not in axes]
        return fixed_type(shape, c.out_frac_bits, x.layout)

    @staticmethod
    def _count(shape, axes) -> int:
        return math.prod(shape[a] for a in axes)

    def compute(self, c, x):
        t = c.in_types[0]
        axes = tuple(sorted({norm_axis(a, t.rank) for a in c.axes}))
        acc = x.astype(np.int64).sum(axis=axes, keepdims=c.keepdims)
        shift = t.quant.frac_bits[0] - c.out_frac_bits
        n = self._count(t.shape, axes) if self.mean else 1
        if n == 1:
            return saturate(rshift_round(acc, shift))
        # round_half_up(acc * 2**-shift / n) = floor((2 * num + den) / (2 * den))
        num, den = acc << max(-shift, 0), n << max(shift, 0)
        return saturate(np.floor_divide(2 * num + den, 2 * den))

    def tvm_lowering(self, c, L, x):
        t = c.in_types[0]
        axes = sorted({norm_axis(a, t.rank) for a in c.axes})
        rs = {a: L.reduce_axis(t.shape[a], f"r{a}") for a in axes}
        shift = t.quant.frac_bits[0] - c.out_frac_bits
        n = self._count(t.shape, axes) if self.mean else 1

        def acc(i):
            v = L.i64(x[tuple(reduced_index(i, t.rank, rs, c.keepdims))])
            return L.sum(v, axis=list(rs.values())) if rs else v
        s = L.te.compute(c.out_types[0].shape, lambda *i: acc(i), name="acc")

        def fn(*i):
            if n == 1:
                return L.saturate(L.rshift_round(s[i], shift), "int8")
            num, den = L.shl(s[i], max(-shift, 0)), n << max(shift, 0)
            return L.saturate(L.tirx.floordiv(L.i64(2) * num + L.i64(den), L.i64(2 * den)), "int8")
        return L.compute(c.out_types[0], fn)


class FxReduceMean(FxReduceSum):
    """Mean of i8 fixed x over ``axes``: the exact sum divided by the count, rounded half
    up once: y = round_half_up(sum * 2**(out_frac_bits - f) / n)."""

    name = "fx_reduce_mean"
    onnx_export = qdq("reduce_mean")
    mean = True


class FxRelu(OpDef):
    """max(x, 0) of i8 or i16 fixed x, requantized to out_frac_bits (default: x's frac
    bits), saturated to out_dtype (i8, default, or i16)."""

    name = "fx_relu"
    onnx_export = qdq("relu")
    cycle_cost = per_element(1)
    operands = ("x",)
    attrs = {"out_frac_bits": Int(None), **ACT_DTYPE}
    splits = ("rows",)
    x_dtypes = (I8, I16)

    def _out_frac(self, c, fx: int) -> int:
        return fx if c.out_frac_bits is None else c.out_frac_bits

    def infer(self, c, x):
        fx = frac_of(x, "x", self.x_dtypes)
        fy = self._out_frac(c, fx)
        require_out_frac(fy)
        Rescale.of(FixedPointQuant((fx,)), fy)
        return fixed_type(x.shape, fy, x.layout, out_dtype(c))

    def compute(self, c, x):
        fx = c.in_types[0].quant.frac_bits[0]
        return saturate(rshift_round(np.maximum(x, 0), fx - self._out_frac(c, fx)),
                        out_dtype(c).np)

    def tvm_lowering(self, c, L, x):
        fx = c.in_types[0].quant.frac_bits[0]
        return L.compute(c.out_types[0], lambda *i: L.saturate(L.rshift_round(
            L.max(L.i64(x[i]), L.i64(0)), fx - self._out_frac(c, fx)),
            out_dtype(c).np))
