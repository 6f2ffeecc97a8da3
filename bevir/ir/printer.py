"""The text format's printer. See docs/ir.md for the grammar; parser.py reads it back."""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from .types import TensorType

if TYPE_CHECKING:       # Graph.__str__ prints through this module
    from .graph import Graph, Node, Value

_BARE = re.compile(r"^[A-Za-z0-9_.$-]+$")
#: constants with at most this many elements print as a literal list when exact
LITERAL_LIMIT = 16


def fmt_name(name: str) -> str:
    return name if _BARE.match(name) else json.dumps(name)


def fmt_value(v: Value | None) -> str:
    return "_" if v is None else "%" + fmt_name(v.name)


def fmt_float(x: float) -> str:
    return repr(float(x))


def fmt_dense(a: np.ndarray) -> str:
    """``dense<literal>`` when small and exact, else ``dense<"0x..">`` (little-endian bytes)."""
    if a.size <= LITERAL_LIMIT:
        flat = a.reshape(-1)
        if a.dtype == np.bool_:
            items = ["true" if x else "false" for x in flat]
        elif a.dtype.kind in "iu":
            items = [str(int(x)) for x in flat]
        else:
            items = [str(x) for x in flat]   # numpy's shortest repr for the dtype
            if not all(np.array(s, np.float64).astype(a.dtype) == x or np.isnan(x)
                       for s, x in zip(items, flat)):
                items = None
        if items is not None:
            return "dense<" + (items[0] if a.ndim == 0 else "[" + ", ".join(items) + "]") + ">"
    little = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"))
    return 'dense<"0x' + little.tobytes().hex().upper() + '">'


def fmt_attr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return fmt_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, np.ndarray):
        return f"{fmt_dense(v)} : {TensorType.of(v)}"
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(fmt_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")


def fmt_attrs(node: Node) -> str:
    schema = node.opdef.attrs
    items = []
    for k, v in node.attrs.items():
        s = schema.get(k)
        if v is None or (s is not None and not s.required and _same(v, s.default)):
            continue    # defaults are implied
        items.append(f"{k} = {fmt_attr(v)}")
    return " {" + ", ".join(items) + "}" if items else ""


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return type(a) is type(b) and a == b


def fmt_node(node: Node) -> str:
    outs = ", ".join(fmt_value(v) for v in node.outputs)
    ins = ", ".join(fmt_value(v) for v in node.inputs)
    types = ", ".join(str(v.type) for v in node.outputs)
    loc = f" loc({json.dumps(node.loc)})" if node.loc else ""
    return f"{outs} = {node.op}({ins}){fmt_attrs(node)} : {types}{loc}"


def print_graph(graph: Graph, constants: str = "inline") -> str:
    """The graph as text.

    ``constants``: ``"inline"`` prints every payload (the text alone round-trips),
    ``"elide"`` prints ``dense<...>`` for large ones (for reading), ``"external"`` prints
    ``external`` (the payloads live in a safetensors file beside the text).
    """
    args = ", ".join(f"{fmt_value(v)}: {v.type}" for v in graph.inputs)
    lines = [f"graph @{fmt_name(graph.name)}({args}) {{"]
    for v in graph.constants.values():
        if constants == "external":
            payload = "external"
        elif constants == "elide" and v.const.size > LITERAL_LIMIT:
            payload = "dense<...>"
        else:
            payload = fmt_dense(v.const)
        lines.append(f"  {fmt_value(v)} = const {payload} : {v.type}")
    lines += ["  " + fmt_node(n) for n in graph.nodes]
    rets = [fmt_value(v) + ("" if name == v.name else f" as {json.dumps(name)}")
            for name, v in graph.outputs.items()]
    lines.append("  return " + ", ".join(rets))
    lines.append("}")
    return "\n".join(lines) + "\n"

