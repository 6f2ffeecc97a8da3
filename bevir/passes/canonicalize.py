"""canonicalize: constant folding, no-op removal and chain folding, to a fixpoint.

Per-op rewrites are plain functions registered with :func:`canonicalization`; each gets
the pass (for its helpers and statistics), the graph and a node, and returns True when it
rewrote the node. A rewrite replaces a node only by one with exactly the same result
types (layout and quantization included), keeps the replaced node's ``loc`` and its
result name, and erases what it made dead.

Every fold and every rewrite asks the rewrite budget (:mod:`bevir.passes.rewrites`) first,
as ``canonicalize:fold`` or ``canonicalize:<rewrite function name>``: the helpers
:meth:`Canonicalize.forward` and :meth:`Canonicalize.replace_with` do it; a rewrite that
mutates the graph itself calls :meth:`Canonicalize.permitted` first. A refusal ends the pass.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BevirError, PassError
from ..ir.graph import Graph, Node, Value
from ..ir.limits import fold_bytes
from ..ops import get_op
from .analysis import AnalysisManager
from .core import Pass
from .rewrites import rewrite_permitted

Rewrite = Callable[["Canonicalize", Graph, Node], bool]
_REWRITES: dict[str, list[Rewrite]] = {}


def canonicalization(*ops: str) -> Callable[[Rewrite], Rewrite]:
    """Register a rewrite of nodes of ``ops`` for the canonicalize pass."""
    def register(fn: Rewrite) -> Rewrite:
        for op in ops:
            _REWRITES.setdefault(op, []).append(fn)
        return fn
    return register


class Canonicalize(Pass):
    """Fold constants, remove no-ops, canonicalize shape ops, fold reshape and transpose
    chains; repeat until nothing changes (at most ``max_iterations`` sweeps)."""

    name = "canonicalize"
    description = "fold constants, remove no-ops, fold reshape/transpose chains"

    fold_limit: int = 1 << 22     # largest folded result, in elements (and bevir.limits' bytes)
    max_iterations: int = 10

    _rewrite = "canonicalize"     # what the budget is told (not an option)
    _refused = False

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        self._refused = False
        for _ in range(self.max_iterations):
            changed = False
            for node in list(graph.nodes):
                if node.graph is not graph:        # erased earlier in this sweep
                    continue
                if self.fold(graph, node) or self._apply_rewrites(graph, node):
                    changed = True
                if self._refused:
                    return
            if not changed:
                return

    def _apply_rewrites(self, graph: Graph, node: Node) -> bool:
        """Apply the first registered rewrite of ``node``'s op that fires."""
        for rewrite in _REWRITES.get(node.op, ()):
            if self._refused:
                return False
            self._rewrite = "canonicalize:" + rewrite.__name__.lstrip("_")
            if rewrite(self, graph, node):
                return True
        return False

    def permitted(self, node: Node, what: str | None = None) -> bool:
        """Ask the rewrite budget before rewriting ``node`` (as ``what``, default the running
        rewrite); a refusal stops the pass after the current node."""
        if rewrite_permitted(what or self._rewrite, node):
            return True
        self._refused = True
        return False

    # ---- constant folding --------------------------------------------------------------
    def fold(self, graph: Graph, node: Node) -> bool:
        """Replace a pure node whose operands are all constants by constants."""
        opdef = node.opdef
        if not opdef.pure or any(v is not None and not v.is_const for v in node.inputs):
            return False
        if sum(v.type.numel for v in node.outputs) > self.fold_limit \
                or sum(v.type.nbytes for v in node.outputs) > fold_bytes():
            return False
        where = dict(node=node.name, op=node.op, loc=node.loc)
        try:
            results = opdef.run(node, [None if v is None else v.const for v in node.inputs])
        except NotImplementedError:
            return False
        except BevirError as e:
            raise PassError(f"constant folding failed: {e.message}", **where) from e
        except Exception as e:
            raise PassError(f"constant folding failed: {type(e).__name__}: {e}", **where) from e
        if len(results) != len(node.outputs) or not all(
                v.type.matches(r) for v, r in zip(node.outputs, results)):
            got = ", ".join(f"{r.dtype}{list(r.shape)}" for r in results)
            raise PassError(f"constant folding computed {got}, declared "
                            + ", ".join(str(v.type) for v in node.outputs), **where)
        if not self.permitted(node, "canonicalize:fold"):
            return False
        names = [v.name for v in node.outputs]
        consts = [graph.add_const(r if r.flags.c_contiguous else np.ascontiguousarray(r),
                                  graph.unique_name(v.name), v.type)
                  for v, r in zip(node.outputs, results)]
        self._replace(graph, node, consts, names)
        self.stat("folded")
        return True

    # ---- helpers for rewrites ----------------------------------------------------------
    def forward(self, graph: Graph, node: Node, value: Value) -> bool:
        """Remove a one-result node whose result equals ``value`` (same type required)."""
        if value.type != node.output.type or not self.permitted(node):
            return False
        self._replace(graph, node, [value], None)
        self.stat("removed")
        return True

    def replace_with(self, graph: Graph, node: Node, op: str, inputs: Sequence[Value | None],
                     attrs: dict[str, Any]) -> bool:
        """Replace ``node`` by ``op(inputs){attrs}`` if that is valid and has exactly the
        node's result types; the new node keeps the node's loc and result names."""
        try:
            opdef = get_op(op)
            attrs = opdef.check_attrs(attrs)
            types = opdef.infer_node(Node(op, inputs, attrs, node.loc))
        except BevirError:
            return False
        if types != [v.type for v in node.outputs] or not self.permitted(node):
            return False
        names = [v.name for v in node.outputs]
        new = graph.create_node(op, inputs, attrs, out_types=types, loc=node.loc, before=node)
        self._replace(graph, node, new.outputs, names)
        self.stat("rewritten")
        return True

    def _replace(self, graph: Graph, node: Node, values: Sequence[Value],
                 names: Sequence[str] | None) -> None:
        operands = [v for v in node.inputs if v is not None]
        graph.replace_node(node, values)
        if names is not None:
            for v, name in zip(values, names):
                graph.rename(v, name)
        self._erase_dead(graph, operands)

    def _erase_dead(self, graph: Graph, values: list[Value]) -> None:
        """Erase the pure producers (and constants) of ``values`` that became unused."""
        outputs = {id(v) for v in graph.outputs.values()}
        work = list(values)
        while work:
            v = work.pop()
            if v.uses or id(v) in outputs:
                continue
            if v.is_const:
                if graph.constants.get(v.name) is v:
                    graph.erase_const(v)
                    self.stat("removed")
                continue
            n = v.producer
            if (n is None or n.graph is not graph or not n.opdef.pure
                    or any(o.uses or id(o) in outputs for o in n.outputs)):
                continue
            work += [i for i in n.inputs if i is not None]
            graph.erase(n)
            self.stat("removed")


