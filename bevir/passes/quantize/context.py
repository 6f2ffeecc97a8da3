"""The lowering registry and the small context every lowering works through.

A lowering is a function ``fn(cx, node, rule, fy, target) -> str | None`` registered under
a name with :func:`lowers`; an op names it in its ``fixed_point`` interface
(``FixedLowering(how, target)``). It swaps ``node`` for fixed-point ops through the
:class:`Context` ``cx`` and returns None, or returns why the node stays float. A pattern,
registered for an op with :func:`lowering_pattern`, is tried on that op's nodes before the
op's own lowering (an example's chain of float ops that one table computes) and returns
``NotImplemented`` where it does not match.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...errors import PassError
from ...ir.graph import Graph, Node, Value
from ...ir.opdef import FixedLowering
from ...ir.types import AffineQuant, DType, FixedPointQuant, TensorType
from ...ops import get_op
from ...ops.fixed_tables import FxLookup
from ...ops.numerics import quantize_fixed
from ..calibrate import ranges_of
from ..quant_config import QuantConfig, Rule

F32 = np.float32

#: fn(cx, node, rule, out frac bits, target fx op) -> None (lowered) or why it stays float
LoweringFn = Callable[["Context", Node, Rule, int, "str | None"], "str | None"]


@dataclass(frozen=True)
class Lowering:
    """A registered lowering; ``first``: it takes a chain of float producers with it, so
    it runs before the others."""

    fn: LoweringFn
    first: bool = False


#: lowering name -> lowering (the ``how`` of ops' ``fixed_point`` interfaces)
LOWERINGS: dict[str, Lowering] = {}
#: op -> patterns tried on its nodes before its own lowering
PATTERNS: dict[str, list[Lowering]] = {}


def lowers(how: str, first: bool = False) -> Callable[[LoweringFn], LoweringFn]:
    """Register ``fn`` as the lowering ``how``."""
    def register(fn: LoweringFn) -> LoweringFn:
        if how in LOWERINGS and LOWERINGS[how].fn is not fn:
            raise ValueError(f"fixed-point lowering '{how}' is registered twice")
        LOWERINGS[how] = Lowering(fn, first)
        return fn
    return register


def lowering_pattern(op: str, first: bool = False) -> Callable[[LoweringFn], LoweringFn]:
    """Register ``fn`` as a pattern for ``op``'s nodes, tried before the op's lowering
    (``fn`` returns NotImplemented where it does not match; its ``target`` is the op's)."""
    def register(fn: LoweringFn) -> LoweringFn:
        patterns = PATTERNS.setdefault(op, [])
        if all(p.fn is not fn for p in patterns):
            patterns.append(Lowering(fn, first))
        return fn
    return register


# ---- fixed-point formats -------------------------------------------------------------------

def most_frac_bits(amax: float, top: int, lo: int, hi: int, empty: int) -> int:
    """The largest f in [lo, hi] with amax * 2**f <= top (``empty`` when amax is 0)."""
    f = empty if amax == 0 else math.floor(math.log2(top / amax))
    return max(lo, min(hi, f))


def frac_bits_for(lo: float, hi: float) -> int:
    """The largest frac bits f with max(|lo|, |hi|) * 2**f <= 127 (7 for an all-zero range),
    within [-31, 31]."""
    amax = max(abs(lo), abs(hi))
    if not math.isfinite(amax):
        raise PassError(f"range [{lo}, {hi}] is not finite")
    return most_frac_bits(amax, 127, -31, 31, 7)


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
    [min_frac, max_frac]) that keep max|a| of the finite entries representable, round
    half up (an infinite entry saturates)."""
    a = np.asarray(a)
    finite = np.abs(a[np.isfinite(a)])
    f = most_frac_bits(float(finite.max(initial=0.0)), np.iinfo(dtype).max, min_frac,
                       max_frac, max_frac)
    return quantize_fixed(a, f, dtype), f


def fixed_type(codes: np.ndarray, frac: int) -> TensorType:
    return TensorType(codes.shape, DType.from_numpy(codes.dtype), quant=FixedPointQuant((frac,)))


def is_table(op: str | None) -> bool:
    """Whether fx op ``op`` is a table lookup (one entry per input code, 8 or 16 bits)."""
    return op is not None and isinstance(get_op(op), FxLookup)


def takes_x(op: str, dtype: DType, shape: tuple[int, ...]) -> bool:
    """Whether fx op ``op`` takes an x operand of ``dtype`` and ``shape``: its ``takes_x``
    where it has limits beyond the dtype, else its ``x_dtypes``."""
    spec = get_op(op)
    takes = getattr(spec, "takes_x", None)
    return takes(dtype, shape) if takes else dtype in getattr(spec, "x_dtypes", ())


# ---- who reads a value ---------------------------------------------------------------------

def all_uses(v: Value, accept: Callable[[Node, int], bool], through: tuple[str, ...] = ()
             ) -> bool:
    """Whether ``v`` has uses and ``accept(user, operand index)`` holds for each, looking
    past data movement (of its first operand) and the ops ``through`` to their users."""
    return bool(v.uses) and all(
        accept(u, i) or ((u.opdef.moves_data and i == 0) or u.op in through)
        and all_uses(u.output, accept, through) for u, i in v.uses)


def feeds(v: Value, ops: tuple[str, ...], operand: int | None = None) -> bool:
    """Whether every use of ``v`` is by one of ``ops`` (as operand ``operand``, if given),
    directly or through data movement."""
    return all_uses(v, lambda u, i: u.op in ops and (operand is None or i == operand))


def read_by_tables(v: Value) -> bool:
    """Whether every use of ``v`` is an op that lowers to a table lookup, directly or
    through data movement and concatenation."""
    def tabled(u: Node, i: int) -> bool:
        spec = u.opdef.fixed_point
        return spec is not None and is_table(spec.target)
    return all_uses(v, tabled, through=("concat",))


def read_by_norm(v: Value) -> bool:
    """Whether a layer norm that takes 16-bit rows of its shape reads ``v`` (one of its
    uses, directly or through data movement, concatenation and sums: a residual stream,
    the tokens and position embeddings that start it)."""
    return any(
        u.op == "layer_norm" and i == 0 and takes_x("fx_layer_norm", DType.i16, v.type.shape)
        or (u.opdef.moves_data and i == 0 or u.op in ("concat", "add", "sub"))
        and any(read_by_norm(o) for o in u.outputs)
        for u, i in v.uses)


def exact_sum(node: Node) -> bool:
    """Whether ``node`` is a sum that lowers exact, in 16 bits: one read only by tables."""
    return node.op in ("add", "sub") and read_by_tables(node.output)


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


#: the other activation width a value's codes may be requantized from
_OTHER_WIDTH = {DType.i8: DType.i16, DType.i16: DType.i8}


class Context:
    """What a lowering works with: the graph, its calibrated ranges, the config, the
    statistics, and the fixed-point twins of float values made so far."""

    def __init__(self, graph: Graph, config: QuantConfig, stat: Callable[[str], None]):
        ranges = ranges_of(graph)
        if ranges is None:
            raise PassError("quantize needs calibrated ranges: run bevir.calibrate(graph, "
                            "inputs) or the calibrate pass first")
        self.graph, self.ranges, self.config, self.stat = graph, ranges, config, stat
        self.twins: dict[tuple[Value, str], Value] = {}     # (float value, dtype) -> fixed
        self.active = _reachable(graph, config.sources)
        #: (op, provenance, why) of each op left in float that has a lowering
        self.left: list[tuple[str, str, str]] = []

    def is_active(self, node: Node | None) -> bool:
        """Whether ``node`` computes on the quantized sources (the config's ``sources``)."""
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
        return most_frac_bits(amax, np.iinfo(dtype).max, -31, 31, 7)

    def create(self, op: str, inputs: list, attrs: dict, at: Node, after: Node | None = None
               ) -> Value:
        """A node ``op(inputs){attrs}`` with ``at``'s provenance, before ``at`` (or after
        ``after``); its (first) result."""
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
        return self.graph.add_const(codes, self.graph.unique_name(name), fixed_type(codes, f))

    def addend(self, v: Value, fy: int) -> Value | None:
        """A constant addend with infinite entries (a causal mask's -inf) as int32 codes at
        the sum's frac bits ``fy``: an infinite entry saturates the sum, as it makes the
        float sum infinite. None for any other value."""
        if not v.is_const or np.isfinite(v.const).all():
            return None
        return self.const(v, np.int32, fy)

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
                return self.create(src.op, [inner, *src.inputs[1:]], src.attrs, src, after=src)
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
                t = self.create("fx_requantize", [other], {"out_frac_bits": f,
                                "out_dtype": dtype.value}, node, after=other.producer)
            elif t is None or (frac is not None and t.type.quant.frac_bits[0] != frac):
                f = self.frac(v, dtype.np, bound) if frac is None else frac
                if f is None:
                    return None
                t = self.create("fx_quantize", [v], {"out_frac_bits": f, "out_dtype": dtype.value},
                                node, after=v.producer)
            self.twins[key] = t
        return self.twins[key]

    def operands(self, node: Node, values=None, dtype: DType = DType.i8) -> list[Value] | None:
        """The operands as ``dtype`` fixed (constants quantized), or None if one is
        uncalibrated."""
        qs = [self.fixed(v, node, dtype) for v in (node.inputs if values is None else values)]
        return None if None in qs else qs

    def wide_operands(self, node: Node) -> list[Value] | None:
        """The operands as fixed point for an op that keeps 16 bits: their codes where
        they have them (16 or 8 bits), else quantized to 16 bits (None if one is
        uncalibrated)."""
        qs = [self.twin(v, DType.i16) or self.twin(v, DType.i8) or self.fixed(v, node, DType.i16)
              for v in node.inputs]
        return None if None in qs else qs

    # ---- result formats --------------------------------------------------------------------
    def width(self, node: Node, rule: Rule, fy: int, *ops: str) -> tuple[DType, dict]:
        """(the activation dtype, the result attributes) of ``node`` lowered to ``ops``: i16
        where the rule asks for 16-bit activations and every op takes them (its
        ``x_dtypes``, or its ``takes_x`` for node's first operand), else i8 at ``fy``."""
        if rule.activations != "fixed16" or not all(
                takes_x(op, DType.i16, node.inputs[0].type.shape) for op in ops):
            return DType.i8, {"out_frac_bits": fy}
        self.stat("activations-i16")
        return DType.i16, {"out_frac_bits": self.frac(node.output, np.int16), "out_dtype": "i16"}

    def result_width(self, node: Node, fy: int) -> dict:
        """A product read only by softmaxes (attention scores) keeps 16 bits: an 8-bit
        score of a wide logit range would be too coarse for the exponentials."""
        if not feeds(node.output, ("softmax",)):
            return {}
        return {"out_dtype": "i16", "out_frac_bits": self.frac(node.output, np.int16)}

    def norm_width(self, node: Node) -> dict:
        """The result attributes of a sum a layer norm reads (a residual stream): 16 bits.
        The norm divides each row by its own spread, so a row much smaller than the
        tensor's range (a class token, a position's embedding, the rows an outlier
        channel dwarfs) keeps few of 8 bits, and its error grows by the ratio."""
        self.stat("norm-input-i16")
        return {"out_dtype": "i16", "out_frac_bits": self.frac(node.output, np.int16)}

    def table_width(self, node: Node, dt: DType, out: dict) -> dict:
        """A table's result attributes: 16 bits where only exact sums read it (they keep 16
        bits anyway, and a table of 16-bit entries costs what one of 8-bit entries does)."""
        if dt is not DType.i8 or not all_uses(node.output, lambda u, i: exact_sum(u)):
            return out
        self.stat("exact-i16")
        return {"out_dtype": "i16", "out_frac_bits": self.frac(node.output, np.int16)}

    def exact_width(self, v: Value, qs: list[Value]) -> dict:
        """The result attributes of ``v``, a sum read only by tables, that keep every bit of
        its operands ``qs``, in 16 bits: a table takes 16-bit codes at the cost of 8-bit
        ones, and rounding a sum of operands with finer frac bits (half up) would bias it
        by up to a quarter step, which a loop such as a decoder's box refinement
        (sigmoid(delta + logit(ref))) accumulates."""
        exact = max(q.type.quant.frac_bits[0] for q in qs)
        self.stat("exact-i16")
        return {"out_dtype": "i16", "out_frac_bits": min(exact, self.frac(v, np.int16))}

    # ---- swapping a node for fixed-point ops -------------------------------------------------
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
        self.swap(node, new.output)

    def swap(self, node: Node, fixed: Value) -> None:
        """Replace ``node``'s float result by ``fx_dequantize(fixed)``; ``fixed`` takes over
        the result's name (per-layer comparisons match values by name)."""
        self.swap_all(node, [fixed])

    def swap_all(self, node: Node, fixed: list[Value]) -> None:
        """Replace each float result of ``node`` by ``fx_dequantize`` of its fixed twin in
        ``fixed`` (which takes over its name)."""
        g = self.graph
        names = [o.name for o in node.outputs]
        for out, q in zip(node.outputs, fixed):
            back = g.create_node("fx_dequantize", [q], loc=node.loc, before=node)
            g.replace_all_uses(out, back.output)
        g.erase(node)
        for q, name in zip(fixed, names):
            g.rename(q, name)
        self.stat(f"lowered-{node.op}")


# ---- the driver ----------------------------------------------------------------------------

#: how data movement lowers (an op that moves data and names no lowering of its own)
MOVEMENT = FixedLowering("movement")


def _lowerings_of(node: Node) -> list[tuple[Lowering, str | None]]:
    """The patterns of ``node``'s op, then its own lowering, each with its fx target; an op
    naming a lowering nobody registered is an error naming the op."""
    spec = node.opdef.fixed_point or (MOVEMENT if node.opdef.moves_data else None)
    found = [(p, spec.target if spec else None) for p in PATTERNS.get(node.op, ())]
    if spec is not None:
        if spec.how not in LOWERINGS:
            raise PassError(f"op '{node.op}' declares the fixed-point lowering '{spec.how}'; "
                            f"quantize has {sorted(LOWERINGS)}", node=node.name, op=node.op,
                            loc=node.loc)
        found.append((LOWERINGS[spec.how], spec.target))
    return found


def _dead(graph: Graph, node: Node) -> bool:
    outs = set(map(id, graph.outputs.values()))
    return node.graph is None or not any(o.uses or id(o) in outs for o in node.outputs)


def lower_graph(cx: Context) -> None:
    """Lower every node of ``cx.graph`` its config and ranges allow; those with a ``first``
    lowering or pattern go first (they take float producers with them)."""
    graph = cx.graph
    plans = {n: _lowerings_of(n) for n in graph.nodes}
    order = sorted(graph.nodes, key=lambda n: not any(lw.first for lw, _ in plans[n]))
    for node in order:
        if not plans[node] or _dead(graph, node):
            continue
        if not cx.is_active(node):
            cx.stat("geometry-left")
            continue
        floats = [v.type.dtype is DType.f32 for v in (node.outputs[0], node.inputs[0]) if v]
        if not any(floats):                     # integers already (or ids, masks)
            continue
        rule = cx.config.rule_for(node)
        if rule.activations == "affine":        # onnxruntime's scales: the INT8 import's
            cx.stat("affine-left")
            continue
        fy = cx.frac(node.output) if len(node.outputs) == 1 and floats[0] else 0
        why = f"excluded by rule '{rule.name}'" if rule.exclude else \
            "uncalibrated result" if fy is None else _lower(cx, node, rule, fy, plans[node])
        if why is not None:
            cx.stat("float-left")
            cx.left.append((node.op, node.loc or "", why))


def _lower(cx: Context, node: Node, rule: Rule, fy: int,
           lowerings: list[tuple[Lowering, str | None]]) -> str | None:
    """None where one of ``lowerings`` (patterns first) lowered ``node``, else why not."""
    for lowering, target in lowerings:
        why = lowering.fn(cx, node, rule, fy, target)
        if why is not NotImplemented:
            return why
    return "no pattern matches"
