"""Fixed-point lowerings of reductions and normalizations: sums and means, softmax,
layer norm over the last axis."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ...ir.types import DType, Layout
from ...ops.numerics import NORM_FRAC
from ..quant_config import Rule
from .context import Context, feeds, fixed_const, fixed_type, lowers, most_frac_bits, takes_x


@lowers("reduce")
def reduce(cx: Context, node: Node, rule: Rule, fy: int, target: str) -> str | None:
    qs = cx.operands(node)
    if qs is None:
        return "uncalibrated input"
    cx.replace(node, target, qs, {"axes": node.attrs["axes"],
                                  "keepdims": node.attrs["keepdims"], "out_frac_bits": fy})
    return None


@lowers("softmax")
def softmax(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    xq = cx.twin(node.inputs[0], DType.i16) or cx.fixed(node.inputs[0], node)
    if xq is None:
        return "uncalibrated input"
    # probabilities that weight values in a matmul (attention) keep 16 bits
    wide = feeds(node.output, ("matmul",), operand=0)
    cx.replace(node, "fx_softmax", [xq], {
        "axis": node.attrs["axis"], "out_dtype": "i16" if wide else "i8",
        "out_frac_bits": 15 if wide else max(1, min(7, fy))})
    return None


@lowers("layer_norm")
def layer_norm(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    x, scale, bias = (list(node.inputs) + [None, None])[:3]
    if node.attrs["axis"] not in (-1, x.type.rank - 1):
        return "normalizes another axis than the last"
    if any(p is not None and not p.is_const for p in (scale, bias)):
        return "scale or bias is not a constant"
    dt, out = cx.width(node, rule, fy, "fx_layer_norm")
    wide = cx.twin(x, DType.i16) if takes_x("fx_layer_norm", DType.i16, x.type.shape) else None
    xq = wide if wide is not None else cx.fixed(x, node, dt)   # a residual stream's 16 bits
    if xq is None:
        return "uncalibrated input"
    g = cx.graph
    inputs = [xq, None, None]
    fg = 0
    if scale is not None:
        codes, fg = fixed_const(scale.const, np.int16)
        inputs[1] = g.add_const(codes, f"{scale.name}.q", fixed_type(codes, fg))
    if bias is not None:
        # bias frac bits: aligned with the Q16 normalized value times the scale when the
        # int32 holds it, else fewer (the shift stays within [0, 31])
        fb_max = NORM_FRAC + fg
        codes, fb = fixed_const(bias.const, np.int32, max_frac=fb_max, min_frac=fb_max - 31)
        inputs[2] = g.add_const(codes, f"{bias.name}.q", fixed_type(codes, fb))
    while inputs and inputs[-1] is None:
        inputs.pop()
    cx.replace(node, "fx_layer_norm", inputs, {"epsilon": node.attrs["epsilon"], **out})
    return None


@lowers("global_pool")
def global_pool(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """global average pooling as the mean of the codes over the spatial axes."""
    xq = cx.fixed(node.inputs[0], node)
    if xq is None:
        return "uncalibrated input"
    t = node.inputs[0].type
    axes = (1, 2) if t.layout is Layout.nhwc else tuple(range(2, t.rank))
    cx.replace(node, "fx_reduce_mean", [xq], {"axes": axes, "keepdims": True,
                                              "out_frac_bits": fy})
    return None


@lowers("avgpool")
def avgpool(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """average pooling on the codes: each window's exact sum divided by its count."""
    xq = cx.fixed(node.inputs[0], node)
    if xq is None:
        return "uncalibrated input"
    cx.replace(node, "fx_avgpool2d", [xq], {**node.attrs, "out_frac_bits": fy})
    return None


@lowers("batch_norm")
def batch_norm(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """batch norm as x * scale + shift per channel (i16 constants of their own frac bits):
    fx_mul to 16 bits, then fx_add (to 16 bits in a fixed16 group, from 16-bit x); the
    product's frac bits from the bound of x's codes times max|scale|."""
    x, *params = node.inputs
    if not all(p.is_const for p in params):
        return "its statistics are not constants"
    gamma, beta, mean, var = (p.const.astype(np.float64) for p in params)
    scale = gamma / np.sqrt(var + node.attrs["epsilon"])
    shift = beta - mean * scale
    dt, out = cx.width(node, rule, fy, "fx_mul", "fx_add")   # 16 bits in a fixed16 group
    xq = cx.fixed(x, node, dt)
    if xq is None:
        return "uncalibrated input"
    axis = 3 if x.type.layout is Layout.nhwc else 1
    shape = [1] * x.type.rank
    shape[axis] = scale.size
    g = cx.graph
    s_codes, fs = fixed_const(scale.reshape(shape), np.int16)
    t_codes, ft = fixed_const(shift.reshape(shape), np.int16)
    s = g.add_const(s_codes, g.unique_name(f"{node.output.name}.scale"), fixed_type(s_codes, fs))
    t = g.add_const(t_codes, g.unique_name(f"{node.output.name}.shift"), fixed_type(t_codes, ft))
    # the product's bound from the codes' (never saturates, and x's codes hold its range)
    top = float(np.iinfo(xq.type.dtype.np).max + 1)
    amax = top * 2.0 ** -xq.type.quant.frac_bits[0] * float(np.abs(scale).max())
    fm = most_frac_bits(amax, np.iinfo(np.int16).max, -31, 31, 15)
    scaled = cx.create("fx_mul", [xq, s], {"out_frac_bits": fm, "out_dtype": "i16"}, node)
    cx.replace(node, "fx_add", [scaled, t], out)
    return None
