"""Composing graphs: feed outputs of one graph into inputs of another, as one graph."""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import VerifyError
from .graph import Graph, Node, Value


def compose(first: Graph, second: Graph, connect: Mapping[str, str], *,
            keep_outputs: bool = False, name: str | None = None) -> Graph:
    """One graph computing ``second`` on (some of) the outputs of ``first``.

    ``connect`` maps input names of ``second`` to output names of ``first``. The result's
    inputs are ``first``'s inputs followed by ``second``'s unconnected inputs (an input of
    the same name and type in both becomes one input); its outputs are ``second``'s, plus
    ``first``'s when ``keep_outputs``. Value names of ``second`` that clash get a suffix;
    constants, attributes and provenance are kept. Neither graph is modified.
    """
    for k, v in connect.items():
        if k not in {i.name for i in second.inputs}:
            raise VerifyError(f"compose: @{second.name} has no input %{k}")
        if v not in first.outputs:
            raise VerifyError(f"compose: @{first.name} has no output '{v}'")
        a, b = first.outputs[v].type, next(i for i in second.inputs if i.name == k).type
        if a != b:
            raise VerifyError(f"compose: output '{v}' is {a} but input %{k} expects {b}")
    g = first.clone()
    g.name = name or f"{first.name}+{second.name}"
    shared = {v.name: v for v in g.inputs}
    vmap: dict[int, Value] = {}
    for v in second.inputs:
        if v.name in connect:
            vmap[id(v)] = g.outputs[connect[v.name]]
        elif v.name in shared and shared[v.name].type == v.type:
            vmap[id(v)] = shared[v.name]
        else:
            vmap[id(v)] = g.add_input(g.unique_name(v.name), v.type)
    for v in second.constants.values():
        vmap[id(v)] = g.add_const(v.const, g.unique_name(v.name), v.type)
    for n in second.nodes:
        node = Node(n.op, [None if v is None else vmap[id(v)] for v in n.inputs], n.attrs, n.loc)
        for o in n.outputs:
            vmap[id(o)] = Value(g._claim(g.unique_name(o.name)), o.type, producer=node)
            node.outputs.append(vmap[id(o)])
        g.insert(node)
    outputs = dict(g.outputs) if keep_outputs else {}
    g.outputs = {}
    for k, v in second.outputs.items():
        if k in outputs:
            raise VerifyError(f"compose: output '{k}' exists in both graphs")
        outputs[k] = vmap[id(v)]
    for k, v in outputs.items():
        g.set_output(k, v)
    return g
