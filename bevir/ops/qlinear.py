"""Integer (quantized) ops with onnxruntime's CPU semantics, bit for bit.

Quantization parameters live in the types: an operand's scale and zero point are read from
its ``TensorType.quant`` (an :class:`AffineQuant`, per tensor or per channel along
``axis``); a result's parameters are attributes (``out_dtype``, ``out_scale``,
``out_zero_point``) from which ``infer`` builds the result type. docs/numerics.md gives
each op's exact integer definition and the onnxruntime (MLAS) routine it reproduces.

Integer accumulations run through float32 BLAS on the centered codes (exact small
integers), the reduction split so every partial sum stays below 2**24 and is exact
(:func:`~bevir.ops.kernels.gemm.exact_matmul`); the split parts add up in float64. The result is
the exact int32 accumulator. The rounding and requantization helpers are
:mod:`bevir.ops.numerics`. Binary elementwise ops on large tensors look their results
up in a table of every code pair, computed with the same formula.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.opdef import Bool, Float, Floats, Int, Ints, LayoutRule, OpDef, Str
from ..ir.types import AffineQuant, DType, Layout, TensorType
from .common import broadcast_types, norm_axis, require
from .layout_rules import AXIS, ELEMENTWISE, NATIVE, converted, nhwc_type
from .kernels.conv import (NCHW_CHANNEL_LIMIT, conv2d_nchw, conv2d_nhwc, from_nhwc,
                           int_conv2d_nhwc, to_nhwc)
from .kernels.gemm import F32_EXACT, exact_chunk, exact_int_matmul
from .kernels.pool import window_taps
from .linalg import CONV_ATTRS, Convolution, MatrixProduct, conv_accumulator, matmul_shape
from .common import pool_out, spatial_axes
from .nn import POOL_ATTRS, pool_infer
from .numerics import (conv_multiplier, fma32, lookup_table, mlas_logistic, requantize,
                       saturate_round)
from .cost import per_element
from .onnx_export import identity, integer_product, onnx_as, qdq

F32, F64 = np.float32, np.float64
_Q8 = ("i8", "u8")


# ---- helpers -----------------------------------------------------------------------------
def affine(t: TensorType, what: str, per_channel_axis: int | None = None,
           allow_none: bool = False) -> AffineQuant | None:
    """The operand's affine quantization: per tensor, or (where ``per_channel_axis`` is
    given) per channel along exactly that axis."""
    q = t.quant
    if q is None and allow_none:
        return None
    require(isinstance(q, AffineQuant), f"{what} must carry affine quantization, got {t}")
    if q.axis is not None:
        require(per_channel_axis is not None and q.axis == per_channel_axis,
                f"{what} must be quantized per tensor"
                + ("" if per_channel_axis is None else f" or per channel on axis "
                                                      f"{per_channel_axis}") + f", got {t}")
    return q


def _q8(t: TensorType, what: str) -> None:
    require(t.dtype in (DType.i8, DType.u8), f"{what} must be i8 or u8, got {t.dtype}")


def _qlinear_pair(x: TensorType, w: TensorType, names: tuple[str, str] = ("x", "w")) -> None:
    """The operand dtypes onnxruntime's QLinearConv / QLinearMatMul kernels take: u8 or i8
    each, except i8 activations with u8 weights (which it has no kernel for)."""
    _q8(x, names[0])
    _q8(w, names[1])
    require(not (x.dtype is DType.i8 and w.dtype is DType.u8),
            f"i8 {names[0]} with u8 {names[1]}: onnxruntime has no kernel for this combination")


def _out_type(c, shape, layout=Layout.plain, dtype: str | None = None) -> TensorType:
    dtype = DType(dtype or c.out_dtype)
    info = np.iinfo(dtype.np)
    require(info.min <= c.out_zero_point <= info.max,
            f"output zero point {c.out_zero_point} outside the {dtype} range")
    require(c.out_scale > 0 and np.isfinite(c.out_scale), "output scale must be positive")
    lo, hi = c.attrs.get("out_min"), c.attrs.get("out_max")
    require(all(b is None or info.min <= b <= info.max for b in (lo, hi))
            and (lo is None or hi is None or lo <= hi),
            f"clamp [{lo}, {hi}] is not an interval of {dtype} codes")
    shape = tuple(shape)
    return TensorType(shape, dtype, layout if len(shape) == 4 else Layout.plain,
                      AffineQuant((c.out_scale,), (c.out_zero_point,)))


def _params(q: AffineQuant, rank: int, axis: int | None = None):
    """(scale as float32, zero point as int32) arrays broadcastable to a rank-``rank``
    tensor quantized by ``q`` (per-channel parameters along ``q.axis`` or ``axis``)."""
    s, z = np.asarray(q.scale, F32), np.asarray(q.zero_point, np.int32)
    ax = q.axis if axis is None else axis
    if q.axis is None:
        return s.reshape(()), z.reshape(())
    shape = [1] * rank
    shape[ax] = len(q.scale)
    return s.reshape(shape), z.reshape(shape)


def _centered(x: np.ndarray, zp) -> np.ndarray:
    """x - zero_point (8-bit codes: |x - zp| <= 255), exactly, as float32 (for BLAS)."""
    return np.subtract(x, np.asarray(zp, F32), dtype=F32)


def _code_span(t: TensorType) -> int:
    """The largest |code - zero point| a tensor of type ``t`` can hold."""
    info = np.iinfo(t.dtype.np)
    zp = np.asarray(t.quant.zero_point if t.quant is not None else 0, np.int64)
    return int(max((info.max - zp).max(), (zp - info.min).max()))


def _add_bias(y: np.ndarray, bias: np.ndarray | None, bound: float) -> np.ndarray:
    """y + bias, exactly: in place when y is float32 and |y| <= bound leaves room for the
    bias below 2**24, else in float64."""
    if bias is None:
        return y
    if y.dtype == F32 and bound + float(np.abs(bias).max(initial=0)) <= F32_EXACT:
        y += bias.astype(F32)
        return y
    return y.astype(F64) + bias


# ---- quantize / dequantize ---------------------------------------------------------------
class Quantize(OpDef):
    """ONNX QuantizeLinear to i8/u8/i16: saturate(round_half_even(x / scale) + zero_point),
    the division in float32; per tensor (axis unset) or per channel along ``axis``."""

    name = "quantize"
    onnx_export = qdq(identity)
    nhwc = AXIS
    operands = ("x",)
    attrs = {"dtype": Str(choices=_Q8 + ("i16",)), "scale": Floats(), "zero_point": Ints(),
             "axis": Int(None)}
    splits = ("rows",)
    pointwise = True

    def row_axes(self, c):
        """The leading axes but a per-channel one (a range of it would take its scales)."""
        rank = c.out_types[0].rank
        own = None if c.axis is None else norm_axis(c.axis, rank)
        return tuple(a for a in range(rank - 1) if a != own)

    def infer(self, c, x):
        require(x.dtype is DType.f32, f"quantize takes f32, got {x.dtype}")
        axis = None if c.axis is None else norm_axis(c.axis, x.rank)
        q = AffineQuant(c.scale, c.zero_point, axis)
        return TensorType(x.shape, DType(c.dtype), x.layout, q)

    def compute(self, c, x):
        t = c.out_types[0]
        s, z = _params(t.quant, x.ndim)
        return saturate_round(np.divide(x, s, dtype=F32), z, t.dtype.np, scratch=True)

    def tvm_lowering(self, c, L, x):
        out = c.out_types[0]
        return _lower_elementwise_affine(L, out.quant, out, lambda i, scale, zp: (
            _lower_saturate_round(L, L.cast(x[i], "float32") / scale, zp, out)))


class Dequantize(OpDef):
    """ONNX DequantizeLinear: float32(int32(q) - zero_point) * scale (one float32
    multiply), with the scale and zero point of q's type."""

    name = "dequantize"
    onnx_export = qdq(identity)
    nhwc = ELEMENTWISE
    operands = ("x",)

    def infer(self, c, x):
        require(x.dtype.is_int, f"dequantize takes an integer operand, got {x.dtype}")
        affine(x, "the operand", per_channel_axis=x.quant.axis if x.quant else None)
        return TensorType(x.shape, DType.f32, x.layout)

    def compute(self, c, x):
        s, z = _params(c.in_types[0].quant, x.ndim)
        v = np.asarray(np.subtract(x, z.astype(F32), dtype=F32))   # |x - z| < 2**16: exact
        with np.errstate(over="ignore"):                 # a huge scale gives inf, as in ORT
            if v.shape == np.broadcast_shapes(v.shape, s.shape):
                return np.multiply(v, s, out=v)
            return v * s

    def tvm_lowering(self, c, L, x):
        # a device stage's way out to a float consumer (a group kept float inside the network)
        def real(i, scale, zp):
            return L.cast(L.cast(x[i], "int32") - zp, "float32") * scale
        return _lower_elementwise_affine(L, c.in_types[0].quant, c.out_types[0], real)


