"""ATen converters: arithmetic, comparisons, reductions, activations, products and
attention."""
from __future__ import annotations

import math

import numpy as np

from ...errors import UnsupportedError
from ...ir.graph import Value
from ...ir.types import DType
from .importer import AtenCtx, aten_converter, ir_dtype, norm_dim, promote, rank_of

def _binary(op: str, swap: bool = False):
    def convert(c: AtenCtx):
        a, b = promote(c, c.arg(0), c.arg(1))
        alpha = c.kwargs.get("alpha", 1)
        if alpha != 1:
            b = c.emit("mul", [b, c.const(alpha, b)])
        return c.emit(op, [b, a] if swap else [a, b])
    return convert


for _name, _op in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("maximum", "max"),
                   ("minimum", "min"), ("atan2", "atan2"), ("pow", "pow")]:
    aten_converter(f"aten.{_name}")(_binary(_op))
aten_converter("aten.rsub")(_binary("sub", swap=True))
for _name, _op in [("gt", "greater"), ("lt", "less"), ("eq", "equal")]:
    aten_converter(f"aten.{_name}")(_binary(_op))


@aten_converter("aten.div")
def _div(c: AtenCtx):
    a, b = promote(c, c.arg(0), c.arg(1))
    if a.type.dtype.is_int or c.kwargs.get("rounding_mode"):
        raise c.unsupported("integer or rounding division")
    return c.emit("div", [a, b])


@aten_converter("aten.ge", "aten.le")
def _ge_le(c: AtenCtx):
    a, b = promote(c, c.arg(0), c.arg(1))
    return c.emit("not", [c.emit("less" if c.target.startswith("aten.ge") else "greater", [a, b])])


for _name in ["neg", "sigmoid", "relu", "log", "exp", "sqrt", "cos", "sin", "tanh", "abs",
              "erf", "reciprocal", "isnan"]:
    aten_converter(f"aten.{_name}")(lambda c, _op=_name: c.emit(_op, [c.arg(0)]))


@aten_converter("aten.rsqrt")
def _rsqrt(c: AtenCtx):
    return c.emit("reciprocal", [c.emit("sqrt", [c.arg(0)])])


@aten_converter("aten.gelu")
def _gelu(c: AtenCtx):
    return c.emit("gelu", [c.arg(0)], approximate=c.kwargs.get("approximate", "none"))


@aten_converter("aten.__and__", "aten.logical_and", "aten.bitwise_and")
def _and(c: AtenCtx):
    return c.emit("where", [c.arg(0), c.arg(1), c.const(np.array(False))])


@aten_converter("aten.__or__", "aten.logical_or", "aten.bitwise_or")
def _or(c: AtenCtx):
    return c.emit("where", [c.arg(0), c.const(np.array(True)), c.arg(1)])


@aten_converter("aten.logical_not", "aten.bitwise_not")
def _not(c: AtenCtx):
    return c.emit("not", [c.arg(0)])


@aten_converter("aten.clamp", "aten.clamp_min", "aten.clamp_max")
def _clamp(c: AtenCtx):
    lo = c.arg(1, "min")
    hi = c.arg(2, "max")
    if c.target.startswith("aten.clamp_max"):
        lo, hi = None, c.arg(1)
    if isinstance(lo, Value) or isinstance(hi, Value):
        raise c.unsupported("tensor clamp bounds")
    return c.emit("clip", [c.arg(0)], min=None if lo is None else float(lo),
                  max=None if hi is None else float(hi))


@aten_converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
                "aten.where.Scalar")
def _where(c: AtenCtx):
    x, y = promote(c, c.arg(1), c.arg(2))
    return c.emit("where", [c.arg(0), x, y])


def _reduce(op: str):
    def convert(c: AtenCtx):
        x = c.arg(0)
        dims = c.arg(1, "dim")
        dims = None if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        keep = bool(c.arg(2, "keepdim", False))
        if c.kwargs.get("dtype") is not None:
            x = c.emit("cast", [x], to=ir_dtype(c.kwargs["dtype"], c.loc).value)
        axes = None if not dims else tuple(norm_dim(d, rank_of(x)) for d in dims)
        return c.emit(op, [x], axes=axes, keepdims=keep)
    return convert


aten_converter("aten.sum")(_reduce("reduce_sum"))
aten_converter("aten.mean")(_reduce("reduce_mean"))
aten_converter("aten.amax")(_reduce("reduce_max"))
aten_converter("aten.amin")(_reduce("reduce_min"))


def _dims(c: AtenCtx, x: Value, i: int) -> tuple[int, ...] | None:
    """Argument ``i`` (``dim``: an int, a list, or None for all) as normalized axes."""
    dims = c.arg(i, "dim")
    if dims is None or (not isinstance(dims, int) and not dims):
        return None
    return tuple(norm_dim(d, rank_of(x)) for d in ([dims] if isinstance(dims, int) else dims))


