"""ATen converters: shapes, data movement and indexing."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...extras import require
from ...ir.graph import Value
from ...ir.types import DType
from .importer import AtenCtx, aten_converter, ir_dtype, norm_dim, pair, rank_of, torch_dtype

torch = require("torch")

# ---- shapes and data movement ------------------------------------------------------------------

def _resolve(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = [int(d) for d in shape]
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@aten_converter("aten.reshape_as", "aten.view_as")
def _reshape_as(c: AtenCtx):
    return c.emit("reshape", [c.arg(0)], shape=c.arg(1).type.shape)


@aten_converter("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(c: AtenCtx):
    x = c.arg(0)
    return c.emit("reshape", [x], shape=_resolve(c.arg(1), x.type.numel))


@aten_converter("aten.flatten")
def _flatten(c: AtenCtx):
    x = c.arg(0)
    r = rank_of(x)
    s, e = norm_dim(c.arg(1, "start_dim", 0), r), norm_dim(c.arg(2, "end_dim", -1), r)
    shape = x.type.shape[:s] + (math.prod(x.type.shape[s:e + 1]),) + x.type.shape[e + 1:]
    return c.emit("reshape", [x], shape=shape)


@aten_converter("aten.unsqueeze")
def _unsqueeze(c: AtenCtx):
    x = c.arg(0)
    return c.emit("unsqueeze", [x], axes=(norm_dim(c.arg(1), rank_of(x) + 1),))


@aten_converter("aten.squeeze")
def _squeeze(c: AtenCtx):
    x = c.arg(0)
    dims = c.arg(1, "dim")
    dims = range(rank_of(x)) if dims is None else ([dims] if isinstance(dims, int) else dims)
    axes = tuple(a for a in (norm_dim(d, rank_of(x)) for d in dims) if x.type.shape[a] == 1)
    return c.emit("squeeze", [x], axes=axes) if axes else x


@aten_converter("aten.permute")
def _permute(c: AtenCtx):
    x = c.arg(0)
    return c.emit("transpose", [x], perm=tuple(norm_dim(d, rank_of(x)) for d in c.arg(1)))


@aten_converter("aten.transpose", "aten.t", "aten.swapaxes", "aten.swapdims")
def _transpose(c: AtenCtx):
    x = c.arg(0)
    perm = list(range(rank_of(x)))
    a, b = (norm_dim(c.arg(1, default=0), len(perm)), norm_dim(c.arg(2, default=1), len(perm)))
    perm[a], perm[b] = perm[b], perm[a]
    return c.emit("transpose", [x], perm=tuple(perm))


@aten_converter("aten.select")
def _select(c: AtenCtx):
    x = c.arg(0)
    axis = norm_dim(c.arg(1), rank_of(x))
    index = c.arg(2) % x.type.shape[axis]
    return c.emit("gather", [x, c.const(np.array(index, np.int64))], axis=axis)


@aten_converter("aten.slice")
def _slice(c: AtenCtx):
    x = c.arg(0)
    axis = norm_dim(c.arg(1, "dim", 0), rank_of(x))
    start, end, step = c.arg(2, "start"), c.arg(3, "end"), c.arg(4, "step", 1)
    dim = x.type.shape[axis]
    s = slice(0 if start is None else start, dim if end is None else min(end, dim), step)
    start, end, step = s.indices(dim)
    if (start, end, step) == (0, dim, 1):
        return x
    return c.emit("slice", [x], starts=(start,), ends=(end,), axes=(axis,), steps=(step,))


@aten_converter("aten.cat", "aten.concat")
def _cat(c: AtenCtx):
    xs = [x for x in c.arg(0) if x.type.numel or len(c.arg(0)) == 1]
    axis = norm_dim(c.arg(1, "dim", 0), rank_of(xs[0]))
    return xs[0] if len(xs) == 1 else c.emit("concat", xs, axis=axis)


@aten_converter("aten.stack")
def _stack(c: AtenCtx):
    xs = c.arg(0)
    axis = norm_dim(c.arg(1, "dim", 0), rank_of(xs[0]) + 1)
    parts = [c.emit("unsqueeze", [x], axes=(axis,)) for x in xs]
    return parts[0] if len(parts) == 1 else c.emit("concat", parts, axis=axis)


def _split(c: AtenCtx, sizes: Sequence[int], axis: int) -> list[Value]:
    x = c.arg(0)
    out = c.emit("split", [x], axis=axis, sizes=tuple(sizes))
    return list(out) if isinstance(out, tuple) else [out]


@aten_converter("aten.split_with_sizes")
def _split_with_sizes(c: AtenCtx):
    x = c.arg(0)
    return _split(c, c.arg(1), norm_dim(c.arg(2, "dim", 0), rank_of(x)))


@aten_converter("aten.split.Tensor", "aten.chunk")
def _split_even(c: AtenCtx):
    x = c.arg(0)
    axis = norm_dim(c.arg(2, "dim", 0), rank_of(x))
    dim = x.type.shape[axis]
    size = c.arg(1) if c.target.startswith("aten.split") else -(-dim // c.arg(1))
    sizes = [min(size, dim - i) for i in range(0, dim, size)]
    return _split(c, sizes, axis)


@aten_converter("aten.expand")
def _expand(c: AtenCtx):
    x = c.arg(0)
    shape = list(c.arg(1))
    lead = len(shape) - rank_of(x)
    shape = [x.type.shape[i - lead] if d == -1 else d for i, d in enumerate(shape)]
    return c.emit("expand", [x], shape=tuple(shape))


@aten_converter("aten.expand_as")
def _expand_as(c: AtenCtx):
    return c.emit("expand", [c.arg(0)], shape=c.arg(1).type.shape)


@aten_converter("aten.to", "aten._to_copy", "aten.type_as")
def _to(c: AtenCtx):
    x = c.arg(0)
    dtype = c.kwargs.get("dtype")
    if dtype is None:
        dtype = next((a for a in c.args[1:] if isinstance(a, torch.dtype)), None)
    if c.target.startswith("aten.type_as"):
        dtype = torch_dtype(c.arg(1).type.dtype)
    if dtype is None or ir_dtype(dtype, c.loc) is x.type.dtype:
        return x
    return c.emit("cast", [x], to=ir_dtype(dtype, c.loc).value)


@aten_converter("aten.contiguous", "aten.clone", "aten.detach", "aten.detach_", "aten.alias",
                "aten.dropout", "aten.lift_fresh_copy")
def _same(c: AtenCtx):
    return c.arg(0)


@aten_converter("aten._assert_tensor_metadata")
def _ignore(c: AtenCtx):
    return None


@aten_converter("aten.ones_like", "aten.zeros_like", "aten.full_like", "aten.new_zeros",
                "aten.new_ones", "aten.new_full")
def _like(c: AtenCtx):
    x = c.arg(0)
    name = c.target.split(".")[1]
    fill = {"ones_like": 1, "zeros_like": 0, "new_ones": 1, "new_zeros": 0}.get(name)
    shape = x.type.shape if name.endswith("_like") else tuple(c.arg(1))
    if fill is None:
        fill = c.arg(1) if name == "full_like" else c.arg(2)
    dtype = c.kwargs.get("dtype")
    np_dtype = x.type.dtype.np if dtype is None else ir_dtype(dtype, c.loc).np
    return c.graph.add_const(np.full(shape, fill, np_dtype), c.graph.unique_name(name))



# ---- more shapes and indexing -------------------------------------------------------------------

@aten_converter("aten.unflatten")
def _unflatten(c: AtenCtx):
    x = c.arg(0)
    axis = norm_dim(c.arg(1), rank_of(x))
    sizes = _resolve(c.arg(2), x.type.shape[axis])
    return c.emit("reshape", [x], shape=x.type.shape[:axis] + sizes + x.type.shape[axis + 1:])


@aten_converter("aten.unbind")
def _unbind(c: AtenCtx):
    x = c.arg(0)
    axis = norm_dim(c.arg(1, "dim", 0), rank_of(x))
    parts = _split(c, [1] * x.type.shape[axis], axis)
    return [c.emit("squeeze", [p], axes=(axis,)) for p in parts]


@aten_converter("aten.pad", "aten.constant_pad_nd")
def _pad(c: AtenCtx):
    x = c.arg(0)
    pad = list(c.arg(1))
    mode = ("constant" if c.target.startswith("aten.constant_pad_nd")
            else c.arg(2, "mode", "constant"))
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise c.unsupported(f"pad mode {mode!r}")
    value = c.arg(2 if c.target.startswith("aten.constant_pad_nd") else 3, "value")
    r = rank_of(x)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):     # torch lists (begin, end) from the last axis backwards
        begins[r - 1 - i], ends[r - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    if any(p < 0 for p in begins + ends):
        raise c.unsupported("negative padding")
    return c.emit("pad", [x], pads=(*begins, *ends), mode=modes[mode],
                  value=float(value or 0.0))


@aten_converter("aten.roll")
def _roll(c: AtenCtx):
    x = c.arg(0)
    shifts = pair(c.arg(1), 1)
    dims = c.arg(2, "dims", ())
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:                       # roll of the flattened tensor
        flat = c.emit("reshape", [x], shape=(x.type.numel,))
        return c.emit("reshape", [_roll_axis(c, flat, shifts[0], 0)], shape=x.type.shape)
    for s, d in zip(shifts, dims):
        x = _roll_axis(c, x, s, norm_dim(d, rank_of(x)))
    return x


def _roll_axis(c: AtenCtx, x: Value, shift: int, axis: int) -> Value:
    n = x.type.shape[axis]
    s = shift % n if n else 0
    if s == 0:
        return x
    tail = c.emit("slice", [x], starts=(n - s,), ends=(n,), axes=(axis,), steps=(1,))
    head = c.emit("slice", [x], starts=(0,), ends=(n - s,), axes=(axis,), steps=(1,))
    return c.emit("concat", [tail, head], axis=axis)


@aten_converter("aten.fill")
def _fill(c: AtenCtx):
    x = c.arg(0)
    value = c.arg(1)
    if isinstance(value, Value):
        return c.emit("expand", [c.emit("cast", [value], to=x.type.dtype.value)
                                 if value.type.dtype is not x.type.dtype else value],
                      shape=x.type.shape)
    return c.graph.add_const(np.full(x.type.shape, value, x.type.dtype.np),
                             c.graph.unique_name("fill"))


@aten_converter("aten.slice_scatter")
def _slice_scatter(c: AtenCtx):
    x, src = c.arg(0), c.arg(1)
    axis = norm_dim(c.arg(2, "dim", 0), rank_of(x))
    n = x.type.shape[axis]
    start, end, step = slice(c.arg(3, "start"), c.arg(4, "end"), c.arg(5, "step", 1)).indices(n)
    if step != 1:
        raise c.unsupported("slice_scatter with a step")
    parts = [c.emit("slice", [x], starts=(0,), ends=(start,), axes=(axis,), steps=(1,))
             if start else None,
             src,
             c.emit("slice", [x], starts=(end,), ends=(n,), axes=(axis,), steps=(1,))
             if end < n else None]
    parts = [p for p in parts if p is not None]
    return parts[0] if len(parts) == 1 else c.emit("concat", parts, axis=axis)


@aten_converter("aten.index.Tensor")
def _index(c: AtenCtx):
    x, indices = c.arg(0), list(c.arg(1))
    given = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(given) != 1:
        raise c.unsupported("indexing with more than one index tensor")
    axis, ix = given[0]
    if ix.type.dtype is DType.bool:
        raise c.unsupported("boolean mask indexing (a data-dependent shape)")
    return c.emit("gather", [x, ix], axis=axis)


@aten_converter("aten.embedding")
def _embedding(c: AtenCtx):
    return c.emit("gather", [c.arg(0), c.arg(1)], axis=0)


@aten_converter("aten.gather")
def _gather_elements(c: AtenCtx):
    x = c.arg(0)
    return c.emit("gather_elements", [x, c.arg(2)], axis=norm_dim(c.arg(1), rank_of(x)))
