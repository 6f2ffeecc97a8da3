"""torch.export capture (custom-op boundaries), the ATen converter registry, the
context a converter gets and the importer that drives them; helpers converters share."""
from __future__ import annotations

import contextlib
import inspect
import itertools
import operator
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ...errors import BevirError, UnsupportedError
from ...extras import require
from ...ir.graph import Graph, Value
from ...ir.types import DType, TensorType

torch = require("torch")
nn = torch.nn

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

TORCH_DTYPES = {torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16,
                 torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16,
                 torch.int8: DType.i8, torch.uint8: DType.u8, torch.bool: DType.bool}

Converter = Callable[["AtenCtx"], Any]
ATEN: dict[str, Converter] = {}


def aten_converter(*names: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen ops, by overload name (``"aten.add.Tensor"``) or packet
    name (``"aten.add"``: every overload)."""
    def register(fn: Converter) -> Converter:
        for n in names:
            ATEN[n] = fn
        return fn
    return register


def supported_aten_ops() -> list[str]:
    """The ATen ops (packets and overloads) the importer converts."""
    return sorted(ATEN)


def aten_table(columns: int = 4) -> str:
    """The supported ATen ops as a Markdown table (docs/frontends.md holds it)."""
    names = [f"`{n}`" for n in supported_aten_ops()]
    rows = [names[i:i + columns] for i in range(0, len(names), columns)]
    lines = ["|" + " |" * columns, "|" + "---|" * columns]
    lines += ["| " + " | ".join(r + [""] * (columns - len(r))) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def ir_dtype(t: torch.dtype, loc: str) -> DType:
    try:
        return TORCH_DTYPES[t]
    except KeyError:
        raise UnsupportedError(f"dtype {t} is not supported", loc=loc) from None


class AtenCtx:
    """What a converter sees of one exported node: its arguments with fx nodes replaced by
    bevir values, and helpers to emit nodes with the node's provenance."""

    def __init__(self, imp: Importer, node: torch.fx.Node):
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

    def emitter(self) -> Callable[[str, Sequence[Value | None], dict], Value]:
        """``emit`` taking the attributes as a dict (the shared decompositions' callback)."""
        return lambda op, inputs, attrs=None: self.emit(op, inputs, **(attrs or {}))


class Importer:
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
            t = TensorType(tuple(int(d) for d in meta.shape), ir_dtype(meta.dtype, node.name))
            self.env[node.name] = self.graph.add_input(next(user_names, node.name), t)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            array = values[spec.target].detach().cpu().numpy().copy()
            self.env[node.name] = self.graph.add_const(array, spec.target)
        else:
            raise UnsupportedError(f"exported input kind {spec.kind} is not supported",
                                   loc=node.name)

    def call(self, node: torch.fx.Node) -> None:
        c = AtenCtx(self, node)
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
        fn = ATEN.get(overload) or ATEN.get(packet)
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


def _tensor_args(c: AtenCtx) -> list[Value]:
    flat = list(itertools.chain.from_iterable(a if isinstance(a, (list, tuple)) else [a]
                                              for a in [*c.args, *c.kwargs.values()]))
    return [a for a in flat if isinstance(a, Value)]


#: ops that make tensors out of nothing; folded even with no tensor operand
_FACTORIES = ("aten.linspace", "aten.arange", "aten.ones", "aten.zeros", "aten.full",
              "aten.scalar_tensor", "aten.empty", "aten.tensor", "aten.eye", "aten.lift_fresh_copy")


def _foldable(c: AtenCtx) -> bool:
    tensors = _tensor_args(c)
    if tensors:
        return (all(v.is_const for v in tensors)
                and c.target not in ("aten._assert_tensor_metadata.default",))
    # factories; and arithmetic on Python numbers (a data-dependent value draft_export
    # specialized: item() of a constant, its comparisons, sym_ite, _assert_scalar)
    return c.target.startswith(_FACTORIES) or not isinstance(c.node.target, torch._ops.OpOverload) \
        or c.target.startswith(("aten._assert_scalar", "aten.sym_constrain_range"))


def _fold(c: AtenCtx, node: torch.fx.Node) -> Any:
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
            ir_dtype(o.dtype, c.loc)
            return c.graph.add_const(a, c.graph.unique_name(node.name))
        if isinstance(o, (list, tuple)):
            return type(o)(to_ir(x) for x in o)
        return o
    return to_ir(out)


def _boundary(c: AtenCtx) -> tuple[Value, ...]:
    b = c.imp.boundaries[c.args[1]]
    inputs = list(c.args[0])
    attrs = dict(b.spec.attrs(b.module))
    node = c.graph.create_node(b.spec.op, inputs, attrs, loc=b.path)
    return tuple(node.outputs)


#: how :func:`from_torch` captures a module (its ``export`` argument)
EXPORTS = ("auto", "export", "strict", "draft")


def from_torch(module: nn.Module, example_inputs: Sequence[Any], *,
               custom_ops: Mapping[type, CustomOp] | None = None,
               input_names: Sequence[str] | None = None,
               output_names: Sequence[str] | None = None, name: str | None = None,
               export: str = "auto") -> Graph:
    """Import ``module`` (in eval mode) through ``torch.export`` into a bevir Graph.

    ``example_inputs`` fix the (static) shapes; ``None`` entries select the forward's branch
    without that input. ``custom_ops`` maps module classes to :class:`CustomOp` specs. Graph
    inputs are named ``input_names`` (default: the forward's argument names), outputs
    ``output_names`` (default ``output_0``, ...). Unsupported ATen ops raise
    ``bevir.UnsupportedError`` naming the module path.

    ``export``: ``"export"`` is ``torch.export.export`` (non-strict); ``"strict"`` the same
    with TorchDynamo's tracing; ``"draft"`` ``torch.export.draft_export``, which specializes
    a branch on a data-dependent value (a tensor the model keeps as an attribute, an
    ``.item()``) on the example inputs. ``"auto"`` (the default) is ``"export"``, then
    ``"draft"`` where torch.export cannot guard on a data-dependent value (with a warning
    saying so): bevir's shapes are static, so the graph is the one the example inputs take.
    """
    if export not in EXPORTS:
        raise ValueError(f"export must be one of {', '.join(EXPORTS)}, not {export!r}")
    args = tuple(example_inputs)
    modes = {m: m.training for m in module.modules()}
    module.eval()
    with _boundaries(module, dict(custom_ops or {})) as boundaries:
        try:
            ep = _export(module, args, export)
            if _mutates(ep):   # in-place ops (x[a:b] = v) become their functional forms
                ep = ep.run_decompositions({})
        except BevirError:
            raise
        except Exception as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, BevirError):
                raise cause from None
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise UnsupportedError(f"torch.export failed: {type(e).__name__}: {first}") from e
        finally:
            for m, training in modes.items():     # the caller's module is left as it was
                m.training = training
    if input_names is None:
        params = list(inspect.signature(module.forward).parameters)
        input_names = [p for p, a in zip(params, args) if a is not None]
    return Importer(ep, boundaries, list(input_names), output_names,
                     name or type(module).__name__).run()


