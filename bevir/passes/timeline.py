"""The memory plan's timeline: the buffers a graph's nodes hold in each core's OCM, step
by step, and their live bytes as values move to DDR and loads are issued early (read and
updated by plan-memory, :mod:`bevir.passes.memory_plan`; :func:`graph_timeline` is the
verifier's view of a planned graph)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..target.schedule import core_of, held_tensors, lowerable


@dataclass(frozen=True, order=True)
class BufferKey:
    """What a buffer holds: value ``value``, as loaded from DDR for the node at step
    ``load`` (None: the value itself), or the stage buffer of streamed node ``stage``."""

    value: str
    load: int | None = None
    stage: bool = False

    def __str__(self) -> str:
        if self.stage:
            return f"the stage buffer of {self.value}"
        return f"%{self.value}" + (f" (loaded for step {self.load})" if self.load is not None
                                   else "")


@dataclass(frozen=True)
class Step:
    """One step of the timeline: the OCM buffers it touches, on its core."""

    core: int
    keys: tuple[BufferKey, ...]
    node: Node            # the node run (for a planned DMA: the node it serves)
    compute: bool         # False for a DMA


@dataclass
class Buffer:
    """One value on one core: ``size`` bytes (aligned) live in steps [start, end]."""

    key: BufferKey
    core: int
    size: int
    start: int
    end: int
    offset: int = -1


def _align(n: int, align: int) -> int:
    return -(-n // align) * align


def node_core(node: Node, cores: int, shared: bool) -> int:
    """The core whose OCM a node uses: its core (``node.meta["core"]``), 0 for a shared
    OCM."""
    return 0 if shared else core_of(node, cores)


def _distinct(keys: Iterable[BufferKey]) -> tuple[BufferKey, ...]:
    return tuple(dict.fromkeys(keys))


def _buffers(steps: Sequence[Step], sizes: dict[BufferKey, int],
             pinned_in: Iterable[BufferKey], pinned_out: Iterable[BufferKey]) -> list[Buffer]:
    """The buffers of a timeline, in order of first touch (the order ties break by)."""
    last = max(len(steps) - 1, 0)
    bufs: dict[tuple[int, BufferKey], Buffer] = {}
    for t, s in enumerate(steps):
        for k in s.keys:
            b = bufs.get((s.core, k))
            if b is None:
                bufs[s.core, k] = Buffer(k, s.core, sizes[k], t, t)
            else:
                b.end = t
    pinned_in, pinned_out = list(pinned_in), list(pinned_out)
    for b in bufs.values():
        if b.key in pinned_in:
            b.start = 0
        if b.key in pinned_out:
            b.end = last
    return list(bufs.values())


def held_in_ocm(graph: Graph) -> Callable[[Node], list[Value]]:
    """What a node of ``graph`` holds in its core's OCM when planned there
    (:func:`~bevir.target.schedule.held_tensors`), and nothing for a host node of a graph
    with device nodes: the host reads and writes DDR. A graph with no device node is planned
    as if all of it ran on the device."""
    device = any(lowerable(n) for n in graph.nodes)
    return lambda n: held_tensors(n) if not device or lowerable(n) else []


def overwritable(node: Node) -> list[int]:
    """The operands ``node``'s device kernel may write its result over
    (:attr:`~bevir.ir.opdef.OpDef.result_over_operand`): those of the result's type."""
    if len(node.outputs) != 1 or not node.opdef.result_over_operand:
        return []
    out = node.output.type
    return [k for k, v in enumerate(node.inputs)
            if v is not None and not v.is_const and v.type.shape == out.shape
            and v.type.dtype.itemsize == out.dtype.itemsize and v.type.layout == out.layout]


def in_place_roots(graph: Graph) -> dict[str, str]:
    """Each result the memory plan put over an operand (``node.meta["in_place"]``: the
    operand's index) -> the value whose buffer it shares (through chains)."""
    alias: dict[str, str] = {}
    for n in graph.nodes:
        k = n.meta.get("in_place")
        if k is not None:
            x = n.inputs[k].name
            alias[n.output.name] = alias.get(x, x)
    return alias


