"""ONNX converters: shape and data movement (concat, split, slice, reshape, gather,
pad, resize, grid sampling, top-k)."""
from __future__ import annotations

import math

import numpy as np

from ...ir.types import DType
from .registry import NodeCtx, converts, norm_axes, norm_axis

# ---- shape and data movement ----------------------------------------------------------------

@converts("Concat", attrs=("axis",))
def _concat(c: NodeCtx):
    xs = [v for v in c.inputs if v is not None]
    axis = norm_axis(int(c.attr("axis")), xs[0].type.rank, c)
    if len(xs) == 1:
        return xs[0]
    return c.emit("concat", xs, {"axis": axis})


@converts("Split", attrs=("axis", "split", "num_outputs"))
def _split(c: NodeCtx):
    x = c.input(0)
    axis = norm_axis(int(c.attr("axis", 0)), x.type.rank, c)
    dim = x.type.shape[axis]
    if c.opset >= 13:
        if "split" in c.attrs:
            raise c.unsupported("attribute 'split' (an input since opset 13)")
        sizes = c.ints(1, "split", optional=True)
    else:
        sizes = c.attrs.get("split")
    n = c.num_outputs
    if not sizes:
        if "num_outputs" in c.attrs:
            n = int(c.attrs["num_outputs"])
            if n != c.num_outputs:
                raise c.unsupported(f"attribute 'num_outputs' = {n} but the node has "
                                    f"{c.num_outputs} outputs")
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        else:
            if dim % n:
                raise c.unsupported(f"cannot split {dim} evenly into {n} outputs")
            sizes = [dim // n] * n
    sizes = [int(s) for s in sizes]
    if sum(sizes) != dim or len(sizes) != c.num_outputs or min(sizes) < 0:
        raise c.unsupported(f"split sizes {sizes} do not fit dimension {dim} into "
                            f"{c.num_outputs} outputs")
    if len(sizes) == 1:
        return [x]
    return c.emit("split", [x], {"axis": axis, "sizes": tuple(sizes)}, n_out=len(sizes))


@converts("Slice")
def _slice(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    starts = c.ints(1, "starts")
    ends = c.ints(2, "ends")
    axes = c.ints(3, "axes", optional=True)
    steps = c.ints(4, "steps", optional=True)
    axes = list(range(len(starts))) if axes is None else list(norm_axes(axes, rank, c))
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise c.unsupported("starts, ends, axes and steps differ in length")
    if any(s == 0 for s in steps):
        raise c.unsupported("a step of 0")

    def clamp(v, dim):   # keeps Python slicing semantics, drops INT64_MAX-like sentinels
        return max(-dim - 1, min(dim + 1, v))
    starts = [clamp(s, x.type.shape[a]) for s, a in zip(starts, axes)]
    ends = [clamp(e, x.type.shape[a]) for e, a in zip(ends, axes)]
    if not axes:
        return x
    return c.emit("slice", [x], {"starts": tuple(starts), "ends": tuple(ends),
                                 "axes": tuple(axes), "steps": tuple(steps)})


@converts("Reshape", attrs=("allowzero",))
def _reshape(c: NodeCtx):
    x = c.input(0)
    spec = c.ints(1, "shape")
    allowzero = bool(c.attr("allowzero", 0))
    shape: list[int] = []
    infer = None
    for i, s in enumerate(spec):
        if s == 0 and not allowzero:
            if i >= x.type.rank:
                raise c.unsupported(f"shape {spec}: 0 at axis {i} beyond the input rank")
            shape.append(x.type.shape[i])
        elif s == -1:
            if infer is not None:
                raise c.unsupported(f"shape {spec} has two -1")
            infer = i
            shape.append(1)
        elif s < 0:
            raise c.unsupported(f"shape {spec}: negative dimension {s}")
        else:
            shape.append(s)
    numel = x.type.numel
    if infer is not None:
        rest = math.prod(shape)
        if rest == 0 or numel % rest:
            raise c.unsupported(f"cannot reshape {list(x.type.shape)} to {spec}")
        shape[infer] = numel // rest
    if math.prod(shape) != numel:
        raise c.unsupported(f"cannot reshape {list(x.type.shape)} to {spec}")
    if tuple(shape) == x.type.shape:
        return x
    return c.emit("reshape", [x], {"shape": tuple(shape)})


@converts("Flatten", attrs=("axis",))
def _flatten(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    axis = int(c.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise c.unsupported(f"attribute 'axis' = {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return c.emit("flatten", [x], {"axis": axis})


@converts("Transpose", attrs=("perm",))
def _transpose(c: NodeCtx):
    x = c.input(0)
    perm = c.attr("perm", None)
    perm = tuple(reversed(range(x.type.rank))) if perm is None else \
        norm_axes(perm, x.type.rank, c)
    if perm == tuple(range(x.type.rank)):
        return x
    return c.emit("transpose", [x], {"perm": perm})


def _axes_operand(c: NodeCtx, optional: bool) -> list[int] | None:
    if c.opset >= 13:
        if "axes" in c.attrs:
            raise c.unsupported("attribute 'axes' (an input since opset 13)")
        return c.ints(1, "axes", optional=optional)
    axes = c.attrs.get("axes")
    if axes is None and not optional:
        raise c.unsupported("missing required attribute 'axes'")
    return None if axes is None else [int(a) for a in axes]


@converts("Squeeze", attrs=("axes",))
def _squeeze(c: NodeCtx):
    x = c.input(0)
    axes = _axes_operand(c, optional=True)
    if axes is None:
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]
    axes = sorted(set(norm_axes(axes, x.type.rank, c)))
    for a in axes:
        if x.type.shape[a] != 1:
            raise c.unsupported(f"cannot squeeze axis {a} of size {x.type.shape[a]}")
    if not axes:
        return x
    return c.emit("squeeze", [x], {"axes": tuple(axes)})


@converts("Unsqueeze", attrs=("axes",))
def _unsqueeze(c: NodeCtx):
    x = c.input(0)
    axes = _axes_operand(c, optional=False)
    out_rank = x.type.rank + len(axes)
    axes = sorted(norm_axes(axes, out_rank, c))
    if len(set(axes)) != len(axes):
        raise c.unsupported(f"repeated axes {axes}")
    if not axes:
        return x
    return c.emit("unsqueeze", [x], {"axes": tuple(axes)})


@converts("Gather", attrs=("axis",))
def _gather(c: NodeCtx):
    x, idx = c.input(0), c.input(1)
    axis = norm_axis(int(c.attr("axis", 0)), x.type.rank, c)
    if not idx.type.dtype.is_int:
        raise c.unsupported(f"indices of dtype {idx.type.dtype}")
    if idx.is_const and (idx.const < 0).any():   # negative indices count from the end
        dim = x.type.shape[axis]
        idx = c.constant(np.where(idx.const < 0, idx.const + dim, idx.const)
                         .astype(idx.const.dtype))
    return c.emit("gather", [x, idx], {"axis": axis})


@converts("GatherElements", attrs=("axis",))
def _gather_elements(c: NodeCtx):
    x, idx = c.input(0), c.input(1)
    if not idx.type.dtype.is_int:
        raise c.unsupported(f"indices of dtype {idx.type.dtype}")
    axis = norm_axis(int(c.attr("axis", 0)), x.type.rank, c)
    return c.emit("gather_elements", [x, idx], {"axis": axis})


@converts("Expand")
def _expand(c: NodeCtx):
    x = c.input(0)
    shape = c.ints(1, "shape")
    try:
        out = tuple(np.broadcast_shapes(x.type.shape, tuple(shape)))
    except ValueError:
        raise c.unsupported(f"shape {shape} does not broadcast with {list(x.type.shape)}") \
            from None
    if out == x.type.shape:
        return x
    return c.emit("expand", [x], {"shape": out})


@converts("Tile")
def _tile(c: NodeCtx):
    x = c.input(0)
    reps = c.ints(1, "repeats")
    shape = x.type.shape
    if len(reps) != len(shape) or min(reps, default=1) < 0:
        raise c.unsupported(f"repeats {reps} do not fit rank {len(shape)}")
    if all(r == 1 for r in reps):
        return x
    y = c.emit("unsqueeze", [x], {"axes": tuple(range(0, 2 * len(shape), 2))})
    inter = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    y = c.emit("expand", [y], {"shape": inter})
    return c.emit("reshape", [y], {"shape": tuple(r * d for r, d in zip(reps, shape))})


@converts("Pad", attrs=("mode", "pads", "value"))
def _pad(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    mode = c.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise c.unsupported(f"attribute 'mode' = {mode!r}")
    if c.version < 11:   # Pad-2: pads and value are attributes
        pads = [int(p) for p in c.attr("pads")]
        value = c.attr("value", 0.0)
    else:
        for a in ("pads", "value"):
            if a in c.attrs:
                raise c.unsupported(f"attribute '{a}' (an input since opset 11)")
        pads = c.ints(1, "pads")
        value = c.const(2, "constant_value", optional=True,
                        why="bevir's pad takes its value as an attribute")
    axes = c.ints(3, "axes", optional=True) if c.version >= 18 else None
    if axes is not None:
        axes = norm_axes(axes, rank, c)
        if len(pads) != 2 * len(axes):
            raise c.unsupported(f"pads {pads} do not fit axes {list(axes)}")
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = pads[i], pads[len(axes) + i]
        pads = full
    if len(pads) != 2 * rank:
        raise c.unsupported(f"pads {pads} do not fit rank {rank}")
    if not any(pads):
        return x
    v = 0.0 if value is None or np.size(value) == 0 else float(np.asarray(value).reshape(-1)[0])
    return c.emit("pad", [x], {"pads": tuple(pads), "mode": mode, "value": v})


_RESIZE_CT = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@converts("Resize", attrs=("antialias", "axes", "coordinate_transformation_mode",
                           "cubic_coeff_a", "exclude_outside", "extrapolation_value",
                           "keep_aspect_ratio_policy", "mode", "nearest_mode"))
def _resize(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    mode = c.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise c.unsupported(f"attribute 'mode' = {mode!r}")
    if mode == "cubic" or (mode == "linear" and x.type.dtype not in (DType.i8, DType.u8)):
        c.require_float(x)          # 8-bit linear: onnxruntime's fixed-point kernel
    if c.version < 11:   # Resize-10: (X, scales), asymmetric coordinates, nearest = floor
        ct, nearest, scales_i = "asymmetric", "floor", 1
    else:
        ct = c.attr("coordinate_transformation_mode", "half_pixel")
        nearest = c.attr("nearest_mode", "round_prefer_floor")
        scales_i = 2
    if ct not in _RESIZE_CT:
        raise c.unsupported(f"attribute 'coordinate_transformation_mode' = {ct!r}")
    if nearest not in _NEAREST:
        raise c.unsupported(f"attribute 'nearest_mode' = {nearest!r}")
    if c.attr("antialias", 0):
        raise c.unsupported(f"attribute 'antialias' = {c.attr('antialias')!r}")
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise c.unsupported(f"attribute 'keep_aspect_ratio_policy' = {policy!r}")
    axes = c.attr("axes", None)
    axes = list(range(rank)) if axes is None else list(norm_axes(axes, rank, c))
    scales = c.const(scales_i, "scales", optional=True)
    sizes = c.ints(3, "sizes", optional=True) if scales_i == 2 else None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and len(sizes) == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        raise c.unsupported("exactly one of scales and sizes must be given")
    out, factor = list(x.type.shape), [1.0] * rank     # output shape, ONNX's scale per axis
    if sizes is not None:
        if len(sizes) != len(axes):
            raise c.unsupported(f"sizes {sizes} do not fit axes {axes}")
        ratios = [int(s) / x.type.shape[a] for a, s in zip(axes, sizes)]
        if policy != "stretch":          # one scale for every axis, output rounded half up
            scale = (min if policy == "not_larger" else max)(ratios)
            ratios = [scale] * len(axes)
            sizes = [int(scale * x.type.shape[a] + 0.5) for a in axes]
        for a, s, r in zip(axes, sizes, ratios):
            out[a], factor[a] = int(s), r
    else:
        scales = [float(s) for s in scales.reshape(-1)]
        if len(scales) != len(axes):
            raise c.unsupported(f"scales {scales} do not fit axes {axes}")
        for a, s in zip(axes, scales):
            out[a], factor[a] = int(x.type.shape[a] * s), s
    if tuple(out) == x.type.shape and all(f == 1.0 for f in factor):
        return x
    attrs = {"size": tuple(out), "mode": mode, "coordinate_transformation_mode": ct,
             "nearest_mode": nearest}
    if mode == "cubic":
        attrs |= {"cubic_coeff_a": float(c.attr("cubic_coeff_a", -0.75)),
                  "exclude_outside": bool(c.attr("exclude_outside", 0))}
    elif c.attr("exclude_outside", 0):
        raise c.unsupported("attribute 'exclude_outside' = 1 (cubic only)")
    if ct == "tf_crop_and_resize":       # the region of interest, as fractions per axis
        roi = c.const(1, "roi")
        if roi is None or roi.size != 2 * len(axes):
            raise c.unsupported(f"roi must hold {2 * len(axes)} values for axes {axes}")
        lo, hi = [0.0] * rank, [1.0] * rank
        for k, a in enumerate(axes):
            lo[a], hi[a] = float(roi.reshape(-1)[k]), float(roi.reshape(-1)[len(axes) + k])
        attrs |= {"roi": tuple(lo + hi),
                  "extrapolation_value": float(c.attr("extrapolation_value", 0.0))}
    if ct == "tf_crop_and_resize" or any(f != o / i for f, o, i in zip(factor, out, x.type.shape)):
        attrs["scales"] = tuple(factor)  # ONNX's scale differs from out / in: keep it
    return c.emit("resize", [x], attrs)


@converts("GridSample", attrs=("align_corners", "mode", "padding_mode"))
def _grid_sample(c: NodeCtx):
    x, grid = c.input(0), c.input(1)
    c.require_float(x, grid)
    if x.type.rank != 4:
        raise c.unsupported(f"{x.type.rank - 2}-D sampling: only 4-D (NCHW) input")
    mode = c.attr("mode", "linear" if c.opset >= 20 else "bilinear")
    mode = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest"}.get(mode, mode)
    if mode not in ("bilinear", "nearest"):
        raise c.unsupported(f"attribute 'mode' = {c.attr('mode')!r}")
    padding = c.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise c.unsupported(f"attribute 'padding_mode' = {padding!r}")
    return c.emit("grid_sample", [x, grid], {"mode": mode, "padding_mode": padding,
                                             "align_corners": bool(c.attr("align_corners", 0))})


@converts("TopK", attrs=("axis", "largest", "sorted"))
def _topk(c: NodeCtx):
    x = c.input(0)
    k = c.ints(1, "K")
    if len(k) != 1:
        raise c.unsupported(f"K must have one element, got {k}")
    axis = norm_axis(int(c.attr("axis", -1)), x.type.rank, c)
    return c.emit("topk", [x], {"k": k[0], "axis": axis, "largest": bool(c.attr("largest", 1)),
                                "sorted": bool(c.attr("sorted", 1))}, n_out=2)
