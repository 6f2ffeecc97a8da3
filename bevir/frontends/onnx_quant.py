"""ONNX import of quantized (QOperator) models: QuantizeLinear, DequantizeLinear,
QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and the com.microsoft contrib ops
QLinearAdd, QLinearMul, QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearSigmoid, QLinearLeakyRelu and QGemm (as a 1x1 qlinear_conv), onto the integer ops of
:mod:`bevir.ops.qlinear`.

Scales and zero points must be constants. They go into the value types: an operand's
scale and zero point are recorded on its type (a constant gets a quantized copy, a graph
input not used yet is retyped); a value that a producer already quantized differently
than the node says is refused with UnsupportedError (no requantization is inserted). A
result's parameters become the op's ``out_*`` attributes, so its type carries them.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Value
from ..ir.types import AffineQuant, DType, TensorType
from ..ops.qlinear import avgpool_is_global
from .onnx import NodeCtx, converts, norm_axis, spatial_params

_MS = "com.microsoft"
_8BIT = (DType.i8, DType.u8)


# ---- reading the parameters ---------------------------------------------------------------
def _axis(c: NodeCtx, x: Value, scale_i: int) -> tuple[int | None, int | None]:
    """(axis, channels) of a per-axis Quantize/DequantizeLinear; (None, None) when the
    scale is one value (the axis is then unused)."""
    a = c.const(scale_i, "scale")
    if a.size == 1 and a.ndim <= 1:
        return None, None
    axis = norm_axis(int(c.attr("axis", 1)), max(x.type.rank, 1), c)
    return axis, x.type.shape[axis]


def _scale(c: NodeCtx, i: int, what: str, channels: int | None = None) -> tuple[float, ...]:
    """A float32 (or float16, which float32 holds exactly) scale input: one value, or
    (``channels`` given) one or ``channels``."""
    a = c.const(i, what)
    if a.dtype not in (np.float32, np.float16):
        raise c.unsupported(f"{what} must be float32 or float16, got {a.dtype}")
    if a.size == 1 and a.ndim <= 1:
        vals = (float(a.reshape(-1)[0]),)
    elif channels is not None and a.ndim == 1 and a.size == channels:
        vals = tuple(float(v) for v in a)
    else:
        want = "a scalar" if channels is None else f"a scalar or {channels} values"
        raise c.unsupported(f"{what} must be {want}, got shape {list(a.shape)}")
    if not all(v > 0 and np.isfinite(v) for v in vals):
        raise c.unsupported(f"{what} must be positive and finite, got {list(vals)}")
    return vals


def _zero_point(c: NodeCtx, i: int, what: str, dtype: DType | None,
                channels: int | None = None) -> tuple[int, ...] | None:
    """An integer zero-point input of ``dtype`` (None: the input is omitted)."""
    a = c.const(i, what, optional=True)
    if a is None:
        return None
    if dtype is not None and a.dtype != dtype.np:
        raise c.unsupported(f"{what} must be {dtype} (as its tensor), got {a.dtype}")
    if a.size == 1 and a.ndim <= 1:
        return (int(a.reshape(-1)[0]),)
    if channels is not None and a.ndim == 1 and a.size == channels:
        return tuple(int(v) for v in a)
    want = "a scalar" if channels is None else f"a scalar or {channels} values"
    raise c.unsupported(f"{what} must be {want}, got shape {list(a.shape)}")


def _affine(scale, zp, axis=None) -> AffineQuant:
    """AffineQuant with scale and zero point broadcast to the same length."""
    zp = zp or (0,)
    n = max(len(scale), len(zp))
    if n == 1:
        return AffineQuant(scale, zp, None)
    scale = scale * n if len(scale) == 1 else scale
    zp = zp * n if len(zp) == 1 else zp
    return AffineQuant(scale, zp, axis)


def _require_8bit(c: NodeCtx, v: Value, what: str) -> None:
    if v.type.dtype not in _8BIT:
        raise c.unsupported(f"{what} must be int8 or uint8, got {v.type.dtype}")


def _quantized(c: NodeCtx, i: int, q: AffineQuant, what: str) -> Value:
    """Input ``i`` with its type carrying ``q`` (see the module docstring)."""
    v = c.input(i)
    if v.type.quant == q:
        return v
    if v.is_const:
        name = c.fresh(f"{c.node.input[i]}_q")
        nv = c.graph.add_const(v.const, name, type=v.type.with_(quant=q))
        c.created.add(id(nv))
        return nv
    if v.type.quant is None and v.producer is None and not v.uses \
            and any(u is v for u in c.graph.inputs):
        v.type = v.type.with_(quant=q)
        return v
    have = "no quantization" if v.type.quant is None else f"{v.type.quant}"
    raise c.unsupported(f"input {i} ({what}, '{c.node.input[i]}') has {have} from its "
                        f"producer, but the node quantizes it as {q} (bevir does not insert "
                        "requantization)")


def _out_attrs(c: NodeCtx, scale_i: int, zp_i: int, dtype: DType | None,
               what: str = "y") -> dict:
    """out_dtype/out_scale/out_zero_point from the output's scale and zero-point inputs;
    the dtype is the zero point's (default ``dtype``)."""
    scale = _scale(c, scale_i, f"{what}_scale")
    zp_arr = c.const(zp_i, f"{what}_zero_point", optional=True)
    if zp_arr is None:
        if dtype is None:
            dtype = DType.u8
        zp = (0,)
    else:
        if zp_arr.dtype not in (np.int8, np.uint8):
            raise c.unsupported(f"{what}_zero_point must be int8 or uint8, got {zp_arr.dtype}")
        if dtype is not None and zp_arr.dtype != dtype.np:
            raise c.unsupported(f"{what}_zero_point must be {dtype}, got {zp_arr.dtype}")
        dtype = DType.from_numpy(zp_arr.dtype)
        zp = _zero_point(c, zp_i, f"{what}_zero_point", dtype)
    return {"out_dtype": str(dtype), "out_scale": scale[0], "out_zero_point": zp[0]}


