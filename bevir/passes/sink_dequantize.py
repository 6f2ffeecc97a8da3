"""sink-dequantize: move data movement onto the integers, so float stays out of INT8 paths.

After quantization a value often leaves the integers only to be reshaped, transposed,
sliced or pooled and quantized again: ``fx_quantize(reshape(fx_dequantize(q)))``, or
onnxruntime's symmetric ``quantize(relu(dequantize(q)))``. Every rewrite here is exact,
so the pass is semantics preserving:

=========================  ================================================================
pattern                    rewrites
=========================  ================================================================
sink-dequantize            M(dq(q), ...) -> dq(M(q, ...)) for data movement M (reshape,
                           flatten, squeeze, unsqueeze, transpose, slice, expand, gather)
                           and the monotone maxpool2d, with dq a per-tensor ``dequantize``
                           or ``fx_dequantize`` (moving and taking maxima commute with an
                           increasing elementwise map; padding never wins a max)
sink-dequantize-relu       relu(dq(q)) -> dq(clip(q, min=zero point)): (q - z) * s <= 0
                           exactly when q <= z
sink-dequantize-concat     concat(dq(q1), dq(q2), ...) -> dq(concat(q1, q2, ...)), all of
                           one quantization
cancel-requantize          quantize(dequantize(q)) -> q, fx_quantize(fx_dequantize(q)) -> q
                           with the same parameters and an 8-bit q: the round trip of a
                           code through float32 gives the code back; with other frac bits
                           (an i8/i16 q, exact in float32) -> fx_requantize(q), the same
                           round half up
=========================  ================================================================

The dequantize is duplicated, not moved: its other users keep reading it, and ``dce``
drops it once none are left.
"""
from __future__ import annotations

from ..ir.graph import Node, Value
from ..ops import all_ops
from ..ir.types import AffineQuant, DType
from .patterns import Match, NoMatch, PatternPass, RewritePattern, Rewriter

DEQUANTIZE = ("dequantize", "fx_dequantize")
#: ops whose operand 0 can be moved onto the integers under a per-tensor dequantize: the
#: data-movement ops (``moves_data``) and maxpool2d (max commutes with the monotone scale)
MOVES = tuple(name for name, op in all_ops().items() if op.moves_data) + ("maxpool2d",)
_CODES8 = (DType.i8, DType.u8)


def per_tensor_dequantize(v: Value | None) -> Node | None:
    """The producer of ``v`` when it is a dequantize of per-tensor quantized codes."""
    n = None if v is None else v.producer
    if n is None or n.op not in DEQUANTIZE:
        return None
    q = n.inputs[0].type.quant
    if q is None or q.axis is not None:
        return None
    if isinstance(q, AffineQuant) and not q.scale[0] > 0:
        return None
    return n


class _SinkPattern(RewritePattern):
    """Matches a root of ``roots`` whose operand 0 is a per-tensor dequantize; the
    dequantize may have other users (it is duplicated, not moved)."""

    def match(self, node: Node) -> Match | NoMatch:
        dq = per_tensor_dequantize(node.inputs[0] if node.inputs else None)
        if dq is None:
            return NoMatch(f"operand 0 of {node.name} is not a per-tensor dequantize")
        return Match(node, [node], {"dq": dq, "q": dq.inputs[0]})

    def sink(self, rw: Rewriter, m: Match, op: str, inputs: list, attrs: dict) -> None:
        moved = rw.create(op, inputs, attrs)
        rw.replace(m.root, rw.create(m["dq"].op, [moved.outputs[0]], m["dq"].attrs))


class SinkDequantize(_SinkPattern):
    """M(dq(q), ...) -> dq(M(q, ...)) for data movement and maxpool2d."""

    name = "sink-dequantize"
    roots = MOVES

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        self.sink(rw, m, m.root.op, [m["q"], *m.root.inputs[1:]], m.root.attrs)


class SinkDequantizeRelu(_SinkPattern):
    """relu(dq(q)) -> dq(clip(q, min=zero point))."""

    name = "sink-dequantize-relu"
    roots = ("relu",)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        quant = m["q"].type.quant
        zero = quant.zero_point[0] if isinstance(quant, AffineQuant) else 0
        self.sink(rw, m, "clip", [m["q"]], {"min": float(zero)})


class SinkDequantizeConcat(RewritePattern):
    """concat(dq(q1), dq(q2), ...) -> dq(concat(q1, q2, ...)), one quantization for all."""

    name = "sink-dequantize-concat"
    roots = ("concat",)

    def match(self, node: Node) -> Match | NoMatch:
        dqs = [per_tensor_dequantize(v) for v in node.inputs]
        if None in dqs:
            return NoMatch(f"an operand of {node.name} is not a per-tensor dequantize")
        first = dqs[0].inputs[0].type
        if any(d.op != dqs[0].op or (d.inputs[0].type.dtype, d.inputs[0].type.quant)
               != (first.dtype, first.quant) for d in dqs):
            return NoMatch(f"the operands of {node.name} are quantized differently")
        return Match(node, [node], {"dq": dqs[0], "qs": [d.inputs[0] for d in dqs]})

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        moved = rw.create("concat", m["qs"], m.root.attrs)
        rw.replace(m.root, rw.create(m["dq"].op, [moved.outputs[0]], m["dq"].attrs))


class CancelRequantize(RewritePattern):
    """quantize(dequantize(q)) -> q and fx_quantize(fx_dequantize(q)) -> q, same parameters;
    fx_quantize(fx_dequantize(q)) -> fx_requantize(q) with other frac bits."""

    name = "cancel-requantize"
    roots = ("quantize", "fx_quantize")

    def match(self, node: Node) -> Match | NoMatch:
        src = node.inputs[0].producer
        pair = {"quantize": "dequantize", "fx_quantize": "fx_dequantize"}[node.op]
        if src is None or src.op != pair:
            return NoMatch(f"{node.name} does not quantize a {pair}")
        q = src.inputs[0]
        same = (q.type.dtype, q.type.quant) == (node.output.type.dtype, node.output.type.quant)
        if q.type.dtype in _CODES8 and same:
            return Match(node, [node], {"q": q})
        if node.op == "fx_quantize" and q.type.dtype in (DType.i8, DType.i16) \
                and q.type.quant.axis is None:
            return Match(node, [node], {"q": q, "requantize": True})
        return NoMatch(f"{node.name} quantizes {q.name} with other parameters")

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        if m.get("requantize"):
            rw.replace(m.root, rw.create("fx_requantize", [m["q"]], m.root.attrs))
        else:
            rw.replace(m.root, m["q"])


class SinkDequantizePass(PatternPass):
    """Move data movement, relu and maxpool under per-tensor dequantizes onto the integers
    and cancel quantize-dequantize round trips (exact). Options: ``enable`` / ``disable``,
    ``max_rewrites``."""

    name = "sink-dequantize"
    description = "data movement onto the integers under dequantize; cancel round trips"
    patterns = (SinkDequantize, SinkDequantizeRelu, SinkDequantizeConcat, CancelRequantize)

