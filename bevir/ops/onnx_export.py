"""Helpers for the ops' ONNX exports (``OpDef.onnx_export``; the writer is
:mod:`bevir.codegen.onnx`). An export is ``export(e, node, inputs, outputs)``: it adds
the ONNX nodes that compute ``outputs`` (names) from ``inputs`` (names; None for absent
optional operands) with the writer ``e``. The helpers return static methods, so an op
class can take them as its ``onnx_export`` as they are."""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from ..ir.opdef import get_op
from ..ir.types import AffineQuant

Export = Callable[..., None]   # or a staticmethod wrapping one


def _attr(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, tuple):
        return list(v)
    return v


def onnx_as(op_type: str, attrs: dict[str, str] | None = None, **fixed) -> Export:
    """The op is ONNX ``op_type`` on the same operands; ``attrs`` maps bevir attribute
    names to ONNX ones; ``fixed`` adds constant attributes."""
    def export(e, node, ins: list, outs: list) -> None:
        mapped = {onnx_name: _attr(node.attrs[name]) for name, onnx_name in (attrs or {}).items()
                  if node.attrs.get(name) is not None}
        e.emit(op_type, ins, outs, **mapped, **fixed)
    return staticmethod(export)


def with_inputs(op_type: str, *attr_inputs: str, attrs: dict[str, str] | None = None,
                **fixed) -> Export:
    """ONNX ``op_type`` whose ``attr_inputs`` (bevir attributes, in order) are int64
    tensor inputs in ONNX (Reshape's shape, Slice's starts..., Unsqueeze's axes)."""
    def export(e, node, ins: list, outs: list) -> None:
        extra = [None if node.attrs.get(a) is None else e.ints(node.attrs[a], a)
                 for a in attr_inputs]
        mapped = {o: _attr(node.attrs[a]) for a, o in (attrs or {}).items()
                  if node.attrs.get(a) is not None}
        e.emit(op_type, ins + extra, outs, **mapped, **fixed)
    return staticmethod(export)


def then_activation(inner: Export, fixed: str | None = None) -> Export:
    """``inner`` followed by the node's fused ``activation`` (relu, clip, gelu; ``fixed``:
    always this one)."""
    def export(e, node, ins: list, outs: list) -> None:
        act = fixed or node.attrs.get("activation", "none")
        if act == "none":
            return inner(e, node, ins, outs)
        mid = [e.fresh(f"{outs[0]}_pre")]
        inner(e, node, ins, mid)
        activation(e, act, node.attrs, mid[0], outs[0])
    return staticmethod(export)


