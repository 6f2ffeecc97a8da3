"""Neural-network layers: pooling, normalization, softmax, resize and grid sampling.

2-D ops read x as NCHW (plain or nchw) or NHWC (nhwc), as conv2d does; ``pads`` are
[top, left, bottom, right].
"""
from __future__ import annotations

import math
from itertools import product

import numpy as np

from ..ir.types import DType, Layout, TensorType
from ..ir.opdef import (Bool, Ctx, FixedLowering, Float, Floats, Int, Ints, LayoutRule, OpDef, Piece,
                        Str)
from . import native
from .common import (float_operands, norm_axis, pool_dilations, pool_out, require,
                     spatial_axes, window_rows)
from .layout_rules import NATIVE, size_attr
from .shape import moved
from .cost import Work, per_element
from .onnx_export import onnx_as


def _acc(dtype: np.dtype) -> np.dtype:
    """The dtype to compute a float op in: at least float32."""
    return np.promote_types(dtype, np.float32)


# ---- pooling ---------------------------------------------------------------------------
def pool_infer(c, x: TensorType) -> TensorType:
    require(x.rank == 4, f"expects a 4-D input, got {x}")
    require(len(c.kernel) == 2 and len(c.strides) == 2 and len(c.pads) == 4
            and len(pool_dilations(c)) == 2, "kernel, strides and dilations take 2 values, pads 4")
    require(min(c.kernel + c.strides + pool_dilations(c)) >= 1 and min(c.pads) >= 0,
            "kernel, strides and dilations must be positive, pads non-negative")
    oh, ow = pool_out(c, x)
    require(oh > 0 and ow > 0, f"pooling window does not fit {x}")
    shape = list(x.shape)
    for a, o in zip(spatial_axes(x), (oh, ow)):
        shape[a] = o
    return moved(x, shape)


def pool_padded(x: np.ndarray, axes, c, out, fill, pads=None) -> np.ndarray:
    """``x`` with its two spatial ``axes`` padded with ``fill``, far enough for every
    window (ceil_mode included)."""
    pads = c.pads if pads is None else pads
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        need = (out[i] - 1) * c.strides[i] + pool_dilations(c)[i] * (c.kernel[i] - 1) + 1
        width[a] = (pads[i], max(need - pads[i] - x.shape[a], 0))
    if all(w == (0, 0) for w in width):
        return x
    # the input copied once and only the border slabs filled (np.pad writes everything twice)
    y = np.empty([n + lo + hi for n, (lo, hi) in zip(x.shape, width)], x.dtype)
    y[tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, width))] = native.contiguous(x)
    for a in axes:
        lo, n = width[a][0], x.shape[a]
        for band in (slice(0, lo), slice(lo + n, None)):
            y[(slice(None),) * a + (band,)] = fill
    return y


def window_taps(x: np.ndarray, axes, c, out, fill, pads=None):
    """Pad ``x`` (:func:`pool_padded`) and yield, per kernel tap, the strided view of the
    taps at every output position: KH*KW views of the output's shape."""
    x = pool_padded(x, axes, c, out, fill, pads)
    for taps in product(*(range(k) for k in c.kernel)):
        idx = [slice(None)] * x.ndim
        for i, (a, t) in enumerate(zip(axes, taps)):
            start = t * pool_dilations(c)[i]
            idx[a] = slice(start, start + c.strides[i] * (out[i] - 1) + 1, c.strides[i])
        yield x[tuple(idx)]


POOL_ATTRS = {"kernel": Ints(), "strides": Ints((1, 1)), "pads": Ints((0, 0, 0, 0)),
               "ceil_mode": Bool(False)}


