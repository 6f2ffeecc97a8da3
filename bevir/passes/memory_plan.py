"""plan-memory: on-chip memory (OCM) offsets for every buffer, from liveness.

The timeline is the graph's node order: step ``t`` runs node ``t``, which reads its
operands and writes its results, all in OCM at once. A buffer (a value on one core) is
live from the first step that touches it to the last; graph inputs from step 0, graph
outputs to the last step. A constant, as any value made elsewhere, is loaded at its first
use on a core and lives until its last: the weights of the layers that ran give their room
to the next ones (a layer run stripe by stripe keeps its weights for all its stripes).

An op that computes each result element from the operand elements at its own index
(``OpDef.result_over_operand``: the adds) writes its result over an operand of the
result's type that dies at it: both get one buffer, from the operand's first step to the
result's last (``node.meta["in_place"]``: the operand's index); the residual adds of a
ResNet then hold two tensors, not three. Where either moves to DDR they are separated.

Plan: start with every value in OCM. While a core's live bytes at some step exceed its
OCM (the lower bound ``max_t sum(live bytes)``), or the placement does not fit, move one
value live but untouched at the peak step to DDR (the one used farthest ahead, as Belady's
rule does); a DDR value is loaded by a ``dma_copy`` before each node that reads it, and a
DDR activation is stored by one right after its producer (the producer core's next node
reads it in OCM). When nothing at the peak step
can move, the step's own operands and results exceed the OCM: a PassError naming the op
and the bytes it needs. Loads are then issued up to ``prefetch_window`` nodes early
(double buffering: the transfer overlaps the nodes before its reader) where the bound
leaves room, in the order of their readers, and later again where the placement
fragments.

Placement, per core: greedy by size, best fit (TFLite / TVM USMP), then a seeded
hill-climb over the placement order (Vela) that stops at the lower bound, after
``search_steps`` placements or after ``search_patience`` placements in a row that did not
lower the peak. Where best fit fragments (the bound fits, the placement does not), a
result written over its operand live where the placement overflows gets its own buffer
again where the bound allows; else a value live there moves to DDR: the one touched at
the fewest steps of the core (the fewest reloads), then one at least as large as the
overflow (or, where none is, the node whose own tensors fill the OCM streams them).
Results go to meta (registered keys, saved with the graph):
``value.meta["ocm"]`` (a list of ``{"core", "offset", "size"}``, one per core holding the
value), ``value.meta["mem"]`` (``"ocm"`` or ``"ddr"``), ``graph.meta["memory_plan"]`` (the
options and per-core figures); :func:`memory_plan_of` reads them back as a :class:`MemoryPlan`
and :func:`verify_memory_plan` checks them against liveness recomputed from the graph.
"""
from __future__ import annotations

import dataclasses
import json
import random
from bisect import bisect_right
from dataclasses import dataclass


from ..errors import PassError, VerifyError
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..target.hw import HWConfig
from ..target.schedule import lowerable, run_order
from .analysis import AnalysisManager, Liveness
from .core import Pass
from .placement import conflicts, place_core
from .timeline import (Buffer, BufferKey, Timeline, stage_key, graph_timeline,
                       held_in_ocm)

register_meta_key("ocm", list, doc="plan-memory: [{core, offset, size}] per core holding the value")
register_meta_key("mem", str, doc="plan-memory: 'ocm' or 'ddr', where the value lives")
register_meta_key("memory_plan", dict, doc="plan-memory: options and per-core figures")
register_meta_key("async", bool, doc="plan-memory: a store the core's DMA engine runs while the "
                  "core goes on (its source stays in OCM through the core's next node)")
register_meta_key("in_place", int, doc="plan-memory: the operand a node's result is written "
                  "over (one OCM buffer for both)")
register_meta_key("stream", dict, doc="plan-memory: a node streamed in stripes between DDR and "
                  "an OCM stage buffer ({core, stripes, offset, size})")

PLAN_VERSION = 1


