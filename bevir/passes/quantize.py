"""quantize: lower calibrated float ops to bevir's fixed-point integer ops, by a QuantConfig.

Each float op with a lowering rule below, whose inputs and result have calibrated ranges
(:func:`bevir.calibrate`, or a seeded tranges file) and whose config rule does not
exclude it, becomes its ``fx_*`` op:

- activations: i8 with power-of-two frac bits ``f = floor(log2(127 / max|range|))``
  (symmetric), chosen per value from its calibrated range;
- weights: symmetric int8, per tensor or per output channel as the rule says, scale
  ``max|w| / 127`` (float32), codes ``round_half_even(w / scale)``; biases: int32 in the
  accumulator's units (``round(b / (scale * 2**-f_x))``).

Values cross between the float and the integer parts through ``fx_quantize`` and
``fx_dequantize``, so a graph is quantized as far as the lowerings reach and stays
runnable; ``fx_quantize(fx_dequantize(q))`` of the same frac bits is ``q``.

Lowered so far: ``linear`` and ``gemm`` (constant weight; ``trans_b`` or not, no alpha,
beta or ``trans_a``; a fused relu or gelu becomes fx_relu / fx_gelu), ``matmul`` by a
constant 2-D weight, ``conv2d`` and ``conv2d_act`` (relu) with constant weights,
``relu``, ``add`` of two activations, ``sigmoid``, ``softmax`` (``fx_softmax``, out frac
bits within 1..7), ``layer_norm`` over the last axis with constant scale (i16 fixed) and
bias (i32 fixed).

Statistics: ``lowered-<op>`` per op, ``float-left`` (compute ops of the kinds above left
in float: excluded or uncalibrated), ``affine-left`` (ops of rules with
``activations="affine"``: their quantization is onnxruntime's, imported from the INT8
ONNX model, not made here).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import AffineQuant, DType, FixedPointQuant, TensorType
from .analysis import AnalysisManager
from .calibrate import ranges_of
from .manager import Pass
from ..ops.fixed import NORM_FRAC, quantize_fixed
from .quant_config import QuantConfig, Rule

F32 = np.float32
#: a fused activation -> the fx op applied after the product (None: no activation)
ACTIVATIONS = {"none": None, "relu": "fx_relu", "gelu": "fx_gelu"}


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


class _Lowering:
    """The state of one quantize run: the graph, ranges, config and the i8 twins of values."""

    def __init__(self, graph: Graph, config: QuantConfig, stat: Callable[[str], None]):
        ranges = ranges_of(graph)
        if ranges is None:
            raise PassError("quantize needs calibrated ranges: run bevir.calibrate(graph, "
                            "inputs) or the calibrate pass first")
        self.graph, self.ranges, self.config, self.stat = graph, ranges, config, stat
        self.twins: dict[Value, Value] = {}      # float value -> its fx_quantize

    def frac(self, v: Value) -> int | None:
        """The frac bits for float value ``v``, or None without a calibrated range."""
        e = self.ranges.get(v)
        return None if e is None else frac_bits_for(e.lo, e.hi)

    def fixed(self, v: Value, node: Node) -> Value | None:
        """``v`` as i8 fixed before ``node``: its twin if it has one, else fx_quantize."""
        src = v.producer
        if src is not None and src.op == "fx_dequantize":
            return src.inputs[0]
        if v in self.twins:
            return self.twins[v]
        f = self.frac(v)
        if f is None:
            return None
        after = {"after": src} if src is not None else {"before": node}
        q = self.graph.create_node("fx_quantize", [v], {"out_frac_bits": f}, loc=node.loc,
                                   **after).output
        self.twins[v] = q
        return q

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
        back = g.create_node("fx_dequantize", [new.output], loc=node.loc, before=node)
        g.replace_all_uses(node.output, back.output)
        g.erase(node)
        self.stat(f"lowered-{node.op}")

    # ---- lowerings: (node, rule, out frac) -> None, or a reason to leave it float -----------
    def product(self, node: Node, rule: Rule, fy: int) -> str | None:
        conv = node.op in ("conv2d", "conv2d_act")
        x, w, b, trans_b = _conv_parts(node) if conv else _linear_parts(node)
        act = node.attrs.get("activation", "none")
        if w is None:
            return "not a product by a constant weight"
        if act not in ACTIVATIONS:
            return f"activation {act} has no fixed-point lowering"
        xq = self.fixed(x, node)
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
        self.replace(node, "fx_conv2d" if conv else "fx_linear", inputs,
                     {**attrs, "out_frac_bits": fy}, ACTIVATIONS[act],
                     {"approximate": node.attrs["approximate"]} if act == "gelu" else {})
        return None

    def unary(self, op: str) -> Callable[[Node, Rule, int], str | None]:
        def lower(node: Node, rule: Rule, fy: int) -> str | None:
            xq = self.fixed(node.inputs[0], node)
            if xq is None:
                return "uncalibrated input"
            self.replace(node, op, [xq], {"out_frac_bits": fy})
            return None
        return lower

    def add(self, node: Node, rule: Rule, fy: int) -> str | None:
        if any(v.is_const for v in node.inputs):
            return "adds a constant"
        qs = [self.fixed(v, node) for v in node.inputs]
        if None in qs:
            return "uncalibrated input"
        self.replace(node, "fx_add", qs, {"out_frac_bits": fy})
        return None

    def softmax(self, node: Node, rule: Rule, fy: int) -> str | None:
        xq = self.fixed(node.inputs[0], node)
        if xq is None:
            return "uncalibrated input"
        self.replace(node, "fx_softmax", [xq], {"axis": node.attrs["axis"],
                                                "out_frac_bits": max(1, min(7, fy))})
        return None

    def layer_norm(self, node: Node, rule: Rule, fy: int) -> str | None:
        x, scale, bias = (list(node.inputs) + [None, None])[:3]
        if node.attrs["axis"] not in (-1, x.type.rank - 1):
            return "normalizes another axis than the last"
        if any(p is not None and not p.is_const for p in (scale, bias)):
            return "scale or bias is not a constant"
        xq = self.fixed(x, node)
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
        self.replace(node, "fx_layer_norm", inputs, {"epsilon": node.attrs["epsilon"],
                                                      "out_frac_bits": fy})
        return None

    def table(self) -> dict[str, Callable[[Node, Rule, int], str | None]]:
        return {"linear": self.product, "gemm": self.product, "matmul": self.product,
                "conv2d": self.product, "conv2d_act": self.product,
                "relu": self.unary("fx_relu"), "sigmoid": self.unary("fx_sigmoid"),
                "add": self.add, "softmax": self.softmax, "layer_norm": self.layer_norm}

    def run(self) -> None:
        lowerings = self.table()
        for node in list(self.graph.nodes):
            lower = lowerings.get(node.op)
            if lower is None:
                continue
            rule = self.config.rule_for(node)
            if rule.activations == "affine":        # onnxruntime's scales: the INT8 import's
                self.stat("affine-left")
                continue
            fy = self.frac(node.output)
            if rule.exclude or fy is None or lower(node, rule, fy) is not None:
                self.stat("float-left")
        self._cancel_round_trips()

    def _cancel_round_trips(self) -> None:
        """fx_quantize(fx_dequantize(q)) with q's frac bits -> q."""
        for node in list(self.graph.nodes):
            src = node.inputs[0].producer if node.op == "fx_quantize" else None
            if src is not None and src.op == "fx_dequantize":
                q = src.inputs[0]
                if q.type.quant == FixedPointQuant((node.attrs["out_frac_bits"],)) \
                        and q.type.dtype is DType.i8:
                    self.graph.replace_all_uses(node.output, q)
                    self.graph.erase(node)


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


class Quantize(Pass):
    """Lower calibrated float ops to fixed-point integer ops by a quantization config.
    Option ``config``: a preset name (default ``reference-flow``) or a JSON config file."""

    name = "quantize"
    description = "lower calibrated float ops to fx_* integer ops (QuantConfig rules)"
    semantics_preserving = False

    config: str = "reference-flow"

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        _Lowering(graph, load_config(self.config), self.stat).run()
