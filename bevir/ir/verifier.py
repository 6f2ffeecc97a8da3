"""The verifier: every IR invariant, checked; the first violation raises VerifyError."""
from __future__ import annotations

import networkx as nx
import numpy as np

from ..errors import BevirError, VerifyError
from .graph import Graph, Node
from .types import AffineQuant, Layout, TensorType


def check_type(t: TensorType) -> None:
    """Layout and quantization consistency of one type (raises VerifyError)."""
    if t.layout is not Layout.plain and t.rank != 4:
        raise VerifyError(f"layout {t.layout} needs rank 4, {t} has rank {t.rank}")
    if any(d < 0 for d in t.shape):
        raise VerifyError(f"negative dimension in {t}")
    q = t.quant
    if q is None:
        return
    if not t.dtype.is_int:
        raise VerifyError(f"quantized type {t} must have an integer element type")
    if q.axis is None:
        if q.channels != 1:
            raise VerifyError(f"per-tensor quantization of {t} has {q.channels} parameters")
    else:
        if not 0 <= q.axis < t.rank:
            raise VerifyError(f"quantization axis {q.axis} out of range for {t}")
        if q.channels != t.shape[q.axis]:
            raise VerifyError(f"{q.channels} quantization parameters for {t.shape[q.axis]} "
                              f"channels on axis {q.axis} of {t}")
    if isinstance(q, AffineQuant):
        if len(q.zero_point) != len(q.scale):
            raise VerifyError(f"{t}: {len(q.scale)} scales but {len(q.zero_point)} zero points")
        info = np.iinfo(t.dtype.np)
        if any(not info.min <= z <= info.max for z in q.zero_point):
            raise VerifyError(f"{t}: zero point outside the {t.dtype} range")
        if any(not (s > 0 and np.isfinite(s)) for s in q.scale):
            raise VerifyError(f"{t}: scales must be positive and finite")


def _fail(node: Node, message: str) -> VerifyError:
    return VerifyError(message, node=node.name, op=node.op, loc=node.loc)


def verify(graph: Graph) -> None:
    """Check SSA form, def-before-use, acyclicity, op arity and attributes, declared vs
    inferred types, layout/quantization consistency, constants and use-lists."""
    names: set[str] = set()
    defined: set[int] = set()

    def define(v, where: str) -> None:
        if v.name in names:
            raise VerifyError(f"value %{v.name} defined twice ({where})")
        names.add(v.name)
        defined.add(id(v))
        try:
            check_type(v.type)
        except VerifyError as e:
            raise VerifyError(f"%{v.name}: {e.message}") from None

    for v in graph.inputs:
        if v.producer is not None or v.is_const:
            raise VerifyError(f"graph input %{v.name} has a producer or a payload")
        define(v, "graph input")
    for key, v in graph.constants.items():
        if key != v.name or not v.is_const:
            raise VerifyError(f"constant table entry '{key}' is not constant %{key}")
        if not v.type.matches(v.const):
            raise VerifyError(f"constant %{v.name} payload {v.const.dtype}{list(v.const.shape)} "
                              f"does not match its type {v.type}")
        define(v, "constant")

    for node in graph.nodes:
        _verify_node(graph, node, defined)
        for v in node.outputs:
            if v.producer is not node:
                raise _fail(node, f"result %{v.name} does not name this node as its producer")
            try:
                define(v, "node result")
            except VerifyError as e:
                raise _fail(node, e.message) from None

    for name, v in graph.outputs.items():
        if id(v) not in defined:
            raise VerifyError(f"graph output '{name}' (%{v.name}) is not defined in the graph")
    _verify_uses(graph)


def _verify_node(graph: Graph, node: Node, defined: set[int]) -> None:
    if node.graph is not graph:
        raise _fail(node, "node does not belong to this graph")
    try:
        opdef = node.opdef
        opdef.check_arity(len(node.inputs))
        opdef.check_attrs(node.attrs)
    except BevirError as e:
        raise _fail(node, e.message) from None
    for i, v in enumerate(node.inputs):
        if v is None:
            if not opdef.operands or not _optional(opdef.operands, i):
                raise _fail(node, f"operand {i} is required but omitted")
            continue
        if id(v) not in defined:
            if v.producer is not None and v.producer.graph is graph:
                raise _cycle_or_order(graph, node, v)
            raise _fail(node, f"operand %{v.name} is not defined in this graph")
    try:
        inferred = opdef.infer_node(node)
    except BevirError as e:
        raise _fail(node, e.message) from None
    declared = [v.type for v in node.outputs]
    if inferred != declared:
        raise _fail(node, "declared result types " + ", ".join(map(str, declared)) +
                    " differ from inferred " + ", ".join(map(str, inferred)))


def _optional(operands: tuple[str, ...], i: int) -> bool:
    spec = operands[min(i, len(operands) - 1)]
    return spec.endswith("?")


def _cycle_or_order(graph: Graph, node: Node, v) -> VerifyError:
    g = graph.to_networkx()
    try:
        cycle = nx.find_cycle(g)
        path = " -> ".join(a.name for a, _ in cycle)
        return _fail(node, f"graph has a cycle: {path}")
    except nx.NetworkXNoCycle:
        return _fail(node, f"operand %{v.name} is used before it is defined "
                           "(nodes are not in topological order)")


def _verify_uses(graph: Graph) -> None:
    expected: dict[int, list] = {}
    for n in graph.nodes:
        for i, v in enumerate(n.inputs):
            if v is not None:
                expected.setdefault(id(v), []).append((id(n), i))
    for v in graph.values():
        got = sorted((id(n), i) for n, i in v.uses)
        if got != sorted(expected.get(id(v), [])):
            raise VerifyError(f"use-list of %{v.name} is inconsistent with the nodes using it")
