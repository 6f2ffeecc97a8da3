"""PyTorch import: ``from_torch(module, example_inputs, custom_ops=...) -> Graph``.

The module is captured with ``torch.export``. Instances of the module classes named in
``custom_ops`` become single IR ops: during export their ``forward`` is routed through one
opaque torch custom op, so the exported program holds one call per instance, whose
operands are the forward's tensor arguments followed by the module's parameters. The
importer turns that call into the registered IR op, with the parameters as constants
(named by their state_dict keys) and the module's configuration as attributes; no weight
plumbing by hand. Everything else decomposes into registry ops through one small converter
per ATen op. Every node carries the module path it came from as its ``loc``.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..errors import BevirError, UnsupportedError
from ..extras import require
from ..ir.graph import Graph, Value
from ..ir.types import DType, TensorType

torch = require("torch")
nn = torch.nn

__all__ = ["CustomOp", "from_torch", "aten_converter", "supported_aten_ops", "aten_table"]


@dataclass(frozen=True)
class CustomOp:
    """How instances of one module class become one IR op.

    ``op``: the registry op; ``attrs(module) -> dict``: its attributes from the module's
    configuration; ``params``: the parameter names passed as operands after the forward's
    tensor arguments (default: every parameter, in ``named_parameters()`` order).
    """

    op: str
    attrs: Callable[[nn.Module], Mapping[str, Any]] = field(default=lambda m: {})
    params: Sequence[str] | None = None

    def param_names(self, module: nn.Module) -> list[str]:
        return list(self.params) if self.params is not None else \
            [n for n, _ in module.named_parameters()]


# ---- custom-op boundaries during export ----------------------------------------------------

@dataclass
class _Boundary:
    path: str
    module: nn.Module
    spec: CustomOp
    forward: Callable            # the original bound forward
    arg_names: list[str]
    param_names: list[str]

    def call(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """The module's own computation on ``inputs`` (forward args, then parameters)."""
        n = len(self.arg_names)
        params = dict(zip(self.param_names, inputs[n:]))
        with _bypass(self):
            out = torch.func.functional_call(self.module, params, tuple(inputs[:n]))
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        # a custom op may not return its inputs (or views of them)
        return [o.clone() for o in outs]


_BOUNDARIES: dict[str, _Boundary] = {}
_LOCAL = threading.local()


@contextlib.contextmanager
def _bypass(b: _Boundary) -> Iterator[None]:
    active = getattr(_LOCAL, "bypass", set())
    _LOCAL.bypass = active | {id(b.module)}
    try:
        yield
    finally:
        _LOCAL.bypass = active


@torch.library.custom_op("bevir::boundary", mutates_args=())
def _boundary_op(inputs: list[Optional[torch.Tensor]], key: str) -> list[torch.Tensor]:
    return _BOUNDARIES[key].call(inputs)


@_boundary_op.register_fake
def _boundary_fake(inputs, key):
    return _BOUNDARIES[key].call(inputs)


