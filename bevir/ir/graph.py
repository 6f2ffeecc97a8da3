"""Values, nodes and graphs: the core of the IR.

A :class:`Graph` holds inputs, named outputs, constants and nodes in topological order.
Every :class:`Value` knows its producer and its uses, so rewrites are local and cheap.
Mutate through the Graph's methods: they keep use-lists consistent and bump
``graph.version``, which the pass manager uses to tell whether a pass changed anything.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import networkx as nx
import numpy as np

from ..errors import BevirError, VerifyError
from .meta import Meta
from .opdef import get_op
from .types import TensorType


class Value:
    """An SSA value: a graph input, a constant, or a node's result."""

    __slots__ = ("name", "type", "producer", "uses", "const", "meta", "__weakref__")

    def __init__(self, name: str, type: TensorType, producer: Node | None = None,
                 const: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.producer = producer
        self.uses: list[tuple[Node, int]] = []
        if const is not None:
            const = np.asarray(const)
            const.setflags(write=False)   # constants are shared between clones
        self.const = const
        self.meta = Meta()          # annotations (see bevir.ir.meta)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def users(self) -> list[Node]:
        """The distinct nodes that use this value, in use order."""
        return list(dict.fromkeys(n for n, _ in self.uses))

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


def distinct_values(values: Sequence[Value | None]) -> list[Value]:
    """``values`` without None and without repeats (by identity), in order."""
    return list({id(v): v for v in values if v is not None}.values())


class Node:
    """One op application: ``outputs = op(inputs) {attrs}``, remembering where it came from."""

    __slots__ = ("op", "attrs", "inputs", "outputs", "loc", "graph", "meta")

    def __init__(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any],
                 loc: str = ""):
        self.op = op
        self.attrs: dict[str, Any] = dict(attrs)
        self.inputs: list[Value | None] = list(inputs)   # None: an omitted optional operand
        self.outputs: list[Value] = []
        self.loc = loc                                   # provenance: source node / module path
        self.graph: Graph | None = None
        self.meta = Meta()                               # annotations (see bevir.ir.meta)

    @property
    def opdef(self):
        return get_op(self.op)

    @property
    def name(self) -> str:
        """The node's display name: its first result."""
        return "%" + self.outputs[0].name if self.outputs else f"<{self.op}>"

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise BevirError(f"has {len(self.outputs)} results, not 1", node=self.name, op=self.op)
        return self.outputs[0]

    def distinct_inputs(self) -> list[Value]:
        """The distinct values the node reads (an operand used twice once, absent ones
        skipped), in operand order."""
        return distinct_values(self.inputs)

    def tensors(self) -> list[Value]:
        """The distinct values the node reads or writes: its operands, then its results."""
        return distinct_values(list(self.inputs) + self.outputs)

    def set_input(self, index: int, value: Value | None) -> None:
        old = self.inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        self.inputs[index] = value
        if value is not None:
            value.uses.append((self, index))
        if self.graph is not None:
            self.graph.version += 1

    def __repr__(self) -> str:
        ins = ", ".join("_" if v is None else "%" + v.name for v in self.inputs)
        return f"{self.name} = {self.op}({ins})"


