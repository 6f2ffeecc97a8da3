"""The fixed-point lowering of multi-scale deformable attention: values and weights in
8 bits, the sampling locations' arithmetic in 32-bit integers."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DType
from ..quant_config import Rule
from .context import Context, lowers, most_frac_bits

#: sampling locations (normalized) are i32 fixed; beyond +-LOC_BOUND they saturate, which
#: samples nothing as the exact value would (the image spans [0, 1])
LOC_BOUND = 128.0
#: the most a term of the location arithmetic may reach (calibrated) for that to hold
LOC_TERM_BOUND = LOC_BOUND / 2


@lowers("deform_attn", first=True)
def deform_attn(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    value, loc, aw = node.inputs
    vq, aq = cx.fixed(value, node), cx.fixed(aw, node)
    if vq is None or aq is None:
        return "uncalibrated input"
    f = most_frac_bits(LOC_BOUND, np.iinfo(np.int32).max, -31, 31, 0)
    lq = _locations(cx, loc, node, f)
    if isinstance(lq, str):
        return lq
    cx.replace(node, "fx_ms_deform_attn", [vq, lq, aq],
               {"spatial_shapes": node.attrs["spatial_shapes"], "out_frac_bits": fy})
    return None


def _locations(cx: Context, v: Value, node: Node, f: int) -> Value | str:
    """Normalized sampling locations as i32 fixed<f>: the arithmetic on the quantized
    path (data movement, +, -, * and / by constants of the sampling offsets) in
    integers; geometry (not computed from the sources) quantized where it joins."""
    p = v.producer
    if v.is_const or p is None or not cx.is_active(p):
        q = cx.fixed(v, node, DType.i32, frac=f, bound=LOC_BOUND)
        return "uncalibrated sampling locations" if q is None else q
    if p.opdef.moves_data:
        inner = _locations(cx, p.inputs[0], node, f)
        return inner if isinstance(inner, str) else \
            cx.create(p.op, [inner, *p.inputs[1:]], p.attrs, node)
    wide = {"out_frac_bits": f, "out_dtype": "i32"}
    if p.op in ("add", "sub"):
        terms = [_locations(cx, x, node, f) for x in p.inputs]
        bad = next((t for t in terms if isinstance(t, str)), None)
        return bad or cx.create(f"fx_{p.op}", terms, wide, node)
    # a term computed from the sources: it must stay within the bound (see LOC_BOUND)
    e = cx.ranges.get(v)
    if e is None or max(abs(e.lo), abs(e.hi)) > LOC_TERM_BOUND:
        return (f"sampling-location term %{v.name} reaches beyond +-{LOC_TERM_BOUND} "
                "(or is uncalibrated)")
    if p.op in ("mul", "div") and p.inputs[1].is_const and not p.inputs[0].is_const:
        c = p.inputs[1]
        if p.op == "div" and np.any(c.const == 0):
            return "divides by a constant with zeros"
        xq = cx.fixed(p.inputs[0], node)
        if xq is None:
            return "uncalibrated sampling offsets"
        factor = cx.const(c, np.int16, reciprocal=p.op == "div")
        return cx.create("fx_mul", [xq, factor], wide, node)
    q = cx.fixed(v, node, DType.i32, frac=f, bound=LOC_BOUND)
    return "uncalibrated sampling locations" if q is None else q
