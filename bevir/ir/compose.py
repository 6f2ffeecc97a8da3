"""Composing graphs: feed outputs of one graph into inputs of another, as one graph."""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import VerifyError
from .graph import Graph, Value, copy_node
from .meta import Meta, copy_entry, meta_key


def compose(first: Graph, second: Graph, connect: Mapping[str, str], *,
            keep_outputs: bool = False, name: str | None = None) -> Graph:
    """One graph computing ``second`` on (some of) the outputs of ``first``.

    ``connect`` maps input names of ``second`` to output names of ``first``. The result's
    inputs are ``first``'s inputs followed by ``second``'s unconnected inputs (an input of
    the same name and type in both becomes one input); its outputs are ``second``'s, plus
    ``first``'s when ``keep_outputs``. Value names of ``second`` that clash get a suffix;
    constants, attributes, provenance and meta are kept (see :func:`merge_graph_meta`
    for the graphs' own meta). Neither graph is modified.
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
        v.meta.carry_to(vmap[id(v)].meta)       # a joined input keeps first's entries
    for v in second.constants.values():
        vmap[id(v)] = g.add_const(v.const, g.unique_name(v.name), v.type)
        vmap[id(v)].meta = v.meta.copy()
    for n in second.nodes:
        g.insert(copy_node(n, vmap, g, rename=True))
    names = {v.name: vmap[id(v)].name for v in second.values()}
    g.meta = merge_graph_meta(g.meta, second.meta, names, where=f"@{g.name}")
    outputs = dict(g.outputs) if keep_outputs else {}
    g.outputs = {}
    for k, v in second.outputs.items():
        if k in outputs:
            raise VerifyError(f"compose: output '{k}' exists in both graphs")
        outputs[k] = vmap[id(v)]
    for k, v in outputs.items():
        g.set_output(k, v)
    return g


def merge_graph_meta(first: Meta, second: Meta, names: dict[str, str], where: str) -> Meta:
    """The composed graph's meta: ``first``'s entries, then ``second``'s. A key declared
    with ``merge`` combines both (``names``: second's value names -> composed names);
    another key in both must hold equal values, else VerifyError naming it."""
    out = first.copy()
    for k, v in second.items():
        key = meta_key(k)
        if key is not None and key.merge is not None:
            out[k] = key.merge(out.get(k), v, names)
        elif k not in out:
            out[k] = copy_entry(k, v)
        elif not _equal(out[k], v):
            raise VerifyError(f"compose {where}: both graphs hold meta '{k}' and they differ; "
                              "register the key with a merge function to combine them")
    return out


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except ValueError:          # numpy arrays compare elementwise
        return False
