"""Fused ops: one node for a sequence the ``fuse`` pass recognizes.

Each fused op computes exactly what its unfused sequence computes, by calling the same
op definitions in the same order (conv2d then the activation; matmul, the bias add, then
the activation; add then relu), so the result is bit-identical to the sequence. Types
(layout included) and MACs are those of the op that carries the products.

The activation of a fused op is an attribute: ``activation`` (``none``, ``relu``,
``clip`` with ``clip_min`` / ``clip_max``, ``gelu`` with ``approximate``, ``hardswish``,
``hardsigmoid`` with ``alpha`` / ``beta``, ``silu``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.graph import Node
from ..ir.types import TensorType
from ..ir.opdef import Activation, Attr, Bool, Ctx, FixedLowering, Float, OpDef, Str, get_op
from . import native
from .common import broadcast_types, float_operands, read_only, require
from .layout_rules import ELEMENTWISE, NATIVE
from .kernels.products import conv2d_runner, linear_runner, prepared_runner
from .linalg import CONV_ATTRS, Contraction, Convolution
from .onnx_export import matmul_bias, onnx_as, then_activation


def _activation(name: str) -> Activation:
    """The activation interface of op ``name`` (VerifyError for an op that has none)."""
    spec = get_op(name).activation
    require(spec is not None, f"op '{name}' is not a fusable activation")
    return spec


#: the activations a product can carry
ACTIVATIONS = ("relu", "clip", "gelu", "hardswish", "hardsigmoid", "silu")


def activation_attrs(choices: tuple[str, ...]) -> dict[str, Attr]:
    """The attribute schema of a fused activation taking one of ``choices``."""
    attrs = {"activation": Str("none", ("none",) + choices)}
    for name in choices:
        for _, fused in _activation(name).attrs:
            attrs[fused] = Str("none", ("none", "tanh")) if fused == "approximate" else Float(None)
    return attrs


def activation_of(node: Node) -> dict[str, Any]:
    """The fused-op attributes that stand for the activation node ``node``."""
    mapping = _activation(node.op).attrs
    return {"activation": node.op, **{fused: node.attrs[a] for a, fused in mapping}}


def _activation_ctx(c: Ctx, types=()) -> Ctx:
    """The activation op's own attributes, read from the fused op's."""
    return Ctx({a: c.attrs[f] for a, f in _activation(c.activation).attrs}, types)


def activation_runner(c: Ctx) -> Callable[[np.ndarray], np.ndarray]:
    """The fused activation as a function of the product's fresh result, applied with the
    activation op's own definition (on float32, the same operations in one native pass,
    in place), its context and native code made once."""
    if c.activation == "none":
        return lambda y: y
    ctx, code, compute = _activation_ctx(c), activation_code(c), get_op(c.activation).compute

    def run(y: np.ndarray) -> np.ndarray:
        return y if native.activate(code, y) else compute(ctx, y)
    return run


def apply_activation(c: Ctx, y: np.ndarray) -> np.ndarray:
    """Apply the fused activation to ``y``, the product's fresh result
    (:func:`activation_runner`)."""
    return activation_runner(c)(y)


def activation_code(c: Ctx) -> tuple[int, int | None] | None:
    """The native kernels' code of the fused activation (native.activation_code)."""
    if c.activation == "none":
        return native.NO_ACTIVATION
    return native.activation_code(c.activation, _activation_ctx(c).attrs)


def _then_activation(c: Ctx, run, activated: bool):
    """``run``, followed by the fused activation unless it applied it itself."""
    if activated:
        return run
    activate = activation_runner(c)
    return lambda x: activate(run(x))


def _activation_infer(c: Ctx, t: TensorType) -> TensorType:
    if c.activation != "none":
        t = get_op(c.activation).infer(_activation_ctx(c, [t]), t)
    return t