# ---- integer convolution and matrix products --------------------------------------------
_OUT_ATTRS = {"out_dtype": Str(choices=_Q8), "out_scale": Float(), "out_zero_point": Int(0)}
#: the result codes clamped to [out_min, out_max]: a relu / clip fused into the op
#: (fuse-qlinear-clip); unset bounds do not clamp
_CLAMP_ATTRS = {"out_min": Int(None), "out_max": Int(None)}


def _clamped(c, y: np.ndarray) -> np.ndarray:
    """The result codes ``y`` clamped as the op's fused relu / clip says."""
    if c.out_min is None and c.out_max is None:
        return y
    return np.clip(y, c.out_min, c.out_max).astype(y.dtype, copy=False)


def _lower_elementwise_affine(L, q: AffineQuant, out: TensorType, fn):
    """``out`` computed element by element as ``fn(index, scale, zero_point)``, with ``q``'s
    scale and zero point (those of the element's channel) as constants of the kernel."""
    scale = L.const(np.asarray(q.scale, F32), "scale")
    zp = L.const(np.asarray(q.zero_point, np.int32), "zp")

    def element(*i):
        ch = 0 if q.axis is None else i[q.axis]
        return fn(i, scale[ch], zp[ch])
    return L.compute(out, element)


def _lower_saturate_round(L, v, zp, t: TensorType):
    """saturate_round of the float32 expression ``v`` into type ``t``'s dtype: clamped to
    [min - zp, max - zp] as MAXPS / MINPS do (NaN -> the lower bound), rounded half to
    even, zero point added."""
    info, f32 = np.iinfo(t.dtype.np), lambda b: L.cast(b, "float32")
    zp = L.cast(zp, "int32")
    lo, hi = f32(L.tirx.const(info.min, "int32") - zp), f32(L.tirx.const(info.max, "int32") - zp)
    v = L.select(v > lo, v, lo)                  # a NaN compares false: lo
    v = L.select(v < hi, v, hi)
    return L.cast(L.cast(L.tirx.nearbyint(v), "int32") + zp, np.dtype(t.dtype.np).name)


