"""fuse: operator fusion and the recognition of decomposed layers, as rewrite patterns.

Every fusion is one named :class:`~bevir.passes.patterns.RewritePattern`; the ``fuse``
pass runs them all to a fixpoint, and ``fuse{disable=fold-bn-into-conv}`` (or
``enable=...``) picks among them. Each pattern states its ``tolerance``: the largest error
it may introduce relative to the largest result magnitude (0.0: bit-identical in float32).

=============================  ===========================================================
pattern                        rewrites
=============================  ===========================================================
fold-bn-into-conv              batch_norm(conv2d(x, const w, const b?)) with constant BN
                               parameters -> conv2d with folded w, b
fuse-conv-activation           an activation (relu, clip, gelu, hardswish, hardsigmoid,
                               silu) of conv2d -> conv2d_act
fuse-qlinear-clip              relu / clip of qlinear_conv / matmul / add / mul codes -> the
                               op clamping its result codes (out_min, out_max)
fuse-linear-bias               matmul (or gemm without bias) + bias add -> linear
fuse-linear-activation         an activation of matmul, gemm or linear -> linear
fuse-add-relu                  relu(add(a, b)) -> add_relu
recognize-layer-norm           (x - mean) / sqrt(mean((x - mean)^2) + eps), or * rsqrt
                               -> layer_norm
fold-scale-into-layer-norm     layer_norm(x) * const gamma -> layer_norm(x, gamma)
fold-bias-into-layer-norm      layer_norm(x, gamma?) + const beta -> layer_norm(x, gamma, beta)
recognize-gelu                 x * 0.5 * (1 + erf(x / sqrt(2))) and its exported forms -> gelu
recognize-gelu-tanh            0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> gelu
recognize-silu                 x * sigmoid(x) -> silu
recognize-hardsigmoid          relu6(x + 3) / 6 -> hardsigmoid
recognize-hardswish            x * hardsigmoid(x), x * relu6(x + 3) / 6 -> hardswish
recognize-global-avgpool       reduce_mean over the spatial axes of a 4-D tensor -> global_avgpool
recognize-softmax              exp(x - max) / sum(exp(x - max)), and without the max -> softmax
fold-requantize-chain          quantize(dequantize(q)) that gives back every code of q -> q
fold-transpose-into-matmul     matmul(x, transpose(const w)) -> matmul(x, const w^T)
fold-transpose-into-gemm       gemm(transpose(a), b) -> gemm(a, b, trans_a), likewise for b
=============================  ===========================================================

A transpose of a constant on its own is folded by ``canonicalize`` (constant folding);
fuse folds one only where a matmul reads it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import product
from typing import Any, ClassVar

import numpy as np

from ..errors import BevirError
from ..ir.graph import Node, Value
from ..ir.types import AffineQuant, DType, TensorType
from ..ops import Ctx, all_ops, get_op
from ..ops.elementwise import clip_codes
from ..ops.fused import ACTIVATIONS, activation_of
from .patterns import (Match, NoMatch, Op, PatternPass, RewritePattern, Rewriter, const,
                       match_pattern, op)

Replacement = tuple[str, Sequence[Value | None], Mapping[str, Any]]


# ---- helpers -----------------------------------------------------------------------------
def scalar(v: Value | None) -> float | None:
    """The value of a one-element constant, else None."""
    if v is None or not v.is_const or v.const.size != 1:
        return None
    return float(v.const.reshape(-1)[0])


def expect_scalar(m: Match, key: str, want: float, what: str, rtol: float = 0.0) -> str | None:
    """A reason unless the constant bound to ``key`` (if any) is ``want`` (within ``rtol``)."""
    if key not in m:
        return None
    got = scalar(m[key])
    if got is None or abs(got - want) > rtol * abs(want):
        shown = "not a scalar" if got is None else repr(got)
        return f"{what} is {shown}, not {float(want)!r}"
    return None


def inferred_type(op_name: str, inputs: Sequence[Value | None],
                  attrs: Mapping[str, Any]) -> TensorType | str:
    """The result type ``op_name(inputs){attrs}`` would have, or why it is invalid."""
    try:
        opdef = get_op(op_name)
        types = opdef.infer_node(Node(op_name, inputs, opdef.check_attrs(attrs)))
    except BevirError as e:
        return e.message
    return types[0] if len(types) == 1 else f"{op_name} would have {len(types)} results"


def reduced_axes(node: Node) -> tuple[int, ...] | None:
    """The sorted, non-negative axes a keepdims reduction reduces; None if not keepdims."""
    rank = node.inputs[0].type.rank
    axes = node.attrs["axes"]
    if not node.attrs["keepdims"]:
        return None
    return tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))


def same_value(m: Match, capture: str, node_key: str) -> str | None:
    """A reason unless the value captured as ``capture`` (if any) is the result of the
    node bound as ``node_key``."""
    if capture in m and m[capture] is not m[node_key].output:
        return f"%{m[capture].name} is not %{m[node_key].output.name}"
    return None


def operand(node: Node, index: int) -> Value | None:
    """Operand ``index`` of ``node``, None when omitted."""
    return node.inputs[index] if index < len(node.inputs) else None


def first_reason(*reasons: str | None) -> str | None:
    return next((r for r in reasons if r is not None), None)


# ---- pattern bases -----------------------------------------------------------------------
class FusionPattern(RewritePattern):
    """A pattern replacing its root by one new node (:meth:`replacement`). ``check``
    runs :meth:`decline` and then makes sure the new node has the root's result type."""

    #: the largest error the rewrite may introduce, relative to the result's magnitude
    tolerance: ClassVar[float] = 0.0

    def decline(self, m: Match) -> str | None:
        """A pattern-specific reason to decline, or None."""
        return None

    def replacement(self, m: Match) -> Replacement:
        """(op, inputs, attrs) of the node that replaces the root."""
        raise NotImplementedError(f"pattern '{self.name}' defines no replacement()")

    def check(self, m: Match) -> str | None:
        reason = self.decline(m)
        if reason is not None:
            return reason
        op_name, inputs, attrs = self.replacement(m)
        got = inferred_type(op_name, inputs, attrs)
        if isinstance(got, str):
            return f"{op_name} would be invalid: {got}"
        want = self.replaced(m).type
        return None if got == want else f"{op_name} would give {got}, not {want}"

    def replaced(self, m: Match) -> Value:
        """The value the new node computes (whose type it must have): the root's result."""
        return m.root.output

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        op_name, inputs, attrs = self.replacement(m)
        rw.replace(m.root, rw.create(op_name, inputs, attrs))


