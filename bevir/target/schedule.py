"""The schedule of a lowered graph: where each value lives and what each core does, step
by step. One plan for everyone: code generation (bevir/codegen/cprogram.py) emits it as C,
the cycle model (bevir/target/cycles.py) costs it, so what the model charges is what the
programs do.

    sched = schedule_of(graph)            # partitioned and memory-planned, or not
    for stage in sched.stages:            # host and device stages alternate
        for core, steps in enumerate(stage.steps):
            for step in steps: step.loads, step.args, step.stores, step.waits ...

Memory. Each core has an OCM; all cores share DDR. A value the memory plan put in OCM
(``value.meta["ocm"]``) lives at its planned offset on each core holding it; any other
value lives in DDR, where kernels address it in place. A value also gets a DDR slot where
it crosses a boundary: written by the host (graph inputs, constants, host results), read
by the host (outputs, host operands) or read on a core other than its producer's. Its
producer stores it there and publishes a ready flag; a reader on another core waits for
the flag, then loads it into its own OCM once (or reads it in place). A constant or graph
input held in OCM is loaded by each core that holds it, at its first use.

Every DDR <-> OCM movement is explicit here: a step's ``loads`` and ``stores``, and its
``args`` in DDR (a kernel reading or writing DDR in place: a ``dma_copy``, a streamed op,
any op of an unplanned graph). :attr:`Step.ddr_bytes` is their sum. An op that only
renames a row-major tensor's bytes (a reshape) with both its operand and its result in DDR
is a view: its result is its operand's DDR slot, and its step moves nothing and calls no
kernel (it waits for its operand and publishes its result). So is a ``core_gather`` whose
result crosses DDR anyway (:func:`joined_in_ddr`): its pieces' producers store them into
their ranges of its slot, and its readers wait for the pieces, not for the gathering core.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import BevirError
from ..ir.graph import Graph, Node, Value
from ..ir.types import DType, Layout
from ..ops.common import norm_axis
from ..ops.cost import view_cost

ALIGN = 64


class ScheduleError(BevirError):
    """A graph cannot be scheduled as it stands (a core that does not exist, ...)."""


# ---- which core, which side -------------------------------------------------------------
def core_of(node: Node, cores: int | None = None) -> int:
    """The core ``node`` runs on: ``node.meta["core"]`` (0 when absent), checked against
    ``cores`` when given."""
    core = node.meta.get("core", 0)
    if not isinstance(core, int) or isinstance(core, bool) or core < 0 or (
            cores is not None and core >= cores):
        of = f"one of the {cores} cores" if cores is not None else "a core index"
        raise ScheduleError(f"core {core!r} is not {of}", node=node.name, op=node.op,
                            loc=node.loc)
    return core


def lowerable(node: Node) -> bool:
    """Whether ``node`` runs on the device: it gives an integer result, a bool computed
    from integers (:func:`integer_bool`), or reads a quantized operand (fx_dequantize, the
    device's way out). Float ops (the geometry before the network, the box decoding after
    it) run on the host, and so does a quantization of floats the host computes
    (:func:`narrows_host_floats`). A ``dma_copy`` runs on the side of the node it loads
    for (a float camera image the host cut, loaded for a device quantize), or of the node
    whose result it stores."""
    if node.op == "dma_copy":
        near = ([u for u, _ in node.output.uses] if node.attrs.get("dst") == "ocm"
                else [node.inputs[0].producer])
        return any(n is not None and lowerable(n) for n in near)
    return ((any(v.type.dtype.is_int for v in node.outputs) and not narrows_host_floats(node))
            or any(v is not None and v.type.quant is not None for v in node.inputs)
            or integer_bool(node))


def narrows_host_floats(node: Node) -> bool:
    """Whether ``node`` makes integers, in fewer bytes, from floats the host computes
    (:func:`host_computed`; constants aside): a quantization of the host's pre-processing
    (BEVFormer's queries shifted by the CAN bus, its rotated positions). It runs on the
    host, so the integers cross to the device, not the floats: the host writes them where
    it would write the floats. A quantization of a graph input stays on the device, as
    someone reads the floats from DDR either way."""
    floats = [v for v in node.inputs if v is not None and not v.is_const]
    return (bool(floats) and all(v.type.dtype.is_int for v in node.outputs)
            and all(v.type.dtype.is_float and v.type.quant is None and host_computed(v)
                    for v in floats)
            and sum(v.type.nbytes for v in node.outputs) < sum(v.type.nbytes for v in floats))


def host_float_op(node: Node) -> bool:
    """Whether ``node`` is a float op the host runs: off the device, and not a quantization
    the host runs for it (:func:`narrows_host_floats`)."""
    return not lowerable(node) and not narrows_host_floats(node)


def host_computed(value: Value) -> bool:
    """Whether the host computes ``value``: a host op makes it, not a graph input passed on
    (renamed, moved or cut: a camera image's stripes)."""
    p = value.producer
    while p is not None and p.opdef.moves_data:
        data = [v for v in p.inputs if v is not None and not v.is_const]
        if len(data) != 1:
            break
        p = data[0].producer
    return p is not None and not lowerable(p)


def integer_bool(node: Node) -> bool:
    """Whether ``node`` gives a bool from integers alone: every operand an integer or a
    bool computed on the device (a comparison of token ids, the ``not`` of one). A bool
    from floats, or a bool graph input, stays on the host."""
    ins = [v for v in node.inputs if v is not None]
    return (any(v.type.dtype is DType.bool for v in node.outputs) and bool(ins)
            and all(v.type.dtype.is_int or (v.type.dtype is DType.bool and v.producer is not None
                                            and lowerable(v.producer)) for v in ins))


def stages(graph: Graph) -> list[tuple[bool, list[Node]]]:
    """The graph's nodes in stages that alternate between host (False) and device (True):
    a node's stage is the latest of its producers', one later where it changes sides; a
    device node's is also at least the previous device node's, so that the device runs its
    nodes in graph order (the order the memory plan's liveness assumes). A quantized
    network gives three: float pre-processing, the integer network, float post-processing."""
    stage: dict[int, int] = {}
    last_device = 1
    for n in graph.nodes:
        dev = lowerable(n)
        s = last_device if dev else 0
        for v in n.inputs:
            if v is not None and v.producer is not None:
                p = stage[id(v.producer)]
                s = max(s, p if (p % 2 == 1) == dev else p + 1)
        stage[id(n)] = s
        if dev:
            last_device = s
    out: list[tuple[bool, list[Node]]] = [(k % 2 == 1, [])
                                          for k in range(max(stage.values(), default=0) + 1)]
    for n in graph.nodes:
        out[stage[id(n)]][1].append(n)
    return [(dev, nodes) for dev, nodes in out if nodes]


def run_order(graph: Graph) -> list[Node]:
    """The graph's nodes in the order they run: stage after stage (:func:`stages`), each
    in graph order (a topological order: no node's stage precedes its producers')."""
    return [n for _, nodes in stages(graph) for n in nodes]


def host_round_trips(graph: Graph) -> list[list[Node]]:
    """The host stages between two device stages: each a round trip from the device to the
    host and back (float ops a quantization left in the network)."""
    st = stages(graph)
    return [nodes for k, (dev, nodes) in enumerate(st)
            if not dev and any(d for d, _ in st[:k]) and any(d for d, _ in st[k + 1:])]


def joined_in_ddr(node: Node) -> bool:
    """Whether ``node`` is a ``core_gather`` whose result is a view of its pieces in DDR:
    each piece's producer stores it straight into its range of the result's DDR slot, and
    every reader waits for the pieces and loads the result, so nothing passes through the
    gathering core. So it is where the result is read on another core or by the host (it
    crosses DDR anyway) and the pieces lie end to end in it (no axis before the joined one
    is longer than 1); each piece is made on the device, by a node that is not a view of
    another value's bytes, and is joined by no other gather."""
    if node.op != "core_gather":
        return False
    out = node.output
    axis = norm_axis(node.attrs["axis"], out.type.rank)
    if any(d != 1 for d in out.type.shape[:axis]) or len({id(x) for x in node.inputs}) != len(
            node.inputs):
        return False
    for x in node.inputs:
        p = x.producer
        if (p is None or not lowerable(p) or p.op == "barrier" or renames(p)
                or joined_in_ddr(p)
                or any(u is not node and u.op == "core_gather" for u, _ in x.uses)):
            return False
    core = core_of(node)
    graph_outputs = node.graph.outputs.values() if node.graph is not None else ()
    return (any(not lowerable(u) or core_of(u) != core for u, _ in out.uses)
            or any(o is out for o in graph_outputs))


def reads_in_place(node: Node, v: Value) -> bool:
    """Whether ``node`` reads operand ``v`` where it lies in DDR instead of from its core's
    OCM: a ranged op (``core_slice``, ``core_gather``) reading a value made on another
    core, by the host, or a graph input or constant, or a gather's view of its pieces in
    DDR (:func:`joined_in_ddr`), moves only the range it takes."""
    if not node.opdef.in_place_ranges:
        return False
    p = v.producer
    return p is None or not lowerable(p) or core_of(p) != core_of(node) or joined_in_ddr(p)


def held_tensors(node: Node) -> list[Value]:
    """The operands and results ``node`` holds in its core's OCM when they are planned
    there: all but those it reads in place (:func:`reads_in_place`); nothing for a gather
    that is a view of its pieces in DDR (:func:`joined_in_ddr`)."""
    if joined_in_ddr(node):
        return []
    return [v for v in node.inputs if v is not None and not reads_in_place(node, v)] + \
        list(node.outputs)


def renames(node: Node) -> bool:
    """Whether ``node`` only renames its operand's bytes (a reshape, flatten, squeeze or
    unsqueeze of a row-major tensor): where both lie in DDR it is a view and moves nothing."""
    row_major = (Layout.plain, Layout.nchw)
    return (node.opdef.moves_data and type(node.opdef).cycle_cost is view_cost
            and len(node.inputs) == 1 and len(node.outputs) == 1
            and node.inputs[0] is not None
            and node.inputs[0].type.layout in row_major and node.output.type.layout in row_major)


def ddr_view(node: Node, memory: "MemoryMap") -> bool:
    """Whether ``node`` (on its core) is a view of its operand's DDR bytes: it only renames
    them (:func:`renames`) and neither its operand nor its result is in its core's OCM."""
    if not renames(node):
        return False
    core = core_of(node)
    x, y = node.inputs[0], node.output
    return (x.name, core) not in memory.ocm and (y.name, core) not in memory.ocm


def graph_cores(graph: Graph) -> int:
    """The cores a graph is partitioned for (its plan's, else 1 + its highest core)."""
    plan = graph.meta.get("partition")
    if plan is not None:
        return int(plan["cores"])
    return 1 + max((core_of(n) for n in graph.nodes), default=0)


# ---- where values live ------------------------------------------------------------------
@dataclass(frozen=True)
class Place:
    """A buffer: ``mem`` ("ocm" of the step's core, or "ddr") at byte ``offset``."""

    mem: str
    offset: int


@dataclass
class MemoryMap:
    """Where every value of the device stages lives: DDR slots, OCM offsets per core, and
    the ready flags of values read on other cores."""

    cores: int
    ddr: dict[str, int] = field(default_factory=dict)              # value -> DDR offset
    ocm: dict[tuple[str, int], int] = field(default_factory=dict)  # (value, core) -> offset
    ocm_size: list[int] = field(default_factory=list)
    flags: dict[str, int] = field(default_factory=dict)            # value -> flag index
    ddr_size: int = 0
    views: dict[str, str] = field(default_factory=dict)    # value -> the value it views
    joined: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # value ->
    # its pieces and the cores that make them (:func:`joined_in_ddr`)

    def place(self, v: Value, core: int) -> Place:
        """Where ``core`` addresses ``v``: its OCM when it holds it there, else DDR."""
        off = self.ocm.get((v.name, core))
        return Place("ocm", off) if off is not None else Place("ddr", self.ddr[v.name])

    def add_ddr(self, v: Value) -> None:
        if v.name in self.views:                # a view: its operand's bytes
            self.ddr[v.name] = self.ddr[self.views[v.name]]
            return
        self.ddr[v.name] = self.ddr_size
        self.ddr_size += -(-v.type.nbytes // ALIGN) * ALIGN

    def add_joined(self, v: Value, pieces: list[Value], cores: list[int]) -> None:
        """A gather's result in DDR, its pieces (made on ``cores``) end to end in its slot
        (:func:`joined_in_ddr`)."""
        self.add_ddr(v)
        self.joined[v.name] = [(x.name, c) for x, c in zip(pieces, cores)]
        at = self.ddr[v.name]
        for x in pieces:
            self.ddr[x.name] = at
            at += x.type.nbytes


# ---- what a core does -------------------------------------------------------------------
@dataclass(frozen=True)
class Transfer:
    """One DMA between DDR and ``core``'s OCM: ``load`` (DDR -> OCM) or ``store``."""

    value: str
    core: int
    kind: str                 # "load" | "store"
    nbytes: int
    ocm: int                  # offset in the core's OCM
    ddr: int                  # offset in DDR


@dataclass(frozen=True)
class Arg:
    """A kernel argument: a value, where the core addresses it, its bytes."""

    value: str
    place: Place
    nbytes: int


@dataclass
class Step:
    """What one core does for one node: wait for the flags of operands from other cores,
    load what it holds in OCM but has not got yet, run the node's kernel on ``args``
    (operands, then results), store what others read from DDR, publish flags. A barrier
    step copies the core's pieces to the barrier's results and waits for every core."""

    core: int
    node: Node
    waits: list[str] = field(default_factory=list)
    loads: list[Transfer] = field(default_factory=list)
    args: list[Arg] = field(default_factory=list)
    stores: list[Transfer] = field(default_factory=list)
    publishes: list[str] = field(default_factory=list)
    copies: list[tuple[Arg, Arg]] = field(default_factory=list)   # barrier: (src, dst)
    view: bool = False            # its result is its operand's DDR bytes (:func:`ddr_view`)
    prefetch: bool = False        # a load the core's DMA engine runs (:func:`prefetches`)
    spill: bool = False           # a store the core's DMA engine runs (:func:`spills`)
    dma_waits: list[str] = field(default_factory=list)    # engine transfers it waits for

    @property
    def on_engine(self) -> bool:
        """Whether the step issues a transfer to the core's DMA engine (the core goes on)."""
        return self.prefetch or self.spill

    @property
    def barrier(self) -> bool:
        return self.node.op == "barrier"

    @property
    def kernel(self) -> bool:
        """Whether the step calls the node's kernel (every device node but a barrier and a
        view)."""
        return not self.barrier and not self.view and not self.on_engine

    def ddr_args(self) -> list[Arg]:
        """The buffers the step addresses in DDR in place (kernel arguments, copies)."""
        args = self.args + [a for pair in self.copies for a in pair]
        return [a for a in args if a.place.mem == "ddr"]

    def transfers(self) -> list[int]:
        """The bytes of each movement between DDR and OCM the step makes, in order:
        loads, DDR arguments addressed in place, stores."""
        return ([t.nbytes for t in self.loads] + [a.nbytes for a in self.ddr_args()]
                + [t.nbytes for t in self.stores])

    @property
    def ddr_bytes(self) -> int:
        return sum(self.transfers())


@dataclass
class Stage:
    """A run of nodes on one side: on the device, each core's steps."""

    device: bool
    nodes: list[Node]
    steps: list[list[Step]] = field(default_factory=list)     # per core (device stages)


@dataclass
class Schedule:
    """The whole plan of a graph: its memory map and its stages."""

    graph: Graph
    cores: int
    memory: MemoryMap
    stages: list[Stage]

    def steps(self, core: int | None = None) -> Iterator[Step]:
        """Every device step (of ``core``), in program order."""
        for stage in self.stages:
            for k, steps in enumerate(stage.steps):
                if core is None or k == core:
                    yield from steps

    @property
    def host_nodes(self) -> list[Node]:
        return [n for s in self.stages if not s.device for n in s.nodes]

    def ddr_bytes(self, core: int | None = None) -> int:
        """Bytes moved between DDR and OCM in one run (of ``core``)."""
        return sum(s.ddr_bytes for s in self.steps(core))


def producer_core(v: Value, device: set[int]) -> int | None:
    """The core that produces ``v`` (a barrier's result: its operand's), None for the host
    (graph inputs, constants, host nodes)."""
    n = v.producer
    if n is None or id(n) not in device:
        return None
    if n.op == "barrier":
        return producer_core(n.inputs[n.outputs.index(v)], device)
    return core_of(n)


def memory_map(graph: Graph, device: set[int], cores: int) -> MemoryMap:
    """DDR slots, OCM offsets (from the memory plan's ``meta["ocm"]``) and flags of the
    values the device stages touch (see the module docstring)."""
    mm = MemoryMap(cores, ocm_size=[0] * cores)
    touched: dict[str, Value] = {}
    readers: dict[str, set] = {}
    for n in graph.nodes:
        on_device = id(n) in device
        if on_device:
            for v in n.tensors():
                touched[v.name] = v
        for v in n.inputs:
            if v is not None:
                reader = ("host" if not on_device else None if n.op == "barrier"
                          else core_of(n))
                readers.setdefault(v.name, set()).add(reader)
    for v in graph.outputs.values():
        readers.setdefault(v.name, set()).add("host")
    for v in touched.values():
        for e in v.meta.get("ocm") or []:
            if e["core"] < cores:
                mm.ocm[(v.name, e["core"])] = e["offset"]
                mm.ocm_size[e["core"]] = max(mm.ocm_size[e["core"]], e["offset"] + e["size"])
    for n in graph.nodes:
        if id(n) in device and ddr_view(n, mm):
            mm.views[n.output.name] = n.inputs[0].name
        if id(n) in device and joined_in_ddr(n):     # its readers read its pieces
            mm.add_joined(n.output, n.inputs, [producer_core(x, device) for x in n.inputs])
            for x in n.inputs:
                readers[x.name] |= readers.get(n.output.name, set())
    for v in touched.values():
        p = producer_core(v, device)
        others = readers.get(v.name, set()) - {p, None}
        if v.name not in mm.ddr and (p is None or (v.name, p) not in mm.ocm or others):
            mm.add_ddr(v)
        if p is not None and others - {"host"} and v.name not in mm.joined:
            mm.flags[v.name] = len(mm.flags)
    return mm


def prefetches(node: Node, memory: MemoryMap) -> bool:
    """Whether ``node`` is a load the memory plan placed (``dma_copy`` from DDR into its
    core's OCM): the core's DMA engine runs it while the core goes on, and the first step
    reading its result waits for it (the plan keeps the buffer free from the load on)."""
    return (node.op == "dma_copy" and node.attrs["src"] == "ddr" and node.attrs["dst"] == "ocm"
            and (node.output.name, core_of(node)) in memory.ocm
            and node.output.name not in memory.ddr       # nothing stores it (no race)
            and (node.inputs[0].name, core_of(node)) not in memory.ocm)


def spills(node: Node, memory: MemoryMap) -> bool:
    """Whether ``node`` is a store the memory plan made asynchronous (``dma_copy`` from its
    core's OCM to DDR, ``meta["async"]``): the core's DMA engine runs it while the core goes
    on; the step after the core's next node waits for it (the plan keeps its source in OCM
    through that node), as does a step reading its result in place. Loads of its result on
    the core come after it on the engine. Not where another core reads it (its flag is
    published by the core, not the engine)."""
    return (node.op == "dma_copy" and node.attrs["src"] == "ocm" and node.attrs["dst"] == "ddr"
            and bool(node.meta.get("async")) and node.output.name not in memory.flags
            and (node.inputs[0].name, core_of(node)) in memory.ocm)


class _CorePlanner:
    """One core's steps: each node's waits, loads, arguments, stores and flags."""

    def __init__(self, core: int, memory: MemoryMap, device: set[int]):
        self.core, self.memory, self.device = core, memory, device
        self.on_chip: set[str] = set()        # values this core has loaded into its OCM
        self.waited: set[str] = set()
        self.in_flight: set[str] = set()      # prefetched, not read yet
        self.storing: dict[str, bool] = {}    # spilled, not waited for: the next node ran

    def operand(self, v: Value, step: Step, nbytes: int) -> Arg:
        """The operand where this core has it, after waiting for / loading it as needed;
        ``nbytes``: the bytes the node reads of it."""
        p = producer_core(v, self.device)
        place = self.memory.place(v, self.core)
        made = self.memory.joined.get(v.name, [(v.name, p)])
        for name, core in made:          # a gather's view in DDR: its pieces' flags
            if core != self.core and name not in self.waited and name in self.memory.flags:
                self.waited.add(name)
                step.waits.append(name)
        if v.name in self.memory.joined:
            p = None                   # made in DDR by the pieces' stores: every core loads it
        if place.mem == "ocm" and p != self.core and v.name not in self.on_chip:
            self.on_chip.add(v.name)
            step.loads.append(Transfer(v.name, self.core, "load", v.type.nbytes, place.offset,
                                       self.memory.ddr[v.name]))
        return Arg(v.name, place, nbytes)

    def result(self, v: Value, step: Step) -> Arg:
        """A result: stored to its DDR slot where it has one (and lives in OCM here), and
        its flag published."""
        place = self.memory.place(v, self.core)
        if place.mem == "ocm" and v.name in self.memory.ddr:
            step.stores.append(Transfer(v.name, self.core, "store", v.type.nbytes,
                                        place.offset, self.memory.ddr[v.name]))
        if v.name in self.memory.flags:
            step.publishes.append(v.name)
        return Arg(v.name, place, v.type.nbytes)

    def _await(self, v: str, step: Step) -> None:
        """``step`` reads ``v``: it waits for the engine's transfer of it, if in flight."""
        if v in self.in_flight or v in self.storing:
            self.in_flight.discard(v)
            self.storing.pop(v, None)
            step.dma_waits.append(v)

    def drain(self) -> None:
        """The core's DMA engine is drained at a stage's end."""
        self.in_flight.clear()
        self.storing.clear()

    def step(self, n: Node) -> Step:
        step = self._step(n)
        for v in [v for v, ran in self.storing.items() if ran]:
            del self.storing[v]                # its source may be overwritten from here
            step.dma_waits.insert(0, v)
        if n.op != "dma_copy":
            self.storing = dict.fromkeys(self.storing, True)
        if spills(n, self.memory):
            step.spill = True
            self.storing[n.output.name] = False
        return step

    def _step(self, n: Node) -> Step:
        step = Step(self.core, n)
        if n.op == "barrier":          # this core's pieces pass through, then all wait
            for x, y in zip(n.inputs, n.outputs):
                self._await(x.name, step)
                if producer_core(x, self.device) == self.core:
                    step.copies.append((self.operand(x, step, x.type.nbytes),
                                        self.result(y, step)))
            return step
        if n.output.name in self.memory.joined:    # its pieces' stores made it
            step.view = True
            return step
        if n.output.name in self.memory.views:     # a view: only its operand's flag
            self._await(n.inputs[0].name, step)
            self.operand(n.inputs[0], step, 0)
            self.result(n.output, step)
            step.view = True
            return step
        operands = [v for v in n.inputs if v is not None]
        share = _read_share(n, operands)
        step.args = [self.operand(v, step, share(v)) for v in operands] + \
            [self.result(v, step) for v in n.outputs]
        loads = prefetches(n, self.memory)     # after a spill on the engine: no wait
        for v in dict.fromkeys(v.name for v in operands):
            if not (loads and v in self.storing):
                self._await(v, step)
        if loads:
            step.prefetch = True
            self.in_flight.add(n.output.name)
        return step


def _read_share(node: Node, operands: list[Value]):
    """The bytes ``node`` reads of each operand: all of it, but for a ranged op only the
    share its cost declares (a ``core_slice`` reads its range)."""
    if not node.opdef.in_place_ranges:
        return lambda v: v.type.nbytes
    whole = sum(v.type.nbytes for v in operands)
    read = node.opdef.cost(node)["bytes_read"]
    return lambda v: v.type.nbytes * read // whole if whole else 0


def schedule_of(graph: Graph, cores: int | None = None) -> Schedule:
    """The schedule of ``graph`` as it stands (partitioned or not, memory-planned or not)
    on ``cores`` cores (default: the graph's own, :func:`graph_cores`)."""
    cores = graph_cores(graph) if cores is None else cores
    parts = stages(graph)
    device = {id(n) for dev, nodes in parts if dev for n in nodes}
    for dev, nodes in parts:
        for n in nodes if dev else ():
            core_of(n, cores)
    memory = memory_map(graph, device, cores)
    planners = [_CorePlanner(k, memory, device) for k in range(cores)]
    out = []
    for dev, nodes in parts:
        stage = Stage(dev, nodes)
        if dev:
            stage.steps = [[] for _ in range(cores)]
            for p in planners:          # each core's DMA engine is drained between stages
                p.drain()
            for n in nodes:
                for p in planners:
                    if n.op == "barrier" or core_of(n) == p.core:
                        stage.steps[p.core].append(p.step(n))
        out.append(stage)
    return Schedule(graph, cores, memory, out)
