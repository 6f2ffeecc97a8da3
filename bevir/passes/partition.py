"""partition{cores=N}: split the integer ops of a lowered graph across cores.

Each op declares how it may be split (``OpDef.splits``: "rows", "batch", "channels",
"columns", "queries"; ``split_axis`` / ``split_piece`` say which result axis and which
operand ranges). For every node the pass models each candidate, one core (``none``) and
each declared kind cut into balanced ranges, with a cost model: given a hardware config
(``hw="QC-U 8MB 16MAC x4"``), :class:`HWCost`, the cycle model's own cycles of each piece
on one core (bevir/sim/cycles.py); without one, :class:`SplitCost`, ``max(MACs /
macs_per_cycle, bytes / bytes_per_cycle)``, a placeholder. Any :class:`CostModel` will do. A split costs its busiest core plus a barrier, counting what each piece reads
(halo rows, replicated weights); the cheapest candidate wins, one core on a tie.

A chosen split becomes explicit ops (bevir/ops/multicore.py): per core ``core_slice`` of
the operands it cuts, the same op on them, then ``barrier`` and ``core_gather``, which takes
the node's name. Every node's core is in ``node.meta["core"]``: the pieces' and their
slices' their own, every other node (unsplit ops, gathers) core 0; barriers span all cores
and carry none. The plan, per node every candidate with its cycles, the choice and why, is
``graph.meta["partition"]`` (JSON); ``partition{cores=N, plan=FILE}`` replays a saved plan
without searching. Results are bit-identical: the pieces compute the same integers.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..errors import BevirError, PassError, VerifyError
from ..hw import HWConfig
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..ir.opdef import Ctx, get_op
from ..sim.cycles import cost_node
from .analysis import AnalysisManager
from .core import Pass

META_KEY = "partition"
PLAN_FORMAT = "bevir-partition"
PLAN_VERSION = 1

_CORE_SLICE = get_op("core_slice")

register_meta_key(META_KEY, dict, doc="the partition plan of a partitioned graph "
                  "(bevir.passes.partition)")


class CostModel(Protocol):
    """What the pass asks of a cost model (the cycle model can stand in)."""

    def cycles(self, node: Node) -> int: ...

    def piece_cycles(self, node: Node, piece: PieceSpec) -> int:
        """The cycles of one core's ``piece`` of ``node``."""

    def barrier(self, cores: int) -> int: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SplitCost:
    """The modelled cycles of one node on one core: max(MACs / macs_per_cycle, bytes read
    and written / bytes_per_cycle), from ``OpDef.cost``; a barrier costs barrier_cycles.
    Defaults are placeholders (16x16 PEs x 16 MACs, 64 bytes a cycle), not measurements."""

    macs_per_cycle: int = 4096
    bytes_per_cycle: int = 64
    barrier_cycles: int = 500

    def cycles(self, node: Node) -> int:
        cost = node.opdef.cost(node)
        compute = -(-cost["macs"] // self.macs_per_cycle)
        memory = -(-(cost["bytes_read"] + cost["bytes_written"]) // self.bytes_per_cycle)
        return max(compute, memory)

    def piece_cycles(self, node: Node, piece: PieceSpec) -> int:
        return self.cycles(piece.node)

    def barrier(self, cores: int) -> int:
        return self.barrier_cycles

    def describe(self) -> dict[str, Any]:
        return {"model": "max(macs / macs_per_cycle, bytes / bytes_per_cycle) per piece; "
                         "a split: its busiest core + barrier",
                "macs_per_cycle": self.macs_per_cycle, "bytes_per_cycle": self.bytes_per_cycle,
                "barrier_cycles": self.barrier_cycles}


@dataclass(frozen=True)
class HWCost:
    """The cycle model's costs (bevir/sim/cycles.py ``cost_node``): a node's own cycles on
    one core of ``hw`` (launch + max(compute, OCM, DDR) + exposed DMA latency, cheapest PE
    mapping); a barrier costs ``hw.barrier_cycles``. ``graph_io``: ids of the graph's inputs
    and outputs, which the model moves from and to DDR."""

    hw: HWConfig
    graph_io: frozenset[int] = frozenset()

    @classmethod
    def of(cls, graph: Graph, hw: HWConfig) -> HWCost:
        return cls(hw, frozenset(id(v) for v in [*graph.inputs, *graph.outputs.values()]))

    def cycles(self, node: Node) -> int:
        return cost_node(node, self.hw, set(self.graph_io))["own"]

    def piece_cycles(self, node: Node, piece: PieceSpec) -> int:
        """As the model costs the piece in the partitioned graph: an operand the piece does
        not cut is the node's own (a weight or graph input stays in DDR); a cut one comes
        from a ``core_slice``."""
        ranges = list(piece.ranges) + [None] * (len(node.inputs) - len(piece.ranges))
        io = set(self.graph_io) | {
            id(p) for p, v, r in zip(piece.node.inputs, node.inputs, ranges)
            if r is None and v is not None and (v.is_const or id(v) in self.graph_io)}
        return cost_node(piece.node, self.hw, io)["own"]

    def barrier(self, cores: int) -> int:
        return self.hw.barrier_cycles

    def describe(self) -> dict[str, Any]:
        return {"model": "the cycle model's own cycles per piece on one core (bevir/sim/"
                         "cycles.py); a split: its busiest core + barrier",
                "hw": self.hw.describe(), "hw_name": self.hw.name, "hw_hash": self.hw.hash,
                "barrier_cycles": self.hw.barrier_cycles}


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


def pieces_of(node: Node, kind: str, axis: int, sizes: list[int]) -> list[PieceSpec]:
    """The pieces of ``node`` split by ``kind`` into ``sizes`` along result ``axis``, type
    checked: each infers the type of its range of the result (VerifyError otherwise)."""
    opdef, out = node.opdef, node.output.type
    ctx = opdef.ctx(node)
    specs, start = [], 0
    for size in sizes:
        piece = opdef.split_piece(ctx, kind, start, start + size)
        types = [None if v is None else v.type for v in node.inputs]
        for i, r in enumerate(piece.operands):
            if r is not None and types[i] is not None:
                types[i] = _CORE_SLICE.infer(Ctx(dict(zip(("axis", "start", "stop"), r))),
                                             types[i])
        attrs = opdef.check_attrs({**node.attrs, **piece.attrs})
        detached = _detached(node.op, types, attrs, [])
        got = opdef.infer_node(detached)
        want = out.with_(shape=out.shape[:axis] + (size,) + out.shape[axis + 1:])
        if got != [want]:
            raise VerifyError(f"piece [{start}, {start + size}) of axis {axis} infers "
                              f"{', '.join(map(str, got))}, not {want}")
        detached.outputs = [Value("out", want, producer=detached)]
        detached.meta["piece"] = {"of": node.output.name, "kind": kind, "index": len(specs),
                                  "pieces": len(sizes)}
        specs.append(PieceSpec(piece.operands, attrs, detached))
        start += size
    return specs


# ---- the search --------------------------------------------------------------------------
def unsplittable(node: Node, cores: int) -> str | None:
    """Why ``node`` is not considered for a split, or None."""
    if cores == 1:
        return "one core"
    if not node.opdef.splits:
        return "op declares no split"
    if len(node.outputs) != 1:
        return "several results"
    values = [v for v in node.inputs if v is not None] + node.outputs
    if not all(v.type.dtype.is_int for v in values):
        return "not an integer op (float pieces could round differently)"
    return None


def candidate(node: Node, kind: str, cores: int, cost: CostModel, whole_read: int) -> dict:
    """One split candidate: its axis, sizes, cycles per core and what it reads twice."""
    try:
        axis = node.opdef.split_axis(node.opdef.ctx(node), kind)
        if axis is None:
            return {"split": kind, "applies": False, "note": "no axis to split"}
        sizes = balanced(node.output.type.shape[axis], cores)
        if len(sizes) < 2:
            return {"split": kind, "applies": False, "note": f"axis {axis} has one index"}
        specs = pieces_of(node, kind, axis, sizes)
    except (VerifyError, ValueError, IndexError) as e:
        return {"split": kind, "applies": False,
                "note": e.message if isinstance(e, BevirError) else str(e)}
    per_core = [cost.piece_cycles(node, s) for s in specs]
    read = sum(s.node.opdef.cost(s.node)["bytes_read"] for s in specs)
    return {"split": kind, "applies": True, "axis": axis, "sizes": sizes, "per_core": per_core,
            "cycles": max(per_core) + cost.barrier(len(sizes)),
            "extra_bytes_read": read - whole_read}


def plan_node(node: Node, cores: int, cost: CostModel) -> dict:
    """The plan entry of one node: every candidate, the cheapest, and why."""
    whole = cost.cycles(node)
    entry = {"node": node.name, "op": node.op, "loc": node.loc,
             "candidates": [{"split": "none", "applies": True, "cycles": whole}]}
    why = unsplittable(node, cores)
    if why is not None:
        return {**entry, "choice": "none", "reason": why}
    read = node.opdef.cost(node)["bytes_read"]
    entry["candidates"] += [candidate(node, k, cores, cost, read) for k in node.opdef.splits]
    best = min((c for c in entry["candidates"] if c["applies"]), key=lambda c: c["cycles"])
    splits = [c for c in entry["candidates"][1:] if c["applies"]]
    if best["split"] != "none":
        reason = (f"{best['split']} x{len(best['sizes'])}: {best['cycles']} cycles (busiest "
                  f"core + barrier; {best['extra_bytes_read']:,} bytes more read: halos, "
                  f"replicated operands) vs {whole} on one core")
    elif splits:
        alt = min(splits, key=lambda c: c["cycles"])
        reason = f"no split is cheaper: best {alt['split']} {alt['cycles']} vs {whole} cycles"
    else:
        reason = "no declared split applies"
    return {**entry, "choice": best["split"], "reason": reason}


def search(graph: Graph, cores: int, cost: CostModel) -> dict:
    """The partition plan of ``graph`` for ``cores`` cores (nothing is changed)."""
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "graph": graph.name, "cores": cores,
            "cost": cost.describe(), "ops": [plan_node(n, cores, cost) for n in graph.nodes]}


# ---- the rewrite -------------------------------------------------------------------------
def split_node(graph: Graph, node: Node, kind: str, axis: int, sizes: list[int]) -> None:
    """Replace ``node`` by its pieces on cores 0..len(sizes)-1, a barrier and a gather that
    takes the node's result name."""
    name = node.output.name
    specs = pieces_of(node, kind, axis, sizes)
    pieces = []
    for core, spec in enumerate(specs):
        inputs = list(node.inputs)
        for i, r in enumerate(spec.ranges):
            if r is not None and inputs[i] is not None:
                s = graph.create_node("core_slice", [inputs[i]],
                                      dict(zip(("axis", "start", "stop"), r)), loc=node.loc,
                                      names=[f"{name}.c{core}.{i}"], before=node)
                s.meta["core"] = core
                inputs[i] = s.output
        p = graph.create_node(node.op, inputs, spec.attrs, loc=node.loc,
                              names=[f"{name}.c{core}"], before=node)
        p.meta.update(node.meta)
        p.meta["core"] = core
        p.meta["piece"] = dict(spec.node.meta["piece"])
        pieces.append(p.output)
    done = graph.create_node("barrier", pieces, loc=node.loc, before=node,
                             names=[f"{name}.c{k}.done" for k in range(len(pieces))])
    gather = graph.create_node("core_gather", done.outputs, {"axis": axis}, loc=node.loc,
                               names=[f"{name}.gathered"], before=node)
    gather.meta["core"] = 0
    if gather.output.type != node.output.type:
        raise PassError(f"the gathered pieces are {gather.output.type}, not "
                        f"{node.output.type}", node=node.name, op=node.op, loc=node.loc)
    graph.replace_node(node, gather.outputs)
    graph.rename(gather.output, name)


def check_plan(plan: Any, graph: Graph, cores: int, source: str) -> None:
    """PassError unless ``plan`` is a plan of this graph's nodes, in order, for ``cores``."""
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
    for i, (entry, node) in enumerate(zip(ops, graph.nodes)):
        if not isinstance(entry, dict) or (entry.get("node"), entry.get("op")) != (node.name, node.op):
            got = (entry.get("node"), entry.get("op")) if isinstance(entry, dict) else entry
            fail(f"entry {i} is {got}, the graph's node {i} is ({node.name!r}, {node.op!r})", node)
        choice = entry.get("choice")
        if choice == "none":
            continue
        if choice not in node.opdef.splits:
            fail(f"split '{choice}' is not one of the op's {list(node.opdef.splits)}", node)
        chosen = next((c for c in entry.get("candidates", ()) if isinstance(c, dict)
                       and c.get("split") == choice), {})
        axis, sizes = chosen.get("axis"), chosen.get("sizes")
        if axis != node.opdef.split_axis(node.opdef.ctx(node), choice):
            fail(f"split '{choice}' cuts axis {axis!r}, the op's axis is "
                 f"{node.opdef.split_axis(node.opdef.ctx(node), choice)!r}", node)
        dim = node.output.type.shape[axis]
        if not (isinstance(sizes, list) and 2 <= len(sizes) <= cores
                and all(isinstance(s, int) and s >= 1 for s in sizes) and sum(sizes) == dim):
            fail(f"sizes {sizes!r} do not cut axis {axis} ({dim}) into 2..{cores} pieces", node)


def read_plan(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PassError(f"cannot read partition plan {path}: {e}") from None


def apply_plan(graph: Graph, plan: dict) -> dict[str, int]:
    """Split the graph's nodes as ``plan`` (checked) says; counts per kind."""
    counts: dict[str, int] = {}
    for entry, node in list(zip(plan["ops"], graph.nodes)):
        choice = entry["choice"]
        counts[choice] = counts.get(choice, 0) + 1
        if choice == "none":
            node.meta["core"] = 0
            continue
        chosen = next(c for c in entry["candidates"] if c["split"] == choice)
        try:
            split_node(graph, node, choice, chosen["axis"], chosen["sizes"])
        except VerifyError as e:
            raise PassError(f"cannot split by '{choice}': {e.message}", node=node.name,
                            op=node.op, loc=node.loc) from None
    return counts


class Partition(Pass):
    """Split each integer op worth it across ``cores`` cores (see the module docstring);
    ``plan``: a plan JSON file to replay instead of searching. ``hw``: a hardware config
    (a preset or e.g. "QC-U 8MB 16MAC x4") whose cycle model gives the costs
    (:class:`HWCost`); without it the options of :class:`SplitCost` do. ``cores``: 0 means
    the config's cores, or 4 without one."""

    name = "partition"
    description = "split integer ops across cores by their declared splits and a cost model"

    cores: int = 0
    plan: str = ""
    hw: str = ""
    macs_per_cycle: int = 4096
    bytes_per_cycle: int = 64
    barrier_cycles: int = 500

    def hw_config(self) -> HWConfig | None:
        if not self.hw:
            return None
        placeholders = [f.name for f in dataclasses.fields(self) if f.name in
                        ("macs_per_cycle", "bytes_per_cycle", "barrier_cycles")
                        and getattr(self, f.name) != f.default]
        if placeholders:
            raise PassError(f"pass 'partition': {', '.join(placeholders)} configure the "
                            f"placeholder cost; with hw={self.hw!r} the config does")
        return HWConfig.parse(self.hw)

    def core_count(self, hw: HWConfig | None) -> int:
        if hw is not None and self.cores > hw.cores:
            raise PassError(f"pass 'partition': {self.cores} cores, the config "
                            f"{hw.describe()} has {hw.cores}")
        return self.cores or (hw.cores if hw is not None else 4)

    def cost_model(self, graph: Graph, hw: HWConfig | None) -> CostModel:
        if hw is not None:
            return HWCost.of(graph, hw)
        return SplitCost(self.macs_per_cycle, self.bytes_per_cycle, self.barrier_cycles)

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if self.cores < 0 or self.macs_per_cycle < 1 or self.bytes_per_cycle < 1:
            raise PassError(f"pass 'partition': cores {self.cores} must be >= 0 (0: the "
                            "config's), macs_per_cycle and bytes_per_cycle >= 1")
        if META_KEY in graph.meta:
            raise PassError(f"graph @{graph.name} is partitioned already")
        hw = self.hw_config()
        cores = self.core_count(hw)
        if self.plan:
            plan = read_plan(self.plan)
            check_plan(plan, graph, cores, self.plan)
        else:
            plan = search(graph, cores, self.cost_model(graph, hw))
        for kind, n in apply_plan(graph, plan).items():
            self.stat("unsplit" if kind == "none" else f"split-{kind}", n)
        graph.meta[META_KEY] = plan


def plan_of(graph: Graph) -> dict | None:
    """The partition plan of a partitioned graph (None if it is not)."""
    return graph.meta.get(META_KEY)


def save_plan(plan: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(plan, indent=1) + "\n")


def format_plan(plan: dict) -> str:
    """The plan as text: a summary, then one line per op considered for a split (its
    choice, cycles, and every candidate), then the reason."""
    ops = plan["ops"]
    considered = [e for e in ops if len(e["candidates"]) > 1]
    split = [e for e in ops if e["choice"] != "none"]
    kinds: dict[str, int] = {}
    for e in split:
        kinds[e["choice"]] = kinds.get(e["choice"], 0) + 1
    cycles = lambda e, s: next(c["cycles"] for c in e["candidates"] if c["split"] == s)  # noqa: E731
    before = sum(cycles(e, "none") for e in ops)
    after = sum(cycles(e, e["choice"]) for e in ops)
    skipped: dict[str, int] = {}
    for e in ops:
        if len(e["candidates"]) == 1:
            skipped[e["reason"]] = skipped.get(e["reason"], 0) + 1
    cost = plan["cost"]
    lines = [f"partition of @{plan['graph']} for {plan['cores']} cores "
             f"({', '.join(f'{k}={v}' for k, v in cost.items() if k != 'model')})",
             f"  ops split: {len(split)} of {len(ops)} "
             f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'}); "
             f"considered {len(considered)}; not considered: "
             + (", ".join(f"{n} {r}" for r, n in sorted(skipped.items())) or "none"),
             f"  modelled cycles, op after op: {before:,} on one core -> {after:,} "
             f"({before / max(after, 1):.2f}x)"]
    for e in considered:
        cands = "  ".join(f"{c['split']} {c['cycles']}" if c["applies"] else f"{c['split']} -"
                          for c in e["candidates"])
        lines += [f"  {e['op']} {e['node']}" + (f"  ({e['loc']})" if e["loc"] else ""),
                  f"      -> {'none: ' * (e['choice'] == 'none')}{e['reason']}",
                  f"      cycles: {cands}"]
    return "\n".join(lines)
