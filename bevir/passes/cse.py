"""cse: merge pure nodes that compute the same thing, and identical constants."""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ..ir.graph import Graph, Node, Value
from .analysis import AnalysisManager
from .core import Pass
from .rewrites import rewrite_permitted


def attr_key(v: Any) -> Any:
    """A hashable key of an attribute value; numpy arrays compare by dtype, shape and bytes."""
    if isinstance(v, np.ndarray):
        return ("tensor", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, (list, tuple)):
        return ("seq",) + tuple(attr_key(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    return (type(v).__name__, v)       # 1, 1.0 and True stay distinct


def node_key(node: Node) -> tuple:
    """Two pure nodes with equal keys compute the same results."""
    return (node.op,
            tuple(None if v is None else id(v) for v in node.inputs),
            tuple(sorted((k, attr_key(v)) for k, v in node.attrs.items())),
            tuple(v.type for v in node.outputs))


class CSE(Pass):
    """Common subexpression elimination: a pure node with the same op, equal attributes,
    the same operands and result types as an earlier one is replaced by it; constants with
    the same type and bytes are merged into the first. Each merge asks the rewrite budget
    (``cse:merge-constant``, ``cse:merge``); a refusal ends the pass."""

    name = "cse"
    description = "merge identical pure nodes and identical constants"

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if not self._constants(graph):
            return
        seen: dict[tuple, Node] = {}
        for node in list(graph.nodes):
            if not node.opdef.pure:
                continue
            key = node_key(node)
            first = seen.setdefault(key, node)
            if first is not node:
                if not rewrite_permitted("cse:merge", node):
                    return
                graph.replace_node(node, first.outputs)
                self.stat("merged")

    def _constants(self, graph: Graph) -> bool:
        """Merge identical constants; False if the rewrite budget stopped it."""
        seen: dict[tuple, list[Value]] = {}
        for v in list(graph.constants.values()):
            data = _bytes(v.const)
            key = (v.type, hashlib.blake2b(data, digest_size=16).digest())
            group = seen.setdefault(key, [])
            same = next((c for c in group if np.array_equal(_bytes(c.const), data)), None)
            if same is None:
                group.append(v)
                continue
            if not rewrite_permitted("cse:merge-constant", v):
                return False
            graph.replace_all_uses(v, same)
            graph.erase_const(v)
            self.stat("merged")
        return True


def _bytes(a: np.ndarray) -> np.ndarray:
    """The payload's bytes as a flat uint8 array (bitwise: -0.0 differs from 0.0, NaNs
    compare by payload)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
