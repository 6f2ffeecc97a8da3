"""The op-definition mechanism: one declarative definition per op, and the registry of them.

An op is a subclass of :class:`OpDef` that names its operands and attributes and defines
its type rule (``infer``), its numpy reference semantics (``compute``) and its cost
(``macs``; bytes moved follow from the types). Defining the class registers it::

    class Relu(OpDef):
        name = "relu"
        operands = ("x",)

        def infer(self, c, x):
            return x

        def compute(self, c, x):
            return np.maximum(x, 0).astype(x.dtype)

Operand names ending in ``?`` are optional (passed as ``None`` when omitted); a name
starting with ``*`` takes the remaining operands (variadic). ``c`` is a :class:`Ctx`: the
node's validated attributes as fields (``c.axis``), plus ``c.in_types`` and ``c.out_types``.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import AttrError, VerifyError
from .types import TensorType

_REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """An attribute's schema: its kind, default (absent means required) and allowed values."""

    kind: str
    default: Any = _REQUIRED
    choices: tuple | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def check(self, name: str, value: Any) -> Any:
        """Return the value in canonical form, or raise AttrError."""
        try:
            v = _CONVERT[self.kind](value)
        except (TypeError, ValueError) as e:
            raise AttrError(f"attribute '{name}' must be {self.kind}, got {value!r}") from e
        if self.choices is not None and v not in self.choices:
            raise AttrError(f"attribute '{name}' = {v!r} is not one of {list(self.choices)}")
        return v


def _int(v):
    if isinstance(v, (bool, float)) or not isinstance(v, (int, np.integer)):
        raise TypeError
    return int(v)


def _float(v):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError
    return float(v)


def _bool(v):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError
    return bool(v)


def _str(v):
    if not isinstance(v, str):
        raise TypeError
    return v


def _seq(elem):
    def convert(v):
        if isinstance(v, (str, bytes)) or not isinstance(v, (Sequence, np.ndarray)):
            raise TypeError
        return tuple(elem(x) for x in v)
    return convert


def _tensor(v):
    if not isinstance(v, np.ndarray):
        raise TypeError
    v = np.array(v)
    v.setflags(write=False)
    return v


_CONVERT = {"int": _int, "float": _float, "bool": _bool, "str": _str, "ints": _seq(_int),
            "floats": _seq(_float), "strs": _seq(_str), "tensor": _tensor}


def Int(default=_REQUIRED, choices=None) -> Attr:
    return Attr("int", default, choices)


def Float(default=_REQUIRED) -> Attr:
    return Attr("float", default)


def Bool(default=_REQUIRED) -> Attr:
    return Attr("bool", default)


def Str(default=_REQUIRED, choices=None) -> Attr:
    return Attr("str", default, choices)


def Ints(default=_REQUIRED) -> Attr:
    return Attr("ints", default if default is _REQUIRED or default is None else tuple(default))


def Floats(default=_REQUIRED) -> Attr:
    return Attr("floats", default if default is _REQUIRED or default is None else tuple(default))


def Tensor(default=_REQUIRED) -> Attr:
    return Attr("tensor", default)


