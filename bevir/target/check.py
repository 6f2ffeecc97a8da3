"""A schedule checked before anything runs it: every byte a step reads holds the value the
step expects, when it reads it.

:func:`check_schedule` replays a :class:`~bevir.target.schedule.Schedule` on a symbolic
memory: each byte range of DDR and of each core's OCM holds the *name* of the value last
written there. A kernel's operands, a load's or store's source, a host stage's operands
and the graph's outputs must hold their values when read; a transfer on the core's DMA
engine (a prefetch or a spill, see :mod:`bevir.codegen.cprogram`) may finish at any moment
between its issue and the step that waits for it, so until then nothing may read or write
its destination or write its source; the engine runs a core's transfers in order, so one
issued behind the transfer that writes its source reads it once that landed. Cores run in
program order, each blocked at a flag until its producer published it and at a barrier
until every core reached it.

This catches what a golden run of the planned graph cannot (the golden model computes
every node from its operands, wherever the plan put them): two values planned into one
OCM range while both live, a load issued before its source was stored, a store racing a
prefetch, a spill's source overwritten before the spill ran, a host stage reading a DDR
slot nothing wrote.

    from bevir.target import check_schedule, schedule_of
    check_schedule(schedule_of(planned_graph))    # raises ScheduleError naming the step
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..ir.graph import Graph, Node, Value
from .schedule import Schedule, ScheduleError, Step, producer_core


@dataclass
class _Space:
    """One memory (DDR or a core's OCM): disjoint ranges ``[start, end)`` and the value
    each holds."""

    starts: list[int] = field(default_factory=list)
    ranges: list[tuple[int, int, str]] = field(default_factory=list)

    def write(self, start: int, end: int, value: str) -> None:
        keep = [(s, e, v) for s, e, v in self._overlapping(start, end)]
        i = bisect.bisect_left(self.starts, keep[0][0]) if keep else \
            bisect.bisect_left(self.starts, start)
        del self.starts[i:i + len(keep)], self.ranges[i:i + len(keep)]
        pieces = [(s, start, v) for s, e, v in keep[:1] if s < start] + [(start, end, value)] \
            + [(end, e, v) for s, e, v in keep[-1:] if e > end]
        self.starts[i:i] = [p[0] for p in pieces]
        self.ranges[i:i] = pieces

    def holds(self, start: int, end: int, value: str) -> bool:
        """Whether every byte of ``[start, end)`` holds ``value``."""
        at = start
        for s, e, v in self._overlapping(start, end):
            if s > at or v != value:
                return False
            at = e
        return at >= end

    def _overlapping(self, start: int, end: int) -> list[tuple[int, int, str]]:
        i = max(bisect.bisect_right(self.starts, start) - 1, 0)
        out = []
        while i < len(self.ranges) and self.ranges[i][0] < end:
            if self.ranges[i][1] > start:
                out.append(self.ranges[i])
            i += 1
        return out


@dataclass(frozen=True)
class _Job:
    """A transfer in flight on a core's DMA engine: ``value`` is copied from ``src`` to
    ``dst`` (each (memory, span): a prefetch from DDR to the core's OCM, a spill back)."""

    value: str
    src: tuple[str, tuple[int, int]]
    dst: tuple[str, tuple[int, int]]

    @property
    def what(self) -> str:
        return f"the {'prefetch' if self.dst[0] == 'ocm' else 'spill'} of '{self.value}'"


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class _Replay:
    def __init__(self, sched: Schedule):
        self.sched, self.memory = sched, sched.memory
        self.values: dict[str, Value] = _values(sched.graph)
        self.ddr = _Space()
        self.ocm = [_Space() for _ in range(sched.cores)]
        self.jobs: list[list[_Job]] = [[] for _ in range(sched.cores)]
        self.published: set[str] = set()

    # ---- names and ranges -------------------------------------------------------------
    def tag(self, name: str) -> str:
        """The value whose bytes ``name`` are (a view's: its operand's)."""
        while name in self.memory.views:
            name = self.memory.views[name]
        return name

    def span(self, offset: int, name: str) -> tuple[int, int]:
        return offset, offset + self.values[name].type.nbytes

    def space(self, mem: str, core: int) -> _Space:
        return self.ddr if mem == "ddr" else self.ocm[core]

    # ---- reads and writes ---------------------------------------------------------------
    def read(self, step: Step | None, mem: str, core: int, offset: int, name: str,
             what: str) -> None:
        joined = self.memory.joined.get(self.tag(name)) if mem == "ddr" else None
        if joined:                      # a gather's view: its pieces, end to end
            for piece, _ in joined:
                self.read(step, mem, core, offset, piece, what)
                offset += self.values[piece].type.nbytes
            return
        span = self.span(offset, name)
        for k, jobs in enumerate(self.jobs):
            for job in jobs:
                if job.dst[0] == mem and (mem == "ddr" or k == core) and _overlaps(span,
                                                                                  job.dst[1]):
                    self._fail(step, f"{what} reads {mem.upper()} {span} while {job.what} "
                                     f"may still write it")
        if not self.space(mem, core).holds(*span, self.tag(name)):
            where = f"{mem} {span}" + (f" of core {core}" if mem == "ocm" else "")
            self._fail(step, f"{what} reads '{name}' from {where}, which does not hold it "
                             f"then")

    def write(self, step: Step | None, mem: str, core: int, offset: int, name: str) -> None:
        span = self.span(offset, name)
        for k, jobs in enumerate(self.jobs):
            for job in jobs:
                for end, (m, s) in (("source", job.src), ("destination", job.dst)):
                    if m == mem and (mem == "ddr" or k == core) and _overlaps(span, s):
                        self._fail(step, f"writes '{name}' over {mem.upper()} {span}, the "
                                         f"{end} of {job.what} on core {k} still in flight")
        self.space(mem, core).write(*span, self.tag(name))

    def queued(self, core: int, mem: str, offset: int, name: str) -> bool:
        """Whether a transfer ahead in the core's DMA engine writes ``name`` there: a
        transfer issued after it reads it once it landed (the engine runs them in order)."""
        span, tag = self.span(offset, name), self.tag(name)
        return any(job.dst == (mem, span) and self.tag(job.value) == tag
                   for job in self.jobs[core])

    def finish(self, core: int, upto: str | None = None) -> None:
        """The core's DMA engine runs its queue, in order, up to ``upto``'s job (all of it
        when None)."""
        jobs = self.jobs[core]
        n = len(jobs) if upto is None else 1 + next(
            (i for i, j in enumerate(jobs) if j.value == upto), len(jobs))
        done, self.jobs[core] = jobs[:n], jobs[n:]
        for job in done:
            self.space(job.dst[0], core).write(*job.dst[1], self.tag(job.value))

    def _fail(self, step: Step | None, message: str) -> None:
        node = step.node if step is not None else None
        core = f"core {step.core}: " if step is not None else "host: "
        raise ScheduleError(core + message, node=node.name if node else None,
                            op=node.op if node else None, loc=node.loc if node else None)

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> None:
        graph, memory = self.sched.graph, self.memory
        for name, offset in memory.ddr.items():         # the host writes what it gives
            v = self.values[name]
            if v.producer is None and name not in memory.views:
                self.ddr.write(*self.span(offset, name), name)
        device = {id(n) for s in self.sched.stages if s.device for n in s.nodes}
        for stage in self.sched.stages:
            if stage.device:
                self.device_stage(stage.steps)
                continue
            for n in stage.nodes:
                for v in n.inputs:
                    if v is not None and producer_core(v, device) is not None:
                        self.read(None, "ddr", 0, memory.ddr[v.name], v.name,
                                  f"host node '{n.name}' ({n.op})")
                for v in n.outputs:
                    if v.name in memory.ddr:
                        self.ddr.write(*self.span(memory.ddr[v.name], v.name), v.name)
        for v in graph.outputs.values():
            if producer_core(v, device) is not None:
                self.read(None, "ddr", 0, memory.ddr[v.name], v.name, "the graph's output")

    def device_stage(self, steps: list[list[Step]]) -> None:
        at = [0] * len(steps)
        arrived: list[Node | None] = [None] * len(steps)
        while any(a < len(s) for a, s in zip(at, steps)):
            moved = False
            for core, core_steps in enumerate(steps):
                while at[core] < len(core_steps):
                    step = core_steps[at[core]]
                    if any(v not in self.published for v in step.waits):
                        break
                    if step.barrier:
                        if arrived[core] is not step.node:    # its own part, once
                            arrived[core] = step.node
                            self.step(step)
                            moved = True
                        if not all(a is step.node for a in arrived):
                            break
                        arrived = [None] * len(steps)
                        for k in range(len(steps)):
                            at[k] += 1
                        continue
                    self.step(step)
                    at[core] += 1
                    moved = True
            if not moved:
                stuck = [core_steps[a] for a, core_steps in zip(at, steps) if a < len(core_steps)]
                self._fail(stuck[0], "every core waits: a flag nobody publishes or a barrier "
                                     "not every core reaches")
        for core in range(len(steps)):              # the engines drain at the stage's end
            self.finish(core)

    def step(self, step: Step) -> None:
        """One step, in the order its C runs it (bevir/codegen/cprogram.py)."""
        core, node, memory = step.core, step.node, self.memory
        for v in step.dma_waits:
            self.finish(core, v)
        for t in step.loads:
            self.read(step, "ddr", core, t.ddr, t.value, "the load")
            self.write(step, "ocm", core, t.ocm, t.value)
        for src, dst in step.copies:          # a barrier: this core's pieces pass through
            self.read(step, src.place.mem, core, src.place.offset, src.value, "the copy")
            self.write(step, dst.place.mem, core, dst.place.offset, dst.value)
        if step.on_engine:
            src, dst = step.args
            if not self.queued(core, src.place.mem, src.place.offset, src.value):
                self.read(step, src.place.mem, core, src.place.offset, src.value,
                          "the prefetch" if step.prefetch else "the spill")
            self.jobs[core].append(_Job(dst.value,
                                        (src.place.mem, self.span(src.place.offset, src.value)),
                                        (dst.place.mem, self.span(dst.place.offset, dst.value))))
        elif step.kernel:
            operands = len([v for v in node.inputs if v is not None])
            for a in step.args[:operands]:
                self.read(step, a.place.mem, core, a.place.offset, a.value, "the kernel")
            for a in step.args[operands:]:
                self.write(step, a.place.mem, core, a.place.offset, a.value)
        elif step.view and node.output.name not in memory.joined:
            x = node.inputs[0]
            self.read(step, "ddr", core, memory.ddr[x.name], x.name, "the view")
        for t in step.stores:
            self.read(step, "ocm", core, t.ocm, t.value, "the store")
            self.write(step, "ddr", core, t.ddr, t.value)
        self.published.update(step.publishes)


def _values(graph: Graph) -> dict[str, Value]:
    out = {v.name: v for v in graph.inputs}
    for n in graph.nodes:
        out.update((v.name, v) for v in n.tensors())
    return out


def check_schedule(sched: Schedule) -> None:
    """Replay ``sched`` on a symbolic memory (see the module docstring); raise
    :class:`~bevir.target.schedule.ScheduleError` naming the first step that reads a
    range not holding its value, or writes over a transfer still in flight."""
    _Replay(sched).run()
