"""Decompositions both frontends use, written once over an ``emit(op, inputs, attrs)``
callback (each frontend passes its own, which names the nodes and records provenance)."""
from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Value

#: emit(op, inputs, attrs=None) -> the result
Emit = Callable[..., Value]


def group_norm(emit: Emit, x: Value, groups: int, epsilon: float, weight: Value | None,
               bias: Value | None) -> Value:
    """Group normalization of ``x`` [N, C, ...] (instance normalization: ``groups`` = C):
    a layer norm over each group's elements, then the per-channel ``weight`` and ``bias``."""
    n, ch = x.type.shape[:2]
    y = emit("reshape", [x], {"shape": (n, groups, x.type.numel // (n * groups))})
    y = emit("layer_norm", [y, None, None], {"axis": -1, "epsilon": epsilon})
    y = emit("reshape", [y], {"shape": x.type.shape})
    per_channel = (ch,) + (1,) * (x.type.rank - 2)
    if weight is not None:
        y = emit("mul", [y, emit("reshape", [weight], {"shape": per_channel})])
    if bias is not None:
        y = emit("add", [y, emit("reshape", [bias], {"shape": per_channel})])
    return y
