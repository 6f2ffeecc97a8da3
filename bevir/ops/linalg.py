"""Convolution and matrix products: the ops that carry the MACs.

Each op states what it sums; its kernel (bevir.ops.kernels: BLAS GEMMs, native FMA
products, operands prepared once per constant weight) computes it fast, bit for bit.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import Layout, TensorType
from ..ir.opdef import (Bool, FixedLowering, Float, Int, Ints, OpDef, Piece, aligned_range,
                        read_only)
from .common import conv_out_size, float_operands, nchw_dims, require, window_rows
from .cost import REQUANTIZE_OPS, PEMapping, Work
from .kernels import kernel_for, prepared_kernel
from .layout_rules import NATIVE
from .onnx_export import onnx_as

# the BLAS convolutions the fixed-point products call through this module
from .kernels.products import conv2d_sum_runner
from .kernels.conv import (NCHW_CHANNEL_LIMIT, conv2d_nchw, conv2d_nhwc,  # noqa: F401
                           from_nhwc, to_nhwc)


# ---- the product families: one shape rule and one MAC count each --------------------------
class Contraction(OpDef):
    """Ops whose results are sums of products: MACs = result elements x reduction length.
    ``reduction`` is the number of products summed per result element; ``weight_axes``
    the axes of the second operand (the weight) those products run over."""

    def reduction(self, c, x: TensorType, w: TensorType) -> int:
        return x.shape[-1]

    def weight_axes(self, c, w: TensorType) -> tuple[int, ...]:
        raise NotImplementedError(f"op '{self.name}' does not say which weight axes it reduces")

    def macs(self, c):
        return c.out_types[0].numel * self.reduction(c, *c.in_types[:2])

    #: cycle model: the class of its efficiency factor
    op_class = "matmul"

    def epilogue_ops(self, c) -> int:
        """ALU operations per result after the sum: a requantizing epilogue where the
        result is narrower than the int32 accumulator (the INT8 and 16-bit products,
        QLinear and fixed point alike), else the bias add."""
        out = c.out_types[0].dtype
        return REQUANTIZE_OPS if out.is_int and out.np.itemsize < 4 else 1

    def gemm_dims(self, c) -> tuple[int, int, int, int]:
        """(batch, M, N, K): results as batch x [M, N], each a K-long sum of products.
        Rows share the weight, so all leading axes fold into M."""
        out = c.out_types[0]
        n = out.shape[-1] if out.rank else 1
        return 1, out.numel // n, n, self.reduction(c, *c.in_types[:2])

    def pe_mappings(self, c) -> tuple[PEMapping, ...]:
        """Output stationary: M over PE rows and N over columns (K across the lanes), or
        M over every PE with the N columns in sequence (for small N)."""
        b, m, n, k = self.gemm_dims(c)
        return (PEMapping("MxN", ((m, "rows"), (n, "cols"), (k, "lanes")), 1, b, (1,)),
                PEMapping("M/pes", ((m, "pes"), (k, "lanes")), n, b))

    def tile_weight_bytes(self, c) -> int:
        """The weight bytes one tile of the array reads: all of them."""
        return c.in_types[1].nbytes

    def cycle_cost(self, c) -> Work:
        return Work(self.op_class, self.pe_mappings(c),
                    alu_ops=self.epilogue_ops(c) * c.out_types[0].numel,
                    tile_weight_bytes=self.tile_weight_bytes(c),
                    weight_bytes=c.in_types[1].nbytes)


CONV_ATTRS = {"strides": Ints((1, 1)), "pads": Ints((0, 0, 0, 0)), "dilations": Ints((1, 1)),
              "groups": Int(1)}


class Convolution(Contraction):
    """The 2-D convolutions (conv2d, conv2d_act, qlinear_conv, conv_integer, fx_conv2d):
    x [N,C,H,W] (plain or nchw) or [N,H,W,C] (nhwc), w [O, C/G, KH, KW] with G =
    ``groups``, ``pads`` = [top, left, bottom, right]; results in x's layout. In NCHW
    terms each result sums the products of a window of its group's input channels::

        y[n, o, p, q] = sum over c < C/G, i < KH, j < KW of
                        w[o, c, i, j] * x[n, g*C/G + c, p*sh + i*dh - top, q*sw + j*dw - left]

    with g = o // (O/G) the output channel's group, (sh, sw) = ``strides``, (dh, dw) =
    ``dilations``, and x read as 0 (its zero point, for codes) outside [0, H) x [0, W)."""

    attrs = CONV_ATTRS

    def conv_shape(self, c, x: TensorType, w: TensorType) -> tuple[int, ...]:
        """The result shape, in x's layout (VerifyError for operands that do not fit)."""
        require(x.rank == 4 and w.rank == 4, f"expects 4-D input and weight, got {x} and {w}")
        require(len(c.strides) == 2 and len(c.dilations) == 2 and len(c.pads) == 4,
                "strides and dilations take 2 values, pads 4")
        n, ch, h, wd = nchw_dims(x)
        o, cg, kh, kw = w.shape
        require(c.groups >= 1 and ch % c.groups == 0 and o % c.groups == 0
                and cg == ch // c.groups,
                f"weight {list(w.shape)} does not fit {ch} input channels in {c.groups} groups")
        oh = conv_out_size(h, kh, c.strides[0], c.pads[0] + c.pads[2], c.dilations[0])
        ow = conv_out_size(wd, kw, c.strides[1], c.pads[1] + c.pads[3], c.dilations[1])
        require(oh > 0 and ow > 0, "output would be empty")
        return (n, oh, ow, o) if x.layout is Layout.nhwc else (n, o, oh, ow)

    def reduction(self, c, x, w):
        return w.shape[1] * w.shape[2] * w.shape[3]

    def weight_axes(self, c, w):
        return (1, 2, 3)

    op_class = "conv"
    #: by images, by output rows (each piece reads a halo of input rows), by output channels
    splits = ("batch", "rows", "channels")

    def split_axis(self, c, kind):
        nhwc = c.in_types[0].layout is Layout.nhwc
        axes = {"batch": 0, "rows": 1 if nhwc else 2, "channels": 3 if nhwc else 1}
        if kind not in axes:
            return super().split_axis(c, kind)
        return None if kind == "channels" and c.groups != 1 else axes[kind]

    def split_piece(self, c, kind, start, stop):
        ranges: list = [None] * len(c.in_types)
        if kind == "batch":
            ranges[0] = (0, start, stop)
            return Piece(tuple(ranges))
        if kind == "channels":       # the weights' and the bias's rows of those channels
            ranges[1] = (0, start, stop)
            if len(ranges) > 2 and c.in_types[2] is not None:
                ranges[2] = (0, start, stop)
            return Piece(tuple(ranges))
        kh = c.in_types[1].shape[2]
        ranges[0], pads = window_rows(c, self.split_axis(c, "rows"), kh, start, stop)
        return Piece(tuple(ranges), {"pads": pads})

    def pe_mappings(self, c):
        """Output stationary: one output pixel per PE (OH over rows, OW over columns),
        the MAC lanes across the input channels of a group, or across its output
        channels (depthwise convolutions, few input channels); or the pixels over the
        rows and the output channels over the columns; or, as a matrix product's M/pes,
        the pixels of all images over every PE in turn (the lanes across the input
        channels), where OH and OW round up badly on the rows and columns."""
        n, o, oh, ow = nchw_dims(c.out_types[0])
        _, cg, kh, kw = c.in_types[1].shape
        og = o // c.groups
        # the images share the weights: their rows stack down the PE rows (a batch as an
        # outer loop would leave rows idle where an image is shorter than the array)
        pixels = ((n * oh, "rows"), (ow, "cols"))
        return (PEMapping("pixels/in-channels", pixels + ((cg, "lanes"),), o * kh * kw),
                PEMapping("pixels/out-channels", pixels + ((og, "lanes"),),
                          c.groups * cg * kh * kw, 1, (2,)),
                # small images: pixels down the rows, a group's output channels across
                PEMapping("pixels x out-channels", ((n * oh * ow, "rows"), (og, "cols"),
                                                    (cg, "lanes")), c.groups * kh * kw, 1,
                          (1,)),
                # e.g. 24 x 25 pixels: 768 PE slots where 32 x 32 rows x columns take 1024
                PEMapping("pixels/pes", ((n * oh * ow, "pes"), (cg, "lanes")), o * kh * kw))