@aten_converter("aten.linalg_vector_norm")
def _vector_norm(c: AtenCtx):
    x, order = c.arg(0), c.arg(1, "ord", 2)
    axes, keep = _dims(c, x, 2), bool(c.arg(3, "keepdim", False))
    if c.kwargs.get("dtype") is not None:
        x = c.emit("cast", [x], to=ir_dtype(c.kwargs["dtype"], c.loc).value)
    if order == 2:
        return c.emit("sqrt", [c.emit("reduce_sum", [c.emit("mul", [x, x])], axes=axes,
                                      keepdims=keep)])
    if order == 1:
        return c.emit("reduce_sum", [c.emit("abs", [x])], axes=axes, keepdims=keep)
    if order == float("inf"):
        return c.emit("reduce_max", [c.emit("abs", [x])], axes=axes, keepdims=keep)
    raise c.unsupported(f"vector norm of order {order}")


@aten_converter("aten.cumsum")
def _cumsum(c: AtenCtx):
    x = c.arg(0)
    if c.kwargs.get("dtype") is not None:
        x = c.emit("cast", [x], to=ir_dtype(c.kwargs["dtype"], c.loc).value)
    elif x.type.dtype in (DType.bool, DType.u8, DType.i8, DType.i16, DType.i32):
        x = c.emit("cast", [x], to="i64")        # torch sums integers and bools in int64
    return c.emit("cumsum", [x], axis=norm_dim(c.arg(1, "dim"), rank_of(x)))


@aten_converter("aten.any")
def _any(c: AtenCtx):
    x = c.emit("cast", [c.arg(0)], to="u8")
    dims = c.arg(1, "dim")
    axes = None if dims is None else tuple(norm_dim(d, rank_of(x)) for d in
                                           ([dims] if isinstance(dims, int) else dims))
    r = c.emit("reduce_max", [x], axes=axes, keepdims=bool(c.arg(2, "keepdim", False)))
    return c.emit("cast", [r], to="bool")


@aten_converter("aten.softmax", "aten._softmax")
def _softmax(c: AtenCtx):
    return c.emit("softmax", [c.arg(0)], axis=int(c.arg(1)))


@aten_converter("aten.layer_norm")
def _layer_norm(c: AtenCtx):
    x, shape = c.arg(0), c.arg(1)
    return c.emit("layer_norm", [x, c.arg(2), c.arg(3)], axis=-len(shape),
                  epsilon=float(c.arg(4, "eps", 1e-5)))


@aten_converter("aten.linear")
def _linear(c: AtenCtx):
    x, w, b = c.arg(0), c.arg(1), c.arg(2)
    lead = x.type.shape[:-1]
    x2 = x if rank_of(x) == 2 else c.emit("reshape", [x], shape=(math.prod(lead), x.type.shape[-1]))
    y = c.emit("gemm", [x2, w, b], trans_b=True)
    return y if rank_of(x) == 2 else c.emit("reshape", [y], shape=(*lead, w.type.shape[0]))


@aten_converter("aten.matmul", "aten.bmm", "aten.mm")
def _matmul(c: AtenCtx):
    return c.emit("matmul", [c.arg(0), c.arg(1)])


@aten_converter("aten.grid_sampler", "aten.grid_sampler_2d")
def _grid_sample(c: AtenCtx):
    modes = {0: "bilinear", 1: "nearest"}
    pads = {0: "zeros", 1: "border", 2: "reflection"}
    if c.arg(2) not in modes:
        raise c.unsupported("bicubic grid_sample")
    return c.emit("grid_sample", [c.arg(0), c.arg(1)], mode=modes[c.arg(2)],
                  padding_mode=pads[c.arg(3)], align_corners=bool(c.arg(4)))


# ---- activations and elementwise ----------------------------------------------------------------

for _name in ["hardswish", "silu"]:
    aten_converter(f"aten.{_name}")(lambda c, _op=_name: c.emit(_op, [c.arg(0)]))


@aten_converter("aten.hardsigmoid")
def _hardsigmoid(c: AtenCtx):
    return c.emit("hardsigmoid", [c.arg(0)], alpha=1 / 6, beta=0.5)


@aten_converter("aten.hardtanh", "aten.relu6")
def _hardtanh(c: AtenCtx):
    lo, hi = (0.0, 6.0) if c.target.startswith("aten.relu6") else (c.arg(1, "min_val", -1.0),
                                                                    c.arg(2, "max_val", 1.0))
    return c.emit("clip", [c.arg(0)], min=float(lo), max=float(hi))


@aten_converter("aten.leaky_relu")
def _leaky_relu(c: AtenCtx):
    x = c.arg(0)
    neg = c.emit("less", [x, c.const(0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, c.const(c.arg(1, "negative_slope", 0.01), x)]),
                            x])