class AlternativesPattern(FusionPattern):
    """A pattern with several shapes (``alternatives``, tried in order). The match is the
    first alternative that matches and passes ``check``; else the first that matches
    (``check`` then says why it is declined); else the failure that got furthest."""

    alternatives: ClassVar[tuple[Op, ...]] = ()

    def __init_subclass__(cls, **kw):
        if "alternatives" in cls.__dict__:
            cls.roots = tuple(dict.fromkeys(o for alt in cls.alternatives for o in alt.ops))
        super().__init_subclass__(**kw)

    def match(self, node: Node) -> Match | NoMatch:
        failures: list[NoMatch] = []
        declined: list[Match] = []
        for alt in self.alternatives:
            m = match_pattern(alt, node)
            if not m:
                failures.append(m)
            elif self.check(m) is None:
                return m
            else:
                declined.append(m)
        if declined:
            return declined[0]
        return max(failures, key=lambda f: f.progress,
                   default=NoMatch(f"pattern '{self.name}' has no alternatives"))


# ---- convolution -------------------------------------------------------------------------
class FoldBnIntoConv(RewritePattern):
    """batch_norm(conv2d(x, const w, const b?), const scale, bias, mean, var) -> conv2d with
    w * s and (b - mean) * s + bias, s = scale / sqrt(var + eps), computed in float64."""

    name = "fold-bn-into-conv"
    benefit = 2
    tolerance: ClassVar[float] = 1e-5
    pattern = op("batch_norm",
                 op("conv2d", "x", const("w"), const("b", optional=True), name="conv"),
                 const("scale"), const("bias"), const("mean"), const("var"))

    def check(self, m: Match) -> str | None:
        if np.any(self._denominator(m) <= 0):
            return "BN variance + epsilon is not positive"
        return None

    @staticmethod
    def _denominator(m: Match) -> np.ndarray:
        return m["var"].const.astype(np.float64) + m.root.attrs["epsilon"]

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        w, b = m["w"], m["b"]

        def f64(key):
            return m[key].const.astype(np.float64)
        s = f64("scale") / np.sqrt(self._denominator(m))
        w2 = w.const.astype(np.float64) * s.reshape(-1, 1, 1, 1)
        b0 = 0.0 if b is None else b.const.astype(np.float64)
        b2 = (b0 - f64("mean")) * s + f64("bias")
        dtype = w.type.dtype.np
        inputs = [m["x"], rw.const(w2.astype(dtype), f"{w.name}.bn_folded"),
                  rw.const(b2.astype(dtype), f"{w.name}.bn_folded_bias")]
        rw.replace(m.root, rw.create("conv2d", inputs, m["conv"].attrs))