def graph_timeline(graph: Graph, cores: int = 1, shared: bool = False, align: int = 1
                   ) -> list[Buffer]:
    """The buffers of ``graph`` as it stands: every value not marked ``mem="ddr"`` on
    each core that touches it, with its live range, and the stage buffer of each streamed
    node (the verifier's view)."""
    ocm = lambda v: v.meta.get("mem", "ocm") != "ddr"  # noqa: E731
    alias = in_place_roots(graph)
    key = lambda v: BufferKey(alias.get(v.name, v.name))  # noqa: E731
    stages = [n for n in graph.nodes if "stream" in n.meta]
    held = held_in_ocm(graph)
    keys = [[key(v) for v in held(n) if ocm(v)] + [stage_key(n)] * ("stream" in n.meta)
            for n in graph.nodes]
    for t, n in enumerate(graph.nodes):      # an asynchronous store's source: through the
        if n.meta.get("async"):              # core's next node
            core = node_core(n, cores, shared)
            nxt = next((u for u in range(t + 1, len(keys)) if graph.nodes[u].op != "dma_copy"
                        and node_core(graph.nodes[u], cores, shared) == core), None)
            if nxt is not None:
                keys[nxt].append(key(n.inputs[0]))
    steps = [Step(node_core(n, cores, shared), _distinct(k), n, n.op != "dma_copy")
             for n, k in zip(graph.nodes, keys)]
    sizes = {key(v): _align(v.type.nbytes, align) for v in graph.values()}
    sizes.update({stage_key(n): n.meta["stream"]["size"] for n in stages})
    return _buffers(steps, sizes,
                    [key(v) for v in graph.inputs if ocm(v)],
                    [key(v) for v in graph.outputs.values() if ocm(v)])


# ---- the plan's timeline: node steps, some values in DDR, some loads prefetched ------------


