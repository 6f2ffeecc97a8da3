"""Data movement: concat, split, slice, reshape, transpose, layout_transform, gather, expand,
pad, topk, constant.

Results are ``plain`` unless the op keeps a 4-D tensor's axes meaning what they meant
(concat, split, slice, pad, a rank-keeping gather or expand). Per-tensor quantization
passes through data movement; per-channel quantization does not (its axis may move).
"""
from __future__ import annotations

from math import prod

import numpy as np

from ..ir.types import DType, Layout, TensorType
from ..ir.opdef import (Bool, FixedLowering, Float, Int, Ints, LayoutRule, OpDef, Piece, Str,
                        Tensor, aligned_range)
from .common import RangeMap, norm_axis, require, same_dtype
from . import native
from .layout_rules import AXIS, axes_attr, layout_perm, pads_attr, permute_quant
from .cost import view_cost
from .onnx_export import onnx_as, with_inputs


def norm_axes(axes, rank: int) -> tuple[int, ...]:
    """Axes in [0, rank), negatives wrapped; duplicates are an error."""
    out = tuple(norm_axis(a, rank) for a in axes)
    require(len(set(out)) == len(out), f"duplicate axes {list(axes)}")
    return out


#: a strided last axis at most this long is copied one index at a time (:func:`compact`)
SHORT_AXIS = 8


