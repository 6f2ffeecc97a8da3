"""Pattern rewriting: declarative patterns, a worklist driver, statistics and explanations.

A rewrite pattern says what it matches (a small tree of :func:`op` / :func:`const` /
capture names), a ``check`` that returns the reason when it declines, and a ``rewrite``;
its ``benefit`` orders competing patterns on the same node::

    class AddZero(RewritePattern):
        name = "add-zero"
        pattern = op("add", "x", const("zero"), commutative=True)

        def check(self, m):
            if np.any(m["zero"].const):
                return "the constant is not all zeros"

        def rewrite(self, rw, m):
            rw.replace(m.root, m["x"])

:func:`apply_patterns` runs a set of patterns to a fixpoint; :class:`PatternPass` makes a
pass of a pattern set whose patterns can be switched on and off from a pipeline
(``fuse{disable=fold-bn-into-conv}``); :func:`explain` tells why a pattern does not match.

Matching rules: a string in an operand position captures any value under that name (the
same name twice must be the same value; ``"_"`` captures nothing); ``None`` requires the
operand to be absent; :func:`const` requires a constant. Every node of a match except the
root must have no users outside the match, so a rewrite can replace all of it.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import BevirError, PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from .analysis import AnalysisManager
from .core import Pass
from .rewrites import rewrite_permitted

_PATTERNS: dict[str, type[RewritePattern]] = {}


# ---- the matching DSL -------------------------------------------------------------------
@dataclass(frozen=True)
class Const:
    """Matches a constant operand (or an absent one, when ``optional``)."""
    name: str
    optional: bool = False


@dataclass(frozen=True)
class Op:
    """Matches a node of one of ``ops`` whose operands match ``operands`` (see :func:`op`)."""
    ops: tuple[str, ...]
    operands: tuple[Any, ...]
    name: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    where: Callable[[Node], str | None] | None = None
    commutative: bool = False
    variadic: bool = False


def op(ops: str | Sequence[str], *operands: Any, name: str | None = None,
       attrs: Mapping[str, Any] | None = None, where: Callable[[Node], str | None] | None = None,
       commutative: bool = False) -> Op:
    """A node pattern. ``ops``: one op name or several; ``operands``: sub-patterns, capture
    names, ``None`` (absent) or a trailing ``...`` (any further operands); ``name``: the
    match binds the node under it; ``attrs``: required attribute values, or predicates
    taking the value; ``where``: a predicate on the node returning a reason to decline;
    ``commutative``: the first two operands may match in either order."""
    ops = (ops,) if isinstance(ops, str) else tuple(ops)
    variadic = bool(operands) and operands[-1] is Ellipsis
    operands = operands[:-1] if variadic else operands
    return Op(ops, tuple(operands), name, dict(attrs or {}), where, commutative, variadic)


def const(name: str = "_", optional: bool = False) -> Const:
    """An operand pattern matching a constant, captured under ``name``."""
    return Const(name, optional)


@dataclass
class Match:
    """A successful match: the root node, every matched node, and the bindings (capture
    name -> Value, node pattern name -> Node). ``m["x"]`` reads a binding."""
    root: Node
    nodes: list[Node]
    bindings: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.bindings[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.bindings.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.bindings


@dataclass
class NoMatch:
    """Why a match failed, and how far it got (``progress``: bindings made before)."""
    reason: str
    progress: int = 0

    def __bool__(self) -> bool:
        return False


class _Fail(Exception):
    def __init__(self, reason: str, progress: int):
        self.result = NoMatch(reason, progress)


def match_pattern(pattern: Op, node: Node) -> Match | NoMatch:
    """Match ``pattern`` with ``node`` as its root."""
    m = Match(node, [], {})
    try:
        _match_node(pattern, node, m)
        _check_interior(m)
    except _Fail as f:
        return f.result
    return m


def _fail(reason: str, m: Match) -> None:
    raise _Fail(reason, len(m.nodes) + len(m.bindings))


def _match_node(p: Op, node: Node, m: Match) -> None:
    if node.op not in p.ops:
        _fail(f"{_node_desc(node)} is not {' or '.join(p.ops)}", m)
    for key, want in p.attrs.items():
        have = node.attrs.get(key)
        ok = want(have) if callable(want) else _same(have, want)
        if not ok:
            _fail(f"{_node_desc(node)}: attribute {key}={have!r} does not fit", m)
    if p.where is not None and (reason := p.where(node)):
        _fail(f"{_node_desc(node)}: {reason}", m)
    inputs = list(node.inputs)
    while len(inputs) > len(p.operands) and inputs[-1] is None:
        inputs.pop()
    if len(inputs) > len(p.operands) and not p.variadic:
        _fail(f"{_node_desc(node)} has {len(inputs)} operands, the pattern {len(p.operands)}", m)
    inputs += [None] * (len(p.operands) - len(inputs))
    m.nodes.append(node)
    if p.name:
        m.bindings[p.name] = node
    orders = [list(range(len(p.operands)))]
    if p.commutative and len(p.operands) >= 2:
        orders.append([1, 0] + orders[0][2:])
    _match_operands(p, inputs, orders, m)


def _match_operands(p: Op, inputs: list, orders: list[list[int]], m: Match) -> None:
    """Try each operand order in turn, undoing the bindings of a failed one."""
    failure = None
    for order in orders:
        nodes, bindings = list(m.nodes), dict(m.bindings)
        try:
            for pat_index, input_index in enumerate(order):
                _match_value(p.operands[pat_index], inputs[input_index], m)
            return
        except _Fail as f:
            if failure is None or f.result.progress > failure.result.progress:
                failure = f
            m.nodes[:], m.bindings = nodes, bindings
    raise failure


def _match_value(p: Any, v: Value | None, m: Match) -> None:
    if p is None:
        if v is not None:
            _fail(f"operand %{v.name} is present, the pattern wants it absent", m)
    elif isinstance(p, str):
        if v is None:
            _fail(f"operand '{p}' is absent", m)
        _bind(p, v, m)
    elif isinstance(p, Const):
        if v is None:
            if not p.optional:
                _fail(f"constant operand '{p.name}' is absent", m)
        elif not v.is_const:
            _fail(f"operand %{v.name} is not a constant", m)
        _bind(p.name, v, m)
    elif isinstance(p, Op):
        if v is None:
            _fail(f"operand is absent, the pattern wants {' or '.join(p.ops)}", m)
        n = v.producer
        if n is None:
            kind = "a constant" if v.is_const else "a graph input"
            _fail(f"%{v.name} is {kind}, the pattern wants {' or '.join(p.ops)}", m)
        if n in m.nodes:
            _fail(f"{_node_desc(n)} is matched twice", m)
        _match_node(p, n, m)
    else:
        raise TypeError(f"not an operand pattern: {p!r}")


def _bind(name: str, v: Value | None, m: Match) -> None:
    if name == "_":
        return
    if name in m.bindings and m.bindings[name] is not v:
        _fail(f"'{name}' would bind two different values", m)
    m.bindings[name] = v


def _check_interior(m: Match) -> None:
    """Every matched node but the root is used only inside the match."""
    inside = set(map(id, m.nodes))
    for n in m.nodes[1:]:
        for v in n.outputs:
            if any(id(u) not in inside for u, _ in v.uses) or _is_output(n.graph, v):
                _fail(f"result %{v.name} of {n.op} is used outside the pattern", m)


def _is_output(graph: Graph | None, v: Value) -> bool:
    return graph is not None and any(o is v for o in graph.outputs.values())


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, (list, tuple)) or isinstance(want, (list, tuple)):
        return have is not None and tuple(have) == tuple(want)
    return have == want


def _node_desc(n: Node) -> str:
    return f"{n.op} %{n.outputs[0].name}" if n.outputs else n.op


# ---- patterns ---------------------------------------------------------------------------
class RewritePattern:
    """Base of rewrite patterns; see the module docstring.

    Class attributes: ``name`` (defining it registers the pattern), ``benefit`` (higher
    runs first when several patterns match a node), ``pattern`` (an :func:`op` tree; or
    override :meth:`match`), ``roots`` (the root ops, taken from ``pattern`` if not given).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    benefit: ClassVar[int] = 1
    pattern: ClassVar[Op | None] = None
    roots: ClassVar[tuple[str, ...] | None] = None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.pattern is not None and "roots" not in cls.__dict__ and (
                cls.roots is None or "pattern" in cls.__dict__):    # a new pattern, new roots
            cls.roots = cls.pattern.ops
        if "name" in cls.__dict__:
            _PATTERNS[cls.name] = cls

    def match(self, node: Node) -> Match | NoMatch:
        """Match this pattern rooted at ``node``."""
        if self.pattern is None:
            raise NotImplementedError(f"pattern '{self.name}' defines neither pattern nor match()")
        return match_pattern(self.pattern, node)

    def check(self, m: Match) -> str | None:
        """Return a reason to decline the match, or None to accept it."""
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        """Rewrite the match through ``rw``."""
        raise NotImplementedError(f"pattern '{self.name}' does not define rewrite()")

    def __repr__(self) -> str:
        return f"<pattern {self.name} benefit={self.benefit}>"