# ---- rewrites ----------------------------------------------------------------------------
def _producer(v: Value | None, op: str) -> Node | None:
    """The producer of ``v`` if it is a pure ``op`` node with one result."""
    n = v.producer if v is not None else None
    return n if n is not None and n.op == op and len(n.outputs) == 1 and n.opdef.pure else None


def _perm(node: Node) -> tuple[int, ...]:
    perm = node.attrs.get("perm")
    rank = node.inputs[0].type.rank
    return tuple(range(rank))[::-1] if perm is None else tuple(p % rank if rank else 0 for p in perm)


def _const_or_attr(node: Node, attr: str, index: int):
    """An attribute, or the payload of constant operand ``index``; (found, value)."""
    if node.attrs.get(attr) is not None:
        return True, node.attrs[attr]
    if len(node.inputs) > index and node.inputs[index] is not None:
        v = node.inputs[index]
        return (True, v.const.tolist()) if v.is_const else (False, None)
    return True, None


@canonicalization("identity")
def _identity(p: Canonicalize, g: Graph, n: Node) -> bool:
    return p.forward(g, n, n.inputs[0])


@canonicalization("reshape", "expand", "cast")
def _same_type(p: Canonicalize, g: Graph, n: Node) -> bool:
    """A reshape, expand or cast whose result type is its operand's type does nothing."""
    return n.inputs[0] is not None and p.forward(g, n, n.inputs[0])


@canonicalization("slice")
def _full_slice(p: Canonicalize, g: Graph, n: Node) -> bool:
    """A slice with positive steps that keeps every dimension takes everything."""
    found, steps = _const_or_attr(n, "steps", 4)
    if not found or (steps is not None and any(s <= 0 for s in steps)):
        return False
    return p.forward(g, n, n.inputs[0])


@canonicalization("pad")
def _zero_pad(p: Canonicalize, g: Graph, n: Node) -> bool:
    found, pads = _const_or_attr(n, "pads", 1)
    if not found or pads is None or any(pads):
        return False
    return p.forward(g, n, n.inputs[0])


@canonicalization("squeeze", "unsqueeze", "flatten")
def _to_reshape(p: Canonicalize, g: Graph, n: Node) -> bool:
    """squeeze, unsqueeze and flatten are reshapes: canonicalize them to ``reshape``."""
    if len(n.outputs) != 1:
        return False
    return p.replace_with(g, n, "reshape", [n.inputs[0]], {"shape": n.output.type.shape})


@canonicalization("reshape")
def _reshape_chain(p: Canonicalize, g: Graph, n: Node) -> bool:
    """reshape(reshape(x)) -> reshape(x) (or x, when the shapes match)."""
    inner = _producer(n.inputs[0], "reshape")
    if inner is None:
        return False
    x = inner.inputs[0]
    if x.type == n.output.type:
        return p.forward(g, n, x)
    return p.replace_with(g, n, "reshape", [x], {"shape": n.output.type.shape})


@canonicalization("transpose")
def _transpose(p: Canonicalize, g: Graph, n: Node) -> bool:
    """An identity transpose does nothing; transpose(transpose(x)) is one transpose."""
    perm = _perm(n)
    if perm == tuple(range(len(perm))) and p.forward(g, n, n.inputs[0]):
        return True
    inner = _producer(n.inputs[0], "transpose")
    if inner is None:
        return False
    first = _perm(inner)
    composed = tuple(first[i] for i in perm)
    x = inner.inputs[0]
    if composed == tuple(range(len(composed))) and x.type == n.output.type:
        return p.forward(g, n, x)
    return p.replace_with(g, n, "transpose", [x], {"perm": composed})
