"""Fixed-point functions as tables: one entry per input code (256 for i8, 65536 for i16),
computed once in float64 and rounded (``bevir.ops.numerics.lut_table``), so the golden
model and the generated kernels agree by construction. The activations of the zoo's
models (sigmoid, SiLU, hard-swish, hard-sigmoid, GELU), exp, log and BEVFormer's
inverse_sigmoid."""
from __future__ import annotations

import math

import numpy as np

from ..ir.opdef import Float, OpDef, Str
from .cost import per_element
from .fixed_point import ACT_DTYPE, OUT, I8, I16, require_out_frac, fixed_type, frac_of, out_dtype
from .numerics import lut_table
from .onnx_export import inverse_sigmoid, qdq


class FxLookup(OpDef):
    """An elementwise function of i8 or i16 fixed x as a table with one entry per input
    code (lut_table: 256 or 65536 entries), giving out_dtype (i8, default, or i16) fixed."""

    cycle_cost = per_element(2, "table")   # index, load
    operands = ("x",)
    attrs = {**OUT, **ACT_DTYPE}
    splits = ("rows",)
    x_dtypes = (I8, I16)

    def real(self, v: np.ndarray, **attrs) -> np.ndarray:
        """The function in float64."""
        raise NotImplementedError

    def infer(self, c, x):
        frac_of(x, "x", self.x_dtypes)
        require_out_frac(c.out_frac_bits)
        return fixed_type(x.shape, c.out_frac_bits, x.layout, out_dtype(c))

    def table(self, c) -> tuple[np.ndarray, int]:
        """(the table, the index of code 0 in it)."""
        x = c.in_types[0]
        attrs = {k: v for k, v in c.attrs.items() if k not in ("out_frac_bits", "out_dtype")}
        table = lut_table(self.name, x.quant.frac_bits[0], c.out_frac_bits, x.dtype.np,
                          out_dtype(c).np, **attrs)
        return table, -int(np.iinfo(x.dtype.np).min)

    def compute(self, c, x):
        table, zero = self.table(c)
        return table[x.astype(np.intp) + zero]

    def tvm_lowering(self, c, L, x):
        table, zero = self.table(c)
        t = L.const(table, "lut")
        return L.compute(c.out_types[0], lambda *i: t[L.cast(x[i], "int32") + zero])


class FxSigmoid(FxLookup):
    """1 / (1 + exp(-x)) as a table."""

    name = "fx_sigmoid"
    onnx_export = qdq("sigmoid")

    def real(self, v):
        return 0.5 * (1.0 + np.tanh(0.5 * v))


class FxExp(FxLookup):
    """exp(x) as a table (saturating)."""

    name = "fx_exp"
    onnx_export = qdq("exp")

    def real(self, v):
        return np.exp(v)


class FxLog(FxLookup):
    """log(x) as a table; x <= 0 gives -128."""

    name = "fx_log"
    onnx_export = qdq("log")

    def real(self, v):
        return np.log(v)


class FxSqrt(FxLookup):
    """sqrt(x) as a table; x < 0 gives the lowest code."""

    name = "fx_sqrt"
    onnx_export = qdq("sqrt")

    def real(self, v):
        with np.errstate(invalid="ignore"):
            return np.sqrt(v)


class FxReciprocal(FxLookup):
    """1 / x as a table; x = 0 saturates to the highest code."""

    name = "fx_reciprocal"
    onnx_export = qdq("reciprocal")

    def real(self, v):
        with np.errstate(divide="ignore"):
            return 1.0 / v


class FxInverseSigmoid(FxLookup):
    """BEVFormer's inverse_sigmoid: x clamped to [0, 1], log(max(x, eps) / max(1 - x, eps)),
    as a table."""

    name = "fx_inverse_sigmoid"
    onnx_export = qdq(inverse_sigmoid)
    attrs = {**OUT, **ACT_DTYPE, "eps": Float(1e-5)}

    def real(self, v, eps):
        x = np.clip(v, 0.0, 1.0)
        return np.log(np.maximum(x, eps) / np.maximum(1.0 - x, eps))


class FxGelu(FxLookup):
    """GELU (erf, or the tanh approximation) as a table."""

    name = "fx_gelu"
    onnx_export = qdq("gelu")
    attrs = {**OUT, **ACT_DTYPE, "approximate": Str("none", ("none", "tanh"))}

    def real(self, v, approximate):
        if approximate == "tanh":
            return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
        return 0.5 * v * (1 + np.array([math.erf(t / math.sqrt(2)) for t in v]))


class FxSilu(FxLookup):
    """x * sigmoid(x) (SiLU, swish) as a table."""

    name = "fx_silu"
    onnx_export = qdq("silu")

    def real(self, v):
        return v * (0.5 * (1.0 + np.tanh(0.5 * v)))


class FxHardswish(FxLookup):
    """x * clip(x / 6 + 1/2, 0, 1) as a table."""

    name = "fx_hardswish"
    onnx_export = qdq("hardswish")

    def real(self, v):
        return v * np.clip(v / 6.0 + 0.5, 0.0, 1.0)


class FxHardsigmoid(FxLookup):
    """clip(alpha * x + beta, 0, 1) as a table."""

    name = "fx_hardsigmoid"
    onnx_export = qdq("hardsigmoid")
    attrs = {**OUT, **ACT_DTYPE, "alpha": Float(0.2), "beta": Float(0.5)}

    def real(self, v, alpha, beta):
        return np.clip(alpha * v + beta, 0.0, 1.0)


class FxTanh(FxLookup):
    """tanh(x) as a table."""

    name = "fx_tanh"
    onnx_export = qdq("tanh")

    def real(self, v):
        return np.tanh(v)