def _lower_clamped(c, L, v, dtype: str):
    """_clamped of the result code expression ``v`` (of ``dtype``)."""
    if c.out_min is not None:
        v = L.max(v, L.const_or_cast(c.out_min, dtype))
    if c.out_max is not None:
        v = L.min(v, L.const_or_cast(c.out_max, dtype))
    return v


def _zero_points(c) -> tuple:
    """x's zero point (scalar) and w's (per tensor, or per output channel as [O])."""
    xq, wq = c.in_types[0].quant, c.in_types[1].quant
    xz = 0 if xq is None else xq.zero_point[0]
    wz = 0 if wq is None else np.asarray(wq.zero_point, F32).reshape(-1, 1, 1, 1)
    return xz, wz


def _int_conv(c, x, w, bias, finish, out_dtype) -> np.ndarray:
    """The results ``finish(acc, channel_axis)`` of the exact int32 accumulator
    acc = (x - x_zp) * (w - w_zp) + bias (float32 or float64 values), in NCHW or NHWC as
    x's layout. Ungrouped convolutions run tile by tile (:func:`int_conv2d_nhwc`), so
    ``finish`` sees [rows, O] blocks there."""
    xz, wz = _zero_points(c)
    layout = c.in_types[0].layout
    wc = _centered(w, wz)
    o, cg, kh, kw = w.shape
    product = _code_span(c.in_types[0]) * float(np.abs(wc).max(initial=0))
    chunk = exact_chunk(product)
    bound = product * cg * kh * kw
    small = layout is not Layout.nhwc and x.shape[1] < NCHW_CHANNEL_LIMIT
    if c.groups == 1 and not small:
        n, oh, ow = (c.out_types[0].shape[i] for i in ((0, 1, 2) if layout is Layout.nhwc
                                                          else (0, 2, 3)))
        out = np.empty((n, oh, ow, o), out_dtype)
        wm = wc.transpose(2, 3, 1, 0).reshape(kh * kw * cg, o)

        def epilogue(acc, rows):
            rows[...] = finish(_add_bias(acc, bias, bound), -1)
        int_conv2d_nhwc(to_nhwc(x, layout), xz, wm, (kh, kw), c.strides, c.pads,
                        c.dilations, chunk, epilogue, out)
        return from_nhwc(out, layout)
    xc = _centered(x, xz)
    if small and c.groups == 1:
        y = conv2d_nchw(xc, wc, c.strides, c.pads, c.dilations, acc_dtype=F32, chunk=chunk)
        return finish(y if bias is None else _add_bias(y, bias[:, None, None], bound), 1)
    y = conv2d_nhwc(to_nhwc(xc, layout), wc, c.strides, c.pads, c.dilations, c.groups,
                    acc_dtype=F32, chunk=chunk)
    return from_nhwc(finish(_add_bias(y, bias, bound), -1), layout)