def _routed_forward(b: _Boundary) -> Callable:
    sig = inspect.signature(b.forward)

    def forward(*args, **kwargs):
        if id(b.module) in getattr(_LOCAL, "bypass", ()):
            return b.forward(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, v in bound.arguments.items():
            if v is not None and not isinstance(v, torch.Tensor):
                raise UnsupportedError(f"custom op boundary {type(b.module).__name__}: forward "
                                       f"argument '{name}' is a {type(v).__name__}, not a tensor "
                                       "(pass configuration through the module)", loc=b.path)
        params = dict(b.module.named_parameters())
        inputs = list(bound.arguments.values()) + [params[n] for n in b.param_names]
        outs = torch.ops.bevir.boundary(inputs, b.path)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return forward


@contextlib.contextmanager
def _boundaries(module: nn.Module, custom_ops: Mapping[type, CustomOp]
                ) -> Iterator[dict[str, _Boundary]]:
    """Route the forward of every (outermost) instance of a registered class through the
    boundary op for the duration of the export."""
    chosen: list[_Boundary] = []
    inside: list[str] = []
    for path, m in module.named_modules():
        if any(path.startswith(p + ".") for p in inside) or type(m) not in custom_ops:
            continue
        spec = custom_ops[type(m)]
        fwd = m.forward
        chosen.append(_Boundary(path, m, spec, fwd, list(inspect.signature(fwd).parameters),
                                spec.param_names(m)))
        inside.append(path)
    try:
        for b in chosen:
            _BOUNDARIES[b.path] = b
            b.module.forward = _routed_forward(b)
        yield {b.path: b for b in chosen}
    finally:
        for b in chosen:
            del b.module.forward          # the class's forward again
            _BOUNDARIES.pop(b.path, None)


# ---- the importer ---------------------------------------------------------------------------

_TORCH_DTYPES = {torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16,
                 torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16,
                 torch.int8: DType.i8, torch.uint8: DType.u8, torch.bool: DType.bool}

Converter = Callable[["_Ctx"], Any]
_ATEN: dict[str, Converter] = {}


def aten_converter(*names: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen ops, by overload name (``"aten.add.Tensor"``) or packet
    name (``"aten.add"``: every overload)."""
    def register(fn: Converter) -> Converter:
        for n in names:
            _ATEN[n] = fn
        return fn
    return register


def supported_aten_ops() -> list[str]:
    """The ATen ops (packets and overloads) the importer converts."""
    return sorted(_ATEN)


def aten_table(columns: int = 4) -> str:
    """The supported ATen ops as a Markdown table (docs/frontends.md holds it)."""
    names = [f"`{n}`" for n in supported_aten_ops()]
    rows = [names[i:i + columns] for i in range(0, len(names), columns)]
    lines = ["|" + " |" * columns, "|" + "---|" * columns]
    lines += ["| " + " | ".join(r + [""] * (columns - len(r))) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _dtype(t: torch.dtype, loc: str) -> DType:
    try:
        return _TORCH_DTYPES[t]
    except KeyError:
        raise UnsupportedError(f"dtype {t} is not supported", loc=loc) from None


class _Ctx:
    """What a converter sees of one exported node: its arguments with fx nodes replaced by
    bevir values, and helpers to emit nodes with the node's provenance."""

    def __init__(self, imp: _Importer, node: torch.fx.Node):
        self.imp, self.node, self.graph = imp, node, imp.graph
        self.target = str(node.target)
        self.loc = imp.loc_of(node)
        self.args = [imp.lookup(a) for a in node.args]
        self.kwargs = {k: imp.lookup(v) for k, v in node.kwargs.items()}

    def arg(self, i: int, name: str | None = None, default: Any = None) -> Any:
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default) if name else default

    def emit(self, op: str, inputs: Sequence[Value | None], **attrs) -> Value:
        node = self.graph.create_node(op, inputs, attrs, loc=self.loc)
        return node.outputs[0] if len(node.outputs) == 1 else tuple(node.outputs)

    def const(self, array, like: Value | None = None) -> Value:
        a = np.asarray(array)
        if like is not None:
            a = a.astype(like.type.dtype.np)
        elif a.dtype == np.float64:
            a = a.astype(np.float32)
        elif a.dtype.kind == "i":
            a = a.astype(np.int64)
        return self.graph.add_const(a, self.graph.unique_name("const"))

    def value(self, x: Any, like: Value | None = None) -> Value:
        """A Value for a tensor operand or a Python scalar (typed like ``like``)."""
        return x if isinstance(x, Value) else self.const(x, like)

    def unsupported(self, message: str) -> UnsupportedError:
        return UnsupportedError(message, op=self.target, loc=self.loc)


class _Importer:
    def __init__(self, ep: torch.export.ExportedProgram, boundaries: dict[str, _Boundary],
                 input_names, output_names, name: str):
        self.ep = ep
        self.boundaries = boundaries
        self.graph = Graph(name)
        self.env: dict[str, Any] = {}
        self.input_names = input_names
        self.output_names = output_names

    def lookup(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.lookup(x) for x in a)
        return a

    @staticmethod
    def loc_of(node: torch.fx.Node) -> str:
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        if node.target is torch.ops.bevir.boundary.default:
            return node.args[1]
        return path

    def run(self) -> Graph:
        sig = self.ep.graph_signature
        kinds = {s.arg.name: s for s in sig.input_specs}
        values = {**self.ep.state_dict, **self.ep.constants}
        user = iter(self.input_names or [])
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, kinds[node.name], values, user)
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node)
        return self.graph

    def placeholder(self, node, spec, values, user_names) -> None:
        InputKind = require("torch.export.graph_signature").InputKind
        if spec.kind is InputKind.USER_INPUT:
            meta = node.meta.get("val")
            if meta is None:                      # an input given as None
                self.env[node.name] = None
                return
            t = TensorType(tuple(int(d) for d in meta.shape), _dtype(meta.dtype, node.name))
            self.env[node.name] = self.graph.add_input(next(user_names, node.name), t)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            array = values[spec.target].detach().cpu().numpy().copy()
            self.env[node.name] = self.graph.add_const(array, spec.target)
        else:
            raise UnsupportedError(f"exported input kind {spec.kind} is not supported",
                                   loc=node.name)

    def call(self, node: torch.fx.Node) -> None:
        c = _Ctx(self, node)
        if node.target is torch.ops.bevir.boundary.default:
            self.env[node.name] = _boundary(c)
            return
        if node.target is operator.getitem:
            self.env[node.name] = c.args[0][c.args[1]]
            return
        if _foldable(c):
            self.env[node.name] = _fold(c, node)
            return
        overload = c.target
        packet = overload.rsplit(".", 1)[0]
        fn = _ATEN.get(overload) or _ATEN.get(packet)
        if fn is None:
            raise c.unsupported(f"unsupported torch op {overload}")
        try:
            self.env[node.name] = fn(c)
        except BevirError as e:
            if e.loc:
                raise
            raise UnsupportedError(f"{overload}: {e.message}", op=overload, loc=c.loc) from None

    def outputs(self, node) -> None:
        outs = node.args[0]
        names = self.output_names or [f"output_{i}" for i in range(len(outs))]
        if len(names) != len(outs):
            raise UnsupportedError(f"{len(names)} output names for {len(outs)} outputs")
        for name, o in zip(names, outs):
            v = self.lookup(o)
            if not isinstance(v, Value):
                raise UnsupportedError(f"output '{name}' is not a tensor")
            self.graph.set_output(name, v)


def _tensor_args(c: _Ctx) -> list[Value]:
    flat = list(itertools.chain.from_iterable(a if isinstance(a, (list, tuple)) else [a]
                                              for a in [*c.args, *c.kwargs.values()]))
    return [a for a in flat if isinstance(a, Value)]


#: ops that make tensors out of nothing; folded even with no tensor operand
_FACTORIES = ("aten.linspace", "aten.arange", "aten.ones", "aten.zeros", "aten.full",
              "aten.scalar_tensor", "aten.empty", "aten.tensor", "aten.eye", "aten.lift_fresh_copy")


def _foldable(c: _Ctx) -> bool:
    tensors = _tensor_args(c)
    if tensors:
        return all(v.is_const for v in tensors) and c.target not in ("aten._assert_tensor_metadata.default",)
    return c.target.startswith(_FACTORIES)