class Graph:
    """A dataflow graph in SSA form.

    ``inputs``: graph arguments; ``outputs``: result name -> value; ``constants``: name ->
    constant value; ``nodes``: in topological order; ``meta``: graph-level annotations
    (e.g. the calibrated ranges; see :mod:`bevir.ir.meta`).
    """

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: dict[str, Value] = {}
        self.constants: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.meta = Meta()
        self.version = 0
        self._names: set[str] = set()
        self._counter = itertools.count()

    # ---- names -------------------------------------------------------------------------
    def unique_name(self, hint: str | None = None) -> str:
        """A value name not yet used in this graph, derived from ``hint``."""
        if hint and hint not in self._names:
            return hint
        while True:
            name = f"{hint}_{next(self._counter)}" if hint else str(next(self._counter))
            if name not in self._names:
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise VerifyError(f"value name %{name} defined twice")
        self._names.add(name)
        return name

    def rename(self, value: Value, name: str) -> None:
        self._names.discard(value.name)
        value.name = self._claim(name)
        if value.is_const:
            self.constants = {(name if v is value else k): v for k, v in self.constants.items()}
        self.version += 1

    # ---- building ----------------------------------------------------------------------
    def add_input(self, name: str, type: TensorType) -> Value:
        v = Value(self._claim(self.unique_name(name)), type)
        self.inputs.append(v)
        self.version += 1
        return v

    def add_const(self, array: np.ndarray, name: str | None = None,
                  type: TensorType | None = None) -> Value:
        """Add a constant; its type is the array's unless given (to carry layout or quant)."""
        array = np.asarray(array)
        type = type or TensorType.of(array)
        if not type.matches(array):
            raise VerifyError(f"constant %{name} payload {array.dtype}{list(array.shape)} "
                              f"does not match its type {type}")
        v = Value(self._claim(self.unique_name(name or "c")), type, const=array)
        self.constants[v.name] = v
        self.version += 1
        return v

    def set_output(self, name: str, value: Value) -> None:
        self.outputs[name] = value
        self.version += 1

    def create_node(self, op: str, inputs: Sequence[Value | None],
                    attrs: Mapping[str, Any] | None = None, *,
                    out_types: Sequence[TensorType] | None = None, loc: str = "",
                    names: Sequence[str] | None = None, before: Node | None = None,
                    after: Node | None = None) -> Node:
        """Create a node, validate its attributes, infer its result types and insert it.

        The node is appended unless ``before`` or ``after`` is given.
        """
        opdef = get_op(op)
        attrs = opdef.check_attrs(attrs or {}, where=dict(op=op, loc=loc))
        node = Node(op, inputs, attrs, loc)
        if out_types is None:
            out_types = opdef.infer_node(node)
        names = names or [None] * len(out_types)
        for t, n in zip(out_types, names):
            node.outputs.append(Value(self._claim(self.unique_name(n)), t, producer=node))
        self.insert(node, before=before, after=after)
        return node

    def insert(self, node: Node, *, before: Node | None = None, after: Node | None = None) -> Node:
        """Insert a detached node, registering its uses."""
        if before is not None:
            self.nodes.insert(self.nodes.index(before), node)
        elif after is not None:
            self.nodes.insert(self.nodes.index(after) + 1, node)
        else:
            self.nodes.append(node)
        node.graph = self
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.append((node, i))
        self.version += 1
        return node

    # ---- rewriting ---------------------------------------------------------------------
    def erase(self, node: Node) -> None:
        """Remove a node whose results are unused."""
        for v in node.outputs:
            if v.uses or any(o is v for o in self.outputs.values()):
                raise VerifyError(f"cannot erase: result %{v.name} is still used",
                                  node=node.name, op=node.op, loc=node.loc)
        for i, v in enumerate(node.inputs):
            if v is not None:
                v.uses.remove((node, i))
        self.nodes.remove(node)
        for v in node.outputs:
            self._names.discard(v.name)
        node.graph = None
        self.version += 1

    def erase_const(self, value: Value) -> None:
        if value.uses or any(o is value for o in self.outputs.values()):
            raise VerifyError(f"cannot erase constant %{value.name}: still used")
        del self.constants[value.name]
        self._names.discard(value.name)
        self.version += 1

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every user of ``old`` (graph outputs included) use ``new`` instead.

        ``new`` computes what ``old`` did, so it takes over the meta entries of ``old``
        whose key survives rewrites (those it does not have already)."""
        if old is new:
            return
        old.meta.carry_to(new.meta, rewrite=True)
        for node, i in list(old.uses):
            node.set_input(i, new)
        for k, v in self.outputs.items():
            if v is old:
                self.outputs[k] = new
        self.version += 1

    def replace_node(self, node: Node, new_values: Sequence[Value]) -> None:
        """Redirect the node's results to ``new_values`` and erase it."""
        for old, new in zip(node.outputs, new_values, strict=True):
            self.replace_all_uses(old, new)
        self.erase(node)

    # ---- queries -----------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every value: inputs, constants, then node results in order."""
        yield from self.inputs
        yield from self.constants.values()
        for n in self.nodes:
            yield from n.outputs

    def value(self, name: str) -> Value:
        for v in self.values():
            if v.name == name:
                return v
        raise KeyError(f"no value %{name} in graph @{self.name}")

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def num_params(self) -> int:
        return sum(v.type.numel for v in self.constants.values())

    def to_networkx(self) -> nx.DiGraph:
        """The node dependency graph (node objects as vertices)."""
        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        for n in self.nodes:
            for v in n.inputs:
                if v is not None and v.producer is not None:
                    g.add_edge(v.producer, n)
        return g

    def dominators(self) -> dict[Node, Node | None]:
        """The immediate dominator of each node (None: dominated only by the graph's inputs),
        through networkx on the dependency graph with a virtual entry."""
        g = self.to_networkx()
        entry = object()
        g.add_edges_from((entry, n) for n in self.nodes if g.in_degree(n) == 0)
        idom = nx.immediate_dominators(g, entry) if self.nodes else {}
        return {n: (None if idom[n] is entry else idom[n]) for n in self.nodes}

    def toposort(self) -> None:
        """Reorder ``nodes`` topologically (stable: keeps the current order where it can)."""
        order = {n: i for i, n in enumerate(self.nodes)}
        g = self.to_networkx()
        try:
            self.nodes = list(nx.lexicographical_topological_sort(g, key=order.__getitem__))
        except nx.NetworkXUnfeasible:
            cycle = nx.find_cycle(g)
            raise VerifyError("graph has a cycle through " +
                              " -> ".join(a.name for a, _ in cycle)) from None
        self.version += 1

    def clone(self) -> Graph:
        """A deep copy sharing the (read-only) constant payloads; meta is copied, so
        changing the clone's meta leaves this graph's alone."""
        g = Graph(self.name)
        g.meta = self.meta.copy()
        vmap: dict[int, Value] = {}
        for v in self.inputs:
            vmap[id(v)] = g.add_input(v.name, v.type)
        for v in self.constants.values():
            vmap[id(v)] = g.add_const(v.const, v.name, v.type)
        for v in itertools.chain(self.inputs, self.constants.values()):
            vmap[id(v)].meta = v.meta.copy()
        for n in self.nodes:
            g.insert(copy_node(n, vmap, g))
        for k, v in self.outputs.items():
            g.set_output(k, vmap[id(v)])
        return g

    def __str__(self) -> str:
        from .printer import print_graph
        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, " \
               f"{len(self.constants)} constants, {len(self.outputs)} outputs>"



def copy_node(n: Node, vmap: dict[int, Value], g: Graph, rename: bool = False) -> Node:
    """A detached copy of ``n`` for graph ``g``: operands through ``vmap`` (id of the
    original value -> value of ``g``), results named as the original's (made unique with
    ``rename``) and added to ``vmap``; attributes, provenance and meta are copied."""
    c = Node(n.op, [None if v is None else vmap[id(v)] for v in n.inputs], n.attrs, n.loc)
    c.meta = n.meta.copy()
    for o in n.outputs:
        v = Value(g._claim(g.unique_name(o.name) if rename else o.name), o.type, producer=c)
        v.meta = o.meta.copy()
        vmap[id(o)] = v
        c.outputs.append(v)
    return c
