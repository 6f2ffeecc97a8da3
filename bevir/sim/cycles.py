"""The GPNPU cycle model: cycles per op per core from the op's declared work and a HWConfig.

    profile = model(graph, HWConfig.parse("QC-U 8MB 16MAC x4"))
    profile.write("out/")     # profile_core{i}.json, summary.json, timeline.png, roofline.png

Per op (docs/target.md gives the formulas and worked numbers):

    mac     = batch x prod ceil(extent / unit) x serial     for one of the op's PE mappings
    alu     = ceil(alu_ops / (PEs x alu_ops_per_pe))
    compute = ceil((mac + alu) / efficiency[op class])      one instruction stream per core
    ocm     = ceil(array bytes / OCM bytes per cycle)       array bytes: operands + results
                                                            + max(0, tile weight bytes x
                                                              passes - weight bytes)
    ddr     = sum over DDR tensors of set-up + ceil(bytes / burst) x burst / DDR share
    own     = launch + max(compute, ocm, ddr) + exposed     exposed: DDR latency + one burst
                                                            (double buffering hides the rest)

The DDR share is the DDR bandwidth over the cores streaming at once: the pieces of a split
op (``node.meta["piece"]``) run and stream together, any other op streams alone. The DDR
tensors of an op in an unplanned graph are its weights, graph inputs and outputs (all its
tensors when they do not fit the OCM); in a memory-planned graph they are what the plan says
(:func:`planned_tensors`): dma_copy transfers, streamed ops, resident tensors loaded once.

The op's mapping is the one with the fewest own cycles (memory terms included: a mapping
that computes faster but re-reads more weights can lose).

An op runs on core ``node.meta["core"]`` (0 when absent), after its producers; one on
another core adds the barrier cost. ``TotalCycles`` = wait + own, as in the vendor's
per-core profiles, so a core's records sum to its finishing time.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import BevirError
from ..hw import HWConfig
from ..ir.graph import Graph, Node
from ..ir.opdef import get_op
from ..ops.cost import PEMapping, Work, work_of


class CycleModelError(BevirError):
    """The cycle model cannot place or cost an op (e.g. its core does not exist)."""


BOUNDS = ("compute", "alu", "ocm", "ddr", "barrier", "launch", "view")


@dataclass
class OpRecord:
    """One op on one core. ``terms``: the cycle terms; ``bound``: the largest of them."""

    index: int
    name: str
    op: str
    loc: str
    core: int
    op_class: str
    mapping: str | None
    macs: int
    bytes: dict[str, int]
    terms: dict[str, int]
    own_cycles: int
    wait_cycles: int
    start: int
    bound: str
    utilisation: float
    notes: dict = field(default_factory=dict)

    @property
    def total_cycles(self) -> int:
        return self.wait_cycles + self.own_cycles

    @property
    def end(self) -> int:
        return self.start + self.own_cycles

    def to_json(self) -> dict:
        d = asdict(self)
        d["data"] = {"TotalCycles": self.total_cycles, "OwnCycles": self.own_cycles,
                     "WaitCycles": self.wait_cycles,
                     **{f"{k.capitalize()}Cycles": v for k, v in self.terms.items()}}
        return d


# ---- the terms --------------------------------------------------------------------------
def unit_size(unit: str, hw: HWConfig) -> int:
    return {"rows": hw.pe_rows, "cols": hw.pe_cols, "pes": hw.pes, "lanes": hw.macs_per_pe,
            "macs": hw.peak_macs_per_cycle}[unit]


def mapping_cycles(m: PEMapping, hw: HWConfig) -> tuple[int, int]:
    """(cycles, weight passes) of one mapping: batch x prod ceil(extent / unit) x serial;
    a pass is a sweep of the array along the loops that do not split the weight."""
    tiles = [-(-e // unit_size(u, hw)) for e, u in m.loops]
    passes = math.prod(t for i, (t, (_, u)) in enumerate(zip(tiles, m.loops))
                       if u != "lanes" and i not in m.weight_loops)
    return m.batch * math.prod(tiles) * m.serial, m.batch * passes


def dma_cycles(nbytes: int, hw: HWConfig, streams: int = 1) -> int:
    """One DMA transfer DDR <-> OCM: set-up plus whole bursts at this core's share of the
    DDR bandwidth, ``streams`` cores moving data at once (the pieces of one split op)."""
    if nbytes <= 0:
        return 0
    bursts = -(-nbytes // hw.dma_burst_bytes)
    share = hw.ddr_bytes_per_cycle / max(1, min(streams, hw.cores))
    return hw.dma_setup_cycles + math.ceil(bursts * hw.dma_burst_bytes / share)


def streams_of(node: Node) -> int:
    """How many cores stream DDR while ``node`` runs: its split's pieces, else one."""
    piece = node.meta.get("piece")
    return piece["pieces"] if piece else 1