def get_pattern(name: str) -> type[RewritePattern]:
    """The registered pattern class called ``name``."""
    try:
        return _PATTERNS[name]
    except KeyError:
        raise PassError(f"unknown pattern '{name}'; known: "
                        f"{', '.join(sorted(_PATTERNS))}") from None


class Rewriter:
    """What a pattern's ``rewrite`` uses to change the graph. New nodes go before the
    match's root and carry the match's provenance (``loc``) and the root's meta entries
    that survive rewrites; replaced results keep their names (and pass their surviving
    meta on, see :meth:`Graph.replace_all_uses`)."""

    def __init__(self, graph: Graph, m: Match):
        self.graph = graph
        self.match = m
        self.loc = fused_loc(n.loc for n in reversed(m.nodes))
        self.created: list[Node] = []
        self._consts: list[Value] = []
        self._renames: list[tuple[Value, str]] = []
        self.changed = False

    def create(self, op: str, inputs: Sequence[Value | None],
               attrs: Mapping[str, Any] | None = None, *,
               out_types: Sequence[TensorType] | None = None, name: str | None = None,
               loc: str | None = None) -> Node:
        """Create ``op(inputs){attrs}`` before the root (types inferred unless given)."""
        node = self.graph.create_node(op, inputs, attrs, out_types=out_types,
                                      loc=self.loc if loc is None else loc,
                                      names=[name] * (len(out_types) if out_types else 1)
                                      if name else None, before=self.match.root)
        self.match.root.meta.carry_to(node.meta, rewrite=True)
        self.created.append(node)
        self.changed = True
        return node

    def const(self, array: np.ndarray, name: str | None = None,
              type: TensorType | None = None) -> Value:
        """A new constant (a replacement by it takes over the replaced result's name)."""
        array = np.asarray(array)
        v = self.graph.add_const(array if array.flags.c_contiguous else np.ascontiguousarray(array),
                                 self.graph.unique_name(name or "c"), type)
        self._consts.append(v)
        self.changed = True
        return v

    def replace(self, old: Node | Value, new: Node | Value | Sequence[Value]) -> None:
        """Redirect the uses of ``old`` (a value, or a node's results) to ``new``. New
        results take over the replaced results' names."""
        olds = list(old.outputs) if isinstance(old, Node) else [old]
        news = list(new.outputs) if isinstance(new, Node) else (
            [new] if isinstance(new, Value) else list(new))
        if len(olds) != len(news):
            raise PassError(f"replace: {len(olds)} results by {len(news)} values")
        created = {id(v) for n in self.created for v in n.outputs} | set(map(id, self._consts))
        for o, n in zip(olds, news):
            if o.type != n.type:
                raise PassError(f"replace: %{o.name} is {o.type}, its replacement {n.type}")
            self.graph.replace_all_uses(o, n)
            if id(n) in created:
                self._renames.append((n, o.name))
        self.changed = True

    def finish(self) -> list[Node]:
        """Erase what the rewrite left dead and hand the names over; the touched nodes."""
        erase_dead(self.graph, self.match.nodes)
        for v, name in self._renames:
            if v.name != name and name not in self.graph._names:
                self.graph.rename(v, name)
        return self.created


