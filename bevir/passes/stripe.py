"""stripe-images{hw=...}: run the layers whose activations the OCM cannot hold a few
images at a time, so that they stay on chip.

A network over a batch of images (BEVFormer's six cameras) computes every image alone
through its backbone: each op of it computes the images of its result from the same
images of its activations (:meth:`OpDef.region` along axis 0 reads axis 0 of every
activation by the same range, no halo). Run op after op, such a layer holds the whole
batch at once: ResNet-50's first stage over six 480x800 cameras holds 37 MB per tensor, far
more than an 8 MB OCM, so every op streams its tensors through DDR. Run a stripe of images
after another, a *group* of consecutive such ops holds one stripe's tensors: the group
becomes one copy of itself per stripe, in image order (``%y.i3`` is image 3 of ``%y``,
``%y.i0_3`` images 0 to 2), reading its images of each operand made before the group
(``core_slice``, or the stripes an earlier group made, joined) and joining each result
read after it from its stripes (``core_gather``, named as the result was). The partition
then splits every stripe's ops across the cores (by rows), and the memory plan keeps them
on chip.

Which ops: a run of consecutive ops that compute images alone is cut after its last op
whose tensors, split over the cores, exceed ``budget`` of a core's OCM: the later ops
(ResNet's last stage: small activations, large weights) run on the whole batch, loading
each weight once instead of once per stripe; unless the cycle model finds that taking some
of them into the group costs less than the join they spare (an attention's 16-bit
probabilities, head by head, joined after the product with the values instead). How many
images a stripe holds: as many (a divisor of the batch) as keep each op's tensors within
the budget and as few as any later op of the run needs, so deeper layers, whose images are
smaller, run wider stripes (a group per width); of the widths that fit, the narrowest,
unless the cycle model finds a wider one fills the array's rows (a stripe of a few rows
split over the cores leaves most of a 16-row array idle). A group's weights are read by
each of its stripes: the memory plan keeps them resident while the group runs, and a group
whose weights would not fit beside its activations is cut in consecutive groups that do
(where what crosses the cut fits).

Where a group is cut for its weights, the later ops of its run may instead run on the whole
batch: from the op where the rest of the run fits a core's OCM whole (what is live at each
op and its weights, split over the cores) and the fewest bytes cross from the stripes
before, the run is not striped (each weight loaded once, none kept through other groups'
stripes), and the stripes before run as narrow as they fit (ResNet-50 on six cameras and
four cores: the first two stages and the third's first block a camera at a time, the rest
of the third stage on the whole batch).

Cascades: the groups of a run (narrow stripes, then wider ones) run interleaved, each
stripe as soon as the images it reads are made: two one-image stripes, then the two-image
stripe that reads them, then the next two. So only a stripe's images wait between two
groups, not the whole batch (ResNet-50's second stage over six cameras: 4.6 MB a core,
which the OCM could not keep beside the third stage's weights). A cut for the weights
starts a new cascade: the groups it separates keep their weights apart, so the one after
runs once the one before has made all its stripes.

Results are bit-identical: every stripe's ops compute the same integers. Each striped node
has ``node.meta["stripe"]`` = {of, index, stripes, images, group, cascade}.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from ..errors import PassError, VerifyError
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..target.hw import HWConfig
from ..target.schedule import held_tensors, lowerable
from .analysis import AnalysisManager
from .core import Pass
from ..target.cycles import op_cost
from .partition import DEFAULT_HW, balanced, pieces_at, pieces_of
from .timeline import graph_timeline

META_KEY = "stripe_groups"
register_meta_key(META_KEY, list, doc="stripe-images: the groups of a graph, each with its "
                  "first and last op, ops, images a stripe and the widths weighed (images -> "
                  "modelled array cycles) (bevir.passes.stripe)")
register_meta_key("stripe", dict, doc="stripe-images: {of, index, stripes, images, group, "
                  "cascade} of a node computing a stripe of images of a striped node "
                  "(bevir.passes.stripe)")

#: the ops that carry pieces between cores and stripes: never striped themselves
PLUMBING = ("core_slice", "core_gather", "dma_copy", "barrier")


def working_set(node: Node) -> int:
    """Bytes of what ``node`` holds in OCM while it runs (distinct operands and results)."""
    return sum({id(v): v.type.nbytes for v in held_tensors(node)}.values())


def by_image(node: Node) -> bool:
    """Whether ``node`` computes each image of its result (axis 0) from the same image of
    each activation operand alone (constants whole)."""
    if (not lowerable(node) or node.op in PLUMBING or len(node.outputs) != 1
            or node.output.type.rank < 2 or node.output.type.shape[0] < 2):
        return False
    opdef = node.opdef
    try:
        piece = opdef.region(opdef.ctx(node), 0, 0, 1)
    except (VerifyError, ValueError):
        return False
    if piece is None:
        return False
    for i, v in enumerate(node.inputs):
        r = piece.operands[i] if i < len(piece.operands) else None
        if v is None:
            continue
        if v.is_const:
            if r is not None:
                return False
        elif r != (0, 0, 1) or v.type.shape[0] != node.output.type.shape[0]:
            return False
    return True


@dataclass
class Group:
    """Consecutive ops run ``images`` images at a time (a stripe of the batch).
    ``widths``: the array cycles the cycle model gave each width that fits (the choice
    and the alternatives it rejected); ``cascade``: the groups of a cascade run
    interleaved (:func:`interleave`)."""

    nodes: list[Node]
    images: int
    widths: dict[int, int] = field(default_factory=dict)
    cascade: int = 0

    def summary(self) -> dict:
        """The group as JSON: its first and last op, ops, images a stripe, its cascade,
        the widths weighed (images -> modelled array cycles)."""
        return {"first": self.nodes[0].output.name, "last": self.nodes[-1].output.name,
                "ops": len(self.nodes), "images": self.images, "cascade": self.cascade,
                "widths": {str(k): v for k, v in self.widths.items()}}


def groups(graph: Graph, budget: int, cores: int, hw: HWConfig | None = None,
           whole: bool = True) -> list[Group]:
    """The groups to run a few images at a time (see the module docstring), in graph
    order, each with its cascade; ``whole``: a run's later ops may run on the whole batch
    where its groups are cut for their weights (:func:`_whole_from`)."""
    out: list[Group] = []
    run: list[Node] = []
    for node in graph.nodes + [None]:
        if node is not None and by_image(node) and (
                not run or node.output.type.shape[0] == run[0].output.type.shape[0]):
            run.append(node)
            continue
        large = [k for k, n in enumerate(run) if working_set(n) > budget * cores]
        if large:
            out += _striped(run, large[-1], budget, cores, hw,
                            out[-1].cascade + 1 if out else 0, whole)
        run = [node] if node is not None and by_image(node) else []
    return out


def _striped(run: list[Node], last: int, budget: int, cores: int, hw: HWConfig | None,
             cascade: int, whole: bool) -> list[Group]:
    """The groups of a run whose last op over the budget is ``last``: up to ``last`` (or
    later: :func:`_end`), cut where their weights would not stay on chip
    (:func:`by_weights`); where such a cut is made, the groups up to where the rest of the
    run can run on the whole batch instead (:func:`_whole_from`), as narrow as they fit
    (their results wait for the whole batch anyway; a wider stripe would hold the images
    it reads waiting too)."""
    end = _end(run, last, cores, hw)
    found = _groups(run[:end + 1], budget, cores, hw, cascade)
    cut = len({g.cascade for g in found}) > 1
    start = _whole_from(run, last, cores, hw) if whole and hw and cut and end == last else None
    if start is None:
        return found
    return _groups(run[:start], budget, cores, hw, cascade, narrow=True) if start else []


def _groups(nodes: list[Node], budget: int, cores: int, hw: HWConfig | None, cascade: int,
            narrow: bool = False) -> list[Group]:
    """``nodes`` as groups of stripes (:func:`stripes_of`), each cut for its weights
    (:func:`by_weights`), numbered in cascades from ``cascade``."""
    out: list[Group] = []
    for group in stripes_of(nodes, budget * cores, cores, hw, narrow):
        cut = by_weights(group, hw.ocm_per_core - budget if hw else None, budget, cores)
        for k, part in enumerate(cut):
            part.widths = group.widths if len(cut) == 1 else {
                d: stripe_cycles(part.nodes, d, cores, hw) for d in group.widths}
            cascade += k > 0                   # a cut for the weights: a new cascade
            part.cascade = cascade
        out += cut
    return out


def _whole_from(run: list[Node], last: int, cores: int, hw: HWConfig) -> int | None:
    """Where the ops of ``run`` start to run on the whole batch, its ops before striped, or
    None (striped up to its last large op, ``last``). Candidates: the ops from which every
    op up to ``last`` fits a core's OCM on the whole batch (the activations live at it and
    its weights, split over the cores); of them, the one the fewest bytes cross to from
    the striped ops before (the first of equals). The whole-batch ops load each weight
    once, where a group's stripes would keep their weights on chip through the stripes of
    the groups before them in the cascade, or load them again (ResNet-50's third stage on
    six cameras: 7 MB of weights beside the first two stages' stripes; after its first
    block, which halves the rows, its tensors fit a core's quarter on the whole batch)."""
    graph = run[0].graph
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    spans = [(b.start, b.end, b.size, b.key.value) for b in graph_timeline(graph)
             if b.key.value not in graph.constants]      # the memory plan's live ranges
    first = None
    for k in range(last, -1, -1):
        t = pos[id(run[k])]
        live = sum(size for start, end, size, _ in spans if start <= t <= end)
        weights = sum({id(v): v.type.nbytes for v in run[k].inputs
                       if v is not None and v.is_const}.values())
        if live / cores + weights > hw.ocm_per_core:
            break
        first = k
    if first is None:
        return None
    made = {n.output.name: pos[id(n)] for n in run}
    crossing = [sum(size for _, end, size, name in spans
                    if made.get(name, len(pos)) < pos[id(run[k])] <= end)
                for k in range(first, last + 1)]
    return first + crossing.index(min(crossing))


def _end(run: list[Node], last: int, cores: int, hw: HWConfig | None) -> int:
    """The last op of the group a run's striped ops make: its last large op (``last``), or
    a later one where the cycle model finds that running the ops between one image a
    stripe costs less than joining the results read after the group would save (the join
    of an attention's probabilities, head by head, where the product with the values that
    follows makes a result 28 times smaller)."""
    if hw is None:
        return last
    batch = run[0].output.type.shape[0]
    best, best_cost, extra = last, _join_cycles(run[:last + 1], cores, hw), 0
    for k in range(last + 1, len(run)):
        extra += (stripe_cycles([run[k]], 1, cores, hw)
                  - stripe_cycles([run[k]], batch, cores, hw))
        cost = extra + _join_cycles(run[:k + 1], cores, hw)
        if cost < best_cost:
            best, best_cost = k, cost
    return best


def _join_cycles(nodes: list[Node], cores: int, hw: HWConfig) -> int:
    """The OCM cycles, per core, of joining the results of ``nodes`` that are read after
    them or by the host, from their stripes."""
    inside = {id(n) for n in nodes}
    graph = nodes[0].graph
    outputs = {id(v) for v in graph.outputs.values()} if graph is not None else set()
    joined = sum(n.output.type.nbytes for n in nodes if id(n.output) in outputs
                 or any(id(u) not in inside for u, _ in n.output.uses))
    return 2 * joined // (cores * hw.ocm_bytes_per_cycle)


def by_weights(group: Group, weights: int | None, budget: int, cores: int) -> list[Group]:
    """``group`` cut into consecutive groups whose weights stay within ``weights`` bytes
    (what a core's OCM keeps beside the activations; None: no limit), so that each keeps
    its weights on chip for all its stripes instead of loading them again for each (a
    stripe runs its group's ops one after the other: ResNet-50's third stage holds 7 MB of
    weights). A cut is made only where what crosses it, for all the stripes, split over
    the cores, fits ``budget``: the whole batch of it waits there for the next group."""
    if weights is None:
        return [group]
    out = [Group([], group.images)]
    held: dict[int, int] = {}
    for k, node in enumerate(group.nodes):
        own = {id(v): v.type.nbytes for v in node.inputs if v is not None and v.is_const}
        if (out[-1].nodes and sum({**held, **own}.values()) > weights
                and _crossing(out[-1].nodes, group.nodes[k:]) <= budget * cores):
            out.append(Group([], group.images))
            held = {}
        out[-1].nodes.append(node)
        held.update(own)
    return out


def _crossing(before: list[Node], after: list[Node]) -> int:
    """Bytes of the results of ``before`` that ``after`` reads."""
    later = {id(n) for n in after}
    return sum(n.output.type.nbytes for n in before
               if any(id(u) in later for u, _ in n.output.uses))


def stripes_of(run: list[Node], limit: int, cores: int, hw: HWConfig | None,
               narrow: bool = False) -> list[Group]:
    """``run`` cut where the images a stripe may hold change: an op's stripe holds as many
    images (a divisor of the batch) as keep its tensors within ``limit``, and as few as any
    later op of the run needs (deeper layers are smaller: the stripes only widen). Of the
    widths that fit, each part takes the one the cycle model finds fastest, its ops split
    by rows over ``cores`` (a stripe of too few rows leaves the array's rows idle), or
    with ``narrow`` the narrowest."""
    batch = run[0].output.type.shape[0]
    widths = [d for d in range(1, batch + 1) if batch % d == 0]
    fit = [max((d for d in widths if working_set(n) * d <= limit * batch), default=1)
           for n in run]
    for k in range(len(fit) - 2, -1, -1):
        fit[k] = min(fit[k], fit[k + 1])
    parts: list[Group] = []
    for k, n in enumerate(run):
        if parts and fit[k] == fit[k - 1]:
            parts[-1].nodes.append(n)
        else:
            parts.append(Group([n], fit[k]))
    for part in parts:
        if hw is not None:
            part.widths = {d: stripe_cycles(part.nodes, d, cores, hw)
                           for d in widths if d <= part.images}
            part.images = min(part.widths) if narrow else _width(part.widths, hw)
        else:
            part.images = 1
    merged: list[Group] = []
    for part in parts:                  # neighbours of one width are one group
        if merged and merged[-1].images == part.images:
            merged[-1].nodes += part.nodes
            merged[-1].widths = {d: c + part.widths[d] for d, c in merged[-1].widths.items()
                                 if d in part.widths}
        else:
            merged.append(part)
    return merged


def _width(cycles: dict[int, int], hw: HWConfig) -> int:
    """The narrowest width of ``cycles`` (width -> array cycles) but where a wider stripe
    fills the array's idle rows: it saves more than one PE row's share (1 / pe_rows) of
    the narrowest one's cycles (less is rounding, not rows filled)."""
    widths = sorted(cycles)
    best = widths[0]
    for d in widths[1:]:
        if cycles[d] < cycles[best] - cycles[widths[0]] // hw.pe_rows:
            best = d
    return best


def stripe_cycles(nodes: list[Node], images: int, cores: int, hw: HWConfig) -> int:
    """The array cycles of ``nodes`` run ``images`` images at a time over the batch, each
    op split by rows over ``cores`` as the partition splits a stripe (its busiest piece),
    or whole where it cuts no rows."""
    total = 0
    for node in nodes:
        (stripe,) = pieces_at(node, 0, [(0, images)])
        one = stripe.node
        axis = one.opdef.split_axis(one.opdef.ctx(one), "rows") if (
            cores > 1 and "rows" in one.opdef.splits) else None
        if axis is None or one.output.type.shape[axis] < cores:
            busy = op_cost(one, hw).terms.busy
        else:
            sizes = balanced(one.output.type.shape[axis], cores)
            busy = max(op_cost(p.node, hw).terms.busy for p in pieces_of(one, axis, sizes))
        total += busy * (node.output.type.shape[0] // images)
    return total


class StripeImages(Pass):
    """Run the layers too large for the OCM a stripe of images after another (see the
    module docstring).
    ``hw``: the config whose OCM bounds the working sets (default QC-U x4); ``cores``: the
    cores the graph will be split over (0: the config's); ``budget``: the share of a core's
    OCM an op's tensors may take before their layer is striped; ``whole``: where a group is
    cut for its weights, run the rest of its run on the whole batch where it fits."""

    name = "stripe-images"
    description = "run the layers too large for the OCM a few images at a time (on chip)"

    hw: HWConfig | None = None
    cores: int = 0
    budget: float = 0.5
    whole: bool = True

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if not 0 < self.budget <= 1:
            raise PassError(f"pass 'stripe-images': budget {self.budget} must be in (0, 1]")
        hw = self.hw or HWConfig.preset(DEFAULT_HW)
        found = groups(graph, int(hw.ocm_per_core * self.budget), self.cores or hw.cores, hw,
                       self.whole)
        if found:
            graph.meta[META_KEY] = [g.summary() for g in found]
        for index, group in enumerate(found):
            write(graph, group, index)
            self.stat("groups")
            self.stat("striped-nodes", len(group.nodes))
        if found:
            interleave(graph)
            self.stat("cascades", found[-1].cascade + 1)


def write(graph: Graph, group: Group, index: int) -> None:
    """Replace ``group`` by one copy of it per stripe of ``group.images`` images (stripe
    after stripe, where its first node was) and, for each result read after it, the gather
    of its stripes."""
    nodes = group.nodes
    ids = {id(n) for n in nodes}
    anchor = nodes[0]
    batch, width = anchor.output.type.shape[0], group.images
    made: dict[int, list[Value]] = {id(n): [] for n in nodes}
    read = list({id(v): v for n in nodes for v in n.inputs if v is not None
                 and v.producer is not None and id(v.producer) not in ids}.values())
    for k, i in enumerate(range(0, batch, width)):
        taken: dict[int, Value] = {}
        for node in nodes:
            try:
                (spec,) = pieces_at(node, 0, [(i, i + width)])
            except VerifyError as e:
                raise PassError(f"cannot compute images {i}..{i + width - 1} alone: "
                                f"{e.message}", node=node.name, op=node.op,
                                loc=node.loc) from None
            inputs = []
            for v in node.inputs:
                if v is None or v.is_const:
                    inputs.append(v)
                elif v.producer is not None and id(v.producer) in ids:
                    inputs.append(made[id(v.producer)][k])
                else:
                    if id(v) not in taken:
                        taken[id(v)] = _images(graph, v, i, i + width, anchor)
                    inputs.append(taken[id(v)])
            suffix = f"i{i}" if width == 1 else f"i{i}_{i + width}"
            p = graph.create_node(node.op, inputs, spec.attrs, loc=node.loc,
                                  names=[graph.unique_name(f"{node.output.name}.{suffix}")],
                                  before=anchor)
            p.meta.update(node.meta)
            p.meta["stripe"] = {"of": node.output.name, "index": k, "stripes": batch // width,
                                "images": width, "group": index, "cascade": group.cascade}
            made[id(node)].append(p.output)
    outputs = {id(v) for v in graph.outputs.values()}
    renames = []
    for node in nodes:
        out = node.output
        if any(id(u) not in ids for u, _ in out.uses) or id(out) in outputs:
            g = graph.create_node("core_gather", made[id(node)], {"axis": 0}, loc=node.loc,
                                  names=[graph.unique_name(f"{out.name}.images")],
                                  before=anchor)
            graph.replace_all_uses(out, g.output)
            renames.append((g.output, out.name))
    for node in reversed(nodes):
        graph.erase(node)
    for v in read:            # an earlier group's whole batch, now read stripe by stripe
        if v.producer.op == "core_gather" and not v.uses and id(v) not in outputs:
            graph.erase(v.producer)
    for whole, name in renames:
        graph.rename(whole, name)


def _images(graph: Graph, v: Value, lo: int, hi: int, anchor: Node) -> Value:
    """Images [lo, hi) of ``v``: the stripes an earlier group made of it where they cover
    the range exactly (joined if several: the whole batch is never gathered between two
    groups), else a ``core_slice``."""
    made = v.producer
    if made is not None and made.op == "core_gather" and made.attrs["axis"] == 0 and all(
            u.producer is not None and "stripe" in u.producer.meta for u in made.inputs):
        starts, at = [], 0
        for u in made.inputs:
            starts.append(at)
            at += u.type.shape[0]
        if lo in starts and (hi in starts or hi == at):
            parts = made.inputs[starts.index(lo):starts.index(hi) if hi < at else None]
            if len(parts) == 1:
                return parts[0]
            return graph.create_node("core_gather", list(parts), {"axis": 0}, loc=anchor.loc,
                                     names=[graph.unique_name(f"{v.name}.i{lo}_{hi}")],
                                     before=anchor).output
    return graph.create_node("core_slice", [v], {"axis": 0, "start": lo, "stop": hi},
                             loc=anchor.loc, names=[graph.unique_name(f"{v.name}.i{lo}")],
                             before=anchor).output


def interleave(graph: Graph) -> None:
    """Order each cascade's nodes so that its groups run interleaved: a stripe as soon as
    the images it reads are made (a group of two images a stripe after the two stripes of
    one image it reads). The plumbing made for a stripe (the joins of the stripes it
    reads) runs with it; what reads several stripes (the whole batch of a result) after
    them. Nothing moves out of its cascade's span of the graph."""
    spans: dict[int, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        if s := n.meta.get("stripe"):
            spans.setdefault(s["cascade"], [i, i])[1] = i
    for first, last in spans.values():
        span = graph.nodes[first:last + 1]
        key: dict[int, tuple] = {}
        for i, n in enumerate(span):
            if s := n.meta.get("stripe"):
                key[id(n)] = ((s["index"] + 1) * s["images"], s["group"], i)
        after = (float("inf"),) * 2
        for i, n in reversed(list(enumerate(span))):    # plumbing: with its readers
            if id(n) not in key:
                users = [key.get(id(u), after) for v in n.outputs for u, _ in v.uses]
                key[id(n)] = (*min(users, default=after)[:2], i)
        graph.nodes[first:last + 1] = _topological(span, key)
    graph.version += 1


def _topological(nodes: list[Node], key: dict[int, tuple]) -> list[Node]:
    """``nodes`` in an order their operands allow, the smallest ``key`` first."""
    inside = {id(n) for n in nodes}
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((v.producer, n) for n in nodes for v in n.inputs
                     if v is not None and v.producer is not None and id(v.producer) in inside)
    return list(nx.lexicographical_topological_sort(g, key=lambda n: key[id(n)]))
