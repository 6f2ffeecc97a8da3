"""to-nhwc: run the convolutional region of a graph in NHWC, with layout changes only at
its boundaries.

Two phases:

1. **Region assignment** (a plain propagation). Nodes that compute in NHWC themselves
   (conv2d, conv2d_act, qlinear_conv, conv_integer, the pools, batch_norm, the global
   average pools) seed regions; a region grows through the 4-D values it reads and writes
   into every producer and consumer that can work in NHWC: elementwise ops (constant
   operands such as a ``[1,C,1,1]`` bias are permuted to ``[1,1,1,C]``), the quantization
   ops (a per-channel axis 1 becomes 3), concat, split, slice, pad and resize (axes
   remapped). A 4-D value tagged ``nchw``, or ``plain`` (read as NCHW, as conv2d reads it),
   in a region becomes ``nhwc`` with the permuted shape. ``layout_transform`` ops are
   inserted only where a region meets the rest of the graph: after a value it reads from
   outside (a graph input keeps its declared type: one transform follows it), and before
   each outside consumer of a value it writes; graph outputs keep their declared types
   unless ``convert_outputs``.

2. **Sinking and cancelling** (patterns, with statistics per pattern):
   ``cancel-layout-transforms`` (a pair of transforms is one transform, or nothing),
   ``fold-transpose-layout-transform`` (a transpose next to a transform is one transpose,
   a reshape when it only moves unit dimensions, or nothing), and
   ``absorb-layout-transform-into-reshape`` (a chain of reshapes and transposes over a
   transform becomes at most one transpose: the BEVFormer bridge ``[6,C,h,w] -> reshape
   [6,C,hw] -> transpose [6,hw,C]`` reads NHWC memory in order, so it becomes one reshape).

Layout changes are exact data movement: the pass preserves the golden model's results bit
for bit (``tolerance = 0.0``). Ops whose golden numerics would depend on the layout are not
converted (a qlinear_add whose onnxruntime kernel variant would change).

Statistics: ``inserted`` (transforms placed at region boundaries), ``cancelled`` (transforms
the patterns removed), ``converted`` (nodes moved to NHWC), ``layout_transforms_before`` /
``_after`` (:func:`count_layout_transforms`), ``transposes_before`` / ``_after``
(:func:`count_transposes`), and one counter per applied pattern.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import Layout, TensorType
from ..ir.opdef import Ctx, LayoutRule
from ..ops import get_op
from ..ops.layout_rules import NCHW_TO_NHWC, NHWC_TO_NCHW, converted, layout_perm, nhwc_type
from .analysis import AnalysisManager
from .patterns import Match, NoMatch, PatternPass, RewritePattern, Rewriter, match_pattern, op
from .rewrites import rewrite_permitted

RESHAPES = ("reshape", "flatten", "squeeze", "unsqueeze")
_FROM_NCHW = (Layout.plain, Layout.nchw)


# ---- counting ----------------------------------------------------------------------------
def is_layout_transform(node: Node) -> bool:
    """A ``layout_transform`` op, or a ``transpose`` of a 4-D tensor by exactly the NCHW ->
    NHWC permutation ``[0, 2, 3, 1]`` or its inverse ``[0, 3, 1, 2]``."""
    if node.op == "layout_transform":
        return True
    return (node.op == "transpose" and node.inputs[0].type.rank == 4
            and tuple(node.attrs["perm"]) in (NCHW_TO_NHWC, NHWC_TO_NCHW))


def count_layout_transforms(graph: Graph) -> int:
    """How many layout transforms ``graph`` has: its ``layout_transform`` ops plus its
    transposes that only permute NCHW <-> NHWC (see :func:`is_layout_transform`)."""
    return sum(1 for n in graph.nodes if is_layout_transform(n))


def moves_data(perm: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether transposing ``shape`` by ``perm`` moves data: it reorders non-unit axes."""
    kept = [p for p in perm if shape[p] != 1]
    return kept != sorted(kept)


