"""What stays float after quantize: the float ops on the way from the inputs to the outputs."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ...ir.graph import Graph, Node


@dataclass
class FloatOps:
    """Ops computing in float on the way from some inputs to the outputs (graph order)."""

    nodes: list[Node]

    def __len__(self) -> int:
        return len(self.nodes)

    def counts(self) -> dict[str, int]:
        """Op -> how many."""
        return dict(Counter(n.op for n in self.nodes))

    def table(self) -> str:
        """One line per node: op, result type and provenance."""
        return "\n".join(f"{n.op:<16} {n.outputs[0].type}  {n.loc or ''}" for n in self.nodes)


def float_ops_between(graph: Graph, sources: Sequence[str]) -> FloatOps:
    """The nodes with a float result on a path from the graph inputs named ``sources`` to
    an output: what stays float in the quantized program. A dequantize whose result is a
    graph output (the program's output conversion) is not counted."""
    outputs = {id(v) for v in graph.outputs.values()}
    ahead: set[Node] = set()
    stack = [v for v in graph.inputs if v.name in sources]
    while stack:
        for user in stack.pop().users:
            if user not in ahead:
                ahead.add(user)
                stack.extend(user.outputs)
    behind: set[Node] = set()
    todo = [v.producer for v in graph.outputs.values() if v.producer is not None]
    while todo:
        n = todo.pop()
        if n not in behind:
            behind.add(n)
            todo.extend(v.producer for v in n.inputs if v is not None and v.producer is not None)

    def counted(n: Node) -> bool:
        if not any(o.type.dtype.is_float for o in n.outputs):
            return False
        return not (n.op in ("dequantize", "fx_dequantize") and id(n.outputs[0]) in outputs)
    return FloatOps([n for n in graph.nodes if n in ahead and n in behind and counted(n)])
