"""Elementwise ops: unary math, broadcasting binary arithmetic, clip, where, cast."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..ir.types import DType, TensorType
from ..ir.opdef import Activation, Bool, FixedLowering, Float, OpDef, Str, c_ordered
from . import native
from .common import broadcast_types, float_operands, require, same_dtype
from .layout_rules import ELEMENTWISE
from .onnx_export import atan2, onnx_as, silu


#: elements per block of a many-step float64 function (:func:`blockwise`): its
#: temporaries stay in cache, and numpy's per-call cost stays small beside the work
BLOCK = 1 << 16


def blockwise(fn):
    """``fn(x, *args)``, an elementwise function, evaluated block by block of :data:`BLOCK`
    elements of ``x``: the same result bit for bit, several times faster on large
    tensors when ``fn`` runs many passes over float64 temporaries."""
    @functools.wraps(fn)
    def run(x: np.ndarray, *args) -> np.ndarray:
        x = np.asarray(x)
        if x.size <= BLOCK:
            return fn(x, *args)
        flat = x.reshape(-1)
        blocks = [fn(flat[i:i + BLOCK], *args) for i in range(0, flat.size, BLOCK)]
        return np.concatenate(blocks).reshape(x.shape)
    return run


@functools.cache
def _zeros(dtype: np.dtype) -> np.ndarray | None:
    """BLOCK read-only zeros of ``dtype``, or None where numpy's maximum against an array
    of zeros differs from its maximum against a scalar zero (its vector and scalar loops
    may break the tie of -0 and +0 differently on other processors)."""
    zeros = np.zeros(BLOCK, dtype)
    zeros.setflags(write=False)
    values = [-0.0, 0.0, np.nan, -np.nan, -1.0, 1.0] if dtype.kind == "f" else [-1, 0, 1]
    probe = np.resize(np.array(values).astype(dtype), 67)
    vector, scalar = np.maximum(probe, zeros[:probe.size]), np.maximum(probe, dtype.type(0))
    return zeros if vector.tobytes() == scalar.tobytes() else None


def relu_values(x: np.ndarray) -> np.ndarray:
    """``np.maximum(x, 0)``, compared block by block with an array of zeros where ``x`` is
    contiguous: numpy's maximum runs its vector loop for two arrays, and a loop about three
    times slower for an array and a scalar (the same bits: :func:`_zeros` checks)."""
    zeros = _zeros(x.dtype) if x.flags.c_contiguous else None
    if zeros is None:
        return np.maximum(x, x.dtype.type(0))
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for i in range(0, flat.size, BLOCK):
        j = min(i + BLOCK, flat.size)
        np.maximum(flat[i:j], zeros[:j - i], out=out[i:j])
    return out.reshape(x.shape)


#: the Chebyshev fit of erfc's exponent (Numerical Recipes): its coefficient of the highest
#: degree, the others down to degree 1, its constant term
_ERFC_LEAD, _ERFC_CONSTANT = 0.17087277, 1.26551223
_ERFC_TAIL = (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368)


@blockwise
def _erf(x: np.ndarray) -> np.ndarray:
    """erf through the Chebyshev-fitted erfc (fractional error < 1.2e-7), in float64:
    erfc = t * exp(-z^2 - 1.26551223 + t * (1.00002368 + t * (... + t * 0.17087277))),
    t = 1 / (1 + z / 2), z = |x|; erf = 1 - erfc for x >= 0, erfc - 1 below. Evaluated in
    place, in as few passes as give the same roundings."""
    flat = np.asarray(x).reshape(-1)        # in-place steps need arrays, also for 0-d x
    z = np.abs(flat, dtype=np.float64)
    t = np.multiply(z, 0.5)
    t += 1.0
    np.divide(1.0, t, out=t)
    acc = t * _ERFC_LEAD
    for c in _ERFC_TAIL:
        acc += c
        acc *= t
    poly = np.negative(np.multiply(z, z, out=z), out=z)
    poly -= _ERFC_CONSTANT
    poly += acc
    erfc = np.exp(poly, out=poly)
    erfc *= t
    # s - s * erfc with s = +-1: 1 - erfc, or exactly -(1 - erfc) = erfc - 1 (+0 as erfc - 1
    # gives it); the sign of x + 0, so that -0 counts as x >= 0
    sign = np.add(flat, 0.0, dtype=np.float64)
    np.copysign(1.0, sign, out=sign)
    erfc *= sign
    y = np.subtract(sign, erfc, out=erfc)
    return y.astype(x.dtype, copy=False).reshape(np.shape(x))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    # the same float64 arithmetic, natively, into C order: the numpy code's result lies in
    # memory as x does (a later reduction sums in memory order) up to a block, then in C order
    if approximate != "tanh" and (x.flags.c_contiguous or x.size > BLOCK):
        y = native.gelu_erf(x, (np.sqrt(2), _ERFC_LEAD) + _ERFC_TAIL + (_ERFC_CONSTANT,))
        if y is not None:
            return y
    return _gelu_numpy(x, approximate)


@blockwise
def _gelu_numpy(x: np.ndarray, approximate: str) -> np.ndarray:
    xd = x.astype(np.float64)
    if approximate == "tanh":
        y = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
    else:
        y = 0.5 * xd * (1 + _erf(xd / np.sqrt(2)))
    return y.astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below. The
    # numerator is max(e, [x >= 0]): 1 where x >= 0 (e <= 1), e below (e >= 0, NaN kept),
    # one vector op where a masked copy would run element by element
    x = np.asarray(x)
    y = native.sigmoid(x)                   # the same arithmetic, natively
    if y is not None:
        return y
    flat = x.reshape(-1)                    # in-place steps need arrays, also for 0-d x
    e = np.exp(-np.abs(flat))
    d = e + x.dtype.type(1)
    np.maximum(e, np.greater_equal(flat, 0).astype(x.dtype), out=e)
    return np.divide(e, d, out=e).reshape(x.shape)


class Unary(OpDef):
    """A float elementwise function; subclasses set ``fn``."""

    nhwc = ELEMENTWISE
    operands = ("x",)

    def infer(self, c, x):
        float_operands(x)
        return x

    def compute(self, c, x):
        return np.asarray(type(self).fn(x), dtype=x.dtype)


def unary(name: str, fn, doc: str = "", **interfaces) -> type[Unary]:
    return type(name.title(), (Unary,), {"name": name, "fn": staticmethod(fn), "doc": doc,
                                         **interfaces})


class Relu(Unary):
    """max(x, 0); integer operands too (the type, quantization included, is kept)."""

    name = "relu"
    fixed_point = FixedLowering("unary", "fx_relu")
    activation = Activation(fixed="fx_relu")
    onnx_export = onnx_as("Relu")

    def infer(self, c, x):
        require(x.dtype.is_float or x.dtype.is_int, f"expects a numeric operand, got {x.dtype}")
        return x

    def compute(self, c, x):
        return relu_values(x)


Sigmoid = unary("sigmoid", _sigmoid, "1 / (1 + exp(-x))",
                fixed_point=FixedLowering("unary", "fx_sigmoid"), onnx_export=onnx_as("Sigmoid"))
Tanh = unary("tanh", np.tanh, fixed_point=FixedLowering("unary", "fx_tanh"),
             onnx_export=onnx_as("Tanh"))
Exp = unary("exp", np.exp, fixed_point=FixedLowering("unary", "fx_exp"), onnx_export=onnx_as("Exp"))
Log = unary("log", np.log, fixed_point=FixedLowering("unary", "fx_log"), onnx_export=onnx_as("Log"))
Sqrt = unary("sqrt", np.sqrt, fixed_point=FixedLowering("unary", "fx_sqrt"),
             onnx_export=onnx_as("Sqrt"))
Erf = unary("erf", _erf, onnx_export=onnx_as("Erf"))
Neg = unary("neg", np.negative, onnx_export=onnx_as("Neg"))
Abs = unary("abs", np.abs, onnx_export=onnx_as("Abs"))
Reciprocal = unary("reciprocal", np.reciprocal,
                   fixed_point=FixedLowering("unary", "fx_reciprocal"),
                   onnx_export=onnx_as("Reciprocal"))
Sin = unary("sin", np.sin, onnx_export=onnx_as("Sin"))
Cos = unary("cos", np.cos, onnx_export=onnx_as("Cos"))


class Gelu(Unary):
    name = "gelu"
    activation = Activation(attrs=(("approximate", "approximate"),), fixed="fx_gelu")
    fixed_point = FixedLowering("unary", "fx_gelu")
    attrs = {"approximate": Str("none", ("none", "tanh"))}
    onnx_export = onnx_as("Gelu", {"approximate": "approximate"})

    def compute(self, c, x):
        return _gelu(x, c.approximate)


def _hardsigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    # onnxruntime's order: clamp(alpha * x + beta) in the operand's dtype
    t = x.dtype.type
    return np.clip(x * t(alpha) + t(beta), t(0), t(1))


class HardSigmoid(Unary):
    """clip(alpha * x + beta, 0, 1); torch's hardsigmoid is alpha = 1/6, beta = 1/2."""

    name = "hardsigmoid"
    activation = Activation(attrs=(("alpha", "alpha"), ("beta", "beta")), fixed="fx_hardsigmoid")
    fixed_point = FixedLowering("unary", "fx_hardsigmoid")
    attrs = {"alpha": Float(0.2), "beta": Float(0.5)}
    onnx_export = onnx_as("HardSigmoid", {"alpha": "alpha", "beta": "beta"})

    def compute(self, c, x):
        return _hardsigmoid(x, c.alpha, c.beta)