class FuseConvActivation(FusionPattern):
    """An activation (relu, clip, gelu, hardswish, hardsigmoid, silu) of conv2d (with or
    without its bias) -> conv2d_act: bit-identical."""

    name = "fuse-conv-activation"
    benefit = 2
    pattern = op(ACTIVATIONS, op("conv2d", "x", "w", ..., name="conv"))

    def replacement(self, m: Match) -> Replacement:
        conv = m["conv"]
        return "conv2d_act", conv.inputs, {**conv.attrs, **activation_of(m.root)}


class FuseQLinearClip(FusionPattern):
    """relu / clip of the codes of an onnxruntime-exact QLinear op (conv, matmul, add, mul)
    -> the op clamping its result codes (``out_min``, ``out_max``): bit-identical, and the
    activation's pass over the tensor is gone."""

    name = "fuse-qlinear-clip"
    benefit = 2
    #: the ops that declare the clamp attributes
    clamped = tuple(sorted(n for n, d in all_ops().items() if "out_min" in d.attrs))
    pattern = op(("relu", "clip"), op(clamped, ..., name="q"))

    def decline(self, m: Match) -> str | None:
        lo, hi = self._bounds(m)
        return None if lo <= hi else f"clip [{lo}, {hi}] of a clamped result is constant"

    def _bounds(self, m: Match) -> tuple[int, int]:
        q, dtype = m["q"], m["q"].output.type.dtype.np
        lo, hi = (0, None) if m.root.op == "relu" else (m.root.attrs["min"], m.root.attrs["max"])
        lo, hi = clip_codes(lo, hi, dtype)
        old_lo, old_hi = clip_codes(q.attrs.get("out_min"), q.attrs.get("out_max"), dtype)
        return max(lo, old_lo), min(hi, old_hi)

    def replacement(self, m: Match) -> Replacement:
        lo, hi = self._bounds(m)
        return m["q"].op, m["q"].inputs, {**m["q"].attrs, "out_min": lo, "out_max": hi}


# ---- matrix products ---------------------------------------------------------------------
def linear_attrs(node: Node) -> dict[str, Any] | str:
    """The linear attributes equal to the product ``node`` (matmul, gemm or linear), or
    why there are none."""
    if node.op == "matmul":
        return {}
    if node.op == "matmul_act":
        if node.attrs["activation"] != "none":
            return f"matmul_act {node.name} already applies {node.attrs['activation']}"
        return dict(node.attrs)
    a = node.attrs
    if a["trans_a"]:
        return f"gemm {node.name} transposes a"
    if a["alpha"] != 1.0 or (a["beta"] != 1.0 and len(node.inputs) > 2
                             and node.inputs[2] is not None):
        return f"gemm {node.name} scales (alpha={a['alpha']}, beta={a['beta']})"
    return {"trans_b": a["trans_b"]}


