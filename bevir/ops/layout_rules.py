"""Layout facts shared by the ops and the to-nhwc pass: the NCHW <-> NHWC permutations and
the :class:`~bevir.ir.opdef.LayoutRule` building blocks ops declare as their ``nhwc``."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..ir.opdef import LayoutRule
from ..ir.types import Layout, TensorType

if TYPE_CHECKING:
    from ..ir.graph import Node, Value

#: NHWC axis i holds NCHW axis NCHW_TO_NHWC[i]; NHWC_TO_NCHW is its inverse
NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def layout_perm(src: Layout, dst: Layout) -> tuple[int, ...]:
    """The transpose permutation that moves a 4-D tensor from layout ``src`` to ``dst``.
    A ``plain`` 4-D tensor is read as NCHW (as conv2d reads it), so plain <-> nchw moves
    nothing and only changes the tag."""
    if (src is Layout.nhwc) == (dst is Layout.nhwc):
        return (0, 1, 2, 3)
    return NCHW_TO_NHWC if dst is Layout.nhwc else NHWC_TO_NCHW


def permute_quant(quant, perm: tuple[int, ...]):
    """``quant`` of a tensor after ``transpose(perm)``: a per-channel axis follows its axis."""
    if quant is None or quant.axis is None:
        return quant
    return replace(quant, axis=perm.index(quant.axis))


def nhwc_axis(a: int) -> int:
    """An NCHW axis's position in NHWC."""
    return NCHW_TO_NHWC.index(a % 4)


def permuted(values: Sequence[Any]) -> tuple:
    """Per-axis values (NCHW order) in NHWC order."""
    return tuple(values[p] for p in NCHW_TO_NHWC)


def nhwc_type(t: TensorType) -> TensorType:
    """The NHWC type of an NCHW (or plain 4-D) type; a lower-rank type is first extended
    to rank 4 with leading unit dimensions, as broadcasting reads it."""
    extra = 4 - t.rank
    quant = t.quant
    if quant is not None and quant.axis is not None:
        quant = replace(quant, axis=quant.axis + extra)
    return TensorType(permuted((1,) * extra + t.shape), t.dtype, Layout.nhwc,
                      permute_quant(quant, NCHW_TO_NHWC))


def converted(v: Value | None) -> bool:
    """Whether an operand of an elementwise node changes in NHWC: 4-D values, and
    constants that are not scalars (they broadcast against the permuted axes)."""
    return v is not None and (v.type.rank == 4 or (v.is_const and v.type.numel > 1))


# ---- attributes in NHWC ------------------------------------------------------------------
def axis_attr(node: Node) -> dict:
    a = node.attrs.get("axis")
    return {**node.attrs, "axis": None if a is None else nhwc_axis(a)}


def axes_attr(node: Node) -> dict:
    return {**node.attrs, "axes": tuple(nhwc_axis(a) for a in node.attrs["axes"])}


def pads_attr(node: Node) -> dict:
    pads = node.attrs["pads"]
    return {**node.attrs, "pads": permuted(pads[:4]) + permuted(pads[4:])}


def size_attr(node: Node) -> dict:
    return {**node.attrs, "size": permuted(node.attrs["size"])}


#: computes in NHWC itself (seeds regions); the layout travels through operand 0
NATIVE = LayoutRule(native=True, data=(0,))
#: elementwise: every 4-D operand and non-scalar constant moves with it
ELEMENTWISE = LayoutRule()
#: an ``axis`` attribute follows the permutation
AXIS = LayoutRule(attrs=axis_attr)
