"""fold-qdq: fold QDQ-format quantized graphs into bevir's integer ops, as onnxruntime does.

onnxruntime's ``quantize_static(..., quant_format=QuantFormat.QDQ)`` writes float ops wrapped
in DequantizeLinear -> op -> QuantizeLinear; the importer turns those into ``dequantize``
-> float op -> ``quantize``. onnxruntime (CPU, default optimization level) replaces such
groups by its integer kernels, which round differently from the float ops. This pass folds
exactly the groups onnxruntime folds, into the ops of :mod:`bevir.ops.qlinear` with the same
integer semantics, so that the golden model equals onnxruntime bit for bit. It runs, in
onnxruntime's order:

1. ReluQuantFusion: a ``relu`` whose only user is a per-tensor ``quantize`` with the lowest
   code as zero point is dropped (the saturation does the same); then common subexpression
   elimination (``cse``: dedicated Q/DQ pairs of one tensor become one quantize).
2. EnsureUniqueDQForNodeUnit: a ``dequantize`` read by several consumers is duplicated, one
   per consumer (the nodes an ONNX node was decomposed into share its ``loc`` and count as
   one consumer).
3. QDQS8ToU8 (unless ``int8_allowed``, onnxruntime's x86-64 behaviour): an int8 per-tensor
   ``quantize`` read only by one ``dequantize`` becomes uint8 with the zero point + 128
   (the pair computes the same values).
4. The selectors and actions of QDQSelectorActionTransformer, as patterns (rooted at the
   group's ``quantize``): conv2d -> qlinear_conv; matmul -> qlinear_matmul, or without a
   ``quantize`` after it -> matmul_integer, cast, times a_scale * b_scale
   (MatMulIntegerToFloat); gemm -> QGemm, computed as a 1x1 qlinear_conv between reshapes;
   add, mul -> qlinear_add, qlinear_mul; concat -> qlinear_concat; global_avgpool,
   avgpool2d, sigmoid, leaky relu -> qlinear_global_avgpool, qlinear_avgpool (or
   qlinear_global_avgpool for a window over the whole image), qlinear_sigmoid,
   qlinear_leaky_relu; data movement (reshape, flatten, transpose, squeeze, unsqueeze,
   expand, slice, gather), maxpool2d and nearest resize run on the integers when the
   ``dequantize`` and the ``quantize`` have the same parameters. A group onnxruntime
   declines (dtypes that differ, an int8 convolution input without ``int8_allowed``, a
   linear resize, other parameters...) stays explicit, which is exact too.
5. QDQFinalCleanup: ``dequantize`` -> ``quantize`` with the same parameters is removed.

Groups onnxruntime would fold into a kernel that needs one scale and zero point where the
graph has one per channel raise :class:`~bevir.errors.PassError` naming the node (onnxruntime
cannot run them either).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import AffineQuant, DType, TensorType
from ..ops.qlinear import avgpool_is_global
from .analysis import AnalysisManager
from .cse import CSE
from .patterns import (Match, NoMatch, Op, PatternPass, RewritePattern, Rewriter, const,
                       erase_dead, match_pattern, op)

_Q8 = (DType.i8, DType.u8)
_LOWEST = {DType.i8: -128, DType.u8: 0}


# ---- helpers -----------------------------------------------------------------------------
def _producer(v: Value | None, ops: Sequence[str]) -> Node | None:
    n = None if v is None else v.producer
    return n if n is not None and n.op in ops else None


def _is_output(graph: Graph, v: Value) -> bool:
    return any(o is v for o in graph.outputs.values())


def _per_tensor(t: TensorType) -> bool:
    q = t.quant
    return isinstance(q, AffineQuant) and q.axis is None and len(q.scale) == 1


def _require_per_tensor(v: Value, by: Node, what: str, fused: str) -> None:
    """PassError naming ``by`` unless ``v`` has one scale and zero point."""
    if not _per_tensor(v.type):
        raise PassError(f"{what} must have one scale and zero point (per tensor) to fold "
                        f"into {fused}, as onnxruntime does; got {v.type.quant}",
                        node=by.name, op=by.op, loc=by.loc)


def _out_attrs(q: Node) -> dict:
    """out_dtype/out_scale/out_zero_point of a quantize node's result."""
    return {"out_dtype": q.attrs["dtype"], "out_scale": q.attrs["scale"][0],
            "out_zero_point": q.attrs["zero_point"][0]}


