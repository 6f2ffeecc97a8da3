"""Fixed-point lowerings of data movement: ops that only move, select or order values
(reshape, transpose, split, gather, max pooling) run on the codes; concatenation."""
from __future__ import annotations

import math

import numpy as np

from ...ir.graph import Node, Value
from ...ir.types import DType
from ...ops.kernels.resize import BILINEAR_MODES
from ..quant_config import Rule
from .context import Context, lowers, read_by_norm, read_by_tables


@lowers("concat")
def concat(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """concat on the codes, each operand requantized to the result's frac bits; in 16
    bits, keeping every bit, where some operands are exact sums on their way to a table
    (see Context.exact_width), or on their way to a layer norm (Context.norm_width)."""
    wide = read_by_tables(node.output) or read_by_norm(node.output)
    qs = cx.wide_operands(node) if wide else cx.operands(node)
    if qs is None:
        return "uncalibrated input"
    out = {"out_frac_bits": fy} if all(q.type.dtype is DType.i8 for q in qs) else \
        cx.exact_width(node.output, qs)
    qs = [q if (q.type.quant.frac_bits[0], q.type.dtype.value) ==
          (out["out_frac_bits"], out.get("out_dtype", "i8")) else
          cx.create("fx_requantize", [q], out, node) for q in qs]
    cx.swap(node, cx.create("concat", qs, node.attrs, node))
    return None


@lowers("movement")
def movement(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """The op on the codes of its data operand (operand 0), the frac bits kept: where that
    operand has codes already (its producer was lowered) or is a constant (an embedding
    table, quantized per tensor); the other operands (indices) as they are."""
    q, why = _codes(cx, node)
    if q is None:
        return why
    new = cx.graph.create_node(node.op, [q, *node.inputs[1:]], node.attrs, loc=node.loc,
                               before=node)
    cx.swap_all(node, list(new.outputs))
    return None


@lowers("split")
def split(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """A split as one slice of the codes per piece (a kernel has one result)."""
    q, why = _codes(cx, node)
    if q is None:
        return why
    axis, start, pieces = node.attrs["axis"], 0, []
    for size in node.attrs["sizes"]:
        pieces.append(cx.create("slice", [q], {"starts": [start], "ends": [start + size],
                                               "axes": [axis], "steps": [1]}, node))
        start += size
    cx.swap_all(node, pieces)
    return None


@lowers("pad")
def pad(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """Constant or edge padding on the codes, the frac bits kept; a constant's value as a
    code of them (where it is one: the op stays float otherwise)."""
    q, why = _codes(cx, node)
    if q is None:
        return why
    attrs = dict(node.attrs)
    if attrs["mode"] not in ("constant", "edge"):
        return f"{attrs['mode']} padding"
    code = math.ldexp(attrs["value"], q.type.quant.frac_bits[0])
    info = np.iinfo(q.type.dtype.np)
    if attrs["mode"] == "constant" and not (code.is_integer() and info.min <= code <= info.max):
        return f"the pad value {attrs['value']} is not a code of the operand's frac bits"
    attrs["value"] = code
    cx.swap(node, cx.create("pad", [q], attrs, node))
    return None


@lowers("resize")
def resize(cx: Context, node: Node, rule: Rule, fy: int, target: None) -> str | None:
    """Resize on the codes, the frac bits kept: nearest; linear on 8-bit codes (at most
    two resized axes: onnxruntime's fixed-point bilinear kernel, as the golden model runs
    resize of int8)."""
    a = node.attrs
    if a["mode"] == "cubic" or a["roi"] is not None or (a["mode"] == "nearest" and a["scales"]):
        return f"{a['mode']} resize with these coordinates has no integer form here"
    t = node.inputs[0].type
    if a["mode"] == "linear":
        resized = sum(i != o for i, o in zip(t.shape, a["size"]))
        if resized > 2 or a["coordinate_transformation_mode"] not in BILINEAR_MODES:
            return "a linear resize of more than two axes, or of other coordinates"
        q = cx.fixed(node.inputs[0], node)
        if q is None:
            return "uncalibrated input"
    else:
        q, why = _codes(cx, node)
        if q is None:
            return why
    cx.swap(node, cx.create("resize", [q], a, node))
    return None


def _read_as_codes(node: Node) -> bool:
    """Whether what ``node`` moves is read, through further moves, only by ops with an
    integer form (not by float ops or as a graph output, which would take the codes back to
    float on the host: a round trip, and the input's quantization error for nothing)."""
    graph, stack = node.graph, [node]
    while stack:
        for v in stack.pop().outputs:
            if graph is not None and any(o is v for o in graph.outputs.values()):
                return False
            for user, _ in v.uses:
                if user.opdef.moves_data:
                    stack.append(user)
                elif user.opdef.fixed_point is None and not all(
                        o.type.dtype.is_int for o in user.outputs):
                    return False
    return True


def _codes(cx: Context, node: Node) -> tuple[Value | None, str]:
    """(the codes of ``node``'s data operand, or None and why not): its fixed twin, or a
    constant's or a graph input's codes (the input quantized before it moves, so that
    the move runs on the device)."""
    x = node.inputs[0]
    graph_input = any(x is v for v in cx.graph.inputs)
    if graph_input and not _read_as_codes(node):
        return None, "the moved input goes on to float ops (moved in float: no round trip)"
    given = x.is_const or graph_input                                # a table, a graph input
    q = cx.fixed(x, node) if given else (cx.twin(x, DType.i8) or cx.twin(x, DType.i16))
    if q is None:
        return None, "its data is computed in float" if not given else "uncalibrated data"
    if q.type.quant.axis is not None:
        return None, "its codes are quantized per channel"
    return q, ""
