"""canonicalize: constant folding, no-op removal and chain folding, as rewrite patterns.

The rules are :class:`~bevir.passes.patterns.RewritePattern` s run to a fixpoint by
:func:`~bevir.passes.patterns.apply_patterns`, so they get its statistics (rewrites per
pattern), its explanations (``explain(graph, "fold-reshape-chain", "y")``), its rewrite
budget entries (one per pattern name) and ``enable`` / ``disable`` / ``max_rewrites``.

A rule replaces a node only by a value or a node with exactly the same result types
(layout and quantization included); a new node keeps the replaced node's ``loc`` and its
result names, and what the rewrite made dead is erased. Constant folding goes first on
every node (the highest benefit), then removals, then rewrites into other ops.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BevirError, PassError
from ..ir.graph import Node, Value
from ..ir.limits import fold_bytes
from ..ops import get_op
from .patterns import Match, PatternPass, RewritePattern, Rewriter, op

Replacement = Value | tuple[str, list[Value | None], dict[str, Any]] | str


# ---- constant folding ----------------------------------------------------------------------
class FoldConstants(RewritePattern):
    """A pure node whose operands are all constants becomes constants (through the op's
    reference semantics), at most ``limit`` result elements."""
    name = "fold-constants"
    benefit = 3
    limit: int = 1 << 22

    def match(self, node: Node) -> Match:
        return Match(node, [node], {})

    def check(self, m: Match) -> str | None:
        node = m.root
        if not node.opdef.pure:
            return "the op is not pure"
        if v := next((v for v in node.inputs if v is not None and not v.is_const), None):
            return f"operand %{v.name} is not a constant"
        if (n := sum(v.type.numel for v in node.outputs)) > self.limit:
            return f"{n} result elements are more than the fold limit {self.limit}"
        if (b := sum(v.type.nbytes for v in node.outputs)) > fold_bytes():
            return f"{b} result bytes are more than the folding limit {fold_bytes()}"
        try:
            m.bindings["results"] = _evaluate(node)
        except NotImplementedError:
            return "the op has no reference implementation"
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        outputs = m.root.outputs
        rw.replace(m.root, [rw.const(r, v.name, v.type) for v, r in zip(outputs, m["results"])])


def _evaluate(node: Node) -> list[np.ndarray]:
    """The node's results on its constant operands, checked against its declared types."""
    where = dict(node=node.name, op=node.op, loc=node.loc)
    try:
        results = node.opdef.run(node, [None if v is None else v.const for v in node.inputs])
    except NotImplementedError:
        raise
    except BevirError as e:
        raise PassError(f"constant folding failed: {e.message}", **where) from e
    except Exception as e:
        raise PassError(f"constant folding failed: {type(e).__name__}: {e}", **where) from e
    if len(results) != len(node.outputs) or not all(
            v.type.matches(r) for v, r in zip(node.outputs, results)):
        got = ", ".join(f"{r.dtype}{list(r.shape)}" for r in results)
        raise PassError(f"constant folding computed {got}, declared "
                        + ", ".join(str(v.type) for v in node.outputs), **where)
    return results


# ---- removals and rewrites -------------------------------------------------------------------
class _Simplify(RewritePattern):
    """A one-node rule: :meth:`replacement` names what the root becomes (an existing value,
    or ``(op, inputs, attrs)``), or returns why it stays. A replacement whose types differ
    from the root's results is declined."""

    def replacement(self, n: Node) -> Replacement:
        raise NotImplementedError

    def check(self, m: Match) -> str | None:
        new = self.replacement(m.root)
        if isinstance(new, str):
            return new
        want = [v.type for v in m.root.outputs]
        if isinstance(new, Value):
            types = [new.type]
        else:
            try:
                opdef = get_op(new[0])
                new = (new[0], new[1], opdef.check_attrs(new[2]))
                types = opdef.infer_node(Node(new[0], new[1], new[2], m.root.loc))
            except BevirError as e:
                return f"the replacement {new[0]} is invalid: {e.message}"
        if types != want:
            return f"the replacement has type {', '.join(map(str, types))}, not " \
                   f"{', '.join(map(str, want))}"
        m.bindings["new"], m.bindings["types"] = new, types
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        new = m["new"]
        if not isinstance(new, Value):
            node = rw.create(new[0], new[1], new[2], out_types=m["types"], loc=m.root.loc)
            new = node.outputs
        rw.replace(m.root, new)


class RemoveIdentity(_Simplify):
    """identity(x) is x; so is a reshape, expand or cast whose result type is x's."""
    name = "remove-identity"
    benefit = 2
    pattern = op(("identity", "reshape", "expand", "cast"), ...)

    def replacement(self, n: Node) -> Replacement:
        return "the operand is absent" if n.inputs[0] is None else n.inputs[0]


