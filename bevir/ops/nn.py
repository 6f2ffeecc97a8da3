"""Neural-network layers: pooling, normalization, softmax, resize and grid sampling.

2-D ops read x as NCHW (plain or nchw) or NHWC (nhwc), as conv2d does; ``pads`` are
[top, left, bottom, right]. Where computing an op fast takes more than its numpy
statement, its kernel (bevir.ops.kernels) does it, bit for bit.
"""
from __future__ import annotations

import functools

import numpy as np

from ..ir.types import DType, Layout, TensorType
from ..ir.opdef import (Bool, Ctx, FixedLowering, Float, Floats, Int, Ints, LayoutRule, OpDef,
                        Piece, Str)
from .common import (channel_axis, float_operands, norm_axis, pool_dilations, pool_out, require,
                     spatial_axes, window_rows)
from .kernels import kernel_for, prepared_kernel
from .kernels.norm import moments
from .kernels.pool import window_taps
from .kernels.resize import f32_scales, gather_tables
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


POOL_ATTRS = {"kernel": Ints(), "strides": Ints((1, 1)), "pads": Ints((0, 0, 0, 0)),
               "ceil_mode": Bool(False)}


class MaxPool2d(OpDef):
    """2-D max pooling: each result is the maximum of its window, the taps ``dilations``
    apart; padding never wins (it is -inf, or the integer dtype's minimum)::

        y[n, c, p, q] = max over i < KH, j < KW of x[n, c, p*sh + i*dh - top, q*sw + j*dw - left]
    """

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
        return kernel_for("maxpool2d")(c, x)         # kernels/pool.py

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
        for tap, idx in zip(window_taps(x, axes, c, out, fill),
                            window_taps(flat, axes, c, out, -1)):
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
    input and its pads with count_include_pad). Made once per geometry, read-only: a
    node's divisors are the same on every run."""
    return _avgpool_counts(t.shape, t.layout, tuple(c.kernel), tuple(c.strides),
                           tuple(c.pads), tuple(pool_dilations(c)), bool(c.ceil_mode),
                           bool(c.count_include_pad), np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _avgpool_counts(shape, layout: Layout, kernel, strides, pads, dilations, ceil_mode: bool,
                    count_include_pad: bool, dtype: np.dtype) -> np.ndarray:
    c = Ctx({"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "ceil_mode": ceil_mode})
    t = TensorType(shape, layout=layout)
    axes, out = spatial_axes(t), pool_out(c, t)
    h, w = (t.shape[a] for a in axes)
    top, left, bottom, right = pads
    if count_include_pad:
        mask, pads = np.ones((h + top + bottom, w + left + right), dtype), (0, 0)
    else:
        mask, pads = np.ones((h, w), dtype), (top, left)
    shape = [1] * 4
    shape[axes[0]], shape[axes[1]] = out
    counts = np.maximum(sum(window_taps(mask, (0, 1), c, out, 0, pads)), 1).reshape(shape)
    counts.setflags(write=False)
    return counts


class GlobalAvgPool(OpDef):
    """Mean over the spatial axes (all but N and C), kept as size 1, in (at least)
    float32, summed in onnxruntime's order in either layout: four lanes, lane j summing
    elements j, j + 4, ... in order, the lanes added as (l0 + l2) + (l1 + l3), the last
    S % 4 elements one by one, the sum divided by S (kernels.pool.mlas_global_mean)."""

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
        return kernel_for("global_avgpool")(c, x)    # kernels/pool.py


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
        ch = x.shape[channel_axis(x)]
        for p in params:
            require(p.dtype.is_float and p.shape == (ch,), f"parameters must be [{ch}], got {p}")
        return x

    def compute(self, c, x, scale, bias, mean, var):
        return kernel_for("batch_norm")(c, x, scale, bias, mean, var)    # kernels/norm.py

    def prepare(self, c, x, scale, bias, mean, var):
        return prepared_kernel("batch_norm", c, x, scale, bias, mean, var)


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
        return kernel_for("layer_norm")(c, x, scale, bias)   # kernels/norm.py


def _ones_scale(e, node):
    """A scale of ones over the normalized axes of ``node``'s first operand (ONNX
    LayerNormalization needs one), float32 where the operand is codes (a QDQ export)."""
    x = node.inputs[0].type
    axis = norm_axis(node.attrs.get("axis", -1), x.rank)
    dtype = x.dtype.np if x.dtype.np.kind == "f" else np.float32
    return e.const(np.ones(x.shape[axis:], dtype), "scale")


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
        mean, _, var = moments(x, c.axis)
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
    kernel, bit for bit; float32 linear over two axes of a 2-D or 4-D tensor is its float
    bilinear kernel (both in bevir.ops.kernels.resize; docs/numerics.md)."""

    name = "resize"
    nhwc = LayoutRule(attrs=size_attr, check=_resize_ok)
    fixed_point = FixedLowering("resize")       # on the codes: nearest, or 8-bit linear
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
            resized = sum(s != 1 for s in f32_scales(c, x.shape))
            require(resized <= 2, f"linear resize of 8-bit integers over {resized} axes: at "
                    "most 2 (onnxruntime's bilinear kernel)")
        elif c.mode == "linear":
            float_operands(x)
        return moved(x, c.size)

    def compute(self, c, x):
        return kernel_for("resize")(c, x)            # kernels/resize.py

    def tvm_lowering(self, c, L, x):
        """Integer codes: nearest as a gather by index tables, linear as onnxruntime's
        fixed-point kernel (two taps per resized axis, weights in 1/1024, the exact sum
        divided truncating toward zero); the tables are the golden kernel's own."""
        t, out = c.in_types[0], c.out_types[0]
        tables = gather_tables(c, t.shape) if t.dtype.is_int else None
        if tables is None:
            raise NotImplementedError(f"{c.mode} resize of {t.dtype}")
        consts = [None if tb is None else [L.const(a.astype(np.int32), f"r{k}_{j}")
                                           for j, a in enumerate(tb)]
                  for k, tb in enumerate(tables)]
        resized = [k for k, tb in enumerate(consts) if tb is not None]
        if c.mode == "nearest":
            return L.compute(out, lambda *i: x[tuple(
                i[k] if tb is None else tb[0][i[k]] for k, tb in enumerate(consts))])

        def fn(*i):
            acc = None
            for corner in range(1 << len(resized)):
                idx, w = list(i), L.i64(1)
                for b, k in enumerate(resized):
                    hi = corner >> b & 1
                    idx[k] = consts[k][hi][i[k]]
                    w = w * L.i64(consts[k][2 + hi][i[k]])
                term = w * L.i64(x[tuple(idx)])
                acc = term if acc is None else acc + term
            s = L.i64(10 * len(resized))
            down = L.select(acc >= L.i64(0), acc >> s, L.i64(0) - ((L.i64(0) - acc) >> s))
            return L.cast(down, np.dtype(t.dtype.np).name)
        return L.compute(out, fn)

    def onnx_export(self, e, node, ins, outs):
        a = node.attrs
        scales = (None if a["scales"] is None
                  else e.const(np.asarray(a["scales"], np.float32), "scales"))
        roi = None if a["roi"] is None else e.const(np.asarray(a["roi"], np.float32), "roi")
        e.emit("Resize", ins + [roi, scales, None if scales else e.ints(a["size"], "sizes")], outs,
               mode=a["mode"], nearest_mode=a["nearest_mode"], cubic_coeff_a=a["cubic_coeff_a"],
               exclude_outside=int(a["exclude_outside"]),
               extrapolation_value=a["extrapolation_value"],
               coordinate_transformation_mode=a["coordinate_transformation_mode"])


_INT_LINEAR_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")


class GridSample(OpDef):
    """torch.nn.functional.grid_sample, 2-D: x [N,C,H,W], grid [N,Ho,Wo,2] of (x, y) in
    [-1, 1] -> [N,C,Ho,Wo]. A grid point maps to the pixel coordinate ((g + 1) * size - 1)
    / 2, or (g + 1) * (size - 1) / 2 with ``align_corners``; border padding clamps it to
    the input, reflection reflects it at the borders (pixel centers with align_corners,
    else pixel edges) first. Nearest takes the pixel at the coordinate rounded half to
    even; bilinear sums the four pixels around it, each weighted by the opposite
    rectangle's area (torch's formulas). Under zeros padding a tap outside the input
    contributes 0."""

    name = "grid_sample"
    cycle_cost = per_element(10, "sampling")   # 4 taps: gather, MAC; coordinates
    operands = ("x", "grid")
    attrs = {"mode": Str("bilinear", ("bilinear", "nearest")),
             "padding_mode": Str("zeros", ("zeros", "border", "reflection")),
             "align_corners": Bool(False)}

    def onnx_export(self, e, node, ins, outs):
        mode = node.attrs["mode"]
        e.emit("GridSample", ins, outs, mode="linear" if mode == "bilinear" else mode,
               padding_mode=node.attrs["padding_mode"],
               align_corners=int(node.attrs["align_corners"]))

    def infer(self, c, x, grid):
        float_operands(x, grid)
        require(x.rank == 4 and x.layout is not Layout.nhwc, f"x must be [N,C,H,W], got {x}")
        n, ch = x.shape[:2]
        require(grid.rank == 4 and grid.shape[0] == n and grid.shape[3] == 2,
                f"grid must be [{n},Ho,Wo,2], got {grid}")
        return TensorType((n, ch) + grid.shape[1:3], x.dtype, x.layout)

    def compute(self, c, x, grid):
        return kernel_for("grid_sample")(c, x, grid)  # kernels/sample.py