def fused_loc(locs: Iterable[str]) -> str:
    """The provenance of a node made from several: their distinct locs, joined by '+'."""
    seen: list[str] = []
    for loc in locs:
        for part in loc.split("+") if loc else ():
            if part not in seen:
                seen.append(part)
    return "+".join(seen)


def erase_dead(graph: Graph, nodes: Iterable[Node]) -> int:
    """Erase the pure nodes among ``nodes`` (and, transitively, their operands' producers
    and constants) whose results are unused. Returns how many nodes were erased."""
    outputs = {id(v) for v in graph.outputs.values()}
    work: list[Value] = [v for n in nodes for v in n.outputs]
    erased = 0
    while work:
        v = work.pop()
        if v.uses or id(v) in outputs:
            continue
        if v.is_const:
            if graph.constants.get(v.name) is v:
                graph.erase_const(v)
            continue
        n = v.producer
        if (n is None or n.graph is not graph or not n.opdef.pure
                or any(o.uses or id(o) in outputs for o in n.outputs)):
            continue
        work += [i for i in n.inputs if i is not None]
        graph.erase(n)
        erased += 1
    return erased


# ---- the driver -------------------------------------------------------------------------
@dataclass
class PatternStats:
    """Per-pattern counters of one driver run."""
    tries: int = 0
    matches: int = 0
    declined: int = 0
    applied: int = 0
    seconds: float = 0.0


