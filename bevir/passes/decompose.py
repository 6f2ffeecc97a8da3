"""decompose: expand module-level ops into primitive ops.

An op opts in by defining ``decompose(self, builder, node) -> list[Value]`` in its
:class:`~bevir.ir.opdef.OpDef`: the same computation written with a
:class:`~bevir.ir.builder.Builder` placed before the node. The parts get the node's
provenance plus a sub-path (``encoder.layers.0.attentions.0/sampling_offsets``), so
reports made later still speak in module names. Quantization runs on the result.
"""
from __future__ import annotations

from ..errors import BevirError, PassError
from ..ir.builder import Builder
from ..ir.graph import Graph, Node
from .analysis import AnalysisManager
from .core import Pass
from .rewrites import rewrite_permitted


def decomposable(node: Node) -> bool:
    return node.opdef.decompose is not None


class Decompose(Pass):
    """Expand every node whose op defines a decomposition (``ops``: only these op names,
    separated by ``|``; empty: all), repeating until none is left."""

    name = "decompose"
    description = "expand module-level ops (attention, ffn) into primitive ops"
    tolerance = 1e-5

    ops: str = ""

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        wanted = {s for s in self.ops.split("|") if s}
        for _ in range(8):              # expansions may contain decomposable ops
            todo = [n for n in graph.nodes if decomposable(n) and (not wanted or n.op in wanted)]
            if not todo:
                return
            for node in todo:
                if not rewrite_permitted("decompose", node):
                    return
                self.expand(graph, node)
                self.stat(node.op)
        raise PassError("decompose: expansions keep producing decomposable ops")

    @staticmethod
    def expand(graph: Graph, node: Node) -> None:
        """Replace ``node`` by its decomposition; results keep their names."""
        b = Builder(graph, before=node, loc=node.loc)
        where = dict(node=node.name, op=node.op, loc=node.loc)
        try:
            values = node.opdef.decompose(b, node)
        except BevirError as e:
            raise PassError(f"decomposition failed: {e.message}", **where) from e
        got = [v.type for v in values]
        if got != [v.type for v in node.outputs]:
            raise PassError(f"decomposition gives {', '.join(map(str, got))}, the op "
                            f"{', '.join(str(v.type) for v in node.outputs)}", **where)
        names = [v.name for v in node.outputs]
        graph.replace_node(node, values)
        for v, name in zip(values, names):
            if v.producer is not None:
                graph.rename(v, name)