def activation(e, act: str, attrs: dict, x: str, out: str) -> None:
    if act == "clip":
        lo, hi = attrs.get("clip_min"), attrs.get("clip_max")
        e.emit("Clip", [x, None if lo is None else e.const(np.float32(lo), "lo"),
                        None if hi is None else e.const(np.float32(hi), "hi")], [out])
    elif act == "gelu":
        e.emit("Gelu", [x], [out], approximate=attrs.get("approximate", "none"))
    elif act in ("hardswish", "hardsigmoid", "silu"):      # the op's own export
        spec = get_op(act)
        own = {a: attrs.get(fused) for a, fused in spec.activation.attrs}
        spec.onnx_export(e, SimpleNamespace(op=act, attrs=own), [x], [out])
    else:
        e.emit({"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}[act], [x], [out])


def linear(e, node, ins: list, outs: list) -> None:
    """x @ w.T (+ b) with w [N, K] (the torch layout)."""
    wt = e.emit("Transpose", [ins[1]], 1, perm=[1, 0])[0]
    if len(ins) > 2 and ins[2] is not None:
        y = e.emit("MatMul", [ins[0], wt], 1)[0]
        e.emit("Add", [y, ins[2]], outs)
    else:
        e.emit("MatMul", [ins[0], wt], outs)


def matmul_bias(e, node, ins: list, outs: list) -> None:
    """a @ b (+ bias); b transposed first where the node has ``trans_b``."""
    a, b = ins[:2]
    if node.attrs.get("trans_b"):
        rank = node.inputs[1].type.rank
        b = e.emit("Transpose", [b], 1, perm=list(range(rank - 2)) + [rank - 1, rank - 2])[0]
    if len(ins) > 2 and ins[2] is not None:
        y = e.emit("MatMul", [a, b], 1)[0]
        e.emit("Add", [y, ins[2]], outs)
    else:
        e.emit("MatMul", [a, b], outs)


def qdq(float_op: str | Export, product_bias: bool = False) -> Export:
    """A quantized op as QDQ: operands dequantized, ``float_op`` computes (an op name, whose
    export runs with this node's attributes, or an export), the results quantized to their
    types (clamped first to ``out_min`` / ``out_max`` codes where the node has them).
    ``product_bias``: the op is a product whose third operand, when an integer without
    quantization, is a bias in the product's units (scale of operand 0 times that of
    operand 1, per output channel), as in QLinearConv."""
    def export(e, node, ins: list, outs: list) -> None:
        inner = get_op(float_op).onnx_export if isinstance(float_op, str) else float_op
        real = [e.dequantized(v) for v in node.inputs]
        bias = node.inputs[2] if product_bias and len(node.inputs) > 2 else None
        if bias is not None and bias.type.quant is None and bias.type.dtype.is_int:
            real[2] = e.dequantized_product(*node.inputs[:3])
        tmp = [e.fresh(f"{o}_real") if v.type.quant is not None else o
               for v, o in zip(node.outputs, outs)]
        inner(e, node, real, tmp)
        for v, t, o in zip(node.outputs, tmp, outs):
            if v.type.quant is None:
                continue
            lo, hi = node.attrs.get("out_min"), node.attrs.get("out_max")
            if lo is not None or hi is not None:
                t = e.emit("Clip", [t, None if lo is None else e.const(_real(v, lo), "lo"),
                                    None if hi is None else e.const(_real(v, hi), "hi")])[0]
            e.quantize(t, v, o)
    return staticmethod(export)


def _real(v, code: int) -> np.float32:
    q = v.type.quant
    if isinstance(q, AffineQuant):
        return np.float32(q.scale[0] * (code - q.zero_point[0]))
    return np.float32(code * 2.0 ** -q.frac_bits[0])


def identity(e, node, ins: list, outs: list) -> None:
    e.emit("Identity", ins[:1], outs)


def ms_deform_attn(e, node, ins: list, outs: list) -> None:
    """mmcv's multi_scale_deformable_attn_pytorch in ONNX: per level, the value reshaped
    to (bs*H, d, h, w) and sampled by GridSample (bilinear, zeros, align_corners 0) at the
    level's locations; the samples weighted and summed over levels and points. Locations
    are normalized to [0, 1], or pixel coordinates (``coordinates="pixels"``: pixel k's
    centre at k)."""
    value, loc, aw = ins
    bs, _, heads, d = node.inputs[0].type.shape
    _, nq, _, levels, points, _ = node.inputs[1].type.shape
    shapes = list(zip(node.attrs["spatial_shapes"][::2], node.attrs["spatial_shapes"][1::2]))
    pixels = node.attrs.get("coordinates", "normalized") == "pixels"
    sampled, start = [], 0
    for level, (h, w) in enumerate(shapes):
        v = e.emit("Slice", [value, e.ints([start], "s"), e.ints([start + h * w], "e"),
                             e.ints([1], "a")], 1)[0]
        start += h * w
        v = e.emit("Transpose", [v], 1, perm=[0, 2, 3, 1])[0]
        v = e.emit("Reshape", [v, e.ints([bs * heads, d, h, w], "shape")], 1)[0]
        g = e.emit("Slice", [loc, e.ints([level], "s"), e.ints([level + 1], "e"),
                             e.ints([3], "a")], 1)[0]
        # grid = loc * a + b: normalized [0, 1] -> [-1, 1], or pixel centres -> [-1, 1]
        a = [2.0 / w, 2.0 / h] if pixels else [2.0, 2.0]
        b = [1.0 / w - 1, 1.0 / h - 1] if pixels else [-1.0, -1.0]
        g = e.emit("Mul", [g, e.const(np.asarray(a, np.float32), "a")], 1)[0]
        g = e.emit("Add", [g, e.const(np.asarray(b, np.float32), "b")], 1)[0]
        g = e.emit("Reshape", [g, e.ints([bs, nq, heads, points, 2], "shape")], 1)[0]
        g = e.emit("Transpose", [g], 1, perm=[0, 2, 1, 3, 4])[0]
        g = e.emit("Reshape", [g, e.ints([bs * heads, nq, points, 2], "shape")], 1)[0]
        sampled.append(e.emit("GridSample", [v, g], 1, mode="linear", padding_mode="zeros",
                              align_corners=0)[0])                       # (bs*H, d, Nq, P)
    s = e.emit("Concat", sampled, 1, axis=-1)[0] if len(sampled) > 1 else sampled[0]
    wts = e.emit("Transpose", [aw], 1, perm=[0, 2, 1, 3, 4])[0]
    wts = e.emit("Reshape", [wts, e.ints([bs * heads, 1, nq, levels * points], "shape")], 1)[0]
    y = e.emit("Mul", [s, wts], 1)[0]
    y = e.emit("ReduceSum", [y, e.ints([-1], "axes")], 1, keepdims=0)[0]   # (bs*H, d, Nq)
    y = e.emit("Reshape", [y, e.ints([bs, heads * d, nq], "shape")], 1)[0]
    e.emit("Transpose", [y], outs, perm=[0, 2, 1])


def divide_by_count(e, node, ins: list, outs: list) -> None:
    """x / max(count, 1), the count an integer tensor."""
    count = e.emit("Cast", [ins[1]], 1, to=1)[0]                         # to float32
    count = e.emit("Max", [count, e.const(np.float32(1.0), "one")], 1)[0]
    e.emit("Div", [ins[0], count], outs)


def inverse_sigmoid(e, node, ins: list, outs: list) -> None:
    """log(max(x, eps) / max(1 - x, eps)), x clamped to [0, 1] (BEVFormer's)."""
    eps = e.const(np.float32(node.attrs["eps"]), "eps")
    x = e.emit("Clip", [ins[0], e.const(np.float32(0), "zero"), e.const(np.float32(1), "one")],
               1)[0]
    num = e.emit("Max", [x, eps], 1)[0]
    den = e.emit("Max", [e.emit("Sub", [e.const(np.float32(1), "one"), x], 1)[0], eps], 1)[0]
    e.emit("Log", [e.emit("Div", [num, den], 1)[0]], outs)


def atan2(e, node, ins: list, outs: list) -> None:
    """atan2(a, b) from Atan(a / b): plus or minus pi where b < 0 (the sign of a's), 0 at
    (0, 0); b == 0 gives atan(+-inf) = +-pi/2."""
    a, b = ins
    dt = node.inputs[0].type.dtype.np
    zero, pi = e.const(np.asarray(0, dt), "zero"), e.const(np.asarray(np.pi, dt), "pi")
    at = e.emit("Atan", [e.emit("Div", [a, b], 1)[0]], 1)[0]
    turn = e.emit("Where", [e.emit("GreaterOrEqual", [a, zero], 1)[0], pi,
                            e.emit("Neg", [pi], 1)[0]], 1)[0]
    r = e.emit("Where", [e.emit("Less", [b, zero], 1)[0], e.emit("Add", [at, turn], 1)[0], at],
               1)[0]
    origin = e.emit("And", [e.emit("Equal", [a, zero], 1)[0], e.emit("Equal", [b, zero], 1)[0]],
                    1)[0]
    e.emit("Where", [origin, zero, r], outs)


def silu(e, node, ins: list, outs: list) -> None:
    """x * Sigmoid(x): the form both torch exporters give SiLU."""
    e.emit("Mul", [ins[0], e.emit("Sigmoid", ins, 1)[0]], outs)


def bridge(e, node, ins: list, outs: list) -> None:
    """Requantize, then move the codes by ``perm`` (Q before the Transpose: onnxruntime's
    QDQ propagation mistypes a QuantizeLinear it moves across a Transpose between
    different code types)."""
    perm = node.attrs.get("perm")
    if not perm:
        return e.quantize(e.dequantized(node.inputs[0]), node.outputs[0], outs[0])
    codes = e.fresh(f"{outs[0]}_unpermuted")
    e.quantize(e.dequantized(node.inputs[0]), node.outputs[0], codes)
    e.emit("Transpose", [codes], outs, perm=list(perm))


def integer_product(op_type: str, attrs: dict[str, str] | None = None) -> Export:
    """ConvInteger / MatMulInteger: the zero points, from the operand types, as inputs."""
    inner = onnx_as(op_type, attrs)

    def export(e, node, ins: list, outs: list) -> None:
        zps = []
        for v in node.inputs:
            q = v.type.quant
            zp = np.asarray(q.zero_point if q is not None else (0,), v.type.dtype.np)
            zps.append(e.const(zp.reshape(()) if zp.size == 1 else zp, "zp"))
        inner(e, node, ins + zps, outs)
    return staticmethod(export)