def _replace_keeping_names(graph: Graph, old: Node, new: Node) -> None:
    """Redirect ``old``'s results to ``new``'s, erase ``old``, and give ``new``'s results
    the old names."""
    names = [v.name for v in old.outputs]
    graph.replace_node(old, new.outputs)
    for v, name in zip(new.outputs, names):
        graph.rename(v, name)


# ---- onnxruntime's graph preparation -------------------------------------------------------
def drop_relu_before_quantize(graph: Graph) -> int:
    """ReluQuantFusion: quantize(relu(x)) -> quantize(x) where the quantize saturates at the
    zero point (per tensor, zero point = the lowest code). Returns the number dropped."""
    dropped = 0
    for relu in [n for n in graph.nodes if n.op == "relu"]:
        v = relu.output
        if not relu.inputs[0].type.dtype.is_float or len(v.uses) != 1 or _is_output(graph, v):
            continue
        q, _ = v.uses[0]
        t = q.output.type if q.op == "quantize" else None
        if t is None or not _per_tensor(t) or t.quant.zero_point[0] != _LOWEST.get(t.dtype):
            continue
        q.set_input(0, relu.inputs[0])
        graph.erase(relu)
        dropped += 1
    return dropped


def _consumers(v: Value) -> list[list[tuple[Node, int]]]:
    """The uses of ``v`` grouped by consumer: nodes with the same provenance (the parts of
    one decomposed ONNX node) are one consumer."""
    groups: dict[object, list[tuple[Node, int]]] = {}
    for node, i in v.uses:
        groups.setdefault(node.loc or id(node), []).append((node, i))
    return list(groups.values())


def unique_dequantize(graph: Graph) -> int:
    """EnsureUniqueDQForNodeUnit: give every consumer of a dequantize its own copy (a graph
    output keeps the original). Returns the number of copies made."""
    copies = 0
    for dq in [n for n in graph.nodes if n.op == "dequantize"]:
        v = dq.output
        groups = _consumers(v)
        for uses in groups[0 if _is_output(graph, v) else 1:]:
            dup = graph.create_node("dequantize", dq.inputs, dq.attrs, loc=dq.loc, after=dq,
                                    names=[f"{v.name}_dup"])
            for node, i in uses:
                node.set_input(i, dup.output)
            copies += 1
    return copies


def int8_pairs_to_uint8(graph: Graph) -> int:
    """QDQS8ToU8: an int8 per-tensor quantize whose only user is a dequantize becomes uint8
    (zero point + 128), the dequantize with it; the values the pair computes do not change.
    Returns the number of pairs converted."""
    converted = 0
    for q in [n for n in graph.nodes if n.op == "quantize" and n.attrs["dtype"] == "i8"]:
        v = q.output
        if not _per_tensor(v.type) or len(v.uses) != 1 or _is_output(graph, v):
            continue
        dq, _ = v.uses[0]
        if dq.op != "dequantize":
            continue
        attrs = {**q.attrs, "dtype": "u8", "zero_point": (q.attrs["zero_point"][0] + 128,)}
        nq = graph.create_node("quantize", q.inputs, attrs, loc=q.loc, before=q)
        ndq = graph.create_node("dequantize", [nq.output], loc=dq.loc, before=dq)
        _replace_keeping_names(graph, dq, ndq)
        _replace_keeping_names(graph, q, nq)
        converted += 1
    return converted


def drop_dequantize_quantize(graph: Graph) -> int:
    """QDQFinalCleanup: quantize(dequantize(x)) with the same parameters is x. Returns the
    number of pairs removed."""
    removed = 0
    for dq in [n for n in graph.nodes if n.op == "dequantize"]:
        v = dq.output
        if dq.graph is not graph or len(v.uses) != 1 or _is_output(graph, v):
            continue
        q, _ = v.uses[0]
        x = dq.inputs[0]
        if q.op != "quantize" or not _per_tensor(x.type) or q.output.type != x.type:
            continue
        if _is_output(graph, q.output) and q.output.uses:
            continue
        graph.replace_all_uses(q.output, x)
        erase_dead(graph, [q])
        removed += 1
    return removed


# ---- the fold patterns -----------------------------------------------------------------------
def _dq_operand(i: int) -> Op:
    return op("dequantize", f"x{i}", name=f"dq{i}")