class FuseLinearBias(FusionPattern):
    """matmul(a, b) + const bias, or gemm(a, b) without its bias + const bias -> linear(a,
    b, bias), where the bias does not broaden the product: bit-identical."""

    name = "fuse-linear-bias"
    pattern = op("add", op(("matmul", "gemm"), "a", "b", None, name="mm"), const("bias"),
                 commutative=True)

    def decline(self, m: Match) -> str | None:
        attrs = linear_attrs(m["mm"])
        return attrs if isinstance(attrs, str) else None

    def replacement(self, m: Match) -> Replacement:
        return "matmul_act", [m["a"], m["b"], m["bias"]], linear_attrs(m["mm"])


_PRODUCT = op(("matmul", "gemm", "matmul_act"), "a", "b", ..., name="mm")


class FuseLinearActivation(AlternativesPattern):
    """An activation of matmul, gemm (with or without bias) or linear, or of a reshape
    of one (torch's linear on N-D input: reshape, gemm, reshape) -> linear with the
    activation (then the reshape): bit-identical."""

    name = "fuse-linear-activation"
    benefit = 2
    alternatives = (op(ACTIVATIONS, _PRODUCT),
                    op(ACTIVATIONS, op("reshape", _PRODUCT, ..., name="reshape")))

    def decline(self, m: Match) -> str | None:
        attrs = linear_attrs(m["mm"])
        return attrs if isinstance(attrs, str) else None

    def replaced(self, m: Match) -> Value:
        return m["mm"].output

    def replacement(self, m: Match) -> Replacement:
        mm = m["mm"]
        return "matmul_act", [operand(mm, i) for i in range(3)], {**linear_attrs(mm),
                                                             **activation_of(m.root)}

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        op_name, inputs, attrs = self.replacement(m)
        out = rw.create(op_name, inputs, attrs).output
        if "reshape" in m:
            out = rw.create("reshape", [out], m["reshape"].attrs).output
        rw.replace(m.root, out)


class FuseAddRelu(FusionPattern):
    """relu(add(a, b)) -> add_relu(a, b): bit-identical."""

    name = "fuse-add-relu"
    pattern = op("relu", op("add", "a", "b"))

    def replacement(self, m: Match) -> Replacement:
        return "add_relu", [m["a"], m["b"]], {}


# ---- layer norm --------------------------------------------------------------------------
def _layer_norm_core(normalize: str, square: str) -> Op:
    """One exported shape of (x - mean) / sqrt(var + eps): ``normalize`` is ``div`` or
    ``rsqrt`` (times reciprocal(sqrt)); ``square`` how (x - mean)^2 is written: ``pow`` or
    ``mul`` of the centered value itself, or ``pow-again`` of a second x - mean."""
    center = op("sub", "x", op("reduce_mean", "x", name="mean"), name="center")
    sq = {"pow": op("pow", "d", const("two")), "mul": op("mul", "d", "d"),
          "pow-again": op("pow", op("sub", "x", "u"), const("two"))}[square]
    std = op("sqrt", op("add", op("reduce_mean", sq, name="var"), const("eps"), commutative=True))
    if normalize == "div":
        return op("div", center, std)
    return op("mul", center, op("reciprocal", std), commutative=True)