class ConvergenceError(PassError):
    """Pattern rewriting did not reach a fixpoint within its bound."""


def apply_patterns(graph: Graph, patterns: Sequence[RewritePattern], *,
                   max_rewrites: int | None = None,
                   stats: dict[str, PatternStats] | None = None) -> int:
    """Apply ``patterns`` to ``graph`` until none matches; returns the number of rewrites.

    A worklist holds every node, then the nodes near each rewrite. On each node the
    patterns for its op are tried in order of decreasing benefit; the first that matches
    and passes its check rewrites. More than ``max_rewrites`` rewrites (default: ten per
    node, plus 100) raise :class:`ConvergenceError` naming the patterns still firing.
    """
    stats = {} if stats is None else stats
    for p in patterns:
        stats.setdefault(p.name, PatternStats())
    by_op = _index(patterns)
    bound = max_rewrites if max_rewrites is not None else 10 * len(graph.nodes) + 100
    work, queued = deque(graph.nodes), set(graph.nodes)
    recent: deque[str] = deque(maxlen=32)
    count = 0
    while work:
        node = work.popleft()
        queued.discard(node)
        if node.graph is not graph:
            continue
        for p in by_op.get(node.op, by_op[None]):
            outcome = _try(graph, p, node, stats[p.name])
            if outcome is None:
                continue
            if outcome is False:            # the rewrite budget is spent
                return count
            count += 1
            recent.append(p.name)
            if count > bound:
                raise _non_convergence(count, recent)
            for n in outcome:
                if n not in queued and n.graph is graph:
                    work.append(n)
                    queued.add(n)
            break
    return count


def _index(patterns: Sequence[RewritePattern]) -> dict[str | None, list[RewritePattern]]:
    """Op -> the patterns to try on its nodes, by decreasing benefit (patterns without
    roots, under None, try every op)."""
    anywhere = [p for p in patterns if not p.roots]
    by_op: dict[str | None, list[RewritePattern]] = {None: anywhere}
    for p in patterns:
        for root in p.roots or ():
            by_op.setdefault(root, list(anywhere)).append(p)
    for ps in by_op.values():
        ps.sort(key=lambda p: (-p.benefit, p.name))
    return by_op


def _try(graph: Graph, p: RewritePattern, node: Node, st: PatternStats):
    """None: no rewrite; False: the budget refused; else the nodes to revisit."""
    t0 = time.perf_counter()
    try:
        st.tries += 1
        m = p.match(node)
        if not m:
            return None
        st.matches += 1
        if p.check(m) is not None:
            st.declined += 1
            return None
        if not rewrite_permitted(p.name, node):
            return False
        neighbours = _neighbours(m)
        rw = Rewriter(graph, m)
        try:
            p.rewrite(rw, m)
        except BevirError as e:
            raise PassError(f"pattern '{p.name}' failed: {e.message}", node=node.name,
                            op=node.op, loc=node.loc) from e
        if not rw.changed:
            raise PassError(f"pattern '{p.name}' matched and accepted but its rewrite changed "
                            "nothing", node=node.name, op=node.op, loc=node.loc)
        st.applied += 1
        created = rw.finish()
        return created + [u for n in created for v in n.outputs for u, _ in v.uses] + neighbours
    finally:
        st.seconds += time.perf_counter() - t0


def _neighbours(m: Match) -> list[Node]:
    """The producers of the match's operands and the users of its root: what a rewrite
    can make matchable."""
    inside = set(map(id, m.nodes))
    out = [v.producer for n in m.nodes for v in n.inputs
           if v is not None and v.producer is not None and id(v.producer) not in inside]
    return out + [u for v in m.root.outputs for u, _ in v.uses]


def _non_convergence(count: int, recent: Iterable[str]) -> ConvergenceError:
    firing: dict[str, int] = {}
    for name in recent:
        firing[name] = firing.get(name, 0) + 1
    names = ", ".join(f"{k} ({v}x)" for k, v in sorted(firing.items(), key=lambda kv: -kv[1]))
    return ConvergenceError(f"pattern rewriting did not converge after {count - 1} rewrites; "
                            f"the last rewrites were by: {names}")