# ---- QuantizeLinear / DequantizeLinear ------------------------------------------------------
_ONNX_INT = {2: DType.u8, 3: DType.i8, 5: DType.i16}


@converts("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype"))
def _quantize_linear(c: NodeCtx):
    x = c.input(0)
    if x.type.dtype is not DType.f32:
        raise c.unsupported(f"input of dtype {x.type.dtype} (only float32)")
    if c.attr("block_size", 0):
        raise c.unsupported("blocked quantization (attribute 'block_size') is not supported")
    axis, channels = _axis(c, x, 1)
    scale = _scale(c, 1, "y_scale", channels)
    out = c.attr("output_dtype", 0)
    dtype = None
    if out:
        if out not in _ONNX_INT:
            raise c.unsupported(f"attribute 'output_dtype' = {out} (only int8, uint8, int16)")
        dtype = _ONNX_INT[out]
    zp_arr = c.const(2, "y_zero_point", optional=True)
    if zp_arr is not None:
        zdt = DType.from_numpy(zp_arr.dtype) if zp_arr.dtype in (np.int8, np.uint8, np.int16) \
            else None
        if zdt is None or (dtype is not None and zdt is not dtype):
            raise c.unsupported(f"y_zero_point of dtype {zp_arr.dtype} "
                                "(only int8, uint8, int16, matching output_dtype)")
        dtype = zdt
    dtype = dtype or DType.u8
    zp = _zero_point(c, 2, "y_zero_point", dtype, channels) or (0,)
    q = _affine(scale, zp, axis)
    attrs = {"dtype": str(dtype), "scale": q.scale, "zero_point": q.zero_point, "axis": q.axis}
    return c.emit("quantize", [x], attrs)