Hardswish = unary("hardswish", lambda x: x * _hardsigmoid(x, 1 / 6, 0.5),
                  "x * hardsigmoid(x) (alpha 1/6, beta 1/2)",
                  activation=Activation(fixed="fx_hardswish"),
                  fixed_point=FixedLowering("unary", "fx_hardswish"),
                  onnx_export=onnx_as("HardSwish"))
def _silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    # the same arithmetic, natively, into C order: as x * _sigmoid(x) lies, whatever x's
    # order (a C-ordered operand wins numpy's choice of the result's order)
    y = native.sigmoid(x, silu=True)
    return x * _sigmoid(x) if y is None else y


Silu = unary("silu", _silu, "x * sigmoid(x) (swish)",
             activation=Activation(fixed="fx_silu"), fixed_point=FixedLowering("unary", "fx_silu"),
             onnx_export=staticmethod(silu))


class Identity(OpDef):
    name = "identity"
    nhwc = ELEMENTWISE
    operands = ("x",)
    onnx_export = onnx_as("Identity")

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        return x


class Clip(OpDef):
    """min(max(x, min), max); a bound left unset does not clip."""

    name = "clip"
    activation = Activation(attrs=(("min", "clip_min"), ("max", "clip_max")))
    fixed_point = FixedLowering("clip")
    nhwc = ELEMENTWISE
    operands = ("x",)
    attrs = {"min": Float(None), "max": Float(None)}

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        if x.dtype.kind in "iu":
            lo, hi = clip_codes(c.min, c.max, x.dtype)
            return np.clip(x, x.dtype.type(lo), x.dtype.type(hi))
        lo = -np.inf if c.min is None else c.min
        hi = np.inf if c.max is None else c.max
        return np.clip(x, np.asarray(lo).astype(x.dtype), np.asarray(hi).astype(x.dtype))

    def onnx_export(self, e, node, ins, outs):
        t = node.inputs[0].type
        if t.dtype.is_int:
            bounds = clip_codes(node.attrs["min"], node.attrs["max"], t.dtype.np)
        else:
            bounds = (node.attrs["min"], node.attrs["max"])
        e.emit("Clip", ins + [None if b is None else e.const(np.asarray(b, t.dtype.np), "bound")
                              for b in bounds], outs)

    def tvm_lowering(self, c, L, x):
        t = c.in_types[0]
        require(t.dtype.is_int, "the lowering takes integer codes")
        lo, hi = clip_codes(c.min, c.max, t.dtype.np)
        dt = x.dtype
        return L.compute(t, lambda *i: L.min(L.max(x[i], L.tirx.const(lo, dt)),
                                             L.tirx.const(hi, dt)))


