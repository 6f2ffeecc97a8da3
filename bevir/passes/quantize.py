"""quantize: lower calibrated float ops to bevir's fixed-point integer ops, by a QuantConfig.

Each float op with a lowering rule below, whose inputs and result have calibrated ranges
(:func:`bevir.calibrate`, or a seeded tranges file) and whose config rule does not
exclude it, becomes its ``fx_*`` op:

- activations: i8 with power-of-two frac bits ``f = floor(log2(127 / max|range|))``
  (symmetric), chosen per value from its calibrated range; i16 (``32767`` for ``127``)
  for the ops of a rule with ``activations="fixed16"`` whose fx op takes 16-bit operands
  (its ``x_dtypes``). Where an operand's codes have the other width, they are
  requantized (``fx_requantize``), never passed through float;
- weights: symmetric int8, per tensor or per output channel as the rule says, scale
  ``max|w| / 127`` (float32), codes ``round_half_even(w / scale)``; biases: int32 in the
  accumulator's units (``round(b / (scale * 2**-f_x))``).

Values cross between the float and the integer parts through ``fx_quantize`` and
``fx_dequantize``, so a graph is quantized as far as the lowerings reach and stays
runnable; ``fx_quantize(fx_dequantize(q))`` of the same frac bits is ``q``.

Lowered so far: ``matmul_act`` and ``gemm`` (constant weight; ``trans_b`` or not, no alpha,
beta or ``trans_a``; a fused relu or gelu becomes fx_relu / fx_gelu), ``matmul`` by a
constant 2-D weight, ``conv2d`` and ``conv2d_act`` (relu) with constant weights,
``relu``, ``add`` of two activations, ``sigmoid``, ``softmax`` (``fx_softmax``, out frac
bits within 1..7), ``layer_norm`` over the last axis with constant scale (i16 fixed) and
bias (i32 fixed).

Statistics: ``lowered-<op>`` per op, ``float-left`` (compute ops of the kinds above left
in float: excluded or uncalibrated), ``affine-left`` (ops of rules with
``activations="affine"``: their quantization is onnxruntime's, imported from the INT8
ONNX model, not made here), ``activations-i16`` (ops lowered with 16-bit activations),
``exact-i16`` (sums, and concats of them, kept exact in 16 bits for the tables that read
them; tables read only by such sums, giving 16 bits).
"""
from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import AffineQuant, DType, FixedPointQuant, TensorType
from ..ops import get_op
from ..ops.fixed_point import FxLookup
from ..ops.numerics import NORM_FRAC, quantize_fixed
from .accumulators import accumulator_bounds
from .analysis import AnalysisManager
from .calibrate import ranges_of
from .core import Pass
from .quant_config import QuantConfig, Rule

F32 = np.float32


def _most_frac_bits(amax: float, top: int, lo: int, hi: int, empty: int) -> int:
    """The largest f in [lo, hi] with amax * 2**f <= top (``empty`` when amax is 0)."""
    f = empty if amax == 0 else math.floor(math.log2(top / amax))
    return max(lo, min(hi, f))


def frac_bits_for(lo: float, hi: float) -> int:
    """The largest frac bits f with max(|lo|, |hi|) * 2**f <= 127 (7 for an all-zero range),
    within [-31, 31]."""
    amax = max(abs(lo), abs(hi))
    if not math.isfinite(amax):
        raise PassError(f"range [{lo}, {hi}] is not finite")
    return _most_frac_bits(amax, 127, -31, 31, 7)


def quantize_weight(w: np.ndarray, per_channel: bool) -> tuple[np.ndarray, AffineQuant]:
    """Symmetric int8 codes of a [N, ...] weight and their quantization (per output channel,
    axis 0, when ``per_channel``): scale max|w| / 127 in float32, round half to even, clip
    to +-127."""
    flat = w.reshape(w.shape[0], -1)
    amax = np.abs(flat).max(axis=1) if per_channel else np.abs(w).max().reshape(1)
    scale = np.where(amax > 0, amax / F32(127), F32(1)).astype(F32)
    per = scale.reshape((-1,) + (1,) * (w.ndim - 1)) if per_channel else scale[0]
    codes = np.clip(np.rint(w / per), -127, 127)
    return codes.astype(np.int8), AffineQuant(tuple(scale.tolist()), (0,) * scale.size,
                                              0 if per_channel else None)