def _perm_of(node: Node) -> tuple[int, ...]:
    """The permutation a transpose or layout_transform applies to its operand."""
    if node.op == "layout_transform":
        return layout_perm(node.inputs[0].type.layout, Layout(node.attrs["to"]))
    return tuple(node.attrs["perm"])


def count_transposes(graph: Graph) -> int:
    """How many nodes permute data: transposes and layout transforms whose permutation
    reorders non-unit axes (a retag such as plain -> nchw, or a transpose that only moves
    size-1 axes, moves nothing)."""
    return sum(1 for n in graph.nodes if n.op in ("transpose", "layout_transform")
               and moves_data(_perm_of(n), n.inputs[0].type.shape))


# ---- what each op does in NHWC: its ``nhwc`` interface -------------------------------------
def _rule(node: Node) -> LayoutRule | None:
    return node.opdef.nhwc


def _is_region_value(v: Value | None) -> bool:
    """A non-constant 4-D value that reads as NCHW."""
    return v is not None and not v.is_const and v.type.rank == 4 and v.type.layout in _FROM_NCHW


def layout_operands(node: Node) -> list[int]:
    """The operand indices of ``node`` that move to NHWC with it."""
    rule = _rule(node)
    if rule.data is not None:
        return [i for i in rule.data if i < len(node.inputs) and node.inputs[i] is not None]
    return [i for i, v in enumerate(node.inputs) if converted(v)]


def why_not_nhwc(node: Node) -> str | None:
    """Why ``node`` cannot run in NHWC, or None when it can."""
    rule = _rule(node)
    if rule is None:
        return f"op '{node.op}' has no NHWC form here (it declares no nhwc rule)"
    if any(v.type.rank != 4 or v.type.layout not in _FROM_NCHW for v in node.outputs):
        return "its results are not 4-D NCHW tensors"
    for i in layout_operands(node):
        v = node.inputs[i]
        if not (_is_region_value(v) or (v.is_const and v.type.rank <= 4)):
            return f"operand %{v.name} ({v.type}) is not a 4-D NCHW tensor"
    if rule.data is None and any(v is not None and not converted(v) and v.type.numel != 1
                                 for v in node.inputs):
        return "an operand of lower rank would broadcast differently"
    return rule.check(node) if rule.check else None


# ---- region assignment ---------------------------------------------------------------------
def find_regions(graph: Graph) -> list[list[Node]]:
    """The NHWC regions of ``graph``: connected sets of nodes that can run in NHWC, each
    holding at least one node that computes in NHWC itself; nodes in graph order."""
    ok = {n for n in graph.nodes if why_not_nhwc(n) is None}
    order = {n: i for i, n in enumerate(graph.nodes)}
    seen: set[Node] = set()
    regions = []
    for seed in graph.nodes:
        if seed in ok and seed not in seen and _rule(seed).native:
            region = _grow(seed, ok)
            seen |= region
            regions.append(sorted(region, key=order.__getitem__))
    return regions


def _grow(seed: Node, ok: set[Node]) -> set[Node]:
    region, work = {seed}, [seed]
    while work:
        node = work.pop()
        for v in _region_values(node):
            for n in _neighbours(v):
                if n in ok and n not in region:
                    region.add(n)
                    work.append(n)
    return region


def _region_values(node: Node) -> list[Value]:
    ins = [node.inputs[i] for i in layout_operands(node)]
    return [v for v in ins + list(node.outputs) if _is_region_value(v)]


def _neighbours(v: Value) -> list[Node]:
    """The producer of ``v`` and its users that read it as a layout operand."""
    users = [n for n, i in v.uses if _rule(n) is not None and i in layout_operands(n)]
    return ([v.producer] if v.producer is not None else []) + users


