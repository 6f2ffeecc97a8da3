"""The GPNPU cycle model: cycles per step per core for a graph's schedule on a HWConfig.

    profile = model(graph, HWConfig.parse("QC-U 8MB 16MAC x4"))
    profile.write("out/")     # profile_core{i}.json, summary.json, timeline.png, roofline.png

The model costs the schedule the programs run (:func:`bevir.target.schedule.schedule_of`):
every step's kernel, the loads, stores and in-place DDR accesses it makes, the flags it
waits for. docs/target.md gives the formulas and worked numbers. Per kernel step:

    mac       = prod ceil(extent / unit) x serial           for one of the op's PE mappings
    alu       = ceil(alu_ops / (PEs x alu_ops_per_pe))
    compute   = ceil((mac + alu) / efficiency[op class])    one instruction stream per core
    ocm       = ceil((bytes read + written) / OCM bytes per cycle)
    broadcast = ceil(weight bytes x passes / broadcast bytes per cycle)
    ddr       = sum over the step's transfers of set-up + ceil(bursts x burst / DDR bandwidth)
    own       = launch + exposed + max(compute, ocm, broadcast, ddr)   (double buffered)
    exposed   = DDR latency + one burst, when the step moves anything

DDR bandwidth is shared by whatever transfers overlap in time, on any core: the model runs
the cores' steps as a fluid simulation in which every step moving data gets an equal share
of the bandwidth, so a transfer of ``ddr`` cycles alone takes longer beside others. A step
waiting for a value from another core starts ``barrier_cycles`` after its producer ends
(the flag's synchronisation); a barrier releases every core ``barrier_cycles`` after the
last one arrives. Host stages are host work: the device's cores join between stages, and
host nodes cost no device cycles (they are listed as host records).

``TotalCycles`` = wait + own, as in the vendor's per-core profiles, so a core's records sum
to its finishing time.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fsutil import write_atomic
from ..ir.graph import Graph, Node
from ..ops.cost import PEMapping, Work, work_of
from .hw import HWConfig
from .schedule import Schedule, ScheduleError, Step, schedule_of

#: what a step can be bound by: the largest of its terms ("launch" when all are 0), a
#: barrier (its copies and the release), or nothing: a view of DDR bytes (its waits only),
#: a prefetch or a spill (a load or a store issued to the core's DMA engine; a step
#: after it waits for the transfer)
BOUNDS = ("compute", "alu", "ocm", "broadcast", "ddr", "barrier", "launch", "view",
          "prefetch", "spill")


# ---- the cost of one op -------------------------------------------------------------------
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


@dataclass(frozen=True)
class Terms:
    """The compute-side cycle terms of an op on one core (DDR is the schedule's)."""

    mac: int = 0
    alu: int = 0
    compute: int = 0
    ocm: int = 0
    broadcast: int = 0

    @property
    def busy(self) -> int:
        """The array's time: the largest of compute, OCM and broadcast traffic."""
        return max(self.compute, self.ocm, self.broadcast)


@dataclass(frozen=True)
class OpCost:
    """What one op costs on one core of a config, for its cheapest PE mapping."""

    work: Work
    mapping: PEMapping | None
    terms: Terms
    macs: int
    bytes_read: int
    bytes_written: int
    bytes_broadcast: int

    @property
    def array_bytes(self) -> int:
        return self.bytes_read + self.bytes_written


def op_cost(node: Node, hw: HWConfig) -> OpCost:
    """The cycle terms of ``node`` on one core of ``hw`` for its cheapest mapping (the
    fewest array cycles; DDR does not depend on the mapping)."""
    op = node.opdef
    work, cost = work_of(op, op.ctx(node)), op.cost(node)
    options = [_with_mapping(work, m, cost, hw) for m in work.mappings or (None,)]
    return min(options, key=lambda c: c.terms.busy)          # first on ties


def _with_mapping(work: Work, mapping: PEMapping | None, cost: dict, hw: HWConfig) -> OpCost:
    mac, passes = mapping_cycles(mapping, hw) if mapping else (0, 0)
    alu = -(-work.alu_ops // (hw.pes * hw.alu_ops_per_pe))
    compute = math.ceil((mac + alu) / hw.efficiency_of(work.op_class))
    array = cost["bytes_read"] + cost["bytes_written"]
    broadcast = work.tile_weight_bytes * passes
    terms = Terms(mac, alu, compute, math.ceil(array / hw.ocm_bytes_per_cycle),
                  math.ceil(broadcast / hw.broadcast_bytes_per_cycle))
    return OpCost(work, mapping, terms, cost["macs"], cost["bytes_read"],
                  cost["bytes_written"], broadcast)


def dma_cycles(nbytes: int, hw: HWConfig) -> int:
    """One DMA transfer DDR <-> OCM with the DDR bandwidth to itself: set-up plus whole
    bursts."""
    if nbytes <= 0:
        return 0
    return hw.dma_setup_cycles + _bandwidth_cycles(nbytes, hw)


def _bandwidth_cycles(nbytes: int, hw: HWConfig) -> int:
    bursts = -(-nbytes // hw.dma_burst_bytes)
    return math.ceil(bursts * hw.dma_burst_bytes / hw.ddr_bytes_per_cycle)


def exposed_cycles(transfers: list[int], hw: HWConfig) -> int:
    """The DMA latency double buffering cannot hide: DDR latency + the first burst."""
    if not any(transfers):
        return 0
    return hw.ddr_latency_cycles + dma_cycles(min(max(transfers), hw.dma_burst_bytes), hw)


# ---- records and the profile --------------------------------------------------------------
@dataclass
class OpRecord:
    """One step on one core. ``terms``: its cycle terms (``ddr``: its transfers with the
    bandwidth to itself; ``ddr_shared``: the extra cycles sharing cost it); ``bound``:
    the largest term."""

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
    transfers: int = 0
    notes: dict = field(default_factory=dict)
    dma: tuple[int, int] | None = None      # when its transfers were in flight
    duplicate: bool = False     # a copy of a node core 0 computes too (partition "copies")

    @property
    def total_cycles(self) -> int:
        return self.wait_cycles + self.own_cycles

    @property
    def end(self) -> int:
        return self.start + self.own_cycles

    @property
    def ddr_bytes(self) -> int:
        return self.bytes["ddr"]

    def to_json(self) -> dict:
        d = asdict(self)
        d["data"] = {"TotalCycles": self.total_cycles, "OwnCycles": self.own_cycles,
                     "WaitCycles": self.wait_cycles,
                     **{f"{k.capitalize()}Cycles": v for k, v in self.terms.items()}}
        return d


@dataclass(frozen=True)
class HostRecord:
    """A node the program runs on the host (float pre- and post-processing)."""

    index: int
    name: str
    op: str
    loc: str
    stage: int


@dataclass
class Profile:
    """The modelled run: one record per device step (in program order per core), the host
    nodes, and the stages."""

    hw: HWConfig
    records: list[OpRecord]
    host_records: list[HostRecord] = field(default_factory=list)
    stages: list[dict] = field(default_factory=list)    # {"device", "nodes", "start", "end"}

    def core_records(self, core: int) -> list[OpRecord]:
        return [r for r in self.records if r.core == core]

    @property
    def cycles_per_core(self) -> list[int]:
        """Each core's finishing time (= the sum of its records' TotalCycles)."""
        return [sum(r.total_cycles for r in self.core_records(i)) for i in range(self.hw.cores)]

    @property
    def wait_cycles_per_core(self) -> list[int]:
        """Cycles each core spends waiting (for operands, barriers, stage boundaries)."""
        return [sum(r.wait_cycles for r in self.core_records(i)) for i in range(self.hw.cores)]

    @property
    def ddr_bytes_per_core(self) -> list[int]:
        return [sum(r.ddr_bytes for r in self.core_records(i)) for i in range(self.hw.cores)]

    @property
    def ddr_bytes(self) -> int:
        """Bytes moved between DDR and OCM in one run, all cores."""
        return sum(r.ddr_bytes for r in self.records)

    @property
    def makespan(self) -> int:
        return max(self.cycles_per_core, default=0)

    @property
    def macs(self) -> int:
        """The graph's MACs: a node every core computes (partition ``copies``) counts once,
        its other copies are overhead, not work."""
        return sum(r.macs for r in self.records if not r.duplicate)

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
        """The figures: makespan, per core cycles, waits and DDR bytes, utilisation, the
        own cycles of the steps by what bounds them (and the waits beside them), the top
        steps, the host work and the config."""
        bounds = {b: sum(r.own_cycles for r in self.records if r.bound == b) for b in BOUNDS}
        bounds["wait"] = sum(r.wait_cycles for r in self.records)
        device_stages = [s for s in self.stages if s["device"]]
        return {"makespan_cycles": self.makespan, "cycles_per_core": self.cycles_per_core,
                "wait_cycles_per_core": self.wait_cycles_per_core,
                "makespan_ms": self.makespan / (self.hw.clock_ghz * 1e6),
                "ddr_bytes": self.ddr_bytes, "ddr_bytes_per_core": self.ddr_bytes_per_core,
                "transfers": sum(r.transfers for r in self.records),
                "macs": self.macs, "roofline_cycles": self.roofline_cycles,
                "utilisation": self.utilisation, "ops": len(self.records),
                "host": {"nodes": len(self.host_records),
                         "stages": len(self.stages) - len(device_stages),
                         "device_stages": len(device_stages)},
                "cycles_by_bound": {b: c for b, c in bounds.items() if c},
                "top_ops": [{"name": r.name, "op": r.op, "loc": r.loc, "core": r.core,
                             "cycles": r.own_cycles, "bound": r.bound, "macs": r.macs,
                             "utilisation": r.utilisation} for r in self.top(10)],
                "hw": self.hw.model_dump(), "hw_string": self.hw.option_text(),
                "hw_hash": self.hw.hash}

    def write(self, out_dir: str | Path, plots: bool = True) -> list[Path]:
        """profile_core{i}.json, summary.json and (``plots``) timeline.png, roofline.png."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for i in range(self.hw.cores):
            p = out / f"profile_core{i}.json"
            write_atomic(p, json.dumps([r.to_json() for r in self.core_records(i)], indent=1))
            written.append(p)
        p = out / "summary.json"
        write_atomic(p, json.dumps(self.summary(), indent=1))
        written.append(p)
        if plots:
            from .plots import roofline_plot, timeline_plot
            written += [timeline_plot(self, out / "timeline.png"),
                        roofline_plot(self, out / "roofline.png")]
        return written


# ---- the simulation -----------------------------------------------------------------------
_EPS = 1e-6


def _tick(t: float) -> int:
    """A simulated time as whole cycles (up, forgiving float noise)."""
    return math.ceil(t - _EPS)


class _Track:
    """A sequence of segments: ("time", cycles) run on their own, ("ddr", cycles at the
    whole bandwidth) run at the bandwidth's share. A segment may carry a label; ``spans``
    keeps when each label's segments began and ended (the trace's DMA lane)."""

    def __init__(self, segments: list[tuple], now: float):
        self.segments = [s for s in segments if s[1] > 0]
        self.i, self.left = 0, 0.0
        self.spans: dict[str, list[float]] = {}
        self._enter(now)

    def _enter(self, now: float) -> None:
        if self.i < len(self.segments):
            kind, amount, *label = self.segments[self.i]
            self.left = now + amount if kind == "time" else amount
            if label:
                self.spans.setdefault(label[0], [now, now])

    @property
    def done(self) -> bool:
        return self.i >= len(self.segments)

    @property
    def on_ddr(self) -> bool:
        return not self.done and self.segments[self.i][0] == "ddr"

    def next_event(self, now: float, sharers: int) -> float:
        return self.left if not self.on_ddr else now + self.left * sharers

    def advance(self, now: float, dt: float, sharers: int) -> None:
        if self.on_ddr:
            self.left -= dt / sharers
        while not self.done and (self.left <= _EPS if self.on_ddr else self.left <= now + _EPS):
            label = self.segments[self.i][2:]
            if label:
                self.spans[label[0]][1] = now
            self.i += 1
            self._enter(now)


@dataclass
class _Job:
    step: Step
    cost: OpCost | None
    transfers: list[int]
    ddr: int                       # the transfers' cycles with the bandwidth to themselves
    exposed: int
    launch: int
    busy: int                      # the array's (or a barrier's copies') cycles
    start: float                   # when it starts, its operands ready
    tracks: list[_Track]
    double: bool = True            # DMA overlaps the array's work
    arrive: float = 0.0            # a barrier: when this core's copies are done
    engine: _Track | None = None   # its transfer on the core's DMA engine (prefetch, spill)

    @property
    def dma_span(self) -> tuple[float, float] | None:
        """When its transfers were in flight (their exposed latency included)."""
        spans = [t.spans["dma"] for t in self.tracks + [self.engine] if t and "dma" in t.spans]
        return (spans[0][0] - self.exposed, spans[0][1]) if spans else None

    @property
    def alone(self) -> int:
        """Its own cycles with the DDR bandwidth to itself."""
        body = max(self.busy, self.ddr) if self.double else self.busy + self.ddr
        return self.launch + self.exposed + body


class _Simulation:
    """The cores' steps of one device stage, run together (see the module docstring)."""

    def __init__(self, hw: HWConfig, steps: list[list[Step]], t0: float,
                 costs: dict[int, OpCost]):
        self.hw, self.costs, self.queues = hw, costs, steps
        self.pos = [0] * len(steps)
        self.free = [t0] * len(steps)
        self.held: set[int] = set()                   # cores waiting at a barrier
        self.now = t0
        self.jobs: dict[int, _Job] = {}
        # each core's DMA engine: prefetches issued, the one in flight, when each ended
        self.issued: list[list[_Job]] = [[] for _ in steps]
        self.engines: dict[int, _Job] = {}
        self.engine_free = [t0] * len(steps)
        self.fetched: dict[tuple[int, str], float] = {}
        self.published: dict[str, float] = {}
        self.arrived: dict[int, dict[int, _Job]] = {}      # barrier node -> core -> job
        self.done: list[tuple[_Job, float]] = []           # (job, end)

    def run(self) -> float:
        """Run every step; the time the last core finishes."""
        while True:
            self._start_ready()
            if self._finish_done():       # a step of no time (an issue) ends where it starts
                continue
            if not self.jobs and not self.engines:
                waiting = [q[p] for p, q in zip(self.pos, self.queues) if p < len(q)]
                if waiting or self.held:
                    n = waiting[0].node if waiting else None
                    raise ScheduleError("the cores wait for each other forever here",
                                        **({} if n is None else
                                           dict(node=n.name, op=n.op, loc=n.loc)))
                return max(self.free + self.engine_free, default=self.now)
            tracks = [t for j in self.jobs.values() for t in j.tracks if not t.done] + \
                [j.engine for j in self.engines.values() if not j.engine.done]
            if tracks:
                sharers = max(1, sum(t.on_ddr for t in tracks))
                t_next = min(t.next_event(self.now, sharers) for t in tracks)
                dt, self.now = max(t_next - self.now, 0.0), max(t_next, self.now)
                for t in tracks:
                    t.advance(self.now, dt, sharers)
            self._finish_done()

    def _finish_done(self) -> bool:
        """Finish the steps and transfers that are done; whether any was."""
        finished = False
        for core, job in list(self.jobs.items()):
            if all(t.done for t in job.tracks):
                del self.jobs[core]
                self._finish(core, job)
                finished = True
        for core, job in list(self.engines.items()):
            if job.engine.done:
                del self.engines[core]
                self.engine_free[core] = self.now
                self.fetched[core, job.step.node.output.name] = self.now
                finished = True
        return finished

    def _start_ready(self) -> None:
        for core, queue in enumerate(self.queues):
            if core in self.jobs or core in self.held or self.pos[core] >= len(queue):
                continue
            step = queue[self.pos[core]]
            if any(v not in self.published for v in step.waits) or \
                    any((core, v) not in self.fetched for v in step.dma_waits):
                continue
            start = max([self.free[core], self.now]
                        + [self.published[v] + self.hw.barrier_cycles for v in step.waits]
                        + [self.fetched[core, v] for v in step.dma_waits])
            self.jobs[core] = self._job(step, start)
            self.pos[core] += 1
            if step.on_engine:
                self.issued[core].append(self.jobs[core])
        for core, issued in enumerate(self.issued):
            if issued and core not in self.engines:    # the engine takes the next transfer
                job = issued.pop(0)
                setup = self.hw.dma_setup_cycles * len(job.transfers)
                head = ("time", max(job.start, self.engine_free[core]) - self.now + job.exposed)
                job.engine = _Track([head, ("time", setup, "dma"), ("ddr", job.ddr - setup, "dma")],
                                    self.now)
                self.engines[core] = job

    def _job(self, step: Step, start: float) -> _Job:
        hw = self.hw
        transfers = [b for b in step.transfers() if b > 0]
        ddr_time = sum(_bandwidth_cycles(b, hw) for b in transfers)
        setup = hw.dma_setup_cycles * len(transfers)
        exposed = exposed_cycles(transfers, hw)
        cost = self.costs.get(id(step.node)) if step.kernel else None
        if step.on_engine:               # issued: the engine moves it, the core goes on
            tracks = [_Track([("time", start - self.now)], self.now)]
            return _Job(step, None, transfers, setup + ddr_time, exposed, 0, 0, start, tracks)
        if cost is None:                 # a barrier's copies: OCM traffic, no kernel
            copied = sum(a.nbytes for a, _ in step.copies)
            busy, launch = math.ceil(2 * copied / hw.ocm_bytes_per_cycle), 0
        else:
            busy, launch = cost.terms.busy, hw.launch_cycles
        head = ("time", start - self.now + launch + exposed)
        ddr = [("time", setup, "dma"), ("ddr", ddr_time, "dma")]
        if hw.double_buffer:
            tracks = [_Track([head, ("time", busy)], self.now), _Track([head] + ddr, self.now)]
        else:
            tracks = [_Track([head] + ddr + [("time", busy)], self.now)]
        return _Job(step, cost, transfers, setup + ddr_time, exposed, launch, busy, start,
                    tracks, hw.double_buffer)

    def _finish(self, core: int, job: _Job) -> None:
        step = job.step
        if not step.barrier:
            self.free[core] = self.now
            for v in step.publishes:
                self.published[v] = self.now
            self.done.append((job, self.now))
            return
        job.arrive = self.now
        arrived = self.arrived.setdefault(id(step.node), {})
        arrived[core] = job
        self.held.add(core)
        if len(arrived) == len(self.queues):        # every core is here: release them all
            release = max(j.arrive for j in arrived.values()) + self.hw.barrier_cycles
            for k, j in arrived.items():
                self.free[k] = release
                self.held.discard(k)
                self.done.append((j, release))


def _record(job: _Job, end: float, index: int, prev_end: int, hw: HWConfig) -> OpRecord:
    """The record of one finished job; ``prev_end``: its core's previous record's end."""
    step, c = job.step, job.cost
    t = c.terms if c is not None else Terms()
    start_i, end_i = max(_tick(job.start), prev_end), max(_tick(end), prev_end)
    own = end_i - start_i
    if step.barrier:                 # its copies and the release; the rest is waiting
        own = min(own, max(_tick(job.arrive) - start_i, 0) + hw.barrier_cycles)
    wait = end_i - own - prev_end
    terms = {"mac": t.mac, "alu": t.alu, "compute": t.compute, "ocm": t.ocm,
             "broadcast": t.broadcast, "ddr": job.ddr,
             "ddr_shared": 0 if step.barrier else max(0, own - job.alone),
             "exposed": job.exposed, "launch": job.launch}
    bound = ("barrier" if step.barrier else "view" if step.view else "prefetch"
             if step.prefetch else "spill" if step.spill
             else _bound(t, job.ddr + terms["ddr_shared"]))
    macs = c.macs if c is not None else 0
    util = macs / (own * hw.peak_macs_per_cycle) if own else 0.0
    span = job.dma_span
    dma = None if span is None else (max(_tick(span[0]), end_i - own),
                                     max(_tick(span[1]), end_i - own))
    moved = {"read": c.bytes_read if c else 0, "written": c.bytes_written if c else 0,
             "array": c.array_bytes if c else 0, "broadcast": c.bytes_broadcast if c else 0,
             "ddr": step.ddr_bytes}
    return OpRecord(index, step.node.name, step.node.op, step.node.loc, step.core,
                    c.work.op_class if c else "data",
                    c.mapping.name if c and c.mapping else None, macs, moved, terms, own,
                    wait, end_i - own, bound, util, len(job.transfers),
                    dict(c.work.notes) if c else {}, dma,
                    step.node.meta.get("copy", {}).get("index", 0) > 0)


def _bound(t: Terms, ddr: int) -> str:
    """What the op waits on: the largest overlapping term (launch when all are 0)."""
    if max(t.busy, ddr) == 0:
        return "launch"
    top = max((t.compute, 3, "compute"), (t.ocm, 2, "ocm"), (t.broadcast, 1, "broadcast"),
              (ddr, 0, "ddr"))[2]
    return ("compute" if t.mac >= t.alu else "alu") if top == "compute" else top


def simulate(sched: Schedule, hw: HWConfig) -> Profile:
    """Cost every step of ``sched`` on ``hw`` (see the module docstring)."""
    if sched.cores > hw.cores:
        raise ScheduleError(f"the graph is partitioned for {sched.cores} cores, "
                            f"{hw.option_text()} has {hw.cores}")
    costs = {id(s.node): op_cost(s.node, hw) for s in sched.steps() if s.kernel}
    index = {id(n): i for i, n in enumerate(sched.graph.nodes)}
    records: list[OpRecord] = []
    hosts: list[HostRecord] = []
    stages: list[dict] = []
    prev_end = [0] * hw.cores
    t = 0.0
    for k, stage in enumerate(sched.stages):
        if not stage.device:
            hosts += [HostRecord(index[id(n)], n.name, n.op, n.loc, k) for n in stage.nodes]
            stages.append({"device": False, "nodes": len(stage.nodes), "start": _tick(t),
                           "end": _tick(t)})
            continue
        steps = stage.steps + [[] for _ in range(hw.cores - len(stage.steps))]
        sim = _Simulation(hw, steps, t, costs)
        end = sim.run()
        for job, job_end in sorted(sim.done, key=lambda r: (r[0].step.core, r[1])):
            core = job.step.core
            rec = _record(job, job_end, index[id(job.step.node)], prev_end[core], hw)
            prev_end[core] = rec.end
            records.append(rec)
        stages.append({"device": True, "nodes": len(stage.nodes), "start": _tick(t),
                       "end": _tick(end)})
        t = end
    return Profile(hw, records, hosts, stages)


def model(graph: Graph, hw: HWConfig) -> Profile:
    """Model ``graph`` as it stands (partitioned or not, memory-planned or not) on ``hw``:
    the cost of its schedule (:func:`~bevir.target.schedule.schedule_of`)."""
    return simulate(schedule_of(graph, hw.cores), hw)
