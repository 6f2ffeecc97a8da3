"""stripe-images{hw=...}: run the layers whose activations the OCM cannot hold one image
at a time, so that they stay on chip.

A network over a batch of images (BEVFormer's six cameras) computes every image alone
through its backbone: each op of it computes the images of its result from the same
images of its activations (:meth:`OpDef.region` along axis 0 reads axis 0 of every
activation by the same range, no halo). Run op after op, such a layer holds the whole
batch at once: ResNet-50's first stage over six 480x800 cameras holds 37 MB per tensor, far
more than an 8 MB OCM, so every op streams its tensors through DDR. Run image after image,
a *group* of consecutive such ops holds one image's tensors: the group becomes one copy of
itself per image, in image order (``%y.i3`` is image 3 of ``%y``), reading its image of each
operand made before the group (``core_slice``) and joining each result read after it from
its images (``core_gather``, named as the result was). The partition then splits every
image's ops across the cores (by rows), and the memory plan keeps them on chip.

Which ops: a group is a maximal run of consecutive ops that compute images alone, cut
after its last op whose tensors, split over the cores, exceed ``budget`` of a core's OCM:
the later ops (ResNet's last stages: small activations, large weights) run on the whole
batch, loading each weight once instead of once per image. A group's weights are read by
each of its images: the memory plan keeps those that fit resident while the group runs.

Results are bit-identical: every image's ops compute the same integers. Each striped node
has ``node.meta["stripe"]`` = {of, index, stripes, group}.
"""
from __future__ import annotations

from ..errors import PassError, VerifyError
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..target.hw import HWConfig
from ..target.schedule import held_tensors, lowerable
from .analysis import AnalysisManager
from .core import Pass
from .partition import DEFAULT_HW, pieces_at

register_meta_key("stripe", dict, doc="stripe-images: {of, index, stripes, group} of a node "
                  "computing one image of a striped node (bevir.passes.stripe)")

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


def groups(graph: Graph, budget: int, cores: int) -> list[list[Node]]:
    """The groups to run image by image (see the module docstring), in graph order."""
    out: list[list[Node]] = []
    run: list[Node] = []
    for node in graph.nodes + [None]:
        if node is not None and by_image(node) and (
                not run or node.output.type.shape[0] == run[0].output.type.shape[0]):
            run.append(node)
            continue
        large = [k for k, n in enumerate(run) if working_set(n) > budget * cores]
        if large:
            out.append(run[:large[-1] + 1])
        run = [node] if node is not None and by_image(node) else []
    return out


class StripeImages(Pass):
    """Run the layers too large for the OCM image after image (see the module docstring).
    ``hw``: the config whose OCM bounds the working sets (default QC-U x4); ``cores``: the
    cores the graph will be split over (0: the config's); ``budget``: the share of a core's
    OCM an op's tensors may take before their layer is striped."""

    name = "stripe-images"
    description = "run the layers too large for the OCM one image at a time (on chip)"

    hw: HWConfig | None = None
    cores: int = 0
    budget: float = 0.5

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if not 0 < self.budget <= 1:
            raise PassError(f"pass 'stripe-images': budget {self.budget} must be in (0, 1]")
        hw = self.hw or HWConfig.preset(DEFAULT_HW)
        found = groups(graph, int(hw.ocm_per_core * self.budget), self.cores or hw.cores)
        for index, group in enumerate(found):
            write(graph, group, index)
            self.stat("groups")
            self.stat("striped-nodes", len(group))


def write(graph: Graph, group: list[Node], index: int) -> None:
    """Replace ``group`` by one copy of it per image (image-major, where its first node was)
    and, for each result read after it, the gather of its images."""
    ids = {id(n) for n in group}
    anchor = group[0]
    images = anchor.output.type.shape[0]
    made: dict[int, list[Value]] = {id(n): [] for n in group}
    for i in range(images):
        sliced: dict[int, Value] = {}
        for node in group:
            try:
                (spec,) = pieces_at(node, 0, [(i, i + 1)])
            except VerifyError as e:
                raise PassError(f"cannot compute image {i} alone: {e.message}",
                                node=node.name, op=node.op, loc=node.loc) from None
            inputs = []
            for v in node.inputs:
                if v is None or v.is_const:
                    inputs.append(v)
                elif v.producer is not None and id(v.producer) in ids:
                    inputs.append(made[id(v.producer)][i])
                else:
                    if id(v) not in sliced:
                        s = graph.create_node(
                            "core_slice", [v], {"axis": 0, "start": i, "stop": i + 1},
                            loc=node.loc, names=[graph.unique_name(f"{v.name}.i{i}")],
                            before=anchor)
                        sliced[id(v)] = s.output
                    inputs.append(sliced[id(v)])
            p = graph.create_node(node.op, inputs, spec.attrs, loc=node.loc,
                                  names=[graph.unique_name(f"{node.output.name}.i{i}")],
                                  before=anchor)
            p.meta.update(node.meta)
            p.meta["stripe"] = {"of": node.output.name, "index": i, "stripes": images,
                                "group": index}
            made[id(node)].append(p.output)
    outputs = {id(v) for v in graph.outputs.values()}
    renames = []
    for node in group:
        out = node.output
        if any(id(u) not in ids for u, _ in out.uses) or id(out) in outputs:
            g = graph.create_node("core_gather", made[id(node)], {"axis": 0}, loc=node.loc,
                                  names=[graph.unique_name(f"{out.name}.images")],
                                  before=anchor)
            graph.replace_all_uses(out, g.output)
            renames.append((g.output, out.name))
    for node in reversed(group):
        graph.erase(node)
    for whole, name in renames:
        graph.rename(whole, name)