# ---- the pass -----------------------------------------------------------------------------
class PlanMemory(Pass):
    """Plan the OCM: offsets per core from liveness, DDR and DMA for what does not fit."""

    name = "plan-memory"
    description = "on-chip memory offsets from liveness; DDR with dma_copy where it does not fit"

    ocm: int = 8 * 1024 * 1024        # bytes of OCM per core (or in all, when shared)
    cores: int = 1
    shared: bool = False              # one OCM for all cores instead of one per core
    align: int = 64                   # every buffer's offset and size, in bytes
    seed: int = 0                     # the placement search's random choices
    search_steps: int = 200           # placements the hill-climb may try per core
    search_patience: int = 20         # ... and in a row without lowering the peak
    prefetch_window: int = 8          # the most nodes of its core a load is issued before
    double_buffer: bool = True        # issue loads one node early where the OCM allows
    stream: bool = True               # stream ops that do not fit the OCM through a stage
    hw: HWConfig | None = None        # a hardware config: ocm, cores and shared from it

    def __post_init__(self):
        super().__post_init__()
        if self.hw is not None:
            self._from_config(self.hw)

    def _from_config(self, hw: HWConfig) -> None:
        """Take ocm, cores and shared from ``hw``; one given otherwise contradicts it."""
        fields = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in (("ocm", hw.ocm_bytes), ("cores", hw.cores),
                            ("shared", hw.ocm_shared)):
            if getattr(self, name) not in (fields[name], value):
                raise PassError(f"pass 'plan-memory': {name}={getattr(self, name)} "
                                f"contradicts hw={self.hw.option_text()!r} ({name} {value})")
            setattr(self, name, value)

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if "memory_plan" in graph.meta:
            raise PassError("the graph already has a memory plan")
        if self.ocm <= 0 or self.cores <= 0 or self.align <= 0 or self.prefetch_window <= 0:
            raise PassError("plan-memory needs positive ocm, cores, align and prefetch_window, "
                            f"not {self}")
        dead = len(am.get(Liveness).dead_nodes)
        if dead:
            self.stat("dead-nodes-planned", dead)     # they still run; dce drops them
        order = run_order(graph)         # the host's cuts of a camera before the device
        if order != graph.nodes:
            graph.nodes = order
            graph.version += 1
        tl = Timeline(graph, self.cores, self.shared, self.align, self.ocm, self.stream)
        self._placements: dict[tuple[int, bool], tuple] = {}
        self._spill(tl)
        self._restore(tl)
        self._fit(tl)
        if self.double_buffer:
            self._prefetch(tl)
        bufs, figures, _ = self._place(tl)        # the search, once, on what fits
        self._materialize(graph, tl, bufs, figures)
        verify_memory_plan(graph)

    # ---- search -----------------------------------------------------------------------
    def _spill(self, tl: Timeline) -> None:
        """Move values to DDR until every core's live bytes fit its OCM."""
        while True:
            over = [(int(live.max()), c) for c, live in tl.live.items() if live.max() > self.ocm]
            if not over:
                return
            _, core = max(over, key=lambda o: (o[0], -o[1]))
            tl.to_ddr(self._victim(tl, core))

    def _restore(self, tl: Timeline) -> None:
        """Bring values back from DDR, last moved first, while every core's bound stays
        within its OCM (a value moved early may not be needed in DDR once later ones are)."""
        for name in reversed(list(tl.ddr)):
            if name in tl.streamed_values:
                continue
            tl.to_ocm(name)
            if not tl.fits(self.ocm):
                tl.to_ddr(name)

    def _place(self, tl: Timeline, search: bool = True
               ) -> tuple[list[Buffer], dict[int, dict] | None, int]:
        """Place every core; the figures, or None and the first core that does not fit."""
        bufs = tl.buffers()
        per_core: dict[int, list[Buffer]] = {}
        for b in bufs:
            per_core.setdefault(b.core, []).append(b)
        figures = {}
        for c in sorted(per_core):
            figures[c] = self._place_core(per_core[c], c, tl.last + 1, search)
            if figures[c]["peak"] > self.ocm:
                return bufs, None, c
        return bufs, figures, -1

    def _place_core(self, bufs: list[Buffer], core: int, num_steps: int, search: bool
                    ) -> dict[str, int]:
        """:func:`~bevir.passes.placement.place_core`, remembered per core: a core whose
        buffers did not change since its last placement (a spill moved another core's
        value) keeps it."""
        key = tuple((b.key, b.start, b.end, b.size) for b in bufs)
        seen = self._placements.get((core, search))
        if seen is not None and seen[0] == key:
            for b, offset in zip(bufs, seen[1]):
                b.offset = offset
            return seen[2]
        figures = place_core(bufs, num_steps, self.search_steps if search else 0,
                             random.Random(self.seed * 1009 + core), self.search_patience)
        self._placements[core, search] = (key, [b.offset for b in bufs], figures)
        return figures

    def _fit(self, tl: Timeline) -> None:
        """Place; while a core's placement does not fit (fragmentation), separate a
        result written over its operand live where it overflows (:meth:`_separate`), else
        move one more value of that core to DDR (:meth:`_victim`). The loop places by best
        fit alone; the search runs once on the final plan (it never makes a placement
        worse)."""
        while True:
            bufs, figures, core = self._place(tl, search=False)
            if figures is not None:
                return
            top = max((b for b in bufs if b.core == core), key=lambda b: b.offset + b.size)
            live = tl.live[core][top.start:top.end + 1]
            peak = top.offset + top.size
            t = top.start + int(live.argmax())
            separated = self._separate(tl, core, t)
            if separated:
                self.stat("fragmentation-separations", separated)
                continue
            victim = self._candidate(tl, core, t, peak - self.ocm)
            if victim is None and tl.core[t] == core and t not in tl.stages:
                tl.stream(t, self.ocm)       # its own tensors fill the OCM: stream them
                self.stat("fragmentation-streams")
                continue
            tl.to_ddr(self._victim(tl, core, t, need=peak - self.ocm))
            self.stat("fragmentation-spills")

    def _separate(self, tl: Timeline, core: int, t: int) -> int:
        """Where the placement overflows at step ``t``, give the results written over
        their operands live there buffers of their own again, largest first, as far as
        the OCM bound allows: two shorter buffers may fit where one long one does not.
        How many were separated."""
        live = sorted(dict.fromkeys(root for root in tl.alias.values()
                                    if (span := tl.ocm_span(root, core))
                                    and span[0] <= t <= span[1]),
                      key=lambda r: -tl.size[r])
        separated = 0
        for root in live:
            undone = tl.unmerge(root)
            if tl.fits(self.ocm):
                separated += 1
            else:
                tl.remerge(undone)
        return separated

    def _victim(self, tl: Timeline, core: int, t: int | None = None, need: int = 0) -> str:
        """The value to move to DDR: live but untouched at step ``t`` of ``core`` (then at
        its fullest step); where the placement needs ``need`` bytes more, the one touched
        at the fewest steps of the core first (the fewest reloads), then one of at least
        ``need`` bytes, then the one used farthest ahead there (Belady), then the largest,
        then the first."""
        live = tl.live[core]
        placement, fullest = t is not None, int(live.argmax())
        for step in dict.fromkeys([fullest if t is None else t, fullest]):
            best = self._candidate(tl, core, step, need)
            if best is not None:
                return best
        t = fullest                             # none moves: name the fullest step
        node = tl.nodes[t]
        held = sorted(((tl.size[key.value], key) for name in tl.values
                       for c, start, end, key in tl.intervals(name)
                       if c == core and start <= t <= end), key=lambda h: -h[0])
        held = ", ".join(f"%{key.value} {size}" for size, key in held[:8])
        if not placement:
            raise PassError(f"needs {int(live[t])} bytes of on-chip memory at once ({held}), "
                            f"more than the {self.ocm} bytes of core {core}, and none of them "
                            "can move to DDR", node=node.name, op=node.op, loc=node.loc)
        raise PassError(f"the placement on core {core} does not fit its {self.ocm} bytes "
                        f"although at most {int(live[t])} bytes are live at once, and nothing "
                        "more can move to DDR", node=node.name, op=node.op, loc=node.loc)

    @staticmethod
    def _candidate(tl: Timeline, core: int, t: int, need: int) -> str | None:
        here = tl.touched_at(t) if tl.core[t] == core else set()
        best, best_key = None, None
        for i, name in enumerate(tl.values):
            if name in tl.ddr or name in here or not tl.size[name]:
                continue
            span = tl.ocm_span(name, core)
            if span is not None and span[0] <= t <= span[1]:
                steps = tl.touches[name][core]
                j = bisect_right(steps, t)
                key = (-len(steps) if need else 0, tl.size[name] >= need,
                       steps[j] if j < len(steps) else tl.last + 2, tl.size[name], -i)
                if best_key is None or key > best_key:
                    best, best_key = name, key
        return best

    def _prefetch(self, tl: Timeline) -> None:
        """Issue loads early (the core's DMA engine moves them while the nodes between run)
        while the bound stays within the OCM: each as early as ``prefetch_window`` node
        steps allow, none before the core's load for an earlier node; where the placement
        fragments, later (:meth:`_place_prefetched`); where that does not fit, with half
        the window the same way, down to one node, else none. What the host made for a
        core to read once (a camera's rows it cut) is loaded the same way, so that it
        arrives while the core computes what comes before (its reader, a quantize, has
        little work to hide the load under); where its load cannot be issued early it stays
        in OCM, loaded by its reader."""
        fed = [name for name in tl.values if tl.fed_once(name) and name not in tl.ddr]
        for name in fed:
            tl.to_ddr(name)
        windows = [self.prefetch_window >> k for k in range(self.prefetch_window.bit_length())]
        for window in dict.fromkeys(windows + [1]):     # what fragments with 8 may fit with 4
            issued: dict[int, int] = {}      # per core: where its last load was issued
            for i in range(1, len(tl.nodes)):
                for name in tl.loads(i):
                    at = self._issue_step(tl, name, i, window, issued.get(tl.core[i], 0))
                    if at is not None:
                        tl.add_prefetch(name, i, at)
                    issued[tl.core[i]] = i if at is None else at
            tl.add_spills(self.ocm)              # where the loads issued early leave room
            if self._place_prefetched(tl):
                for name in fed:          # the same bytes and steps as its load buffer
                    if not any((name, i) in tl.prefetch for i in tl.readers[name]):
                        tl.to_ocm(name)
                return
            tl.clear_prefetch()
            for name in list(tl.spills):
                tl.sync_store(name)
        for name in fed:
            tl.to_ocm(name)

    def _place_prefetched(self, tl: Timeline) -> bool:
        """Place with the loads issued early and the stores asynchronous. Where a core's
        placement does not fit (fragmentation), at the fullest step of the overflowing
        buffer: its stores still running there become synchronous, else its loads in
        flight there are issued at their readers, else all its stores become synchronous;
        until it fits, or nothing is left to give up."""
        while tl.prefetch or tl.spills:
            bufs, figures, core = self._place(tl, search=False)
            if figures is not None:
                return True
            top = max((b for b in bufs if b.core == core), key=lambda b: b.offset + b.size)
            t = top.start + int(tl.live[core][top.start:top.end + 1].argmax())
            stores = [name for name in tl.spills if tl.core[tl.producer[name]] == core]
            running = [name for name in stores
                       if tl.producer[name] < t <= tl.next_on_core[tl.producer[name]]]
            late = [(name, i) for (name, i), at in tl.prefetch.items()
                    if tl.core[i] == core and at <= t < i]
            if running or not late:
                if not (running or stores):
                    break
                for name in running or stores:
                    tl.sync_store(name)
                self.stat("spills-made-synchronous", len(running or stores))
                continue
            for name, i in late:
                tl.delay_prefetch(name, i, i)
            self.stat("prefetches-delayed", len(late))
        return False

    def _issue_step(self, tl: Timeline, name: str, i: int, window: int, floor: int
                    ) -> int | None:
        """The earliest node of its core, at most ``window`` before node ``i``, at
        which the load of ``name`` fits the core's OCM at every step up to ``i``, after the
        value was made (and stored) and with no node of the other side (host, device)
        between (None: not even one node early). The nodes run stage after stage
        (:func:`~bevir.target.schedule.run_order`): the host's cuts of a camera come
        before the device stage that loads them."""
        core, side = tl.core[i], lowerable(tl.nodes[i])
        live, size, at, mine = tl.live[core], tl.size[name], None, 0
        for j in range(i - 1, floor - 1, -1):
            if tl.made_at.get(name, -1) >= j or lowerable(tl.nodes[j]) != side or \
                    live[j] + size > self.ocm:
                break
            if tl.core[j] == core:          # issued before a node of its core
                at, mine = j, mine + 1
                if mine >= window:
                    break
        return at

    # ---- writing the plan into the graph ------------------------------------------------
    def _materialize(self, graph: Graph, sched: Timeline, bufs: list[Buffer],
                     figures: dict[int, dict]) -> None:
        nodes = list(graph.nodes)
        loads = [sched.loads(i) for i in range(len(nodes))]     # before stores rename uses
        key_value: dict[BufferKey, Value] = {}
        ddr_value: dict[str, Value] = {}
        for v in list(graph.inputs) + list(graph.constants.values()):
            if v.name in sched.ddr:
                v.meta["mem"] = "ddr"
                ddr_value[v.name] = v
        for i, n in enumerate(nodes):             # stores after the producers
            after = n
            for v in n.outputs:
                if v.name in sched.ddr and (i in sched.stages or v.name not in sched.producer):
                    # written to DDR directly (a streamed node's, the host's)
                    v.meta["mem"] = "ddr"
                    ddr_value[v.name] = v
                elif v.name in sched.ddr:
                    s = self._dma(graph, v, "ocm", "ddr", n, after=after)
                    if v.name in sched.spills:
                        s.meta["async"] = True
                    kept = sched.kept_for(v.name)
                    for user, j in list(v.uses):
                        if user is not s and (kept is None or user is not nodes[kept]):
                            user.set_input(j, s.output)
                    for k, o in graph.outputs.items():
                        if o is v:
                            graph.outputs[k] = s.output
                    ddr_value[v.name], after = s.output, s
        issued: dict[int, list[tuple[str, int]]] = {}    # loads before their users, or
        for i in range(len(nodes)):                      # where they are issued early
            for name in loads[i]:
                issued.setdefault(sched.prefetch.get((name, i), i), []).append((name, i))
        for at, n in enumerate(nodes):
            for name, i in issued.get(at, ()):
                self._load(graph, name, i, nodes[i], n, ddr_value, key_value)
        for v in graph.values():
            key_value.setdefault(BufferKey(v.name), v)
        stage = {stage_key(nodes[i]): (nodes[i], stripes)
                 for i, (stripes, _) in sched.stages.items()}
        for b in bufs:
            if b.key in stage:
                node, stripes = stage[b.key]
                node.meta["stream"] = {"core": b.core, "stripes": stripes, "offset": b.offset,
                                       "size": b.size}
                self.stat("streamed-ops")
                continue
            v = key_value[b.key]
            v.meta.setdefault("mem", "ocm")
            v.meta["ocm"] = v.meta.get("ocm", []) + [{"core": b.core, "offset": b.offset,
                                                      "size": b.size}]
        for name, k in sched.over.items():      # a result over its operand: its buffer
            v = sched.values[name]
            v.meta["mem"] = "ocm"
            v.meta["ocm"] = [dict(p) for p in sched.values[sched.alias[name]].meta["ocm"]]
            v.producer.meta["in_place"] = k
            self.stat("results-over-operands")
        self._record(graph, sched, figures)

    def _dma(self, graph: Graph, v: Value, src: str, dst: str, node: Node, **where) -> Node:
        d = graph.create_node("dma_copy", [v], {"src": src, "dst": dst}, loc=node.loc,
                              names=[graph.unique_name(f"{v.name}_{dst}")], **where)
        for key in ("core", "piece"):           # a piece's DMA streams beside the others
            if key in node.meta:
                d.meta[key] = node.meta[key]
        if dst == "ddr":
            d.output.meta["mem"] = "ddr"
        self.stat("dma-ops")
        self.stat("dma-bytes", v.type.nbytes)
        return d

    def _load(self, graph: Graph, name: str, i: int, user: Node, before: Node,
              ddr_value: dict[str, Value], key_value: dict[BufferKey, Value]) -> None:
        src = ddr_value[name]
        d = self._dma(graph, src, "ddr", "ocm", user, before=before)
        for j, v in enumerate(user.inputs):
            if v is not None and v.name in (name, src.name):
                user.set_input(j, d.output)
        key_value[BufferKey(name, load=i)] = d.output

    def _record(self, graph: Graph, sched: Timeline, figures: dict[int, dict[str, int]]) -> None:
        ddr = list(sched.ddr)
        sizes = {v.name: v.type.nbytes for v in graph.values()}
        graph.meta["memory_plan"] = {
            "version": PLAN_VERSION,
            "options": {"ocm": self.ocm, "cores": self.cores, "shared": self.shared,
                        "align": self.align, "seed": self.seed,
                        "search_steps": self.search_steps,
                        "search_patience": self.search_patience,
                        "double_buffer": self.double_buffer,
                        "prefetch_window": self.prefetch_window,
                        **({"hw": self.hw.option_text(), "hw_hash": self.hw.hash}
                           if self.hw is not None else {})},
            "cores": [{"core": c, **figures[c]} for c in sorted(figures)],
            "ddr_values": ddr,
            "ddr_bytes": sum(sizes[n] for n in ddr),
            "prefetched_loads": len(sched.prefetch),
            # before any spill: every value in OCM on each core holding it
            "liveness_bound": max(sched.bound_in_ocm.values(), default=0),
            "forced": [n for n in ddr if n in sched.streamed_values],
            "forced_bytes": sum(sizes[n] for n in ddr if n in sched.streamed_values),
            "spilled": [n for n in ddr if n not in sched.streamed_values],
            "spilled_bytes": sum(sizes[n] for n in ddr if n not in sched.streamed_values),
        }
        bound = max(f["lower_bound"] for f in figures.values()) if figures else 0
        peak = max(f["peak"] for f in figures.values()) if figures else 0
        self.stat("lower-bound", bound)
        self.stat("peak", peak)
        self.stat("ddr-values", len(ddr))
        self.stat("prefetched-loads", len(sched.prefetch))
        self.stat("search-steps", sum(f["search_steps"] for f in figures.values()))


