"""Fixed-point lowerings of elementwise ops: tables (unary), sums, products and quotients,
clips, logarithms, and the NaN test (never true of integer codes)."""
from __future__ import annotations

import math

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DType
from ...ops import get_op
from ..quant_config import Rule
from .context import (Context, exact_sum, feeds, is_table, lowers, most_frac_bits,
                      read_by_norm)


@lowers("unary")
def unary(cx: Context, node: Node, rule: Rule, fy: int, target: str) -> str | None:
    dt, out = cx.width(node, rule, fy, target)
    table = is_table(target)
    wide = cx.twin(node.inputs[0], DType.i16) if table else None
    qs = [wide] if wide is not None else cx.operands(node, node.inputs[:1], dt)
    if qs is None:
        return "uncalibrated input"
    attrs = {k: v for k, v in node.attrs.items() if k in get_op(target).attrs and k not in out}
    cx.replace(node, target, qs, {**(cx.table_width(node, dt, out) if table else out), **attrs})
    return None


@lowers("binary")
def binary(cx: Context, node: Node, rule: Rule, fy: int, target: str) -> str | None:
    if all(v.is_const for v in node.inputs):
        return "both operands are constants"
    dt, out = cx.width(node, rule, fy, target)
    exact = dt is DType.i8 and exact_sum(node)
    normed = dt is DType.i8 and not exact and target == "fx_add" and read_by_norm(node.output)
    qs = cx.wide_operands(node) if exact or normed else cx.operands(node, None, dt)
    if qs is None:
        return "uncalibrated input"
    out = cx.exact_width(node.output, qs) if exact else cx.norm_width(node) if normed else out
    if target in ("fx_add", "fx_sub"):
        out = _masked_width(cx, node, out)
        qs = [cx.addend(v, out["out_frac_bits"]) or q for v, q in zip(node.inputs, qs)]
    cx.replace(node, target, within_reach(qs, out["out_frac_bits"], cx, node), out)
    return None


#: how far below its finite range a masked (-inf) softmax input's format reaches:
#: e**-12 < 2**-16, nothing of a 16-bit probability
MASK_MARGIN = 12.0


def _masked_width(cx: Context, node: Node, out: dict) -> dict:
    """The result attributes of a sum with an infinite constant addend (a causal mask) that
    a softmax reads: 16 bits reaching MASK_MARGIN beyond its finite range, so that a
    masked score, saturated to the lowest code, weighs nothing (at the frac bits of a
    small range it would be a score like the others)."""
    masked = any(v.is_const and not np.isfinite(v.const).all() for v in node.inputs)
    e = cx.ranges.get(node.output)
    if not masked or e is None or not feeds(node.output, ("softmax",)):
        return out
    amax = max(abs(e.lo), abs(e.hi)) + MASK_MARGIN
    return {"out_dtype": "i16",
            "out_frac_bits": most_frac_bits(amax, np.iinfo(np.int16).max, -31, 31, 15)}