def clip_codes(lo: float | None, hi: float | None, dtype) -> tuple[int, int]:
    """The integer bounds clip applies to an integer tensor: each bound saturated to the
    dtype's range, then cast to it (a fractional bound truncates toward zero)."""
    info = np.iinfo(dtype)
    code = lambda b, unset: unset if b is None else int(np.asarray(  # noqa: E731
        min(max(b, info.min), info.max)).astype(dtype))
    return code(lo, info.min), code(hi, info.max)


def _int_div(a, b):
    """Integer division truncating toward zero, as C (and onnxruntime) do."""
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)


class Binary(OpDef):
    """Broadcasting binary arithmetic; subclasses set ``fn`` (and ``int_fn`` if it differs)."""

    nhwc = ELEMENTWISE
    operands = ("a", "b")
    commutative = False
    fresh_results = True            # a ufunc's new array (or the operand handed over)

    def infer(self, c, a, b):
        return broadcast_types(a, b)

    def compute(self, c, a, b):
        fn = type(self).int_fn if a.dtype.kind in "iub" else type(self).fn
        return np.asarray(fn(a, b)).astype(a.dtype, copy=False)

    def bind_in_place(self, node, operand):
        """A float op whose ``fn`` is a ufunc, on operands of the result's dtype: ``fn``
        with ``out`` the handed-over operand (C-ordered, as :meth:`OpDef.bind` reads them)."""
        fn, out = type(self).fn, node.outputs[0].type
        if not (isinstance(fn, np.ufunc) and out.dtype.is_float
                and node.inputs[operand].type.shape == out.shape
                and all(v.type.dtype == out.dtype for v in node.inputs)):
            return None

        def run(arrays):
            a, b = (c_ordered(x) for x in arrays)
            return [fn(a, b, out=(a, b)[operand])]
        return run