# ---- reading and checking a plan ----------------------------------------------------------
@dataclass
class MemoryPlan:
    """A graph's memory plan as data (read back from its meta by :func:`memory_plan_of`)."""

    options: dict
    cores: list[dict]
    buffers: list[dict]          # value, core, offset, size, start, end
    ddr_values: list[str]
    ddr_bytes: int
    dma_ops: int
    dma_bytes: int
    prefetched_loads: int
    #: the largest bytes live at once on a core with every value in OCM (before spilling)
    liveness_bound: int
    #: values in DDR because an op's operands and results exceed the OCM (streamed), and
    #: values the plan chose to move there (spilled), with their bytes
    forced: list[str]
    forced_bytes: int
    spilled: list[str]
    spilled_bytes: int
    #: bytes the plan's dma_copy ops load into OCM and store to DDR
    reload_bytes: int
    store_bytes: int

    def to_json(self) -> str:
        """The plan as JSON text, keys sorted: equal plans give equal bytes."""
        return json.dumps(self.__dict__, sort_keys=True, indent=1)

    def ratio(self, core: int | None = None) -> float:
        """Peak over lower bound (the worst core by default)."""
        cs = self.cores if core is None else [c for c in self.cores if c["core"] == core]
        return max((c["peak"] / c["lower_bound"] if c["lower_bound"] else 1.0) for c in cs)

    def summary(self) -> str:
        o = self.options
        lines = [f"memory plan: OCM {o['ocm']} bytes x {o['cores']} core(s)"
                 f"{' shared' if o['shared'] else ''}, align {o['align']}"]
        for c in self.cores:
            r = c["peak"] / c["lower_bound"] if c["lower_bound"] else 1.0
            lines.append(f"  core {c['core']}: peak {c['peak']} / lower bound {c['lower_bound']}"
                         f" = {r:.3f} ({100 * c['peak'] / o['ocm']:.1f}% of OCM)")
        lines.append(f"  liveness bound before spilling: {self.liveness_bound:,} bytes "
                     f"({self.liveness_bound / o['ocm']:.1f}x the OCM)")
        lines.append(f"  DDR: {len(self.ddr_values)} values, {self.ddr_bytes:,} bytes: "
                     f"{len(self.forced)} forced ({self.forced_bytes:,} bytes: streamed ops "
                     f"larger than the OCM), {len(self.spilled)} spilled by choice "
                     f"({self.spilled_bytes:,} bytes); {self.dma_ops} dma_copy ops reload "
                     f"{self.reload_bytes:,} and store {self.store_bytes:,} bytes, "
                     f"{self.prefetched_loads} loads double-buffered")
        return "\n".join(lines)