def _channels(v: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-output-channel vector shaped to broadcast along ``axis`` of a rank-``rank``
    array (a scalar stays a scalar)."""
    if v.ndim == 0 or axis in (-1, rank - 1):
        return v
    shape = [1] * rank
    shape[axis] = -1
    return v.reshape(shape)


class QLinearConv(Convolution):
    """ONNX QLinearConv: x (i8/u8, per-tensor quant), w (i8/u8, per tensor or per output
    channel, axis 0), b (i32, optional); the int32 accumulator of (x - x_zp)(w - w_zp) + b
    is requantized by MlasRequantizeOutput with the float32 multiplier
    (x_scale * w_scale) / y_scale. Attributes as conv2d, plus the output quantization."""

    name = "qlinear_conv"
    onnx_export = qdq("conv2d", product_bias=True)
    nhwc = NATIVE
    operands = ("x", "w", "b?")
    attrs = {**CONV_ATTRS, **_OUT_ATTRS, **_CLAMP_ATTRS}

    def infer(self, c, x, w, b=None):
        _qlinear_pair(x, w)
        affine(x, "x")
        wq = affine(w, "w", per_channel_axis=0)
        require(b is None or (b.dtype is DType.i32 and b.shape == (w.shape[0],)),
                f"bias must be i32 [{w.shape[0]}], got {b}")
        require(wq.axis is None or wq.channels == w.shape[0], "w per-channel size mismatch")
        return _out_type(c, self.conv_shape(c, x, w), x.layout)

    def compute(self, c, x, w, b=None):
        xt, wt, yt = c.in_types[0], c.in_types[1], c.out_types[0]
        mult = conv_multiplier(xt.quant, wt.quant, yt.quant)
        zp, dtype = yt.quant.zero_point[0], yt.dtype.np

        def finish(acc, axis):
            return _clamped(c, requantize(acc, _channels(mult, axis, acc.ndim), zp, dtype))
        return _int_conv(c, x, w, b, finish, dtype)

    def tvm_lowering(self, c, L, x, w, b=None):
        xt, wt, yt = c.in_types[0], c.in_types[1], c.out_types[0]
        xz, wz = _zero_points(c)
        mult = L.const(conv_multiplier(xt.quant, wt.quant, yt.quant), "mult")
        o, cg, kh, kw = wt.shape
        exact32 = 255 * 255 * cg * kh * kw < 1 << 31
        acc = conv_accumulator(c, L, x, w, "int32" if exact32 else "int64", int(xz),
                               np.asarray(wz, np.int32).reshape(-1))
        axis = 3 if xt.layout is Layout.nhwc else 1

        def fn(*i):
            ch = i[axis]
            v = L.i64(acc(i)) + (0 if b is None else L.i64(b[ch]))
            v = L.cast(v, "float32") * mult[ch if mult.shape[0] > 1 else 0]
            code = _lower_saturate_round(L, v, yt.quant.zero_point[0], yt)
            return _lower_clamped(c, L, code, np.dtype(yt.dtype.np).name)
        return L.compute(yt, fn)


class ConvInteger(Convolution):
    """ONNX ConvInteger: the exact int32 sum of (x - x_zp)(w - w_zp), zero points from the
    operand types (none: 0); w's per tensor or per output channel (axis 0)."""

    name = "conv_integer"
    onnx_export = integer_product("ConvInteger", {"strides": "strides", "pads": "pads",
                                                  "dilations": "dilations", "groups": "group"})
    nhwc = NATIVE
    operands = ("x", "w")
    attrs = dict(CONV_ATTRS)

    def infer(self, c, x, w):
        _q8(x, "x")
        _q8(w, "w")
        affine(x, "x", allow_none=True)
        affine(w, "w", per_channel_axis=0, allow_none=True)
        shape = self.conv_shape(c, x, w)
        return TensorType(shape, DType.i32, x.layout)

    def compute(self, c, x, w):
        return _int_conv(c, x, w, None, lambda acc, axis: acc.astype(np.int32), np.int32)


def _int_matmul(c, a, b) -> np.ndarray:
    """The exact int32 product of (a - a_zp)(b - b_zp), as float32 or float64."""
    at, bt = c.in_types
    az = 0 if at.quant is None else at.quant.zero_point[0]
    bz = 0 if bt.quant is None else bt.quant.zero_point
    return exact_int_matmul(_centered(a, az), _centered(b, bz),
                            exact_chunk(_code_span(at) * _code_span(bt)))


class QLinearMatMul(MatrixProduct):
    """ONNX QLinearMatMul: a per tensor, b per tensor or per column (axis rank-1); the
    exact int32 product of (a - a_zp)(b - b_zp) requantized with the float32 multiplier
    (a_scale * b_scale) / y_scale, as QLinearConv."""

    name = "qlinear_matmul"
    onnx_export = qdq("matmul")
    operands = ("a", "b")
    attrs = {**_OUT_ATTRS, **_CLAMP_ATTRS}

    def infer(self, c, a, b):
        _qlinear_pair(a, b, ("a", "b"))
        affine(a, "a")
        affine(b, "b", per_channel_axis=MatrixProduct.column_axis(b))
        return _out_type(c, matmul_shape(a, b))

    def compute(self, c, a, b):
        at, bt, yt = c.in_types[0], c.in_types[1], c.out_types[0]
        acc = _int_matmul(c, a, b)
        mult = conv_multiplier(at.quant, bt.quant, yt.quant)
        return _clamped(c, requantize(acc, mult, yt.quant.zero_point[0], yt.dtype.np))


class MatMulInteger(MatrixProduct):
    """ONNX MatMulInteger: the exact int32 product of (a - a_zp)(b - b_zp), zero points
    from the types (none: 0), b's per tensor or per column."""

    name = "matmul_integer"
    onnx_export = integer_product("MatMulInteger")
    operands = ("a", "b")

    def infer(self, c, a, b):
        _q8(a, "a")
        _q8(b, "b")
        affine(a, "a", allow_none=True)
        affine(b, "b", per_channel_axis=MatrixProduct.column_axis(b), allow_none=True)
        return TensorType(matmul_shape(a, b), DType.i32)

    def compute(self, c, a, b):
        return _int_matmul(c, a, b).astype(np.int32)


# ---- elementwise (com.microsoft) ---------------------------------------------------------
def _vector_kind(ta: TensorType, tb: TensorType, out: tuple) -> str:
    """Which MLAS kernel variant onnxruntime's broadcast loop runs: 'a' (a is a scalar in
    each span), 'b' (b is) or 'ab' (both are vectors), from the innermost output axis
    that is not 1."""
    r = len(out)
    sa = (1,) * (r - ta.rank) + ta.shape
    sb = (1,) * (r - tb.rank) + tb.shape
    for da, db, do in zip(reversed(sa), reversed(sb), reversed(out)):
        if do == 1:
            continue
        if da == 1:
            return "a"
        if db == 1:
            return "b"
        return "ab"
    return "a"


class _QBinary(OpDef):
    """A binary op on 8-bit codes: each result depends on its two codes only, so results of
    large tensors are looked up in the table of all 256 x 256 code pairs, which
    :meth:`formula` computes (the same arithmetic as element by element)."""

    operands = ("a", "b")
    attrs = {**_OUT_ATTRS, **_CLAMP_ATTRS}
    splits = ("rows",)
    #: results with at least this many elements come from the table
    TABLE_MIN = 1 << 17

    def infer(self, c, a, b):
        _q8(a, "a")
        require(a.dtype == b.dtype, f"operand dtypes differ: {a.dtype} and {b.dtype}")
        require(c.out_dtype == str(a.dtype), f"result dtype must be the operands' {a.dtype}")
        affine(a, "a")
        affine(b, "b")
        t = broadcast_types(a.with_(quant=None), b.with_(quant=None))
        return _out_type(c, t.shape, t.layout)

    def formula(self, c, a: np.ndarray, b: np.ndarray, a_first: bool) -> np.ndarray:
        """The results for broadcastable code arrays ``a`` and ``b``; ``a_first``: which
        operand MLAS's kernel takes as its first (see :func:`_vector_kind`)."""
        raise NotImplementedError

    def _a_first(self, c) -> bool:
        ta, tb, tc = c.in_types[0], c.in_types[1], c.out_types[0]
        return _vector_kind(ta, tb, tc.shape) != "a"

    def table(self, c) -> np.ndarray:
        """The results of every code pair, indexed by (a's byte << 8) | b's byte."""
        codes = np.arange(256, dtype=np.uint8).view(c.in_types[0].dtype.np)
        return _clamped(c, self.formula(c, codes[:, None], codes[None, :],
                                        self._a_first(c))).reshape(-1)

    def compute(self, c, a, b):
        if c.out_types[0].numel < self.TABLE_MIN:
            return _clamped(c, self.formula(c, a, b, self._a_first(c)))
        index = np.left_shift(a.view(np.uint8), 8, dtype=np.uint16) | b.view(np.uint8)
        return self.table(c)[index]

    def tvm_lowering(self, c, L, a, b):
        # the table gives the formula's results exactly, whatever the tensor's size
        (ta, tb), out = c.in_types, c.out_types[0]
        table = L.const(self.table(c), "pairs")

        def byte(v, t, i):
            return L.cast(L.cast(v[L.broadcast_index(t, out.shape, i)], "uint8"), "int32")
        return L.compute(out, lambda *i: table[(byte(a, ta, i) << 8) | byte(b, tb, i)])


def _qlinear_add_ok(node) -> str | None:
    before = [v.type for v in node.inputs]
    after = [nhwc_type(v.type) if converted(v) else v.type for v in node.inputs]
    if _vector_kind(*before, node.output.type.shape) != _vector_kind(
            *after, nhwc_type(node.output.type).shape):
        return "its onnxruntime kernel variant would change"
    return None


class QLinearAdd(_QBinary):
    """com.microsoft QLinearAdd, as MLAS's AVX2 kernel (qladd_avx2.cpp, compiled with FMA
    contraction): V is the operand that varies within each span (a, unless a is the single
    value of its spans), S the other; rV = sV/sc, rS = sS/sc and
    fixed = zc - fma(rV, zV, rS*zS) in float32; per element fma(V, rV, fma(S, rS, fixed));
    round half to even, saturate."""

    name = "qlinear_add"
    onnx_export = qdq("add")
    nhwc = LayoutRule(check=_qlinear_add_ok)
    result_over_operand = True
    #: cycle model: two multiply-adds (fma(V, rV, fma(S, rS, fixed))), round, saturate
    cycle_cost = per_element(4)

    def formula(self, c, a, b, a_first):
        ta, tb, tc = c.in_types[0], c.in_types[1], c.out_types[0]
        (sc,), (zc,) = tc.quant.scale, tc.quant.zero_point
        operands = [(x.astype(F32), F32(t.quant.scale[0]) / F32(sc), F32(t.quant.zero_point[0]))
                    for x, t in ((a, ta), (b, tb))]
        if not a_first:                                # MLAS receives b first
            operands.reverse()
        (xv, rv, zv), (xs, rs, zs) = operands
        fixed = (F32(zc) - fma32(rv, zv, rs * zs)).astype(F32)
        v = fma32(xv, rv, fma32(xs, rs, fixed).astype(F32))
        return saturate_round(v, 0, tc.dtype.np)


class QLinearMul(_QBinary):
    """com.microsoft QLinearMul, as MLAS's SSE2 kernel: the exact int32 product
    (a - za)(b - zb), converted to float32, times (sa * sb) / sc, plus float32(zc); round
    half to even, saturate."""

    name = "qlinear_mul"
    onnx_export = qdq("mul")
    nhwc = ELEMENTWISE
    #: cycle model: the zero points off (2), the product, times the scale, + zc, round,
    #: saturate
    cycle_cost = per_element(7)

    def formula(self, c, a, b, a_first):
        ta, tb, tc = c.in_types[0], c.in_types[1], c.out_types[0]
        (sa,), (za,) = ta.quant.scale, ta.quant.zero_point
        (sb,), (zb,) = tb.quant.scale, tb.quant.zero_point
        (sc,), (zc,) = tc.quant.scale, tc.quant.zero_point
        ratio = F32(sa) * F32(sb) / F32(sc)
        prod = (a.astype(np.int32) - za) * (b.astype(np.int32) - zb)
        v = prod.astype(F32) * ratio + F32(zc)
        return saturate_round(v, 0, tc.dtype.np)


# ---- pooling, concat and lookup tables ---------------------------------------------------
def _not_channels_last(node) -> str | None:
    return "already channels_last" if node.attrs.get("channels_last") else None


class QLinearGlobalAvgPool(OpDef):
    """com.microsoft QLinearGlobalAveragePool (MlasQLinearGlobalAveragePoolNchw/Nhwc): the
    int32 sum over the image minus x_zp * image_size, requantized with the float32
    multiplier x_scale / (y_scale * float(image_size)); a multiplier outside [2**-32, 256)
    is an error, as onnxruntime's "parameter out of computation range"."""

    name = "qlinear_global_avgpool"
    onnx_export = qdq(lambda e, node, ins, outs: e.emit(
        "ReduceMean", [ins[0], e.ints(list(range(1, node.inputs[0].type.rank - 1)), "axes")], outs,
        keepdims=1) if node.attrs["channels_last"] else e.emit("GlobalAveragePool", ins, outs))
    nhwc = LayoutRule(native=True, data=(0,), check=_not_channels_last)
    operands = ("x",)
    attrs = {"out_scale": Float(), "out_zero_point": Int(0), "channels_last": Bool(False)}

    def _axes(self, c, x: TensorType) -> tuple[int, ...]:
        if c.channels_last or x.layout is Layout.nhwc:
            return tuple(range(1, x.rank - 1))
        return tuple(range(2, x.rank))

    def infer(self, c, x):
        _q8(x, "x")
        affine(x, "x")
        require(x.rank >= 3, f"expects an [N, C, spatial...] input, got {x}")
        axes = self._axes(c, x)
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        y = _out_type(c, shape, x.layout, str(x.dtype))
        size = self._size(c, x)
        require(size < 0x1000000, f"image of {size} elements is too large (onnxruntime: < 2**24)")
        mult = self._multiplier(x, y, size)
        require(2.0 ** -32 <= mult < 256.0, f"requantization multiplier x_scale / (y_scale * "
                f"{size}) = {mult:g} is outside onnxruntime's range [2**-32, 256)")
        return y

    def _size(self, c, x: TensorType) -> int:
        return int(np.prod([x.shape[a] for a in self._axes(c, x)]))

    @staticmethod
    def _multiplier(x: TensorType, y: TensorType, size: int) -> np.float32:
        return F32(x.quant.scale[0]) / (F32(y.quant.scale[0]) * F32(size))

    def compute(self, c, x):
        xt, yt = c.in_types[0], c.out_types[0]
        size = self._size(c, xt)
        acc = x.sum(axis=self._axes(c, xt), keepdims=True, dtype=np.int64)
        acc -= xt.quant.zero_point[0] * size
        return requantize(acc, self._multiplier(xt, yt, size), yt.quant.zero_point[0], yt.dtype.np)


class _QLookup(OpDef):
    operands = ("x",)
    splits = ("rows",)

    def infer(self, c, x):
        _q8(x, "x")
        affine(x, "x")
        return _out_type(c, x.shape, x.layout, str(x.dtype))

    def compute(self, c, x):
        xt, yt = c.in_types[0], c.out_types[0]
        table = lookup_table(xt.quant, yt.quant, x.dtype, lambda v: self.fn(c, v))
        return table[x.view(np.uint8)]


class QLinearSigmoid(_QLookup):
    """com.microsoft QLinearSigmoid: a 256-entry table of MlasComputeLogistic (see
    lookup_table and mlas_logistic)."""

    name = "qlinear_sigmoid"
    onnx_export = qdq("sigmoid")
    nhwc = ELEMENTWISE
    attrs = {"out_scale": Float(), "out_zero_point": Int(0)}

    def fn(self, c, v):
        return mlas_logistic(v)


class QLinearLeakyRelu(_QLookup):
    """com.microsoft QLinearLeakyRelu: a 256-entry table of v >= 0 ? v : v * alpha
    (float32)."""

    name = "qlinear_leaky_relu"
    onnx_export = qdq(onnx_as("LeakyRelu", {"alpha": "alpha"}))
    nhwc = ELEMENTWISE
    attrs = {"alpha": Float(0.01), "out_scale": Float(), "out_zero_point": Int(0)}

    def fn(self, c, v):
        return np.where(v >= 0, v, v * F32(c.alpha))


class QLinearConcat(OpDef):
    """com.microsoft QLinearConcat: an input quantized as the output is copied; any other
    goes through a 256-entry requantization table (lookup_table with the identity)."""

    name = "qlinear_concat"
    onnx_export = qdq("concat")
    nhwc = AXIS
    operands = ("*xs",)
    attrs = {"axis": Int(), **_OUT_ATTRS}

    def infer(self, c, *xs):
        require(len(xs) >= 1, "takes at least one operand")
        x = xs[0]
        _q8(x, "x")
        require(c.out_dtype == str(x.dtype), f"result dtype must be the operands' {x.dtype}")
        for t in xs:
            require(t.dtype == x.dtype, "operand dtypes differ")
            affine(t, "each operand")
        plain = [t.with_(quant=None) for t in xs]
        from .shape import Concat
        t = Concat.infer(self, c, *plain)
        return _out_type(c, t.shape, t.layout)

    def compute(self, c, *xs):
        yt = c.out_types[0]
        parts = []
        for x, t in zip(xs, c.in_types):
            if t.quant.scale == yt.quant.scale and t.quant.zero_point == yt.quant.zero_point:
                parts.append(x)
            else:
                table = lookup_table(t.quant, yt.quant, x.dtype, lambda v: v)
                parts.append(table[x.view(np.uint8)])
        return np.concatenate(parts, axis=norm_axis(c.axis, xs[0].ndim))


def avgpool_is_global(x: TensorType, kernel: Sequence[int], pads: Sequence[int]) -> bool:
    """Whether onnxruntime computes a QLinearAveragePool of ``x`` as QLinearGlobalAveragePool:
    one window covering the whole unpadded image."""
    return tuple(kernel) == tuple(x.shape[a] for a in spatial_axes(x)) and not any(pads)


class QLinearAvgPool(OpDef):
    """com.microsoft QLinearAveragePool (qlinear_pool.cc, 2-D): x dequantized to float32
    (x_scale * (x - x_zp)), each window summed in float32 in row-major tap order, divided
    by the float32 count (count_include_pad: the whole kernel, also for windows that
    ceil_mode runs past the input; else the taps inside the input) and quantized as
    nearbyint(v / y_scale + y_zp), saturated. The importer writes a window covering the
    whole unpadded image as ``qlinear_global_avgpool``, as onnxruntime computes it."""

    name = "qlinear_avgpool"
    onnx_export = qdq("avgpool2d")
    nhwc = NATIVE
    operands = ("x",)
    attrs = {**POOL_ATTRS, "count_include_pad": Bool(False), "out_scale": Float(),
             "out_zero_point": Int(0)}

    def infer(self, c, x):
        _q8(x, "x")
        affine(x, "x")
        t = pool_infer(c, x)
        return _out_type(c, t.shape, t.layout, str(x.dtype))

    def compute(self, c, x):
        xt, yt = c.in_types[0], c.out_types[0]
        s, z = _params(xt.quant, x.ndim)
        real = np.subtract(x, z, dtype=np.int32).astype(F32) * s
        axes, out = spatial_axes(xt), pool_out(c, xt)
        acc = np.zeros(yt.shape, F32)
        for tap in window_taps(real, axes, c, out, 0):
            acc += tap                  # taps in the padding add +0.0: the sum is unchanged
        counts = [self._counts(xt.shape[a], k, st, p, n, c.count_include_pad)
                  for a, k, st, p, n in zip(axes, c.kernel, c.strides, c.pads[:2], out)]
        shape = [1] * x.ndim
        shape[axes[0]], shape[axes[1]] = out
        acc /= np.outer(*counts).astype(F32).reshape(shape)
        (sy,), (zy,) = yt.quant.scale, yt.quant.zero_point
        return saturate_round(acc / F32(sy) + F32(zy), 0, yt.dtype.np)

    @staticmethod
    def _counts(size: int, k: int, stride: int, pad: int, n: int, include_pad: bool):
        """Per window along one axis, the divisor's factor (onnxruntime's hend - hstart)."""
        if include_pad:
            return np.full(n, k)
        start = np.arange(n) * stride - pad
        return np.minimum(start + k, size) - np.maximum(start, 0)
