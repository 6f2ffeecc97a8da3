"""partition{hw=...}: split the integer ops of a lowered graph across cores.

Each op declares how it may be split (``OpDef.splits``: "rows", "batch", "channels",
"columns", "queries"; ``split_axis`` / ``split_piece`` say which result axis and which
operand ranges). For every node the pass weighs one core (``none``, core 0) against each
declared kind cut into balanced ranges and against ``copies`` (every core computes the
whole result, its consumers on each core read their own), costed by the cycle model of
the hardware config (bevir/target/cycles.py) over the whole graph: a split pays for its
busiest piece and for how each piece gets its operands from their producers' decisions
(:class:`Route`) — nothing where the producer was split the same way or copied, the halo
rows read from the neighbouring cores, a gather and a slice otherwise — and its consumers
pay for how they get its pieces. The decisions are improved node by node until no change
lowers the sum (iterated conditional modes, from the cheapest decisions one node at a
time; a move to copies takes the node's reshapes along and lets its readers re-decide,
as neither pays alone); each entry of the plan gives its candidates' cycles in the final
neighbourhood, the choice and why.

A chosen split becomes explicit ops (bevir/ops/multicore.py): per core the same op on the
ranges it reads, a ``core_slice`` of an operand produced whole, ``core_gather`` where a
piece needs rows of several producer pieces (the rows of a neighbour's piece cut on the
neighbour's core: only they cross) or a range of another axis of every piece (each cut
where it was made: a split of channels feeding a split of rows exchanges only what each
core reads), or a consumer the whole result. A copied node stays on core 0 with a copy
on each other core (``node.meta["copy"]``); each core's consumers read their own. A
constant's slices are cut at compile time, so each core loads only its share. Cores
synchronise through the values they exchange (ready flags in the programs), not barriers.
Every node's core is in ``node.meta["core"]``. The plan is ``graph.meta["partition"]`` (JSON);
``partition{plan=FILE}`` replays a saved plan without searching. Results are
bit-identical: the pieces compute the same integers.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BevirError, PassError, VerifyError
from ..fsutil import write_atomic
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..ir.opdef import Ctx, get_op
from ..target.cycles import OpCost, dma_cycles, exposed_cycles, op_cost
from ..target.hw import HWConfig
from ..target.schedule import lowerable, renames
from .analysis import AnalysisManager
from .core import Pass

META_KEY = "partition"
PLAN_FORMAT = "bevir-partition"
PLAN_VERSION = 2

_CORE_SLICE = get_op("core_slice")

register_meta_key(META_KEY, dict, doc="the partition plan of a partitioned graph "
                  "(bevir.passes.partition)")


def balanced(n: int, parts: int) -> list[int]:
    """n split into min(parts, n) sizes differing by at most one, larger first."""
    parts = min(parts, n)
    return [n // parts + (i < n % parts) for i in range(parts)]


# ---- pieces ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PieceSpec:
    """One core's piece of a node: its operand ranges, attributes and (detached) node."""

    ranges: tuple
    attrs: dict
    node: Node


def _detached(op: str, types: list, attrs: Mapping[str, Any], out_types: list) -> Node:
    node = Node(op, [None if t is None else Value(f"in{i}", t) for i, t in enumerate(types)],
                attrs)
    node.outputs = [Value("out", t, producer=node) for t in out_types]
    return node


def pieces_of(node: Node, axis: int, sizes: list[int]) -> list[PieceSpec]:
    """The pieces of ``node`` cut into ``sizes`` along result ``axis``
    (:meth:`OpDef.region`), type checked: each infers the type of its range of the result
    (VerifyError otherwise)."""
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return pieces_at(node, axis, ranges)


def pieces_at(node: Node, axis: int, ranges: list[tuple[int, int]]) -> list[PieceSpec]:
    """The pieces of ``node`` computing result ranges ``ranges`` (any, overlapping or not)
    along result ``axis``, type checked."""
    opdef, out = node.opdef, node.output.type
    ctx = opdef.ctx(node)
    specs = []
    for start, stop in ranges:
        size = stop - start
        piece = opdef.region(ctx, axis, start, stop)
        if piece is None:
            raise VerifyError(f"op '{node.op}' cannot compute a range of result axis {axis}")
        types = [None if v is None else v.type for v in node.inputs]
        for i, r in enumerate(piece.operands):
            if r is not None and types[i] is not None:
                types[i] = _CORE_SLICE.infer(Ctx(dict(zip(("axis", "start", "stop"), r))),
                                             types[i])
        attrs = opdef.check_attrs({**node.attrs, **piece.attrs})
        detached = _detached(node.op, types, attrs, [])
        got = _infer(detached)
        want = out.with_(shape=out.shape[:axis] + (size,) + out.shape[axis + 1:])
        if got != [want]:
            raise VerifyError(f"piece [{start}, {start + size}) of axis {axis} infers "
                              f"{', '.join(map(str, got))}, not {want}")
        detached.outputs = [Value("out", want, producer=detached)]
        specs.append(PieceSpec(piece.operands, attrs, detached))
    return specs


_INFERRED: dict[tuple, list] = {}