class Conv2dAct(Convolution):
    """conv2d (with its bias) followed by an activation (:data:`ACTIVATIONS`). Operands and
    attributes as conv2d's, plus the activation; layout and MACs are conv2d's."""

    name = "conv2d_act"
    onnx_export = then_activation(onnx_as("Conv", {"strides": "strides", "pads": "pads",
                                                   "dilations": "dilations", "groups": "group"}))
    fixed_point = FixedLowering("product")
    nhwc = NATIVE
    any_memory_order = True        # as conv2d's
    fresh_results = True
    operands = ("x", "w", "b?")
    attrs = {**CONV_ATTRS, **activation_attrs(ACTIVATIONS)}

    def infer(self, c, x, w, b=None):
        return _activation_infer(c, get_op("conv2d").infer(c, x, w, b))

    def compute(self, c, x, w, b=None):
        return self.prepare(c, x, w, b)(x)

    def prepare(self, c, x, w, b=None):
        return prepared_runner(c, x, w, b, lambda: self.runner(c, x, w, b))

    @staticmethod
    def runner(c, x, w, b):
        """conv2d's runner, the activation in its native call where the kernels take it."""
        code = activation_code(c)
        run, ran = conv2d_runner(c, x, w, b, code or native.NO_ACTIVATION)
        return _then_activation(c, run, ran and code is not None)


class MatMulAct(Contraction):
    """a @ b (b transposed with ``trans_b``, which needs a 2-D b), plus ``bias``
    (broadcast to the product's shape, not beyond), then an activation (none, relu, clip,
    gelu): matmul, add and the activation op in that order; gemm without alpha, beta or
    trans_a is the same computation."""

    name = "matmul_act"
    onnx_export = then_activation(matmul_bias)
    fixed_point = FixedLowering("product")
    operands = ("a", "b", "bias?")
    attrs = {"trans_b": Bool(False), **activation_attrs(ACTIVATIONS)}

    def infer(self, c, a, b, bias=None):
        if c.trans_b:
            require(b.rank == 2, f"trans_b needs a 2-D b, got {b}")
            b = TensorType(b.shape[::-1], b.dtype)
        y = get_op("matmul").infer(c, a, b)
        if bias is not None:
            float_operands(y, bias)
            require(broadcast_types(y, bias).shape == y.shape,
                    f"bias {bias} broadcasts beyond the product {y}")
        return _activation_infer(c, y)

    def compute(self, c, a, b, bias=None):
        run = self.prepare(c, a, b, bias)
        return self.numpy_path(c, a, b, bias) if run is None else run(a)

    def prepare(self, c, a, b, bias=None):
        if np.ndim(b) == 2 and read_only(b):       # a weight: prepared once
            return prepared_runner(c, a, b, bias, lambda: self.runner(c, a, b, bias))
        return None

    @staticmethod
    def numpy_path(c, a, b, bias=None):
        y = get_op("matmul").compute(c, a, b.T if c.trans_b else b)
        if bias is not None:
            y = get_op("add").compute(c, y, bias)
        return apply_activation(c, y)

    @classmethod
    def runner(cls, c, a, b, bias):
        """The native product, the activation in its call where the kernels take it; else
        the numpy path."""
        code = activation_code(c)
        run = linear_runner(a, b.T if c.trans_b else b, bias, code or native.NO_ACTIVATION)
        if run is None:
            return lambda a: cls.numpy_path(c, a, b, bias)
        return _then_activation(c, run, code is not None)

    def weight_axes(self, c, w):
        return (1,) if c.trans_b else (w.rank - 2,)


class AddRelu(OpDef):
    """relu(a + b), broadcasting as add."""

    name = "add_relu"
    sum_activation = "relu"
    fresh_results = True            # add's new array (or the operand handed over)
    onnx_export = then_activation(onnx_as("Add"), "relu")
    fixed_point = FixedLowering("add_relu")
    nhwc = ELEMENTWISE
    operands = ("a", "b")

    def infer(self, c, a, b):
        return get_op("relu").infer(c, get_op("add").infer(c, a, b))

    def compute(self, c, a, b):
        return self._relu(c, get_op("add").compute(c, a, b))

    def bind_in_place(self, node, operand):
        """The sum into the handed-over operand (add's), then relu."""
        add, c = get_op("add").bind_in_place(node, operand), self.ctx(node)
        return None if add is None else (lambda arrays: [self._relu(c, add(arrays)[0])])

    @staticmethod
    def _relu(c, y):
        # the sum is a fresh array: relu's own operations on it in place, in one native
        # pass where they run (one allocation and one pass over memory fewer)
        return y if native.activation("relu", {}, y) else get_op("relu").compute(c, y)