def _options(graph: Graph) -> dict:
    plan = graph.meta.get("memory_plan")
    if plan is None:
        raise VerifyError(f"graph @{graph.name} has no memory plan (run plan-memory)")
    return plan["options"]


def memory_plan_of(graph: Graph) -> MemoryPlan:
    """The plan held in ``graph``'s meta, with live ranges recomputed from the graph."""
    meta = graph.meta.get("memory_plan")
    o = _options(graph)
    by_name = _placed(graph)
    bufs = []
    for b in graph_timeline(graph, o["cores"], o["shared"], o["align"]):
        placed = _placement(by_name[b.key], b.core)
        bufs.append({"value": b.key.value, "stage": b.key.stage, "core": b.core,
                     "start": b.start, "end": b.end,
                     "offset": placed["offset"] if placed else None,
                     "size": placed["size"] if placed else b.size})
    dmas = [n for n in graph.nodes if n.op == "dma_copy"]
    moved = lambda dst: sum(n.output.type.nbytes for n in dmas if n.attrs["dst"] == dst)  # noqa: E731
    return MemoryPlan(o, meta["cores"], bufs, meta["ddr_values"], meta["ddr_bytes"], len(dmas),
                      sum(n.output.type.nbytes for n in dmas), meta["prefetched_loads"],
                      meta["liveness_bound"], meta["forced"], meta["forced_bytes"],
                      meta["spilled"], meta["spilled_bytes"], moved("ocm"), moved("ddr"))