def _infer(node: Node) -> list:
    """``node``'s result types, remembered by op, attributes and operand types (pieces of
    equal shape are common, and some type rules check accumulator bounds at length)."""
    key = (node.op, repr(sorted(node.attrs.items())),
           tuple(None if v is None else v.type for v in node.inputs))
    if key not in _INFERRED:
        if len(_INFERRED) > 4096:
            _INFERRED.clear()
        _INFERRED[key] = node.opdef.infer_node(node)
    return _INFERRED[key]


@dataclass
class Decision:
    """One way to run a node: on core 0 (``kind`` "none"), split by ``kind`` along
    result ``axis`` into ``sizes``, core k computing range k, or whole on every core
    (:data:`COPIES`, one piece a core)."""

    kind: str
    axis: int | None = None
    sizes: tuple[int, ...] = ()
    pieces: list[PieceSpec] = field(default_factory=list, repr=False)

    @property
    def split(self) -> bool:
        """Whether the node is cut into ranges (not one core, not copies)."""
        return self.kind not in ("none", COPIES)

    @property
    def copies(self) -> bool:
        """Whether every core computes the whole result (:data:`COPIES`)."""
        return self.kind == COPIES

    def ranges(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for s in self.sizes:
            out.append((start, start + s))
            start += s
        return out

    def cores(self) -> range:
        return range(len(self.pieces)) if self.split or self.copies else range(1)


NONE = Decision("none")

#: the decision kind where every core computes the whole result from whole operands, so
#: that each core's consumers read it from their own OCM: cheaper than gathering it where
#: it is small to compute and large to move (an attention's value, read whole by every
#: core's queries)
COPIES = "copies"


def copies_of(node: Node, cores: int) -> Decision:
    """``node`` computed whole on each of ``cores`` cores."""
    return Decision(COPIES, pieces=[PieceSpec((), dict(node.attrs), node)] * cores)


# ---- how a core gets an operand ----------------------------------------------------------
HOST = -1          # the producer of graph inputs and host results: they are in DDR


@dataclass(frozen=True)
class Part:
    """Range [lo, hi) along the route's axis of the producer's piece made on ``core``, or
    of its whole value (made on ``core``; HOST: written by the host); ``whole``: the range
    is all of it."""

    core: int
    lo: int
    hi: int
    whole: bool


@dataclass(frozen=True)
class Route:
    """How core ``core`` gets an operand range: a constant cut at compile time
    (``const``), or ``parts``: each the producer's value or piece as it is (``whole``) or a
    ``core_slice`` of it, joined by a ``core_gather`` when there are several.
    A producer split along another axis gives one part per piece (its range of the cut
    axis, joined along the producer's). ``via_gather``: the whole of a split producer's
    result, its pieces gathered on core 0 first; ``joined_in_ddr``: that gather is a view
    of the pieces in DDR (a split reader, the pieces end to end: see
    :func:`bevir.target.schedule.joined_in_ddr`), so each core stores its piece and this
    core loads the whole."""

    core: int
    nbytes: int
    const: bool = False
    axis: int | None = None
    parts: tuple[Part, ...] = ()
    via_gather: bool = False
    joined_in_ddr: bool = False


class Router:
    """Routes operand ranges from the producers' decisions (see :class:`Route`)."""

    def __init__(self, decisions: dict[int, Decision]):
        self.decisions = decisions
        self._sizes: dict[tuple[int, int], dict[int, int]] = {}

    def sizes(self, v: Value) -> dict[int, int]:
        """The bytes of ``v`` each core makes (remembered by value and decision: the
        search asks often)."""
        d = self.decision(v)
        key = (id(v), id(d))
        out = self._sizes.get(key)
        if out is None:
            if d.copies:
                out = {k: v.type.nbytes for k in d.cores()}
            elif d.split:
                out = {k: s.node.output.type.nbytes for k, s in enumerate(d.pieces)}
            else:
                out = {self.home(v): v.type.nbytes}
            self._sizes[key] = out
        return out

    def decision(self, v: Value) -> Decision:
        return self.decisions.get(id(v.producer), NONE) if v.producer is not None else NONE

    @staticmethod
    def host_reads(v: Value) -> bool:
        """Whether the host reads ``v``: a graph output, or an operand of a host node."""
        return (any(o is v for o in v.producer.graph.outputs.values())
                or any(not lowerable(u) for u, _ in v.uses))

    @staticmethod
    def home(v: Value) -> int:
        """The core an unsplit value is made on: 0, or HOST for graph inputs and host
        results."""
        return 0 if v.producer is not None and lowerable(v.producer) else HOST

    def route(self, v: Value, r: tuple[int, int, int] | None, core: int,
              shared: bool = False) -> Route:
        """How ``core`` gets range ``r`` (axis, start, stop; None: all) of ``v``;
        ``shared``: the reader is split over several cores."""
        t = v.type
        if r is None:
            axis, lo, hi = 0, 0, (t.shape[0] if t.rank else 1)
            nbytes = t.nbytes
        else:
            axis, lo, hi = r
            nbytes = t.nbytes // max(t.shape[axis], 1) * (hi - lo)
        whole = r is None or (lo == 0 and hi == t.shape[axis])
        if v.is_const:
            return Route(core, nbytes, const=True)
        d = self.decision(v)
        if d.copies:                       # this core's own copy
            return Route(core, nbytes, axis=axis, parts=(Part(core, lo, hi, whole),))
        if d.split and r is not None and axis == d.axis:
            parts = tuple(Part(k, max(lo, a) - a, min(hi, b) - a, lo <= a and b <= hi)
                          for k, (a, b) in enumerate(d.ranges()) if a < hi and lo < b)
            return Route(core, nbytes, axis=axis, parts=parts)
        if d.split and r is not None:      # along another axis: each piece's range, joined
            parts = tuple(Part(k, lo, hi, whole) for k in range(len(d.pieces)))
            return Route(core, nbytes, axis=axis, parts=parts)
        src = 0 if d.split else self.home(v)
        joined = d.split and shared and all(n == 1 for n in t.shape[:d.axis])
        return Route(core, nbytes, axis=axis, parts=(Part(src, lo, hi, whole),),
                     via_gather=d.split, joined_in_ddr=joined)


# ---- costs -------------------------------------------------------------------------------
class Coster:
    """Cycles of decisions on ``hw`` from the cycle model's formulas: a piece's op cost
    and DMAs, a route's waits for other cores' stores, its slices and joins."""

    def __init__(self, hw: HWConfig):
        self.hw = hw
        self._ops: dict[tuple, OpCost] = {}
        self._nodes: dict[int, tuple[Node, OpCost]] = {}

    def op(self, node: Node) -> OpCost:
        """``node``'s cost, remembered by node and by op, attributes and types (pieces of
        equal shape are common)."""
        known = self._nodes.get(id(node))
        if known is not None and known[0] is node:
            return known[1]
        key = (node.op, tuple(sorted((k, repr(v)) for k, v in node.attrs.items())),
               tuple(None if v is None else v.type for v in node.inputs),
               tuple(v.type for v in node.outputs))
        if key not in self._ops:
            self._ops[key] = op_cost(node, self.hw)
        self._nodes[id(node)] = (node, self._ops[key])
        return self._ops[key]

    def step(self, busy: int, transfers: list[int]) -> int:
        """A kernel step alone: launch + exposed + max(array time, its DMAs)."""
        hw = self.hw
        ddr = sum(dma_cycles(b, hw) for b in transfers)
        body = max(busy, ddr) if hw.double_buffer else busy + ddr
        return hw.launch_cycles + exposed_cycles(transfers, hw) + body

    def copy(self, nbytes: int, remote: list[int]) -> int:
        """A slice or gather kernel: its bytes through the array, ``remote`` ranges read
        from DDR in place."""
        return self.step(math.ceil(2 * nbytes / self.hw.ocm_bytes_per_cycle), remote)

    def store(self, nbytes: int) -> int:
        """A producer's store of what another core reads, and the flag's synchronisation."""
        return dma_cycles(nbytes, self.hw) + self.hw.barrier_cycles

    def route(self, route: Route, sizes: dict[int, int]) -> tuple[int, int, list[int]]:
        """(cycles the core waits for other cores' stores and gathers, cycles of its own
        slice and join kernels, bytes the step itself moves from DDR). ``sizes``: the
        bytes each core made of the producer's result."""
        if route.const:
            return 0, 0, [route.nbytes]
        wait = copies = 0
        moved: list[int] = []
        if route.joined_in_ddr:       # each core stores its piece, this core loads all
            return max(map(self.store, sizes.values())), 0, [route.nbytes]
        if route.via_gather:          # core 0 gathers the pieces, then this core reads it
            remote = [b for k, b in sizes.items() if k != 0]
            wait = max(map(self.store, remote), default=0) + self.copy(sum(sizes.values()),
                                                                      remote)
            sizes = {0: sum(sizes.values())}
        span = sum(p.hi - p.lo for p in route.parts) or 1
        for p in route.parts:
            b = route.nbytes * (p.hi - p.lo) // span
            if p.core != route.core:
                if p.core != HOST:
                    wait = max(wait, (wait if route.via_gather else 0)
                               + self.store(sizes.get(p.core, b)))
                if p.whole:
                    moved.append(b)
                else:
                    copies += self.copy(b, [b])
            elif not p.whole:
                copies += self.copy(b, [])
        if len(route.parts) > 1:
            copies += self.copy(route.nbytes, [])
        return wait, copies, moved


def node_cost(node: Node, d: Decision, router: Router, coster: Coster) -> int:
    """The cycles of ``node`` run as ``d``, its operands routed from their producers'
    current decisions: its busiest core's waits, slices and piece, the cores' DMAs sharing
    the DDR bandwidth; where the host reads the result (a graph output), its store (after
    gathering the pieces on core 0)."""
    per_core = []
    for k in d.cores():
        spec = d.pieces[k] if d.split else None
        ranges = list(spec.ranges) if spec else []
        ranges += [None] * (len(node.inputs) - len(ranges))
        wait = copies = 0
        transfers: list[int] = []
        shared = d.split or d.copies
        for v, r in zip(node.inputs, ranges):
            if v is not None:
                w, c, moved = coster.route(router.route(v, r, k, shared), router.sizes(v))
                wait, copies, transfers = max(wait, w), copies + c, transfers + moved
        per_core.append((wait + copies, coster.op(spec.node if spec else node).terms.busy,
                         transfers))
    out = node.outputs[0]
    if router.host_reads(out):
        if d.split:            # core 0 gathers the pieces and stores the whole result
            remote = [s.node.output.type.nbytes for s in d.pieces[1:]]
            gather = (max(map(coster.store, remote), default=0)
                      + coster.copy(out.type.nbytes, remote)
                      + coster.step(0, [out.type.nbytes]))
            times = _shared(per_core, coster.hw)
            return max(times[0] + gather, *times[1:])
        per_core[0][2].append(out.type.nbytes)
    return max(_shared(per_core, coster.hw))


def _shared(per_core: list[tuple[int, int, list[int]]], hw: HWConfig) -> list[int]:
    """Each core's time when the cores' DMAs start together and share the bandwidth
    equally: a core with ``w`` cycles of DMA alone is done with them after the sum over
    the cores of min(their DMA cycles, ``w``)."""
    ddr = [sum(dma_cycles(b, hw) for b in t) for _, _, t in per_core]
    out = []
    for (before, busy, transfers), w in zip(per_core, ddr):
        shared = sum(min(x, w) for x in ddr)
        body = max(busy, shared) if hw.double_buffer else busy + shared
        out.append(before + hw.launch_cycles + exposed_cycles(transfers, hw) + body)
    return out


# ---- the search --------------------------------------------------------------------------
def unsplittable(node: Node, cores: int) -> str | None:
    """Why ``node`` is not considered for a split, or None."""
    if cores == 1:
        return "one core"
    if not lowerable(node):
        return "runs on the host"
    if not node.opdef.splits:
        return "op declares no split"
    if len(node.outputs) != 1:
        return "several results"
    values = [v for v in node.inputs if v is not None] + node.outputs
    if not node.opdef.pointwise and not all(v.type.dtype.is_int for v in values):
        return "not an integer op (float pieces could round differently)"
    return None


def candidates(node: Node, cores: int) -> tuple[list[Decision], list[dict]]:
    """The decisions ``node`` may take (none first, copies, then each declared kind along
    each result axis it cuts, :meth:`OpDef.region_axes`) and notes on the kinds that do
    not apply."""
    out, notes = [NONE, copies_of(node, cores)], []
    axes = node.opdef.region_axes(node.opdef.ctx(node))
    for kind in node.opdef.splits:
        kind_axes = [a for a, k in sorted(axes.items()) if k == kind]
        if not kind_axes:
            notes.append({"split": kind, "applies": False, "note": "no axis to split"})
        for axis in kind_axes:
            try:
                sizes = balanced(node.output.type.shape[axis], cores)
                if len(sizes) < 2:
                    notes.append({"split": kind, "axis": axis, "applies": False,
                                  "note": f"axis {axis} has one index"})
                    continue
                out.append(Decision(kind, axis, tuple(sizes), pieces_of(node, axis, sizes)))
            except (VerifyError, ValueError, IndexError) as e:
                notes.append({"split": kind, "axis": axis, "applies": False,
                              "note": e.message if isinstance(e, BevirError) else str(e)})
    return out, notes


class Search:
    """Iterated conditional modes (ICM) over the nodes' decisions: each node in turn takes
    the decision that minimises its own cost plus its consumers', given everyone else's,
    until a sweep changes nothing; the objective is the sum of the nodes' costs."""

    def __init__(self, graph: Graph, hw: HWConfig, cores: int, sweeps: int = 4):
        self.graph, self.cores, self.sweeps = graph, cores, sweeps
        self.coster = Coster(hw)
        self.options: dict[int, list[Decision]] = {}
        self.notes: dict[int, list[dict]] = {}
        self.why: dict[int, str] = {}
        for n in graph.nodes:
            why = unsplittable(n, cores)
            if why is None:
                self.options[id(n)], self.notes[id(n)] = candidates(n, cores)
            else:
                self.why[id(n)] = why
        self.decisions: dict[int, Decision] = {}
        self.router = Router(self.decisions)
        self.users = {id(n): list(dict.fromkeys(u for v in n.outputs for u, _ in v.uses))
                      for n in graph.nodes}
        self.operands = {id(n): [v for v in n.inputs if v is not None and not v.is_const]
                         for n in graph.nodes}
        self.copied: dict[int, Decision] = {
            id(n): next(d for d in opts if d.copies) for n in graph.nodes
            if (opts := self.options.get(id(n))) and any(d.copies for d in opts)}
        self.followers = {id(n): self._followers(n) for n in graph.nodes}
        moved = {id(n): [n, *self.followers[id(n)]] for n in graph.nodes}
        self.readers = {id(n): [u for u in dict.fromkeys(
            u for m in moved[id(n)] for u in self.users[id(m)]) if u not in moved[id(n)]]
            for n in graph.nodes}
        self.touched = {id(n): list(dict.fromkeys(
            moved[id(n)] + self.readers[id(n)] + ([u for r in self.readers[id(n)]
                                                    for u in self.users[id(r)]]
                                                   if id(n) in self.copied else [])))
            for n in graph.nodes}
        self._costs: dict[tuple, int] = {}

    def _followers(self, node: Node) -> list[Node]:
        """The views of ``node``'s result (reshapes: :func:`renames`), and theirs, that a
        move to copies copies too: a copied result is only worth it where the reader of
        its view reads it on its own core."""
        out, todo = [], [node]
        while todo:
            for u in self.users[id(todo.pop())]:
                if renames(u) and id(u) in self.copied and u not in out:
                    out.append(u)
                    todo.append(u)
        return out

    def move(self, node: Node, d: Decision) -> dict[int, Decision]:
        """The decisions taking ``d`` for ``node`` sets: a move to copies also copies the
        node's views (:meth:`_followers`) and lets each of their readers take its cheapest
        decision given that (a copy pays only once its readers read it on their cores;
        one node at a time, neither change would be made)."""
        out = {id(node): d}
        if d.copies:
            out.update((id(f), self.copied[id(f)]) for f in self.followers[id(node)])
            old = {k: self.decisions.get(k, NONE) for k in out}
            self.decisions.update(out)
            for u in self.readers[id(node)]:
                opts = self.options.get(id(u))
                if opts:
                    out[id(u)] = min(opts, key=lambda o: self.cost(u, o))
            self.decisions.update(old)
        return out

    def cost(self, node: Node, d: Decision | None = None) -> int:
        """``node``'s cost as ``d`` (default: its decision), its producers as decided
        (remembered by the decisions it depends on)."""
        d = self.decisions.get(id(node), NONE) if d is None else d
        key = (id(node), id(d), tuple(id(self.router.decision(v)) for v in self.operands[id(node)]))
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = node_cost(node, d, self.router, self.coster)
        return cost

    def local(self, node: Node, d: Decision) -> int:
        """``node`` as ``d`` (with what the move sets, :meth:`move`), its followers (as the
        move leaves them) and their consumers as they are."""
        move = self.move(node, d)
        old = {k: self.decisions.get(k, NONE) for k in move}
        self.decisions.update(move)
        total = sum(self.cost(n) for n in self.touched[id(node)])
        self.decisions.update(old)
        return total

    def run(self) -> None:
        """ICM from two starts, every node on one core and every node decided greedily in
        graph order (each the cheapest given its producers, its consumers at their best):
        the cheaper end wins. (From one core alone, a chain whose ops pay only when split
        together stays unsplit.)"""
        ends = []
        for start in (self._none, self._greedy):
            self.decisions.clear()
            start()
            self._sweep()
            ends.append((self.total(), dict(self.decisions)))
        self.decisions.clear()
        self.decisions.update(min(ends, key=lambda e: e[0])[1])        # one core on ties

    def total(self) -> int:
        return sum(self.cost(n) for n in self.graph.nodes)

    def _none(self) -> None:
        pass

    def _greedy(self) -> None:
        for n in self.graph.nodes:
            opts = self.options.get(id(n))
            if opts:
                self.decisions[id(n)] = min(opts, key=lambda d: self._ahead(n, d))

    def _ahead(self, node: Node, d: Decision) -> int:
        """``node`` as ``d`` and each consumer at its best given that (one step ahead)."""
        self.decisions[id(node)] = d
        total = self.cost(node)
        for u in self.users[id(node)]:
            total += min(self.cost(u, o) for o in self.options.get(id(u)) or [NONE])
        del self.decisions[id(node)]
        return total

    def _sweep(self) -> None:
        for _ in range(self.sweeps):
            changed = False
            for n in self.graph.nodes:
                opts = self.options.get(id(n))
                if not opts or len(opts) == 1:
                    continue
                best = min(opts, key=lambda d: self.local(n, d))       # none first on ties
                move = self.move(n, best)
                changed |= any(d is not self.decisions.get(k, NONE) for k, d in move.items())
                self.decisions.update(move)
            if not changed:
                break

    def plan(self) -> dict:
        ops = []
        for n in self.graph.nodes:
            entry = {"node": n.name, "op": n.op, "loc": n.loc}
            if id(n) in self.why:
                ops.append({**entry, "choice": "none", "reason": self.why[id(n)],
                            "candidates": [{"split": "none", "applies": True,
                                            "cycles": self.cost(n)}]})
                continue
            d = self.decisions.get(id(n), NONE)
            cands = [{"split": o.kind, "applies": True, "cycles": self.local(n, o),
                      **({"axis": o.axis, "sizes": list(o.sizes)} if o.split else {})}
                     for o in self.options[id(n)]] + self.notes[id(n)]
            order = {k: i for i, k in enumerate(("none", COPIES, *n.opdef.splits))}
            cands.sort(key=lambda c: (order[c["split"]], c.get("axis", -1)))   # declared order
            ops.append({**entry, "choice": d.kind, **({"axis": d.axis} if d.split else {}),
                        "candidates": cands, "reason": _reason(d, cands)})
        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "graph": self.graph.name,
                "cores": self.cores, "ops": ops}