class RemoveFullSlice(_Simplify):
    """A slice with positive steps that keeps every dimension takes everything."""
    name = "remove-full-slice"
    benefit = 2
    pattern = op("slice", ...)

    def replacement(self, n: Node) -> Replacement:
        found, steps = _const_or_attr(n, "steps", 4)
        if not found:
            return "the steps are not constant"
        if steps is not None and any(s <= 0 for s in steps):
            return "a step is not positive"
        return n.inputs[0]


class RemoveZeroPad(_Simplify):
    """A pad by zeros everywhere."""
    name = "remove-zero-pad"
    benefit = 2
    pattern = op("pad", ...)

    def replacement(self, n: Node) -> Replacement:
        found, pads = _const_or_attr(n, "pads", 1)
        if not found or pads is None:
            return "the pads are not constant"
        return "some padding is not zero" if any(pads) else n.inputs[0]


class RemoveIdentityTranspose(_Simplify):
    """A transpose by the identity permutation."""
    name = "remove-identity-transpose"
    benefit = 2
    pattern = op("transpose", ...)

    def replacement(self, n: Node) -> Replacement:
        perm = _perm(n)
        return n.inputs[0] if perm == tuple(range(len(perm))) else "the permutation moves axes"


class ShapeOpToReshape(_Simplify):
    """squeeze, unsqueeze and flatten are reshapes: canonicalize them to ``reshape``."""
    name = "shape-op-to-reshape"
    pattern = op(("squeeze", "unsqueeze", "flatten"), ...)

    def replacement(self, n: Node) -> Replacement:
        if len(n.outputs) != 1:
            return "the node has several results"
        return "reshape", [n.inputs[0]], {"shape": n.output.type.shape}


class FoldReshapeChain(_Simplify):
    """reshape(reshape(x)) -> reshape(x) (or x, when the shapes match)."""
    name = "fold-reshape-chain"
    pattern = op("reshape", ...)

    def replacement(self, n: Node) -> Replacement:
        inner = _producer(n.inputs[0], "reshape")
        if inner is None:
            return "the operand is not made by a pure reshape"
        x = inner.inputs[0]
        return x if x.type == n.output.type else ("reshape", [x], {"shape": n.output.type.shape})


class FoldTransposeChain(_Simplify):
    """transpose(transpose(x)) is one transpose (or x, when they cancel)."""
    name = "fold-transpose-chain"
    pattern = op("transpose", ...)

    def replacement(self, n: Node) -> Replacement:
        inner = _producer(n.inputs[0], "transpose")
        if inner is None:
            return "the operand is not made by a pure transpose"
        first = _perm(inner)
        composed = tuple(first[i] for i in _perm(n))
        x = inner.inputs[0]
        if composed == tuple(range(len(composed))) and x.type == n.output.type:
            return x
        return "transpose", [x], {"perm": composed}


def _producer(v: Value | None, op: str) -> Node | None:
    """The producer of ``v`` if it is a pure ``op`` node with one result."""
    n = v.producer if v is not None else None
    return n if n is not None and n.op == op and len(n.outputs) == 1 and n.opdef.pure else None


def _perm(node: Node) -> tuple[int, ...]:
    perm = node.attrs.get("perm")
    rank = node.inputs[0].type.rank
    return (tuple(range(rank))[::-1] if perm is None
            else tuple(p % rank if rank else 0 for p in perm))


def _const_or_attr(node: Node, attr: str, index: int):
    """An attribute, or the payload of constant operand ``index``; (found, value)."""
    if node.attrs.get(attr) is not None:
        return True, node.attrs[attr]
    if len(node.inputs) > index and node.inputs[index] is not None:
        v = node.inputs[index]
        return (True, v.const.tolist()) if v.is_const else (False, None)
    return True, None


# ---- the pass ------------------------------------------------------------------------------
class Canonicalize(PatternPass):
    """Fold constants, remove no-ops, canonicalize shape ops, fold reshape and transpose
    chains; to a fixpoint. ``fold_limit``: the largest folded result, in elements."""

    name = "canonicalize"
    description = "fold constants, remove no-ops, fold reshape/transpose chains"
    patterns = (FoldConstants, RemoveIdentity, RemoveFullSlice, RemoveZeroPad,
                RemoveIdentityTranspose, ShapeOpToReshape, FoldReshapeChain, FoldTransposeChain)

    fold_limit: int = 1 << 22

    def active_patterns(self) -> list[RewritePattern]:
        patterns = super().active_patterns()
        for p in patterns:
            if isinstance(p, FoldConstants):
                p.limit = self.fold_limit
        return patterns
