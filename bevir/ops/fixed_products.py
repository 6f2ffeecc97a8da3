"""Fixed-point matrix products: ``fx_matmul``, ``fx_linear`` and ``fx_conv2d``. The exact
sum of the products of i8 (or i16) x by i8 weights, + bias, saturated to int32 and
requantized by Rescale, per tensor or per output channel.

Matrix products go through BLAS in float32 with the reduction split into blocks of 1024
(every partial sum of int8 products stays within 2**24, so it is exact); convolutions
through linalg's im2col GEMMs in float64 (exact below 2**53). No integer numpy matmul.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.opdef import Piece
from ..ir.types import Layout, Quant, TensorType
from .common import require
from .fixed_point import (I8, I16, OUT, WIDE_DTYPE, acc_quant, check_bias, fixed_type, frac_of,
                          out_dtype, require_out_frac, weight_quant)
from .linalg import (CONV_ATTRS, NCHW_CHANNEL_LIMIT, Contraction, Convolution, MatrixProduct,
                     batch_index, conv2d_nchw, conv2d_nhwc, conv_accumulator, from_nhwc,
                     matmul_shape, to_nhwc)
from .numerics import MAX_REDUCTION, Rescale, int_matmul, saturate
from .onnx_export import linear, matmul_bias, qdq


class _FxProduct(Contraction):
    """Shared by the product ops: acc = exact sum of the products of i8 or i16 x by i8
    weights, + bias, saturated to int32, requantized per tensor or per output channel by
    Rescale to out_dtype (default i8; i16 for 16-bit activations, and attention scores
    kept fine for a softmax)."""

    attrs = {**OUT, **WIDE_DTYPE}

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
            return Piece(((self.split_axis(c, kind), start, stop),)
                         + (None,) * (len(c.in_types) - 1))
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
    attrs = {**CONV_ATTRS, **OUT, **WIDE_DTYPE}

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