def _fold(c: _Ctx, node: torch.fx.Node) -> Any:
    """Evaluate a node whose tensor operands are all constants with torch itself."""
    def to_torch(a):
        if isinstance(a, Value):
            return torch.from_numpy(np.array(a.const))
        if isinstance(a, (list, tuple)):
            return type(a)(to_torch(x) for x in a)
        return a
    with torch.no_grad():
        out = node.target(*to_torch(c.args), **to_torch(c.kwargs))

    def to_ir(o):
        if isinstance(o, torch.Tensor):
            a = o.detach().numpy().copy()
            _dtype(o.dtype, c.loc)
            return c.graph.add_const(a, c.graph.unique_name(node.name))
        if isinstance(o, (list, tuple)):
            return type(o)(to_ir(x) for x in o)
        return o
    return to_ir(out)


def _boundary(c: _Ctx) -> tuple[Value, ...]:
    b = c.imp.boundaries[c.args[1]]
    inputs = list(c.args[0])
    attrs = dict(b.spec.attrs(b.module))
    node = c.graph.create_node(b.spec.op, inputs, attrs, loc=b.path)
    return tuple(node.outputs)


def from_torch(module: nn.Module, example_inputs: Sequence[Any], *,
               custom_ops: Mapping[type, CustomOp] | None = None,
               input_names: Sequence[str] | None = None,
               output_names: Sequence[str] | None = None, name: str | None = None) -> Graph:
    """Import ``module`` (in eval mode) through ``torch.export`` into a bevir Graph.

    ``example_inputs`` fix the (static) shapes; ``None`` entries select the forward's branch
    without that input. ``custom_ops`` maps module classes to :class:`CustomOp` specs. Graph
    inputs are named ``input_names`` (default: the forward's argument names), outputs
    ``output_names`` (default ``output_0``, ...). Unsupported ATen ops raise
    ``bevir.UnsupportedError`` naming the module path.
    """
    args = tuple(example_inputs)
    modes = {m: m.training for m in module.modules()}
    module.eval()
    with _boundaries(module, dict(custom_ops or {})) as boundaries:
        try:
            ep = torch.export.export(module, args)
            if _mutates(ep):   # in-place ops (x[a:b] = v) become their functional forms
                ep = ep.run_decompositions({})
        except BevirError:
            raise
        except Exception as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, BevirError):
                raise cause from None
            raise UnsupportedError(f"torch.export failed: {type(e).__name__}: {e}") from e
        finally:
            for m, training in modes.items():     # the caller's module is left as it was
                m.training = training
    if input_names is None:
        params = list(inspect.signature(module.forward).parameters)
        input_names = [p for p, a in zip(params, args) if a is not None]
    return _Importer(ep, boundaries, list(input_names), output_names,
                     name or type(module).__name__).run()


def _mutates(ep: torch.export.ExportedProgram) -> bool:
    """Whether an op writes into a tensor (detach_ only changes autograd state)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable and n.target is not torch.ops.aten.detach_.default
               for n in ep.graph.nodes)


# ---- ATen converters ------------------------------------------------------------------------

def _rank(v: Value) -> int:
    return v.type.rank


def _axis(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _promote(c: _Ctx, a: Any, b: Any) -> tuple[Value, Value]:
    """Both operands as Values of one dtype, following torch's promotion."""
    if not isinstance(a, Value):
        a, b = _promote(c, b, a)[::-1] if isinstance(b, Value) else (c.const(a), c.const(b))
        return a, b
    if not isinstance(b, Value):
        if a.type.dtype is DType.bool or (a.type.dtype.is_int and isinstance(b, float)):
            a = c.emit("cast", [a], to="f32")
        return a, c.const(b, a)
    if a.type.dtype != b.type.dtype:
        to = torch.promote_types(*(_torch_dtype(v.type.dtype) for v in (a, b)))
        to = _dtype(to, c.loc).value
        a = a if a.type.dtype.value == to else c.emit("cast", [a], to=to)
        b = b if b.type.dtype.value == to else c.emit("cast", [b], to=to)
    return a, b


def _torch_dtype(d: DType) -> torch.dtype:
    return next(t for t, b in _TORCH_DTYPES.items() if b is d)


def _binary(op: str, swap: bool = False):
    def convert(c: _Ctx):
        a, b = _promote(c, c.arg(0), c.arg(1))
        alpha = c.kwargs.get("alpha", 1)
        if alpha != 1:
            b = c.emit("mul", [b, c.const(alpha, b)])
        return c.emit(op, [b, a] if swap else [a, b])
    return convert


for _name, _op in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("maximum", "max"),
                   ("minimum", "min"), ("atan2", "atan2"), ("pow", "pow")]:
    aten_converter(f"aten.{_name}")(_binary(_op))
aten_converter("aten.rsub")(_binary("sub", swap=True))
for _name, _op in [("gt", "greater"), ("lt", "less"), ("eq", "equal")]:
    aten_converter(f"aten.{_name}")(_binary(_op))


@aten_converter("aten.div")
def _div(c: _Ctx):
    a, b = _promote(c, c.arg(0), c.arg(1))
    if a.type.dtype.is_int or c.kwargs.get("rounding_mode"):
        raise c.unsupported("integer or rounding division")
    return c.emit("div", [a, b])


@aten_converter("aten.ge", "aten.le")
def _ge_le(c: _Ctx):
    a, b = _promote(c, c.arg(0), c.arg(1))
    return c.emit("not", [c.emit("less" if c.target.startswith("aten.ge") else "greater", [a, b])])


for _name in ["neg", "sigmoid", "relu", "log", "exp", "sqrt", "cos", "sin", "tanh", "abs",
              "erf", "reciprocal"]:
    aten_converter(f"aten.{_name}")(lambda c, _op=_name: c.emit(_op, [c.arg(0)]))