class RecognizeLayerNorm(AlternativesPattern):
    """The layer norm torch export produces from a hand-written one (mean over trailing
    axes, subtract, square, mean, add eps, sqrt, divide or multiply by the reciprocal) ->
    layer_norm without scale and bias (which the fold-*-into-layer-norm patterns add).
    Bit-identical in the divide form; the reciprocal form is within float32 rounding."""

    name = "recognize-layer-norm"
    benefit = 3
    tolerance: ClassVar[float] = 1e-6
    alternatives = tuple(_layer_norm_core(n, s) for n, s in
                         product(("div", "rsqrt"), ("pow-again", "pow", "mul")))

    def decline(self, m: Match) -> str | None:
        axes, var_axes = reduced_axes(m["mean"]), reduced_axes(m["var"])
        rank = m["x"].type.rank
        if axes is None or axes != tuple(range(rank - len(axes), rank)):
            return f"the mean is not over trailing axes with keepdims ({m['mean'].attrs['axes']})"
        if var_axes != axes:
            return f"the variance is over axes {var_axes}, the mean over {axes}"
        if scalar(m["eps"]) is None:
            return "epsilon is not a scalar constant"
        return first_reason(same_value(m, "d", "center"), same_value(m, "u", "mean"),
                            expect_scalar(m, "two", 2.0, "the exponent"))

    def replacement(self, m: Match) -> Replacement:
        axis = -len(reduced_axes(m["mean"]))
        return "layer_norm", [m["x"], None, None], {"axis": axis, "epsilon": scalar(m["eps"])}


class FoldScaleIntoLayerNorm(FusionPattern):
    """layer_norm(x) * const gamma -> layer_norm(x, gamma): bit-identical."""

    name = "fold-scale-into-layer-norm"
    pattern = op("mul", op("layer_norm", "x", None, None, name="ln"), const("gamma"),
                 commutative=True)

    def replacement(self, m: Match) -> Replacement:
        return "layer_norm", [m["x"], m["gamma"], None], m["ln"].attrs


class FoldBiasIntoLayerNorm(FusionPattern):
    """layer_norm(x, gamma?) + const beta -> layer_norm(x, gamma, beta): bit-identical."""

    name = "fold-bias-into-layer-norm"
    pattern = op("add", op("layer_norm", "x", ..., name="ln"), const("beta"), commutative=True)

    def decline(self, m: Match) -> str | None:
        ln = m["ln"]
        return f"layer_norm {ln.name} already adds a bias" if operand(ln, 2) is not None else None

    def replacement(self, m: Match) -> Replacement:
        return "layer_norm", [m["x"], operand(m["ln"], 1), m["beta"]], m["ln"].attrs


# ---- gelu --------------------------------------------------------------------------------
_ERF_TERM = op("add", op("erf", op(("div", "mul"), "x", const("k"), name="scaled")), const("one"),
               commutative=True)


class RecognizeGelu(AlternativesPattern):
    """x * 0.5 * (1 + erf(x / sqrt(2))) -> gelu, in the association orders torch export
    writes (x * 0.5 * t, x * (t * 0.5), x * t * 0.5, x * t / 2; x / sqrt(2) or
    x * (1 / sqrt(2))). gelu rounds once, the sequence at every step."""

    name = "recognize-gelu"
    benefit = 3
    tolerance: ClassVar[float] = 1e-5
    alternatives = (
        op("mul", op("mul", "x", const("half"), commutative=True), _ERF_TERM, commutative=True),
        op("mul", "x", op("mul", _ERF_TERM, const("half"), commutative=True), commutative=True),
        op("mul", op("mul", "x", _ERF_TERM, commutative=True), const("half"), commutative=True),
        op("div", op("mul", "x", _ERF_TERM, commutative=True), const("two")),
    )

    def decline(self, m: Match) -> str | None:
        k = np.sqrt(2.0) if m["scaled"].op == "div" else 1 / np.sqrt(2.0)
        return first_reason(expect_scalar(m, "k", k, "the erf argument's scale", 1e-6),
                            expect_scalar(m, "one", 1.0, "the added constant"),
                            expect_scalar(m, "half", 0.5, "the factor"),
                            expect_scalar(m, "two", 2.0, "the divisor"))

    def replacement(self, m: Match) -> Replacement:
        return "gelu", [m["x"]], {"approximate": "none"}


#: 0.044715 * x^3 as written: c * (x * (x * x)), c * x^3, or ((c * x) * x) * x
_CUBIC = (op("mul", op("mul", "x", op("mul", "x", "x"), commutative=True), const("c"),
             commutative=True),
          op("mul", op("pow", "x", const("three")), const("c"), commutative=True),
          op("mul", op("mul", op("mul", "x", const("c"), commutative=True), "x", commutative=True),
             "x", commutative=True))
