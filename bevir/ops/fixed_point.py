"""bevir's own fixed-point integer ops: the INT8 scheme of the BEVFormer encoder, decoder
and heads.

Activations are ``i8`` with a per-tensor power-of-two scale, ``FixedPointQuant((f,))`` in
the type: real = q * 2**-f. Weights are ``i8`` per tensor or per output channel, either
``FixedPointQuant`` or symmetric ``AffineQuant`` (zero point 0) where a scale is not a
power of two. Biases and accumulators are ``i32``. Every op takes its result's frac bits as
the attribute ``out_frac_bits`` and builds the result type from it.

The integer conventions (round half up, Rescale requantization, saturation, the tables)
are defined once in :mod:`bevir.ops.numerics`, shared with the code generator.

docs/numerics.md ("bevir fixed-point ops") gives each op's formulas and error bounds. Matrix products go through
BLAS in float32 with the reduction split into blocks of 1024 (every partial sum of int8
products stays within 2**24, so it is exact); convolutions through linalg's im2col GEMMs
in float64 (exact below 2**53). No integer numpy matmul.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..errors import InterpreterError
from ..ir.opdef import Bool, Float, Int, Ints, OpDef, Piece, Str
from ..ir.types import AffineQuant, DType, FixedPointQuant, Layout, Quant, TensorType
from .attention import level_shapes
from . import native
from .common import broadcast_types, norm_axis, require
from .linalg import (CONV_ATTRS, NCHW_CHANNEL_LIMIT, Contraction, Convolution, MatrixProduct,
                     batch_index, conv2d_nchw, conv2d_nhwc, conv_accumulator, from_nhwc, matmul_shape,
                     to_nhwc)
from .numerics import (MAX_REDUCTION, NORM_FRAC, RECIP_BITS, Rescale, bilinear_taps,
                       bridge_table, div_table, int_matmul, quantize_fixed,
                       rshift_round, rsqrt_fixed, saturate, softmax_exp_table)
from .cost import per_element, sampling_work
from .reduce import reduced_index
from .onnx_export import bridge, divide_by_count, identity, linear, matmul_bias, ms_deform_attn, qdq

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
_WIDE = {"out_dtype": Str("i8", ("i8", "i16", "i32"))}
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
    attrs = {**OUT, **_WIDE}
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
    attrs = {**OUT, **_WIDE}
    splits = ("rows",)

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


# ---- matrix products ---------------------------------------------------------------------
class _FxProduct(Contraction):
    """Shared by the product ops: acc = exact sum of the products of i8 or i16 x by i8
    weights, + bias, saturated to int32, requantized per tensor or per output channel by
    Rescale to out_dtype (default i8; i16 for 16-bit activations, and attention scores
    kept fine for a softmax)."""

    attrs = {**OUT, **_WIDE}

    def weight_axis(self, w: TensorType) -> int | None:
        """The axis of w along which it may be quantized per output channel."""
        raise NotImplementedError

    def out_shape(self, c, x: TensorType, w: TensorType) -> tuple:
        raise NotImplementedError

    def accumulate(self, c, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _acc_quant(self, c) -> Quant:
        x, w = c.in_types[0], c.in_types[1]
        return acc_quant(x.quant.frac_bits[0], w.quant)

    #: the dtypes of operand 0: 16-bit activations by 8-bit weights accumulate in int64,
    #: saturated to int32 as the int8 sums are
    x_dtypes: tuple = (I8, I16)

    def infer(self, c, x, w, b=None):
        xf = frac_of(x, "x", self.x_dtypes)
        wq = weight_quant(w, "w", self.weight_axis(w))
        shape = self.out_shape(c, x, w)
        k = self.reduction(c, x, w)
        require(1 <= k <= MAX_REDUCTION, f"reduction length {k} outside [1, {MAX_REDUCTION}]")
        acc = acc_quant(xf, wq)
        channels = shape[self.channel_axis(shape, x)] if shape else 1
        require(acc.channels in (1, channels), "per-channel weight parameters do not fit")
        check_bias(b, channels, acc)
        require_out_frac(c.out_frac_bits)
        Rescale.of(acc, c.out_frac_bits)
        return fixed_type(shape, c.out_frac_bits, x.layout, out_dtype(c))

    def channel_axis(self, shape: tuple, x: TensorType) -> int:
        """The result axis of the output channels (per-channel parameters run along it)."""
        return len(shape) - 1

    def compute(self, c, x, w, b=None):
        acc = self.accumulate(c, x, w)
        axis = self.channel_axis(c.out_types[0].shape, c.in_types[0])
        if b is not None:
            shape = [1] * acc.ndim
            shape[axis] = -1
            acc = acc + b.astype(np.int64).reshape(shape)
        acc = saturate(acc, np.int32)
        return Rescale.of(self._acc_quant(c), c.out_frac_bits).apply(acc, axis, out_dtype(c).np)

    def pe_mappings(self, c):
        """The product's mappings; a 16-bit x takes two passes of the int8 MAC lanes (its
        high and low bytes), as the 16x8 modes of int8 arrays do."""
        maps = super().pe_mappings(c)
        if c.in_types[0].dtype is I8:
            return maps
        return tuple(dataclasses.replace(m, serial=2 * m.serial) for m in maps)

    def acc_dtype(self, c) -> str:
        """The accumulator's dtype: int32 holds any int8 sum (<= 2**16 products of 2**14);
        wider operands accumulate in int64."""
        return "int32" if all(t.dtype is I8 for t in c.in_types[:2]) else "int64"

    def lower_acc(self, c, L, x, w, i):
        """The exact accumulator of result element ``i`` (a reduction expression)."""
        raise NotImplementedError

    def accumulator(self, c, L, x, w):
        """The exact accumulator as a function of the result index (default: one compute
        of :meth:`lower_acc`)."""
        acc = L.te.compute(c.out_types[0].shape, lambda *i: self.lower_acc(c, L, x, w, i),
                           name="acc")
        return lambda i: acc[i]

    def tvm_lowering(self, c, L, x, w, b=None):
        out = c.out_types[0]
        axis = self.channel_axis(out.shape, c.in_types[0])
        acc = self.accumulator(c, L, x, w)
        r = Rescale.of(self._acc_quant(c), c.out_frac_bits)

        def fn(*i):
            v = L.i64(acc(i))
            if b is not None:
                v = L.saturate(v + L.i64(b[i[axis]]), "int32")
            return L.rescale(v, r, i[axis], out_dtype(c).np)
        return L.compute(out, fn)


class FxMatMul(_FxProduct, MatrixProduct):
    """a (i8 or i16 fixed, per tensor; i16: e.g. attention probabilities from an i16
    fx_softmax) @ b (i8 weight: fixed or symmetric affine, per tensor or per column) + bias
    (i32 [N], optional) -> out_dtype fixed<out_frac_bits>; numpy matmul shapes."""

    name = "fx_matmul"
    onnx_export = qdq(matmul_bias, product_bias=True)
    operands = ("a", "b", "bias?")

    def weight_axis(self, w):
        return self.column_axis(w)

    def out_shape(self, c, a, b):
        return matmul_shape(a, b)

    def infer(self, c, a, b, bias=None):
        require(bias is None or b.rank >= 2, "a bias needs a 2-D (or batched) b")
        return super().infer(c, a, b, bias)

    def accumulate(self, c, a, b):
        return int_matmul(a, b)

    def lower_acc(self, c, L, a, b, i):
        ta, tb, out = c.in_types[0], c.in_types[1], c.out_types[0]
        require(ta.rank >= 2 and tb.rank >= 2, "lowering takes matrices (rank >= 2)")
        k = L.reduce_axis(ta.shape[-1])
        batch = out.shape[:-2]
        ia = batch_index(ta, batch, i) + (i[-2], k)
        ib = batch_index(tb, batch, i) + (k, i[-1])
        dt = self.acc_dtype(c)
        return L.sum(L.cast(a[ia], dt) * L.cast(b[ib], dt), axis=k)


class FxLinear(_FxProduct):
    """x (i8 or i16 fixed, per tensor, [..., K]) by w (i8 [N, K], torch layout; fixed or
    symmetric affine, per tensor or per output channel on axis 0) + b (i32 [N], optional)
    -> out_dtype fixed<out_frac_bits> [..., N]."""

    name = "fx_linear"
    onnx_export = qdq(linear, product_bias=True)
    operands = ("x", "w", "b?")

    def weight_axis(self, w):
        return 0

    #: by rows of x (its leading axes), by output channels (rows of w)
    splits = ("rows", "columns")

    def split_axis(self, c, kind):
        if kind == "columns":
            return c.out_types[0].rank - 1
        return super().split_axis(c, kind)

    def split_piece(self, c, kind, start, stop):
        if kind == "rows":
            return Piece(((self.split_axis(c, kind), start, stop),) + (None,) * (len(c.in_types) - 1))
        return Piece((None, (0, start, stop)) + ((0, start, stop),) * (len(c.in_types) - 2))

    def weight_axes(self, c, w):
        return (1,)

    def out_shape(self, c, x, w):
        require(x.rank >= 1 and w.rank == 2 and w.shape[1] == x.shape[-1],
                f"w must be [N, {x.shape[-1] if x.rank else '?'}], got {w} for x {x}")
        return x.shape[:-1] + (w.shape[0],)

    def accumulator(self, c, L, x, w):
        dt = self.acc_dtype(c)
        acc = L.micro_matmul(x, w, c.out_types[0].shape) if dt == "int32" else None
        if acc is not None:
            return lambda i: acc[i]
        # w packed to [K, N], so that output channels run along contiguous memory (as b of
        # a matmul): one schedule serves both
        n, kk = c.in_types[1].shape
        wt = L.te.compute((kk, n), lambda k, o: w[o, k], name="w_packed")

        def element(*i):
            k = L.reduce_axis(kk)
            return L.sum(L.cast(x[tuple(i[:-1]) + (k,)], dt) * L.cast(wt[k, i[-1]], dt), axis=k)
        acc = L.te.compute(c.out_types[0].shape, element, name="acc")
        return lambda i: acc[i]

    def accumulate(self, c, x, w):
        k = x.shape[-1]
        return int_matmul(x.reshape(-1, k), w.T).reshape(*x.shape[:-1], w.shape[0])


class FxConv2d(_FxProduct, Convolution):
    """2-D convolution as conv2d (NCHW or NHWC i8 or i16 x; w [O, C/groups, KH, KW] fixed or
    symmetric affine, per tensor or per output channel on axis 0; b i32 [O]) -> out_dtype
    fixed<out_frac_bits>."""

    name = "fx_conv2d"
    onnx_export = qdq("conv2d", product_bias=True)
    operands = ("x", "w", "b?")
    attrs = {**CONV_ATTRS, **OUT, **_WIDE}

    def weight_axis(self, w):
        return 0

    def out_shape(self, c, x, w):
        return self.conv_shape(c, x, w)

    def channel_axis(self, shape, x):
        return 3 if x.layout is Layout.nhwc else 1

    def accumulator(self, c, L, x, w):
        return conv_accumulator(c, L, x, w, self.acc_dtype(c))

    def accumulate(self, c, x, w):
        layout = c.in_types[0].layout
        if layout is not Layout.nhwc and c.groups == 1 and x.shape[1] < NCHW_CHANNEL_LIMIT:
            y = conv2d_nchw(x, w, c.strides, c.pads, c.dilations, acc_dtype=np.float64)
        else:
            y = from_nhwc(conv2d_nhwc(to_nhwc(x, layout), w, c.strides, c.pads, c.dilations,
                                      c.groups, acc_dtype=np.float64), layout)
        return y.astype(np.int64)


# ---- elementwise arithmetic --------------------------------------------------------------
def _broadcast(a: TensorType, b: TensorType) -> TensorType:
    return broadcast_types(a.with_(quant=None, dtype=I8), b.with_(quant=None, dtype=I8))


class _FxAddSub(OpDef):
    """a +/- b for i8/i16/i32 fixed operands: both shifted left to the larger frac bits F
    (exact), summed, then rshift_round by F - out_frac_bits and saturated to out_dtype
    (default i8); broadcasting."""

    cycle_cost = per_element(3)    # align shifts, add, saturate

    operands = ("a", "b")
    attrs = {**OUT, **_WIDE}
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
    attrs = {**OUT, **_WIDE}
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
            L.i64(a[L.broadcast_index(ta, out.shape, i)]) * L.i64(b[L.broadcast_index(tb, out.shape, i)]),
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


class FxReduceSum(OpDef):
    """Sum of i8 fixed x over ``axes`` (exact, int64), rshift_round to out_frac_bits and
    saturated: y = round_half_up(sum * 2**(out_frac_bits - f))."""

    name = "fx_reduce_sum"
    onnx_export = qdq("reduce_sum")
    cycle_cost = per_element(1, "reduce")
    operands = ("x",)
    attrs = {"axes": Ints(), "keepdims": Bool(True), **OUT}
    mean = False

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


# ---- softmax -----------------------------------------------------------------------------


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
    attrs = {"axis": Int(-1), "out_frac_bits": Int(7), **_WIDE}
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


# ---- deformable attention ----------------------------------------------------------------


class FxMsDeformAttn(OpDef):
    """Integer multi-scale deformable attention (ms_deform_attn): value (i8 fixed, (bs, V,
    H, d)), sampling_locations (i16/i32 fixed<F>, (bs, Nq, H, L, P, 2) as (x, y): normalized
    [0, 1] or pixel coordinates, per ``coordinates``), attention_weights (i8 fixed, (bs, Nq,
    H, L, P)) -> i8 fixed<out_frac_bits> (bs, Nq, H*d). Pixel coordinates (pixel k's centre
    at k) are rounded to ``weight_bits`` B fraction bits; corner weights are products of
    the fractional parts (Q2B), times the attention weight, rshift_round by B; int32
    accumulation over levels, points and corners (out-of-range corners are zero), then
    rshift_round by fv + fa + B - out_frac_bits and saturation."""

    name = "fx_ms_deform_attn"
    onnx_export = qdq(ms_deform_attn)
    operands = ("value", "sampling_locations", "attention_weights")
    attrs = {"spatial_shapes": Ints(), **OUT, "weight_bits": Int(8),
             "coordinates": Str("normalized", ("normalized", "pixel"))}
    #: by batch (value, locations and weights of those batch entries), by queries (their
    #: locations and weights; the value replicated)
    splits = ("batch", "queries")

    def split_axis(self, c, kind):
        if kind in self.splits:
            return 0 if kind == "batch" else 1
        return super().split_axis(c, kind)

    def split_piece(self, c, kind, start, stop):
        axis = self.split_axis(c, kind)
        return Piece((None if kind == "queries" else (0, start, stop),
                      (axis, start, stop), (axis, start, stop)))

    def infer(self, c, value, loc, aw):
        fv, fa = frac_of(value, "value"), frac_of(aw, "attention_weights")
        fl = frac_of(loc, "sampling_locations", (I16, I32))
        require(value.rank == 4 and loc.rank == 6 and aw.rank == 5 and loc.shape[-1] == 2
                and loc.shape[:5] == aw.shape and value.shape[0] == loc.shape[0]
                and value.shape[2] == loc.shape[2], f"shapes do not fit: {value}, {loc}, {aw}")
        levels = level_shapes(c.spatial_shapes)
        require(len(c.spatial_shapes) == 2 * loc.shape[3] and
                value.shape[1] == sum(h * w for h, w in levels),
                f"spatial_shapes {list(c.spatial_shapes)} do not fit value {value} and "
                f"{loc.shape[3]} levels")
        require(1 <= c.weight_bits <= 12, f"weight_bits {c.weight_bits} outside [1, 12]")
        require(c.coordinates == "pixel" or fl >= 1, "normalized locations need frac bits >= 1")
        samples = loc.shape[3] * loc.shape[4]
        require(128 * samples * (128 * (1 << c.weight_bits) + 2) < 1 << 31,
                f"{samples} samples per output could overflow the int32 accumulator")
        require_out_frac(c.out_frac_bits)
        Rescale.of(FixedPointQuant((fv + fa + c.weight_bits,)), c.out_frac_bits)
        return fixed_type((loc.shape[0], loc.shape[1], value.shape[2] * value.shape[3]),
                          c.out_frac_bits)

    def pixel(self, c, coord: np.ndarray, size: int) -> np.ndarray:
        """Q(weight_bits) pixel coordinates from the locations along one axis."""
        f = c.in_types[1].quant.frac_bits[0]
        v = coord.astype(np.int64)
        if c.coordinates == "normalized":
            v = v * size - (1 << (f - 1))
        return rshift_round(v, f - c.weight_bits)

    def compute(self, c, value, loc, aw):
        bs, _, heads, d = value.shape
        acc = np.zeros((bs, loc.shape[1], heads, d), np.int32)
        start = 0
        for lvl, (h, w) in enumerate(level_shapes(c.spatial_shapes)):
            v = value[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(-1, d)
            start += h * w
            self._sample_level(c, acc, v, (h, w), loc[:, :, :, lvl], aw[:, :, :, lvl])
        fv, _, fa = (t.quant.frac_bits[0] for t in c.in_types)
        out = Rescale.of(FixedPointQuant((fv + fa + c.weight_bits,)), c.out_frac_bits).apply(acc)
        return out.reshape(bs, loc.shape[1], heads * d)

    def _sample_level(self, c, acc, v, size, loc, aw) -> None:
        """Accumulate one level's samples into acc (bs, Nq, H, d)."""
        (h, w), bits = size, c.weight_bits
        bs, _, heads, points = aw.shape
        base = (np.arange(bs)[:, None, None, None] * heads
                + np.arange(heads)[None, None, :, None]) * (h * w)
        a = aw.astype(np.int64)
        px, py = self.pixel(c, loc[..., 0], w), self.pixel(c, loc[..., 1], h)
        for xi, yi, wt in bilinear_taps(px, py, bits):
            ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            cw = np.where(ok, rshift_round(a * wt, bits), 0).astype(np.int32)
            idx = np.where(ok, yi * w + xi, 0) + base
            if native.gather_mac(v, idx, cw, acc):
                continue
            for p in range(points):
                acc += v[idx[..., p]].astype(np.int32) * cw[..., p, None]

    def tvm_lowering(self, c, L, value, loc, aw):
        bs, _, heads, d = c.in_types[0].shape
        nq, points = c.in_types[2].shape[1], c.in_types[2].shape[4]
        f, bits = c.in_types[1].quant.frac_bits[0], c.weight_bits
        one = L.i64(1 << bits)

        def pixel(coord, size):         # self.pixel on one coordinate
            v = L.i64(coord)
            if c.coordinates == "normalized":
                v = v * L.i64(size) - L.i64(1 << (f - 1))
            return L.rshift_round(v, f - bits)

        def taps(b, q, h, ch, lvl, p, start, size):
            """The level's 4 bilinear taps of value channel ch (bilinear_taps, _sample_level)."""
            (hh, ww), a = size, L.i64(aw[b, q, h, lvl, p])
            px, py = pixel(loc[b, q, h, lvl, p, 0], ww), pixel(loc[b, q, h, lvl, p, 1], hh)
            x0, y0 = px >> L.i64(bits), py >> L.i64(bits)
            ux, uy = px - (x0 << L.i64(bits)), py - (y0 << L.i64(bits))    # px & (one - 1)
            total = 0
            for xi, wx in ((x0, one - ux), (x0 + L.i64(1), ux)):
                for yi, wy in ((y0, one - uy), (y0 + L.i64(1), uy)):
                    inside = L.tirx.all(xi >= L.i64(0), xi < L.i64(ww), yi >= L.i64(0),
                                        yi < L.i64(hh))
                    pos = L.cast(L.i64(start) + yi * L.i64(ww) + xi, "int32")
                    v = L.guarded(inside, L.cast(value[b, pos, h, ch], "int32"), "int32")
                    total = total + v * L.cast(L.rshift_round(a * wx * wy, bits), "int32")
            return total

        levels = level_shapes(c.spatial_shapes)
        starts = np.cumsum([0] + [hh * ww for hh, ww in levels]).tolist()

        def acc(b, q, h, ch):           # int32 sum over levels (unrolled), points and taps
            p = L.reduce_axis(points, "p")
            return L.sum(sum(taps(b, q, h, ch, lvl, p, starts[lvl], size)
                             for lvl, size in enumerate(levels)), axis=p)
        a = L.te.compute((bs, nq, heads, d), acc, name="acc")
        fv, _, fa = (t.quant.frac_bits[0] for t in c.in_types)
        r = Rescale.of(FixedPointQuant((fv + fa + bits,)), c.out_frac_bits)
        return L.compute(c.out_types[0], lambda b, q, j: L.rescale(a[b, q, j // d, j % d], r,
                                                                    None, "int8"))

    def macs(self, c):
        return c.in_types[2].numel * c.in_types[0].shape[3] * 4


    def cycle_cost(self, c):
        return sampling_work(c.in_types[0], c.in_types[2])