@aten_converter("aten.elu")
def _elu(c: AtenCtx):
    x = c.arg(0)
    if c.arg(2, "scale", 1) != 1 or c.arg(3, "input_scale", 1) != 1:
        raise c.unsupported("elu with scale or input_scale")
    em1 = c.emit("sub", [c.emit("exp", [x]), c.const(1, x)])
    neg = c.emit("less", [x, c.const(0, x)])
    return c.emit("where", [neg, c.emit("mul", [em1, c.const(c.arg(1, "alpha", 1.0), x)]), x])


@aten_converter("aten.softplus")
def _softplus(c: AtenCtx):
    x = c.arg(0)
    beta, threshold = float(c.arg(1, "beta", 1.0)), float(c.arg(2, "threshold", 20.0))
    bx = x if beta == 1 else c.emit("mul", [x, c.const(beta, x)])
    y = c.emit("log", [c.emit("add", [c.emit("exp", [bx]), c.const(1, x)])])
    y = y if beta == 1 else c.emit("div", [y, c.const(beta, x)])
    return c.emit("where", [c.emit("greater", [bx, c.const(threshold, x)]), x, y])


@aten_converter("aten.log_softmax", "aten._log_softmax")
def _log_softmax(c: AtenCtx):
    return c.emit("log", [c.emit("softmax", [c.arg(0)], axis=int(c.arg(1)))])


@aten_converter("aten.ne")
def _ne(c: AtenCtx):
    return c.emit("not", [c.emit("equal", list(promote(c, c.arg(0), c.arg(1))))])


@aten_converter("aten.masked_fill")
def _masked_fill(c: AtenCtx):
    x = c.arg(0)
    return c.emit("where", [c.arg(1), c.value(c.arg(2), x), x])


@aten_converter("aten.var", "aten.std")
def _var(c: AtenCtx):
    x = c.arg(0)
    dims = c.arg(1, "dim")
    axes = tuple(range(rank_of(x))) if dims is None else tuple(
        norm_dim(d, rank_of(x)) for d in ([dims] if isinstance(dims, int) else dims))
    if c.target.endswith(".dim"):              # var.dim(x, dim, unbiased, keepdim)
        correction, keep = int(c.arg(2, "unbiased", True)), bool(c.arg(3, "keepdim", False))
    else:                                      # var.correction(x, dim, *, correction, keepdim)
        correction = c.kwargs.get("correction")
        correction, keep = (1 if correction is None else correction,
                            bool(c.kwargs.get("keepdim", False)))
    d = c.emit("sub", [x, c.emit("reduce_mean", [x], axes=axes, keepdims=True)])
    n = math.prod(x.type.shape[a] for a in axes)
    v = c.emit("reduce_sum", [c.emit("mul", [d, d])], axes=axes, keepdims=keep)
    v = c.emit("div", [v, c.const(max(n - correction, 0), x)])
    return c.emit("sqrt", [v]) if c.target.startswith("aten.std") else v


# ---- products and attention -----------------------------------------------------------------

@aten_converter("aten.addmm")
def _addmm(c: AtenCtx):
    bias, a, b = c.arg(0), c.arg(1), c.arg(2)
    return c.emit("gemm", [a, b, bias], alpha=float(c.kwargs.get("alpha", 1)),
                  beta=float(c.kwargs.get("beta", 1)))


@aten_converter("aten.einsum")
def _einsum_aten(c: AtenCtx):
    from ..einsum import einsum
    operands = list(c.arg(1))
    try:
        return einsum(c.emitter(), c.arg(0), operands)
    except UnsupportedError as e:
        raise c.unsupported(e.message) from None


@aten_converter("aten.scaled_dot_product_attention")
def _sdpa(c: AtenCtx):
    q, k, v = c.arg(0), c.arg(1), c.arg(2)
    mask, causal = c.arg(3, "attn_mask"), bool(c.arg(5, "is_causal", False))
    if c.arg(4, "dropout_p", 0.0):
        raise c.unsupported("scaled_dot_product_attention with dropout")
    if c.kwargs.get("enable_gqa"):
        raise c.unsupported("scaled_dot_product_attention with grouped-query attention")
    scale = c.kwargs.get("scale")
    scale = 1 / math.sqrt(q.type.shape[-1]) if scale is None else scale
    perm = tuple(range(rank_of(k) - 2)) + (rank_of(k) - 1, rank_of(k) - 2)
    s = c.emit("matmul", [c.emit("mul", [q, c.const(scale, q)]),
                          c.emit("transpose", [k], perm=perm)])
    lq, lk = q.type.shape[-2], k.type.shape[-2]
    if causal:
        mask = c.const(np.tril(np.ones((lq, lk), bool)))
    if mask is not None:
        if mask.type.dtype is DType.bool:
            mask = c.emit("where", [mask, c.const(0.0, s), c.const(-np.inf, s)])
        s = c.emit("add", [s, mask])
    return c.emit("matmul", [c.emit("softmax", [s], axis=-1), v])
