"""ONNX converters: constants and shape computations (folded at import), einsum."""
from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError
from ...ir.limits import fold_bytes, nbytes
from ...ir.types import TensorType
from .importer import check_folded
from .registry import NodeCtx, converts

# ---- constants and shape computations (folded at import) ------------------------------------

@converts("Constant", attrs=("value", "value_float", "value_floats", "value_int",
                             "value_ints", "sparse_value", "value_string", "value_strings"))
def _constant(c: NodeCtx):
    if len(c.attrs) != 1:
        raise c.unsupported("exactly one value attribute is needed")
    (name, v), = c.attrs.items()
    if name == "value":
        a = np.asarray(v)
    elif name == "value_float":
        a = np.array(v, np.float32)
    elif name == "value_floats":
        a = np.array(v, np.float32)
    elif name == "value_int":
        a = np.array(v, np.int64)
    elif name == "value_ints":
        a = np.array(v, np.int64)
    else:
        raise c.unsupported(f"attribute '{name}' is not supported")
    try:
        TensorType.of(a)
    except TypeError:
        raise c.unsupported(f"constant of dtype {a.dtype}") from None
    return c.constant(np.asarray(a, order="C"))


@converts("Shape", attrs=("start", "end"))
def _shape(c: NodeCtx):
    shape = list(c.input(0).type.shape)
    start = c.attr("start", 0)
    end = c.attr("end", None)
    return c.constant(np.array(shape[start:end], np.int64))


@converts("Size")
def _size(c: NodeCtx):
    return c.constant(np.array(c.input(0).type.numel, np.int64))


@converts("ConstantOfShape", attrs=("value",))
def _constant_of_shape(c: NodeCtx):
    shape = c.ints(0, "input")
    value = c.attr("value", np.zeros(1, np.float32))
    value = np.asarray(value)
    if value.size != 1:
        raise c.unsupported("attribute 'value' must have one element")
    if min(shape, default=0) < 0:
        raise c.unsupported(f"negative dimension in shape {shape}")
    if nbytes(shape, value.dtype.itemsize) > fold_bytes():     # too large to fold: a node
        return c.emit("expand", [c.constant(value.reshape(()))], {"shape": shape})
    return c.constant(np.full(shape, value.reshape(-1)[0], value.dtype))


@converts("Range", attrs=("stash_type",))
def _range(c: NodeCtx):
    start, limit, delta = (c.const(i, w) for i, w in enumerate(("start", "limit", "delta")))
    dtype = start.dtype
    stash = dtype
    if dtype == np.float16 and c.version >= 27:
        if c.attr("stash_type", 1) != 1:
            raise c.unsupported(f"attribute 'stash_type' = {c.attr('stash_type')} (only 1, "
                                "float32)")
        stash = np.dtype(np.float32)
    s, l, d = (np.asarray(v).astype(stash).reshape(()).item() for v in (start, limit, delta))
    if d == 0:
        raise c.unsupported("delta of 0")
    n = max(int(math.ceil((l - s) / d)), 0)
    check_folded(c, n * np.dtype(stash).itemsize, "output")
    return c.constant((s + np.arange(n) * d).astype(stash).astype(dtype))


@converts("Einsum", attrs=("equation",))
def _einsum(c: NodeCtx):
    from ..einsum import einsum
    c.require_float(*c.inputs)
    try:
        return einsum(lambda op, xs, attrs: c.emit(op, xs, attrs), c.attr("equation"), c.inputs)
    except UnsupportedError as e:
        raise c.unsupported(e.message) from None