def _export(module: nn.Module, args: tuple, how: str) -> torch.export.ExportedProgram:
    """``module`` captured as ``how`` says (see :func:`from_torch`)."""
    if how == "draft":
        return _draft_export(module, args)
    try:
        return torch.export.export(module, args, strict=how == "strict")
    except Exception as e:
        if how != "auto" or not _data_dependent(e):
            raise
        warnings.warn(f"torch.export cannot guard on a data-dependent value "
                      f"({str(e).splitlines()[0]}); imported with torch.export.draft_export, "
                      "which takes the branch of the example inputs", stacklevel=3)
        return _draft_export(module, args)


def _data_dependent(e: Exception) -> bool:
    shapes = require("torch.fx.experimental.symbolic_shapes")
    return isinstance(e, shapes.GuardOnDataDependentSymNode) or "data-dependent" in str(e)


def _draft_export(module: nn.Module, args: tuple) -> torch.export.ExportedProgram:
    """torch.export.draft_export, its report logged at error level only (bevir warns)."""
    import logging
    log = logging.getLogger("torch.export._draft_export")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return torch.export.draft_export(module, args)
    finally:
        log.setLevel(level)


def _mutates(ep: torch.export.ExportedProgram) -> bool:
    """Whether an op writes into a tensor (detach_ only changes autograd state)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable and n.target is not torch.ops.aten.detach_.default
               for n in ep.graph.nodes)


# ---- ATen converters ------------------------------------------------------------------------

def rank_of(v: Value) -> int:
    return v.type.rank


def norm_dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def promote(c: AtenCtx, a: Any, b: Any) -> tuple[Value, Value]:
    """Both operands as Values of one dtype, following torch's promotion."""
    if not isinstance(a, Value):
        a, b = promote(c, b, a)[::-1] if isinstance(b, Value) else (c.const(a), c.const(b))
        return a, b
    if not isinstance(b, Value):
        if a.type.dtype is DType.bool or (a.type.dtype.is_int and isinstance(b, float)):
            a = c.emit("cast", [a], to="f32")
        return a, c.const(b, a)
    if a.type.dtype != b.type.dtype:
        to = torch.promote_types(*(torch_dtype(v.type.dtype) for v in (a, b)))
        to = ir_dtype(to, c.loc).value
        a = a if a.type.dtype.value == to else c.emit("cast", [a], to=to)
        b = b if b.type.dtype.value == to else c.emit("cast", [b], to=to)
    return a, b


def torch_dtype(d: DType) -> torch.dtype:
    return next(t for t, b in TORCH_DTYPES.items() if b is d)


def pair(v: Any, n: int = 2) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(int(x) for x in (v * n if len(v) == 1 else v))