class Timeline:
    """The graph's buffers by node step, with live bytes per core kept up to date as values
    move to DDR (``ddr``) and loads are issued early (``prefetch``: (value, node) -> the
    step it is issued at).

    Node steps suffice: a DMA before node ``i`` touches a subset of what node ``i`` touches
    (its load is node ``i``'s operand), one after it a subset of node ``i``'s results, so the
    live bytes peak at node steps and a placement without conflicts there has none at the
    DMA steps either. A value in OCM is live on each core that touches it from that core's
    first touch to its last (graph inputs from step 0, outputs to the last step); a value in
    DDR is a load buffer at each node that reads it (from the step it is issued at, when
    prefetched) and, with a producer, its result buffer until the store."""

    def __init__(self, graph: Graph, cores: int, shared: bool, align: int, ocm: int,
                 stream: bool = True):
        self.graph, self.nodes, self.align = graph, graph.nodes, align
        self.core = [node_core(n, cores, shared) for n in self.nodes]
        self.last = max(len(self.nodes) - 1, 0)
        self.ddr: dict[str, None] = {}
        self.prefetch: dict[tuple[str, int], int] = {}
        self.spills: set[str] = set()      # DDR values whose store runs on the DMA engine
        index = {id(n): i for i, n in enumerate(self.nodes)}
        self.values: dict[str, Value] = {}
        self._ocm: dict[str, list[tuple]] = {}      # ocm_intervals, by value
        self.size: dict[str, int] = {}
        self.touches: dict[str, dict[int, list[int]]] = {}   # value -> core -> node steps
        self.readers: dict[str, list[int]] = {}
        self.held = held_in_ocm(graph)
        for i, n in enumerate(self.nodes):
            held = self.held(n)
            for v in n.tensors():
                self._see(v, align)
            for v in held:
                self.touches[v.name].setdefault(self.core[i], []).append(i)
            held_ids = {id(v) for v in held}
            for v in n.distinct_inputs():
                if id(v) in held_ids:
                    self.readers[v.name].append(i)
        self.made_at = {v.name: index[id(v.producer)] for v in self.values.values()
                        if v.producer is not None}
        self.producer = {name: i for name, i in self.made_at.items() if self.held(self.nodes[i])}
        self.next_on_core: list[int | None] = [None] * len(self.nodes)
        after: dict[int, int] = {}
        for i in range(len(self.nodes) - 1, -1, -1):
            self.next_on_core[i] = after.get(self.core[i])
            after[self.core[i]] = i
        self.pinned_in = {v.name for v in graph.inputs}
        self.pinned_out = {v.name for v in graph.outputs.values()}
        for v in list(graph.inputs) + list(graph.outputs.values()):
            self._see(v, align)                 # held nowhere if no node holds it
        self.alias: dict[str, str] = {}     # a result over an operand -> the shared buffer's
        self.over: dict[str, int] = {}      # ... and the operand's index at its producer
        self._own: dict[str, dict[int, list[int]]] = {}   # their touches, unmerged
        self._merge_in_place()
        self.live = {c: np.zeros(len(self.nodes) or 1, dtype=np.int64)
                     for c in sorted({c for t in self.touches.values() for c in t} | {0})}
        for name in self.values:
            self._add(self.ocm_intervals(name), +1)
        self.bound_in_ocm = {c: int(live.max()) for c, live in self.live.items()}
        self.stages = self._stages(ocm) if stream else {}
        for i, (_, size) in self.stages.items():
            self.live[self.core[i]][i] += size
        self.streamed_values = {v.name for i in self.stages for v in self.held(self.nodes[i])}
        for name in self.values:
            if name in self.streamed_values:
                self.to_ddr(name)

    def _merge_in_place(self) -> None:
        """Give a result and an operand it may be written over (:func:`overwritable`) one
        buffer where the operand dies at the node, both on its core alone and neither a
        graph input or output: the buffer lives from the operand's first step to the
        result's last. Undone where either moves to DDR (:meth:`unmerge`)."""
        for i, n in enumerate(self.nodes):
            for k in overwritable(n):
                if self._merge(i, k):
                    break

    def _merge(self, i: int, k: int) -> bool:
        n = self.nodes[i]
        x, y, c = n.inputs[k].name, n.output.name, self.core[i]
        tx, ty = self._own.get(x, self.touches[x]), self.touches[y]
        if (list(tx) != [c] or list(ty) != [c] or tx[c][-1] != i or ty[c][0] != i
                or x == y or self.size[x] != self.size[y] or x in self.ddr or y in self.ddr
                or {x, y} & (self.pinned_in | self.pinned_out)):
            return False
        root = self.alias.get(x, x)
        self._own.setdefault(root, {c: list(self.touches[root][c])})
        self._own[y] = {c: list(ty[c])}
        self._touch(root, {c: sorted(set(self.touches[root][c]) | set(ty[c]))})
        self._touch(y, {})
        self.alias[y], self.over[y] = root, k
        return True

    def unmerge(self, name: str) -> list[tuple[int, int]]:
        """Separate the buffers shared with ``name`` again (each value its own); the
        merges undone, as (node step, operand), for :meth:`remerge`."""
        root = self.alias.get(name, name)
        group = [y for y, r in self.alias.items() if r == root]
        if not group:
            return []
        undone = [(self.made_at[y], self.over[y]) for y in group]
        self._add(self.intervals(root), -1)
        self._touch(root, self._own.pop(root))
        for y in group:
            del self.alias[y], self.over[y]
            self._touch(y, self._own.pop(y))
        for v in (root, *group):
            self._add(self.intervals(v), +1)
        return undone

    def remerge(self, undone: list[tuple[int, int]]) -> None:
        """Merge again what :meth:`unmerge` separated."""
        for i, k in sorted(undone):
            names = [self.nodes[i].inputs[k].name, self.nodes[i].output.name]
            roots = {self.alias.get(v, v) for v in names}
            for v in roots:
                self._add(self.intervals(v), -1)
            self._merge(i, k)
            for v in {self.alias.get(v, v) for v in names} | roots:
                self._add(self.intervals(v), +1)

    def _stages(self, ocm: int) -> dict[int, tuple[int, int]]:
        """The nodes whose operands and results together exceed the OCM: they stream them
        between DDR and a stage buffer of two stripes (one filled while the other is
        computed on), each stripe at most a quarter of the OCM. Node -> (stripes, bytes)."""
        out = {}
        for i, n in enumerate(self.nodes):
            working = sum(self.size[name] for name in
                          {self.alias.get(v.name, v.name) for v in self.held(n)})
            if working > ocm:
                out[i] = self._stage(working, ocm)
        return out

    def _stage(self, working: int, ocm: int) -> tuple[int, int]:
        stripes = -(-working // max(ocm // 4, 1))
        return stripes, 2 * _align(-(-working // stripes), self.align)

    def stream(self, i: int, ocm: int) -> None:
        """Stream node ``i`` (a node whose tensors fit the OCM only without fragments)."""
        held = {v.name for v in self.held(self.nodes[i])}
        moved = [name for name in held if name in self.ddr]
        for name in moved:
            self._add(self.ddr_intervals(name), -1)
        self.stages[i] = self._stage(sum(self.size[name] for name in held), ocm)
        self.live[self.core[i]][i] += self.stages[i][1]
        for name in moved:
            self._add(self.ddr_intervals(name), +1)
        self.streamed_values |= held
        for name in held - set(moved):
            self.to_ddr(name)

    def _see(self, v: Value, align: int) -> None:
        if v.name not in self.values:
            self.values[v.name], self.size[v.name] = v, _align(v.type.nbytes, align)
            self.touches[v.name], self.readers[v.name] = {}, []

    # ---- intervals (core, start, end, key) of one value -------------------------------
    def ocm_intervals(self, name: str) -> list[tuple]:
        """Remembered: they change only with the value's touches (:meth:`_touch`)."""
        out = self._ocm.get(name)
        if out is None:
            key = BufferKey(name)
            out = self._ocm[name] = [(c, *self.ocm_span(name, c), key)
                                     for c in self.touches[name]]
        return out

    def _touch(self, name: str, touches: dict[int, list[int]]) -> None:
        self.touches[name] = touches
        self._ocm.pop(name, None)

    def ocm_span(self, name: str, core: int) -> tuple[int, int] | None:
        """The first and last step ``name`` lives in ``core``'s OCM (None: never)."""
        steps = self.touches[name].get(core)
        if steps is None:
            return None
        start = 0 if name in self.pinned_in or not steps else steps[0]
        end = self.last if name in self.pinned_out or not steps else steps[-1]
        return start, end

    def ddr_intervals(self, name: str) -> list[tuple]:
        kept = self.kept_for(name)
        out = [(self.core[i], self.prefetch.get((name, i), i), i, BufferKey(name, load=i))
               for i in self.readers[name] if i not in self.stages and i != kept]
        p = self.producer.get(name)
        if p is not None and p not in self.stages:      # its result, until stored and read
            end = self.next_on_core[p] if name in self.spills else self._stored(name)
            out.append((self.core[p], p, end, BufferKey(name)))
        return out

    def _stored(self, name: str) -> int:
        """The last step a DDR value's result stays in OCM with its store synchronous."""
        kept = self.kept_for(name)
        return self.producer[name] if kept is None else kept

    def may_spill(self, name: str) -> bool:
        """Whether the store of DDR value ``name`` may run on its core's DMA engine while
        the producer core's next node runs (its result then stays in OCM through that
        node): where only that core reads it (no other core waits for the store)."""
        p = self.producer.get(name)
        if p is None or p in self.stages or self.next_on_core[p] is None:
            return False
        return all(self.core[i] == self.core[p] for i in self.readers[name])

    def add_spills(self, ocm: int) -> None:
        """Make the stores asynchronous where the bound stays within the OCM."""
        for name in self.ddr:
            if self.may_spill(name):
                p = self.producer[name]
                extra = slice(self._stored(name) + 1, self.next_on_core[p] + 1)
                live = self.live[self.core[p]]
                if extra.start >= extra.stop or int(live[extra].max()) + self.size[name] <= ocm:
                    self.spills.add(name)
                    live[extra] += self.size[name]

    def sync_store(self, name: str) -> None:
        """Make the store of ``name`` synchronous again."""
        p = self.producer[name]
        self.spills.discard(name)
        self.live[self.core[p]][self._stored(name) + 1:self.next_on_core[p] + 1] -= \
            self.size[name]

    def kept_for(self, name: str) -> int | None:
        """The reader of DDR value ``name`` that reads its result in OCM rather than a load:
        the producer core's next node, where it reads the value (no node between would hide
        the load, and the bytes stay live from the store to the reload anyway)."""
        p = self.producer.get(name)
        i = None if p is None or p in self.stages else self.next_on_core[p]
        return i if i is not None and i not in self.stages and i in self.readers[name] else None

    def intervals(self, name: str) -> list[tuple]:
        return self.ddr_intervals(name) if name in self.ddr else self.ocm_intervals(name)

    def _add(self, intervals: list[tuple], sign: int) -> None:
        for c, start, end, key in intervals:
            self.live[c][start:end + 1] += sign * self.size[key.value]

    def fits(self, ocm: int) -> bool:
        return all(int(live.max()) <= ocm for live in self.live.values())

    # ---- moves ------------------------------------------------------------------------
    def to_ddr(self, name: str) -> None:
        self.unmerge(name)
        self._add(self.ocm_intervals(name), -1)
        self.ddr[name] = None
        self._add(self.ddr_intervals(name), +1)

    def to_ocm(self, name: str) -> None:
        self._add(self.ddr_intervals(name), -1)
        del self.ddr[name]
        self._add(self.ocm_intervals(name), +1)

    def add_prefetch(self, name: str, i: int, at: int) -> None:
        """Issue the load of ``name`` for node ``i`` at step ``at`` (< i)."""
        self.prefetch[name, i] = at
        self.live[self.core[i]][at:i] += self.size[name]

    def delay_prefetch(self, name: str, i: int, at: int) -> None:
        """Issue the load of ``name`` for node ``i`` at step ``at`` (``i``: at its reader),
        and the loads of the core's later readers issued before ``at`` at ``at`` too: a
        core's DMA engine runs its loads in the order they were issued, so none waits behind
        one for a later reader."""
        core = self.core[i]
        for (other, j), start in list(self.prefetch.items()):
            if self.core[j] == core and j >= i and start < at:
                self.live[core][start:min(at, j)] -= self.size[other]
                if at >= j:
                    del self.prefetch[other, j]
                else:
                    self.prefetch[other, j] = at

    def clear_prefetch(self) -> None:
        for (name, i), at in self.prefetch.items():
            self.live[self.core[i]][at:i] -= self.size[name]
        self.prefetch.clear()

    def fed_once(self, name: str) -> bool:
        """Whether ``name`` is a host node's result that each core holding it reads at one
        node only: loaded from DDR for that node, it takes the same OCM bytes at the same
        steps as held there. (A graph input is held from the program's start; a constant
        is loaded by its reader, overlapping the reader's work, rather than wait in the
        DMA engine's queue behind the loads issued before it.)"""
        v = self.values[name]
        steps = self.readers[name]
        return (v.producer is not None and name not in self.producer and bool(steps)
                and name not in self.pinned_out
                and all(len(t) == 1 for t in self.touches[name].values())
                and len(steps) == len(self.touches[name]))

    # ---- what the rest of the pass reads ----------------------------------------------
    def loads(self, i: int) -> list[str]:
        if i in self.stages:
            return []                           # the node streams its DDR operands itself
        n = self.nodes[i]
        held = {id(v) for v in self.held(n)}
        return [v.name for v in n.distinct_inputs() if v.name in self.ddr and id(v) in held
                and self.kept_for(v.name) != i]

    def touched_at(self, i: int) -> set[str]:
        return {v.name for v in self.held(self.nodes[i])}

    def buffers(self) -> list[Buffer]:
        """Every buffer (in order of first touch), for placement."""
        out = [Buffer(key, c, self.size[key.value], start, end)
               for name in self.values for c, start, end, key in self.intervals(name)]
        out += [Buffer(stage_key(self.nodes[i]), self.core[i], size, i, i)
                for i, (_, size) in self.stages.items()]
        return sorted(out, key=lambda b: (b.start, b.end))


def stage_key(node: Node) -> BufferKey:
    return BufferKey(node.name, stage=True)
