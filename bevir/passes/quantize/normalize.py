"""Fixed-point lowerings of reductions and normalizations: sums and means, softmax,
layer norm over the last axis."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node
from ...ir.types import DType
from ...ops.numerics import NORM_FRAC
from ..quant_config import Rule
from .context import Context, feeds, fixed_const, fixed_type, lowers


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
    xq = cx.fixed(x, node, dt)
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
