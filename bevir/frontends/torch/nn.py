"""ATen converters: convolution, normalization, pooling, resampling."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...extras import require
from ...ir.graph import Value
from ..decompose import group_norm
from .importer import AtenCtx, aten_converter, pair, rank_of

torch = require("torch")

# ---- convolution, normalization, pooling, resampling -------------------------------------------

def _conv_pads(c: AtenCtx, padding: Any, kernel, dilation) -> tuple[int, int, int, int]:
    """conv2d's (top, left, bottom, right) for torch's ``padding`` (ints, 'valid', 'same')."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":              # torch puts the odd element at the end
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
    ph, pw = pair(padding)
    return (ph, pw, ph, pw)


@aten_converter("aten.conv2d", "aten.conv1d", "aten.convolution")
def _conv(c: AtenCtx):
    x, w, b = c.arg(0), c.arg(1), c.arg(2)
    if c.target.startswith("aten.convolution"):
        stride, padding, dilation, transposed, _, groups = (c.arg(i) for i in range(3, 9))
        if transposed:
            raise c.unsupported("transposed convolution")
    else:
        stride, padding, dilation, groups = (c.arg(3, "stride", 1), c.arg(4, "padding", 0),
                                             c.arg(5, "dilation", 1), c.arg(6, "groups", 1))
    one_d = rank_of(x) == 3
    if one_d:                          # 1-D: a 2-D convolution over rows of height 1
        x = c.emit("unsqueeze", [x], axes=(2,))
        w = c.emit("unsqueeze", [w], axes=(2,))
        lift = lambda v: (1, *pair(v, 1)) if not isinstance(v, str) else v  # noqa: E731
        stride, dilation = lift(stride), lift(dilation)
        padding = padding if isinstance(padding, str) else (0, *pair(padding, 1))
    kernel = w.type.shape[2:]
    dilation = pair(dilation)
    y = c.emit("conv2d", [x, w, b], strides=pair(stride), dilations=dilation, groups=int(groups),
               pads=_conv_pads(c, padding, kernel, dilation))
    return c.emit("squeeze", [y], axes=(2,)) if one_d else y


@aten_converter("aten.batch_norm", "aten._native_batch_norm_legit_no_training")
def _batch_norm(c: AtenCtx):
    x, weight, bias, mean, var = (c.arg(i) for i in range(5))
    legit = c.target.startswith("aten._native")
    if not legit and c.arg(5, "training"):
        raise c.unsupported("batch norm in training mode")
    eps = float(c.arg(6 if legit else 7, "eps", 1e-5))
    channels = x.type.shape[1]
    ones = lambda v: c.const(np.ones(channels), x) if v is None else v  # noqa: E731
    weight, bias = ones(weight), c.const(np.zeros(channels), x) if bias is None else bias
    y = c.emit("batch_norm", [x, weight, bias, mean, var], epsilon=eps)
    return (y, mean, var) if legit else y


@aten_converter("aten.group_norm")
def _group_norm(c: AtenCtx):
    return group_norm(c.emitter(), c.arg(0), int(c.arg(1)), float(c.arg(4, "eps", 1e-5)),
                      c.arg(2), c.arg(3))


def _pool_pads(c: AtenCtx, padding) -> tuple[int, int, int, int]:
    ph, pw = pair(padding)
    return (ph, pw, ph, pw)


@aten_converter("aten.max_pool2d", "aten.max_pool2d_with_indices")
def _max_pool(c: AtenCtx):
    kernel = pair(c.arg(1))
    stride = c.arg(2, "stride") or kernel
    y = c.emit("maxpool2d", [c.arg(0)], kernel=kernel, strides=pair(stride),
               pads=_pool_pads(c, c.arg(3, "padding", 0)), dilations=pair(c.arg(4, "dilation", 1)),
               ceil_mode=bool(c.arg(5, "ceil_mode", False)))
    return (y, None) if c.target.startswith("aten.max_pool2d_with_indices") else y


@aten_converter("aten.avg_pool2d")
def _avg_pool(c: AtenCtx):
    kernel = pair(c.arg(1))
    if c.arg(6, "divisor_override") is not None:
        raise c.unsupported("avg_pool2d with divisor_override")
    return c.emit("avgpool2d", [c.arg(0)], kernel=kernel,
                  strides=pair(c.arg(2, "stride") or kernel),
                  pads=_pool_pads(c, c.arg(3, "padding", 0)),
                  ceil_mode=bool(c.arg(4, "ceil_mode", False)),
                  count_include_pad=bool(c.arg(5, "count_include_pad", True)))


@aten_converter("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg_pool(c: AtenCtx):
    x = c.arg(0)
    h, w = x.type.shape[-2:]
    oh, ow = (d if d is not None else s for d, s in zip(pair(c.arg(1)), (h, w)))
    if (oh, ow) == (1, 1):
        return c.emit("global_avgpool", [x])
    if h % oh or w % ow:
        raise c.unsupported(f"adaptive average pooling of {h}x{w} to {oh}x{ow} (windows of "
                            "unequal size)")
    k = (h // oh, w // ow)
    return c.emit("avgpool2d", [x], kernel=k, strides=k)


@aten_converter("aten.adaptive_avg_pool1d")
def _adaptive_avg_pool1d(c: AtenCtx):
    x, (size,) = c.arg(0), pair(c.arg(1), 1)
    n = x.type.shape[-1]
    if n % size:
        raise c.unsupported(f"adaptive average pooling of {n} to {size} (windows of unequal "
                            "size)")
    lead = x.type.shape[:-1]
    y = c.emit("reshape", [x], shape=(*lead, size, n // size))
    return c.emit("reshape", [c.emit("reduce_mean", [y], axes=(rank_of(x),), keepdims=False)],
                  shape=(*lead, size))


def _resize(c: AtenCtx, mode: str, size, align_corners: bool | None, scales) -> Value:
    x = c.arg(0)
    h, w = x.type.shape[-2:]
    if size is None:                   # torch sizes floor(in * scale) and maps with 1/scale
        sh, sw = (float(s) for s in scales)
        size, factors = (int(h * sh), int(w * sw)), (1.0, 1.0, sh, sw)
    else:
        size, factors = pair(size), None
    attrs = {"size": (*x.type.shape[:2], *size), "mode": mode, "scales": factors}
    if mode == "linear":
        attrs["coordinate_transformation_mode"] = ("align_corners" if align_corners
                                                   else "pytorch_half_pixel")
    elif c.target.startswith("aten._upsample_nearest_exact"):   # floor((i + 0.5) * scale)
        attrs.update(coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    else:                                                       # floor(i * scale)
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return c.emit("resize", [x], **attrs)


@aten_converter("aten.upsample_bilinear2d")
def _upsample_bilinear(c: AtenCtx):
    if c.target.endswith(".vec"):
        return _resize(c, "linear", c.arg(1), c.arg(2), c.arg(3))
    return _resize(c, "linear", c.arg(1), c.arg(2), (c.arg(3), c.arg(4)) if c.arg(3) else None)


@aten_converter("aten.upsample_nearest2d", "aten._upsample_nearest_exact2d")
def _upsample_nearest(c: AtenCtx):
    if c.target.endswith(".vec"):
        return _resize(c, "nearest", c.arg(1), None, c.arg(2))
    return _resize(c, "nearest", c.arg(1), None, (c.arg(2), c.arg(3)) if c.arg(2) else None)