@lowers("add_relu")
def add_relu(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """relu(a + b): fx_add to the result's frac bits, then fx_relu."""
    dt, out = cx.width(node, rule, fy, "fx_add", "fx_relu")
    qs = cx.operands(node, None, dt)
    if qs is None:
        return "uncalibrated input"
    cx.replace(node, "fx_add", within_reach(qs, fy, cx, node), out, "fx_relu",
               {"out_dtype": out["out_dtype"]} if "out_dtype" in out else None)
    return None


def within_reach(qs: list[Value], fy: int, cx: Context, node: Node) -> list[Value]:
    """``qs`` with any operand whose frac bits lie more than 31 above another's or the
    result's (a value calibrated near zero) requantized to that reach: the bits it drops
    lie 31 below what the sum keeps."""
    reach = min(q.type.quant.frac_bits[0] for q in qs) + 31
    reach = min(reach, fy + 31)
    return [q if q.type.quant.frac_bits[0] <= reach else
            cx.create("fx_requantize", [q], {"out_frac_bits": reach,
                                             "out_dtype": q.type.dtype.value}, node)
            for q in qs]


@lowers("mul")
def mul(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    a, b = node.inputs
    if a.is_const:
        a, b = b, a
    if a.is_const:
        return "both operands are constants"
    dt, out = cx.width(node, rule, fy, "fx_mul")
    aq = cx.fixed(a, node, dt)
    bq = cx.const(b, np.int16) if b.is_const else cx.fixed(b, node, dt)
    if aq is None or bq is None:
        return "uncalibrated input"
    cx.replace(node, "fx_mul", [aq, bq], out)
    return None


@lowers("pow")
def power(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """x ** 2 and x ** 3 (a squared ReLU, an RMS norm's square, a tanh GELU's cube) as
    products of the codes; the square inside a cube in 16 bits."""
    x, e = node.inputs
    n = float(e.const.reshape(-1)[0]) if e.is_const and e.const.size == 1 else None
    if x.is_const or n not in (2.0, 3.0):
        return "not an activation to the power 2 or 3"
    dt, out = cx.width(node, rule, fy, "fx_mul")
    xq = cx.fixed(x, node, dt)
    if xq is None:
        return "uncalibrated input"
    sq = xq
    if n == 3.0:                # the square's frac bits from the codes' bound
        amax = math.ldexp(np.iinfo(xq.type.dtype.np).max, -xq.type.quant.frac_bits[0])
        f2 = most_frac_bits(amax * amax, np.iinfo(np.int16).max, -31, 31, 15)
        sq = cx.create("fx_mul", [xq, xq], {"out_frac_bits": f2, "out_dtype": "i16"}, node)
    cx.replace(node, "fx_mul", [sq, xq], out)
    return None


@lowers("div")
def div(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    x, d = node.inputs
    xq = cx.fixed(x, node) if not x.is_const else None
    if xq is None:
        return "uncalibrated or constant dividend"
    if d.is_const:
        if np.any(d.const == 0):
            return "divides by a constant with zeros"
        cx.replace(node, "fx_mul", [xq, cx.const(d, np.int16, reciprocal=True)],
                   {"out_frac_bits": fy})
        return None
    e = cx.ranges.get(d)
    if not _integer_valued(d) or e is None or e.hi > 1 << 16:
        return _by_reciprocal(cx, node, xq, d, fy)
    count = cx.create("cast", [d], {"to": "i32", "saturate": True}, node)
    cx.replace(node, "fx_div", [xq, count], {"out_frac_bits": fy,
                                             "max_count": max(255, math.ceil(e.hi))})
    return None


def _by_reciprocal(cx: Context, node: Node, xq: Value, d: Value, fy: int) -> str | None:
    """x / d for an activation d of one sign (a norm, a sum of exponentials): x times a
    16-bit table of 1 / d on d's codes (its 16-bit ones where it has them)."""
    dq = cx.twin(d, DType.i16) or cx.fixed(d, node)
    e = cx.ranges.get(d) or (cx.ranges.get(dq.name) if dq is not None else None)
    if dq is None or e is None or not (e.lo > 0 or e.hi < 0):
        return "the divisor is neither a constant, a count nor of one sign"
    inv = 1.0 / min(abs(e.lo), abs(e.hi))
    fr = most_frac_bits(inv, np.iinfo(np.int16).max, -31, 31, 15)
    r = cx.create("fx_reciprocal", [dq], {"out_frac_bits": fr, "out_dtype": "i16"}, node)
    cx.replace(node, "fx_mul", [xq, r], {"out_frac_bits": fy})
    return None


@lowers("clip")
def clip(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """clip on the codes, the bounds rounded to the input's frac bits."""
    xq = cx.fixed(node.inputs[0], node)
    if xq is None:
        return "uncalibrated input"
    bounds = code_bounds({k: node.attrs[k] for k in ("min", "max")}, xq.type)
    cx.swap(node, cx.create("clip", [xq], bounds, node))
    return None


def code_bounds(bounds: dict[str, float | None], t) -> dict[str, float]:
    """Clip bounds (``min``, ``max``; None for none) as codes of fixed type ``t``: rounded
    half up to its frac bits, within its dtype."""
    f, info = t.quant.frac_bits[0], np.iinfo(t.dtype.np)
    return {k: float(np.clip(np.floor(v * 2.0 ** f + 0.5), info.min, info.max))
            for k, v in bounds.items() if v is not None}


def _integer_valued(v: Value) -> bool:
    """Whether ``v`` holds integers by construction: a cast of integers or booleans, an
    integral constant, or max/min/sum/add of such (e.g. a count of cameras)."""
    if v.is_const:
        return bool(np.all(np.mod(v.const, 1) == 0))
    p = v.producer
    if p is None:
        return False
    if p.op == "cast":
        return not p.inputs[0].type.dtype.is_float
    return p.op in ("max", "min", "add", "reduce_sum", "reduce_max", "reduce_min") and all(
        _integer_valued(x) for x in p.inputs if x is not None)


@lowers("never_nan")
def never_nan(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """isnan of a value dequantized from integer codes is all false: the node becomes a
    constant, and a ``where`` it guards (an exporter's ``where(isnan(p), 0, p)`` after a
    softmax) its other operand."""
    x = node.inputs[0]
    if cx.twin(x, DType.i8) is None and cx.twin(x, DType.i16) is None:
        return "its operand is computed in float"
    g = cx.graph
    false = g.add_const(np.zeros(node.output.type.shape, bool),
                        g.unique_name(f"{node.output.name}.never"))
    for user, i in list(node.output.uses):
        if user.op == "where" and i == 0 and user.output.type == user.inputs[2].type:
            g.replace_all_uses(user.output, user.inputs[2])
            g.erase(user)
    g.replace_all_uses(node.output, false)
    g.erase(node)
    cx.stat(f"lowered-{node.op}")
    return None