class Ctx:
    """What an op's methods see of a node: attributes as fields, plus operand/result types."""

    def __init__(self, attrs: Mapping[str, Any], in_types: Sequence[TensorType | None] = (),
                 out_types: Sequence[TensorType] = (), node=None):
        # the attributes as fields (the context's own fields, set after, win): an op reads
        # them on every run, and a read through __getattr__ costs ten times as much
        self.__dict__.update(attrs)
        self.attrs = attrs
        self.in_types = list(in_types)
        self.out_types = list(out_types)
        self.node = node

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["attrs"][name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class LayoutRule:
    """How an op runs in NHWC (its ``nhwc`` interface, read by the to-nhwc pass).
    ``native``: it computes in NHWC itself and seeds regions; ``data``: the operand indices
    that carry the layout (None: every operand, as for elementwise ops); ``attrs``: the
    node's attributes in NHWC; ``check``: a reason to keep a node as it is, or None."""

    native: bool = False
    data: tuple[int, ...] | None = None
    attrs: Callable[[Any], dict] | None = None
    check: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class FixedLowering:
    """What the quantize pass turns a float op into (its ``fixed_point`` interface).
    ``how`` names a lowering registered with ``bevir.passes.quantize.lowers`` (``product``,
    ``unary``, ``binary``, ``mul``, ``div``, ``reduce``, ``clip``, ``softmax``, ``concat``,
    ``layer_norm``, ``deform_attn``, ...; bevir/passes/quantize/), ``target`` the fx op it
    emits where the lowering takes one."""

    how: str
    target: str | None = None


@dataclass(frozen=True)
class Activation:
    """How an op fuses into a product as its activation (its ``activation`` interface, read
    by the fused ops and the fuse and quantize passes). ``attrs``: (its attribute, the
    fused op's attribute) pairs; ``fixed``: the fx op that applies it after a fixed-point
    product (None: a product fused with it stays float)."""

    attrs: tuple[tuple[str, str], ...] = ()
    fixed: str | None = None


#: one operand's share of a split node: (axis, start, stop), the range it reads along axis
Range = tuple[int, int, int]


@dataclass(frozen=True)
class Piece:
    """What one core computes of a node split along a result axis (the ``splits``
    interface, read by the partition pass): per operand, the range it reads (None: the
    whole operand, replicated on every core), and the attributes that differ from the
    node's (a convolution's pads where a piece of rows meets the border)."""

    operands: tuple[Range | None, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)


def aligned_range(t: TensorType | None, out: TensorType, axis: int, start: int, stop: int
                  ) -> Range | None:
    """The range of a broadcast operand ``t`` that result range [start, stop) of ``axis``
    reads: along the operand's axis aligned to it from the right, or None (the whole
    operand) where the operand does not reach that axis or is broadcast along it."""
    if t is None:
        return None
    a = axis - (out.rank - t.rank)
    if a < 0 or t.shape[a] == 1:
        return None
    return (a, start, stop)


def c_ordered(a: np.ndarray) -> np.ndarray:
    """``a``, or a C-ordered copy of it where it is a view in another memory order (a 0-d
    array stays 0-d)."""
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def read_only(a) -> bool:
    """Nothing can write to ``a``: it and every array it views are read-only (a graph
    constant)."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return a is None or isinstance(a, bytes)


_REGISTRY: dict[str, OpDef] = {}


class OpDef:
    """Base of op definitions; see the module docstring."""

    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()
    attrs: ClassVar[dict[str, Attr]] = {}
    #: False for ops with effects or identity (never CSE'd, folded or removed when unused)
    pure: ClassVar[bool] = True
    doc: ClassVar[str] = ""

    #: the op only moves or selects elements of operand 0 (reshape, transpose, slice...):
    #: it computes the same on quantized codes as on the values they stand for
    moves_data: ClassVar[bool] = False
    #: the op selects or joins whole ranges along one axis (core_slice, core_gather): with
    #: its tensors in DDR the code generator addresses the ranges in place, moving nothing
    in_place_ranges: ClassVar[bool] = False
    #: each result element comes from the operand elements at its own (broadcast) index
    #: by the same float operations whatever the shape: a piece of a node with float
    #: operands computes the same bits (the partition may split it)
    pointwise: ClassVar[bool] = False
    #: the results are the operands, value for value (a transfer between memories, a
    #: synchronization point): a build with one memory and one thread (the host build)
    #: passes the operands on instead of running a kernel
    values_unchanged: ClassVar[bool] = False
    #: the kernel's results are the same bits whatever the memory order of its operand
    #: arrays (it copies them into the order it sums in first): they reach it as they are,
    #: views included, as they reach the ops that only move data. Every other op reads
    #: C-ordered operands (:meth:`run`)
    any_memory_order: ClassVar[bool] = False
    #: each result of the golden kernel is a new array nothing else references (a
    #: product's): the interpreter may hand it to its only reader to write its result
    #: into (:meth:`bind_in_place`)
    fresh_results: ClassVar[bool] = False
    #: each result element is computed from the operand elements at its own index alone,
    #: so the device kernel may write its result over an operand of the result's type
    #: that dies at it (the memory plan gives both one OCM buffer)
    result_over_operand: ClassVar[bool] = False
    #: the op is the sum of its two operands followed by this activation ("none": add,
    #: "relu": add_relu), which a product that one of them is may compute in its own pass
    #: (:meth:`bind_sum`); None: the op is no such sum
    sum_activation: ClassVar[str | None] = None

    # ---- interfaces: what passes and backends ask the op (None: not implemented) --------
    #: how the op maps through NCHW -> NHWC (to-nhwc); None: it has no NHWC form
    nhwc: ClassVar[LayoutRule | None] = None
    #: how the op fuses into a conv / matmul as its activation; None: it does not
    activation: ClassVar[Activation | None] = None
    #: what quantize lowers the op to in fixed point; None: it stays float
    fixed_point: ClassVar[FixedLowering | None] = None
    #: ``decompose(self, builder, node)``: the same computation in primitive ops (the
    #: decompose pass); None: the op is primitive
    decompose: ClassVar[Callable | None] = None
    #: ``tvm_lowering(self, c, L, *operands)``: the op as a TVM tensor-expression compute,
    #: built with the toolkit ``L`` (bevir.codegen.lower.Lowering: te, the integer numerics
    #: as expressions, constant tables) on te tensors; returns the result tensor(s). None:
    #: no lowering (code generation refuses an integer node of the op)
    tvm_lowering: ClassVar[Callable | None] = None
    #: the GPNPU cycle cost (bevir.target.cycles); None: the model's default for the op's kind
    cycle_cost: ClassVar[Callable | None] = None
    #: ``onnx_export(e, node, inputs, outputs)``: the op as ONNX nodes (bevir.codegen.onnx;
    #: helpers in bevir.ops.onnx_export). None: the op has no ONNX form
    onnx_export: ClassVar[Callable | None] = None
    #: how the op splits across cores (the partition pass), by kind: "rows" (leading
    #: result axes; the default :meth:`split_piece` slices every operand along the
    #: broadcast-aligned axis), "batch", "channels", "columns", "queries". Each kind cuts
    #: one result axis (:meth:`split_axis`) into ranges, one per core (:meth:`split_piece`)
    splits: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:
            if cls.name in _REGISTRY:
                raise ValueError(f"op '{cls.name}' is defined twice")
            _REGISTRY[cls.name] = cls()

    # ---- to be defined by ops ----------------------------------------------------------
    def infer(self, c: Ctx, *types: TensorType | None) -> TensorType | Sequence[TensorType]:
        raise NotImplementedError(f"op '{self.name}' has no type rule")

    def compute(self, c: Ctx, *arrays: np.ndarray | None) -> np.ndarray | Sequence[np.ndarray]:
        raise NotImplementedError(f"op '{self.name}' has no reference semantics")

    def macs(self, c: Ctx) -> int:
        """Multiply-accumulates of one application (0 for data movement)."""
        return 0

    def row_axes(self, c: Ctx) -> tuple[int, ...]:
        """The result axes along which each result depends only on the same index of its
        operands (the "rows" split): the leading axes, all but the last."""
        return tuple(range(c.out_types[0].rank - 1))

    def split_axis(self, c: Ctx, kind: str) -> int | None:
        """The result axis that split ``kind`` cuts, or None where it does not apply to this
        node. "rows": the longest of :meth:`row_axes` (the first of equals)."""
        if kind != "rows":
            raise NotImplementedError(f"op '{self.name}' does not define split kind '{kind}'")
        shape = c.out_types[0].shape
        axes = [a for a in self.row_axes(c) if shape[a] > 1]
        return max(axes, key=lambda a: (shape[a], -a)) if axes else None

    def split_piece(self, c: Ctx, kind: str, start: int, stop: int) -> Piece:
        """What computes result range [start, stop) of ``split_axis(c, kind)``. "rows":
        every operand sliced along its broadcast-aligned axis."""
        axis = self.split_axis(c, kind)
        out = c.out_types[0]
        return Piece(tuple(aligned_range(t, out, axis, start, stop) for t in c.in_types))

    def region_axes(self, c: Ctx) -> dict[int, str]:
        """The result axes a range of which this node computes alone, and the split kind
        that cuts each: every declared kind's axis, and for the default "rows" every row
        axis (an elementwise op cuts any leading axis)."""
        axes: dict[int, str] = {}
        for kind in self.splits:
            axis = self.split_axis(c, kind)
            if axis is not None:
                axes.setdefault(axis, kind)
        if "rows" in self.splits and type(self).split_piece is OpDef.split_piece:
            for axis in self.row_axes(c):
                axes.setdefault(axis, "rows")
        return axes

    def region(self, c: Ctx, axis: int, start: int, stop: int) -> Piece | None:
        """What computes result range [start, stop) along result ``axis`` alone (a split's
        piece, a cascade's stripe): the operand ranges and changed attributes; None where
        the node cannot (:meth:`region_axes`)."""
        kind = self.region_axes(c).get(axis)
        if kind is None:
            return None
        if self.split_axis(c, kind) == axis:
            return self.split_piece(c, kind, start, stop)
        out = c.out_types[0]
        return Piece(tuple(aligned_range(t, out, axis, start, stop) for t in c.in_types))

    # ---- derived -----------------------------------------------------------------------
    def interfaces(self) -> list[str]:
        """The interfaces this op implements, by name (see the class attributes above)."""
        base = OpDef
        have = [name for name in ("infer", "compute", "macs")
                if getattr(type(self), name) is not getattr(base, name)]
        have += [name for name in ("nhwc", "activation", "fixed_point", "decompose",
                                   "tvm_lowering", "cycle_cost", "onnx_export")
                 if getattr(self, name) is not None]
        return have + (["splits"] if self.splits else [])

    def arity(self) -> tuple[int, int | None]:
        """(min, max) operand count; max None when variadic."""
        lo = sum(1 for o in self.operands if not o.endswith("?") and not o.startswith("*"))
        variadic = any(o.startswith("*") for o in self.operands)
        return lo, None if variadic else len(self.operands)

    def check_attrs(self, attrs: Mapping[str, Any], where: Mapping[str, str] | None = None) -> dict:
        """Validate attributes against the schema, filling in defaults."""
        where = dict(where or {})
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise AttrError(f"unknown attribute(s) {sorted(unknown)}; "
                            f"'{self.name}' takes {sorted(self.attrs)}", **where)
        out = {}
        for k, schema in self.attrs.items():
            if k in attrs and attrs[k] is not None:
                try:
                    out[k] = schema.check(k, attrs[k])
                except AttrError as e:
                    raise AttrError(e.message, **where) from None
            elif schema.required:
                raise AttrError(f"missing required attribute '{k}'", **where)
            else:
                out[k] = schema.default
        return out

    def check_arity(self, n: int) -> None:
        lo, hi = self.arity()
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else f"{lo}..{'' if hi is None else hi}"
            raise VerifyError(f"takes {want} operands ({', '.join(self.operands)}), got {n}")

    def infer_node(self, node) -> list[TensorType]:
        """Infer the result types of a node (arity checked)."""
        self.check_arity(len(node.inputs))
        types = [None if v is None else v.type for v in node.inputs]
        try:
            out = self.infer(Ctx(node.attrs, types, node=node), *types)
        except (VerifyError, ValueError, IndexError) as e:
            msg = e.message if isinstance(e, VerifyError) else f"{type(e).__name__}: {e}"
            raise VerifyError(f"type inference failed: {msg}", op=self.name, loc=node.loc,
                              node=node.name if node.outputs else None) from None
        return [out] if isinstance(out, TensorType) else list(out)

    def ctx(self, node) -> Ctx:
        return Ctx(node.attrs, [None if v is None else v.type for v in node.inputs],
                   [v.type for v in node.outputs], node)

    def run(self, node, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Apply the reference semantics to a node's operand arrays. The operands are
        C-ordered first (a transposed or sliced view copied), except for the ops that only
        move data or declare ``any_memory_order``: numpy sums a strided axis in another
        order than a contiguous one, BLAS a transposed matrix in another order than a
        C-ordered one, and its vectorized transcendentals may take a scalar path on strided
        memory, so a result would otherwise depend on how its operand's producer laid the
        array out (a layout change elsewhere in the graph would change its bits)."""
        return self.bind(node)(arrays)

    def prepare(self, c: Ctx, x: np.ndarray, *weights: np.ndarray | None
                ) -> Callable[[np.ndarray], np.ndarray] | None:
        """For an op whose operands after the first are weights (a convolution's, a linear
        layer's): a function of the first operand that computes the (single) result, made
        for operands like ``x`` and these ``weights`` (graph constants), or None where it
        cannot be made. An op that defines it is prepared once per plan (:meth:`bind`),
        where the weights are constants nothing can change; by default there is none."""
        return None

    def bind(self, node) -> Callable[[Sequence[np.ndarray | None]], list[np.ndarray]]:
        """:meth:`run` of ``node`` as a function of its operand arrays, its context made
        once: what the interpreter calls on every run of a graph (its prepared plan). It
        holds the node's attributes and types as they are now, so a changed graph needs
        new ones (the interpreter prepares again when the graph's version changes). Where
        the op defines :meth:`prepare` and the node's weights are graph constants, the
        prepared function is made on the first call and called from then on."""
        c, compute = self.ctx(node), self.compute
        ordered = not (self.moves_data or self.any_memory_order)

        def run(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            if ordered:
                arrays = [None if a is None else c_ordered(a) for a in arrays]
            out = compute(c, *arrays)
            if type(out) is np.ndarray:              # the common case, without a list
                return [out]
            outs = [out] if isinstance(out, np.ndarray) or np.isscalar(out) else list(out)
            return [np.asarray(o) for o in outs]
        weights = node.inputs[1:]
        if (type(self).prepare is OpDef.prepare or not node.inputs
                or not all(v is None or v.is_const and read_only(v.const) for v in weights)):
            return run
        return self._prepared(c, tuple(None if v is None else v.const for v in weights),
                              ordered, run)

    def bind_in_place(self, node, operand: int
                      ) -> Callable[[Sequence[np.ndarray | None]], list[np.ndarray]] | None:
        """:meth:`bind`'s function writing the (single) result into operand ``operand``'s
        array, which the caller hands over: a fresh array nothing else reads (an operand of
        the result's shape and dtype whose producer has :attr:`fresh_results`). The same
        bits as :meth:`bind`'s; None where the op cannot (the default)."""
        return None

    def bind_sum(self, node, first: bool, activation: str
                 ) -> Callable[[Sequence[np.ndarray | None], np.ndarray], np.ndarray | None] | None:
        """A function of the node's operand arrays and an addend: the node's (single)
        result, then the addend added (``addend + y`` where ``first``, else ``y + addend``:
        the add that reads the result, in its operand order; see :attr:`sum_activation`),
        then ``activation``, in its kernel's own pass, with the bits of the node and the
        add run one after the other; the function returns None, computing nothing, where
        it cannot for the arrays given. None (the default) where the op never can."""
        return None

    def _prepared(self, c: Ctx, weights: tuple[np.ndarray | None, ...], ordered: bool,
                  run: Callable[[Sequence[np.ndarray | None]], list[np.ndarray]]
                  ) -> Callable[[Sequence[np.ndarray | None]], list[np.ndarray]]:
        """:meth:`bind`'s function through :meth:`prepare` (made on the first call) for
        the node's own weights and a first operand of its declared shape and dtype; through
        ``run`` for other operands, or where prepare makes none."""
        made: list[Callable[[np.ndarray], np.ndarray] | None] = []
        t = c.in_types[0]
        shape, dtype, n = t.shape, t.dtype.np, len(weights) + 1

        def prepared(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            x = arrays[0]
            if (len(arrays) != n or x.shape != shape or x.dtype != dtype
                    or not all(map(operator.is_, arrays[1:], weights))):
                return run(arrays)
            if ordered:
                x = c_ordered(x)
            if not made:
                made.append(self.prepare(c, x, *weights))
            fn = made[0]
            return run(arrays) if fn is None else [fn(x)]
        return prepared

    def cost(self, node) -> dict[str, int]:
        """MACs and bytes read and written by one application of the node."""
        return {"macs": int(self.macs(self.ctx(node))),
                "bytes_read": sum(v.type.nbytes for v in node.inputs if v is not None),
                "bytes_written": sum(v.type.nbytes for v in node.outputs)}


def get_op(name: str) -> OpDef:
    """The definition of op ``name``; raises VerifyError for an unknown op."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise VerifyError(f"unknown op '{name}'", op=name) from None


def all_ops() -> dict[str, OpDef]:
    """Every registered op, by name."""
    return dict(sorted(_REGISTRY.items()))