def search(graph: Graph, hw: HWConfig | None = None, cores: int = 0) -> dict:
    """The plan ``partition{hw, cores}`` would find for ``graph`` (nothing is changed)."""
    hw = Partition(hw=hw, cores=cores).config()
    s = Search(graph, hw, hw.cores)
    s.run()
    return {**s.plan(), "hw": hw.option_text(), "hw_hash": hw.hash}


def _label(c: dict) -> str:
    """A candidate's name: its kind, with the axis where the kind cuts several."""
    return c["split"] if "axis" not in c else f"{c['split']}@{c['axis']}"


def _reason(d: Decision, cands: list[dict]) -> str:
    cost = {_label(c): c["cycles"] for c in cands if c["applies"]}
    cost["none"] = next(c["cycles"] for c in cands if c["split"] == "none")
    if d.copies:
        return (f"{COPIES} x{len(d.pieces)}: {cost[COPIES]:,} cycles with its consumers vs "
                f"{cost['none']:,} on one core")
    if d.split:
        return (f"{d.kind}@{d.axis} x{len(d.sizes)}: {cost[f'{d.kind}@{d.axis}']:,} cycles "
                f"with its consumers vs {cost['none']:,} on one core")
    splits = {k: c for k, c in cost.items() if k not in ("none", COPIES)}
    if not splits:
        return "no declared split applies"
    alt = min(splits, key=splits.get)
    return f"no split is cheaper: best {alt} {splits[alt]:,} vs {cost['none']:,} cycles"