def fixed_const(a: np.ndarray, dtype, max_frac: int = 31, min_frac: int = -31
                ) -> tuple[np.ndarray, int]:
    """A constant as fixed-point codes of ``dtype``: the most frac bits (within
    [min_frac, max_frac]) that keep max|a| representable, round half up."""
    f = _most_frac_bits(float(np.abs(a).max(initial=0.0)), np.iinfo(dtype).max, min_frac,
                        max_frac, max_frac)
    return quantize_fixed(a, f, dtype), f


def _fixed_type(codes: np.ndarray, frac: int) -> TensorType:
    return TensorType(codes.shape, DType.from_numpy(codes.dtype), quant=FixedPointQuant((frac,)))


#: data movement a fixed-point value goes through unchanged (operand 0 is the data)
#: sampling locations (normalized) are i32 fixed; beyond +-LOC_BOUND they saturate, which
#: samples nothing as the exact value would (the image spans [0, 1])
LOC_BOUND = 128.0
#: the most a term of the location arithmetic may reach (calibrated) for that to hold
LOC_TERM_BOUND = LOC_BOUND / 2


def _reachable(graph: Graph, names: tuple[str, ...]) -> set[Node] | None:
    """The nodes that depend on the graph inputs called ``names`` (None: no restriction)."""
    starts = [v for v in graph.inputs if v.name in names]
    if not names or not starts:
        return None
    seen: set[Node] = set()
    stack = list(starts)
    while stack:
        for user in stack.pop().users:
            if user not in seen:
                seen.add(user)
                stack.extend(user.outputs)
    return seen


def _integer_valued(v: Value) -> bool:
    """Whether ``v`` holds integers by construction: a cast of integers or booleans, an
    integral constant, or max/min/sum/add of such (e.g. a count of cameras)."""
    if v.is_const:
        return bool(np.all(np.mod(v.const, 1) == 0))
    p = v.producer
    if p is None:
        return False
    if p.op == "cast":
        return not p.inputs[0].type.dtype.is_float
    return p.op in ("max", "min", "add", "reduce_sum", "reduce_max", "reduce_min") and all(
        _integer_valued(x) for x in p.inputs if x is not None)


def _takes_x(op: str, dtype: DType, shape: tuple[int, ...]) -> bool:
    """Whether fx op ``op`` takes an x operand of ``dtype`` and ``shape``: its ``takes_x``
    where it has limits beyond the dtype, else its ``x_dtypes``."""
    spec = get_op(op)
    takes = getattr(spec, "takes_x", None)
    return takes(dtype, shape) if takes else dtype in getattr(spec, "x_dtypes", ())


#: the other activation width a value's codes may be requantized from
_OTHER_WIDTH = {DType.i8: DType.i16, DType.i16: DType.i8}

#: the lowering strategies ops name in their ``fixed_point`` interface (methods of _Lowering)
STRATEGIES = ("product", "unary", "binary", "mul", "div", "reduce", "clip", "log", "softmax",
              "concat", "layer_norm", "deform_attn")
#: strategies that take a chain of float producers with them: they run first
CHAIN_STRATEGIES = ("deform_attn", "log")