class MaxPool2d(OpDef):
    """2-D max pooling; padding never wins (it is -inf, or the integer dtype's minimum)."""

    name = "maxpool2d"
    onnx_export = onnx_as("MaxPool", {"kernel": "kernel_shape", "strides": "strides",
                                      "pads": "pads", "ceil_mode": "ceil_mode",
                                      "dilations": "dilations"})
    nhwc = NATIVE
    fixed_point = FixedLowering("movement")       # the maximum of codes is the codes' maximum
    operands = ("x",)
    attrs = {**POOL_ATTRS, "dilations": Ints((1, 1))}

    def infer(self, c, x):
        require(x.dtype.is_float or x.dtype.is_int, f"expects a numeric operand, got {x.dtype}")
        return pool_infer(c, x)

    def cycle_cost(self, c):
        """One compare per window tap and result."""
        kh, kw = c.kernel
        return Work("reduce", alu_ops=c.out_types[0].numel * kh * kw)

    #: by images, by output rows (each piece reads the halo rows its windows need), by
    #: channels (each channel pools alone)
    splits = ("batch", "rows", "channels")

    def split_axis(self, c, kind):
        nhwc = c.in_types[0].layout is Layout.nhwc
        return {"batch": 0, "rows": 1 if nhwc else 2, "channels": 3 if nhwc else 1}[kind]

    def split_piece(self, c, kind, start, stop):
        axis = self.split_axis(c, kind)
        if kind != "rows":
            return Piece(((axis, start, stop),))
        rows, pads = window_rows(c, axis, c.kernel[0], start, stop)
        return Piece((rows,), {"pads": pads})

    def compute(self, c, x):
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        axes, out = spatial_axes(c.in_types[0]), pool_out(c, c.in_types[0])
        xp = pool_padded(x, axes, c, out, fill)
        # the native kernel vectorizes over channels: NCHW's one per pixel gives it nothing
        if c.in_types[0].layout is Layout.nhwc:
            y = np.empty((xp.shape[0], *out, xp.shape[3]), x.dtype)
            if native.maxpool(xp, y, c.kernel, c.strides, pool_dilations(c)):
                return y
        taps = window_taps(xp, axes, c, out, fill, pads=(0, 0))
        y = next(taps).copy()
        for t in taps:
            np.maximum(y, t, out=y)
        return y

    def tvm_lowering(self, c, L, x):
        t = c.in_types[0]
        require(t.dtype.is_int, "the lowering takes integer codes")
        (ah, aw), out = spatial_axes(t), c.out_types[0]
        ry, rx = L.reduce_axis(c.kernel[0], "ry"), L.reduce_axis(c.kernel[1], "rx")
        lowest = L.tirx.const(int(np.iinfo(t.dtype.np).min), x.dtype)

        def fn(*i):
            idx = list(i)
            idx[ah] = i[ah] * c.strides[0] - c.pads[0] + ry * pool_dilations(c)[0]
            idx[aw] = i[aw] * c.strides[1] - c.pads[1] + rx * pool_dilations(c)[1]
            inside = L.tirx.all(idx[ah] >= 0, idx[ah] < t.shape[ah],
                                idx[aw] >= 0, idx[aw] < t.shape[aw])
            # padding (and ceil_mode's overhang) reads as the minimum: it never wins
            return L.te.max(L.tirx.if_then_else(inside, x[tuple(idx)], lowest), axis=[ry, rx])
        return L.te.compute(out.shape, fn, name="y")