def binary(name: str, fn, int_fn=None, commutative: bool = False,
           int_expr: Callable | None = None, **interfaces) -> type[Binary]:
    """A :class:`Binary` op; ``int_expr(L, a, b)``, where given, is its operator on integer
    (and bool) elements as a TE expression: the op's lowering (:func:`broadcast_lowering`)."""
    if int_expr is not None:
        interfaces["tvm_lowering"] = broadcast_lowering(int_expr, integers_only=True)
    return type(name.title(), (Binary,), {"name": name, "fn": staticmethod(fn),
                                          "int_fn": staticmethod(int_fn or fn),
                                          "commutative": commutative, **interfaces})


def broadcast_lowering(expr: Callable, integers_only: bool = False) -> Callable:
    """The ``tvm_lowering`` of a broadcasting elementwise op whose result element is
    ``expr(L, a, b)`` of its operands' elements at their broadcast indices (the operator
    is all that tells the ops apart). ``integers_only``: the operands must be integer or
    bool (float arithmetic stays on the host)."""
    def tvm_lowering(self, c, L, a, b):
        ta, tb = c.in_types
        require(not integers_only or not ta.dtype.is_float,
                f"the lowering takes integer or bool operands, got {ta.dtype}")
        out = c.out_types[0]
        return L.compute(out, lambda *i: expr(L, a[L.broadcast_index(ta, out.shape, i)],
                                              b[L.broadcast_index(tb, out.shape, i)]))
    return tvm_lowering