def _placement(v: Value | Node, core: int) -> dict | None:
    """Where ``v`` (a value, or a streamed node's stage) sits on ``core``, or None."""
    if isinstance(v, Node):
        return v.meta["stream"] if v.meta["stream"]["core"] == core else None
    return next((p for p in v.meta.get("ocm", []) if p["core"] == core), None)


def _placed(graph: Graph) -> dict[BufferKey, Value | Node]:
    """The placed things by buffer key: values, and streamed nodes by their stage."""
    return {**{BufferKey(v.name): v for v in graph.values()},
            **{stage_key(n): n for n in graph.nodes if "stream" in n.meta}}


def verify_memory_plan(graph: Graph) -> None:
    """Check ``graph``'s memory plan against liveness recomputed from the graph: every
    value a node touches is placed on that node's core or explicitly in DDR (then only DMAs
    touch it), every buffer lies within its core's OCM, aligned, and no two buffers live
    at a common step overlap. VerifyError naming the values otherwise."""
    o = _options(graph)
    held = held_in_ocm(graph)
    for n in graph.nodes:
        for v in held(n):
            if v.meta.get("mem") == "ddr" and n.op != "dma_copy" and "stream" not in n.meta:
                raise VerifyError(f"%{v.name} is in DDR but read by a node that is neither a "
                                  "dma_copy nor streamed", node=n.name, op=n.op, loc=n.loc)
    by_name = _placed(graph)
    per_core: dict[int, list[tuple[Buffer, int]]] = {}
    for b in graph_timeline(graph, o["cores"], o["shared"], o["align"]):
        p = _placement(by_name[b.key], b.core)
        if p is None:
            raise VerifyError(f"{b.key} is neither placed on core {b.core} nor in DDR")
        if p["size"] < b.size or p["offset"] % o["align"] or p["offset"] < 0 \
                or p["offset"] + p["size"] > o["ocm"]:
            raise VerifyError(f"{b.key} at [{p['offset']}, {p['offset'] + p['size']}) on core "
                              f"{b.core} is not an aligned {b.size}-byte buffer within the "
                              f"{o['ocm']}-byte OCM")
        b.offset = p["offset"]
        per_core.setdefault(b.core, []).append(b)
    for core, bufs in per_core.items():
        for i, js in enumerate(conflicts(bufs)):
            a = bufs[i]
            for j in js:
                c = bufs[j]
                if j > i and a.size and c.size and a.offset < c.offset + c.size \
                        and c.offset < a.offset + a.size:
                    raise VerifyError(
                        f"{a.key} [{a.offset}, {a.offset + a.size}) and {c.key} "
                        f"[{c.offset}, {c.offset + c.size}) overlap on core {core} while both "
                        f"are live (steps {max(a.start, c.start)}..{min(a.end, c.end)})")