@converts("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def _dequantize_linear(c: NodeCtx):
    x = c.input(0)
    if x.type.dtype not in (DType.i8, DType.u8, DType.i16, DType.i32):
        raise c.unsupported(f"input of dtype {x.type.dtype} (only int8, uint8, int16, int32)")
    if c.attr("block_size", 0):
        raise c.unsupported("blocked quantization (attribute 'block_size') is not supported")
    if c.attr("output_dtype", 0) not in (0, 1):
        raise c.unsupported("attribute 'output_dtype' other than float32")
    axis, channels = _axis(c, x, 1)
    scale = _scale(c, 1, "x_scale", channels)
    zp = _zero_point(c, 2, "x_zero_point", x.type.dtype, channels) or (0,)
    if x.type.dtype is DType.i32 and any(zp):
        raise c.unsupported("an int32 input takes no (or a zero) zero point")
    return c.emit("dequantize", [_quantized(c, 0, _affine(scale, zp, axis), "x")])


# ---- convolution and matrix products --------------------------------------------------------
def _conv_attrs(c: NodeCtx, x: Value, w: Value) -> dict:
    if x.type.rank != 4 or w.type.rank != 4:
        raise c.unsupported(f"{w.type.rank - 2}-D convolution: only 2-D is supported")
    kernel = w.type.shape[2:]
    ks = c.attr("kernel_shape", None)
    if ks is not None and tuple(ks) != kernel:
        raise c.unsupported(f"attribute 'kernel_shape' {list(ks)} differs from the weight's "
                            f"{list(kernel)}")
    strides, pads, dil = spatial_params(c, x, kernel)
    return {"strides": strides, "pads": pads, "dilations": dil,
            "groups": int(c.attr("group", 1))}


_CONV = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@converts("QLinearConv", attrs=_CONV)
def _qlinear_conv(c: NodeCtx):
    x, w = c.input(0), c.input(3)
    _require_8bit(c, x, "x")
    _require_8bit(c, w, "w")
    m = w.type.shape[0]
    xq = _affine(_scale(c, 1, "x_scale"), _zero_point(c, 2, "x_zero_point", x.type.dtype))
    wq = _affine(_scale(c, 4, "w_scale", m), _zero_point(c, 5, "w_zero_point", w.type.dtype, m),
                 axis=0)
    attrs = {**_conv_attrs(c, x, w), **_out_attrs(c, 6, 7, None)}
    b = c.input(8)
    if b is not None and (b.type.dtype is not DType.i32 or b.type.shape != (m,)):
        raise c.unsupported(f"bias must be int32 [{m}], got {b.type}")
    return c.emit("qlinear_conv", [_quantized(c, 0, xq, "x"), _quantized(c, 3, wq, "w"), b],
                  attrs)


def _b_channels(b: Value) -> int | None:
    return b.type.shape[-1] if b.type.rank >= 2 else None


@converts("QLinearMatMul")
def _qlinear_matmul(c: NodeCtx):
    a, b = c.input(0), c.input(3)
    _require_8bit(c, a, "a")
    _require_8bit(c, b, "b")
    n = _b_channels(b)
    aq = _affine(_scale(c, 1, "a_scale"), _zero_point(c, 2, "a_zero_point", a.type.dtype))
    bq = _affine(_scale(c, 4, "b_scale", n), _zero_point(c, 5, "b_zero_point", b.type.dtype, n),
                 axis=None if n is None else b.type.rank - 1)
    attrs = _out_attrs(c, 6, 7, None)
    return c.emit("qlinear_matmul", [_quantized(c, 0, aq, "a"), _quantized(c, 3, bq, "b")],
                  attrs)


def _integer_zp(c: NodeCtx, i: int, v: Value, what: str, channels=None, axis=None):
    """ConvInteger/MatMulInteger: a zero point recorded on the type with scale 1 (these
    ops have no scale); none when the zero point is omitted or all zero."""
    zp = _zero_point(c, i, what, v.type.dtype, channels)
    if zp is None or not any(zp):
        if v.type.quant is not None and any(v.type.quant.zero_point):
            raise c.unsupported(f"{what}: the input is typed with zero point "
                                f"{list(v.type.quant.zero_point)}, the node says 0")
        return v
    return _quantized(c, 0 if v is c.input(0) else 1, _affine((1.0,), zp, axis), what)


@converts("ConvInteger", attrs=_CONV)
def _conv_integer(c: NodeCtx):
    x, w = c.input(0), c.input(1)
    _require_8bit(c, x, "x")
    _require_8bit(c, w, "w")
    attrs = _conv_attrs(c, x, w)
    xv = _integer_zp(c, 2, x, "x_zero_point")
    wv = _integer_zp(c, 3, w, "w_zero_point", w.type.shape[0], 0)
    return c.emit("conv_integer", [xv, wv], attrs)


@converts("MatMulInteger")
def _matmul_integer(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    _require_8bit(c, a, "A")
    _require_8bit(c, b, "B")
    n = _b_channels(b)
    av = _integer_zp(c, 2, a, "a_zero_point")
    bv = _integer_zp(c, 3, b, "b_zero_point", n, None if n is None else b.type.rank - 1)
    return c.emit("matmul_integer", [av, bv])


# ---- com.microsoft contrib ops --------------------------------------------------------------
def _input_quant(c: NodeCtx, i: int, what: str) -> Value:
    """Input ``i`` followed by its scale (i+1) and optional zero point (i+2), per tensor."""
    v = c.input(i)
    _require_8bit(c, v, what)
    q = _affine(_scale(c, i + 1, f"{what}_scale"),
                _zero_point(c, i + 2, f"{what}_zero_point", v.type.dtype))
    return _quantized(c, i, q, what)


@converts("QLinearAdd", "QLinearMul", domain=_MS)
def _qlinear_binary(c: NodeCtx):
    a, b = _input_quant(c, 0, "A"), _input_quant(c, 3, "B")
    if a.type.dtype is not b.type.dtype:
        raise c.unsupported(f"operand dtypes differ: {a.type.dtype} and {b.type.dtype}")
    op = "qlinear_add" if c.op_type == "QLinearAdd" else "qlinear_mul"
    return c.emit(op, [a, b], _out_attrs(c, 6, 7, a.type.dtype, "C"))


@converts("QLinearGlobalAveragePool", attrs=("channels_last",), domain=_MS)
def _qlinear_global_avgpool(c: NodeCtx):
    x = _input_quant(c, 0, "x")
    out = _out_attrs(c, 3, 4, x.type.dtype)
    if x.type.rank < 3:
        raise c.unsupported(f"input of rank {x.type.rank}")
    return c.emit("qlinear_global_avgpool", [x],
                  {"out_scale": out["out_scale"], "out_zero_point": out["out_zero_point"],
                   "channels_last": bool(c.attr("channels_last", 0))})


@converts("QLinearSigmoid", "QLinearLeakyRelu", attrs=("alpha",), domain=_MS)
def _qlinear_lookup(c: NodeCtx):
    x = _input_quant(c, 0, "X")
    out = _out_attrs(c, 3, 4, x.type.dtype, "Y")
    attrs = {"out_scale": out["out_scale"], "out_zero_point": out["out_zero_point"]}
    if c.op_type == "QLinearLeakyRelu":
        attrs["alpha"] = float(c.attr("alpha", 0.01))
        return c.emit("qlinear_leaky_relu", [x], attrs)
    if "alpha" in c.attrs:
        raise c.unsupported("attribute 'alpha' is not supported")
    return c.emit("qlinear_sigmoid", [x], attrs)


@converts("QLinearConcat", attrs=("axis",), domain=_MS)
def _qlinear_concat(c: NodeCtx):
    if len(c.inputs) < 5 or (len(c.inputs) - 2) % 3:
        raise c.unsupported("takes Y_scale, Y_zero_point and (X, X_scale, X_zero_point) "
                            "triples")
    xs = [_input_quant(c, i, f"X{(i - 2) // 3}") for i in range(2, len(c.inputs), 3)]
    dtype = xs[0].type.dtype
    if any(v.type.dtype is not dtype for v in xs):
        raise c.unsupported("inputs of different dtypes")
    axis = norm_axis(int(c.attr("axis")), xs[0].type.rank, c)
    return c.emit("qlinear_concat", xs, {"axis": axis, **_out_attrs(c, 0, 1, dtype, "Y")})


@converts("QLinearAveragePool", attrs=("auto_pad", "ceil_mode", "channels_last",
                                       "count_include_pad", "kernel_shape", "pads", "strides"),
          domain=_MS)
def _qlinear_avgpool(c: NodeCtx):
    x = _input_quant(c, 0, "x")
    out = _out_attrs(c, 3, 4, x.type.dtype, "y")
    out = {"out_scale": out["out_scale"], "out_zero_point": out["out_zero_point"]}
    if x.type.rank != 4 or c.attr("channels_last", 0):
        raise c.unsupported("only 2-D pooling of an NCHW input (channels_last 0) is supported")
    kernel = tuple(int(k) for k in c.attr("kernel_shape"))
    strides, pads, _ = spatial_params(c, x, kernel)
    if avgpool_is_global(x.type, kernel, pads):        # onnxruntime's global fallback
        return c.emit("qlinear_global_avgpool", [x], out)
    return c.emit("qlinear_avgpool", [x], {
        "kernel": kernel, "strides": strides, "pads": pads,
        "ceil_mode": bool(c.attr("ceil_mode", 0)),
        "count_include_pad": bool(c.attr("count_include_pad", 0)), **out})


@converts("QGemm", attrs=("alpha", "transA", "transB"), domain=_MS)
def _qgemm(c: NodeCtx):
    """QGemm with a quantized result, as qdq-gemm folds Gemm: a 1x1 qlinear_conv of A as
    [M, K, 1, 1] with the constant B as [N, K, 1, 1] (the same int32 accumulator, bias and
    float32 multiplier a_scale * b_scale / y_scale)."""
    a, b = c.input(0), c.input(3)
    _require_8bit(c, a, "A")
    _require_8bit(c, b, "B")
    if float(c.attr("alpha", 1.0)) != 1.0 or c.attr("transA", 0):
        raise c.unsupported("alpha != 1 and transA are not supported")
    if not c.has_input(7):
        raise c.unsupported("a float result (no y_scale) is not supported")
    if a.type.rank != 2 or b.type.rank != 2:
        raise c.unsupported(f"A and B must be matrices, got ranks {a.type.rank}, {b.type.rank}")
    w = c.const(3, "B", why="bevir computes QGemm as a convolution with a constant weight")
    w = w if c.attr("transB", 0) else w.T
    n = w.shape[0]
    aq = _affine(_scale(c, 1, "a_scale"), _zero_point(c, 2, "a_zero_point", a.type.dtype))
    wq = _affine(_scale(c, 4, "b_scale", n), _zero_point(c, 5, "b_zero_point", b.type.dtype, n),
                 axis=0)
    w4 = c.graph.add_const(np.ascontiguousarray(w).reshape(w.shape + (1, 1)), c.fresh("B_nk11"),
                           type=TensorType(w.shape + (1, 1), b.type.dtype, quant=wq))
    c.created.add(id(w4))
    bias = c.input(6)
    if bias is not None:
        if bias.type.dtype is not DType.i32 or bias.type.shape not in ((n,), (1, n)):
            raise c.unsupported(f"C must be int32 [{n}] or [1, {n}], got {bias.type}")
        if bias.type.rank == 2:
            bias = c.emit("reshape", [bias], {"shape": (n,)})
    a4 = c.emit("reshape", [_quantized(c, 0, aq, "A")], {"shape": a.type.shape + (1, 1)})
    y = c.emit("qlinear_conv", [a4, w4, bias], _out_attrs(c, 7, 8, None))
    return c.emit("reshape", [y], {"shape": y.type.shape[:2]})