_TANH_TERMS = tuple(
    op("add", op("tanh", op("mul", op("add", "x", cubic, commutative=True), const("k"),
                            commutative=True)), const("one"), commutative=True) for cubic in _CUBIC)


class RecognizeGeluTanh(AlternativesPattern):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> gelu(approximate=tanh),
    in the association orders the exporters write (x * x * x or x^3)."""

    name = "recognize-gelu-tanh"
    benefit = 3
    tolerance: ClassVar[float] = 1e-5
    alternatives = tuple(alt for t in _TANH_TERMS for alt in (
        op("mul", const("half"), op("mul", "x", t, commutative=True), commutative=True),
        op("mul", op("mul", "x", const("half"), commutative=True), t, commutative=True),
        op("mul", "x", op("mul", t, const("half"), commutative=True), commutative=True)))

    def decline(self, m: Match) -> str | None:
        return first_reason(expect_scalar(m, "k", np.sqrt(2 / np.pi), "the tanh argument's scale",
                                          1e-6),
                            expect_scalar(m, "c", 0.044715, "the cubic coefficient", 1e-6),
                            expect_scalar(m, "three", 3.0, "the exponent"),
                            expect_scalar(m, "one", 1.0, "the added constant"),
                            expect_scalar(m, "half", 0.5, "the factor"))

    def replacement(self, m: Match) -> Replacement:
        return "gelu", [m["x"]], {"approximate": "tanh"}


# ---- swish family ------------------------------------------------------------------------
class RecognizeSilu(FusionPattern):
    """x * sigmoid(x) -> silu: bit-identical."""

    name = "recognize-silu"
    benefit = 3
    pattern = op("mul", "x", op("sigmoid", "x"), commutative=True)

    def replacement(self, m: Match) -> Replacement:
        return "silu", [m["x"]], {}


_RELU6_OF_X_PLUS_3 = op("clip", op("add", "x", const("three"), commutative=True), name="clip")


def _relu6_reason(m: Match) -> str | None:
    clip = m["clip"].attrs
    bounds = None if (clip["min"], clip["max"]) == (0.0, 6.0) else \
        f"clip bounds are [{clip['min']}, {clip['max']}], not [0, 6]"
    return first_reason(bounds, expect_scalar(m, "three", 3.0, "the added constant"),
                        expect_scalar(m, "six", 6.0, "the divisor"),
                        expect_scalar(m, "sixth", 1 / 6, "the factor", 1e-6))


class RecognizeHardSigmoid(AlternativesPattern):
    """relu6(x + 3) / 6 (or * 1/6), torch's decomposed hardsigmoid -> hardsigmoid(1/6, 1/2)."""

    name = "recognize-hardsigmoid"
    benefit = 3
    tolerance: ClassVar[float] = 1e-6
    alternatives = (op("div", _RELU6_OF_X_PLUS_3, const("six")),
                    op("mul", _RELU6_OF_X_PLUS_3, const("sixth"), commutative=True))

    def decline(self, m: Match) -> str | None:
        return _relu6_reason(m)

    def replacement(self, m: Match) -> Replacement:
        return "hardsigmoid", [m["x"]], {"alpha": 1 / 6, "beta": 0.5}


class RecognizeHardSwish(AlternativesPattern):
    """x * hardsigmoid(x) with alpha 1/6, beta 1/2 (bit-identical), and torch's decomposed
    x * relu6(x + 3) / 6 -> hardswish."""

    name = "recognize-hardswish"
    benefit = 4
    tolerance: ClassVar[float] = 1e-6
    alternatives = (op("mul", "x", op("hardsigmoid", "x", name="hs"), commutative=True),
                    op("div", op("mul", "x", _RELU6_OF_X_PLUS_3, commutative=True), const("six")))

    def decline(self, m: Match) -> str | None:
        if "hs" in m:
            a = m["hs"].attrs
            exact = np.float32(a["alpha"]) == np.float32(1 / 6) and a["beta"] == 0.5
            return None if exact else f"hardsigmoid has alpha {a['alpha']}, beta {a['beta']}"
        return _relu6_reason(m)

    def replacement(self, m: Match) -> Replacement:
        return "hardswish", [m["x"]], {}


