"""A Builder for writing graphs in Python: every registered op is a method.

    b = Builder("net")
    x = b.input("x", TensorType((1, 3, 32, 32)))
    w = b.const(np.ones((8, 3, 3, 3), np.float32), "w")
    y = b.relu(b.conv2d(x, w, pads=(1, 1, 1, 1), loc="conv1"))
    b.output("y", y)
    graph = b.graph
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from .graph import Graph, Node, Value
from .opdef import get_op
from .types import TensorType


class Builder:
    """Creates nodes in ``graph`` (a new one when given a name), appending them or
    inserting them before ``before``. ``loc`` is the provenance given to new nodes."""

    def __init__(self, graph: Graph | str = "main", *, before: Node | None = None, loc: str = ""):
        self.graph = Graph(graph) if isinstance(graph, str) else graph
        self.before = before
        self.default_loc = loc

    def input(self, name: str, type: TensorType) -> Value:
        return self.graph.add_input(name, type)

    def const(self, array, name: str | None = None, type: TensorType | None = None) -> Value:
        return self.graph.add_const(np.asarray(array), name, type)

    def output(self, name: str, value: Value) -> None:
        self.graph.set_output(name, value)

    @contextlib.contextmanager
    def loc(self, loc: str) -> Iterator[Builder]:
        """Give ``loc`` as provenance to the nodes created inside the block."""
        saved, self.default_loc = self.default_loc, loc
        try:
            yield self
        finally:
            self.default_loc = saved

    def op(self, op: str, *inputs: Value | None, loc: str | None = None,
           name: str | list[str] | None = None, **attrs) -> Value | tuple[Value, ...]:
        """Create an ``op`` node; returns its result, or a tuple of results."""
        names = [name] if isinstance(name, str) else name
        node = self.graph.create_node(op, inputs, attrs,
                                      loc=self.default_loc if loc is None else loc,
                                      names=names, before=self.before)
        return node.outputs[0] if len(node.outputs) == 1 else tuple(node.outputs)

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        get_op(op)     # unknown op names fail here, not at call time

        def build(*inputs, **attrs):
            return self.op(op, *inputs, **attrs)
        build.__name__ = op
        return build