def matmul_shape(a: TensorType, b: TensorType) -> tuple[int, ...]:
    """numpy.matmul's result shape: batched, broadcasting, 1-D operands promoted."""
    require(a.rank >= 1 and b.rank >= 1, "matmul operands must have rank >= 1")
    sa = a.shape if a.rank > 1 else (1,) + a.shape
    sb = b.shape if b.rank > 1 else b.shape + (1,)
    require(sa[-1] == sb[-2], f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    return batch + (sa[-2],) * (a.rank > 1) + (sb[-1],) * (b.rank > 1)


class MatrixProduct(Contraction):
    """The numpy-matmul products (matmul, qlinear_matmul, matmul_integer, fx_matmul): b's
    columns are the output channels, its rows the reduction."""

    def weight_axes(self, c, w):
        return (w.rank - 2,) if w.rank >= 2 else (0,)

    #: by batch (attention heads), by rows of a, by columns of b
    splits = ("batch", "rows", "columns")

    def split_axis(self, c, kind):
        a, b = c.in_types[:2]
        shape = c.out_types[0].shape
        if kind not in self.splits:
            return super().split_axis(c, kind)
        if a.rank < 2 or b.rank < 2:
            return None
        if kind == "batch":
            axes = [i for i in range(len(shape) - 2) if shape[i] > 1]
            return max(axes, key=lambda i: (shape[i], -i)) if axes else None
        return len(shape) - (2 if kind == "rows" else 1)

    def split_piece(self, c, kind, start, stop):
        a, b = c.in_types[:2]
        out = c.out_types[0]
        ranges: list = [None] * len(c.in_types)
        if kind == "batch":
            axis = self.split_axis(c, kind)
            ranges[0] = aligned_range(a, out, axis, start, stop)
            ranges[1] = aligned_range(b, out, axis, start, stop)
        elif kind == "rows":
            ranges[0] = (a.rank - 2, start, stop)
        else:                         # columns: of b, and of the bias where there is one
            ranges[1] = (b.rank - 1, start, stop)
            if len(ranges) > 2 and c.in_types[2] is not None:
                ranges[2] = (0, start, stop)
        return Piece(tuple(ranges))

    def gemm_dims(self, c):
        """A batched b (attention scores) differs per batch; a 2-D one is shared."""
        _, m, n, k = super().gemm_dims(c)
        b = c.in_types[1]
        batch = int(np.prod(c.out_types[0].shape[:-2])) if b.rank > 2 else 1
        return batch, m // batch, n, k

    def tile_weight_bytes(self, c):
        """A batched b: one batch's matrix per tile."""
        b = c.in_types[1]
        return b.nbytes // int(np.prod(b.shape[:-2])) if b.rank > 2 else b.nbytes

    @staticmethod
    def column_axis(b: TensorType) -> int | None:
        """The axis along which b may be quantized per channel: its columns (N)."""
        return b.rank - 1 if b.rank >= 2 else None


class Conv2d(Convolution):
    """2-D float convolution: the sum of :class:`Convolution`, plus ``b`` [O] (y + b[o]).
    The float sums run as BLAS sums the im2col GEMM, per group in (i, j, c) order; in
    (c, i, j) order for an ungrouped one of fewer than 16 input channels; tap by tap for
    a depthwise one (bevir.ops.kernels.conv): the same bits in either layout."""

    name = "conv2d"
    onnx_export = onnx_as("Conv", {"strides": "strides", "pads": "pads",
                                   "dilations": "dilations", "groups": "group"})
    fixed_point = FixedLowering("product")
    nhwc = NATIVE
    #: its kernels copy x into the order they sum in (NHWC, or im2col) first, so a view
    #: (an NCHW result kept in NHWC memory: the next convolution's copy is then free)
    #: gives the same bits as a C-ordered x
    any_memory_order = True
    #: its kernels write a new array (a transposed view of one in NCHW)
    fresh_results = True
    operands = ("x", "w", "b?")

    def infer(self, c, x, w, b=None):
        float_operands(x, w, *([b] if b else []))
        shape = self.conv_shape(c, x, w)
        require(b is None or b.shape == (w.shape[0],), f"bias must be [{w.shape[0]}], got {b}")
        return TensorType(shape, x.dtype, x.layout)

    def compute(self, c, x, w, b=None):
        return kernel_for("conv2d")(c, x, w, b)      # kernels/products.py

    def prepare(self, c, x, w, b=None):
        return prepared_kernel("conv2d", c, x, w, b)

    def bind_sum(self, node, first, activation):
        """NHWC, the weights graph constants: the native product with the addend in its
        pass (kernels.products.conv2d_sum_runner), made on the first call."""
        x, *weights = node.inputs
        if x.type.layout is not Layout.nhwc or not all(
                v is None or v.is_const and read_only(v.const) for v in weights):
            return None
        c, (w, *b) = self.ctx(node), [None if v is None else v.const for v in weights]
        out = node.outputs[0].type
        made: list = []

        def run(arrays, addend):
            if not made:
                made.append(conv2d_sum_runner(c, arrays[0], w, b[0] if b else None,
                                              activation))
            if (made[0] is None or addend.shape != out.shape or addend.dtype != np.float32
                    or not addend.flags.c_contiguous or arrays[0].shape != x.type.shape):
                return None
            return made[0](arrays[0], addend, first)
        return run


class MatMul(MatrixProduct):
    """numpy.matmul: y[..., m, n] = sum over k of a[..., m, k] * b[..., k, n], batched and
    broadcasting, 1-D operands promoted as numpy does. A stack of matrices times one
    matrix sums as one GEMM of all their rows (as onnxruntime does)."""

    name = "matmul"
    onnx_export = onnx_as("MatMul")
    fixed_point = FixedLowering("product")
    operands = ("a", "b")

    def infer(self, c, a, b):
        float_operands(a, b)
        return TensorType(matmul_shape(a, b), a.dtype)

    def compute(self, c, a, b):
        return kernel_for("matmul")(c, a, b)         # kernels/gemm.py


class Gemm(Contraction):
    """alpha * op(a) @ op(b) + beta * c, op = optional transpose; a and b are 2-D.
    With trans_b it is a linear layer (torch's weight layout)."""

    name = "gemm"
    onnx_export = onnx_as("Gemm", {"alpha": "alpha", "beta": "beta", "trans_a": "transA",
                                   "trans_b": "transB"})
    fixed_point = FixedLowering("product")
    operands = ("a", "b", "c?")
    attrs = {"alpha": Float(1.0), "beta": Float(1.0), "trans_a": Bool(False),
             "trans_b": Bool(False)}

    def infer(self, c, a, b, bias=None):
        float_operands(a, b, *([bias] if bias else []))
        require(a.rank == 2 and b.rank == 2, f"gemm takes 2-D operands, got {a} and {b}")
        m, k = a.shape[::-1] if c.trans_a else a.shape
        k2, n = b.shape[::-1] if c.trans_b else b.shape
        require(k == k2, f"inner dimensions differ: {k} and {k2}")
        if bias is not None:
            np.broadcast_shapes(bias.shape, (m, n))
        return TensorType((m, n), a.dtype)

    def compute(self, c, a, b, bias=None):
        a = a.T if c.trans_a else a
        b = b.T if c.trans_b else b
        y = np.matmul(a, b)
        if c.alpha != 1.0:
            y = y * a.dtype.type(c.alpha)
        if bias is not None:
            y = y + (bias if c.beta == 1.0 else bias * a.dtype.type(c.beta))
        return y.astype(a.dtype, copy=False)

    def reduction(self, c, a, b):
        return a.shape[0] if c.trans_a else a.shape[1]

    def weight_axes(self, c, w):
        return (1,) if c.trans_b else (0,)


# ---- lowerings shared by the integer product ops (their tvm_lowering) ------------------
def batch_index(t: TensorType, batch: tuple, i) -> tuple:
    """The batch index of matrix operand ``t`` for result index ``i`` (broadcast batches)."""
    lead = len(batch) - (t.rank - 2)
    return tuple(0 if t.shape[a] == 1 and batch[a + lead] != 1 else i[a + lead]
                 for a in range(t.rank - 2))


def conv_accumulator(c, L, x, w, dtype: str, x_zero: int = 0, w_zero: np.ndarray | None = None):
    """The exact accumulator of a convolution (NCHW or NHWC x, w [O, C/groups, KH, KW]) of
    the centered codes x - x_zero and w - w_zero (w_zero: None, or one zero point per
    output channel or one for all): a function from result index to its element. Padding
    reads as a centered 0. Where the build has a micro-kernel for it (an int32 sum of
    8-bit codes, weights centered at 0), that; else, ungrouped: x is packed into a padded
    NHWC buffer and w into [KH, KW, C, O], so the inner loop runs over output channels
    along contiguous memory (the ``conv_acc`` block the schedule vectorizes); grouped: one
    guarded load per product."""
    w_zero = None if w_zero is None or not np.any(w_zero) else w_zero
    if dtype == "int32" and w_zero is None:
        acc = L.micro_conv(c, x, w, int(x_zero))
        if acc is not None:
            return lambda i: acc[i]
    t, out = c.in_types[0], c.out_types[0]
    nhwc = t.layout is Layout.nhwc
    n, ch, hh, ww = (t.shape[0], t.shape[3], t.shape[1], t.shape[2]) if nhwc else t.shape
    o, cg, kh, kw = c.in_types[1].shape
    (sy, sx), (dy, dx) = c.strides, c.dilations
    top, left = c.pads[0], c.pads[1]
    nchw_of = (lambda i: (i[0], i[3], i[1], i[2])) if nhwc else (lambda i: tuple(i))

    def xv(b, cin, y, xx):
        load = x[(b, y, xx, cin) if nhwc else (b, cin, y, xx)]
        value = L.cast(load, dtype)
        return value - L.const_or_cast(x_zero, dtype) if x_zero else value

    wz = None if w_zero is None else L.const(np.asarray(w_zero, np.int32).reshape(-1), "wzp")

    def wv(oc, rc, ry, rx):
        v = L.cast(w[oc, rc, ry, rx], dtype)
        if wz is None:
            return v
        return v - L.cast(wz[oc if int(wz.shape[0]) > 1 else 0], dtype)

    if c.groups > 1:
        og = o // c.groups
        rc, ry, rx = L.reduce_axis(cg, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")

        def element(*i):
            b, oc, oy, ox = nchw_of(i)
            y, xx = oy * sy - top + ry * dy, ox * sx - left + rx * dx
            inside = L.tirx.all(y >= 0, y < hh, xx >= 0, xx < ww)
            v = L.tirx.if_then_else(inside, xv(b, (oc // og) * cg + rc, y, xx),
                                    L.tirx.const(0, dtype))
            return L.sum(v * wv(oc, rc, ry, rx), axis=[rc, ry, rx])
        acc = L.te.compute(out.shape, element, name="acc")
        return lambda i: acc[i]
    b_, oc_, oh, ow = nchw_of(out.shape)
    hp = max((oh - 1) * sy + (kh - 1) * dy + 1, top + hh)
    wp = max((ow - 1) * sx + (kw - 1) * dx + 1, left + ww)
    xp = L.te.compute((n, hp, wp, ch), lambda b, y, xx, cin: L.tirx.if_then_else(
        L.tirx.all(y >= top, y < top + hh, xx >= left, xx < left + ww),
        xv(b, cin, y - top, xx - left), L.tirx.const(0, dtype)), name="x_packed")
    wk = L.te.compute((kh, kw, cg, o), lambda ry, rx, rc, oc: wv(oc, rc, ry, rx), name="w_packed")
    rc, ry, rx = L.reduce_axis(cg, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")
    acc = L.te.compute((n, oh, ow, o), lambda b, oy, ox, oc: L.sum(
        xp[b, oy * sy + ry * dy, ox * sx + rx * dx, rc] * wk[ry, rx, rc, oc],
        axis=[ry, rx, rc]), name="conv_acc")
    return lambda i: acc[(lambda b, oc, oy, ox: (b, oy, ox, oc))(*nchw_of(i))]