@aten_converter("aten.rsqrt")
def _rsqrt(c: _Ctx):
    return c.emit("reciprocal", [c.emit("sqrt", [c.arg(0)])])


@aten_converter("aten.gelu")
def _gelu(c: _Ctx):
    return c.emit("gelu", [c.arg(0)], approximate=c.kwargs.get("approximate", "none"))


@aten_converter("aten.__and__", "aten.logical_and", "aten.bitwise_and")
def _and(c: _Ctx):
    return c.emit("where", [c.arg(0), c.arg(1), c.const(np.array(False))])


@aten_converter("aten.__or__", "aten.logical_or", "aten.bitwise_or")
def _or(c: _Ctx):
    return c.emit("where", [c.arg(0), c.const(np.array(True)), c.arg(1)])


@aten_converter("aten.logical_not", "aten.bitwise_not")
def _not(c: _Ctx):
    return c.emit("not", [c.arg(0)])


@aten_converter("aten.clamp", "aten.clamp_min", "aten.clamp_max")
def _clamp(c: _Ctx):
    lo = c.arg(1, "min")
    hi = c.arg(2, "max")
    if c.target.startswith("aten.clamp_max"):
        lo, hi = None, c.arg(1)
    if isinstance(lo, Value) or isinstance(hi, Value):
        raise c.unsupported("tensor clamp bounds")
    return c.emit("clip", [c.arg(0)], min=None if lo is None else float(lo),
                  max=None if hi is None else float(hi))


@aten_converter("aten.where.self")
def _where(c: _Ctx):
    x, y = _promote(c, c.arg(1), c.arg(2))
    return c.emit("where", [c.arg(0), x, y])


def _reduce(op: str):
    def convert(c: _Ctx):
        x = c.arg(0)
        dims = c.arg(1, "dim")
        dims = None if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        keep = bool(c.arg(2, "keepdim", False))
        if c.kwargs.get("dtype") is not None:
            x = c.emit("cast", [x], to=_dtype(c.kwargs["dtype"], c.loc).value)
        axes = None if not dims else tuple(_axis(d, _rank(x)) for d in dims)
        return c.emit(op, [x], axes=axes, keepdims=keep)
    return convert


aten_converter("aten.sum")(_reduce("reduce_sum"))
aten_converter("aten.mean")(_reduce("reduce_mean"))
aten_converter("aten.amax")(_reduce("reduce_max"))
aten_converter("aten.amin")(_reduce("reduce_min"))


@aten_converter("aten.any")
def _any(c: _Ctx):
    x = c.emit("cast", [c.arg(0)], to="u8")
    dims = c.arg(1, "dim")
    axes = None if dims is None else tuple(_axis(d, _rank(x)) for d in
                                           ([dims] if isinstance(dims, int) else dims))
    r = c.emit("reduce_max", [x], axes=axes, keepdims=bool(c.arg(2, "keepdim", False)))
    return c.emit("cast", [r], to="bool")


@aten_converter("aten.softmax", "aten._softmax")
def _softmax(c: _Ctx):
    return c.emit("softmax", [c.arg(0)], axis=int(c.arg(1)))


@aten_converter("aten.layer_norm")
def _layer_norm(c: _Ctx):
    x, shape = c.arg(0), c.arg(1)
    return c.emit("layer_norm", [x, c.arg(2), c.arg(3)], axis=-len(shape),
                  epsilon=float(c.arg(4, "eps", 1e-5)))


@aten_converter("aten.linear")
def _linear(c: _Ctx):
    x, w, b = c.arg(0), c.arg(1), c.arg(2)
    lead = x.type.shape[:-1]
    x2 = x if _rank(x) == 2 else c.emit("reshape", [x], shape=(math.prod(lead), x.type.shape[-1]))
    y = c.emit("gemm", [x2, w, b], trans_b=True)
    return y if _rank(x) == 2 else c.emit("reshape", [y], shape=(*lead, w.type.shape[0]))


@aten_converter("aten.matmul", "aten.bmm", "aten.mm")
def _matmul(c: _Ctx):
    return c.emit("matmul", [c.arg(0), c.arg(1)])


@aten_converter("aten.grid_sampler", "aten.grid_sampler_2d")
def _grid_sample(c: _Ctx):
    modes = {0: "bilinear", 1: "nearest"}
    pads = {0: "zeros", 1: "border", 2: "reflection"}
    if c.arg(2) not in modes:
        raise c.unsupported("bicubic grid_sample")
    return c.emit("grid_sample", [c.arg(0), c.arg(1)], mode=modes[c.arg(2)],
                  padding_mode=pads[c.arg(3)], align_corners=bool(c.arg(4)))


# ---- shapes and data movement ------------------------------------------------------------------