class _Lowering:
    """The state of one quantize run: the graph, ranges, config and the i8 twins of values."""

    def __init__(self, graph: Graph, config: QuantConfig, stat: Callable[[str], None]):
        ranges = ranges_of(graph)
        if ranges is None:
            raise PassError("quantize needs calibrated ranges: run bevir.calibrate(graph, "
                            "inputs) or the calibrate pass first")
        self.graph, self.ranges, self.config, self.stat = graph, ranges, config, stat
        self.twins: dict[tuple[Value, str], Value] = {}     # (float value, dtype) -> fixed
        self.active = _reachable(graph, config.sources)

    def is_active(self, node: Node | None) -> bool:
        """Whether ``node`` computes on the quantized sources (the image, prev_bev)."""
        return node is not None and (self.active is None or node in self.active)

    def frac(self, v: Value, dtype=np.int8, bound: float | None = None) -> int | None:
        """The frac bits for float value ``v`` in ``dtype`` (its range capped at ``bound``),
        or None without a calibrated range."""
        e = self.ranges.get(v)
        if e is None:
            return None
        amax = max(abs(e.lo), abs(e.hi))
        if not math.isfinite(amax) and bound is None:
            raise PassError(f"range [{e.lo}, {e.hi}] of %{v.name} is not finite")
        amax = amax if bound is None else min(amax, bound)
        return _most_frac_bits(amax, np.iinfo(dtype).max, -31, 31, 7)

    def _create(self, op: str, inputs: list, attrs: dict, at: Node, after: Node | None = None
                ) -> Value:
        where = {"after": after} if after is not None else {"before": at}
        return self.graph.create_node(op, inputs, attrs, loc=at.loc, **where).output

    def const(self, v: Value, dtype=np.int8, frac: int | None = None,
              reciprocal: bool = False) -> Value:
        """A float constant (or its reciprocal) as fixed-point codes of ``dtype``, with its
        own frac bits unless given."""
        a = np.asarray(v.const, np.float64)
        a = 1.0 / a if reciprocal else a
        codes, f = fixed_const(a, dtype) if frac is None else (quantize_fixed(a, frac, dtype), frac)
        name = f"{v.name}.{'recip' if reciprocal else 'q'}"
        return self.graph.add_const(codes, self.graph.unique_name(name), _fixed_type(codes, f))

    def twin(self, v: Value, dtype: DType) -> Value | None:
        """The fixed codes ``v`` was dequantized from, through data movement (recreated on
        the integers), or None."""
        src = v.producer
        if src is None:
            return None
        if src.op == "fx_dequantize":
            q = src.inputs[0]
            return q if q.type.dtype is dtype else None
        if src.opdef.moves_data and not src.inputs[0].is_const:
            inner = self.twin(src.inputs[0], dtype)
            if inner is not None and inner.type.quant.axis is None:
                return self._create(src.op, [inner, *src.inputs[1:]], src.attrs, src, after=src)
        return None

    def fixed(self, v: Value, node: Node, dtype: DType = DType.i8, frac: int | None = None,
              bound: float | None = None) -> Value | None:
        """``v`` as fixed point of ``dtype`` before ``node``: a quantized constant, the codes
        it was dequantized from, those codes requantized (8 <-> 16 bits), or an fx_quantize
        (None without a calibrated range)."""
        if v.is_const:
            return self.const(v, dtype.np, frac)
        key = (v, dtype.value)
        if key not in self.twins:
            t = self.twin(v, dtype)
            other = self.twin(v, _OTHER_WIDTH[dtype]) \
                if t is None and frac is None and dtype in _OTHER_WIDTH else None
            if other is not None:                       # 8 bits more or fewer, by a shift
                shift = 8 if dtype is DType.i16 else -8
                f = max(-31, min(31, other.type.quant.frac_bits[0] + shift))
                t = self._create("fx_requantize", [other], {"out_frac_bits": f,
                                 "out_dtype": dtype.value}, node, after=other.producer)
            elif t is None or (frac is not None and t.type.quant.frac_bits[0] != frac):
                f = self.frac(v, dtype.np, bound) if frac is None else frac
                if f is None:
                    return None
                t = self._create("fx_quantize", [v], {"out_frac_bits": f, "out_dtype": dtype.value},
                                 node, after=v.producer)
            self.twins[key] = t
        return self.twins[key]

    def width(self, node: Node, rule: Rule, fy: int, *ops: str) -> tuple[DType, dict]:
        """(the activation dtype, the result attributes) of ``node`` lowered to ``ops``: i16
        where the rule asks for 16-bit activations and every op takes them (its
        ``x_dtypes``, or its ``takes_x`` for node's first operand), else i8 at ``fy``."""
        if rule.activations != "fixed16" or not all(
                _takes_x(op, DType.i16, node.inputs[0].type.shape) for op in ops):
            return DType.i8, {"out_frac_bits": fy}
        self.stat("activations-i16")
        return DType.i16, {"out_frac_bits": self.frac(node.output, np.int16), "out_dtype": "i16"}

    def replace(self, node: Node, op: str, inputs: list[Value | None], attrs: dict,
                then: str | None = None, then_attrs: dict | None = None) -> None:
        """Swap ``node`` for ``op(inputs){attrs}`` (followed by the unary fx op ``then``, at
        the same frac bits) and an fx_dequantize for its float users."""
        g = self.graph
        new = g.create_node(op, inputs, attrs, loc=node.loc, before=node)
        if then is not None:
            new = g.create_node(then, [new.output], {"out_frac_bits": attrs["out_frac_bits"],
                                                     **(then_attrs or {})},
                                loc=node.loc, before=node)
        self._swap(node, new.output)

    def _swap(self, node: Node, fixed: Value) -> None:
        """Replace ``node``'s float result by ``fx_dequantize(fixed)``; ``fixed`` takes over
        the result's name (per-layer comparisons match values by name)."""
        g = self.graph
        name = node.output.name
        back = g.create_node("fx_dequantize", [fixed], loc=node.loc, before=node)
        g.replace_all_uses(node.output, back.output)
        g.erase(node)
        g.rename(fixed, name)
        self.stat(f"lowered-{node.op}")

    def operands(self, node: Node, values=None, dtype: DType = DType.i8) -> list[Value] | None:
        """The operands as ``dtype`` fixed (constants quantized), or None if one is
        uncalibrated."""
        qs = [self.fixed(v, node, dtype) for v in (node.inputs if values is None else values)]
        return None if None in qs else qs

    # ---- lowerings: (node, rule, out frac) -> None, or a reason to leave it float -----------
    def product(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        conv = node.op in ("conv2d", "conv2d_act")
        x, w, b, trans_b = _conv_parts(node) if conv else _linear_parts(node)
        act = node.attrs.get("activation", "none")
        if w is None:
            return self.activation_product(node, fy)
        spec = None if act == "none" else get_op(act).activation
        if spec is not None and spec.fixed is None:
            return f"activation {act} has no fixed-point lowering"
        target = "fx_conv2d" if conv else "fx_linear"
        dt, out = self.width(node, rule, fy, target, *([spec.fixed] if spec else []))
        xq = self.fixed(x, node, dt)
        if xq is None:
            return "uncalibrated input"
        wt = w.const if trans_b or conv else w.const.T            # [N, K] / [O, C, KH, KW]
        codes, wq = quantize_weight(np.ascontiguousarray(wt, F32), rule.weights == "per_channel")
        g = self.graph
        wv = g.add_const(codes, f"{w.name}.q", TensorType(codes.shape, DType.i8, quant=wq))
        inputs = [xq, wv]
        if b is not None:
            fx = xq.type.quant.frac_bits[0]
            acc = np.asarray(wq.scale, np.float64) * 2.0 ** -fx
            bq = np.clip(np.rint(b.const.astype(np.float64) / acc), -2**31, 2**31 - 1)
            inputs.append(g.add_const(bq.astype(np.int32), f"{b.name}.q"))
        attrs = {k: node.attrs[k] for k in ("strides", "pads", "dilations", "groups")} \
            if conv else {}
        if act == "none" and dt is DType.i8:
            out.update(self.result_width(node, fy))
        then_attrs = {a: node.attrs[f] for a, f in spec.attrs} if spec else {}
        if spec is not None and dt is DType.i16:
            then_attrs["out_dtype"] = "i16"
        self.replace(node, target, inputs, {**out, **attrs}, spec and spec.fixed, then_attrs)
        return None

    def activation_product(self, node: Node, fy: int) -> str | None:
        """matmul of two activations (attention scores, attention times values)."""
        if node.op != "matmul" or any(v.is_const for v in node.inputs):
            return "not a product by a constant weight or of two activations"
        a = self.twin(node.inputs[0], DType.i16) or self.fixed(node.inputs[0], node)
        b = self.fixed(node.inputs[1], node)
        if a is None or b is None:
            return "uncalibrated input"
        self.replace(node, "fx_matmul", [a, b], {"out_frac_bits": fy,
                                                  **self.result_width(node, fy)})
        return None

    def result_width(self, node: Node, fy: int) -> dict:
        """A product read only by softmaxes (attention scores) keeps 16 bits: an 8-bit
        score of a wide logit range would be too coarse for the exponentials."""
        if not _feeds(node.output, ("softmax",)):
            return {}
        return {"out_dtype": "i16", "out_frac_bits": self.frac(node.output, np.int16)}

    def unary(self, node: Node, rule: Rule, fy: int, target: str) -> str | None:
        dt, out = self.width(node, rule, fy, target)
        table = _is_table(target)
        wide = self.twin(node.inputs[0], DType.i16) if table else None
        qs = [wide] if wide is not None else self.operands(node, node.inputs[:1], dt)
        if qs is None:
            return "uncalibrated input"
        self.replace(node, target, qs, self.table_width(node, dt, out) if table else out)
        return None

    def table_width(self, node: Node, dt: DType, out: dict) -> dict:
        """A table's result attributes: 16 bits where only exact sums read it (they keep 16
        bits anyway, and a table of 16-bit entries costs what one of 8-bit entries does)."""
        if dt is not DType.i8 or not _all_uses(node.output, lambda u, i: _exact_sum(u)):
            return out
        self.stat("exact-i16")
        return {"out_dtype": "i16", "out_frac_bits": self.frac(node.output, np.int16)}

    def binary(self, node: Node, rule: Rule, fy: int, target: str) -> str | None:
        if all(v.is_const for v in node.inputs):
            return "both operands are constants"
        dt, out = self.width(node, rule, fy, target)
        exact = dt is DType.i8 and _exact_sum(node)
        qs = self.wide_operands(node) if exact else self.operands(node, None, dt)
        if qs is None:
            return "uncalibrated input"
        self.replace(node, target, qs, self.exact_width(node.output, qs) if exact else out)
        return None

    def wide_operands(self, node: Node) -> list[Value] | None:
        """The operands as fixed point for an op that keeps 16 bits: their codes where
        they have them (16 or 8 bits), else quantized to 16 bits (None if one is
        uncalibrated)."""
        qs = [self.twin(v, DType.i16) or self.twin(v, DType.i8) or self.fixed(v, node, DType.i16)
              for v in node.inputs]
        return None if None in qs else qs

    def exact_width(self, v: Value, qs: list[Value]) -> dict:
        """The result attributes of ``v``, a sum read only by tables, that keep every bit of
        its operands ``qs``, in 16 bits: a table takes 16-bit codes at the cost of 8-bit
        ones, and rounding a sum of operands with finer frac bits (half up) would bias it
        by up to a quarter step, which a loop such as the decoder's box refinement
        (sigmoid(delta + inverse_sigmoid(ref))) accumulates."""
        exact = max(q.type.quant.frac_bits[0] for q in qs)
        self.stat("exact-i16")
        return {"out_dtype": "i16", "out_frac_bits": min(exact, self.frac(v, np.int16))}

    def mul(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        a, b = node.inputs
        if a.is_const:
            a, b = b, a
        if a.is_const:
            return "both operands are constants"
        dt, out = self.width(node, rule, fy, "fx_mul")
        aq = self.fixed(a, node, dt)
        bq = self.const(b, np.int16) if b.is_const else self.fixed(b, node, dt)
        if aq is None or bq is None:
            return "uncalibrated input"
        self.replace(node, "fx_mul", [aq, bq], out)
        return None

    def div(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        x, d = node.inputs
        xq = self.fixed(x, node) if not x.is_const else None
        if xq is None:
            return "uncalibrated or constant dividend"
        if d.is_const:
            if np.any(d.const == 0):
                return "divides by a constant with zeros"
            self.replace(node, "fx_mul", [xq, self.const(d, np.int16, reciprocal=True)],
                         {"out_frac_bits": fy})
            return None
        e = self.ranges.get(d)
        if not _integer_valued(d) or e is None or e.hi > 1 << 16:
            return "the divisor is neither a constant nor a count"
        count = self._create("cast", [d], {"to": "i32", "saturate": True}, node)
        self.replace(node, "fx_div", [xq, count], {"out_frac_bits": fy,
                                                    "max_count": max(255, math.ceil(e.hi))})
        return None

    def reduce(self, node: Node, rule: Rule, fy: int, target: str) -> str | None:
        qs = self.operands(node)
        if qs is None:
            return "uncalibrated input"
        self.replace(node, target, qs, {"axes": node.attrs["axes"],
                                        "keepdims": node.attrs["keepdims"], "out_frac_bits": fy})
        return None

    def clip(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        """clip on the codes, the bounds rounded to the input's frac bits."""
        xq = self.fixed(node.inputs[0], node)
        if xq is None:
            return "uncalibrated input"
        f = xq.type.quant.frac_bits[0]
        bounds = {k: float(np.clip(np.floor(node.attrs[k] * 2.0 ** f + 0.5), -128, 127))
                  for k in ("min", "max") if node.attrs.get(k) is not None}
        self._swap(node, self._create("clip", [xq], bounds, node))
        return None

    def log(self, node: Node, rule: Rule, fy: int, target: str) -> str | None:
        """BEVFormer's inverse_sigmoid (log(max(x, eps) / max(1 - x, eps)) of x clamped to
        [0, 1]) as one table; another log as ``target`` (fx_log)."""
        x, eps = _inverse_sigmoid(node)
        if x is None:
            return self.unary(node, rule, fy, target)
        dt, out = self.width(node, rule, fy, "fx_inverse_sigmoid")
        xq = self.fixed(x, node, dt)
        if xq is None:
            return "uncalibrated input"
        self.replace(node, "fx_inverse_sigmoid", [xq], {**self.table_width(node, dt, out), "eps": eps})
        return None

    def softmax(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        xq = self.twin(node.inputs[0], DType.i16) or self.fixed(node.inputs[0], node)
        if xq is None:
            return "uncalibrated input"
        # probabilities that weight values in a matmul (attention) keep 16 bits
        wide = _feeds(node.output, ("matmul",), operand=0)
        self.replace(node, "fx_softmax", [xq], {
            "axis": node.attrs["axis"], "out_dtype": "i16" if wide else "i8",
            "out_frac_bits": 15 if wide else max(1, min(7, fy))})
        return None

    def concat(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        """concat on the codes, each operand requantized to the result's frac bits; in 16
        bits, keeping every bit, where some operands are exact sums on their way to a
        table (see exact_width)."""
        qs = self.wide_operands(node) if _read_by_tables(node.output) else self.operands(node)
        if qs is None:
            return "uncalibrated input"
        out = {"out_frac_bits": fy} if all(q.type.dtype is DType.i8 for q in qs) else \
            self.exact_width(node.output, qs)
        qs = [q if (q.type.quant.frac_bits[0], q.type.dtype.value) ==
              (out["out_frac_bits"], out.get("out_dtype", "i8")) else
              self._create("fx_requantize", [q], out, node) for q in qs]
        self._swap(node, self._create("concat", qs, node.attrs, node))
        return None

    def layer_norm(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        x, scale, bias = (list(node.inputs) + [None, None])[:3]
        if node.attrs["axis"] not in (-1, x.type.rank - 1):
            return "normalizes another axis than the last"
        if any(p is not None and not p.is_const for p in (scale, bias)):
            return "scale or bias is not a constant"
        dt, out = self.width(node, rule, fy, "fx_layer_norm")
        xq = self.fixed(x, node, dt)
        if xq is None:
            return "uncalibrated input"
        g = self.graph
        inputs = [xq, None, None]
        fg = 0
        if scale is not None:
            codes, fg = fixed_const(scale.const, np.int16)
            inputs[1] = g.add_const(codes, f"{scale.name}.q", _fixed_type(codes, fg))
        if bias is not None:
            # bias frac bits: aligned with the Q16 normalized value times the scale when the
            # int32 holds it, else fewer (the shift stays within [0, 31])
            fb_max = NORM_FRAC + fg
            codes, fb = fixed_const(bias.const, np.int32, max_frac=fb_max, min_frac=fb_max - 31)
            inputs[2] = g.add_const(codes, f"{bias.name}.q", _fixed_type(codes, fb))
        while inputs and inputs[-1] is None:
            inputs.pop()
        self.replace(node, "fx_layer_norm", inputs, {"epsilon": node.attrs["epsilon"], **out})
        return None

    # ---- deformable attention ---------------------------------------------------------------
    def deform_attn(self, node: Node, rule: Rule, fy: int, target: None) -> str | None:
        value, loc, aw = node.inputs
        vq, aq = self.fixed(value, node), self.fixed(aw, node)
        if vq is None or aq is None:
            return "uncalibrated input"
        f = _most_frac_bits(LOC_BOUND, np.iinfo(np.int32).max, -31, 31, 0)
        lq = self.locations(loc, node, f)
        if isinstance(lq, str):
            return lq
        self.replace(node, "fx_ms_deform_attn", [vq, lq, aq],
                     {"spatial_shapes": node.attrs["spatial_shapes"], "out_frac_bits": fy})
        return None

    def locations(self, v: Value, node: Node, f: int) -> Value | str:
        """Normalized sampling locations as i32 fixed<f>: the arithmetic on the quantized
        path (data movement, +, -, * and / by constants of the sampling offsets) in
        integers; geometry (not computed from the sources) quantized where it joins."""
        p = v.producer
        if v.is_const or p is None or not self.is_active(p):
            q = self.fixed(v, node, DType.i32, frac=f, bound=LOC_BOUND)
            return "uncalibrated sampling locations" if q is None else q
        if p.opdef.moves_data:
            inner = self.locations(p.inputs[0], node, f)
            return inner if isinstance(inner, str) else \
                self._create(p.op, [inner, *p.inputs[1:]], p.attrs, node)
        wide = {"out_frac_bits": f, "out_dtype": "i32"}
        if p.op in ("add", "sub"):
            terms = [self.locations(x, node, f) for x in p.inputs]
            bad = next((t for t in terms if isinstance(t, str)), None)
            return bad or self._create(f"fx_{p.op}", terms, wide, node)
        # a term computed from the sources: it must stay within the bound (see LOC_BOUND)
        e = self.ranges.get(v)
        if e is None or max(abs(e.lo), abs(e.hi)) > LOC_TERM_BOUND:
            return (f"sampling-location term %{v.name} reaches beyond +-{LOC_TERM_BOUND} "
                    "(or is uncalibrated)")
        if p.op in ("mul", "div") and p.inputs[1].is_const and not p.inputs[0].is_const:
            c = p.inputs[1]
            if p.op == "div" and np.any(c.const == 0):
                return "divides by a constant with zeros"
            xq = self.fixed(p.inputs[0], node)
            if xq is None:
                return "uncalibrated sampling offsets"
            factor = self.const(c, np.int16, reciprocal=p.op == "div")
            return self._create("fx_mul", [xq, factor], wide, node)
        q = self.fixed(v, node, DType.i32, frac=f, bound=LOC_BOUND)
        return "uncalibrated sampling locations" if q is None else q

    def strategy(self, node: Node) -> Callable[[Node, Rule, int], str | None] | None:
        """How ``node`` lowers, from its op's ``fixed_point`` interface (None: it stays
        float); a strategy the pass does not have is an error naming the op."""
        spec = node.opdef.fixed_point
        if spec is None:
            return None
        how = getattr(self, spec.how, None) if spec.how in STRATEGIES else None
        if how is None:
            raise PassError(f"op '{node.op}' declares the fixed-point lowering '{spec.how}'; "
                            f"quantize has {sorted(STRATEGIES)}", node=node.name, op=node.op,
                            loc=node.loc)
        return lambda n, rule, fy: how(n, rule, fy, spec.target)

    def run(self) -> None:
        # strategies that lower a chain of float producers with them go first
        def chain_first(n: Node) -> bool:
            spec = n.opdef.fixed_point
            return spec is None or spec.how not in CHAIN_STRATEGIES
        for node in sorted(self.graph.nodes, key=chain_first):
            lower = self.strategy(node)
            if lower is None or self._dead(node):
                continue
            if not self.is_active(node):
                self.stat("geometry-left")
                continue
            if node.output.type.dtype is not DType.f32:
                continue
            rule = self.config.rule_for(node)
            if rule.activations == "affine":        # onnxruntime's scales: the INT8 import's
                self.stat("affine-left")
                continue
            fy = self.frac(node.output)
            if rule.exclude or fy is None or lower(node, rule, fy) is not None:
                self.stat("float-left")
        for bound in accumulator_bounds(self.graph):
            if not bound.safe:              # saturates at run time: say which op, and how far
                warnings.warn(f"quantize: {bound}", stacklevel=2)
                self.stat("accumulator-overflow-risk")


    def _dead(self, node: Node) -> bool:
        outs = set(map(id, self.graph.outputs.values()))
        return node.graph is None or not any(o.uses or id(o) in outs for o in node.outputs)


def _is_table(op: str | None) -> bool:
    """Whether fx op ``op`` is a table lookup (one entry per input code, 8 or 16 bits)."""
    return op is not None and isinstance(get_op(op), FxLookup)


def _read_by_tables(v: Value) -> bool:
    """Whether every use of ``v`` is an op that lowers to a table lookup, directly or
    through data movement and concatenation."""
    def tabled(u: Node, i: int) -> bool:
        spec = u.opdef.fixed_point
        return spec is not None and _is_table(spec.target)
    return _all_uses(v, tabled, through=("concat",))


def _exact_sum(node: Node) -> bool:
    """Whether ``node`` is a sum that lowers exact, in 16 bits: one read only by tables."""
    return node.op in ("add", "sub") and _read_by_tables(node.output)


def _feeds(v: Value, ops: tuple[str, ...], operand: int | None = None) -> bool:
    """Whether every use of ``v`` is by one of ``ops`` (as operand ``operand``, if given),
    directly or through data movement."""
    return _all_uses(v, lambda u, i: u.op in ops and (operand is None or i == operand))


def _all_uses(v: Value, accept: Callable[[Node, int], bool], through: tuple[str, ...] = ()
              ) -> bool:
    """Whether ``v`` has uses and ``accept(user, operand index)`` holds for each, looking
    past data movement (of its first operand) and the ops ``through`` to their users."""
    return bool(v.uses) and all(
        accept(u, i) or ((u.opdef.moves_data and i == 0) or u.op in through)
        and _all_uses(u.output, accept, through) for u, i in v.uses)


def _inverse_sigmoid(node: Node) -> tuple[Value | None, float]:
    """(x, eps) when ``node`` is log(div(clip(x1, min=eps), clip(sub(1, x1), min=eps))) with
    x1 = clip(x, 0, 1), as BEVFormer's inverse_sigmoid traces; else (None, 0)."""
    def prod(v, op):
        p = v.producer if v is not None else None
        return p if p is not None and p.op == op else None
    div = prod(node.inputs[0], "div")
    num, den = (prod(v, "clip") for v in div.inputs) if div is not None else (None, None)
    sub = prod(den.inputs[0], "sub") if den is not None else None
    if num is None or sub is None or num.attrs.get("max") is not None:
        return None, 0.0
    x1 = num.inputs[0]
    unit = prod(x1, "clip")
    one = sub.inputs[0]
    if (unit is None or sub.inputs[1] is not x1 or not one.is_const or np.any(one.const != 1)
            or (unit.attrs.get("min"), unit.attrs.get("max")) != (0.0, 1.0)
            or num.attrs.get("min") != den.attrs.get("min") or den.attrs.get("max") is not None):
        return None, 0.0
    return unit.inputs[0], float(num.attrs["min"])


def _linear_parts(node: Node) -> tuple[Value, Value | None, Value | None, bool]:
    """(x, constant 2-D weight, constant [N] bias or None, trans_b) of a product; the
    weight is None when the node is not a plain product by a constant."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    a = node.attrs
    trans_b = bool(a.get("trans_b", False))
    plain = {"gemm": lambda: a["alpha"] == 1.0 and a["beta"] == 1.0 and not a["trans_a"]
             }.get(node.op, lambda: True)
    if w is None or not w.is_const or w.type.rank != 2 or not plain():
        return x, None, None, trans_b
    n = w.type.shape[0 if trans_b else 1]
    if bias is not None and not (bias.is_const and bias.type.shape == (n,)):
        return x, None, None, trans_b
    return x, w, bias, trans_b


def _conv_parts(node: Node) -> tuple[Value, Value | None, Value | None, bool]:
    """(x, constant weight, constant bias or None, False) of a convolution; the weight is
    None unless weight and bias are constants."""
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if not w.is_const or (bias is not None and not bias.is_const):
        return x, None, None, False
    return x, w, bias, False


@dataclass
class FloatOps:
    """Ops computing in float on the way from some inputs to the outputs (graph order)."""

    nodes: list[Node]

    def __len__(self) -> int:
        return len(self.nodes)

    def counts(self) -> dict[str, int]:
        """Op -> how many."""
        return dict(Counter(n.op for n in self.nodes))

    def table(self) -> str:
        """One line per node: op, result type and provenance."""
        return "\n".join(f"{n.op:<16} {n.outputs[0].type}  {n.loc or ''}" for n in self.nodes)


def float_ops_between(graph: Graph, sources: Sequence[str]) -> FloatOps:
    """The nodes with a float result on a path from the graph inputs named ``sources`` to
    an output: what stays float in the quantized program. A dequantize whose result is a
    graph output (the program's output conversion) is not counted."""
    outputs = {id(v) for v in graph.outputs.values()}
    ahead: set[Node] = set()
    stack = [v for v in graph.inputs if v.name in sources]
    while stack:
        for user in stack.pop().users:
            if user not in ahead:
                ahead.add(user)
                stack.extend(user.outputs)
    behind: set[Node] = set()
    todo = [v.producer for v in graph.outputs.values() if v.producer is not None]
    while todo:
        n = todo.pop()
        if n not in behind:
            behind.add(n)
            todo.extend(v.producer for v in n.inputs if v is not None and v.producer is not None)

    def counted(n: Node) -> bool:
        if not any(o.type.dtype.is_float for o in n.outputs):
            return False
        return not (n.op in ("dequantize", "fx_dequantize") and id(n.outputs[0]) in outputs)
    return FloatOps([n for n in graph.nodes if n in ahead and n in behind and counted(n)])


def load_config(config: QuantConfig | str) -> QuantConfig:
    """A QuantConfig as given, or a preset name, or a ``.json`` config file."""
    if isinstance(config, QuantConfig):
        return config
    return QuantConfig.load(config) if Path(config).suffix == ".json" else QuantConfig.preset(config)


def quantize(graph: Graph, config: QuantConfig | str = "reference-flow") -> dict[str, int]:
    """Lower ``graph``'s calibrated float ops by ``config`` (a QuantConfig, a preset name or
    a JSON file); returns the statistics."""
    stats: dict[str, int] = {}

    def stat(counter: str) -> None:
        stats[counter] = stats.get(counter, 0) + 1
    _Lowering(graph, load_config(config), stat).run()
    return stats


class LowerToFixedPoint(Pass):
    """Lower calibrated float ops to fixed-point integer ops by a quantization config
    (:func:`quantize` in one call; the pass is not named ``quantize``, which is the ONNX
    QuantizeLinear op). Option ``config``: a preset name (default ``reference-flow``) or a
    JSON config file."""

    name = "lower-to-fixed-point"
    description = "lower calibrated float ops to fx_* integer ops (QuantConfig rules)"
    semantics_preserving = False

    config: str = "reference-flow"

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        _Lowering(graph, load_config(self.config), self.stat).run()
