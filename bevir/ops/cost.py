"""What an op asks of the GPNPU: the vocabulary of the ``cycle_cost`` interface.

An op's ``cycle_cost(c) -> Work`` says how its MACs map onto the PE array (candidate
:class:`PEMapping` s; the cycle model takes the cheapest) and how many ALU operations its
non-MAC work takes. Bytes are not declared: they follow from the operand and result types
(``OpDef.cost``). An op without ``cycle_cost`` gets :func:`default_work`: data movement
for ``moves_data`` ops, its MACs spread over every lane, or one ALU operation per element.
The units are symbolic (``rows``, ``cols``, ``pes``, ``lanes``, ``macs``); bevir/target/cycles.py
resolves them from the HWConfig, so no op knows the machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: the array units a mapping loop divides by ("macs": every lane of every PE)
UNITS = ("rows", "cols", "pes", "lanes", "macs")

#: ALU operations per result of a requantizing epilogue: add the bias (or zero point),
#: multiply by the requantizing multiplier, round (shift or round to nearest), saturate
REQUANTIZE_OPS = 4


@dataclass(frozen=True)
class PEMapping:
    """One mapping of a product onto the array (output stationary): ``batch`` x the
    product over ``loops`` of ceil(extent / unit size) tiles, each running ``serial``
    steps. E.g. a conv: ((OH, rows), (OW, cols), (C/groups, lanes)), serial O*KH*KW:
    one output pixel per PE, input channels across the MAC lanes, weights broadcast.
    ``weight_loops``: the loops that split the weight (output channels)."""

    name: str
    loops: tuple[tuple[int, str], ...]
    serial: int = 1
    batch: int = 1
    #: the loops that split the weight (output channels): the tiles along the other
    #: loops each broadcast the whole weight again
    weight_loops: tuple[int, ...] = ()

    def __post_init__(self):
        for extent, unit in self.loops:
            if unit not in UNITS or extent < 1:
                raise ValueError(f"mapping {self.name}: bad loop ({extent}, {unit!r})")


@dataclass(frozen=True)
class Work:
    """An op's demand on a core. ``op_class`` selects the HWConfig efficiency factor;
    ``alu_ops`` counts ALU operations over all PEs; ``tile_weight_bytes`` (one batch
    element's weights) are broadcast from the OCM again for every pass of the chosen
    mapping over the array (the register file cannot keep them), of which
    ``weight_bytes`` (the weight operand) are already counted once among the bytes read; a
    ``view`` moves nothing (a reshape: the compiler renames the buffer) and costs no
    cycles."""

    op_class: str
    mappings: tuple[PEMapping, ...] = ()
    alu_ops: int = 0
    tile_weight_bytes: int = 0
    weight_bytes: int = 0
    view: bool = False
    notes: dict = field(default_factory=dict)


def numel_max(c) -> int:
    """The largest element count among the operands and results (the elementwise extent)."""
    return max([t.numel for t in list(c.in_types) + list(c.out_types) if t is not None] or [0])


def per_element(ops: int, op_class: str = "elementwise"):
    """A ``cycle_cost`` of ``ops`` ALU operations per element of the largest operand or
    result (elementwise maps, tables, reductions, normalizations)."""
    def cycle_cost(self, c) -> Work:
        return Work(op_class, alu_ops=ops * numel_max(c), notes={"alu_ops_per_element": ops})
    cycle_cost.ops_per_element = ops
    return cycle_cost


def view_cost(self, c) -> Work:
    """The ``cycle_cost`` of an op that only renames its operand's buffer."""
    return Work("data", view=True)


def default_work(op, c) -> Work:
    """The work of an op that declares no ``cycle_cost``, from its other interfaces."""
    if op.moves_data:
        return Work("data")
    macs = int(op.macs(c))
    if macs:
        return Work("mac", (PEMapping("flat", ((macs, "macs"),)),))
    return Work("elementwise", alu_ops=numel_max(c))


def sampling_work(value, aw, taps: int = 4, per_sample: int = 12, op_class="sampling") -> Work:
    """Bilinear deformable sampling on the ALU: value (bs, V, H, d), attention weights
    (bs, Nq, H, L, P). Per sample ``per_sample`` operations (coordinates to pixels, corner
    weights, bounds), per tap and channel a gather and a multiply-accumulate (2)."""
    samples, d = aw.numel, value.shape[-1]
    return Work(op_class, alu_ops=samples * (per_sample + taps * d * 2),
                notes={"samples": samples, "channels": d})


def work_of(op, c) -> Work:
    """The op's declared work, or its default."""
    return op.cycle_cost(c) if op.cycle_cost is not None else default_work(op, c)
