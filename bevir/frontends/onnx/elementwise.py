"""ONNX converters: elementwise ops, comparisons, casts."""
from __future__ import annotations

import numpy as np
import onnx

from ...ir.graph import Value
from ...ir.types import DType
from .registry import ONNX_DTYPES, NodeCtx, absolute, converts, negative, scalar

# ---- elementwise ---------------------------------------------------------------------------

_UNARY = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Erf": "erf", "Reciprocal": "reciprocal"}


@converts(*_UNARY)
def _unary(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit(_UNARY[c.op_type], [x])


@converts("Relu")
def _relu(c: NodeCtx):
    return c.emit("relu", [c.input(0)])


@converts("Neg")
def _neg_conv(c: NodeCtx):
    return negative(c, c.input(0))


@converts("Abs")
def _abs_conv(c: NodeCtx):
    return absolute(c, c.input(0))


@converts("Gelu", attrs=("approximate",))
def _gelu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    approx = c.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise c.unsupported(f"attribute 'approximate' = {approx!r}")
    return c.emit("gelu", [x], {"approximate": approx})


@converts("LeakyRelu", attrs=("alpha",))
def _leaky_relu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 0.01)
    neg = c.emit("less", [x, scalar(c, 0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, scalar(c, alpha, x)]), x])


@converts("PRelu")
def _prelu(c: NodeCtx):
    x, slope = c.input(0), c.input(1)
    c.require_float(x, slope)
    neg = c.emit("less", [x, scalar(c, 0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, slope]), x])


@converts("Elu", attrs=("alpha",))
def _elu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 1.0)
    neg = c.emit("less", [x, scalar(c, 0, x)])
    em1 = c.emit("sub", [c.emit("exp", [x]), scalar(c, 1, x)])
    return c.emit("where", [neg, c.emit("mul", [em1, scalar(c, alpha, x)]), x])


@converts("Selu", attrs=("alpha", "gamma"))
def _selu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 1.67326319217681884765625)
    gamma = c.attr("gamma", 1.05070102214813232421875)
    pos = c.emit("greater", [x, scalar(c, 0, x)])
    em1 = c.emit("sub", [c.emit("exp", [x]), scalar(c, 1, x)])
    y = c.emit("where", [pos, x, c.emit("mul", [em1, scalar(c, alpha, x)])])
    return c.emit("mul", [y, scalar(c, gamma, x)])


