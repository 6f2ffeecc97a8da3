"""Reductions over a set of axes: mean, sum, max, min.

``axes`` None reduces every axis; an empty list reduces none (numpy's ``axis=()``).
Results have the input's dtype; float sums and means accumulate as numpy does (pairwise).
Max and min of an empty set give the dtype's lowest / highest value (-inf / inf for floats).
"""
from __future__ import annotations

import numpy as np

from ..ir.types import Layout, TensorType
from .common import float_operands, require
from ..ir.opdef import Bool, FixedLowering, Int, Ints, OpDef
from .shape import norm_axes
from .common import norm_axis
from .cost import per_element
from .onnx_export import with_inputs


def _bound(dtype: np.dtype, high: bool):
    if dtype.kind == "f":
        return np.inf if high else -np.inf
    info = np.iinfo(dtype)
    return info.max if high else info.min


class Reduce(OpDef):
    """A reduction; subclasses set ``fn(x, axis, keepdims)`` and ``floats_only``."""

    operands = ("x",)
    attrs = {"axes": Ints(None), "keepdims": Bool(True)}
    floats_only = False
    keeps_quant = False
    cycle_cost = per_element(1, "reduce")

    def infer(self, c, x):
        if self.floats_only:
            float_operands(x)
        else:
            require(x.dtype.is_float or x.dtype.is_int, f"expects a numeric operand, got {x.dtype}")
        axes = range(x.rank) if c.axes is None else norm_axes(c.axes, x.rank)
        if c.keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        layout = x.layout if c.keepdims and x.rank == 4 else Layout.plain
        per_tensor = x.quant is not None and x.quant.axis is None
        return TensorType(shape, x.dtype, layout,
                          x.quant if self.keeps_quant and per_tensor else None)

    def compute(self, c, x):
        axes = None if c.axes is None else norm_axes(c.axes, x.ndim)
        y = type(self).fn(x, axes, c.keepdims)
        return np.asarray(y).astype(x.dtype, copy=False)


def reduced_index(i: tuple, rank: int, rs: dict, keepdims: bool) -> list:
    """The operand index read at result index ``i`` of a reduction over ``rs`` (axis ->
    its reduce variable): reduced axes read their variable, kept ones skip their size-1
    result axis."""
    it, idx = iter(i), []
    for a in range(rank):
        if a in rs and keepdims:
            next(it)
        idx.append(rs[a] if a in rs else next(it))
    return idx


def _extreme(kind: str):
    """The kernel of an integer max or min: te's reducer, whose identity is the dtype's
    lowest or highest value, as the golden model's ``initial``."""
    def tvm_lowering(self, c, L, x):
        t = c.in_types[0]
        axes = range(t.rank) if c.axes is None else norm_axes(c.axes, t.rank)
        rs = {a: L.reduce_axis(t.shape[a], f"r{a}") for a in axes}

        def fn(*i):
            v = x[tuple(reduced_index(i, t.rank, rs, c.keepdims))]
            return getattr(L.te, kind)(v, axis=list(rs.values())) if rs else v
        return L.te.compute(c.out_types[0].shape, fn, name=kind)     # x's dtype
    return tvm_lowering


def reduction(name: str, fn, floats_only: bool = False, keeps_quant: bool = False,
              doc: str = "", **interfaces) -> type[Reduce]:
    return type("Reduce" + name.title(), (Reduce,), {
        "name": "reduce_" + name, "fn": staticmethod(fn), "floats_only": floats_only,
        "keeps_quant": keeps_quant, "doc": doc,
        "onnx_export": with_inputs("Reduce" + name.title(), "axes", attrs={"keepdims": "keepdims"}),
        **interfaces})


ReduceMean = reduction("mean", lambda x, a, k: np.mean(x, axis=a, keepdims=k), floats_only=True,
                       fixed_point=FixedLowering("reduce", "fx_reduce_mean"))
ReduceSum = reduction("sum", lambda x, a, k: np.sum(x, axis=a, keepdims=k, dtype=x.dtype),
                      fixed_point=FixedLowering("reduce", "fx_reduce_sum"))
ReduceMax = reduction("max", lambda x, a, k: np.max(x, axis=a, keepdims=k,
                                                    initial=_bound(x.dtype, False)),
                      keeps_quant=True, fixed_point=FixedLowering("movement"),
                      tvm_lowering=_extreme("max"))
ReduceMin = reduction("min", lambda x, a, k: np.min(x, axis=a, keepdims=k,
                                                    initial=_bound(x.dtype, True)),
                      keeps_quant=True, fixed_point=FixedLowering("movement"),
                      tvm_lowering=_extreme("min"))


class CumSum(OpDef):
    """Running sums along ``axis`` (ONNX CumSum, torch.cumsum): ``exclusive`` leaves each
    element out of its own sum, ``reverse`` sums from the end. Floats add in order, one
    element after the other, as numpy's cumsum does."""

    name = "cumsum"
    onnx_export = with_inputs("CumSum", "axis", attrs={"exclusive": "exclusive",
                                                      "reverse": "reverse"})
    operands = ("x",)
    attrs = {"axis": Int(), "exclusive": Bool(False), "reverse": Bool(False)}
    cycle_cost = per_element(1, "reduce")

    def infer(self, c, x):
        require(x.dtype.is_float or x.dtype.is_int, f"expects a numeric operand, got {x.dtype}")
        norm_axis(c.axis, x.rank)
        return TensorType(x.shape, x.dtype, Layout.plain if x.rank == 4 else x.layout)

    def compute(self, c, x):
        axis = norm_axis(c.axis, x.ndim)
        y = np.flip(x, axis) if c.reverse else x
        s = np.cumsum(y, axis=axis, dtype=x.dtype)
        if c.exclusive:
            s = np.concatenate([np.zeros_like(np.take(s, [0], axis)),
                                np.delete(s, -1, axis)], axis)
        return np.ascontiguousarray(np.flip(s, axis) if c.reverse else s)

    def tvm_lowering(self, c, L, x):
        """Each result the sum of the elements before it (after it, ``reverse``), itself
        included unless ``exclusive``: the low bits of the exact sum, as numpy's integer
        cumsum wraps (unsigned 64-bit arithmetic, which wraps where signed overflow is
        undefined). Integers only: te's float sum would start from +0.0, where numpy's
        starts from the first element (a -0.0 stays -0.0)."""
        t = c.in_types[0]
        require(t.dtype.is_int, f"the lowering takes integer operands, got {t.dtype}")
        axis = norm_axis(c.axis, t.rank)
        k = L.reduce_axis(t.shape[axis], "k")

        def fn(*i):
            j = k.var
            summed = (j > i[axis] if c.reverse else j < i[axis]) if c.exclusive else \
                (j >= i[axis] if c.reverse else j <= i[axis])
            v = L.cast(x[i[:axis] + (k,) + i[axis + 1:]], "uint64")
            # a select, not te.sum(where=...): create_prim_func drops that condition
            return L.te.sum(L.select(summed, v, L.tirx.const(0, "uint64")), axis=k)
        sums = L.te.compute(t.shape, fn, name="sums")      # a reduction is a stage's top
        return L.compute(c.out_types[0], lambda *i: sums[i])
