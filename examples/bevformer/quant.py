"""BEVFormer's quantization: the reference flow's preset and the lowering of its
``inverse_sigmoid`` as one table. Importing this module registers both (``--load-module
examples.bevformer.quant`` on the command line), so that::

    bevir.quantize(graph, "reference-flow")

lowers a BEVFormer graph as the reference flow does."""
from __future__ import annotations

import numpy as np

from bevir.ir.graph import Node, Value
from bevir.passes.quant_config import Rule, register_preset
from bevir.passes.quantize import Context, lowering_pattern

_HEAD = "pts_bbox_head"
_DECODER = f"{_HEAD}.transformer.decoder.layers.*"

#: the reference flow's strategy, as a user's config file would hold it
REFERENCE_FLOW = {
    "sources": ["img", "feats", "prev_bev"],
    "rules": [
        # the reference flow's host post-processing: the last reference update, sigmoid
        # and denormalization of the boxes to metres (8 bits would be ~0.8 m steps)
        {"name": "box-decoding", "where": [_HEAD], "exclude": True},
        {"name": "backbone", "where": ["/img_backbone/*", "/img_neck/*"],
         "weights": "per_tensor", "activations": "affine"},
        {"name": "encoder", "where": [f"{_HEAD}.transformer.encoder.layers.*"],
         "weights": "per_channel"},
        {"name": "decoder-attention", "where": [f"{_DECODER}.attentions.*"],
         "weights": "per_tensor"},
        {"name": "decoder-ffn", "where": [f"{_DECODER}.ffns.*"],
         "weights": "per_channel"},
        {"name": "heads", "where": [f"{_HEAD}.cls_branches.*", f"{_HEAD}.reg_branches.*"],
         "weights": "per_channel"},
    ],
    # the rest of the head (decoder norms, reference-point refinement, box decoding);
    # the geometry, which does not depend on the sources, stays float
    "default": {"name": "other", "weights": "per_channel"},
}

register_preset("reference-flow", REFERENCE_FLOW)


@lowering_pattern("log", first=True)
def inverse_sigmoid(cx: Context, node: Node, rule: Rule, fy: int, target: str):
    """log(max(x1, eps) / max(1 - x1, eps)) with x1 = clip(x, 0, 1), as BEVFormer's
    inverse_sigmoid traces, as one table (fx_inverse_sigmoid; its float producers go
    with it, so it runs before the other lowerings)."""
    x, eps = _inverse_sigmoid(node)
    if x is None:
        return NotImplemented
    dt, out = cx.width(node, rule, fy, "fx_inverse_sigmoid")
    xq = cx.fixed(x, node, dt)
    if xq is None:
        return "uncalibrated input"
    cx.replace(node, "fx_inverse_sigmoid", [xq], {**cx.table_width(node, dt, out), "eps": eps})
    return None


def _inverse_sigmoid(node: Node) -> tuple[Value | None, float]:
    """(x, eps) when ``node`` is log(div(clip(x1, min=eps), clip(sub(1, x1), min=eps))) with
    x1 = clip(x, 0, 1); else (None, 0)."""
    def prod(v, op):
        p = v.producer if v is not None else None
        return p if p is not None and p.op == op else None
    div = prod(node.inputs[0], "div")
    num, den = (prod(v, "clip") for v in div.inputs) if div is not None else (None, None)
    sub = prod(den.inputs[0], "sub") if den is not None else None
    if num is None or sub is None or num.attrs.get("max") is not None:
        return None, 0.0
    x1 = num.inputs[0]
    unit = prod(x1, "clip")
    one = sub.inputs[0]
    if (unit is None or sub.inputs[1] is not x1 or not one.is_const or np.any(one.const != 1)
            or (unit.attrs.get("min"), unit.attrs.get("max")) != (0.0, 1.0)
            or num.attrs.get("min") != den.attrs.get("min") or den.attrs.get("max") is not None):
        return None, 0.0
    return unit.inputs[0], float(num.attrs["min"])