@converts("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("hardsigmoid", [x], {"alpha": c.attr("alpha", 0.2), "beta": c.attr("beta", 0.5)})


@converts("HardSwish")
def _hard_swish(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("hardswish", [x])


@converts("Softplus")
def _softplus(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("log", [c.emit("add", [c.emit("exp", [x]), scalar(c, 1, x)])])


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converts(*_BINARY)
def _binary(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    if a.type.dtype is DType.bool or b.type.dtype is DType.bool:
        raise c.unsupported("bool operands")
    return c.emit(_BINARY[c.op_type], [a, b])


@converts("Pow")
def _pow(c: NodeCtx):
    x, y = c.input(0), c.input(1)
    if x.type.dtype is y.type.dtype:
        return c.emit("pow", [x, y])
    if x.type.dtype.is_float:   # the result has the base's type
        return c.emit("pow", [x, c.emit("cast", [y], {"to": x.type.dtype.value})])
    xf = c.emit("cast", [x], {"to": "f64"})
    yf = c.emit("cast", [y], {"to": "f64"})
    return c.emit("cast", [c.emit("pow", [xf, yf])], {"to": x.type.dtype.value})


@converts("Max", "Min", "Sum", "Mean")
def _variadic(c: NodeCtx):
    op = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[c.op_type]
    xs = [v for v in c.inputs if v is not None]
    if not xs:
        raise c.unsupported("no operands")
    y = xs[0]
    for v in xs[1:]:
        y = c.emit(op, [y, v])
    if c.op_type == "Mean" and len(xs) > 1:
        c.require_float(y)
        y = c.emit("div", [y, scalar(c, len(xs), y)])
    return y


@converts("Clip", attrs=("min", "max"))
def _clip(c: NodeCtx):
    x = c.input(0)
    if c.version < 11:   # Clip-6: float bounds as attributes
        lo, hi = c.attrs.get("min"), c.attrs.get("max")
        bounds = [None if b is None else scalar(c, b, x) for b in (lo, hi)]
    else:
        if "min" in c.attrs or "max" in c.attrs:
            raise c.unsupported("attributes 'min'/'max' (inputs since opset 11)")
        bounds = [c.input(i) for i in (1, 2)]
        bounds = [None if b is None or b.type.numel == 0 else b for b in bounds]
    for b in bounds:
        if b is not None and b.type.numel != 1:
            raise c.unsupported(f"a bound of shape {list(b.type.shape)} (a scalar is needed)")
    lo, hi = bounds
    if all(b is None or b.is_const for b in bounds) and x.type.dtype.is_float:
        return c.emit("clip", [x], {
            "min": None if lo is None else float(lo.const.reshape(())),
            "max": None if hi is None else float(hi.const.reshape(()))})
    # integer operands or bounds given at run time: min(max(x, lo), hi), exactly ONNX's
    y = x
    if lo is not None:
        y = c.emit("max", [y, _as_scalar(c, lo)])
    if hi is not None:
        y = c.emit("min", [y, _as_scalar(c, hi)])
    return y


def _as_scalar(c: NodeCtx, v: Value) -> Value:
    """A one-element operand as a rank-0 value (so that it broadcasts like a scalar)."""
    if v.type.rank == 0:
        return v
    return c.emit("reshape", [v], {"shape": ()})


@converts("Where")
def _where(c: NodeCtx):
    return c.emit("where", [c.input(0), c.input(1), c.input(2)])


_COMPARE = {"Equal": "equal", "Less": "less", "Greater": "greater"}


@converts(*_COMPARE)
def _compare(c: NodeCtx):
    return c.emit(_COMPARE[c.op_type], [c.input(0), c.input(1)])


@converts("GreaterOrEqual", "LessOrEqual")
def _compare_or_equal(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    strict = c.emit("greater" if c.op_type == "GreaterOrEqual" else "less", [a, b])
    true = c.constant(np.array(True))
    return c.emit("where", [strict, true, c.emit("equal", [a, b])])


@converts("IsNaN")
def _isnan(c: NodeCtx):
    c.require_float(c.input(0))
    return c.emit("isnan", [c.input(0)])


@converts("Not")
def _not(c: NodeCtx):
    return c.emit("not", [c.input(0)])


@converts("And", "Or", "Xor")
def _logical(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    if c.op_type == "And":
        return c.emit("where", [a, b, c.constant(np.array(False))])
    if c.op_type == "Or":
        return c.emit("where", [a, c.constant(np.array(True)), b])
    return c.emit("not", [c.emit("equal", [a, b])])


def _dtype_of(c: NodeCtx, onnx_type: int) -> DType:
    if onnx_type not in ONNX_DTYPES:
        name = onnx.TensorProto.DataType.Name(onnx_type) if onnx_type in \
            onnx.TensorProto.DataType.values() else str(onnx_type)
        raise c.unsupported(f"attribute 'to' = {name}: dtype not supported by bevir")
    return ONNX_DTYPES[onnx_type]


@converts("Cast", attrs=("to", "saturate", "round_mode"))
def _cast(c: NodeCtx):
    x = c.input(0)
    to = _dtype_of(c, c.attr("to"))
    # 'saturate' only concerns float8 targets, which bevir does not have
    if to is x.type.dtype:
        return x
    return c.emit("cast", [x], {"to": to.value})


@converts("CastLike", attrs=("saturate", "round_mode"))
def _cast_like(c: NodeCtx):
    x, like = c.input(0), c.input(1)
    if like.type.dtype is x.type.dtype:
        return x
    return c.emit("cast", [x], {"to": like.type.dtype.value})


@converts("Identity")
def _identity(c: NodeCtx):
    return c.input(0)


@converts("Dropout", attrs=("seed", "ratio"))
def _dropout(c: NodeCtx):
    """Inference, or training with ratio 0: the input, and a mask of all true."""
    x = c.input(0)
    if c.has_input(2) and bool(np.asarray(c.const(2, "training_mode")).reshape(-1)[0]):
        ratio = float(np.asarray(c.const(1, "ratio")).reshape(-1)[0]) if c.has_input(1) else 0.5
        if ratio != 0:
            raise c.unsupported(f"training_mode = true with ratio {ratio} (random: inference, "
                                "or training with ratio 0, only)")
    if not c.output_used(1):
        return x
    mask = c.emit("expand", [c.constant(np.array(True))], {"shape": x.type.shape})
    return [x, mask]