class _Converter:
    """Moves one region to NHWC: new nodes before the old ones, transforms at the
    boundary, then the old nodes erased and their names handed over."""

    def __init__(self, graph: Graph, region: list[Node], convert_outputs: bool):
        self.graph, self.region, self.convert_outputs = graph, region, convert_outputs
        self.members = set(region)
        self.map: dict[int, Value] = {}
        self.renames: list[tuple[Value, str]] = []
        self.constants: list[Value] = []
        self.inserted = 0

    def run(self) -> int:
        for n in self.region:
            self._convert(n)
        for n in self.region:
            for old in n.outputs:
                self._leave(old)
        for n in reversed(self.region):
            self.graph.erase(n)
        for old in self.constants:        # permuted constants take over unused names
            if not old.uses and all(o is not old for o in self.graph.outputs.values()):
                self.graph.erase_const(old)
                self.renames.append((self.map[id(old)], old.name))
        for new, name in self.renames:
            self.graph.rename(new, name)
        return self.inserted

    def _convert(self, node: Node) -> None:
        inputs = list(node.inputs)
        for i in layout_operands(node):
            inputs[i] = self._nhwc(inputs[i], node)
        rule = _rule(node)
        attrs = rule.attrs(node) if rule.attrs else node.attrs
        new = self.graph.create_node(node.op, inputs, attrs, loc=node.loc, before=node,
                                     names=[f"{v.name}.nhwc" for v in node.outputs])
        want = [nhwc_type(v.type) for v in node.outputs]
        if [v.type for v in new.outputs] != want:
            raise PassError(f"to-nhwc: the NHWC form infers {[str(v.type) for v in new.outputs]}, "
                            f"expected {[str(t) for t in want]}", node=node.name, op=node.op,
                            loc=node.loc)
        for old, v in zip(node.outputs, new.outputs):
            self.map[id(old)] = v
            self.renames.append((v, old.name))

    def _nhwc(self, v: Value, user: Node) -> Value:
        """``v`` in NHWC: converted already, a permuted constant, or a transform of it."""
        if id(v) not in self.map:
            if v.is_const:
                t = nhwc_type(v.type)
                shape = (1,) * (4 - v.type.rank) + v.type.shape
                array = np.ascontiguousarray(v.const.reshape(shape).transpose(NCHW_TO_NHWC))
                self.map[id(v)] = self.graph.add_const(
                    array, self.graph.unique_name(f"{v.name}.nhwc"), t)
                self.constants.append(v)
            else:
                self.map[id(v)] = self._transform(v, Layout.nhwc, v.name, before=user)
        return self.map[id(v)]

    def _transform(self, v: Value, to: Layout, name: str, **where) -> Value:
        """A new ``layout_transform(v) {to}``, named after ``name``, where ``where`` says."""
        self.inserted += 1
        loc = v.producer.loc if v.producer is not None else ""
        node = self.graph.create_node("layout_transform", [v], {"to": to.value}, loc=loc,
                                      names=[f"{name}.{to.value}"], **where)
        return node.output

    def _leave(self, old: Value) -> None:
        """Give the outside users and graph outputs of ``old`` its original type back."""
        new = self.map[id(old)]
        outside: dict[Node, list[int]] = {}
        for user, i in old.uses:
            if user not in self.members or i not in layout_operands(user):
                outside.setdefault(user, []).append(i)
        for user, indices in outside.items():
            back = self._transform(new, old.type.layout, old.name, before=user)
            for i in indices:
                user.set_input(i, back)
        for key, out in list(self.graph.outputs.items()):
            if out is old:
                self.graph.set_output(key, new if self.convert_outputs else self._transform(
                    new, old.type.layout, old.name, after=new.producer))


def convert_regions(graph: Graph, convert_outputs: bool = False) -> tuple[int, int]:
    """Move every NHWC region of ``graph`` to NHWC (see the module docstring); returns
    (nodes converted, layout transforms inserted)."""
    converted = inserted = 0
    for region in find_regions(graph):
        if not rewrite_permitted("to-nhwc-region", region[0]):
            break
        inserted += _Converter(graph, region, convert_outputs).run()
        converted += len(region)
    return converted, inserted