# ---- the rewrite -------------------------------------------------------------------------
class Splitter:
    """Writes decisions into the graph: each split node's pieces, each operand as routed
    (:class:`Router`), and a ``core_gather`` on core 0 of the pieces, which takes the
    node's name, for the consumers that need the whole result (dropped when none does)."""

    def __init__(self, graph: Graph, decisions: dict[int, Decision]):
        self.graph, self.decisions = graph, decisions
        self.split: dict[int, tuple[Decision, list[Value]]] = {}   # gather value -> pieces
        self.copies: dict[int, list[Value]] = {}     # a copied node's result -> each core's
        self.gathers: list[Node] = []
        self.const_slices: dict[tuple, Value] = {}

    def run(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in list(self.graph.nodes):
            d = self.decisions.get(id(node), NONE)
            counts[d.kind] = counts.get(d.kind, 0) + 1
            if d.copies:
                self.copy(node, len(d.pieces))
                continue
            if not d.split:
                node.meta["core"] = 0
                continue
            try:
                self.pieces(node, d)
            except VerifyError as e:
                raise PassError(f"cannot split by '{d.kind}': {e.message}", node=node.name,
                                op=node.op, loc=node.loc) from None
        outputs = {id(v) for v in self.graph.outputs.values()}
        for gather in self.gathers:
            if not gather.output.uses and id(gather.output) not in outputs:
                self.graph.erase(gather)
        return counts

    def pieces(self, node: Node, d: Decision) -> None:
        name = node.output.name
        outs = []
        operands = []            # every core's cuts first, then the joins: a core cuts the
        for core, spec in enumerate(d.pieces):      # ranges others read before it waits for
            ranges = list(spec.ranges) + [None] * (len(node.inputs) - len(spec.ranges))
            operands.append([None if v is None else    # theirs (no core waits on a chain)
                             self.operand(v, r, core, node, f"{name}.c{core}.{i}")
                             for i, (v, r) in enumerate(zip(node.inputs, ranges))])
        operands = [[self.join(*x, node) if isinstance(x, tuple) else x for x in row]
                    for row in operands]
        for core, (spec, inputs) in enumerate(zip(d.pieces, operands)):
            p = self.graph.create_node(node.op, inputs, spec.attrs, loc=node.loc,
                                       names=[f"{name}.c{core}"], before=node)
            p.meta.update(node.meta)
            p.meta["core"] = core
            p.meta["piece"] = {"of": name, "kind": d.kind, "index": core,
                               "pieces": len(d.pieces)}
            outs.append(p.output)
        gather = self.graph.create_node("core_gather", outs, {"axis": d.axis}, loc=node.loc,
                                        names=[f"{name}.gathered"], before=node)
        gather.meta["core"] = 0
        if gather.output.type != node.output.type:
            raise PassError(f"the gathered pieces are {gather.output.type}, not "
                            f"{node.output.type}", node=node.name, op=node.op, loc=node.loc)
        self.graph.replace_node(node, gather.outputs)
        self.graph.rename(gather.output, name)
        self.split[id(gather.output)] = (d, outs)
        self.gathers.append(gather)

    def copy(self, node: Node, cores: int) -> None:
        """``node`` on core 0, and a copy of it on each other core reading that core's
        operands (its own copies where they are copied too)."""
        node.meta["core"] = 0
        node.meta["copy"] = {"of": node.output.name, "index": 0, "copies": cores}
        outs = [node.output]
        for core in range(1, cores):
            inputs = [None if v is None else self.operand(v, None, core, node, "")
                      for v in node.inputs]
            c = self.graph.create_node(node.op, inputs, node.attrs, loc=node.loc,
                                       names=[f"{node.output.name}.c{core}"],
                                       after=outs[-1].producer)
            c.meta.update(node.meta)
            c.meta["core"] = core
            c.meta["copy"] = {**node.meta["copy"], "index": core}
            outs.append(c.output)
        self.copies[id(node.output)] = outs

    def operand(self, v: Value, r, core: int, node: Node, name: str) -> Value | tuple:
        """Core ``core``'s operand: range ``r`` of ``v`` (None: all), as routed. A range of
        another core's piece is cut on that core, so that only the range crosses (the piece
        stays in its core's OCM); a range of a whole value, by ``core`` (in place where the
        value lies in DDR). Ranges of several pieces: (parts, axis, core, name), the join
        :meth:`pieces` makes once every core has cut what the others read."""
        if v.is_const:
            return v if r is None else self.const_slice(v, r)
        copies = self.copies.get(id(v))
        if copies is not None:                # this core's own copy
            return copies[core] if r is None else self.slice(copies[core], *r, core, node,
                                                             name)
        if r is None:
            return v
        split = self.split.get(id(v))
        if split is not None and r[0] == split[0].axis:
            d, pieces = split
            axis, lo, hi = r
            parts = [self.slice(pieces[k], axis, max(lo, a) - a, min(hi, b) - a, k, node,
                                f"{name}.p{k}")
                     for k, (a, b) in enumerate(d.ranges()) if a < hi and lo < b]
            return parts[0] if len(parts) == 1 else (parts, axis, core, name)
        if split is not None:        # cut along another axis: each piece's range, joined
            d, pieces = split
            parts = [self.slice(p, *r, k, node, f"{name}.p{k}") for k, p in enumerate(pieces)]
            return (parts, d.axis, core, name)
        return self.slice(v, *r, core, node, name)

    def slice(self, v: Value, axis: int, lo: int, hi: int, core: int, node: Node,
              name: str) -> Value:
        if lo == 0 and hi == v.type.shape[axis]:
            return v
        s = self.graph.create_node("core_slice", [v], {"axis": axis, "start": lo, "stop": hi},
                                   loc=node.loc, names=[self.graph.unique_name(name)],
                                   before=node)
        s.meta["core"] = core
        return s.output

    def join(self, parts: list[Value], axis: int, core: int, name: str, node: Node) -> Value:
        g = self.graph.create_node("core_gather", parts, {"axis": axis}, loc=node.loc,
                                   names=[self.graph.unique_name(name)], before=node)
        g.meta["core"] = core
        return g.output

    def const_slice(self, v: Value, r) -> Value:
        """A constant's range, cut at compile time (one constant per range)."""
        axis, lo, hi = r
        if lo == 0 and hi == v.type.shape[axis]:
            return v
        key = (v.name, axis, lo, hi)
        if key not in self.const_slices:
            t = _CORE_SLICE.infer(Ctx({"axis": axis, "start": lo, "stop": hi}), v.type)
            data = np.ascontiguousarray(np.take(v.const, np.arange(lo, hi), axis=axis))
            self.const_slices[key] = self.graph.add_const(
                data, self.graph.unique_name(f"{v.name}.{lo}_{hi}"), t)
        return self.const_slices[key]


# ---- plans -------------------------------------------------------------------------------
def check_plan(plan: Any, graph: Graph, cores: int, source: str) -> dict[int, Decision]:
    """The decisions of ``plan`` for this graph's nodes, in order, for ``cores``;
    PassError where it does not fit."""
    def fail(message: str, node: Node | None = None):
        where = {} if node is None else dict(node=node.name, op=node.op, loc=node.loc)
        raise PassError(f"plan {source} does not fit the graph: {message}", **where)
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        fail(f"not a {PLAN_FORMAT} plan")
    if plan.get("version") != PLAN_VERSION:
        fail(f"version {plan.get('version')!r}, this bevir reads {PLAN_VERSION}")
    if plan.get("cores") != cores:
        fail(f"it is for {plan.get('cores')} cores, the pass for {cores}")
    ops = plan.get("ops")
    if not isinstance(ops, list) or len(ops) != len(graph.nodes):
        fail(f"{len(ops) if isinstance(ops, list) else 'no'} op entries for "
             f"{len(graph.nodes)} nodes")
    decisions = {}
    for i, (entry, node) in enumerate(zip(ops, graph.nodes)):
        if (not isinstance(entry, dict)
                or (entry.get("node"), entry.get("op")) != (node.name, node.op)):
            got = (entry.get("node"), entry.get("op")) if isinstance(entry, dict) else entry
            fail(f"entry {i} is {got}, the graph's node {i} is ({node.name!r}, {node.op!r})", node)
        choice = entry.get("choice")
        if choice == "none":
            continue
        if choice == COPIES:
            why = unsplittable(node, cores)
            if why is not None:
                fail(f"'{COPIES}' needs an op the search considers; this one: {why}", node)
            decisions[id(node)] = copies_of(node, cores)
            continue
        if choice not in node.opdef.splits:
            fail(f"split '{choice}' is not one of the op's {list(node.opdef.splits)}", node)
        chosen = next((c for c in entry.get("candidates", ()) if isinstance(c, dict)
                       and c.get("split") == choice and c.get("applies")
                       and c.get("axis") == entry.get("axis", c.get("axis"))), {})
        axis, sizes = chosen.get("axis"), chosen.get("sizes")
        cuts = [a for a, k in node.opdef.region_axes(node.opdef.ctx(node)).items()
                if k == choice]
        if axis not in cuts:
            fail(f"split '{choice}' cuts axis {axis!r}, the op's axes are {cuts}", node)
        dim = node.output.type.shape[axis]
        if not (isinstance(sizes, list) and 2 <= len(sizes) <= cores
                and all(isinstance(s, int) and s >= 1 for s in sizes) and sum(sizes) == dim):
            fail(f"sizes {sizes!r} do not cut axis {axis} ({dim}) into 2..{cores} pieces", node)
        try:
            decisions[id(node)] = Decision(choice, axis, tuple(sizes),
                                           pieces_of(node, axis, sizes))
        except VerifyError as e:
            fail(f"cannot split by '{choice}': {e.message}", node)
    return decisions


def read_plan(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise PassError(f"cannot read partition plan {path}: {e or 'nested too deeply'}") from None


def save_plan(plan: dict, path: str | Path) -> None:
    write_atomic(path, json.dumps(plan, indent=1) + "\n")


def plan_of(graph: Graph) -> dict | None:
    """The partition plan of a partitioned graph (None if it is not)."""
    return graph.meta.get(META_KEY)


#: the configuration a partition without ``hw`` costs with: QC-U, 4 cores
DEFAULT_HW = "qc-u-4c"


class Partition(Pass):
    """Split each integer op worth it across the cores (see the module docstring).
    ``hw``: the hardware config whose cycle model gives the costs (default QC-U x4);
    ``cores``: 0 for the config's, else at most as many; ``plan``: a plan JSON file to
    replay instead of searching; ``sweeps``: the search's passes over the graph."""

    name = "partition"
    description = "split integer ops across cores by their declared splits and the cycle model"

    hw: HWConfig | None = None
    cores: int = 0
    plan: str = ""
    sweeps: int = 4

    def config(self) -> HWConfig:
        hw = self.hw or HWConfig.preset(DEFAULT_HW)
        if self.cores < 0 or (self.hw is not None and self.cores > hw.cores):
            raise PassError(f"pass 'partition': cores={self.cores} must be 0 (the config's) "
                            f"to {hw.cores} ({hw.option_text()})")
        return hw.with_cores(self.cores) if self.cores else hw

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if META_KEY in graph.meta:
            raise PassError(f"graph @{graph.name} is partitioned already")
        if self.sweeps < 1:
            raise PassError(f"pass 'partition': sweeps={self.sweeps} must be >= 1")
        hw = self.config()
        if self.plan:
            plan = read_plan(self.plan)
            decisions = check_plan(plan, graph, hw.cores, self.plan)
        else:
            found = Search(graph, hw, hw.cores, self.sweeps)
            found.run()
            plan, decisions = found.plan(), found.decisions
        plan = {**plan, "hw": hw.option_text(), "hw_hash": hw.hash}
        for kind, n in Splitter(graph, decisions).run().items():
            self.stat({"none": "unsplit", COPIES: "copied"}.get(kind, f"split-{kind}"), n)
        graph.meta[META_KEY] = plan


def format_plan(plan: dict) -> str:
    """The plan as text: a summary, then one line per op considered for a split (its
    choice, cycles, and every candidate), then the reason."""
    ops = plan["ops"]
    considered = [e for e in ops if len(e["candidates"]) > 1]
    kinds: dict[str, int] = {}
    for e in ops:
        if e["choice"] != "none":
            kinds[e["choice"]] = kinds.get(e["choice"], 0) + 1
    skipped: dict[str, int] = {}
    for e in ops:
        if len(e["candidates"]) == 1:
            skipped[e["reason"]] = skipped.get(e["reason"], 0) + 1
    lines = [f"partition of @{plan['graph']} for {plan['cores']} cores ({plan.get('hw', '-')})",
             f"  ops split or copied: {sum(kinds.values())} of {len(ops)} "
             f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'}); "
             f"considered {len(considered)}; not considered: "
             + (", ".join(f"{n} {r}" for r, n in sorted(skipped.items())) or "none")]
    if "modelled" in plan:
        m = plan["modelled"]
        one = m.get("one_core", m.get("one_core_at_least"))
        at_least = "" if "one_core" in m else "at least "
        lines.append(f"  modelled makespan (planned, the figure bevir sim reports): "
                     f"{at_least}{one:,} cycles on one core -> {m['partitioned']:,} on "
                     f"{plan['cores']} ({at_least}{one / max(m['partitioned'], 1):.2f}x)"
                     + ("" if m["kept"] else "; the split is not kept (not faster)")
                     + ("" if at_least == "" else " (one core's MAC roofline: not planned)"))
    for e in considered:
        cands = "  ".join(f"{_label(c)} {c['cycles']}" if c["applies"] else f"{_label(c)} -"
                          for c in e["candidates"])
        lines += [f"  {e['op']} {e['node']}" + (f"  ({e['loc']})" if e["loc"] else ""),
                  f"      -> {'none: ' * (e['choice'] == 'none')}{e['reason']}",
                  f"      cycles with its consumers: {cands}"]
    return "\n".join(lines)