def compact(x: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(x)``, faster where x's last axis is short and strided (the
    transposed pairs of a channel shuffle): numpy would copy element by element. A view of
    memory with its last two axes swapped is transposed natively; otherwise a copy per
    index of that axis moves rows of the axes before it (about 5x faster)."""
    if (x.flags.c_contiguous or x.ndim < 2 or x.shape[-1] > SHORT_AXIS
            or x.strides[-1] == x.itemsize):
        return np.ascontiguousarray(x)
    swapped = x.swapaxes(-1, -2)
    if swapped.flags.c_contiguous:          # one transposition of memory: natively
        y = native.swap_last_axes(swapped.reshape((-1,) + swapped.shape[-2:]))
        if y is not None:
            return y.reshape(x.shape)
    out = np.empty(x.shape, x.dtype)
    for i in range(x.shape[-1]):
        out[..., i] = x[..., i]
    return out


def moved(x: TensorType, shape, layout: Layout | None = None) -> TensorType:
    """The type of data moved out of ``x`` into ``shape``: same dtype, per-tensor quant kept;
    ``layout`` (default: x's) only survives on a 4-D result."""
    layout = x.layout if layout is None else layout
    shape = tuple(shape)
    quant = x.quant if x.quant is not None and x.quant.axis is None else None
    return TensorType(shape, x.dtype, layout if len(shape) == 4 else Layout.plain, quant)


class Concat(OpDef):
    name = "concat"
    onnx_export = onnx_as("Concat", {"axis": "axis"})
    fixed_point = FixedLowering("concat")
    nhwc = AXIS
    operands = ("*xs",)
    attrs = {"axis": Int()}

    def infer(self, c, *xs):
        require(len(xs) >= 1, "concat takes at least one operand")
        same_dtype(*xs)
        x = xs[0]
        require(all(t.rank == x.rank for t in xs), "concat operands differ in rank")
        axis = norm_axis(c.axis, x.rank)
        rest = lambda t: t.shape[:axis] + t.shape[axis + 1:]  # noqa: E731
        require(all(rest(t) == rest(x) for t in xs),
                f"concat operands differ off axis {axis}: " + ", ".join(str(t) for t in xs))
        layouts = {t.layout for t in xs} - {Layout.plain}
        require(len(layouts) <= 1, f"concat mixes layouts {sorted(map(str, layouts))}")
        shape = x.shape[:axis] + (sum(t.shape[axis] for t in xs),) + x.shape[axis + 1:]
        t = moved(x, shape, layouts.pop() if layouts else Layout.plain)
        return t if all(u.quant == x.quant for u in xs) else t.with_(quant=None)

    splits = ("rows",)

    def row_axes(self, c) -> tuple[int, ...]:
        """The leading axes but the joined one: a range of one is the same range of every
        operand."""
        axis = norm_axis(c.axis, c.out_types[0].rank)
        return tuple(a for a in range(c.out_types[0].rank - 1) if a != axis)

    def tvm_lowering(self, c, L, *xs):
        return L.joined(xs, norm_axis(c.axis, c.out_types[0].rank), c.out_types[0])

    def compute(self, c, *xs):
        y = native.join(xs, c.axis)                 # runs of a few channels: natively
        return np.concatenate(xs, axis=c.axis) if y is None else y


class Split(OpDef):
    """Split into consecutive pieces of ``sizes`` along ``axis`` (zero sizes allowed)."""

    name = "split"
    onnx_export = with_inputs("Split", "sizes", attrs={"axis": "axis"})
    fixed_point = FixedLowering("split")
    nhwc = AXIS
    operands = ("x",)
    attrs = {"axis": Int(0), "sizes": Ints()}

    def infer(self, c, x):
        axis = norm_axis(c.axis, x.rank)
        require(len(c.sizes) >= 1 and min(c.sizes) >= 0 and sum(c.sizes) == x.shape[axis],
                f"sizes {list(c.sizes)} do not split dimension {axis} of {x}")
        return [moved(x, x.shape[:axis] + (s,) + x.shape[axis + 1:]) for s in c.sizes]

    def compute(self, c, x):
        return np.split(x, np.cumsum(c.sizes)[:-1], axis=c.axis)


def _slices(c, shape) -> tuple[slice, ...]:
    """Python slices per axis, bounds clamped as slice.indices does (equal to ONNX Slice)."""
    out = [slice(None)] * len(shape)
    for ax, b, e, s in zip(norm_axes(c.axes, len(shape)), c.starts, c.ends, c.steps):
        out[ax] = slice(*slice(b, e, s).indices(shape[ax]))
        if out[ax].stop < 0:     # a negative step running to the front: stop "before 0"
            out[ax] = slice(out[ax].start, None, s)
    return tuple(out)


class Slice(OpDef):
    name = "slice"
    onnx_export = with_inputs("Slice", "starts", "ends", "axes", "steps")
    moves_data = True
    nhwc = LayoutRule(attrs=axes_attr)
    operands = ("x",)
    attrs = {"starts": Ints(), "ends": Ints(), "axes": Ints(), "steps": Ints()}

    def infer(self, c, x):
        require(len(c.starts) == len(c.ends) == len(c.axes) == len(c.steps),
                "starts, ends, axes and steps differ in length")
        require(0 not in c.steps, "slice step 0")
        sl = _slices(c, x.shape)
        return moved(x, (len(range(d)[s]) for d, s in zip(x.shape, sl)))

    def compute(self, c, x):
        return x[_slices(c, x.shape)]

    def tvm_lowering(self, c, L, x):
        ranges = [range(d)[s] for d, s in zip(c.in_types[0].shape, _slices(c, c.in_types[0].shape))]
        return L.compute(c.out_types[0], lambda *i: x[tuple(r.start + a * r.step
                                                             for a, r in zip(i, ranges))])


class Reshape(RangeMap, OpDef):
    name = "reshape"
    onnx_export = with_inputs("Reshape", "shape", allowzero=1)   # the shape is explicit
    cycle_cost = view_cost
    moves_data = True
    operands = ("x",)
    #: ``layout`` tags the result (a 4-D one only): to-nhwc ends a channel permutation
    #: computed in NHWC memory order (ShuffleNet's shuffle) with the reshape back to NHWC
    attrs = {"shape": Ints(), "layout": Str("plain", tuple(layout.value for layout in Layout))}

    def infer(self, c, x):
        require(min(c.shape, default=0) >= 0, f"reshape shape {list(c.shape)} must be static")
        require(prod(c.shape) == x.numel, f"cannot reshape {x} to {list(c.shape)}")
        require(c.layout == "plain" or len(c.shape) == 4,
                f"a {len(c.shape)}-D reshape result cannot carry layout {c.layout}")
        return moved(x, c.shape, Layout(c.layout))

    def compute(self, c, x):
        try:
            return np.reshape(x, c.shape, copy=False)
        except ValueError:                  # x's strides need a copy
            return compact(x).reshape(c.shape)

    def tvm_lowering(self, c, L, x):
        return L.same_order(x, c.in_types[0], c.out_types[0])

    def row_axes(self, c) -> tuple[int, ...]:
        """The result axes but the last that are an operand axis with the same elements
        before it (a range of one is the same range of that operand axis), of plain
        tensors: (2500, 256) -> (1, 2500, 256) cuts the 2500 of both."""
        return tuple(self._axis_map(c))

    @staticmethod
    def _axis_map(c) -> dict[int, int]:
        x, y = c.in_types[0], c.out_types[0]
        if x.layout is not Layout.plain or y.layout is not Layout.plain:
            return {}
        before = {prod(x.shape[:b]): b for b in range(x.rank - 1) if x.shape[b] > 1}
        out = {}
        for a in range(y.rank - 1):
            b = before.get(prod(y.shape[:a]))
            if b is not None and x.shape[b] == y.shape[a]:
                out[a] = b
        return out

    def operand_axis(self, c, axis: int) -> int:
        return self._axis_map(c)[axis]

    def changed(self, c, axis: int, size: int) -> dict:
        shape = list(c.shape)
        shape[axis] = size
        return {"shape": tuple(shape)}


class Flatten(OpDef):
    """ONNX Flatten: [prod(dims before axis), prod(dims from axis)]."""

    name = "flatten"
    onnx_export = onnx_as("Flatten", {"axis": "axis"})
    cycle_cost = view_cost
    moves_data = True
    operands = ("x",)
    attrs = {"axis": Int(1)}

    def infer(self, c, x):
        require(-x.rank <= c.axis <= x.rank, f"axis {c.axis} out of range for rank {x.rank}")
        axis = c.axis + x.rank if c.axis < 0 else c.axis
        return moved(x, (prod(x.shape[:axis]), prod(x.shape[axis:])), Layout.plain)

    def compute(self, c, x):
        return x.reshape(c.out_types[0].shape)

    tvm_lowering = Reshape.tvm_lowering       # the same elements in the same order


class Transpose(RangeMap, OpDef):
    name = "transpose"
    onnx_export = onnx_as("Transpose", {"perm": "perm"})
    moves_data = True
    operands = ("x",)
    attrs = {"perm": Ints()}

    def infer(self, c, x):
        require(sorted(c.perm) == list(range(x.rank)),
                f"perm {list(c.perm)} is not a permutation of {x.rank} axes")
        return moved(x, (x.shape[p] for p in c.perm), Layout.plain)

    def compute(self, c, x):
        return x.transpose(c.perm)

    def tvm_lowering(self, c, L, x):
        return L.permuted(x, c.perm, c.out_types[0])

    def operand_axis(self, c, axis: int) -> int:
        return c.perm[axis]


class LayoutTransform(OpDef):
    """Move a 4-D tensor to layout ``to``: the data moves as ``transpose(layout_perm(x's
    layout, to))`` and the result carries the tag ``to`` (plain reads as NCHW, so plain <->
    nchw only retags). dtype and quantization are kept; a per-channel axis follows the
    channel (axis 1 of nchw is axis 3 of nhwc)."""

    name = "layout_transform"
    operands = ("x",)
    attrs = {"to": Str(choices=tuple(layout.value for layout in Layout))}

    def infer(self, c, x):
        require(x.rank == 4, f"layout_transform takes a 4-D tensor, got {x}")
        to = Layout(c.to)
        require(to is not x.layout, f"layout_transform to {to} of a tensor already {to}: {x}")
        perm = layout_perm(x.layout, to)
        return TensorType(tuple(x.shape[p] for p in perm), x.dtype, to,
                          permute_quant(x.quant, perm))

    def compute(self, c, x):
        perm = layout_perm(c.in_types[0].layout, Layout(c.to))
        return native.contiguous(x.transpose(perm))     # natively for a C-ordered x


class Squeeze(OpDef):
    name = "squeeze"
    onnx_export = with_inputs("Squeeze", "axes")
    cycle_cost = view_cost
    moves_data = True
    operands = ("x",)
    attrs = {"axes": Ints()}

    def infer(self, c, x):
        axes = norm_axes(c.axes, x.rank)
        require(all(x.shape[a] == 1 for a in axes), f"cannot squeeze axes {list(c.axes)} of {x}")
        return moved(x, (d for i, d in enumerate(x.shape) if i not in axes), Layout.plain)

    def compute(self, c, x):
        return x.reshape(c.out_types[0].shape)

    tvm_lowering = Reshape.tvm_lowering       # the same elements in the same order


class Unsqueeze(OpDef):
    """Insert size-1 axes at ``axes``, positions in the result (ONNX semantics)."""

    name = "unsqueeze"
    onnx_export = with_inputs("Unsqueeze", "axes")
    cycle_cost = view_cost
    moves_data = True
    operands = ("x",)
    attrs = {"axes": Ints()}

    def infer(self, c, x):
        axes = norm_axes(c.axes, x.rank + len(c.axes))
        dims = iter(x.shape)
        shape = [1 if i in axes else next(dims) for i in range(x.rank + len(axes))]
        return moved(x, shape, Layout.plain)

    def compute(self, c, x):
        return x.reshape(c.out_types[0].shape)

    tvm_lowering = Reshape.tvm_lowering       # the same elements in the same order


class Gather(OpDef):
    """numpy.take along ``axis``; negative indices count from the end."""

    name = "gather"
    onnx_export = onnx_as("Gather", {"axis": "axis"})
    moves_data = True
    operands = ("x", "indices")
    attrs = {"axis": Int(0)}

    def infer(self, c, x, idx):
        require(idx.dtype in (DType.i32, DType.i64), f"indices must be i32 or i64, got {idx.dtype}")
        axis = norm_axis(c.axis, x.rank)
        shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
        return moved(x, shape, None if idx.rank == 1 else Layout.plain)

    def compute(self, c, x, idx):
        axis = norm_axis(c.axis, x.ndim)
        n = x.shape[axis]
        if idx.size and not (-n <= idx.min() and idx.max() < n):
            raise ValueError(f"gather index out of range [{-n}, {n}) on axis {axis}: "
                             f"min {idx.min()}, max {idx.max()}")
        return np.take(x, idx, axis=axis)

    def tvm_lowering(self, c, L, x, idx):
        xt, it = c.in_types
        axis = norm_axis(c.axis, xt.rank)
        n = xt.shape[axis]

        def fn(*i):
            k = L.cast(idx[i[axis:axis + it.rank]], "int64")
            k = L.cast(L.select(k < 0, k + L.i64(n), k), "int32")    # numpy wraps negatives
            return x[i[:axis] + (k,) + i[axis + it.rank:]]
        return L.compute(c.out_types[0], fn)


class GatherElements(OpDef):
    """ONNX GatherElements / torch.gather: ``numpy.take_along_axis`` along ``axis``; the
    result has the indices' shape; negative indices count from the end."""

    name = "gather_elements"
    onnx_export = onnx_as("GatherElements", {"axis": "axis"})
    moves_data = True
    operands = ("x", "indices")
    attrs = {"axis": Int(0)}

    def infer(self, c, x, idx):
        require(idx.dtype in (DType.i32, DType.i64), f"indices must be i32 or i64, got {idx.dtype}")
        require(idx.rank == x.rank, f"indices of rank {idx.rank} for data of rank {x.rank}")
        axis = norm_axis(c.axis, x.rank)
        require(all(i <= d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != axis),
                f"indices {idx.shape} exceed data {x.shape} off axis {axis}")
        return moved(x, idx.shape, Layout.plain)

    def compute(self, c, x, idx):
        axis = norm_axis(c.axis, x.ndim)
        n = x.shape[axis]
        if idx.size and not (-n <= idx.min() and idx.max() < n):
            raise ValueError(f"gather_elements index out of range [{-n}, {n}) on axis {axis}: "
                             f"min {idx.min()}, max {idx.max()}")
        lead = tuple(slice(0, d) for d in idx.shape)
        lead = lead[:axis] + (slice(None),) + lead[axis + 1:]
        return np.take_along_axis(x[lead], np.where(idx < 0, idx + n, idx), axis=axis)

    def tvm_lowering(self, c, L, x, idx):
        n = c.in_types[0].shape[norm_axis(c.axis, c.in_types[0].rank)]
        axis = norm_axis(c.axis, c.in_types[0].rank)

        def fn(*i):
            k = L.cast(idx[i], "int64")
            k = L.cast(L.select(k < 0, k + L.i64(n), k), "int32")
            return x[i[:axis] + (k,) + i[axis + 1:]]
        return L.compute(c.out_types[0], fn)


class Expand(RangeMap, OpDef):
    """ONNX Expand: broadcast ``x`` against ``shape``."""

    name = "expand"
    onnx_export = with_inputs("Expand", "shape")
    moves_data = True
    operands = ("x",)
    attrs = {"shape": Ints()}

    def region(self, c, axis, start, stop):
        """A range of any leading result axis (RangeMap's split): the operand's range along
        it where the operand has that axis, the whole operand where it is repeated; the
        target shape takes the range's length on that axis."""
        out = c.out_types[0]
        if axis not in self.row_axes(c):
            return None
        shape = list(c.shape)
        at = axis - (out.rank - len(shape))
        if at >= 0 and shape[at] != 1:
            shape[at] = stop - start
        return Piece((aligned_range(c.in_types[0], out, axis, start, stop),),
                     {"shape": tuple(shape)})

    def infer(self, c, x):
        shape = np.broadcast_shapes(x.shape, c.shape)
        return moved(x, shape, None if len(shape) == x.rank else Layout.plain)

    def compute(self, c, x):
        return np.broadcast_to(x, c.out_types[0].shape)

    def tvm_lowering(self, c, L, x):
        out = c.out_types[0]
        return L.compute(out, lambda *i: x[L.broadcast_index(c.in_types[0], out.shape, i)])


class Pad(OpDef):
    """Pad by ``pads`` = [begin_0..begin_n, end_0..end_n]; negative pads crop (before padding)."""

    name = "pad"
    nhwc = LayoutRule(attrs=pads_attr)
    fixed_point = FixedLowering("pad")      # on the codes; a constant value as a code
    operands = ("x",)
    attrs = {"pads": Ints(), "mode": Str("constant", ("constant", "reflect", "edge", "wrap")),
             "value": Float(0.0)}

    def onnx_export(self, e, node, ins, outs):
        value = e.const(np.asarray(node.attrs["value"], node.inputs[0].type.dtype.np), "value") \
            if node.attrs["mode"] == "constant" else None
        e.emit("Pad", ins + [e.ints(node.attrs["pads"], "pads"), value], outs,
               mode=node.attrs["mode"])

    def infer(self, c, x):
        r = x.rank
        require(len(c.pads) == 2 * r, f"pads takes {2 * r} values for rank {r}, got {len(c.pads)}")
        crop = [d + min(b, 0) + min(e, 0) for d, b, e in zip(x.shape, c.pads[:r], c.pads[r:])]
        require(min(crop, default=0) >= 0, f"pads {list(c.pads)} crop more than {x} holds")
        require(c.mode == "constant" or all(
            d > 0 or (b <= 0 and e <= 0) for d, b, e in zip(crop, c.pads[:r], c.pads[r:])),
            f"{c.mode} padding of an empty axis")
        return moved(x, (d + max(b, 0) + max(e, 0)
                         for d, b, e in zip(crop, c.pads[:r], c.pads[r:])))

    def compute(self, c, x):
        r = x.ndim
        begin, end = c.pads[:r], c.pads[r:]
        x = x[tuple(slice(-min(b, 0), d + min(e, 0)) for d, b, e in zip(x.shape, begin, end))]
        width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
        if not any(b or e for b, e in width):
            return x
        if c.mode == "constant":
            return np.pad(x, width, constant_values=np.asarray(c.value).astype(x.dtype))
        return np.pad(x, width, mode=c.mode)

    def tvm_lowering(self, c, L, x):
        """Constant and edge padding (and cropping): element i of the result reads element
        i - begin of x, where it lies inside x (edge: the nearest inside)."""
        t, out = c.in_types[0], c.out_types[0]
        if c.mode not in ("constant", "edge"):
            raise NotImplementedError(f"{c.mode} padding")
        begin = c.pads[:t.rank]

        def fn(*i):
            src = [L.i64(k) - L.i64(b) for k, b in zip(i, begin)]
            if c.mode == "edge":
                return x[tuple(L.cast(L.min(L.max(s, L.i64(0)), L.i64(d - 1)), "int32")
                               for s, d in zip(src, t.shape))]
            inside = L.tirx.all(*(e for s, d in zip(src, t.shape)
                                  for e in (s >= L.i64(0), s < L.i64(d))))
            dt = np.dtype(t.dtype.np)
            value = L.const_or_cast(np.asarray(c.value).astype(dt)[()], dt.name)
            return L.tirx.if_then_else(inside, x[tuple(L.cast(s, "int32") for s in src)], value)
        return L.compute(out, fn)


class TopK(OpDef):
    """The k largest (or smallest) along ``axis`` -> (values, i64 indices); ties keep the
    lower index first. NaN counts as the largest value. Results are always sorted."""

    name = "topk"
    operands = ("x",)
    attrs = {"k": Int(), "axis": Int(-1), "largest": Bool(True), "sorted": Bool(True)}

    def onnx_export(self, e, node, ins, outs):
        e.emit("TopK", ins + [e.ints([node.attrs["k"]], "k")], outs, axis=node.attrs["axis"],
               largest=int(node.attrs["largest"]), sorted=1)

    def infer(self, c, x):
        axis = norm_axis(c.axis, x.rank)
        require(0 <= c.k <= x.shape[axis], f"k={c.k} out of range for axis {axis} of {x}")
        shape = x.shape[:axis] + (c.k,) + x.shape[axis + 1:]
        return moved(x, shape, Layout.plain), TensorType(shape, DType.i64)

    def compute(self, c, x):
        axis = norm_axis(c.axis, x.ndim)
        if c.largest:   # descending, ties by lower index: reverse a stable sort of the flip
            n = x.shape[axis]
            order = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
            order = n - 1 - np.flip(order, axis)
        else:
            order = np.argsort(x, axis=axis, kind="stable")
        idx = np.take(order, np.arange(c.k), axis=axis)
        return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


class Constant(OpDef):
    name = "constant"
    attrs = {"value": Tensor()}

    def onnx_export(self, e, node, ins, outs):
        import onnx
        e.emit("Constant", [], outs, value=onnx.numpy_helper.from_array(
            np.asarray(node.attrs["value"]), outs[0]))

    def infer(self, c):
        try:
            return TensorType.of(c.value)
        except TypeError as e:
            raise ValueError(str(e)) from None

    def compute(self, c):
        return c.value