# ---- pooling -----------------------------------------------------------------------------
class RecognizeGlobalAvgPool(FusionPattern):
    """reduce_mean of a 4-D tensor over its two spatial axes (the dynamo exporter's form
    of adaptive_avg_pool2d(x, 1)) -> global_avgpool, which runs in NHWC; then a reshape
    when the mean drops the axes. The mean's summation order may differ."""

    name = "recognize-global-avgpool"
    tolerance: ClassVar[float] = 1e-6
    pattern = op("reduce_mean", "x")

    def decline(self, m: Match) -> str | None:
        x, axes = m["x"].type, m.root.attrs["axes"]
        if x.rank != 4 or not x.dtype.is_float:
            return f"the operand is {x}, not a 4-D float tensor"
        if axes is None or sorted(a % 4 for a in axes) != [2, 3]:
            return f"axes {axes} are not the spatial axes (2, 3)"
        return None

    def check(self, m: Match) -> str | None:    # the pool (and reshape) give the mean's type
        return self.decline(m)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        y = rw.create("global_avgpool", [m["x"]], {}).output
        if not m.root.attrs["keepdims"]:
            y = rw.create("reshape", [y], {"shape": m.root.output.type.shape}).output
        rw.replace(m.root, y)


# ---- softmax -----------------------------------------------------------------------------
def _softmax_form(shifted: bool, shared: bool) -> Op:
    """exp(x [- max]) / reduce_sum(exp(x [- max])), the exp shared or computed twice."""
    arg = op("sub", "x", op("reduce_max", "x", name="max")) if shifted else "x"
    again = op("sub", "x", "m2") if shifted else "x"
    total = op("reduce_sum", "e2" if shared else op("exp", again), name="sum")
    return op("div", op("exp", arg, name="e"), total)


class RecognizeSoftmax(AlternativesPattern):
    """exp(x - max) / sum(exp(x - max)) over one axis (bit-identical), and the form
    without the max (within float32 rounding where it does not overflow) -> softmax."""

    name = "recognize-softmax"
    benefit = 3
    tolerance: ClassVar[float] = 1e-5
    alternatives = tuple(_softmax_form(s, sh) for s, sh in product((True, False), (True, False)))

    def decline(self, m: Match) -> str | None:
        axes = reduced_axes(m["sum"])
        if axes is None or len(axes) != 1:
            return f"the sum is not over one axis with keepdims ({m['sum'].attrs['axes']})"
        if "max" in m and reduced_axes(m["max"]) != axes:
            return f"the max is over axes {reduced_axes(m['max'])}, the sum over {axes}"
        return first_reason(same_value(m, "e2", "e"), same_value(m, "m2", "max"))

    def replacement(self, m: Match) -> Replacement:
        return "softmax", [m["x"]], {"axis": reduced_axes(m["sum"])[0]}


# ---- quantization ------------------------------------------------------------------------
def round_trip_failure(t: TensorType) -> str | None:
    """Why dequantize then quantize with ``t``'s own parameters does not give back every
    code of ``t`` (tried exhaustively, per channel, with the ops' definitions), or None."""
    if not t.dtype.is_int or not isinstance(t.quant, AffineQuant):
        return f"{t} is not affine-quantized"
    for s, z in np.broadcast(t.quant.scale, t.quant.zero_point):
        reason = _channel_round_trip(t.dtype, float(s), int(z))
        if reason is not None:
            return reason
    return None


