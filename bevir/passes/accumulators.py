"""Static int32 accumulator bounds of the fixed-point product ops.

Every contraction (an op deriving :class:`~bevir.ops.linalg.Contraction`: ``fx_linear``,
``fx_matmul``, ``fx_conv2d``) with a fixed-point result accumulates exact integer products
into an int32 (saturating, docs/numerics.md); the op says how long its reduction is and
which weight axes it runs over. :func:`accumulator_bounds` bounds every accumulator
from what is known before running: the operand dtypes (an i8 code is at most 128 in
magnitude, an i16 one 32768), the constant weights and biases (per output channel:
code_max * sum |w| + |b|), and for attention probabilities from ``fx_softmax`` their row
sum (at most 2**f + n/2 codes).
``fx_ms_deform_attn`` rejects attributes whose accumulator could overflow when it is
built, so its bound holds by construction. A bound within int32 rules overflow out for
every input; :func:`check_accumulators` raises a PassError naming the others.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import FixedPointQuant
from ..ops.linalg import Contraction

INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class AccumulatorBound:
    """The largest |accumulator| ``node`` can reach, and whether int32 holds it."""

    node: Node
    bound: int

    @property
    def safe(self) -> bool:
        return self.bound <= INT32_MAX

    def __str__(self) -> str:
        n = self.node
        verdict = "fits int32" if self.safe else "can overflow int32"
        return f"{n.op} {n.name} ({n.loc or 'no loc'}): |acc| <= {self.bound} {verdict}"


def _code_max(v: Value) -> int:
    """The largest |code| of an integer operand: its dtype's, or a softmax row's sum."""
    info = np.iinfo(v.type.dtype.np)
    return max(-int(info.min), int(info.max))


def _row_sum(v: Value, length: int) -> int | None:
    """The largest sum of ``length`` codes along a softmax's axis (probabilities), or None."""
    p = v.producer
    if p is None or p.op != "fx_softmax":
        return None
    return (1 << p.attrs["out_frac_bits"]) + (length + 1) // 2


def _weighted(node: Node, w: np.ndarray, reduce_axes: tuple[int, ...]) -> int:
    """max over output channels of code_max(x) * sum |w| + |bias|, for a constant weight."""
    x = node.inputs[0]
    per_out = _code_max(x) * np.abs(w.astype(np.int64)).sum(axis=reduce_axes)
    if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].is_const:
        per_out = per_out + np.abs(node.inputs[2].const.astype(np.int64))
    return int(per_out.max(initial=0))


def _bound(node: Node) -> int | None:
    opdef = node.opdef
    if not isinstance(opdef, Contraction) or not isinstance(node.outputs[0].type.quant,
                                                               FixedPointQuant):
        return None
    x, w = node.inputs[0], node.inputs[1]
    c = opdef.ctx(node)
    if w.is_const:
        return _weighted(node, w.const, opdef.weight_axes(c, w.type))
    k = opdef.reduction(c, x.type, w.type)         # a product of two activations
    rows = _row_sum(x, k)
    lhs = rows if rows is not None else _code_max(x) * k
    return lhs * _code_max(w)


def accumulator_bounds(graph: Graph) -> list[AccumulatorBound]:
    """One bound per fixed-point product op of ``graph``, in graph order."""
    out = []
    for n in graph.nodes:
        b = _bound(n)
        if b is not None:
            out.append(AccumulatorBound(n, b))
    return out


def check_accumulators(graph: Graph) -> list[AccumulatorBound]:
    """The bounds, after raising a PassError naming every op whose accumulator can
    overflow int32."""
    bounds = accumulator_bounds(graph)
    bad = [b for b in bounds if not b.safe]
    if bad:
        first = bad[0].node
        raise PassError(f"{len(bad)} accumulator(s) can overflow int32: "
                        + "; ".join(str(b) for b in bad), node=first.name, op=first.op,
                        loc=first.loc)
    return bounds