def _resolve(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = [int(d) for d in shape]
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@aten_converter("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(c: _Ctx):
    x = c.arg(0)
    return c.emit("reshape", [x], shape=_resolve(c.arg(1), x.type.numel))


@aten_converter("aten.flatten")
def _flatten(c: _Ctx):
    x = c.arg(0)
    r = _rank(x)
    s, e = _axis(c.arg(1, "start_dim", 0), r), _axis(c.arg(2, "end_dim", -1), r)
    shape = x.type.shape[:s] + (math.prod(x.type.shape[s:e + 1]),) + x.type.shape[e + 1:]
    return c.emit("reshape", [x], shape=shape)


@aten_converter("aten.unsqueeze")
def _unsqueeze(c: _Ctx):
    x = c.arg(0)
    return c.emit("unsqueeze", [x], axes=(_axis(c.arg(1), _rank(x) + 1),))


@aten_converter("aten.squeeze")
def _squeeze(c: _Ctx):
    x = c.arg(0)
    dims = c.arg(1, "dim")
    dims = range(_rank(x)) if dims is None else ([dims] if isinstance(dims, int) else dims)
    axes = tuple(a for a in (_axis(d, _rank(x)) for d in dims) if x.type.shape[a] == 1)
    return c.emit("squeeze", [x], axes=axes) if axes else x


@aten_converter("aten.permute")
def _permute(c: _Ctx):
    x = c.arg(0)
    return c.emit("transpose", [x], perm=tuple(_axis(d, _rank(x)) for d in c.arg(1)))


@aten_converter("aten.transpose", "aten.t")
def _transpose(c: _Ctx):
    x = c.arg(0)
    perm = list(range(_rank(x)))
    a, b = (_axis(c.arg(1, default=0), len(perm)), _axis(c.arg(2, default=1), len(perm)))
    perm[a], perm[b] = perm[b], perm[a]
    return c.emit("transpose", [x], perm=tuple(perm))


@aten_converter("aten.select")
def _select(c: _Ctx):
    x = c.arg(0)
    axis = _axis(c.arg(1), _rank(x))
    index = c.arg(2) % x.type.shape[axis]
    return c.emit("gather", [x, c.const(np.array(index, np.int64))], axis=axis)


@aten_converter("aten.slice")
def _slice(c: _Ctx):
    x = c.arg(0)
    axis = _axis(c.arg(1, "dim", 0), _rank(x))
    start, end, step = c.arg(2, "start"), c.arg(3, "end"), c.arg(4, "step", 1)
    dim = x.type.shape[axis]
    s = slice(0 if start is None else start, dim if end is None else min(end, dim), step)
    start, end, step = s.indices(dim)
    if (start, end, step) == (0, dim, 1):
        return x
    return c.emit("slice", [x], starts=(start,), ends=(end,), axes=(axis,), steps=(step,))


@aten_converter("aten.cat", "aten.concat")
def _cat(c: _Ctx):
    xs = [x for x in c.arg(0) if x.type.numel or len(c.arg(0)) == 1]
    axis = _axis(c.arg(1, "dim", 0), _rank(xs[0]))
    return xs[0] if len(xs) == 1 else c.emit("concat", xs, axis=axis)


@aten_converter("aten.stack")
def _stack(c: _Ctx):
    xs = c.arg(0)
    axis = _axis(c.arg(1, "dim", 0), _rank(xs[0]) + 1)
    parts = [c.emit("unsqueeze", [x], axes=(axis,)) for x in xs]
    return parts[0] if len(parts) == 1 else c.emit("concat", parts, axis=axis)


def _split(c: _Ctx, sizes: Sequence[int], axis: int) -> list[Value]:
    x = c.arg(0)
    out = c.emit("split", [x], axis=axis, sizes=tuple(sizes))
    return list(out) if isinstance(out, tuple) else [out]


@aten_converter("aten.split_with_sizes")
def _split_with_sizes(c: _Ctx):
    x = c.arg(0)
    return _split(c, c.arg(1), _axis(c.arg(2, "dim", 0), _rank(x)))


@aten_converter("aten.split.Tensor", "aten.chunk")
def _split_even(c: _Ctx):
    x = c.arg(0)
    axis = _axis(c.arg(2, "dim", 0), _rank(x))
    dim = x.type.shape[axis]
    size = c.arg(1) if c.target.startswith("aten.split") else -(-dim // c.arg(1))
    sizes = [min(size, dim - i) for i in range(0, dim, size)]
    return _split(c, sizes, axis)


@aten_converter("aten.expand")
def _expand(c: _Ctx):
    x = c.arg(0)
    shape = list(c.arg(1))
    lead = len(shape) - _rank(x)
    shape = [x.type.shape[i - lead] if d == -1 else d for i, d in enumerate(shape)]
    return c.emit("expand", [x], shape=tuple(shape))


@aten_converter("aten.to", "aten._to_copy", "aten.type_as")
def _to(c: _Ctx):
    x = c.arg(0)
    dtype = c.kwargs.get("dtype")
    if dtype is None:
        dtype = next((a for a in c.args[1:] if isinstance(a, torch.dtype)), None)
    if c.target.startswith("aten.type_as"):
        dtype = _torch_dtype(c.arg(1).type.dtype)
    if dtype is None or _dtype(dtype, c.loc) is x.type.dtype:
        return x
    return c.emit("cast", [x], to=_dtype(dtype, c.loc).value)


@aten_converter("aten.contiguous", "aten.clone", "aten.detach", "aten.detach_", "aten.alias",
                "aten.dropout", "aten.lift_fresh_copy")
def _same(c: _Ctx):
    return c.arg(0)


@aten_converter("aten._assert_tensor_metadata")
def _ignore(c: _Ctx):
    return None


@aten_converter("aten.ones_like", "aten.zeros_like", "aten.full_like", "aten.new_zeros",
                "aten.new_ones", "aten.new_full")
def _like(c: _Ctx):
    x = c.arg(0)
    name = c.target.split(".")[1]
    fill = {"ones_like": 1, "zeros_like": 0, "new_ones": 1, "new_zeros": 0}.get(name)
    shape = x.type.shape if name.endswith("_like") else tuple(c.arg(1))
    if fill is None:
        fill = c.arg(1) if name == "full_like" else c.arg(2)
    dtype = c.kwargs.get("dtype")
    np_dtype = x.type.dtype.np if dtype is None else _dtype(dtype, c.loc).np
    return c.graph.add_const(np.full(shape, fill, np_dtype), c.graph.unique_name(name))



# ---- convolution, normalization, pooling, resampling -------------------------------------------

def _pair(v: Any, n: int = 2) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(int(x) for x in (v * n if len(v) == 1 else v))


def _conv_pads(c: _Ctx, padding: Any, kernel, dilation) -> tuple[int, int, int, int]:
    """conv2d's (top, left, bottom, right) for torch's ``padding`` (ints, 'valid', 'same')."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":              # torch puts the odd element at the end
        total = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return (total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2)
    ph, pw = _pair(padding)
    return (ph, pw, ph, pw)


@aten_converter("aten.conv2d", "aten.conv1d", "aten.convolution")
def _conv(c: _Ctx):
    x, w, b = c.arg(0), c.arg(1), c.arg(2)
    if c.target.startswith("aten.convolution"):
        stride, padding, dilation, transposed, _, groups = (c.arg(i) for i in range(3, 9))
        if transposed:
            raise c.unsupported("transposed convolution")
    else:
        stride, padding, dilation, groups = (c.arg(3, "stride", 1), c.arg(4, "padding", 0),
                                             c.arg(5, "dilation", 1), c.arg(6, "groups", 1))
    one_d = _rank(x) == 3
    if one_d:                          # 1-D: a 2-D convolution over rows of height 1
        x = c.emit("unsqueeze", [x], axes=(2,))
        w = c.emit("unsqueeze", [w], axes=(2,))
        lift = lambda v: (1, *_pair(v, 1)) if not isinstance(v, str) else v  # noqa: E731
        stride, dilation = lift(stride), lift(dilation)
        padding = padding if isinstance(padding, str) else (0, *_pair(padding, 1))
    kernel = w.type.shape[2:]
    dilation = _pair(dilation)
    y = c.emit("conv2d", [x, w, b], strides=_pair(stride), dilations=dilation, groups=int(groups),
               pads=_conv_pads(c, padding, kernel, dilation))
    return c.emit("squeeze", [y], axes=(2,)) if one_d else y


@aten_converter("aten.batch_norm", "aten._native_batch_norm_legit_no_training")
def _batch_norm(c: _Ctx):
    x, weight, bias, mean, var = (c.arg(i) for i in range(5))
    legit = c.target.startswith("aten._native")
    if not legit and c.arg(5, "training"):
        raise c.unsupported("batch norm in training mode")
    eps = float(c.arg(6 if legit else 7, "eps", 1e-5))
    channels = x.type.shape[1]
    ones = lambda v: c.const(np.ones(channels), x) if v is None else v  # noqa: E731
    weight, bias = ones(weight), c.const(np.zeros(channels), x) if bias is None else bias
    y = c.emit("batch_norm", [x, weight, bias, mean, var], epsilon=eps)
    return (y, mean, var) if legit else y


@aten_converter("aten.group_norm")
def _group_norm(c: _Ctx):
    x, groups, weight, bias = c.arg(0), int(c.arg(1)), c.arg(2), c.arg(3)
    eps = float(c.arg(4, "eps", 1e-5))
    n, ch = x.type.shape[:2]
    y = c.emit("reshape", [x], shape=(n, groups, x.type.numel // (n * groups)))
    y = c.emit("reshape", [c.emit("layer_norm", [y, None, None], axis=-1, epsilon=eps)],
               shape=x.type.shape)
    per_channel = (ch,) + (1,) * (_rank(x) - 2)
    if weight is not None:
        y = c.emit("mul", [y, c.emit("reshape", [weight], shape=per_channel)])
    if bias is not None:
        y = c.emit("add", [y, c.emit("reshape", [bias], shape=per_channel)])
    return y


def _pool_pads(c: _Ctx, padding) -> tuple[int, int, int, int]:
    ph, pw = _pair(padding)
    return (ph, pw, ph, pw)


@aten_converter("aten.max_pool2d", "aten.max_pool2d_with_indices")
def _max_pool(c: _Ctx):
    kernel = _pair(c.arg(1))
    stride = c.arg(2, "stride") or kernel
    y = c.emit("maxpool2d", [c.arg(0)], kernel=kernel, strides=_pair(stride),
               pads=_pool_pads(c, c.arg(3, "padding", 0)), dilations=_pair(c.arg(4, "dilation", 1)),
               ceil_mode=bool(c.arg(5, "ceil_mode", False)))
    return (y, None) if c.target.startswith("aten.max_pool2d_with_indices") else y


@aten_converter("aten.avg_pool2d")
def _avg_pool(c: _Ctx):
    kernel = _pair(c.arg(1))
    if c.arg(6, "divisor_override") is not None:
        raise c.unsupported("avg_pool2d with divisor_override")
    return c.emit("avgpool2d", [c.arg(0)], kernel=kernel, strides=_pair(c.arg(2, "stride") or kernel),
                  pads=_pool_pads(c, c.arg(3, "padding", 0)),
                  ceil_mode=bool(c.arg(4, "ceil_mode", False)),
                  count_include_pad=bool(c.arg(5, "count_include_pad", True)))


@aten_converter("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg_pool(c: _Ctx):
    x = c.arg(0)
    h, w = x.type.shape[-2:]
    oh, ow = (d if d is not None else s for d, s in zip(_pair(c.arg(1)), (h, w)))
    if (oh, ow) == (1, 1):
        return c.emit("global_avgpool", [x])
    if h % oh or w % ow:
        raise c.unsupported(f"adaptive average pooling of {h}x{w} to {oh}x{ow} (windows of "
                            "unequal size)")
    k = (h // oh, w // ow)
    return c.emit("avgpool2d", [x], kernel=k, strides=k)


def _resize(c: _Ctx, mode: str, size, align_corners: bool | None, scales) -> Value:
    x = c.arg(0)
    h, w = x.type.shape[-2:]
    if size is None:                   # torch sizes floor(in * scale) and maps with 1/scale
        sh, sw = (float(s) for s in scales)
        size, factors = (int(h * sh), int(w * sw)), (1.0, 1.0, sh, sw)
    else:
        size, factors = _pair(size), None
    attrs = {"size": (*x.type.shape[:2], *size), "mode": mode, "scales": factors}
    if mode == "linear":
        attrs["coordinate_transformation_mode"] = ("align_corners" if align_corners
                                                   else "pytorch_half_pixel")
    elif c.target.startswith("aten._upsample_nearest_exact"):   # floor((i + 0.5) * scale)
        attrs.update(coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    else:                                                       # floor(i * scale)
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return c.emit("resize", [x], **attrs)


@aten_converter("aten.upsample_bilinear2d")
def _upsample_bilinear(c: _Ctx):
    if c.target.endswith(".vec"):
        return _resize(c, "linear", c.arg(1), c.arg(2), c.arg(3))
    return _resize(c, "linear", c.arg(1), c.arg(2), (c.arg(3), c.arg(4)) if c.arg(3) else None)


@aten_converter("aten.upsample_nearest2d", "aten._upsample_nearest_exact2d")
def _upsample_nearest(c: _Ctx):
    if c.target.endswith(".vec"):
        return _resize(c, "nearest", c.arg(1), None, c.arg(2))
    return _resize(c, "nearest", c.arg(1), None, (c.arg(2), c.arg(3)) if c.arg(2) else None)


# ---- activations and elementwise ----------------------------------------------------------------

for _name in ["hardswish", "silu"]:
    aten_converter(f"aten.{_name}")(lambda c, _op=_name: c.emit(_op, [c.arg(0)]))


@aten_converter("aten.hardsigmoid")
def _hardsigmoid(c: _Ctx):
    return c.emit("hardsigmoid", [c.arg(0)], alpha=1 / 6, beta=0.5)


@aten_converter("aten.hardtanh", "aten.relu6")
def _hardtanh(c: _Ctx):
    lo, hi = (0.0, 6.0) if c.target.startswith("aten.relu6") else (c.arg(1, "min_val", -1.0),
                                                                    c.arg(2, "max_val", 1.0))
    return c.emit("clip", [c.arg(0)], min=float(lo), max=float(hi))


@aten_converter("aten.leaky_relu")
def _leaky_relu(c: _Ctx):
    x = c.arg(0)
    neg = c.emit("less", [x, c.const(0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, c.const(c.arg(1, "negative_slope", 0.01), x)]), x])


@aten_converter("aten.elu")
def _elu(c: _Ctx):
    x = c.arg(0)
    if c.arg(2, "scale", 1) != 1 or c.arg(3, "input_scale", 1) != 1:
        raise c.unsupported("elu with scale or input_scale")
    em1 = c.emit("sub", [c.emit("exp", [x]), c.const(1, x)])
    neg = c.emit("less", [x, c.const(0, x)])
    return c.emit("where", [neg, c.emit("mul", [em1, c.const(c.arg(1, "alpha", 1.0), x)]), x])


@aten_converter("aten.softplus")
def _softplus(c: _Ctx):
    x = c.arg(0)
    beta, threshold = float(c.arg(1, "beta", 1.0)), float(c.arg(2, "threshold", 20.0))
    bx = x if beta == 1 else c.emit("mul", [x, c.const(beta, x)])
    y = c.emit("log", [c.emit("add", [c.emit("exp", [bx]), c.const(1, x)])])
    y = y if beta == 1 else c.emit("div", [y, c.const(beta, x)])
    return c.emit("where", [c.emit("greater", [bx, c.const(threshold, x)]), x, y])


@aten_converter("aten.log_softmax", "aten._log_softmax")
def _log_softmax(c: _Ctx):
    return c.emit("log", [c.emit("softmax", [c.arg(0)], axis=int(c.arg(1)))])


@aten_converter("aten.ne")
def _ne(c: _Ctx):
    return c.emit("not", [c.emit("equal", list(_promote(c, c.arg(0), c.arg(1))))])


@aten_converter("aten.masked_fill")
def _masked_fill(c: _Ctx):
    x = c.arg(0)
    return c.emit("where", [c.arg(1), c.value(c.arg(2), x), x])


@aten_converter("aten.var", "aten.std")
def _var(c: _Ctx):
    x = c.arg(0)
    dims = c.arg(1, "dim")
    axes = tuple(range(_rank(x))) if dims is None else tuple(
        _axis(d, _rank(x)) for d in ([dims] if isinstance(dims, int) else dims))
    if c.target.endswith(".dim"):              # var.dim(x, dim, unbiased, keepdim)
        correction, keep = int(c.arg(2, "unbiased", True)), bool(c.arg(3, "keepdim", False))
    else:                                      # var.correction(x, dim, *, correction, keepdim)
        correction = c.kwargs.get("correction")
        correction, keep = 1 if correction is None else correction, bool(c.kwargs.get("keepdim", False))
    d = c.emit("sub", [x, c.emit("reduce_mean", [x], axes=axes, keepdims=True)])
    n = math.prod(x.type.shape[a] for a in axes)
    v = c.emit("reduce_sum", [c.emit("mul", [d, d])], axes=axes, keepdims=keep)
    v = c.emit("div", [v, c.const(max(n - correction, 0), x)])
    return c.emit("sqrt", [v]) if c.target.startswith("aten.std") else v


# ---- products and attention -----------------------------------------------------------------

@aten_converter("aten.addmm")
def _addmm(c: _Ctx):
    bias, a, b = c.arg(0), c.arg(1), c.arg(2)
    return c.emit("gemm", [a, b, bias], alpha=float(c.kwargs.get("alpha", 1)),
                  beta=float(c.kwargs.get("beta", 1)))


@aten_converter("aten.einsum")
def _einsum_aten(c: _Ctx):
    from .einsum import einsum
    operands = list(c.arg(1))
    try:
        return einsum(lambda op, ins, attrs: c.emit(op, ins, **attrs), c.arg(0), operands)
    except UnsupportedError as e:
        raise c.unsupported(e.message) from None


@aten_converter("aten.scaled_dot_product_attention")
def _sdpa(c: _Ctx):
    q, k, v = c.arg(0), c.arg(1), c.arg(2)
    mask, causal = c.arg(3, "attn_mask"), bool(c.arg(5, "is_causal", False))
    if c.arg(4, "dropout_p", 0.0):
        raise c.unsupported("scaled_dot_product_attention with dropout")
    if c.kwargs.get("enable_gqa"):
        raise c.unsupported("scaled_dot_product_attention with grouped-query attention")
    scale = c.kwargs.get("scale")
    scale = 1 / math.sqrt(q.type.shape[-1]) if scale is None else scale
    perm = tuple(range(_rank(k) - 2)) + (_rank(k) - 1, _rank(k) - 2)
    s = c.emit("matmul", [c.emit("mul", [q, c.const(scale, q)]), c.emit("transpose", [k], perm=perm)])
    lq, lk = q.type.shape[-2], k.type.shape[-2]
    if causal:
        mask = c.const(np.tril(np.ones((lq, lk), bool)))
    if mask is not None:
        if mask.type.dtype is DType.bool:
            mask = c.emit("where", [mask, c.const(0.0, s), c.const(-np.inf, s)])
        s = c.emit("add", [s, mask])
    return c.emit("matmul", [c.emit("softmax", [s], axis=-1), v])


# ---- more shapes and indexing -------------------------------------------------------------------

@aten_converter("aten.unflatten")
def _unflatten(c: _Ctx):
    x = c.arg(0)
    axis = _axis(c.arg(1), _rank(x))
    sizes = _resolve(c.arg(2), x.type.shape[axis])
    return c.emit("reshape", [x], shape=x.type.shape[:axis] + sizes + x.type.shape[axis + 1:])


@aten_converter("aten.unbind")
def _unbind(c: _Ctx):
    x = c.arg(0)
    axis = _axis(c.arg(1, "dim", 0), _rank(x))
    parts = _split(c, [1] * x.type.shape[axis], axis)
    return [c.emit("squeeze", [p], axes=(axis,)) for p in parts]


@aten_converter("aten.pad", "aten.constant_pad_nd")
def _pad(c: _Ctx):
    x = c.arg(0)
    pad = list(c.arg(1))
    mode = "constant" if c.target.startswith("aten.constant_pad_nd") else c.arg(2, "mode", "constant")
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise c.unsupported(f"pad mode {mode!r}")
    value = c.arg(2 if c.target.startswith("aten.constant_pad_nd") else 3, "value")
    r = _rank(x)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):     # torch lists (begin, end) from the last axis backwards
        begins[r - 1 - i], ends[r - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    if any(p < 0 for p in begins + ends):
        raise c.unsupported("negative padding")
    return c.emit("pad", [x], pads=(*begins, *ends), mode=modes[mode],
                  value=float(value or 0.0))


@aten_converter("aten.roll")
def _roll(c: _Ctx):
    x = c.arg(0)
    shifts = _pair(c.arg(1), 1)
    dims = c.arg(2, "dims", ())
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:                       # roll of the flattened tensor
        flat = c.emit("reshape", [x], shape=(x.type.numel,))
        return c.emit("reshape", [_roll_axis(c, flat, shifts[0], 0)], shape=x.type.shape)
    for s, d in zip(shifts, dims):
        x = _roll_axis(c, x, s, _axis(d, _rank(x)))
    return x


def _roll_axis(c: _Ctx, x: Value, shift: int, axis: int) -> Value:
    n = x.type.shape[axis]
    s = shift % n if n else 0
    if s == 0:
        return x
    tail = c.emit("slice", [x], starts=(n - s,), ends=(n,), axes=(axis,), steps=(1,))
    head = c.emit("slice", [x], starts=(0,), ends=(n - s,), axes=(axis,), steps=(1,))
    return c.emit("concat", [tail, head], axis=axis)


@aten_converter("aten.fill")
def _fill(c: _Ctx):
    x = c.arg(0)
    value = c.arg(1)
    if isinstance(value, Value):
        return c.emit("expand", [c.emit("cast", [value], to=x.type.dtype.value)
                                 if value.type.dtype is not x.type.dtype else value], shape=x.type.shape)
    return c.graph.add_const(np.full(x.type.shape, value, x.type.dtype.np), c.graph.unique_name("fill"))


@aten_converter("aten.slice_scatter")
def _slice_scatter(c: _Ctx):
    x, src = c.arg(0), c.arg(1)
    axis = _axis(c.arg(2, "dim", 0), _rank(x))
    n = x.type.shape[axis]
    start, end, step = slice(c.arg(3, "start"), c.arg(4, "end"), c.arg(5, "step", 1)).indices(n)
    if step != 1:
        raise c.unsupported("slice_scatter with a step")
    parts = [c.emit("slice", [x], starts=(0,), ends=(start,), axes=(axis,), steps=(1,)) if start else None,
             src,
             c.emit("slice", [x], starts=(end,), ends=(n,), axes=(axis,), steps=(1,)) if end < n else None]
    parts = [p for p in parts if p is not None]
    return parts[0] if len(parts) == 1 else c.emit("concat", parts, axis=axis)


@aten_converter("aten.index.Tensor")
def _index(c: _Ctx):
    x, indices = c.arg(0), list(c.arg(1))
    given = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(given) != 1:
        raise c.unsupported("indexing with more than one index tensor")
    axis, ix = given[0]
    if ix.type.dtype is DType.bool:
        raise c.unsupported("boolean mask indexing (a data-dependent shape)")
    return c.emit("gather", [x, ix], axis=axis)