@lru_cache(maxsize=4096)
def _channel_round_trip(dtype: DType, s: float, z: int) -> str | None:
    codes = np.arange(np.iinfo(dtype.np).min, np.iinfo(dtype.np).max + 1).astype(dtype.np)
    q = TensorType(codes.shape, dtype, quant=AffineQuant((s,), (z,)))
    with np.errstate(over="ignore"):   # codes beyond float32 become inf, then saturate
        real = get_op("dequantize").compute(Ctx({}, [q]), codes)
    back = get_op("quantize").compute(Ctx({}, [TensorType(codes.shape)], [q]), real)
    bad = np.flatnonzero(back != codes)
    if bad.size:
        return f"code {codes[bad[0]]} comes back as {back[bad[0]]} (scale {s}, zero point {z})"
    return None


class FoldRequantizeChain(RewritePattern):
    """quantize(dequantize(q)) with q's own parameters -> q, when that gives back every code
    (checked exhaustively): bit-identical. Other parameters would need a requantize op."""

    name = "fold-requantize-chain"
    tolerance: ClassVar[float] = 0.0
    pattern = op("quantize", op("dequantize", "q"))

    def check(self, m: Match) -> str | None:
        q, want = m["q"].type, m.root.output.type
        if want != q:
            return (f"the quantize gives {want}, the dequantized value is {q}: a different "
                    "quantization needs a requantize op")
        return round_trip_failure(q)

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        rw.replace(m.root, m["q"])


# ---- transposes --------------------------------------------------------------------------
class FoldTransposeIntoMatmul(RewritePattern):
    """matmul(x, transpose(const w)) -> matmul(x, const w transposed)."""

    name = "fold-transpose-into-matmul"
    tolerance: ClassVar[float] = 0.0
    pattern = op("matmul", "x", op("transpose", const("w"), name="t"))

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        t, w = m["t"], m["w"]
        data = np.asarray(t.opdef.run(t, [w.const])[0])
        wt = rw.const(data, f"{w.name}.transposed", t.output.type)
        rw.replace(m.root, rw.create("matmul", [m["x"], wt], m.root.attrs))


class FoldTransposeIntoGemm(AlternativesPattern):
    """gemm(transpose(a), b, c?) -> gemm(a, b, c?) with trans_a flipped; likewise for b."""

    name = "fold-transpose-into-gemm"
    alternatives = (op("gemm", op("transpose", "a", name="ta"), "b", ...),
                    op("gemm", "a", op("transpose", "b", name="tb"), ...))

    def decline(self, m: Match) -> str | None:
        t = m["ta"] if "ta" in m else m["tb"]
        return None if tuple(t.attrs["perm"]) == (1, 0) else f"transpose {t.name} keeps the axes"

    def replacement(self, m: Match) -> Replacement:
        side = "a" if "ta" in m else "b"
        inputs = list(m.root.inputs)
        inputs[0 if side == "a" else 1] = m[side]
        flag = f"trans_{side}"
        return "gemm", inputs, {**m.root.attrs, flag: not m.root.attrs[flag]}


# ---- the pass ----------------------------------------------------------------------------
class Fuse(PatternPass):
    """Fuse convolutions, matrix products and activations; recognize decomposed layer
    norms, GELUs and softmaxes; fold BN, requantization chains and transposes. Options:
    ``enable`` / ``disable`` (pattern names separated by ``|``), ``max_rewrites``."""

    name = "fuse"
    description = "fuse conv/linear + activation, fold BN, recognize layer_norm/gelu/softmax"
    patterns = (FoldBnIntoConv, FuseConvActivation, FuseQLinearClip, FuseLinearBias,
                FuseLinearActivation, FuseAddRelu, RecognizeLayerNorm, FoldScaleIntoLayerNorm,
                FoldBiasIntoLayerNorm, RecognizeGelu, RecognizeGeluTanh, RecognizeSilu,
                RecognizeHardSigmoid, RecognizeHardSwish, RecognizeGlobalAvgPool, RecognizeSoftmax,
                FoldRequantizeChain, FoldTransposeIntoMatmul, FoldTransposeIntoGemm)
    semantics_preserving = True
    tolerance = max(getattr(p, "tolerance", 0.0) for p in patterns)