def wrapping(op: Callable) -> Callable:
    """An integer operator as numpy computes it on arrays: the low bits of the exact
    result, in the operands' dtype. Computed on unsigned 64-bit values (sign-extended
    operands), whose arithmetic wraps, where C's and LLVM's signed overflow is undefined;
    bools are 0 and 1, and a nonzero result is true (numpy's add is or, mul is and)."""
    def expr(L, a, b):
        return L.cast(op(L.cast(a, "uint64"), L.cast(b, "uint64")), a.dtype)
    return expr


def ordered(fn: Callable) -> Callable:
    """``fn(a, b)`` (a comparison, max or min) on the elements as numbers: bools as 0 and 1."""
    def expr(L, a, b):
        if a.dtype == "bool":
            return L.cast(fn(L, L.cast(a, "int8"), L.cast(b, "int8")), "bool")
        return fn(L, a, b)
    return expr


Add = binary("add", np.add, commutative=True, fixed_point=FixedLowering("binary", "fx_add"),
             onnx_export=onnx_as("Add"), int_expr=wrapping(lambda a, b: a + b),
             sum_activation="none")
Sub = binary("sub", np.subtract, fixed_point=FixedLowering("binary", "fx_sub"),
             onnx_export=onnx_as("Sub"), int_expr=wrapping(lambda a, b: a - b))
Mul = binary("mul", np.multiply, commutative=True, fixed_point=FixedLowering("mul"),
             onnx_export=onnx_as("Mul"), int_expr=wrapping(lambda a, b: a * b))
Div = binary("div", np.divide, _int_div, fixed_point=FixedLowering("div"),
             onnx_export=onnx_as("Div"))
Max = binary("max", np.maximum, commutative=True, onnx_export=onnx_as("Max"),
             int_expr=ordered(lambda L, a, b: L.max(a, b)))
Min = binary("min", np.minimum, commutative=True, onnx_export=onnx_as("Min"),
             int_expr=ordered(lambda L, a, b: L.min(a, b)))
Pow = binary("pow", np.power, fixed_point=FixedLowering("pow"), onnx_export=onnx_as("Pow"))
Atan2 = binary("atan2", np.arctan2,        # atan2(a, b) = angle of the point (b, a)
               onnx_export=staticmethod(atan2))


class Where(OpDef):
    """cond ? x : y with broadcasting."""

    name = "where"
    nhwc = ELEMENTWISE
    operands = ("cond", "x", "y")

    def onnx_export(self, e, node, ins, outs):
        if node.outputs[0].type.dtype is not DType.bool:
            return e.emit("Where", ins, outs)
        c, x, y = ins                  # onnxruntime has no bool Where: (c & x) | (!c & y)
        e.emit("Or", [e.emit("And", [c, x], 1)[0],
                      e.emit("And", [e.emit("Not", [c], 1)[0], y], 1)[0]], outs)

    def infer(self, c, cond, x, y):
        require(cond.dtype is DType.bool, f"condition must be bool, got {cond.dtype}")
        t = broadcast_types(cond.with_(dtype=x.dtype), x, y)
        return t

    def compute(self, c, cond, x, y):
        return np.where(cond, x, y)