def ddr_tensors(node: Node, graph_io: set[int], hw: HWConfig) -> list[int]:
    """Bytes of each tensor an op of an unplanned graph moves between DDR and OCM:
    constants (weights), graph inputs and outputs; all operands and results when they do
    not fit the core's OCM."""
    ins = [v for v in node.inputs if v is not None]
    spill = sum(v.type.nbytes for v in node.tensors()) > hw.ocm_per_core
    return [v.type.nbytes for v in ins + node.outputs
            if spill or v.is_const or id(v) in graph_io]


def planned_tensors(node: Node, graph_io: set[int], loaded: set[int]) -> list[int]:
    """Bytes of each tensor an op of a memory-planned graph moves between DDR and OCM: a
    ``dma_copy`` its tensor; a streamed op (``meta["stream"]``) its operands and results
    in DDR; the first reader of a constant or graph input held in OCM loads it once (a
    prologue charged to it), the producer of a graph output held in OCM stores it. Every
    other operand is already in OCM."""
    if node.op == "dma_copy":
        return [node.inputs[0].type.nbytes]
    values = node.tensors()
    if "stream" in node.meta:
        return [v.type.nbytes for v in values if v.meta.get("mem") == "ddr"]
    out = []
    for v in values:
        resident = v.meta.get("mem") != "ddr" and (v.is_const or id(v) in graph_io)
        if resident and id(v) not in loaded:
            loaded.add(id(v))
            out.append(v.type.nbytes)
    return out


def cost_node(node: Node, hw: HWConfig, graph_io: set[int],
              transfers: list[int] | None = None) -> dict:
    """The cycle terms of one op on one core (no waits), for its cheapest mapping.
    ``transfers``: the bytes of each tensor it moves from or to DDR (default: as in an
    unplanned graph, :func:`ddr_tensors`)."""
    op = get_op(node.op)
    work, cost = work_of(op, op.ctx(node)), op.cost(node)
    moved = {"read": cost["bytes_read"], "written": cost["bytes_written"]}
    # a streamed slice or gather has all its tensors in DDR, addressed there in place
    if work.view or (op.in_place_ranges and "stream" in node.meta):
        return dict(work=work, cost=cost, mapping=None, terms={}, own=0, bound="view",
                    bytes={**moved, "array": 0, "ddr": 0})
    if transfers is None:
        transfers = ddr_tensors(node, graph_io, hw)
    streams = streams_of(node)
    options = [terms_of(work, m, moved, transfers, hw, streams)
               for m in work.mappings or (None,)]
    best = min(options, key=lambda r: r["own"])           # first on ties
    return dict(work=work, cost=cost, **best)