class QDQPattern(RewritePattern):
    """A dequantize -> ``targets`` -> quantize group (onnxruntime's NodeGroup): every operand
    in ``dq_operands`` (all present ones when None) comes from a dequantize used only by the
    target, whose result only the root quantize reads. Bindings: ``target``, ``q``, and per
    operand ``x{i}`` (the integer value) and ``dq{i}``."""

    targets: ClassVar[tuple[str, ...]] = ()
    dq_operands: ClassVar[tuple[int, ...] | None] = None
    roots = ("quantize",)
    int8_allowed: bool = False          # set by the pass

    def match(self, node: Node) -> Match | NoMatch:
        t = _producer(node.inputs[0], self.targets)
        if t is None:
            return NoMatch(f"the quantized value is not produced by {' or '.join(self.targets)}")
        return match_pattern(op("quantize", self.target_pattern(t), name="q"), node)

    def target_pattern(self, t: Node) -> Op:
        wanted = range(len(t.inputs)) if self.dq_operands is None else self.dq_operands
        operands = [None if v is None else _dq_operand(i) if i in wanted else f"x{i}"
                    for i, v in enumerate(t.inputs)]
        return op(t.op, *operands, name="target")

    # ---- helpers for checks and rewrites --------------------------------------------------
    @staticmethod
    def ints(m: Match) -> list[Value | None]:
        """The target's operands with every dequantize looked through."""
        return [m.get(f"x{i}") for i in range(len(m["target"].inputs))]

    @staticmethod
    def dtype_reason(ts: Sequence[TensorType], allowed=_Q8) -> str | None:
        """Why onnxruntime declines: the quantized dtypes differ or are not ``allowed``."""
        dtypes = {t.dtype for t in ts}
        if len(dtypes) != 1:
            return f"the quantized dtypes differ ({', '.join(sorted(map(str, dtypes)))})"
        if dtypes.pop() not in allowed:
            return f"{ts[0].dtype} is not {' or '.join(map(str, allowed))}"
        return None

    def int8_reason(self, x: Value, w: Value) -> str | None:
        """onnxruntime folds convolutions and matrix products of an int8 input only where
        int8 is allowed (ARM), and then only with an int8 weight."""
        if x.type.dtype is DType.i8 and not self.int8_allowed:
            return "int8 input (onnxruntime on x86-64 keeps these in float; int8_allowed=true)"
        if x.type.dtype is DType.i8 and w.type.dtype is not DType.i8:
            return "int8 input with a non-int8 weight"
        return None

    def require_per_tensor(self, m: Match, indices: Sequence[int], fused: str) -> None:
        for i in indices:
            if m.get(f"dq{i}") is not None:
                _require_per_tensor(m[f"x{i}"], m[f"dq{i}"], f"operand {i} of "
                                    f"{m['target'].op}", fused)
        if "q" in m:
            _require_per_tensor(m["q"].output, m["q"], f"the result of {m['target'].op}", fused)

    def emit(self, rw: Rewriter, m: Match, op_name: str, inputs: Sequence[Value | None],
             attrs: dict) -> None:
        """Replace the group's result by ``op_name(inputs){attrs}`` (provenance: the target)."""
        new = rw.create(op_name, inputs, attrs, loc=m["target"].loc)
        rw.replace(m.root, new)


def _bias_reason(b: Value, x: Value, w: Value) -> str | None:
    """onnxruntime folds a convolution bias only if it is int32 with a scale within
    1e-6 + 1% of x_scale * w_scale per channel (measured on onnxruntime 1.32)."""
    if b.type.dtype is not DType.i32:
        return f"the bias is {b.type.dtype}, not i32"
    want = np.float32(x.type.quant.scale[0]) * np.asarray(w.type.quant.scale, np.float32)
    have = np.asarray(b.type.quant.scale, np.float32)
    if not np.all(np.abs(have - want) <= 1e-6 + 1e-2 * np.abs(want)):
        return "the bias scale is not x_scale * w_scale"
    return None


