"""The ops of a graph partitioned across cores (the partition pass): what each core takes
of a tensor, the synchronisation of the cores, and the assembly of their pieces.

    %x.c1.0 = core_slice(%x) {axis=1, start=4, stop=8}      core 1's rows of %x
    %y.c1 = fx_conv2d(%x.c1.0, %w.4_8, %b.4_8) {...}         the same op on core 1's slice
    %y = core_gather(%y.c0, %y.c1, ...) {axis=1}             the pieces, in core order

(``barrier`` makes every core wait for all; the partition pass writes none: the cores
synchronise on the values they exchange.)

For the golden model they are data movement (a slice, the identity, a concatenation), so
a partitioned graph computes exactly what the graph did. The core a node runs on is its
``node.meta["core"]`` (registered here).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..ir.meta import register_meta_key
from ..ir.opdef import Int, OpDef
from ..ir.types import Quant, TensorType
from .common import norm_axis, require
from .cost import view_cost

register_meta_key("core", int, doc="the core a node runs on (set by the partition pass)")
register_meta_key("piece", dict, doc="the partition pass: {of, kind, index, pieces} of one "
                  "core's piece of a split node (its pieces run, and stream DDR, at once)")


def sliced_quant(q: Quant | None, axis: int, start: int, stop: int) -> Quant | None:
    """The quantization of a slice: per-channel parameters along ``axis`` sliced too."""
    if q is None or q.axis != axis:
        return q
    fields = ("scale", "zero_point") if hasattr(q, "scale") else ("frac_bits",)
    return dataclasses.replace(q, **{f: getattr(q, f)[start:stop] for f in fields})


def gathered_quant(types: list[TensorType], axis: int) -> Quant | None:
    """The quantization of pieces joined along ``axis``: the pieces' own when they agree,
    their per-channel parameters joined when they run along ``axis``."""
    qs = [t.quant for t in types]
    if all(q == qs[0] for q in qs):
        return qs[0]
    require(all(q is not None and q.axis == axis and type(q) is type(qs[0]) for q in qs),
            f"pieces differ in quantization: {', '.join(str(q) for q in qs)}")
    fields = ("scale", "zero_point") if hasattr(qs[0], "scale") else ("frac_bits",)
    return dataclasses.replace(qs[0], **{f: sum((getattr(q, f) for q in qs), ()) for f in fields})


def _off_axis_rows(c) -> tuple[int, ...]:
    """The "rows" of a core_slice or core_gather: every leading axis but its own, which it
    cuts or joins (a piece of another axis reads the same range of each operand)."""
    own = norm_axis(c.axis, c.out_types[0].rank)
    return tuple(a for a in range(c.out_types[0].rank - 1) if a != own)


class CoreSlice(OpDef):
    """The range [start, stop) of x along ``axis`` that one core holds: a slice keeping x's
    layout and quantization (per-channel parameters along ``axis`` sliced with it)."""

    name = "core_slice"
    moves_data = True
    in_place_ranges = True
    operands = ("x",)
    attrs = {"axis": Int(), "start": Int(), "stop": Int()}
    splits = ("rows",)
    row_axes = staticmethod(_off_axis_rows)

    def infer(self, c, x):
        axis = norm_axis(c.axis, x.rank)
        require(0 <= c.start < c.stop <= x.shape[axis],
                f"range [{c.start}, {c.stop}) is not inside axis {axis} of {x}")
        shape = x.shape[:axis] + (c.stop - c.start,) + x.shape[axis + 1:]
        return TensorType(shape, x.dtype, x.layout,
                          sliced_quant(x.quant, axis, c.start, c.stop))

    def tvm_lowering(self, c, L, x):
        axis = norm_axis(c.axis, c.out_types[0].rank)
        return L.compute(c.out_types[0], lambda *i: x[tuple(i[:axis]) + (i[axis] + c.start,)
                                                       + tuple(i[axis + 1:])])

    def compute(self, c, x):
        axis = norm_axis(c.axis, x.ndim)
        return np.ascontiguousarray(x[(slice(None),) * axis + (slice(c.start, c.stop),)])

    def cost(self, node):
        """It reads only its range of x."""
        out = node.outputs[0].type.nbytes
        return {"macs": 0, "bytes_read": out, "bytes_written": out}


class CoreGather(OpDef):
    """The pieces that the cores computed, joined along ``axis`` in core order."""

    name = "core_gather"
    in_place_ranges = True
    operands = ("*pieces",)
    attrs = {"axis": Int()}
    splits = ("rows",)
    row_axes = staticmethod(_off_axis_rows)

    def infer(self, c, *xs):
        require(len(xs) >= 1, "core_gather takes at least one piece")
        x = xs[0]
        axis = norm_axis(c.axis, x.rank)
        rest = lambda t: (t.shape[:axis] + t.shape[axis + 1:], t.dtype, t.layout)  # noqa: E731
        require(all(rest(t) == rest(x) for t in xs),
                f"pieces differ off axis {axis}: " + ", ".join(str(t) for t in xs))
        shape = x.shape[:axis] + (sum(t.shape[axis] for t in xs),) + x.shape[axis + 1:]
        return TensorType(shape, x.dtype, x.layout, gathered_quant(list(xs), axis))

    def compute(self, c, *xs):
        return np.concatenate(xs, axis=c.axis)

    def tvm_lowering(self, c, L, *xs):
        return L.joined(xs, norm_axis(c.axis, c.out_types[0].rank), c.out_types[0])


class Barrier(OpDef):
    """Every core waits until each has produced its operand; the results are the operands.
    Never removed or merged (it orders the cores)."""

    name = "barrier"
    pure = False
    values_unchanged = True
    operands = ("*xs",)
    cycle_cost = view_cost          # moves nothing; the model charges the cores' waits

    def infer(self, c, *xs):
        require(len(xs) >= 1, "barrier takes at least one operand")
        return list(xs)

    def compute(self, c, *xs):
        return list(xs)

    def tvm_lowering(self, c, L, *xs):
        # the C programs synchronize around it; the kernel itself copies (the host build
        # passes the operands on instead: values_unchanged)
        return [L.compute(t, lambda *i, x=x: x[i], name=f"y{k}")
                for k, (x, t) in enumerate(zip(xs, c.out_types))]