def terms_of(work: Work, mapping: PEMapping | None, moved: dict, transfers: list[int],
             hw: HWConfig, streams: int = 1) -> dict:
    """The terms of one mapping (None: no MACs) and the op's cycles with it."""
    mac, passes = mapping_cycles(mapping, hw) if mapping else (0, 0)
    alu = -(-work.alu_ops // (hw.pes * hw.alu_ops_per_pe))
    compute = math.ceil((mac + alu) / hw.efficiency_of(work.op_class))
    rebroadcast = max(0, work.tile_weight_bytes * passes - work.weight_bytes)
    array = moved["read"] + moved["written"] + rebroadcast
    ocm = math.ceil(array / hw.ocm_bytes_per_cycle)
    ddr = sum(dma_cycles(b, hw, streams) for b in transfers)
    exposed = (hw.ddr_latency_cycles
               + dma_cycles(min(max(transfers), hw.dma_burst_bytes), hw, streams)
               if transfers else 0)
    if hw.double_buffer:
        own = hw.launch_cycles + max(compute, ocm, ddr) + exposed
    else:                                   # load, then compute: nothing overlaps the DMA
        own = hw.launch_cycles + max(compute, ocm) + ddr + exposed
    terms = {"mac": mac, "alu": alu, "compute": compute, "ocm": ocm, "ddr": ddr,
             "exposed": exposed, "launch": hw.launch_cycles}
    return dict(mapping=mapping, terms=terms, own=own,
                bound=bound_of(mac, alu, compute, ocm, ddr),
                bytes={**moved, "array": array, "ddr": sum(transfers)})


def bound_of(mac: int, alu: int, compute: int, ocm: int, ddr: int) -> str:
    """What the op waits on: the largest overlapping term (launch when all are 0)."""
    if max(compute, ocm, ddr) == 0:
        return "launch"
    top = max((compute, 2, "compute"), (ocm, 1, "ocm"), (ddr, 0, "ddr"))[2]
    return ("compute" if mac >= alu else "alu") if top == "compute" else top


# ---- the schedule -----------------------------------------------------------------------
def core_of(node: Node, hw: HWConfig) -> int:
    core = node.meta.get("core", 0)
    if not isinstance(core, int) or not 0 <= core < hw.cores:
        raise CycleModelError(f"core {core!r} is not one of the {hw.cores} cores of "
                              f"{hw.describe()}", node=node.name, op=node.op, loc=node.loc)
    return core


def model(graph: Graph, hw: HWConfig) -> Profile:
    """Model every op of ``graph`` on ``hw``, in graph order, each core in sequence."""
    graph_io = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs.values()}
    planned, loaded = "memory_plan" in graph.meta, set()
    free = [0] * hw.cores
    done: dict[int, tuple[int, int]] = {}           # value id -> (end, core)
    records = []
    for i, node in enumerate(graph.nodes):
        core = core_of(node, hw)
        r = cost_node(node, hw, graph_io,
                      planned_tensors(node, graph_io, loaded) if planned else None)
        ready = [done[id(v)][0] + (hw.barrier_cycles if done[id(v)][1] != core else 0)
                 for v in node.inputs if v is not None and id(v) in done]
        start = max([free[core]] + ready)
        wait = start - free[core]
        bound = "barrier" if wait > r["own"] else r["bound"]
        macs = r["cost"]["macs"]
        util = macs / (r["own"] * hw.peak_macs_per_cycle) if r["own"] else 0.0
        rec = OpRecord(i, node.name, node.op, node.loc, core, r["work"].op_class,
                       r["mapping"].name if r["mapping"] else None, macs, r["bytes"],
                       r["terms"], r["own"], wait, start, bound, util, dict(r["work"].notes))
        records.append(rec)
        free[core] = rec.end
        for v in node.outputs:
            done[id(v)] = (rec.end, core)
    return Profile(hw, records)


@dataclass
class Profile:
    """The modelled run: one record per op, in graph order."""

    hw: HWConfig
    records: list[OpRecord]

    def core_records(self, core: int) -> list[OpRecord]:
        return [r for r in self.records if r.core == core]

    @property
    def cycles_per_core(self) -> list[int]:
        """Each core's finishing time (= the sum of its records' TotalCycles)."""
        return [sum(r.total_cycles for r in self.core_records(i)) for i in range(self.hw.cores)]

    @property
    def makespan(self) -> int:
        return max(self.cycles_per_core, default=0)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.records)

    @property
    def roofline_cycles(self) -> float:
        """The MAC-bound ideal: MACs / (cores x PEs x MACs per PE)."""
        return self.macs / (self.hw.cores * self.hw.peak_macs_per_cycle)

    @property
    def utilisation(self) -> float:
        """MACs done / MACs the cores could do in the makespan."""
        return self.roofline_cycles / self.makespan if self.makespan else 0.0

    def top(self, n: int = 10) -> list[OpRecord]:
        return sorted(self.records, key=lambda r: (-r.own_cycles, r.index))[:n]

    def summary(self) -> dict:
        bounds = {b: sum(r.own_cycles for r in self.records if r.bound == b) for b in BOUNDS}
        return {"makespan_cycles": self.makespan, "cycles_per_core": self.cycles_per_core,
                "makespan_ms": self.makespan / (self.hw.clock_ghz * 1e6),
                "macs": self.macs, "roofline_cycles": self.roofline_cycles,
                "utilisation": self.utilisation, "ops": len(self.records),
                "cycles_by_bound": {b: c for b, c in bounds.items() if c},
                "top_ops": [{"name": r.name, "op": r.op, "loc": r.loc, "core": r.core,
                             "cycles": r.own_cycles, "bound": r.bound, "macs": r.macs,
                             "utilisation": r.utilisation} for r in self.top(10)],
                "hw": self.hw.model_dump(), "hw_string": self.hw.describe(),
                "hw_hash": self.hw.hash}

    def write(self, out_dir: str | Path, plots: bool = True) -> list[Path]:
        """profile_core{i}.json, summary.json and (``plots``) timeline.png, roofline.png."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for i in range(self.hw.cores):
            p = out / f"profile_core{i}.json"
            p.write_text(json.dumps([r.to_json() for r in self.core_records(i)], indent=1))
            written.append(p)
        p = out / "summary.json"
        p.write_text(json.dumps(self.summary(), indent=1))
        written.append(p)
        if plots:
            from .perf_plots import roofline_plot, timeline_plot
            written += [timeline_plot(self, out / "timeline.png"),
                        roofline_plot(self, out / "roofline.png")]
        return written