class FoldConv(QDQPattern):
    """Conv -> QLinearConv (ConvNodeGroupSelector, ConvReplaceWithQLinear). The bias is the
    int32 input of its dequantize, as onnxruntime takes it (see _bias_reason)."""

    name = "qdq-conv"
    targets = ("conv2d",)

    def check(self, m: Match) -> str | None:
        x, w, b = self.ints(m)
        reason = (self.dtype_reason([x.type, m["q"].output.type]) or self.int8_reason(x, w)
                  or self.dtype_reason([w.type]))
        if reason is None and b is not None:
            reason = _bias_reason(b, x, w)
        if reason is None:
            self.require_per_tensor(m, [0], "qlinear_conv")
            if w.type.quant.axis not in (None, 0):
                raise PassError(f"the weight is quantized along axis {w.type.quant.axis}; "
                                "qlinear_conv takes per-output-channel (axis 0) weights",
                                node=m["dq1"].name, op="dequantize", loc=m["dq1"].loc)
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        t = m["target"]
        conv = {k: t.attrs[k] for k in ("strides", "pads", "dilations", "groups")}
        self.emit(rw, m, "qlinear_conv", self.ints(m), {**conv, **_out_attrs(m["q"])})


class FoldMatMul(QDQPattern):
    """MatMul -> QLinearMatMul (MatMulNodeGroupSelector with a Q)."""

    name = "qdq-matmul"
    targets = ("matmul",)

    def check(self, m: Match) -> str | None:
        a, b = self.ints(m)
        reason = (self.dtype_reason([a.type, m["q"].output.type]) or self.int8_reason(a, b)
                  or self.dtype_reason([b.type]))
        if reason is None:
            self.require_per_tensor(m, [0], "qlinear_matmul")
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        self.emit(rw, m, "qlinear_matmul", self.ints(m), _out_attrs(m["q"]))


class FoldMatMulToFloat(QDQPattern):
    """DQ -> MatMul with no Q after it -> MatMulIntegerToFloat: the exact int32 product,
    converted to float32, times the float32 a_scale * b_scale (per column of b)."""

    name = "qdq-matmul-to-float"
    targets = ("matmul",)
    roots = ("matmul",)

    def match(self, node: Node) -> Match | NoMatch:
        if any(u.op == "quantize" for u in node.output.users):
            return NoMatch("a quantize reads the product (qdq-matmul's group)")
        return match_pattern(self.target_pattern(node), node)

    def check(self, m: Match) -> str | None:
        a, b = self.ints(m)
        reason = (self.dtype_reason([a.type]) or self.dtype_reason([b.type])
                  or self.int8_reason(a, b))
        if reason is None:
            self.require_per_tensor(m, [0], "matmul_integer")
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        a, b = self.ints(m)
        scale = np.float32(a.type.quant.scale[0]) * np.asarray(b.type.quant.scale, np.float32)
        loc = m["target"].loc
        acc = rw.create("matmul_integer", [a, b], loc=loc).output
        real = rw.create("cast", [acc], {"to": "f32"}, loc=loc).output
        self.emit(rw, m, "mul", [real, rw.const(scale, f"{m.root.output.name}_scale")], {})


class FoldGemm(QDQPattern):
    """Gemm -> QGemm (GemmNodeGroupSelector, GemmReplaceWithQuant): the int32 accumulator
    of (a - a_zp)(b - b_zp) + bias requantized by MlasRequantizeOutput with the float32
    multiplier a_scale * b_scale / y_scale, which is qlinear_conv's 1x1 convolution of
    a [M, K, 1, 1] with the weight as [N, K, 1, 1]. The bias's scale is not checked."""

    name = "qdq-gemm"
    targets = ("gemm",)

    def check(self, m: Match) -> str | None:
        t, (a, b, c) = m["target"], self.ints(m)
        reason = self.dtype_reason([a.type, m["q"].output.type]) or self.dtype_reason([b.type])
        if reason is None and a.type.dtype is DType.i8 and b.type.dtype is not DType.i8:
            reason = "int8 input with a non-int8 weight"
        if reason is None and c is not None and (t.attrs["beta"] != 1.0
                                                 or c.type.dtype is not DType.i32):
            reason = "the bias is not i32 with beta = 1"
        return reason or self.representable(m)

    def representable(self, m: Match) -> str | None:
        """What bevir's 1x1 qlinear_conv form needs beyond onnxruntime's selector."""
        t, (_, b, c) = m["target"], self.ints(m)
        n = b.type.shape[0 if t.attrs["trans_b"] else 1]
        if t.attrs["alpha"] != 1.0 or t.attrs["trans_a"]:
            return "not representable: alpha != 1 or trans_a"
        if not b.is_const or b.type.quant.axis not in (None, 0 if t.attrs["trans_b"] else 1):
            return "not representable: the weight is not a constant quantized per column"
        if c is not None and c.type.shape != (n,):
            return f"not representable: the bias is not [{n}]"
        self.require_per_tensor(m, [0], "QGemm")
        return None

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        t, (a, b, c) = m["target"], self.ints(m)
        w = b.const if t.attrs["trans_b"] else b.const.T
        q = b.type.quant
        wq = AffineQuant(q.scale, q.zero_point, None if q.axis is None else 0)
        w4 = rw.const(w.reshape(w.shape + (1, 1)), f"{b.name}_nk11",
                      TensorType(w.shape + (1, 1), b.type.dtype, quant=wq))
        loc = t.loc
        a4 = rw.create("reshape", [a], {"shape": a.type.shape + (1, 1)}, loc=loc).output
        y = rw.create("qlinear_conv", [a4, w4, c], _out_attrs(m["q"]), loc=loc).output
        self.emit(rw, m, "reshape", [y], {"shape": m.root.output.type.shape})


