"""Analyses and their cache.

An analysis is any class constructed from a graph: ``Analysis(graph)``. Passes ask the
:class:`AnalysisManager` for one (``am.get(Liveness)``): it is computed on first use and
cached. When a pass changes the graph, the pass manager drops every cached analysis except
those the pass lists in ``preserves``.
"""
from __future__ import annotations

from typing import TypeVar

from ..ir.graph import Graph, Node, Value

A = TypeVar("A")


class AnalysisManager:
    """Lazily computed, cached analyses of one graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._cache: dict[type, object] = {}
        self.computed = 0          # how many analyses were computed (for tests and tuning)

    def get(self, cls: type[A]) -> A:
        """The analysis ``cls`` of the graph, computed now unless cached."""
        try:
            return self._cache[cls]
        except KeyError:
            pass
        result = self._cache[cls] = cls(self.graph)
        self.computed += 1
        return result

    def cached(self, cls: type[A]) -> A | None:
        """The cached analysis ``cls``, or None (never computes)."""
        return self._cache.get(cls)

    def invalidate(self, preserved: tuple[type, ...] = ()) -> None:
        """Drop every cached analysis that is not (a subclass of) one in ``preserved``."""
        self._cache = {k: v for k, v in self._cache.items() if issubclass(k, tuple(preserved))}

    def clear(self) -> None:
        self._cache.clear()


class Liveness:
    """Which nodes and constants contribute to the graph outputs.

    A node is live when it has effects (its op is not ``pure``) or a result feeds a graph
    output or a live node. ``dead_nodes`` are in graph order, ``dead_constants`` in table
    order.
    """

    def __init__(self, graph: Graph):
        live_values: set[int] = {id(v) for v in graph.outputs.values()}
        self.live_nodes: set[Node] = set()
        for node in reversed(graph.nodes):
            if not node.opdef.pure or any(id(v) in live_values for v in node.outputs):
                self.live_nodes.add(node)
                live_values.update(id(v) for v in node.inputs if v is not None)
        self._live_values = live_values
        self.dead_nodes: list[Node] = [n for n in graph.nodes if n not in self.live_nodes]
        self.dead_constants: list[Value] = [v for v in graph.constants.values()
                                            if id(v) not in live_values]

    def is_live(self, item: Node | Value) -> bool:
        if isinstance(item, Node):
            return item in self.live_nodes
        return id(item) in self._live_values


class CostSummary:
    """Totals of the ops' cost model over the graph: MACs, bytes read and written,
    parameters, and node counts per op."""

    def __init__(self, graph: Graph):
        self.nodes = len(graph.nodes)
        self.op_counts = graph.op_counts()
        self.params = graph.num_params()
        self.param_bytes = sum(v.type.nbytes for v in graph.constants.values())
        self.macs = self.bytes_read = self.bytes_written = 0
        self.per_op: dict[str, dict[str, int]] = {}
        for n in graph.nodes:
            cost = n.opdef.cost(n)
            self.macs += cost["macs"]
            self.bytes_read += cost["bytes_read"]
            self.bytes_written += cost["bytes_written"]
            acc = self.per_op.setdefault(n.op, dict.fromkeys(cost, 0))
            for k, v in cost.items():
                acc[k] = acc.get(k, 0) + v