class MaxPool2dIndices(OpDef):
    """ONNX MaxPool's Indices output: per window, the flat index in x of the maximum (the
    first one in window order on a tie; padding never wins), x taken row-major (NCHW;
    ``storage_order`` 0) or with H and W column-major (1)."""

    name = "maxpool2d_indices"
    operands = ("x",)
    attrs = {**MaxPool2d.attrs, "storage_order": Int(0)}

    def infer(self, c, x):
        require(x.layout is not Layout.nhwc, f"expects NCHW, got {x}")
        return TensorType(pool_infer(c, x).shape, DType.i64)

    def compute(self, c, x):
        axes, out = (2, 3), pool_out(c, c.in_types[0])
        n, ch, h, w = x.shape
        flat = np.arange(x.size, dtype=np.int64).reshape(x.shape)
        if c.storage_order == 1:
            flat = (flat // (h * w)) * (h * w) + np.arange(w)[None, :] * h + np.arange(h)[:, None]
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        best, where = None, None
        for tap, idx in zip(window_taps(x, axes, c, out, fill), window_taps(flat, axes, c, out, -1)):
            if best is None:
                best, where = tap.copy(), idx.copy()
                continue
            wins = tap > best
            best = np.where(wins, tap, best)
            where = np.where(wins, idx, where)
        return where

    def onnx_export(self, e, node, ins, outs):
        a = node.attrs
        e.emit("MaxPool", ins, [e.fresh("values")] + outs, kernel_shape=list(a["kernel"]),
               strides=list(a["strides"]), pads=list(a["pads"]), dilations=list(a["dilations"]),
               ceil_mode=int(a["ceil_mode"]), storage_order=a["storage_order"])


class AvgPool2d(OpDef):
    """2-D average pooling (window taps ``dilations`` apart). The divisor counts the
    window's elements inside the input, or inside input + pads with count_include_pad
    (windows that ceil_mode runs past the pads count only what they cover, as ONNX
    AveragePool and torch do)."""

    name = "avgpool2d"
    onnx_export = onnx_as("AveragePool", {"kernel": "kernel_shape", "strides": "strides",
                                          "pads": "pads", "ceil_mode": "ceil_mode",
                                          "count_include_pad": "count_include_pad",
                                          "dilations": "dilations"})
    nhwc = NATIVE
    fixed_point = FixedLowering("avgpool")
    operands = ("x",)
    attrs = {**POOL_ATTRS, "count_include_pad": Bool(False), "dilations": Ints((1, 1))}

    def infer(self, c, x):
        float_operands(x)
        return pool_infer(c, x)

    def compute(self, c, x):
        t = c.in_types[0]
        axes, out = spatial_axes(t), pool_out(c, t)
        y = np.zeros(c.out_types[0].shape, _acc(x.dtype))
        for tap in window_taps(x, axes, c, out, 0):
            y += tap
        y /= avgpool_counts(c, t, y.dtype)    # a window covering nothing averages to 0
        return y.astype(x.dtype, copy=False)


def avgpool_counts(c, t: TensorType, dtype) -> np.ndarray:
    """Average pooling's divisor at each output position (at least 1), shaped to broadcast
    against the output: the windows taken over a mask of what counts (the input, or the
    input and its pads with count_include_pad)."""
    axes, out = spatial_axes(t), pool_out(c, t)
    h, w = (t.shape[a] for a in axes)
    top, left, bottom, right = c.pads
    if c.count_include_pad:
        mask, pads = np.ones((h + top + bottom, w + left + right), dtype), (0, 0)
    else:
        mask, pads = np.ones((h, w), dtype), (top, left)
    shape = [1] * 4
    shape[axes[0]], shape[axes[1]] = out
    return np.maximum(sum(window_taps(mask, (0, 1), c, out, 0, pads)), 1).reshape(shape)


def mlas_global_mean(x: np.ndarray, channels_last: bool = False) -> np.ndarray:
    """Mean over the spatial axis of ``x`` [N, C, S] ([N, S, C] with ``channels_last``),
    summed as onnxruntime's float GlobalAveragePool does (MLAS ``MlasPoolGlobalKernel``):
    four lanes, lane j summing elements j, j + 4, ... in order; the lanes reduced as
    (l0 + l2) + (l1 + l3); the last S % 4 elements added one by one; the sum divided by S.
    In ``x``'s dtype; the result is [N, C].

    numpy's add.reduce adds row after row along any axis but the contiguous one (there it
    sums pairwise), so the lanes are laid out with the spatial steps outermost: a view of
    channels-last data, a byte copy of 4-element units of channels-first data."""
    if channels_last:
        n, s, ch = x.shape
        body = s - s % 4
        lanes = np.add.reduce(x[:, :body].reshape(n, body // 4, 4, ch), axis=1)    # [N, 4, C]
        lane, element = (lambda j: lanes[:, j]), (lambda i: x[:, i])
    else:
        n, ch, s = x.shape
        body = s - s % 4
        rows = x.reshape(-1, s)
        unit = np.dtype((np.void, 4 * x.dtype.itemsize))
        steps = np.ascontiguousarray(rows[:, :body].view(unit).T).view(x.dtype)
        lanes = np.add.reduce(steps, axis=0).reshape(-1, 4)                      # [N*C, 4]
        lane, element = (lambda j: lanes[:, j]), (lambda i: rows[:, i])
    total = (lane(0) + lane(2)) + (lane(1) + lane(3))
    for i in range(body, s):
        total += element(i)
    return (total / x.dtype.type(s)).reshape(n, ch)


class GlobalAvgPool(OpDef):
    """Mean over the spatial axes (all but N and C), kept as size 1, summed in
    onnxruntime's order (:func:`mlas_global_mean`)."""

    name = "global_avgpool"
    onnx_export = onnx_as("GlobalAveragePool")
    nhwc = NATIVE
    fixed_point = FixedLowering("global_pool")
    operands = ("x",)

    def infer(self, c, x):
        float_operands(x)
        require(x.rank == 4 if x.layout is Layout.nhwc else x.rank >= 3,
                f"expects an [N, C, spatial...] input, got {x}")
        return moved(x, (1 if i in _global_axes(x) else d for i, d in enumerate(x.shape)))

    def compute(self, c, x):
        # the summation order is onnxruntime's in either layout: the result does not
        # depend on the layout or on the memory order of x
        nhwc = c.in_types[0].layout is Layout.nhwc
        flat = np.ascontiguousarray(x, _acc(x.dtype))
        flat = flat.reshape(x.shape[0], -1, x.shape[3]) if nhwc else flat.reshape(x.shape[:2] + (-1,))
        mean = mlas_global_mean(flat, channels_last=nhwc)
        return mean.astype(x.dtype, copy=False).reshape(c.out_types[0].shape)


def _global_axes(t: TensorType) -> tuple[int, ...]:
    return (1, 2) if t.layout is Layout.nhwc else tuple(range(2, t.rank))


# ---- normalization ---------------------------------------------------------------------
class BatchNorm(OpDef):
    """Inference batch norm: (x - mean) / sqrt(var + epsilon) * scale + bias, per channel
    (axis 1, or 3 for nhwc), computed in float32."""

    name = "batch_norm"
    onnx_export = onnx_as("BatchNormalization", {"epsilon": "epsilon"})
    fixed_point = FixedLowering("batch_norm")
    nhwc = NATIVE
    operands = ("x", "scale", "bias", "mean", "var")
    attrs = {"epsilon": Float(1e-5)}

    def infer(self, c, x, *params):
        float_operands(x)
        require(x.rank == 4 if x.layout is Layout.nhwc else x.rank >= 2,
                f"expects an [N, C, ...] input, got {x}")
        ch = x.shape[_channel_axis(x)]
        for p in params:
            require(p.dtype.is_float and p.shape == (ch,), f"parameters must be [{ch}], got {p}")
        return x

    def compute(self, c, x, scale, bias, mean, var):
        t = c.in_types[0]
        acc = _acc(x.dtype)
        shape = [1] * x.ndim
        shape[_channel_axis(t)] = -1
        scale, bias, mean, var = (p.astype(acc, copy=False).reshape(shape)
                                  for p in (scale, bias, mean, var))
        y = (x.astype(acc, copy=False) - mean) / np.sqrt(var + acc.type(c.epsilon)) * scale + bias
        return y.astype(x.dtype, copy=False)


def _channel_axis(t: TensorType) -> int:
    return 3 if t.layout is Layout.nhwc else 1


class LayerNorm(OpDef):
    """ONNX LayerNormalization: normalize over axes axis..rank-1, then * scale + bias
    (both broadcast over those axes). Two-pass mean and variance in (at least) float32."""

    name = "layer_norm"
    cycle_cost = per_element(10, "norm")
    fixed_point = FixedLowering("layer_norm")
    operands = ("x", "scale?", "bias?")
    attrs = {"axis": Int(-1), "epsilon": Float(1e-5)}

    def onnx_export(self, e, node, ins, outs):
        """ONNX LayerNormalization, whose scale is not optional: ones where it is absent."""
        scale = node.inputs[1] if len(node.inputs) > 1 else None
        ins = [ins[0], ins[1] if scale is not None else _ones_scale(e, node)] + ins[2:]
        attrs = {k: node.attrs[k] for k in ("axis", "epsilon") if node.attrs.get(k) is not None}
        e.emit("LayerNormalization", ins, outs, **attrs)

    def infer(self, c, x, scale=None, bias=None):
        float_operands(x, *(p for p in (scale, bias) if p is not None))
        norm = x.shape[norm_axis(c.axis, x.rank):]
        for p in (scale, bias):
            require(p is None or (p.rank <= len(norm) and all(
                d in (1, n) for d, n in zip(p.shape[::-1], norm[::-1]))),
                f"{p} does not broadcast over the normalized shape {list(norm)}")
        return x

    def compute(self, c, x, scale=None, bias=None):
        _, d, var = _moments(x, c.axis)
        y = d / np.sqrt(var + var.dtype.type(c.epsilon))
        if scale is not None:
            y *= scale
        if bias is not None:
            y += bias
        return y.astype(x.dtype, copy=False)


def _ones_scale(e, node):
    """A scale of ones over the normalized axes of ``node``'s first operand (ONNX
    LayerNormalization needs one), float32 where the operand is codes (a QDQ export)."""
    x = node.inputs[0].type
    axis = norm_axis(node.attrs.get("axis", -1), x.rank)
    dtype = x.dtype.np if x.dtype.np.kind == "f" else np.float32
    return e.const(np.ones(x.shape[axis:], dtype), "scale")


def _moments(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, x - mean, variance) over axes axis..rank-1, kept as size-1 dims: layer_norm's
    two-pass statistics in (at least) float32, shared with layer_norm_stats."""
    acc = _acc(x.dtype)
    axes = tuple(range(norm_axis(axis, x.ndim), x.ndim))
    mean = x.mean(axis=axes, keepdims=True, dtype=acc)
    d = x.astype(acc, copy=False) - mean
    return mean, d, np.mean(np.square(d), axis=axes, keepdims=True)


class LayerNormStats(OpDef):
    """ONNX LayerNormalization's Mean and InvStdDev outputs (stash_type float32): the
    statistics layer_norm normalizes ``x`` with, over axes axis..rank-1 kept as size-1 dims;
    inv_std_dev = 1 / sqrt(variance + epsilon)."""

    name = "layer_norm_stats"
    operands = ("x",)
    attrs = {"axis": Int(-1), "epsilon": Float(1e-5)}

    def onnx_export(self, e, node, ins, outs):
        axis = norm_axis(node.attrs["axis"], node.inputs[0].type.rank)
        e.emit("LayerNormalization", [ins[0], _ones_scale(e, node)],
               [e.fresh("normalized")] + outs, axis=axis, epsilon=node.attrs["epsilon"],
               stash_type=1)

    def infer(self, c, x):
        float_operands(x)
        axis = norm_axis(c.axis, x.rank)
        stats = TensorType(x.shape[:axis] + (1,) * (x.rank - axis), DType.f32)
        return stats, stats

    def compute(self, c, x):
        mean, _, var = _moments(x, c.axis)
        inv = 1 / np.sqrt(var + var.dtype.type(c.epsilon))
        return mean.astype(np.float32, copy=False), inv.astype(np.float32, copy=False)


def softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    """exp(x - max) / sum, along ``axis``, accumulated as _acc says."""
    e = np.exp(x.astype(_acc(x.dtype), copy=False) - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e.astype(x.dtype, copy=False)


class Softmax(OpDef):
    name = "softmax"
    onnx_export = onnx_as("Softmax", {"axis": "axis"})
    cycle_cost = per_element(6, "softmax")
    fixed_point = FixedLowering("softmax")
    operands = ("x",)
    attrs = {"axis": Int(-1)}

    def infer(self, c, x):
        float_operands(x)
        norm_axis(c.axis, x.rank)
        return x

    def compute(self, c, x):
        return softmax_np(x, c.axis)


# ---- resampling ------------------------------------------------------------------------
def resize_coords(mode: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Resize's input coordinate of each output index along one axis, exactly: as
    (floor, remainder / denominator). With scale = n_out / n_in every mode's coordinate is
    rational, so ties and integers are exact (no float64 ulps deciding a rounding), and
    half_pixel_symmetric equals half_pixel."""
    y = np.arange(n_out, dtype=np.int64)
    if mode == "asymmetric":                                # y / scale
        num, den = y * n_in, n_out
    elif mode == "align_corners":                           # y * (in - 1) / (out - 1)
        num, den = (y * (n_in - 1), n_out - 1) if n_out > 1 else (y * 0, 1)
    elif mode == "pytorch_half_pixel" and n_out == 1:
        num, den = y - 1, 2
    else:                                                   # (y + 0.5) / scale - 0.5
        num, den = (2 * y + 1) * n_in - n_out, 2 * n_out
    lo, rem = np.divmod(num, den)
    return lo, rem / den


def _nearest(lo: np.ndarray, frac: np.ndarray, rounding: str) -> np.ndarray:
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
          "floor": False, "ceil": frac > 0}[rounding]
    return lo + up


def _resize_ok(node) -> str | None:
    # linear resizes run axis by axis: the order of the resized axes must not change
    if node.attrs.get("scales") is not None:
        return "a resize with scales per axis"
    size, shape = node.attrs["size"], node.inputs[0].type.shape
    if node.attrs["mode"] == "linear" and size[1] != shape[1]:
        return "a linear resize of the channel axis"
    return None


class Resize(OpDef):
    """ONNX Resize (opset 13/19) to ``size``, the full output shape: nearest for any
    dtype, or separable multilinear or cubic (floats) over resized axes. The scale per
    axis is out / in, with exact rational coordinates; ``scales`` (one per axis) gives
    ONNX's scales instead where out / in differs from them, and coordinates follow ONNX's
    float64 formulas (as does cubic, with ``cubic_coeff_a`` and ``exclude_outside``).
    Linear of int8/uint8 (at most two resized axes) is onnxruntime's fixed-point bilinear
    kernel, bit for bit (:func:`resize_linear_int8`); float32 linear over two axes of a 2-D
    or 4-D tensor is its float bilinear kernel (:func:`resize_bilinear_f32`)."""

    name = "resize"
    nhwc = LayoutRule(attrs=size_attr, check=_resize_ok)
    operands = ("x",)
    attrs = {"size": Ints(), "mode": Str("nearest", ("nearest", "linear", "cubic")),
             "coordinate_transformation_mode": Str("half_pixel", (
                 "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                 "asymmetric", "tf_crop_and_resize")),
             "nearest_mode": Str("round_prefer_floor", (
                 "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")),
             "cubic_coeff_a": Float(-0.75), "exclude_outside": Bool(False),
             "scales": Floats(None), "roi": Floats(None), "extrapolation_value": Float(0.0)}

    def infer(self, c, x):
        require(len(c.size) == x.rank and min(c.size + x.shape, default=1) > 0,
                f"size {list(c.size)} is not a non-empty shape for {x}")
        require((c.coordinate_transformation_mode == "tf_crop_and_resize") == (c.roi is not None)
                and (c.roi is None or (len(c.roi) == 2 * x.rank and c.scales is not None)),
                "tf_crop_and_resize takes roi (2 values per axis) and scales")
        if c.mode == "linear" and x.dtype.is_int:
            require(x.dtype in (DType.i8, DType.u8), f"linear resize of {x.dtype}: only "
                    "floats and 8-bit integers")
            require(c.coordinate_transformation_mode in _INT_LINEAR_MODES,
                    f"linear resize of 8-bit integers with coordinate_transformation_mode "
                    f"{c.coordinate_transformation_mode!r}: only {', '.join(_INT_LINEAR_MODES)}")
            resized = sum(s != 1 for s in _f32_scales(c, x.shape))
            require(resized <= 2, f"linear resize of 8-bit integers over {resized} axes: at "
                    "most 2 (onnxruntime's bilinear kernel)")
        elif c.mode == "linear":
            float_operands(x)
        return moved(x, c.size)

    def compute(self, c, x):
        if c.mode == "linear" and x.dtype.kind in "iu":
            return resize_linear_int8(c, x)
        axes = bilinear_f32_axes(c, x)
        if axes is not None:
            return resize_bilinear_f32(c, x, axes)
        if c.scales is not None or c.mode == "cubic":
            return _resize_reference(c, x)
        dtype = x.dtype
        for axis, (n_in, n_out) in enumerate(zip(x.shape, c.size)):
            if n_in == n_out:
                continue
            lo, frac = resize_coords(c.coordinate_transformation_mode, n_in, n_out)
            if c.mode == "nearest":
                x = np.take(x, np.clip(_nearest(lo, frac, c.nearest_mode), 0, n_in - 1), axis=axis)
                continue
            shape = [1] * x.ndim
            shape[axis] = n_out
            a0, a1 = (np.take(x, np.clip(i, 0, n_in - 1), axis=axis) for i in (lo, lo + 1))
            x = a0 + (a1 - a0) * frac.astype(_acc(dtype)).reshape(shape)
        return x.astype(dtype, copy=False)

    def onnx_export(self, e, node, ins, outs):
        a = node.attrs
        scales = None if a["scales"] is None else e.const(np.asarray(a["scales"], np.float32), "scales")
        roi = None if a["roi"] is None else e.const(np.asarray(a["roi"], np.float32), "roi")
        e.emit("Resize", ins + [roi, scales, None if scales else e.ints(a["size"], "sizes")], outs,
               mode=a["mode"], nearest_mode=a["nearest_mode"], cubic_coeff_a=a["cubic_coeff_a"],
               exclude_outside=int(a["exclude_outside"]),
               extrapolation_value=a["extrapolation_value"],
               coordinate_transformation_mode=a["coordinate_transformation_mode"])


_INT_LINEAR_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")


def _f32_scales(c: Ctx, shape: tuple[int, ...]) -> list[np.float32]:
    """onnxruntime's float32 scale per axis: ONNX's scales, or f32(out) / f32(in)."""
    if c.scales is not None:
        return [np.float32(s) for s in c.scales]
    return [np.float32(o) / np.float32(i) for o, i in zip(c.size, shape)]


def _taps_1024(mode: str, n_in: int, n_out: int, scale: np.float32
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's SetupUpsampleBilinearInteger along one axis: per output index the two
    input taps (lo, hi) and their weights in 1/1024 (summing to 1024). The coordinate is
    upsamplebase.h's, in float32, clamped to [0, n_in - 1]; its 1/1024 units are truncated."""
    src, lo, hi = _f32_taps(mode, n_in, n_out, scale)
    units = (src * np.float32(1024)).astype(np.int64)
    w_hi = np.where(lo == hi, 512, units - lo * 1024)       # a clamped edge: 512 each
    return lo, hi, 1024 - w_hi, w_hi


def _f32_taps(mode: str, n_in: int, n_out: int, scale: np.float32
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's bilinear source coordinate of each output index along one axis
    (upsamplebase.h, float32, clamped to [0, n_in - 1]) and its two input taps."""
    f = np.float32
    y = np.arange(n_out, dtype=f)
    if mode == "asymmetric":
        src = y / scale
    elif mode == "align_corners":
        src = y * f(n_in - 1) / f(n_out - 1) if n_out > 1 else np.zeros(n_out, f)
    elif mode == "pytorch_half_pixel" and n_out == 1:
        src = np.zeros(n_out, f)
    else:                                                   # half_pixel, pytorch_half_pixel
        src = (y + f(0.5)) / scale - f(0.5)
    src = np.clip(src, f(0), f(n_in - 1))
    lo = np.minimum(src.astype(np.int64), n_in - 1)
    return src, lo, np.minimum(lo + 1, n_in - 1)


#: the coordinate modes of onnxruntime's bilinear kernels
BILINEAR_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")


def bilinear_f32_axes(c: Ctx, x: np.ndarray) -> tuple[int, int] | None:
    """The two axes of a float32 linear resize that onnxruntime runs as UpsampleBilinear
    (a 2-D tensor, or a 4-D one resized along two axes only), else None."""
    scales = _f32_scales(c, x.shape)
    axes = tuple(a for a, s in enumerate(scales) if s != 1)
    mode = c.coordinate_transformation_mode
    # align_corners with ONNX's scales: onnxruntime maps with the integer output length,
    # ONNX with scale * length; bevir follows ONNX there
    if (c.mode == "linear" and x.dtype == np.float32 and x.ndim in (2, 4) and len(axes) == 2
            and c.roi is None and mode in BILINEAR_MODES
            and not (mode == "align_corners" and c.scales is not None)):
        return axes
    return None


#: the native bilinear resize runs where each pixel holds this many elements (channels last)
NATIVE_RESIZE_INNER = 8


def resize_bilinear_f32(c: Ctx, x: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """Float32 linear resize over ``axes`` as onnxruntime's UpsampleBilinear (upsample.cc):
    per output the four taps weighted by products of the axes' distances, summed in its
    order, all in float32; a clamped edge weighs each tap 1/2. Channels last (the two axes
    adjacent, at least NATIVE_RESIZE_INNER elements after them): the same sums in one
    native pass."""
    f = np.float32
    scales = _f32_scales(c, x.shape)
    parts = []
    for axis in axes:
        src, lo, hi = _f32_taps(c.coordinate_transformation_mode, x.shape[axis], c.size[axis],
                                scales[axis])
        d1, d2 = np.abs(src - lo.astype(f)), np.abs(src - hi.astype(f))
        d1, d2 = (np.where(lo == hi, f(0.5), d).astype(f) for d in (d1, d2))
        shape = [1] * x.ndim
        shape[axis] = len(src)
        parts.append((lo, hi, d1.reshape(shape), d2.reshape(shape)))
    (yl, yh, dy1, dy2), (xl, xh, dx1, dx2) = parts
    outer, inner = math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[1] + 1:])
    if axes[1] == axes[0] + 1 and inner >= NATIVE_RESIZE_INNER:
        h, w = x.shape[axes[0]], x.shape[axes[1]]
        out = np.empty((outer, len(yl), len(xl), inner), f)
        if native.resize_bilinear(x.reshape(outer, h, w, inner), (yl, yh, xl, xh),
                                  tuple(d.reshape(-1) for d in (dy1, dy2, dx1, dx2)), out):
            return out.reshape(x.shape[:axes[0]] + (len(yl), len(xl)) + x.shape[axes[1] + 1:])

    def tap(yi, xi):
        return np.take(np.take(x, yi, axis=axes[0]), xi, axis=axes[1])
    return (dx2 * dy2 * tap(yl, xl) + dx1 * dy2 * tap(yl, xh)
            + dx2 * dy1 * tap(yh, xl) + dx1 * dy1 * tap(yh, xh))


def resize_linear_int8(c: Ctx, x: np.ndarray) -> np.ndarray:
    """Linear resize of int8/uint8 as onnxruntime's NhwcUpsampleBilinearInteger
    (upsample.h): per resized axis two taps with integer weights in 1/1024 (:func:`_taps_1024`);
    the exact sum of tap * weight products (2**20 for two axes), divided by 2**(10 * axes)
    truncating toward zero (C integer division)."""
    y = x.astype(np.int64)
    shift = 0
    for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, c.size, _f32_scales(c, x.shape))):
        if scale == 1:
            continue
        lo, hi, w_lo, w_hi = _taps_1024(c.coordinate_transformation_mode, n_in, n_out, scale)
        shape = [1] * x.ndim
        shape[axis] = n_out
        y = (np.take(y, lo, axis=axis) * w_lo.reshape(shape)
             + np.take(y, hi, axis=axis) * w_hi.reshape(shape))
        shift += 10
    return (np.sign(y) * (np.abs(y) >> shift)).astype(x.dtype)


def _source_coords(mode: str, n_in: int, n_out: int, scale: float,
                   roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """ONNX Resize's source coordinate of each output index, in float64 as its reference
    computes it (the output length scale * n_in may be fractional)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    if mode == "tf_crop_and_resize":
        span = (roi[1] - roi[0]) * (n_in - 1)
        x = np.full(n_out, span / 2) if width == 1 else y * span / (width - 1)
        return x + roi[0] * (n_in - 1)
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel" and width == 1:
        return np.full(n_out, -0.5)
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5


def _tap_weights(c, ratio: np.ndarray) -> np.ndarray:
    """Per output position, the weights of its taps (ONNX's coefficient formulas)."""
    if c.mode == "nearest":
        r = ratio
        up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": r >= 1,
              "ceil": r > 0}[c.nearest_mode] | (r == 1)
        return np.stack([~up, up], -1).astype(np.float64)
    if c.mode == "linear":
        return np.stack([1 - ratio, ratio], -1)
    a, r = c.cubic_coeff_a, ratio
    s = 1 - r
    return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * s - (a + 3)) * s * s + 1,
                     ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a], -1)


def _resize_reference(c, x: np.ndarray) -> np.ndarray:
    """Resize axis by axis in float64 as ONNX's reference does: source coordinates from
    the scales, the taps nearest each (ties to the smaller index), edge values beyond
    the input (or, with exclude_outside, no weight there)."""
    scales = c.scales or tuple(o / i for o, i in zip(c.size, x.shape))
    y = x.astype(np.float64)
    for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, c.size, scales)):
        if n_in == n_out and scale == 1.0:
            continue
        roi = (0.0, 1.0) if c.roi is None else (c.roi[axis], c.roi[x.ndim + axis])
        src = _source_coords(c.coordinate_transformation_mode, n_in, n_out, scale, roi)
        lo = np.floor(src)
        ratio = np.where(src == lo, 1.0, src - lo)
        weights = _tap_weights(c, ratio)
        n = weights.shape[1]
        start = lo.astype(np.int64) + np.where(src == lo, -(n // 2), -(n // 2) + 1)
        taps = start[:, None] + np.arange(n)
        if c.exclude_outside:
            weights = np.where((taps < 0) | (taps >= n_in), 0.0, weights)
            total = weights.sum(-1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        picked = np.take(y, np.clip(taps, 0, n_in - 1), axis=axis)      # [..., n_out, n, ...]
        shape = [1] * y.ndim + [1]
        shape[axis], shape[axis + 1] = n_out, n
        y = (picked * weights.reshape(shape)).sum(axis + 1)
        if c.roi is not None:           # outside the input: the extrapolation value
            where = [1] * y.ndim
            where[axis] = n_out
            outside = ((src < 0) | (src > n_in - 1)).reshape(where)
            y = np.where(outside, c.extrapolation_value, y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(x.dtype)


def _grid_coord(g: np.ndarray, size: int, padding: str, align: bool) -> np.ndarray:
    """torch grid_sample: a normalized grid coordinate to a pixel coordinate (in g's dtype)."""
    f = g.dtype.type
    x = (g + 1) * f((size - 1) / 2) if align else ((g + 1) * f(size) - 1) / 2
    if padding == "reflection":
        low, span = (f(0), f(size - 1)) if align else (f(-0.5), f(size))
        if span == 0:
            return np.zeros_like(x)
        a = np.abs(x - low)
        extra = np.fmod(a, span)
        x = np.where(np.floor(a / span) % 2 == 0, extra + low, span - extra + low)
    if padding != "zeros":
        x = np.clip(x, 0, size - 1)
    return x


class GridSample(OpDef):
    """torch.nn.functional.grid_sample, 2-D: x [N,C,H,W], grid [N,Ho,Wo,2] of (x, y) in
    [-1, 1] -> [N,C,Ho,Wo]. Nearest rounds half to even; under zeros padding a tap outside
    the input contributes 0."""

    name = "grid_sample"
    cycle_cost = per_element(10, "sampling")   # 4 taps: gather, MAC; coordinates
    operands = ("x", "grid")
    attrs = {"mode": Str("bilinear", ("bilinear", "nearest")),
             "padding_mode": Str("zeros", ("zeros", "border", "reflection")),
             "align_corners": Bool(False)}

    def onnx_export(self, e, node, ins, outs):
        mode = node.attrs["mode"]
        e.emit("GridSample", ins, outs, mode="linear" if mode == "bilinear" else mode,
               padding_mode=node.attrs["padding_mode"], align_corners=int(node.attrs["align_corners"]))

    def infer(self, c, x, grid):
        float_operands(x, grid)
        require(x.rank == 4 and x.layout is not Layout.nhwc, f"x must be [N,C,H,W], got {x}")
        n, ch = x.shape[:2]
        require(grid.rank == 4 and grid.shape[0] == n and grid.shape[3] == 2,
                f"grid must be [{n},Ho,Wo,2], got {grid}")
        return TensorType((n, ch) + grid.shape[1:3], x.dtype, x.layout)

    def compute(self, c, x, grid):
        n, ch, h, w = x.shape
        g = grid.astype(_acc(grid.dtype), copy=False).reshape(n, -1, 2)
        ix = _grid_coord(g[..., 0], w, c.padding_mode, c.align_corners)
        iy = _grid_coord(g[..., 1], h, c.padding_mode, c.align_corners)
        src = np.ascontiguousarray(x.reshape(n, ch, h * w).transpose(0, 2, 1)).reshape(-1, ch)
        base = (np.arange(n) * (h * w))[:, None]
        if c.mode == "nearest":
            taps = [(np.rint(ix), np.rint(iy), None)]
        else:
            x0, y0 = np.floor(ix), np.floor(iy)
            x1, y1 = x0 + 1, y0 + 1     # torch's weight formulas, for bitwise-close results
            taps = [(x0, y0, (x1 - ix) * (y1 - iy)), (x1, y0, (ix - x0) * (y1 - iy)),
                    (x0, y1, (x1 - ix) * (iy - y0)), (x1, y1, (ix - x0) * (iy - y0))]
        y = np.zeros((n, g.shape[1], ch), _acc(x.dtype))
        for px, py, wt in taps:
            inside = (px >= 0) & (px <= w - 1) & (py >= 0) & (py <= h - 1)
            idx = base + np.where(inside, py * w + px, 0).astype(np.intp)
            wt = inside if wt is None else np.where(inside, wt, 0)
            y += src[idx] * wt[..., None].astype(y.dtype, copy=False)
        y = y.reshape(n, *grid.shape[1:3], ch).transpose(0, 3, 1, 2)
        return y.astype(x.dtype, copy=False)