class FoldBinary(QDQPattern):
    """Add, Mul -> QLinearAdd, QLinearMul (BinaryNodeGroupSelector)."""

    name = "qdq-add-mul"
    targets = ("add", "mul")

    def check(self, m: Match) -> str | None:
        reason = self.dtype_reason([v.type for v in self.ints(m)] + [m["q"].output.type])
        if reason is None:
            self.require_per_tensor(m, [0, 1], f"qlinear_{m['target'].op}")
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        self.emit(rw, m, f"qlinear_{m['target'].op}", self.ints(m), _out_attrs(m["q"]))


class FoldConcat(QDQPattern):
    """Concat -> QLinearConcat (VariadicNodeGroupSelector)."""

    name = "qdq-concat"
    targets = ("concat",)

    def check(self, m: Match) -> str | None:
        xs = self.ints(m)
        reason = self.dtype_reason([v.type for v in xs] + [m["q"].output.type])
        if reason is None:
            self.require_per_tensor(m, range(len(xs)), "qlinear_concat")
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        axis = m["target"].attrs["axis"]
        self.emit(rw, m, "qlinear_concat", self.ints(m), {"axis": axis, **_out_attrs(m["q"])})


class FoldUnary(QDQPattern):
    """GlobalAveragePool, AveragePool, Sigmoid -> QLinearGlobalAveragePool,
    QLinearAveragePool, QLinearSigmoid (UnaryNodeGroupSelector; the action copies the
    pool's attributes). An average pool whose window covers the whole unpadded image
    becomes qlinear_global_avgpool, as onnxruntime's QLinearAveragePool computes it."""

    name = "qdq-unary"
    targets = ("global_avgpool", "avgpool2d", "sigmoid")
    _FUSED: ClassVar[dict[str, str]] = {"global_avgpool": "qlinear_global_avgpool",
                                        "avgpool2d": "qlinear_avgpool",
                                        "sigmoid": "qlinear_sigmoid"}
    _POOL: ClassVar[tuple[str, ...]] = ("kernel", "strides", "pads", "ceil_mode",
                                        "count_include_pad")

    def check(self, m: Match) -> str | None:
        t = m["target"]
        reason = self.dtype_reason([self.ints(m)[0].type, m["q"].output.type])
        if reason is None and t.op == "avgpool2d" and any(d != 1 for d in t.attrs["dilations"]):
            reason = "not representable: a dilated average pool (QLinearAveragePool has none)"
        if reason is None:
            self.require_per_tensor(m, [0], self._FUSED[t.op])
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        t, x = m["target"], self.ints(m)[0]
        out = _out_attrs(m["q"])
        del out["out_dtype"]
        fused = self._FUSED[t.op]
        if t.op == "avgpool2d":
            if avgpool_is_global(x.type, t.attrs["kernel"], t.attrs["pads"]):
                fused = "qlinear_global_avgpool"
            else:
                out |= {k: t.attrs[k] for k in self._POOL}
        self.emit(rw, m, fused, [x], out)


