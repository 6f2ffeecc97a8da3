"""Fixed-point lowerings of the products: convolutions and matrix products by constant
weights (a fused activation becoming its fx op), and products of two activations."""
from __future__ import annotations

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DType, TensorType
from ...ops import get_op
from ..quant_config import Rule
from .context import F32, Context, lowers, quantize_weight
from .elementwise import code_bounds, within_reach


@lowers("product")
def product(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    conv = node.op in ("conv2d", "conv2d_act")
    x, w, b, trans_b = _conv_parts(node) if conv else _linear_parts(node)
    act = node.attrs.get("activation", "none")
    spec = None if act in ("none", "clip") else get_op(act).activation
    if spec is not None and spec.fixed is None:
        return f"activation {act} has no fixed-point lowering"
    if w is None:
        return _activation_product(cx, node, fy, spec)
    target = "fx_conv2d" if conv else "fx_linear"
    dt, out = cx.width(node, rule, fy, target, *([spec.fixed] if spec else []))
    xq = cx.fixed(x, node, dt)
    if xq is None:
        return "uncalibrated input"
    wt = w.const if trans_b or conv else w.const.T            # [N, K] / [O, C, KH, KW]
    codes, wq = quantize_weight(np.ascontiguousarray(wt, F32), rule.weights == "per_channel")
    g = cx.graph
    wv = g.add_const(codes, f"{w.name}.q", TensorType(codes.shape, DType.i8, quant=wq))
    inputs = [xq, wv]
    if b is not None:
        fx = xq.type.quant.frac_bits[0]
        acc = np.asarray(wq.scale, np.float64) * 2.0 ** -fx
        bq = np.clip(np.rint(b.const.astype(np.float64) / acc), -2**31, 2**31 - 1)
        inputs.append(g.add_const(bq.astype(np.int32), f"{b.name}.q"))
    attrs = {k: node.attrs[k] for k in ("strides", "pads", "dilations", "groups")} \
        if conv else {}
    if act == "none" and dt is DType.i8:
        out.update(cx.result_width(node, fy))
    then_attrs = {a: node.attrs[f] for a, f in spec.attrs} if spec else {}
    if spec is not None and dt is DType.i16:
        then_attrs["out_dtype"] = "i16"
    if act == "clip":
        return _clipped(cx, node, target, inputs, {**out, **attrs})
    cx.replace(node, target, inputs, {**out, **attrs}, spec and spec.fixed, then_attrs)
    return None


def _clipped(cx: Context, node: Node, op: str, inputs: list[Value], attrs: dict) -> None:
    """``op(inputs){attrs}`` clipped on its codes to the node's fused clip bounds (relu6:
    [0, 6]), the bounds rounded to the result's frac bits."""
    y = cx.create(op, inputs, attrs, node)
    bounds = code_bounds({"min": node.attrs.get("clip_min"), "max": node.attrs.get("clip_max")},
                         y.type)
    cx.swap(node, cx.create("clip", [y], bounds, node))
    return None


def _activation_product(cx: Context, node: Node, fy: int, spec) -> str | None:
    """A product of two activations (attention scores, attention times values), its fused
    activation after it, or its constant bias (an attention mask) added to its codes. One
    operand may be a constant of another form than a weight (learned queries on the left,
    a batched table), quantized per tensor with its own frac bits."""
    (x, y), bias = node.inputs[:2], node.inputs[2] if len(node.inputs) > 2 else None
    if node.op not in ("matmul", "matmul_act") or (x.is_const and y.is_const):
        return "not a product by a constant weight or of two activations"
    if node.attrs.get("activation", "none") == "clip" or node.attrs.get("trans_b"):
        return "a product of two activations with a fused clip or a transposed operand"
    if bias is not None and (not bias.is_const or spec is not None):
        return "a product of two activations with a computed bias, or a bias and an activation"
    a = cx.twin(x, DType.i16) or cx.fixed(x, node)
    b = cx.fixed(y, node)
    if a is None or b is None:
        return "uncalibrated input"
    then = {a_: node.attrs[f] for a_, f in spec.attrs} if spec else {}
    out = {"out_frac_bits": fy, **(cx.result_width(node, fy) if spec is None else {})}
    if bias is None:
        cx.replace(node, "fx_matmul", [a, b], out, spec and spec.fixed, then)
        return None
    dt = DType(out.get("out_dtype", "i8"))
    scores = cx.create("fx_matmul", [a, b], out, node)     # at the masked scores' frac bits
    mask = cx.addend(bias, out["out_frac_bits"]) or cx.fixed(bias, node, dt)
    qs = within_reach([scores, mask], out["out_frac_bits"], cx, node)
    cx.replace(node, "fx_add", qs, out)
    return None


def _linear_parts(node: Node) -> tuple[Value, Value | None, Value | None, bool]:
    """(x, constant 2-D weight, constant [N] bias or None, trans_b) of a product; the
    weight is None when the node is not a plain product by a constant."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    a = node.attrs
    trans_b = bool(a.get("trans_b", False))
    plain = {"gemm": lambda: a["alpha"] == 1.0 and a["beta"] == 1.0 and not a["trans_a"]
             }.get(node.op, lambda: True)
    if w is None or not w.is_const or w.type.rank != 2 or not plain():
        return x, None, None, trans_b
    n = w.type.shape[0 if trans_b else 1]
    if bias is not None and not (bias.is_const and bias.type.shape == (n,)):
        return x, None, None, trans_b
    return x, w, bias, trans_b


def _conv_parts(node: Node) -> tuple[Value, Value | None, Value | None, bool]:
    """(x, constant weight, constant bias or None, False) of a convolution; the weight is
    None unless weight and bias are constants."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (bias is not None and not bias.is_const):
        return x, None, None, False
    return x, w, bias, False