# ---- data movement in its cheapest form ----------------------------------------------------
@dataclass(frozen=True)
class _Atom:
    """A piece of one axis of the chain's source: ``key`` orders atoms in source memory
    order (splitting an atom refines its key)."""

    key: tuple[int, ...]
    size: int


def _atoms(shape: Sequence[int]) -> list[list[_Atom]]:
    return [[_Atom((i,), d)] if d != 1 else [] for i, d in enumerate(shape)]


def _reshape_atoms(axes: list[list[_Atom]], shape: Sequence[int]) -> list[list[_Atom]] | None:
    """The atoms of each axis after a reshape to ``shape``; None when an axis would mix
    parts of atoms that do not divide."""
    seq, out, i = [a for ax in axes for a in ax], [], 0
    for size in shape:
        group, need = [], size
        while need > 1:
            a = seq[i]
            if need % a.size == 0:
                group.append(a)
                need //= a.size
                i += 1
            elif a.size % need == 0:
                group.append(_Atom(a.key + (0,), need))
                seq[i] = _Atom(a.key + (1,), a.size // need)
                need = 1
            else:
                return None
        out.append(group)
    return out


@dataclass(frozen=True)
class Movement:
    """A permutation of data in its cheapest form: ``reshape(x, source_shape)``, then
    ``transpose(perm)`` (None: no transpose), then ``reshape`` to the result."""

    source_shape: tuple[int, ...]
    perm: tuple[int, ...] | None


def movement_of(x: TensorType, chain: Iterable[Node]) -> Movement | None:
    """The cheapest form of the chain of reshapes, transposes and layout transforms
    ``chain`` (first to last) applied to a tensor of type ``x``; None if a reshape mixes
    axes in a way a single transpose cannot express."""
    axes = _atoms(x.shape)
    for node in chain:
        if node.op in RESHAPES:
            axes = _reshape_atoms(axes, node.output.type.shape)
            if axes is None:
                return None
        else:
            axes = [axes[p] for p in _perm_of(node)]
    final = [a for ax in axes for a in ax]
    groups: list[list[_Atom]] = []
    by_key = sorted(final, key=lambda a: a.key)
    rank = {a.key: i for i, a in enumerate(by_key)}
    for a in final:
        if groups and rank[a.key] == rank[groups[-1][-1].key] + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    source = sorted(groups, key=lambda g: g[0].key)
    perm = tuple(source.index(g) for g in groups)
    shape = tuple(int(np.prod([a.size for a in g])) for g in source)
    return Movement(shape, None if perm == tuple(range(len(perm))) else perm)


Ops = list[tuple[str, dict]]      # a replacement: (op name, attributes), first to last


def result_type(x: TensorType, ops: Ops) -> TensorType:
    """The type ``ops`` give a value of type ``x``, by the registry's type rules."""
    for name, attrs in ops:
        opdef = get_op(name)
        x = opdef.infer(Ctx(opdef.check_attrs(attrs), [x]), x)
    return x


def movement_ops(x: TensorType, mv: Movement, result: TensorType) -> Ops:
    """The ops that apply ``mv`` to a ``x`` and give the shape of ``result``."""
    ops: Ops = []
    if mv.perm is not None:
        if x.shape != mv.source_shape:
            ops.append(("reshape", {"shape": mv.source_shape}))
        ops.append(("transpose", {"perm": mv.perm}))
    if result_type(x, ops) != result:      # the result's memory order, tagged NHWC if it is
        tag = {"layout": "nhwc"} if result.layout is Layout.nhwc else {}
        ops.append(("reshape", {"shape": result.shape, **tag}))
    return ops


def _moves(chain: Iterable[Node]) -> int:
    return sum(1 for n in chain if n.op not in RESHAPES
               and moves_data(_perm_of(n), n.inputs[0].type.shape))


def _plan(x: Value, chain: list[Node]) -> Ops | str:
    """The cheapest ops that replace ``chain`` (first to last) on ``x`` (none: ``x``
    itself), or a reason to keep the chain."""
    result = chain[-1].output.type
    candidates = [ops for ops in (_transform_ops(x.type, chain, result), _direct_ops(x.type, chain),
                                  _movement_ops(x.type, chain, result))
                  if ops is not None and result_type(x.type, ops) == result]
    if not candidates:
        if result.layout is not Layout.plain:
            return "the result keeps a layout tag that only a layout_transform of the source gives"
        return "a reshape mixes axes that one transpose cannot express"
    ops = min(candidates, key=_cost)
    if _cost(ops) >= (_moves(chain), len(chain)):
        return "the chain is already as cheap as one transpose between reshapes"
    return ops


def _cost(ops: Ops) -> tuple[int, int]:
    """(data permutations, nodes) of a replacement: reshapes move no data."""
    return sum(1 for name, _ in ops if name != "reshape"), len(ops)


def _transform_ops(x: TensorType, chain: list[Node], result: TensorType) -> Ops | None:
    """The chain as one layout_transform of ``x``, when it permutes as that does."""
    perm = _compose(chain)
    if perm is None or x.rank != 4 or x.layout is result.layout \
            or perm != layout_perm(x.layout, result.layout):
        return None
    return [("layout_transform", {"to": result.layout.value})]


def _direct_ops(x: TensorType, chain: list[Node]) -> Ops | None:
    """A chain without reshapes as one transpose (a reshape if only unit axes move)."""
    perm = _compose(chain)
    if perm is None:
        return None
    if moves_data(perm, x.shape):
        return [("transpose", {"perm": perm})]
    return [("reshape", {"shape": tuple(x.shape[p] for p in perm)})]


def _movement_ops(x: TensorType, chain: list[Node], result: TensorType) -> Ops | None:
    mv = movement_of(x, chain)
    return None if mv is None else movement_ops(x, mv, result)


def _compose(chain: Iterable[Node]) -> tuple[int, ...] | None:
    """The one permutation equal to a chain of transposes and layout transforms (None if
    it holds a reshape)."""
    perm: tuple[int, ...] | None = None
    for node in chain:
        if node.op in RESHAPES:
            return None
        p = _perm_of(node)
        perm = p if perm is None else tuple(perm[i] for i in p)
    return perm


def _rewrite_plan(rw: Rewriter, m: Match) -> None:
    x = m["x"]
    for op_name, attrs in m["plan"]:
        x = rw.create(op_name, [x], attrs).output
    rw.replace(m.root, x)


class _PlannedPattern(RewritePattern):
    """A pattern over a chain of data movement ending at the root: ``check`` plans the
    cheapest replacement (see :func:`_plan`), ``rewrite`` builds it."""

    def check(self, m: Match) -> str | None:
        plan = _plan(m["x"], _chain(m))
        if isinstance(plan, str):
            return plan
        m.bindings["plan"] = plan
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        _rewrite_plan(rw, m)


def _chain(m: Match) -> list[Node]:
    """The matched nodes from the source to the root (a match lists the root first)."""
    return list(reversed(m.nodes))


class CancelLayoutTransforms(_PlannedPattern):
    """layout_transform(layout_transform(x)) -> x, or one layout_transform."""

    name = "cancel-layout-transforms"
    benefit = 3
    pattern = op("layout_transform", op("layout_transform", "x"))


class FoldTransposeLayoutTransform(_PlannedPattern):
    """transpose(layout_transform(x)) or layout_transform(transpose(x)) -> one transpose,
    a reshape (only unit dimensions move), one layout_transform, or x."""

    name = "fold-transpose-layout-transform"
    benefit = 2
    roots = ("transpose", "layout_transform")
    _forms = (op("transpose", op("layout_transform", "x")),
              op("layout_transform", op("transpose", "x")))

    def match(self, node: Node) -> Match | NoMatch:
        best: NoMatch | None = None
        for form in self._forms:
            m = match_pattern(form, node)
            if m:
                return m
            best = m if best is None or m.progress > best.progress else best
        return best


class AbsorbLayoutTransformIntoReshape(_PlannedPattern):
    """A chain of reshapes (flatten, squeeze, unsqueeze) and transposes over a
    layout_transform, or reading an NHWC tensor, becomes at most one transpose between
    reshapes; when the chain reads the source in memory order, one reshape (the BEVFormer
    bridge). A chain that ends in a layout_transform back to NHWC (a channel shuffle:
    reshape, transpose, reshape between NHWC convolutions) becomes the same, in NHWC
    memory order, its last reshape tagging the result NHWC."""

    name = "absorb-layout-transform-into-reshape"
    benefit = 1
    roots = RESHAPES + ("transpose", "layout_transform")

    def match(self, node: Node) -> Match | NoMatch:
        if node.op not in self.roots:
            return NoMatch(f"{node.op} is not a reshape, transpose or layout_transform")
        if node.output.type.layout is not (Layout.nhwc if node.op == "layout_transform"
                                           else Layout.plain):
            return NoMatch("the result is not plain (nor NHWC after a layout_transform)")
        nodes = _movement_chain(node)
        while nodes and nodes[-1].op != "layout_transform" \
                and nodes[-1].inputs[0].type.layout is not Layout.nhwc:
            nodes.pop()
        if len(nodes) < 2:
            return NoMatch("no layout_transform or NHWC tensor feeds a chain of reshapes "
                           "and transposes here")
        if not any(n.op in RESHAPES for n in nodes):
            return NoMatch("the chain has no reshape", 1)
        return Match(node, nodes, {"x": nodes[-1].inputs[0]})


def _movement_chain(root: Node) -> list[Node]:
    """``root`` and the reshapes, transposes and layout transforms above it whose results
    only the next node of the chain reads (root first)."""
    nodes = [root]
    while True:
        src = nodes[-1].inputs[0]
        n = src.producer
        if (n is None or n.op not in RESHAPES + ("transpose", "layout_transform")
                or len(src.uses) != 1 or any(o is src for o in n.graph.outputs.values())):
            return nodes
        nodes.append(n)


# ---- the pass -------------------------------------------------------------------------------
class ToNHWC(PatternPass):
    """Run the convolutional region in NHWC with layout transforms only at its boundaries,
    then sink and cancel them (see the module docstring). ``convert_outputs``: graph
    outputs may change to NHWC instead of being transformed back (the same values,
    transposed; such an instance is not ``semantics_preserving``, as its outputs' types
    change)."""

    name = "to-nhwc"
    description = "run the convolutional region in NHWC; transforms only at its boundaries"
    semantics_preserving = True
    tolerance = 0.0
    patterns: ClassVar[tuple[type[RewritePattern], ...]] = (
        CancelLayoutTransforms, FoldTransposeLayoutTransform, AbsorbLayoutTransformIntoReshape)

    convert_outputs: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.convert_outputs:    # the outputs' types change: not checkable against before
            self.__dict__["semantics_preserving"] = False

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        self.stat("layout_transforms_before", count_layout_transforms(graph))
        self.stat("transposes_before", count_transposes(graph))
        converted, inserted = convert_regions(graph, self.convert_outputs)
        self.stat("converted", converted)
        self.stat("inserted", inserted)
        transforms = _count(graph, "layout_transform")
        super().run(graph, am)
        self.stat("cancelled", transforms - _count(graph, "layout_transform"))
        self.stat("layout_transforms_after", count_layout_transforms(graph))
        self.stat("transposes_after", count_transposes(graph))


def _count(graph: Graph, op_name: str) -> int:
    return sum(1 for n in graph.nodes if n.op == op_name)