class FoldLeakyRelu(QDQPattern):
    """LeakyRelu -> QLinearLeakyRelu. The importer writes LeakyRelu as
    where(less(x, 0), mul(x, alpha), x); x must be a dequantize read only by those."""

    name = "qdq-leaky-relu"
    targets = ("where",)

    def target_pattern(self, t: Node) -> Op:
        return op("where", op("less", "d", const("zero")),
                  op("mul", "d", const("alpha"), commutative=True), "d", name="target")

    def check(self, m: Match) -> str | None:
        d, target = m["d"], m["target"]
        dq = _producer(d, ("dequantize",))
        if dq is None or len(d.uses) != 3 or _is_output(target.graph, d):
            return "x is not a dequantize read only by the leaky relu"
        if m["zero"].const.size != 1 or m["zero"].const.item() != 0 \
                or m["alpha"].const.size != 1:
            return "not a leaky relu: compares with a non-zero or scales by a non-scalar"
        m.bindings["x0"], m.bindings["dq0"] = dq.inputs[0], dq
        reason = self.dtype_reason([dq.inputs[0].type, m["q"].output.type])
        if reason is None:
            self.require_per_tensor(m, [0], "qlinear_leaky_relu")
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        out = _out_attrs(m["q"])
        del out["out_dtype"]
        alpha = float(m["alpha"].const.item())
        self.emit(rw, m, "qlinear_leaky_relu", [m["x0"]], {**out, "alpha": alpha})


class DropQDQ(QDQPattern):
    """Data movement, MaxPool and nearest Resize on the integers (DropQDQNodesSelector):
    the dequantize and the quantize must have the same per-tensor parameters (MaxPool and
    Resize: 8-bit only). onnxruntime keeps the QDQ around a linear or cubic Resize
    (measured on onnxruntime 1.32; interpolating the codes would round differently)."""

    name = "qdq-drop"
    targets = ("reshape", "flatten", "transpose", "squeeze", "unsqueeze", "expand", "slice",
               "gather", "maxpool2d", "resize")
    dq_operands = (0,)

    def check(self, m: Match) -> str | None:
        t, x, y = m["target"], m["x0"].type, m["q"].output.type
        if t.op == "resize" and t.attrs["mode"] != "nearest":
            return f"a {t.attrs['mode']} resize (onnxruntime drops the QDQ of nearest only)"
        allowed = _Q8 if t.op in ("maxpool2d", "resize") else _Q8 + (DType.i16,)
        reason = self.dtype_reason([x, y], allowed)
        if reason is None and (not _per_tensor(x) or x.quant != y.quant):
            reason = "the dequantize and the quantize have different parameters"
        return reason

    def rewrite(self, rw: Rewriter, m: Match) -> None:
        t = m["target"]
        self.emit(rw, m, t.op, self.ints(m), dict(t.attrs))


# ---- the pass ----------------------------------------------------------------------------
class FoldQDQ(PatternPass):
    """Fold dequantize -> op -> quantize groups into integer ops exactly where onnxruntime's
    CPU QDQ transformers do (see the module docstring). ``int8_allowed``: onnxruntime's
    ``session.qdqisint8allowed``; false (x86-64) keeps int8-input convolutions and matrix
    products in float and turns single int8 Q/DQ pairs into uint8, true (ARM) does not."""

    name = "fold-qdq"
    description = "fold QDQ-format groups into integer ops as onnxruntime does"
    patterns = (FoldConv, FoldMatMul, FoldMatMulToFloat, FoldGemm, FoldBinary, FoldConcat,
                FoldUnary, FoldLeakyRelu, DropQDQ)

    int8_allowed: bool = False

    def active_patterns(self) -> list[RewritePattern]:
        """The enabled patterns, told whether int8 is allowed."""
        pats = super().active_patterns()
        for p in pats:
            p.int8_allowed = self.int8_allowed
        return pats

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        """Prepare the graph as onnxruntime's level-1 transformers do, fold, clean up."""
        self._count("relu-dropped", drop_relu_before_quantize(graph))
        cse = CSE()
        cse.run(graph, am)
        self._count("merged", cse.statistics.get("merged", 0))
        self._count("dequantize-copied", unique_dequantize(graph))
        if not self.int8_allowed:
            self._count("int8-pairs-to-uint8", int8_pairs_to_uint8(graph))
        super().run(graph, am)
        self._count("dequantize-quantize-removed", drop_dequantize_quantize(graph))
        for name, st in self.pattern_stats.items():
            self._count(f"{name}.declined", st.declined)

    def _count(self, counter: str, n: int) -> None:
        if n:
            self.stat(counter, n)