class Cast(OpDef):
    """Convert the element type (float to int truncates toward zero)."""

    name = "cast"
    nhwc = ELEMENTWISE
    operands = ("x",)
    attrs = {"to": Str(choices=tuple(d.value for d in DType)),
             "saturate": Bool(False)}

    def infer(self, c, x):
        return TensorType(x.shape, DType(c.to), x.layout)

    def compute(self, c, x):
        to = DType(c.to).np
        if c.saturate and to.kind in "iu" and x.dtype.kind == "f":
            info = np.iinfo(to)
            x = np.clip(np.nan_to_num(x), info.min, info.max)
        return x.astype(to)

    def onnx_export(self, e, node, ins, outs):
        import onnx
        e.emit("Cast", ins, outs,
               to=onnx.helper.np_dtype_to_tensor_dtype(DType(node.attrs["to"]).np), saturate=None)

    def tvm_lowering(self, c, L, x):
        src, to = c.in_types[0].dtype, DType(c.to)
        name = np.dtype(to.np).name

        def fn(*i):
            v = x[i]
            if to is DType.bool:
                return v != L.tirx.const(0, v.dtype)
            if not (src.is_float and to.is_int):
                return L.cast(v, name)
            if c.saturate:          # nan_to_num, then clip to bounds rounded to x's dtype
                info, dt = np.iinfo(to.np), x.dtype
                v = L.select(L.tirx.isnan(v), L.tirx.const(0, dt), v)
                v = L.min(L.max(v, L.tirx.const(float(info.min), dt)),
                          L.tirx.const(float(info.max), dt))
            return L.cast(_x86_float_to_int(L, v, 64 if to.itemsize == 8 else 32), name)
        return L.compute(c.out_types[0], fn)


def _x86_float_to_int(L, v, bits: int):
    """numpy's float -> int cast on x86-64 (CVTTSS2SI / CVTTSD2SI): truncation toward zero
    to a ``bits``-bit integer, NaN and values outside its range giving its minimum; narrower
    integers keep the low bits of the 32-bit result."""
    wide, limit = L.cast(v, "float64"), float(2 ** (bits - 1))
    inside = L.tirx.all(wide >= -limit, wide < limit)          # false for NaN
    safe = L.select(inside, wide, L.tirx.const(0.0, "float64"))
    return L.select(inside, L.cast(safe, f"int{bits}"), L.tirx.const(-(1 << (bits - 1)),
                                                                       f"int{bits}"))


class Compare(OpDef):
    """Broadcasting comparison giving bool."""

    nhwc = ELEMENTWISE
    operands = ("a", "b")

    def infer(self, c, a, b):
        same_dtype(a, b)
        return broadcast_types(a, b, dtype=DType.bool)

    def compute(self, c, a, b):
        return type(self).fn(a, b)


def comparison(name: str, fn: Callable, onnx_name: str, expr: Callable) -> type[Compare]:
    """A :class:`Compare` op: numpy's ``fn``, and ``expr(L, a, b)`` the same comparison of
    two elements for its lowering (exact on every dtype)."""
    return type(onnx_name, (Compare,), {"name": name, "fn": staticmethod(fn),
                                        "onnx_export": onnx_as(onnx_name),
                                        "tvm_lowering": broadcast_lowering(ordered(expr))})


Equal = comparison("equal", np.equal, "Equal", lambda L, a, b: a == b)
Less = comparison("less", np.less, "Less", lambda L, a, b: a < b)
Greater = comparison("greater", np.greater, "Greater", lambda L, a, b: a > b)


class IsNan(OpDef):
    """Whether each element is NaN (bool). A fixed-point value never is: the quantize pass
    lowers it on integer codes to all false (``fixed_point`` ``never_nan``), which is how
    an exporter's guard after a softmax (``where(isnan(p), 0, p)``) leaves an INT8 graph."""

    name = "isnan"
    nhwc = ELEMENTWISE
    operands = ("x",)
    onnx_export = onnx_as("IsNaN")
    fixed_point = FixedLowering("never_nan")

    def infer(self, c, x):
        float_operands(x)
        return TensorType(x.shape, DType.bool, x.layout)

    def compute(self, c, x):
        return np.isnan(x)


class Not(OpDef):
    """Logical not of a bool tensor."""

    name = "not"
    nhwc = ELEMENTWISE
    operands = ("x",)
    onnx_export = onnx_as("Not")

    def infer(self, c, x):
        require(x.dtype is DType.bool, f"expects bool, got {x.dtype}")
        return x

    def compute(self, c, x):
        return np.logical_not(x)

    def tvm_lowering(self, c, L, x):
        return L.compute(c.out_types[0], lambda *i: L.tirx.Not(x[i]))