# ---- why didn't it match ----------------------------------------------------------------
def explain(graph: Graph, pattern: RewritePattern | str, node: Node | str | None = None) -> str:
    """Why ``pattern`` does (not) rewrite ``node`` (a Node or a result name); without a
    node, the best near miss over the graph's nodes of the pattern's root ops."""
    p = get_pattern(pattern)() if isinstance(pattern, str) else pattern
    if node is not None:
        n = node if isinstance(node, Node) else _node_of(graph, node)
        return f"{p.name} on {_node_desc(n)}: {_verdict(p, n)[1]}"
    candidates = [n for n in graph.nodes if p.roots is None or n.op in p.roots]
    if not candidates:
        return f"{p.name}: no node of op {' or '.join(p.roots or ())} in the graph"
    best = max(candidates, key=lambda n: _verdict(p, n)[0])
    return f"{p.name}: best candidate {_node_desc(best)}: {_verdict(p, best)[1]}"


def _verdict(p: RewritePattern, n: Node) -> tuple[float, str]:
    m = p.match(n)
    if not m:
        return m.progress, f"no match: {m.reason}"
    reason = p.check(m)
    if reason is not None:
        return 1e9, f"matched, but declined: {reason}"
    return 2e9, "matches"


def _node_of(graph: Graph, name: str) -> Node:
    for n in graph.nodes:
        if any(v.name == name for v in n.outputs):
            return n
    raise PassError(f"no node produces %{name}")


# ---- passes made of patterns ------------------------------------------------------------
class PatternPass(Pass):
    """A pass that runs a pattern set to a fixpoint.

    Subclasses set ``patterns`` (pattern classes). Options: ``enable`` / ``disable``
    (pattern names separated by ``|``, or by commas inside quotes) switch patterns on and
    off (patterns with ``enabled_by_default = False`` need ``enable``); ``max_rewrites``
    bounds the rewrites (0: ten per node). Statistics: rewrites per pattern; the full
    per-pattern table (tries, matches, declined, applied, time) is ``pattern_stats``.
    """

    patterns: ClassVar[tuple[type[RewritePattern], ...]] = ()

    enable: str = ""
    disable: str = ""
    max_rewrites: int = 0

    def __post_init__(self):
        super().__post_init__()
        self._check_names()     # a typo in enable/disable fails while parsing the pipeline

    def _check_names(self) -> None:
        known = [p.name for p in self.patterns]
        for option in ("enable", "disable"):
            for name in sorted(_names(getattr(self, option))):
                if name not in known:
                    raise PassError(f"pass '{self.name}' has no pattern '{name}' (option "
                                    f"'{option}'); its patterns: {', '.join(known)}")

    def active_patterns(self) -> list[RewritePattern]:
        """The patterns this instance runs, after ``enable`` / ``disable``."""
        known = {p.name: p for p in self.patterns}
        enable, disable = _names(self.enable), _names(self.disable)
        self._check_names()
        return [p() for name, p in known.items() if name not in disable
                and (getattr(p, "enabled_by_default", True) or name in enable)]

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        stats: dict[str, PatternStats] = {}
        apply_patterns(graph, self.active_patterns(), stats=stats,
                       max_rewrites=self.max_rewrites or None)
        self.__dict__["pattern_stats"] = stats
        for name, st in stats.items():
            if st.applied:
                self.stat(name, st.applied)

    @property
    def pattern_stats(self) -> dict[str, PatternStats]:
        return dict(self.__dict__.get("pattern_stats", {}))

    def _fired(self) -> dict[str, float]:
        """The patterns of the last run that rewrote something, with their tolerances."""
        claims = {p.name: getattr(p, "tolerance", 0.0) for p in self.patterns}
        return {name: claims[name] for name, st in self.pattern_stats.items() if st.applied}

    @property
    def claimed_tolerance(self) -> float:
        if "pattern_stats" not in self.__dict__:     # not run yet: what its patterns may claim
            return self.tolerance
        return max(self._fired().values(), default=0.0)

    def exact_part(self) -> PatternPass | None:
        fired = self._fired()
        exact = {name for name, tol in fired.items() if tol == 0.0}
        if not exact or len(exact) == len(fired):
            return None
        others = {p.name for p in self.patterns} - exact
        return dataclasses.replace(self, disable="|".join(sorted(others)))


def _names(text: str) -> set[str]:
    return {s.strip() for s in text.replace(",", "|").split("|") if s.strip()}


def format_pattern_stats(stats: Mapping[str, PatternStats]) -> str:
    """A table of per-pattern statistics."""
    rows = [f"{'pattern':32} {'tries':>7} {'matches':>7} {'declined':>8} {'applied':>7} {'ms':>8}"]
    for name, s in stats.items():
        rows.append(f"{name:32} {s.tries:7} {s.matches:7} {s.declined:8} {s.applied:7} "
                    f"{s.seconds * 1e3:8.2f}")
    return "\n".join(rows)
