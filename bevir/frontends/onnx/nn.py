"""ONNX converters: products, convolution, pooling, normalization, softmax, reductions."""
from __future__ import annotations

import math

from ...ir.graph import Value
from ...ir.types import DType
from ..decompose import group_norm
from .registry import (NodeCtx, absolute, converts, norm_axes, norm_axis, spatial_pads,
                       spatial_params)

# ---- linear algebra and convolution ---------------------------------------------------------

@converts("MatMul")
def _matmul(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    c.require_float(a, b)
    return c.emit("matmul", [a, b])


@converts("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(c: NodeCtx):
    a, b, bias = c.input(0), c.input(1), c.input(2)
    c.require_float(a, b, bias)
    return c.emit("gemm", [a, b, bias], {"alpha": float(c.attr("alpha", 1.0)),
                                         "beta": float(c.attr("beta", 1.0)),
                                         "trans_a": bool(c.attr("transA", 0)),
                                         "trans_b": bool(c.attr("transB", 0))})


@converts("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(c: NodeCtx):
    x, w, b = c.input(0), c.input(1), c.input(2)
    c.require_float(x, w, b)
    if not (x.type.rank == w.type.rank and x.type.rank in (3, 4)):
        raise c.unsupported(f"{w.type.rank - 2}-D convolution (attribute 'kernel_shape'): "
                            "only 1-D and 2-D are supported")
    kernel = w.type.shape[2:]
    ks = c.attr("kernel_shape", None)
    if ks is not None and tuple(ks) != kernel:
        raise c.unsupported(f"attribute 'kernel_shape' {list(ks)} differs from the weight's "
                            f"{list(kernel)}")
    if x.type.rank == 3:                 # 1-D: a 2-D convolution over rows of height 1
        strides, pads, dil = _lifted_params(c, x, kernel)
        w = c.emit("reshape", [w], {"shape": w.type.shape[:2] + (1,) + kernel})
        return _over_rows(c, x, lambda x4: c.emit("conv2d", [x4, w, b], {
            "strides": strides, "pads": pads, "dilations": dil, "groups": int(c.attr("group", 1))}))
    strides, pads, dil = spatial_params(c, x, kernel)
    return c.emit("conv2d", [x, w, b], {"strides": strides, "pads": pads, "dilations": dil,
                                        "groups": int(c.attr("group", 1))})


def _lifted_params(c: NodeCtx, x: Value, kernel) -> tuple:
    """A 1-D op's strides, pads and dilations as those of the 2-D op over rows of height 1."""
    (s,) = tuple(int(v) for v in c.attr("strides", (1,)))
    (d,) = tuple(int(v) for v in c.attr("dilations", (1,)))
    begin, end = spatial_pads(c, x.type.shape[2:], kernel, (s,), (d,))
    return (1, s), (0, begin, 0, end), (1, d)


def _over_rows(c: NodeCtx, x: Value, op2d) -> Value:
    """``op2d`` (a 2-D NCHW op) applied to [N, C, L] as [N, C, 1, L], the result back to 3-D."""
    n, ch, length = x.type.shape
    y = op2d(c.emit("reshape", [x], {"shape": (n, ch, 1, length)}))
    return c.emit("reshape", [y], {"shape": y.type.shape[:2] + y.type.shape[3:]})


# ---- pooling and normalization --------------------------------------------------------------

@converts("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                            "storage_order", "strides"))
def _maxpool(c: NodeCtx):
    x = c.input(0)

    def attrs(strides, pads, dil):
        return {"strides": strides, "pads": pads, "dilations": dil,
                "ceil_mode": bool(c.attr("ceil_mode", 0))}
    y = _pool(c, x, "maxpool2d", attrs)
    if not c.output_used(1):
        return y                          # storage_order only orders the indices
    if x.type.rank != 4:
        raise c.unsupported("output 1 (Indices) of a 1-D pooling is not supported")
    return [y, _pool(c, x, "maxpool2d_indices", lambda *p: {
        **attrs(*p), "storage_order": int(c.attr("storage_order", 0))})]


def _pool(c: NodeCtx, x: Value, op: str, attrs) -> Value:
    """A 1-D or 2-D pooling node as ``op`` (2-D; 1-D over rows of height 1) with
    ``attrs(strides, pads, dilations)``."""
    if x.type.rank not in (3, 4):
        raise c.unsupported(f"{x.type.rank - 2}-D pooling (input rank {x.type.rank}): "
                            "only 1-D and 2-D (NCHW) are supported")
    kernel = tuple(int(k) for k in c.attr("kernel_shape"))
    if len(kernel) != x.type.rank - 2:
        raise c.unsupported(f"attribute 'kernel_shape' {list(kernel)} does not fit input rank "
                            f"{x.type.rank}")
    if x.type.rank == 3:
        strides, pads, dil = _lifted_params(c, x, kernel)
        return _over_rows(c, x, lambda x4: c.emit(op, [x4], {"kernel": (1,) + kernel,
                                                              **attrs(strides, pads, dil)}))
    strides, pads, dil = spatial_params(c, x, kernel)
    return c.emit(op, [x], {"kernel": kernel, **attrs(strides, pads, dil)})


@converts("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                "kernel_shape", "pads", "strides"))
def _avgpool(c: NodeCtx):
    def attrs(strides, pads, dil):
        return {"strides": strides, "pads": pads, "dilations": dil,
                "ceil_mode": bool(c.attr("ceil_mode", 0)),
                "count_include_pad": bool(c.attr("count_include_pad", 0))}
    return _pool(c, c.input(0), "avgpool2d", attrs)


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: NodeCtx):
    x = c.input(0)
    if x.type.rank < 3:
        raise c.unsupported(f"input of rank {x.type.rank}")
    if c.op_type == "GlobalAveragePool":
        c.require_float(x)
    if c.op_type == "GlobalAveragePool":      # any rank: onnxruntime's summation order
        return c.emit("global_avgpool", [x])
    return c.emit("reduce_max", [x], {"axes": tuple(range(2, x.type.rank)), "keepdims": True})


@converts("BatchNormalization", attrs=("epsilon", "momentum", "training_mode"))
def _batch_norm(c: NodeCtx):
    if c.attr("training_mode", 0):
        raise c.unsupported("attribute 'training_mode' = 1 is not supported (inference only)")
    if any(c.output_used(i) for i in range(1, c.num_outputs)):
        raise c.unsupported("outputs running_mean/running_var are not supported "
                            "(inference only)")
    x, scale, bias, mean, var = (c.input(i) for i in range(5))
    c.require_float(x, scale, bias, mean, var)
    return c.emit("batch_norm", [x, scale, bias, mean, var],
                  {"epsilon": float(c.attr("epsilon", 1e-5))})


@converts("InstanceNormalization", attrs=("epsilon",))
def _instance_norm(c: NodeCtx):
    x, scale, bias = c.input(0), c.input(1), c.input(2)
    c.require_float(x, scale, bias)
    if x.type.rank < 3:
        raise c.unsupported(f"input of rank {x.type.rank}")
    return group_norm(c.emit, x, x.type.shape[1], float(c.attr("epsilon", 1e-5)), scale, bias)


@converts("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layer_norm(c: NodeCtx):
    if c.attr("stash_type", 1) != 1:
        raise c.unsupported(f"attribute 'stash_type' = {c.attr('stash_type')}")
    x, scale, bias = c.input(0), c.input(1), c.input(2)
    c.require_float(x, scale, bias)
    attrs = {"axis": norm_axis(int(c.attr("axis", -1)), x.type.rank, c),
             "epsilon": float(c.attr("epsilon", 1e-5))}
    y = c.emit("layer_norm", [x, scale, bias], attrs)
    if not any(c.output_used(i) for i in (1, 2)):
        return y
    # Mean / InvStdDev (float32): a separate op, so that layer_norm keeps one result
    return [y, *c.emit("layer_norm_stats", [x], attrs)]


def _coerced_2d(c: NodeCtx, x: Value, fn) -> Value:
    """Softmax-family semantics before opset 13: flatten to 2-D at ``axis``, apply ``fn``
    on the last axis, reshape back."""
    rank = x.type.rank
    default = 1 if c.opset < 13 else -1
    axis = norm_axis(int(c.attr("axis", default)), rank, c)
    if c.opset >= 13 or axis == rank - 1:
        return fn(x, axis)
    shape = x.type.shape
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    y = fn(c.emit("reshape", [x], {"shape": flat}), 1)
    return c.emit("reshape", [y], {"shape": shape})


@converts("Softmax", attrs=("axis",))
def _softmax(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return _coerced_2d(c, x, lambda v, axis: c.emit("softmax", [v], {"axis": axis}))


@converts("LogSoftmax", attrs=("axis",))
def _log_softmax(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)

    def lsm(v, axis):   # x - max - log(sum(exp(x - max))), stable
        m = c.emit("reduce_max", [v], {"axes": (axis,), "keepdims": True})
        d = c.emit("sub", [v, m])
        s = c.emit("reduce_sum", [c.emit("exp", [d])], {"axes": (axis,), "keepdims": True})
        return c.emit("sub", [d, c.emit("log", [s])])
    return _coerced_2d(c, x, lsm)


# ---- reductions ----------------------------------------------------------------------------

_REDUCE = {  # op type -> (bevir reduction, pre, post, opset where axes became an input)
    "ReduceMean": ("reduce_mean", None, None, 18),
    "ReduceSum": ("reduce_sum", None, None, 13),
    "ReduceMax": ("reduce_max", None, None, 18),
    "ReduceMin": ("reduce_min", None, None, 18),
    "ReduceSumSquare": ("reduce_sum", "square", None, 18),
    "ReduceL1": ("reduce_sum", "abs", None, 18),
    "ReduceL2": ("reduce_sum", "square", "sqrt", 18),
    "ReduceLogSum": ("reduce_sum", None, "log", 18),
    "ReduceLogSumExp": ("reduce_sum", "exp", "log", 18),
}


@converts(*_REDUCE, attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(c: NodeCtx):
    op, pre, post, since = _REDUCE[c.op_type]
    x = c.input(0)
    if pre in ("exp",) or post is not None or op == "reduce_mean":
        c.require_float(x)
    if c.opset >= since:
        if "axes" in c.attrs:
            raise c.unsupported(f"attribute 'axes' (an input since opset {since})")
        axes = c.ints(1, "axes", optional=True)
    else:
        axes = c.attrs.get("axes")
    keepdims = bool(c.attr("keepdims", 1))
    if pre == "square":
        x = c.emit("mul", [x, x])
    elif pre == "abs":
        x = absolute(c, x)
    elif pre == "exp":
        x = c.emit("exp", [x])
    boolean = x.type.dtype is DType.bool
    if boolean:
        if op not in ("reduce_max", "reduce_min"):
            raise c.unsupported("bool operand")
        x = c.emit("cast", [x], {"to": "u8"})   # max = any, min = all
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            y = x
        else:
            y = c.emit(op, [x], {"axes": None, "keepdims": keepdims})
    else:
        y = c.emit(op, [x], {"axes": norm_axes(axes, x.type.rank, c), "keepdims": keepdims})
    if boolean:
        y = c.emit("cast", [y], {"to": "bool"})
    if post is not None:
        y = c.emit(post, [y])
    return y


@converts("CumSum", attrs=("exclusive", "reverse"))
def _cumsum(c: NodeCtx):
    x = c.input(0)
    (axis,) = c.ints(1, "axis")
    return c.emit("cumsum", [x], {"axis": norm_axis(axis, x.type.rank, c),
                                  "exclusive": bool(c.attr("exclusive", 0)),
                                  "reverse": bool(c.attr("reverse", 0))})
