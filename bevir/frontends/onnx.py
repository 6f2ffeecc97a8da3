"""ONNX import: ``from_onnx(model) -> Graph`` for models of opsets 10..28.

Each ONNX op type has one small converter, registered with :func:`converts`, that maps a
node onto bevir ops (decomposing where bevir has no direct equivalent). A converter gets a
:class:`NodeCtx`: the node, its inputs as bevir values, helpers to read attributes, to
require an input to be a constant and to emit bevir nodes.

Shapes in bevir are static, so every operand that determines a shape (a Reshape shape,
Slice starts, Pad pads, Resize sizes...) must be a constant at import time; other operands
(Clip bounds, quantization scales and zero points...) may be graph inputs. Nodes whose
inputs are all constants are evaluated right away with the registry's reference semantics
(constant folding), which makes the Shape -> Gather -> Concat -> Reshape chains of exported
models collapse into constants; an all-constant node of an op bevir has no converter for
(Mod, ScatterND, ...) is evaluated with onnx's reference evaluator, so only data-path ops
need converters.
Every node created carries the ONNX node name as its ``loc``.

Each op's versions: a converter sees the model's opset (``c.opset``) and the op's version
there (``c.version``, the schema's since_version). :data:`VERSION_NOTES` lists, per op, the
versions in the supported opsets whose inputs, outputs or attributes changed and what the
converter does about them; the other versions only added types or reworded the text.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import BevirError, InterpreterError, UnsupportedError
from ..ir.graph import Graph, Node, Value
from ..ir.limits import fold_bytes, nbytes, tensor_too_big
from ..ir.types import DType, TensorType
from ..ops import get_op

__all__ = ["import_onnx", "load_model", "is_qdq", "converts", "supported_ops", "NodeCtx", "OnnxLoadError",
           "NonConstantInputError", "VERSION_NOTES", "op_version",
           "MIN_OPSET", "MAX_OPSET"]

#: the default-domain opsets imported; MAX_OPSET is the newest one of the onnx package the
#: version notes were checked against (tests/test_onnx_opsets.py keeps them in step). An
#: older model imports when each of its ops has the version it has in MIN_OPSET.
MIN_OPSET, MAX_OPSET = 10, 28

_DEFAULT_DOMAINS = ("", "ai.onnx")

_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: DType.f32, onnx.TensorProto.DOUBLE: DType.f64,
    onnx.TensorProto.FLOAT16: DType.f16, onnx.TensorProto.INT64: DType.i64,
    onnx.TensorProto.INT32: DType.i32, onnx.TensorProto.INT16: DType.i16,
    onnx.TensorProto.INT8: DType.i8, onnx.TensorProto.UINT8: DType.u8,
    onnx.TensorProto.BOOL: DType.bool,
}


#: op type -> {version: what changed there and how the converter takes it}, for every
#: version in opsets MIN_OPSET..MAX_OPSET whose inputs, outputs, attributes or meaning differ
#: from the version before (an attribute a converter does not read is refused by the
#: registry, so a new attribute is safe by default; a moved or new input is not)
VERSION_NOTES: dict[str, dict[int, str]] = {
    "AveragePool": {19: "attribute 'dilations' (refused unless 1)"},
    "BatchNormalization": {14: "attribute 'training_mode', outputs running_mean/var (refused)"},
    "Cast": {19: "attribute 'saturate' (float8 targets only)",
             24: "attribute 'round_mode' (float8e8m0 targets only)"},
    "CastLike": {19: "attribute 'saturate' (float8 targets only)",
                 24: "attribute 'round_mode' (float8e8m0 targets only)"},
    "Clip": {11: "min/max moved from attributes to inputs (both read)"},
    "Constant": {11: "attribute 'sparse_value' (refused)",
                 12: "attributes value_float(s)/value_int(s) read, value_string(s) refused"},
    "DequantizeLinear": {13: "attribute 'axis' (per-axis scales)",
                         21: "attribute 'block_size' (refused unless 0)",
                         23: "attribute 'output_dtype' (refused unless float32)"},
    "Dropout": {12: "ratio moved to an input, training_mode input (refused when true)"},
    "Gemm": {11: "C became optional"},
    "GridSample": {20: "modes renamed (bilinear -> linear), N-D input (refused unless 4-D)"},
    "Pad": {11: "pads and the value moved from attributes to inputs (both read)",
            18: "input 'axes'", 19: "mode 'wrap'"},
    "QuantizeLinear": {13: "attribute 'axis' (per-axis scales)",
                       19: "attribute 'saturate' (float8 targets only)",
                       21: "attributes 'block_size' (refused unless 0) and 'output_dtype'",
                       23: "attribute 'precision' (refused unless float32)"},
    "Range": {27: "attribute 'stash_type': float16 computed in float32"},
    "ReduceMax": {18: "axes moved from an attribute to an input (both read)",
                  20: "bool operands"},
    "ReduceMin": {18: "axes moved from an attribute to an input (both read)",
                  20: "bool operands"},
    **{op: {18: "axes moved from an attribute to an input (both read)"}
       for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMean",
                  "ReduceSumSquare")},
    "ReduceSum": {13: "axes moved from an attribute to an input (both read)"},
    "Reshape": {14: "attribute 'allowzero'"},
    "Resize": {10: "inputs X and scales: asymmetric coordinates, nearest rounds down",
               11: "inputs roi and sizes, coordinate_transformation_mode and nearest_mode",
               13: "roi and scales became optional",
               18: "attributes 'axes', 'antialias' and 'keep_aspect_ratio_policy' (the last "
                   "two refused unless default)",
               19: "coordinate_transformation_mode 'half_pixel_symmetric'"},
    "Shape": {15: "attributes 'start' and 'end'"},
    "Softmax": {13: "normalizes along 'axis' alone (before: the axis and all after it, "
                    "default axis 1)"},
    "LogSoftmax": {13: "normalizes along 'axis' alone (before: the axis and all after it, "
                       "default axis 1)"},
    "Split": {13: "split moved from an attribute to an input (both read)",
              18: "attribute 'num_outputs'"},
    "Squeeze": {13: "axes moved from an attribute to an input (both read)"},
    "TopK": {11: "attributes 'largest' and 'sorted'"},
    "Unsqueeze": {13: "axes moved from an attribute to an input (both read)"},
}


def op_version(op_type: str, opset: int) -> int | None:
    """The version (since_version) of default-domain ``op_type`` in ``opset``; None when the
    op is not defined there."""
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


class OnnxLoadError(BevirError):
    """The ONNX file could not be read (truncated, corrupt, not a model)."""


class NonConstantInputError(UnsupportedError):
    """An operand bevir takes as an attribute (a shape, axes, pads...) is not a constant at
    import time; ``value_name`` is the ONNX value that would have to be constant."""

    def __init__(self, message: str, *, value_name: str, **where):
        self.value_name = value_name
        super().__init__(message, **where)


# ---- the converter registry ---------------------------------------------------------------

Converter = Callable[["NodeCtx"], "Value | Sequence[Value | None] | None"]


class _Entry:
    __slots__ = ("fn", "attrs")

    def __init__(self, fn: Converter, attrs: frozenset[str]):
        self.fn, self.attrs = fn, attrs


_CONVERTERS: dict[str, _Entry] = {}
#: converters of ops in other domains (com.microsoft contrib ops), by (domain, op_type)
_DOMAIN_CONVERTERS: dict[tuple[str, str], _Entry] = {}


def converts(*op_types: str, attrs: Sequence[str] = (),
             domain: str = "") -> Callable[[Converter], Converter]:
    """Register a converter for ONNX ``op_types`` of ``domain`` (default: ai.onnx);
    ``attrs`` are the attributes it reads (any other attribute on a node is rejected with
    UnsupportedError)."""
    table = _CONVERTERS if domain in _DEFAULT_DOMAINS else _DOMAIN_CONVERTERS

    def register(fn: Converter) -> Converter:
        for t in op_types:
            key = t if table is _CONVERTERS else (domain, t)
            if key in table:
                raise ValueError(f"ONNX op '{t}' has two converters")
            table[key] = _Entry(fn, frozenset(attrs))
        return fn
    return register


def supported_ops() -> frozenset[str]:
    """The ONNX op types (default domain) the importer has a converter for."""
    return frozenset(_CONVERTERS)


_MISSING = object()


_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                 "string_data")


def tensor_array(t: onnx.TensorProto, what: str, **where) -> np.ndarray:
    """A TensorProto's data as an array, refusing (before allocating) one whose declared
    shape holds more elements than the tensor stores or than this machine's memory."""
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise UnsupportedError(f"{what} has a negative dimension in {dims}", **where)
    numel = math.prod(dims)
    item = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize \
        if t.data_type in _ONNX_DTYPES else 1
    too_big = tensor_too_big(dims, item)
    if too_big:
        raise UnsupportedError(f"{what}: {too_big}", **where)
    if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type in _ONNX_DTYPES:
        stored = len(t.raw_data) if t.HasField("raw_data") else \
            max(len(getattr(t, f)) for f in _TYPED_FIELDS)
        held = stored // item if t.HasField("raw_data") else stored
        if held != numel or (t.HasField("raw_data") and stored % item):
            raise UnsupportedError(f"{what} declares shape {dims} ({numel} elements) but "
                                   f"holds {stored} {'bytes' if t.HasField('raw_data') else 'values'}",
                                   **where)
    try:
        return np.asarray(numpy_helper.to_array(t), order="C")
    except Exception as e:   # noqa: BLE001  (malformed data, external file missing...)
        raise UnsupportedError(f"{what} cannot be read: {type(e).__name__}: {e}",
                               **where) from None


def _attr_value(a: onnx.AttributeProto, **where) -> Any:
    try:
        v = onnx.helper.get_attribute_value(a)
    except Exception as e:   # noqa: BLE001  (an attribute type protobuf does not know)
        raise UnsupportedError(f"attribute '{a.name}' cannot be read: {e}", **where) from None
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, onnx.TensorProto):
        return tensor_array(v, f"attribute '{a.name}'", **where)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode(errors="replace") for x in v]
    return v


class NodeCtx:
    """What a converter sees of one ONNX node."""

    def __init__(self, imp: _Importer, node: onnx.NodeProto, index: int,
                 version: int | None = None):
        self.imp = imp
        self.node = node
        self.op_type = node.op_type
        self.loc = node.name or f"{node.op_type}_{index}"
        self.opset = imp.opset
        #: the op's version in the model's opset (since_version); None for other domains
        self.version = version
        self.graph = imp.graph
        self.inputs: list[Value | None] = [imp.lookup(n, self) if n else None for n in node.input]
        self.outputs: list[str] = list(node.output)
        self.attrs: dict[str, Any] = {a.name: _attr_value(a, op=self.op_type, node=self.loc)
                                      for a in node.attribute}
        self.created: set[int] = set()      # ids of the values this conversion made
        hint = next((o for o in node.output if o), self.loc)
        self._hint = hint

    # ---- errors ------------------------------------------------------------------------
    def unsupported(self, message: str) -> UnsupportedError:
        """An UnsupportedError naming this node, its op and the opset (to raise)."""
        return UnsupportedError(f"{message} (ONNX {self.op_type}, opset {self.opset})",
                                op=self.op_type, node=self.loc)

    # ---- inputs, outputs and attributes ------------------------------------------------
    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def has_input(self, i: int) -> bool:
        return self.input(i) is not None

    def output_used(self, i: int) -> bool:
        return i < len(self.outputs) and bool(self.outputs[i])

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        if name in self.attrs:
            return self.attrs[name]
        if default is _MISSING:
            raise self.unsupported(f"missing required attribute '{name}'")
        return default

    def const(self, i: int, what: str, optional: bool = False,
              why: str = "it determines a shape and bevir shapes are static"
              ) -> np.ndarray | None:
        """Input ``i`` as a numpy array; it must be a constant at import time (``why``
        says why, in the error).

        An omitted optional input gives None (``optional``) or raises.
        """
        v = self.input(i)
        if v is None:
            if optional:
                return None
            raise self.unsupported(f"input {i} ({what}) is required")
        if not v.is_const:
            raise NonConstantInputError(
                f"input {i} ({what}, '{self.node.input[i]}') must be a constant at import "
                f"time: {why} (ONNX {self.op_type}, opset {self.opset})",
                value_name=self.node.input[i], op=self.op_type, node=self.loc)
        return np.asarray(v.const)

    def ints(self, i: int, what: str, optional: bool = False) -> list[int] | None:
        a = self.const(i, what, optional)
        return None if a is None else [int(x) for x in a.reshape(-1)]

    def require_float(self, *values: Value | None) -> None:
        for v in values:
            if v is not None and not v.type.dtype.is_float:
                raise self.unsupported(f"{v.type.dtype} operands (bevir's op takes floats)")

    # ---- building ----------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[Value | None], attrs: dict | None = None,
             n_out: int | None = None) -> Any:
        """Create a bevir node (or fold it when every input is a constant); returns its
        result, or the list of results when the op has several (or ``n_out`` is given)."""
        outs = self.imp.emit(op, list(inputs), attrs or {}, self)
        self.created.update(id(v) for v in outs)
        if n_out is None and len(outs) == 1:
            return outs[0]
        return outs

    def constant(self, array, like: Value | None = None) -> Value:
        """Add a constant (cast to ``like``'s dtype when given)."""
        a = np.asarray(array)
        if like is not None:
            a = a.astype(like.type.dtype.np)
        v = self.imp.add_const(a, self._hint + "_const", self)
        self.created.add(id(v))
        return v

    def fresh(self, suffix: str) -> str:
        return self.imp.fresh(f"{self._hint}_{suffix}")


# ---- the importer --------------------------------------------------------------------------

class _Importer:
    def __init__(self, model: onnx.ModelProto, keep_dequantize: bool = False):
        self.model = model
        self.keep_dequantize = keep_dequantize   # fold-qdq reads the dequantized constants
        self.graph = Graph(model.graph.name or "main")
        self.values: dict[str, Value] = {}
        self.opset = _default_opset(model)
        g = model.graph
        self.reserved = {n for node in g.node for n in list(node.input) + list(node.output) if n}
        self.reserved |= {v.name for v in g.input} | {v.name for v in g.output}
        self.reserved |= {t.name for t in g.initializer}

    def fresh(self, hint: str) -> str:
        cand, k = hint, 0
        while cand in self.reserved or self.graph.unique_name(cand) != cand:
            k += 1
            cand = f"{hint}_{k}"
        return cand

    def lookup(self, name: str, c: NodeCtx) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise UnsupportedError(f"input '{name}' is not defined (a subgraph or outer-scope "
                                   "value?)", op=c.op_type, node=c.loc) from None

    def add_const(self, array: np.ndarray, hint: str, c: NodeCtx | None) -> Value:
        try:
            TensorType.of(array)
        except TypeError:
            where = dict(op=c.op_type, node=c.loc) if c else {}
            raise UnsupportedError(f"constant of dtype {array.dtype} is not supported",
                                   **where) from None
        return self.graph.add_const(array, self.fresh(hint))

    def emit(self, op: str, inputs: list[Value | None], attrs: dict, c: NodeCtx) -> list[Value]:
        opdef = get_op(op)
        if opdef.pure and all(v is None or v.is_const for v in inputs) \
                and not (self.keep_dequantize and op == "dequantize"):
            folded = self._fold(opdef, inputs, attrs, c)
            if folded is not None:
                return folded
        node = self.graph.create_node(op, inputs, attrs, loc=c.loc)
        # rename the auto-named results to fresh, reservation-free names
        for i, v in enumerate(node.outputs):
            name = self.fresh(f"{c._hint}_{op}" + (f"_{i}" if len(node.outputs) > 1 else ""))
            self.graph.rename(v, name)
        return list(node.outputs)

    def _fold(self, opdef, inputs, attrs, c: NodeCtx) -> list[Value] | None:
        """The results of a node whose inputs are constants, as constants; None where they
        are larger than the folding limit (the node stays)."""
        attrs = opdef.check_attrs(attrs, where=dict(op=opdef.name, loc=c.loc))
        node = Node(opdef.name, inputs, attrs, c.loc)
        types = opdef.infer_node(node)
        if sum(t.nbytes for t in types) > fold_bytes():
            return None
        node.outputs = [Value("folded", t) for t in types]
        try:
            arrays = opdef.run(node, [None if v is None else v.const for v in inputs])
        except BevirError:
            raise
        except Exception as e:
            raise InterpreterError(f"constant folding failed: {type(e).__name__}: {e}",
                                   op=opdef.name, loc=c.loc) from e
        outs = []
        for t, a in zip(types, arrays, strict=True):
            a = np.asarray(a)
            if a.shape != t.shape:
                raise InterpreterError(f"constant folding gave shape {list(a.shape)}, "
                                       f"declared {t}", op=opdef.name, loc=c.loc)
            a = a.astype(t.dtype.np, copy=False)
            outs.append(self.graph.add_const(a, self.fresh(f"{c._hint}_{opdef.name}"), type=t))
        return outs

    # ---- driving -----------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.model.graph
        inits = {t.name for t in g.initializer}
        for t in g.initializer:
            if t.data_type not in _ONNX_DTYPES:
                raise UnsupportedError(f"initializer '{t.name}' has unsupported dtype "
                                       f"{_dtype_name(t.data_type)}")
            arr = tensor_array(t, f"initializer '{t.name}'")
            try:
                TensorType.of(arr)
            except TypeError:
                raise UnsupportedError(f"initializer '{t.name}' has unsupported dtype "
                                       f"{onnx.TensorProto.DataType.Name(t.data_type)}") from None
            self.values[t.name] = self.graph.add_const(arr, t.name)
        if g.sparse_initializer:
            raise UnsupportedError("sparse initializers are not supported")
        for vi in g.input:
            if vi.name in inits:
                continue
            self.values[vi.name] = self.graph.add_input(vi.name, _value_type(vi))
        for index, node in _toposorted(g.node, set(self.values)):
            self.convert(node, index)
        for vi in g.output:
            if vi.name not in self.values:
                raise UnsupportedError(f"graph output '{vi.name}' is not produced by any node")
            _check_declared_shape(vi, self.values[vi.name])
            self.graph.set_output(vi.name, self.values[vi.name])
        self._prune()
        return self.graph

    def convert(self, node: onnx.NodeProto, index: int) -> None:
        loc = node.name or f"{node.op_type}_{index}"
        if node.domain not in _DEFAULT_DOMAINS:
            entry = _DOMAIN_CONVERTERS.get((node.domain, node.op_type))
            if entry is None and not self.all_constant(node):
                raise UnsupportedError(f"unsupported ONNX op '{node.op_type}' of domain "
                                       f"'{node.domain}' (default-domain opset {self.opset})",
                                       op=node.op_type, node=loc)
        else:
            entry = _CONVERTERS.get(node.op_type)
        if entry is None and self.all_constant(node):
            self.fold_with_reference(node, loc)
            return
        if entry is None and node.domain in _DEFAULT_DOMAINS:
            raise UnsupportedError(f"unsupported ONNX op '{node.op_type}' (opset {self.opset})",
                                   op=node.op_type, node=loc)
        version = None
        if node.domain in _DEFAULT_DOMAINS:
            version = op_version(node.op_type, self.opset)
            if version is None:
                raise UnsupportedError(f"ONNX op '{node.op_type}' is not defined in opset "
                                       f"{self.opset}", op=node.op_type, node=loc)
            if self.opset < MIN_OPSET and version != op_version(node.op_type, MIN_OPSET):
                raise UnsupportedError(
                    f"ONNX {node.op_type}-{version} (opset {self.opset}) predates the "
                    f"definition of opset {MIN_OPSET}: bevir supports opsets "
                    f"{MIN_OPSET}..{MAX_OPSET} (and older models whose ops are unchanged "
                    f"by then)", op=node.op_type, node=loc)
        c = NodeCtx(self, node, index, version)
        for a in node.attribute:
            if a.name not in entry.attrs:
                raise c.unsupported(f"attribute '{a.name}' is not supported")
        try:
            result = entry.fn(c)
        except (TypeError, AttributeError, IndexError, KeyError, ValueError) as e:
            # A malformed node (a missing input, an attribute of the wrong kind) reaches the
            # converter's assumptions: report it as the node's error, not a Python crash.
            raise OnnxLoadError(f"malformed ONNX {node.op_type} node: {type(e).__name__}: {e}",
                                op=node.op_type, node=loc) from e
        results = [result] if isinstance(result, Value) or result is None else list(result)
        if len(results) < len(node.output):
            results += [None] * (len(node.output) - len(results))
        named: dict[int, Value] = {}    # results already given an ONNX name
        for i, (name, v) in enumerate(zip(node.output, results)):
            if not name:
                continue
            if v is None:
                raise c.unsupported(f"output {i} ('{name}') is not supported")
            if id(v) in named:
                v = named[id(v)]
            elif id(v) in c.created and v.name != name:
                old = v
                if v.is_const and not v.uses:   # cheaper than renaming a constant
                    self.graph.erase_const(v)
                    v = self.graph.add_const(v.const, name, type=v.type)
                else:
                    self.graph.rename(v, name)
                named[id(old)] = v
            self.values[name] = v

    def all_constant(self, node: onnx.NodeProto) -> bool:
        """Every input given is a constant (nodes with subgraphs are never folded: their
        bodies may read outer values)."""
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            return False
        return all(n in self.values and self.values[n].is_const for n in node.input if n)

    def fold_with_reference(self, node: onnx.NodeProto, loc: str) -> None:
        """Evaluate a node bevir has no converter for, whose inputs are all constants, with
        onnx's reference evaluator (constant folding of any op: only data-path ops need
        converters)."""
        from onnx.reference import ReferenceEvaluator
        inits = [numpy_helper.from_array(np.asarray(self.values[n].const), f"in{i}")
                 for i, n in enumerate(node.input) if n]
        renamed = {n: f"in{i}" for i, n in enumerate(node.input) if n}
        one = onnx.helper.make_node(node.op_type, [renamed.get(n, "") for n in node.input],
                                    [f"out{i}" if n else "" for i, n in enumerate(node.output)],
                                    domain=node.domain)
        one.attribute.extend(node.attribute)
        outs = [onnx.helper.make_empty_tensor_value_info(f"out{i}")
                for i, n in enumerate(node.output) if n]
        model = onnx.helper.make_model(
            onnx.helper.make_graph([one], "fold", [], outs, initializer=inits),
            opset_imports=list(self.model.opset_import), ir_version=self.model.ir_version)
        _check_folded(None, _predicted_bytes(model), f"folding '{node.op_type}'",
                      op=node.op_type, node=loc)
        try:
            arrays = ReferenceEvaluator(model).run(None, {})
        except Exception as e:   # noqa: BLE001  (the evaluator's own errors, e.g. no kernel)
            raise UnsupportedError(f"unsupported ONNX op '{node.op_type}' (opset {self.opset}); "
                                   f"its inputs are constants but folding it failed: "
                                   f"{type(e).__name__}: {e}", op=node.op_type,
                                   node=loc) from None
        for name, a in zip([n for n in node.output if n], arrays):
            a = np.asarray(a, order="C")
            try:
                TensorType.of(a)
            except TypeError:
                raise UnsupportedError(f"folding gave a constant of dtype {a.dtype}, which "
                                       "bevir does not support", op=node.op_type,
                                       node=loc) from None
            self.values[name] = self.graph.add_const(a, self.graph.unique_name(name))

    def _prune(self) -> None:
        """Drop constants nothing uses (the leftovers of constant folding)."""
        outs = {id(v) for v in self.graph.outputs.values()}
        for v in list(self.graph.constants.values()):
            if not v.uses and id(v) not in outs:
                self.graph.erase_const(v)


def _predicted_bytes(model: onnx.ModelProto) -> int:
    """The bytes of a one-node model's outputs by ONNX shape inference (0 where it cannot
    tell: the evaluator then runs unchecked)."""
    try:
        outputs = onnx.shape_inference.infer_shapes(model, data_prop=True).graph.output
    except Exception:   # noqa: BLE001  (inference's own errors: the evaluator reports them)
        return 0
    total = 0
    for vi in outputs:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if not t.HasField("shape") or min(dims, default=0) < 0 or t.elem_type not in _ONNX_DTYPES:
            return 0
        total += nbytes(dims, _ONNX_DTYPES[t.elem_type].np.itemsize)
    return total


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedError("the model imports no default-domain (ai.onnx) opset; "
                               f"bevir supports opsets {MIN_OPSET}..{MAX_OPSET}")
    v = max(versions)
    if not 1 <= v <= MAX_OPSET:
        raise UnsupportedError(f"unsupported ONNX opset {v}: bevir supports opsets "
                               f"{MIN_OPSET}..{MAX_OPSET}")
    return v


def _dtype_name(onnx_type: int) -> str:
    if onnx_type in onnx.TensorProto.DataType.values():
        return onnx.TensorProto.DataType.Name(onnx_type)
    return str(onnx_type)


def _check_folded(c: NodeCtx | None, n_bytes: int, what: str, **where) -> None:
    """Refuse a constant that folding would make above the folding limit, before it is
    allocated (an op without a bevir node cannot stay a node)."""
    if n_bytes > fold_bytes():
        message = (f"{what}: a constant of {n_bytes:,} bytes, above the folding limit "
                   f"({fold_bytes():,} bytes; $BEVIR_MAX_FOLD_BYTES or bevir.limits raise it)")
        raise c.unsupported(message) if c is not None else UnsupportedError(message, **where)


def _value_type(vi: onnx.ValueInfoProto) -> TensorType:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        raise UnsupportedError(f"graph input '{vi.name}' is not a tensor "
                               f"({t.WhichOneof('value')})")
    tt = t.tensor_type
    if tt.elem_type not in _ONNX_DTYPES:
        raise UnsupportedError(f"graph input '{vi.name}' has unsupported dtype "
                               f"{_dtype_name(tt.elem_type)}")
    if not tt.HasField("shape"):
        raise UnsupportedError(f"graph input '{vi.name}' has no static shape (unknown rank)")
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(d.dim_value)
        else:
            sym = f" '{d.dim_param}'" if d.HasField("dim_param") else ""
            raise UnsupportedError(f"graph input '{vi.name}' has a symbolic/unknown "
                                   f"dimension{sym} at axis {i}: bevir shapes are static")
    dtype = _ONNX_DTYPES[tt.elem_type]
    too_big = tensor_too_big(dims, dtype.np.itemsize)
    if too_big:
        raise UnsupportedError(f"graph input '{vi.name}': {too_big}")
    return TensorType(tuple(dims), dtype)


def _check_declared_shape(vi: onnx.ValueInfoProto, v: Value) -> None:
    """A graph output's declared shape must not contradict the computed one: the rank, and
    every dimension declared as a number (symbolic or unknown ones match anything)."""
    from ..errors import VerifyError
    tt = vi.type.tensor_type
    if vi.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape"):
        return
    declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tt.shape.dim]
    computed = list(v.type.shape)
    if len(declared) != len(computed) or any(
            isinstance(d, int) and d != c for d, c in zip(declared, computed)):
        p = v.producer
        raise VerifyError(f"graph output '{vi.name}' declares shape {declared}, its nodes "
                          f"compute {computed}", op=p.op if p else None,
                          loc=p.loc if p else None)


def _toposorted(nodes, available: set[str]) -> list[tuple[int, onnx.NodeProto]]:
    """(index, node) in a topological order (the given one when it already is)."""
    nodes = list(enumerate(nodes))
    have = set(available)

    def ready(n) -> bool:
        return all(not i or i in have for i in n.input)
    for _, n in nodes:
        if not ready(n):
            break
        have.update(o for o in n.output if o)
    else:
        return nodes
    have, pending, order = set(available), nodes, []
    while pending:
        now = [(i, n) for i, n in pending if ready(n)]
        if not now:
            return order + pending   # undefined inputs: reported by the importer
        for i, n in now:
            order.append((i, n))
            have.update(o for o in n.output if o)
        done = {i for i, _ in now}
        pending = [(i, n) for i, n in pending if i not in done]
    return order


def load_model(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(model))
        except Exception as e:   # noqa: BLE001
            raise OnnxLoadError(f"cannot parse ONNX model bytes: {e}") from None
    path = os.fspath(model)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    try:
        m = onnx.load(path)
    except Exception as e:   # noqa: BLE001  (protobuf DecodeError and friends)
        raise OnnxLoadError(f"cannot read ONNX model '{path}': {type(e).__name__}: {e}") from None
    if not m.HasField("graph"):
        raise OnnxLoadError(f"'{path}' holds no ONNX graph (truncated or not a model?)")
    return m


def is_qdq(model: onnx.ModelProto) -> bool:
    """Whether ``model`` is in QDQ format (has QuantizeLinear/DequantizeLinear nodes)."""
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def import_onnx(model: str | os.PathLike | onnx.ModelProto) -> Graph:
    """Import an ONNX model (a path or a ModelProto) as a bevir Graph, op for op.

    In a QDQ model dequantized constants stay ``dequantize`` nodes; :func:`bevir.from_onnx`
    then folds the groups into integer ops with the ``fold-qdq`` pass.

    Raises OnnxLoadError for a file that cannot be read and UnsupportedError for an op,
    attribute, dtype, dynamic shape or opset bevir does not support.
    """
    m = load_model(model)
    _default_opset(m)
    if m.functions:
        m = onnx.inliner.inline_local_functions(m)
    return _Importer(m, keep_dequantize=is_qdq(m)).run()


# ---- helpers shared by converters -----------------------------------------------------------

def norm_axis(axis: int, rank: int, c: NodeCtx) -> int:
    if not -rank <= axis < max(rank, 1):
        raise c.unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def _norm_axes(axes, rank: int, c: NodeCtx) -> tuple[int, ...]:
    return tuple(norm_axis(int(a), rank, c) for a in axes)


def _scalar(c: NodeCtx, value, like: Value) -> Value:
    return c.constant(np.asarray(value, dtype=like.type.dtype.np), like)


def _neg(c: NodeCtx, x: Value) -> Value:
    if x.type.dtype.is_float:
        return c.emit("neg", [x])
    return c.emit("sub", [_scalar(c, 0, x), x])


def _abs(c: NodeCtx, x: Value) -> Value:
    if x.type.dtype.is_float:
        return c.emit("abs", [x])
    return c.emit("max", [x, _neg(c, x)])


def _spatial_pads(c: NodeCtx, in_sizes, kernel, strides, dilations) -> tuple[int, ...]:
    """[top, left, bottom, right] from ``pads`` or ``auto_pad`` (static shapes)."""
    auto = c.attr("auto_pad", "NOTSET")
    n = len(in_sizes)
    if auto == "NOTSET":
        pads = tuple(int(p) for p in c.attr("pads", (0,) * (2 * n)))
        if len(pads) != 2 * n:
            raise c.unsupported(f"attribute 'pads' needs {2 * n} values, got {list(pads)}")
        return pads
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise c.unsupported(f"attribute 'auto_pad' = {auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return tuple(begin + end)


def spatial_params(c: NodeCtx, x: Value, kernel) -> tuple:
    strides = tuple(int(s) for s in c.attr("strides", (1, 1)))
    dil = tuple(int(d) for d in c.attr("dilations", (1, 1)))
    if len(strides) != 2 or len(dil) != 2:
        raise c.unsupported("attributes 'strides'/'dilations' must have 2 values (2-D only)")
    pads = _spatial_pads(c, x.type.shape[2:], kernel, strides, dil)
    return strides, pads, dil


def _require_rank4(c: NodeCtx, x: Value, what: str = "kernel") -> None:
    if x.type.rank != 4:
        raise c.unsupported(f"{x.type.rank - 2}-D {what} (input rank {x.type.rank}): "
                            "only 2-D (NCHW) is supported")


# ---- elementwise ---------------------------------------------------------------------------

_UNARY = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Erf": "erf", "Reciprocal": "reciprocal"}


@converts(*_UNARY)
def _unary(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit(_UNARY[c.op_type], [x])


@converts("Relu")
def _relu(c: NodeCtx):
    return c.emit("relu", [c.input(0)])


@converts("Neg")
def _neg_conv(c: NodeCtx):
    return _neg(c, c.input(0))


@converts("Abs")
def _abs_conv(c: NodeCtx):
    return _abs(c, c.input(0))


@converts("Gelu", attrs=("approximate",))
def _gelu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    approx = c.attr("approximate", "none")
    if approx not in ("none", "tanh"):
        raise c.unsupported(f"attribute 'approximate' = {approx!r}")
    return c.emit("gelu", [x], {"approximate": approx})


@converts("LeakyRelu", attrs=("alpha",))
def _leaky_relu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 0.01)
    neg = c.emit("less", [x, _scalar(c, 0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, _scalar(c, alpha, x)]), x])


@converts("PRelu")
def _prelu(c: NodeCtx):
    x, slope = c.input(0), c.input(1)
    c.require_float(x, slope)
    neg = c.emit("less", [x, _scalar(c, 0, x)])
    return c.emit("where", [neg, c.emit("mul", [x, slope]), x])


@converts("Elu", attrs=("alpha",))
def _elu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 1.0)
    neg = c.emit("less", [x, _scalar(c, 0, x)])
    em1 = c.emit("sub", [c.emit("exp", [x]), _scalar(c, 1, x)])
    return c.emit("where", [neg, c.emit("mul", [em1, _scalar(c, alpha, x)]), x])


@converts("Selu", attrs=("alpha", "gamma"))
def _selu(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    alpha = c.attr("alpha", 1.67326319217681884765625)
    gamma = c.attr("gamma", 1.05070102214813232421875)
    pos = c.emit("greater", [x, _scalar(c, 0, x)])
    em1 = c.emit("sub", [c.emit("exp", [x]), _scalar(c, 1, x)])
    y = c.emit("where", [pos, x, c.emit("mul", [em1, _scalar(c, alpha, x)])])
    return c.emit("mul", [y, _scalar(c, gamma, x)])


@converts("HardSigmoid", attrs=("alpha", "beta"))
def _hard_sigmoid(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("hardsigmoid", [x], {"alpha": c.attr("alpha", 0.2), "beta": c.attr("beta", 0.5)})


@converts("HardSwish")
def _hard_swish(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("hardswish", [x])


@converts("Softplus")
def _softplus(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return c.emit("log", [c.emit("add", [c.emit("exp", [x]), _scalar(c, 1, x)])])


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@converts(*_BINARY)
def _binary(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    if a.type.dtype is DType.bool or b.type.dtype is DType.bool:
        raise c.unsupported("bool operands")
    return c.emit(_BINARY[c.op_type], [a, b])


@converts("Pow")
def _pow(c: NodeCtx):
    x, y = c.input(0), c.input(1)
    if x.type.dtype is y.type.dtype:
        return c.emit("pow", [x, y])
    if x.type.dtype.is_float:   # the result has the base's type
        return c.emit("pow", [x, c.emit("cast", [y], {"to": x.type.dtype.value})])
    xf = c.emit("cast", [x], {"to": "f64"})
    yf = c.emit("cast", [y], {"to": "f64"})
    return c.emit("cast", [c.emit("pow", [xf, yf])], {"to": x.type.dtype.value})


@converts("Max", "Min", "Sum", "Mean")
def _variadic(c: NodeCtx):
    op = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[c.op_type]
    xs = [v for v in c.inputs if v is not None]
    if not xs:
        raise c.unsupported("no operands")
    y = xs[0]
    for v in xs[1:]:
        y = c.emit(op, [y, v])
    if c.op_type == "Mean" and len(xs) > 1:
        c.require_float(y)
        y = c.emit("div", [y, _scalar(c, len(xs), y)])
    return y


@converts("Clip", attrs=("min", "max"))
def _clip(c: NodeCtx):
    x = c.input(0)
    if c.version < 11:   # Clip-6: float bounds as attributes
        lo, hi = c.attrs.get("min"), c.attrs.get("max")
        bounds = [None if b is None else _scalar(c, b, x) for b in (lo, hi)]
    else:
        if "min" in c.attrs or "max" in c.attrs:
            raise c.unsupported("attributes 'min'/'max' (inputs since opset 11)")
        bounds = [c.input(i) for i in (1, 2)]
        bounds = [None if b is None or b.type.numel == 0 else b for b in bounds]
    for b in bounds:
        if b is not None and b.type.numel != 1:
            raise c.unsupported(f"a bound of shape {list(b.type.shape)} (a scalar is needed)")
    lo, hi = bounds
    if all(b is None or b.is_const for b in bounds) and x.type.dtype.is_float:
        return c.emit("clip", [x], {
            "min": None if lo is None else float(lo.const.reshape(())),
            "max": None if hi is None else float(hi.const.reshape(()))})
    # integer operands or bounds given at run time: min(max(x, lo), hi), exactly ONNX's
    y = x
    if lo is not None:
        y = c.emit("max", [y, _as_scalar(c, lo)])
    if hi is not None:
        y = c.emit("min", [y, _as_scalar(c, hi)])
    return y


def _as_scalar(c: NodeCtx, v: Value) -> Value:
    """A one-element operand as a rank-0 value (so that it broadcasts like a scalar)."""
    if v.type.rank == 0:
        return v
    return c.emit("reshape", [v], {"shape": ()})


@converts("Where")
def _where(c: NodeCtx):
    return c.emit("where", [c.input(0), c.input(1), c.input(2)])


_COMPARE = {"Equal": "equal", "Less": "less", "Greater": "greater"}


@converts(*_COMPARE)
def _compare(c: NodeCtx):
    return c.emit(_COMPARE[c.op_type], [c.input(0), c.input(1)])


@converts("GreaterOrEqual", "LessOrEqual")
def _compare_or_equal(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    strict = c.emit("greater" if c.op_type == "GreaterOrEqual" else "less", [a, b])
    true = c.constant(np.array(True))
    return c.emit("where", [strict, true, c.emit("equal", [a, b])])


@converts("Not")
def _not(c: NodeCtx):
    return c.emit("not", [c.input(0)])


@converts("And", "Or", "Xor")
def _logical(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    if c.op_type == "And":
        return c.emit("where", [a, b, c.constant(np.array(False))])
    if c.op_type == "Or":
        return c.emit("where", [a, c.constant(np.array(True)), b])
    return c.emit("not", [c.emit("equal", [a, b])])


def _dtype_of(c: NodeCtx, onnx_type: int) -> DType:
    if onnx_type not in _ONNX_DTYPES:
        name = onnx.TensorProto.DataType.Name(onnx_type) if onnx_type in \
            onnx.TensorProto.DataType.values() else str(onnx_type)
        raise c.unsupported(f"attribute 'to' = {name}: dtype not supported by bevir")
    return _ONNX_DTYPES[onnx_type]


@converts("Cast", attrs=("to", "saturate", "round_mode"))
def _cast(c: NodeCtx):
    x = c.input(0)
    to = _dtype_of(c, c.attr("to"))
    # 'saturate' only concerns float8 targets, which bevir does not have
    if to is x.type.dtype:
        return x
    return c.emit("cast", [x], {"to": to.value})


@converts("CastLike", attrs=("saturate", "round_mode"))
def _cast_like(c: NodeCtx):
    x, like = c.input(0), c.input(1)
    if like.type.dtype is x.type.dtype:
        return x
    return c.emit("cast", [x], {"to": like.type.dtype.value})


@converts("Identity")
def _identity(c: NodeCtx):
    return c.input(0)


@converts("Dropout", attrs=("seed", "ratio"))
def _dropout(c: NodeCtx):
    """Inference, or training with ratio 0: the input, and a mask of all true."""
    x = c.input(0)
    if c.has_input(2) and bool(np.asarray(c.const(2, "training_mode")).reshape(-1)[0]):
        ratio = float(np.asarray(c.const(1, "ratio")).reshape(-1)[0]) if c.has_input(1) else 0.5
        if ratio != 0:
            raise c.unsupported(f"training_mode = true with ratio {ratio} (random: inference, "
                                "or training with ratio 0, only)")
    if not c.output_used(1):
        return x
    mask = c.emit("expand", [c.constant(np.array(True))], {"shape": x.type.shape})
    return [x, mask]


# ---- linear algebra and convolution ---------------------------------------------------------

@converts("MatMul")
def _matmul(c: NodeCtx):
    a, b = c.input(0), c.input(1)
    c.require_float(a, b)
    return c.emit("matmul", [a, b])


@converts("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(c: NodeCtx):
    a, b, bias = c.input(0), c.input(1), c.input(2)
    c.require_float(a, b, bias)
    return c.emit("gemm", [a, b, bias], {"alpha": float(c.attr("alpha", 1.0)),
                                         "beta": float(c.attr("beta", 1.0)),
                                         "trans_a": bool(c.attr("transA", 0)),
                                         "trans_b": bool(c.attr("transB", 0))})


@converts("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(c: NodeCtx):
    x, w, b = c.input(0), c.input(1), c.input(2)
    c.require_float(x, w, b)
    if not (x.type.rank == w.type.rank and x.type.rank in (3, 4)):
        raise c.unsupported(f"{w.type.rank - 2}-D convolution (attribute 'kernel_shape'): "
                            "only 1-D and 2-D are supported")
    kernel = w.type.shape[2:]
    ks = c.attr("kernel_shape", None)
    if ks is not None and tuple(ks) != kernel:
        raise c.unsupported(f"attribute 'kernel_shape' {list(ks)} differs from the weight's "
                            f"{list(kernel)}")
    if x.type.rank == 3:                 # 1-D: a 2-D convolution over rows of height 1
        strides, pads, dil = _lifted_params(c, x, kernel)
        w = c.emit("reshape", [w], {"shape": w.type.shape[:2] + (1,) + kernel})
        return _over_rows(c, x, lambda x4: c.emit("conv2d", [x4, w, b], {
            "strides": strides, "pads": pads, "dilations": dil, "groups": int(c.attr("group", 1))}))
    strides, pads, dil = spatial_params(c, x, kernel)
    return c.emit("conv2d", [x, w, b], {"strides": strides, "pads": pads, "dilations": dil,
                                        "groups": int(c.attr("group", 1))})


def _lifted_params(c: NodeCtx, x: Value, kernel) -> tuple:
    """A 1-D op's strides, pads and dilations as those of the 2-D op over rows of height 1."""
    (s,) = tuple(int(v) for v in c.attr("strides", (1,)))
    (d,) = tuple(int(v) for v in c.attr("dilations", (1,)))
    begin, end = _spatial_pads(c, x.type.shape[2:], kernel, (s,), (d,))
    return (1, s), (0, begin, 0, end), (1, d)


def _over_rows(c: NodeCtx, x: Value, op2d) -> Value:
    """``op2d`` (a 2-D NCHW op) applied to [N, C, L] as [N, C, 1, L], the result back to 3-D."""
    n, ch, length = x.type.shape
    y = op2d(c.emit("reshape", [x], {"shape": (n, ch, 1, length)}))
    return c.emit("reshape", [y], {"shape": y.type.shape[:2] + y.type.shape[3:]})


# ---- pooling and normalization --------------------------------------------------------------

@converts("MaxPool", attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                            "storage_order", "strides"))
def _maxpool(c: NodeCtx):
    x = c.input(0)

    def attrs(strides, pads, dil):
        return {"strides": strides, "pads": pads, "dilations": dil,
                "ceil_mode": bool(c.attr("ceil_mode", 0))}
    y = _pool(c, x, "maxpool2d", attrs)
    if not c.output_used(1):
        return y                          # storage_order only orders the indices
    if x.type.rank != 4:
        raise c.unsupported("output 1 (Indices) of a 1-D pooling is not supported")
    return [y, _pool(c, x, "maxpool2d_indices", lambda *p: {
        **attrs(*p), "storage_order": int(c.attr("storage_order", 0))})]


def _pool(c: NodeCtx, x: Value, op: str, attrs) -> Value:
    """A 1-D or 2-D pooling node as ``op`` (2-D; 1-D over rows of height 1) with
    ``attrs(strides, pads, dilations)``."""
    if x.type.rank not in (3, 4):
        raise c.unsupported(f"{x.type.rank - 2}-D pooling (input rank {x.type.rank}): "
                            "only 1-D and 2-D (NCHW) are supported")
    kernel = tuple(int(k) for k in c.attr("kernel_shape"))
    if len(kernel) != x.type.rank - 2:
        raise c.unsupported(f"attribute 'kernel_shape' {list(kernel)} does not fit input rank "
                            f"{x.type.rank}")
    if x.type.rank == 3:
        strides, pads, dil = _lifted_params(c, x, kernel)
        return _over_rows(c, x, lambda x4: c.emit(op, [x4], {"kernel": (1,) + kernel,
                                                              **attrs(strides, pads, dil)}))
    strides, pads, dil = spatial_params(c, x, kernel)
    return c.emit(op, [x], {"kernel": kernel, **attrs(strides, pads, dil)})


@converts("AveragePool", attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                "kernel_shape", "pads", "strides"))
def _avgpool(c: NodeCtx):
    def attrs(strides, pads, dil):
        return {"strides": strides, "pads": pads, "dilations": dil,
                "ceil_mode": bool(c.attr("ceil_mode", 0)),
                "count_include_pad": bool(c.attr("count_include_pad", 0))}
    return _pool(c, c.input(0), "avgpool2d", attrs)


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(c: NodeCtx):
    x = c.input(0)
    if x.type.rank < 3:
        raise c.unsupported(f"input of rank {x.type.rank}")
    if c.op_type == "GlobalAveragePool":
        c.require_float(x)
    if c.op_type == "GlobalAveragePool":      # any rank: onnxruntime's summation order
        return c.emit("global_avgpool", [x])
    return c.emit("reduce_max", [x], {"axes": tuple(range(2, x.type.rank)), "keepdims": True})


@converts("BatchNormalization", attrs=("epsilon", "momentum", "training_mode"))
def _batch_norm(c: NodeCtx):
    if c.attr("training_mode", 0):
        raise c.unsupported("attribute 'training_mode' = 1 is not supported (inference only)")
    if any(c.output_used(i) for i in range(1, c.num_outputs)):
        raise c.unsupported("outputs running_mean/running_var are not supported "
                            "(inference only)")
    x, scale, bias, mean, var = (c.input(i) for i in range(5))
    c.require_float(x, scale, bias, mean, var)
    return c.emit("batch_norm", [x, scale, bias, mean, var],
                  {"epsilon": float(c.attr("epsilon", 1e-5))})


@converts("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layer_norm(c: NodeCtx):
    if c.attr("stash_type", 1) != 1:
        raise c.unsupported(f"attribute 'stash_type' = {c.attr('stash_type')}")
    x, scale, bias = c.input(0), c.input(1), c.input(2)
    c.require_float(x, scale, bias)
    attrs = {"axis": norm_axis(int(c.attr("axis", -1)), x.type.rank, c),
             "epsilon": float(c.attr("epsilon", 1e-5))}
    y = c.emit("layer_norm", [x, scale, bias], attrs)
    if not any(c.output_used(i) for i in (1, 2)):
        return y
    # Mean / InvStdDev (float32): a separate op, so that layer_norm keeps one result
    return [y, *c.emit("layer_norm_stats", [x], attrs)]


def _coerced_2d(c: NodeCtx, x: Value, fn) -> Value:
    """Softmax-family semantics before opset 13: flatten to 2-D at ``axis``, apply ``fn``
    on the last axis, reshape back."""
    rank = x.type.rank
    default = 1 if c.opset < 13 else -1
    axis = norm_axis(int(c.attr("axis", default)), rank, c)
    if c.opset >= 13 or axis == rank - 1:
        return fn(x, axis)
    shape = x.type.shape
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    y = fn(c.emit("reshape", [x], {"shape": flat}), 1)
    return c.emit("reshape", [y], {"shape": shape})


@converts("Softmax", attrs=("axis",))
def _softmax(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)
    return _coerced_2d(c, x, lambda v, axis: c.emit("softmax", [v], {"axis": axis}))


@converts("LogSoftmax", attrs=("axis",))
def _log_softmax(c: NodeCtx):
    x = c.input(0)
    c.require_float(x)

    def lsm(v, axis):   # x - max - log(sum(exp(x - max))), stable
        m = c.emit("reduce_max", [v], {"axes": (axis,), "keepdims": True})
        d = c.emit("sub", [v, m])
        s = c.emit("reduce_sum", [c.emit("exp", [d])], {"axes": (axis,), "keepdims": True})
        return c.emit("sub", [d, c.emit("log", [s])])
    return _coerced_2d(c, x, lsm)


# ---- reductions ----------------------------------------------------------------------------

_REDUCE = {  # op type -> (bevir reduction, pre, post, opset where axes became an input)
    "ReduceMean": ("reduce_mean", None, None, 18),
    "ReduceSum": ("reduce_sum", None, None, 13),
    "ReduceMax": ("reduce_max", None, None, 18),
    "ReduceMin": ("reduce_min", None, None, 18),
    "ReduceSumSquare": ("reduce_sum", "square", None, 18),
    "ReduceL1": ("reduce_sum", "abs", None, 18),
    "ReduceL2": ("reduce_sum", "square", "sqrt", 18),
    "ReduceLogSum": ("reduce_sum", None, "log", 18),
    "ReduceLogSumExp": ("reduce_sum", "exp", "log", 18),
}


@converts(*_REDUCE, attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(c: NodeCtx):
    op, pre, post, since = _REDUCE[c.op_type]
    x = c.input(0)
    if pre in ("exp",) or post is not None or op == "reduce_mean":
        c.require_float(x)
    if c.opset >= since:
        if "axes" in c.attrs:
            raise c.unsupported(f"attribute 'axes' (an input since opset {since})")
        axes = c.ints(1, "axes", optional=True)
    else:
        axes = c.attrs.get("axes")
    keepdims = bool(c.attr("keepdims", 1))
    if pre == "square":
        x = c.emit("mul", [x, x])
    elif pre == "abs":
        x = _abs(c, x)
    elif pre == "exp":
        x = c.emit("exp", [x])
    boolean = x.type.dtype is DType.bool
    if boolean:
        if op not in ("reduce_max", "reduce_min"):
            raise c.unsupported("bool operand")
        x = c.emit("cast", [x], {"to": "u8"})   # max = any, min = all
    if not axes:
        if c.attr("noop_with_empty_axes", 0):
            y = x
        else:
            y = c.emit(op, [x], {"axes": None, "keepdims": keepdims})
    else:
        y = c.emit(op, [x], {"axes": _norm_axes(axes, x.type.rank, c), "keepdims": keepdims})
    if boolean:
        y = c.emit("cast", [y], {"to": "bool"})
    if post is not None:
        y = c.emit(post, [y])
    return y


# ---- shape and data movement ----------------------------------------------------------------

@converts("Concat", attrs=("axis",))
def _concat(c: NodeCtx):
    xs = [v for v in c.inputs if v is not None]
    axis = norm_axis(int(c.attr("axis")), xs[0].type.rank, c)
    if len(xs) == 1:
        return xs[0]
    return c.emit("concat", xs, {"axis": axis})


@converts("Split", attrs=("axis", "split", "num_outputs"))
def _split(c: NodeCtx):
    x = c.input(0)
    axis = norm_axis(int(c.attr("axis", 0)), x.type.rank, c)
    dim = x.type.shape[axis]
    if c.opset >= 13:
        if "split" in c.attrs:
            raise c.unsupported("attribute 'split' (an input since opset 13)")
        sizes = c.ints(1, "split", optional=True)
    else:
        sizes = c.attrs.get("split")
    n = c.num_outputs
    if not sizes:
        if "num_outputs" in c.attrs:
            n = int(c.attrs["num_outputs"])
            if n != c.num_outputs:
                raise c.unsupported(f"attribute 'num_outputs' = {n} but the node has "
                                    f"{c.num_outputs} outputs")
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
        else:
            if dim % n:
                raise c.unsupported(f"cannot split {dim} evenly into {n} outputs")
            sizes = [dim // n] * n
    sizes = [int(s) for s in sizes]
    if sum(sizes) != dim or len(sizes) != c.num_outputs or min(sizes) < 0:
        raise c.unsupported(f"split sizes {sizes} do not fit dimension {dim} into "
                            f"{c.num_outputs} outputs")
    if len(sizes) == 1:
        return [x]
    return c.emit("split", [x], {"axis": axis, "sizes": tuple(sizes)}, n_out=len(sizes))


@converts("Slice")
def _slice(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    starts = c.ints(1, "starts")
    ends = c.ints(2, "ends")
    axes = c.ints(3, "axes", optional=True)
    steps = c.ints(4, "steps", optional=True)
    axes = list(range(len(starts))) if axes is None else list(_norm_axes(axes, rank, c))
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise c.unsupported("starts, ends, axes and steps differ in length")
    if any(s == 0 for s in steps):
        raise c.unsupported("a step of 0")

    def clamp(v, dim):   # keeps Python slicing semantics, drops INT64_MAX-like sentinels
        return max(-dim - 1, min(dim + 1, v))
    starts = [clamp(s, x.type.shape[a]) for s, a in zip(starts, axes)]
    ends = [clamp(e, x.type.shape[a]) for e, a in zip(ends, axes)]
    if not axes:
        return x
    return c.emit("slice", [x], {"starts": tuple(starts), "ends": tuple(ends),
                                 "axes": tuple(axes), "steps": tuple(steps)})


@converts("Reshape", attrs=("allowzero",))
def _reshape(c: NodeCtx):
    x = c.input(0)
    spec = c.ints(1, "shape")
    allowzero = bool(c.attr("allowzero", 0))
    shape: list[int] = []
    infer = None
    for i, s in enumerate(spec):
        if s == 0 and not allowzero:
            if i >= x.type.rank:
                raise c.unsupported(f"shape {spec}: 0 at axis {i} beyond the input rank")
            shape.append(x.type.shape[i])
        elif s == -1:
            if infer is not None:
                raise c.unsupported(f"shape {spec} has two -1")
            infer = i
            shape.append(1)
        elif s < 0:
            raise c.unsupported(f"shape {spec}: negative dimension {s}")
        else:
            shape.append(s)
    numel = x.type.numel
    if infer is not None:
        rest = math.prod(shape)
        if rest == 0 or numel % rest:
            raise c.unsupported(f"cannot reshape {list(x.type.shape)} to {spec}")
        shape[infer] = numel // rest
    if math.prod(shape) != numel:
        raise c.unsupported(f"cannot reshape {list(x.type.shape)} to {spec}")
    if tuple(shape) == x.type.shape:
        return x
    return c.emit("reshape", [x], {"shape": tuple(shape)})


@converts("Flatten", attrs=("axis",))
def _flatten(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    axis = int(c.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise c.unsupported(f"attribute 'axis' = {axis} out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    return c.emit("flatten", [x], {"axis": axis})


@converts("Transpose", attrs=("perm",))
def _transpose(c: NodeCtx):
    x = c.input(0)
    perm = c.attr("perm", None)
    perm = tuple(reversed(range(x.type.rank))) if perm is None else \
        _norm_axes(perm, x.type.rank, c)
    if perm == tuple(range(x.type.rank)):
        return x
    return c.emit("transpose", [x], {"perm": perm})


def _axes_operand(c: NodeCtx, optional: bool) -> list[int] | None:
    if c.opset >= 13:
        if "axes" in c.attrs:
            raise c.unsupported("attribute 'axes' (an input since opset 13)")
        return c.ints(1, "axes", optional=optional)
    axes = c.attrs.get("axes")
    if axes is None and not optional:
        raise c.unsupported("missing required attribute 'axes'")
    return None if axes is None else [int(a) for a in axes]


@converts("Squeeze", attrs=("axes",))
def _squeeze(c: NodeCtx):
    x = c.input(0)
    axes = _axes_operand(c, optional=True)
    if axes is None:
        axes = [i for i, d in enumerate(x.type.shape) if d == 1]
    axes = sorted(set(_norm_axes(axes, x.type.rank, c)))
    for a in axes:
        if x.type.shape[a] != 1:
            raise c.unsupported(f"cannot squeeze axis {a} of size {x.type.shape[a]}")
    if not axes:
        return x
    return c.emit("squeeze", [x], {"axes": tuple(axes)})


@converts("Unsqueeze", attrs=("axes",))
def _unsqueeze(c: NodeCtx):
    x = c.input(0)
    axes = _axes_operand(c, optional=False)
    out_rank = x.type.rank + len(axes)
    axes = sorted(_norm_axes(axes, out_rank, c))
    if len(set(axes)) != len(axes):
        raise c.unsupported(f"repeated axes {axes}")
    if not axes:
        return x
    return c.emit("unsqueeze", [x], {"axes": tuple(axes)})


@converts("Gather", attrs=("axis",))
def _gather(c: NodeCtx):
    x, idx = c.input(0), c.input(1)
    axis = norm_axis(int(c.attr("axis", 0)), x.type.rank, c)
    if not idx.type.dtype.is_int:
        raise c.unsupported(f"indices of dtype {idx.type.dtype}")
    if idx.is_const and (idx.const < 0).any():   # negative indices count from the end
        dim = x.type.shape[axis]
        idx = c.constant(np.where(idx.const < 0, idx.const + dim, idx.const)
                         .astype(idx.const.dtype))
    return c.emit("gather", [x, idx], {"axis": axis})


@converts("Expand")
def _expand(c: NodeCtx):
    x = c.input(0)
    shape = c.ints(1, "shape")
    try:
        out = tuple(np.broadcast_shapes(x.type.shape, tuple(shape)))
    except ValueError:
        raise c.unsupported(f"shape {shape} does not broadcast with {list(x.type.shape)}") \
            from None
    if out == x.type.shape:
        return x
    return c.emit("expand", [x], {"shape": out})


@converts("Tile")
def _tile(c: NodeCtx):
    x = c.input(0)
    reps = c.ints(1, "repeats")
    shape = x.type.shape
    if len(reps) != len(shape) or min(reps, default=1) < 0:
        raise c.unsupported(f"repeats {reps} do not fit rank {len(shape)}")
    if all(r == 1 for r in reps):
        return x
    y = c.emit("unsqueeze", [x], {"axes": tuple(range(0, 2 * len(shape), 2))})
    inter = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    y = c.emit("expand", [y], {"shape": inter})
    return c.emit("reshape", [y], {"shape": tuple(r * d for r, d in zip(reps, shape))})


@converts("Pad", attrs=("mode", "pads", "value"))
def _pad(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    mode = c.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise c.unsupported(f"attribute 'mode' = {mode!r}")
    if c.version < 11:   # Pad-2: pads and value are attributes
        pads = [int(p) for p in c.attr("pads")]
        value = c.attr("value", 0.0)
    else:
        for a in ("pads", "value"):
            if a in c.attrs:
                raise c.unsupported(f"attribute '{a}' (an input since opset 11)")
        pads = c.ints(1, "pads")
        value = c.const(2, "constant_value", optional=True,
                        why="bevir's pad takes its value as an attribute")
    axes = c.ints(3, "axes", optional=True) if c.version >= 18 else None
    if axes is not None:
        axes = _norm_axes(axes, rank, c)
        if len(pads) != 2 * len(axes):
            raise c.unsupported(f"pads {pads} do not fit axes {list(axes)}")
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = pads[i], pads[len(axes) + i]
        pads = full
    if len(pads) != 2 * rank:
        raise c.unsupported(f"pads {pads} do not fit rank {rank}")
    if not any(pads):
        return x
    v = 0.0 if value is None or np.size(value) == 0 else float(np.asarray(value).reshape(-1)[0])
    return c.emit("pad", [x], {"pads": tuple(pads), "mode": mode, "value": v})


_RESIZE_CT = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@converts("Resize", attrs=("antialias", "axes", "coordinate_transformation_mode",
                           "cubic_coeff_a", "exclude_outside", "extrapolation_value",
                           "keep_aspect_ratio_policy", "mode", "nearest_mode"))
def _resize(c: NodeCtx):
    x = c.input(0)
    rank = x.type.rank
    mode = c.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise c.unsupported(f"attribute 'mode' = {mode!r}")
    if mode == "cubic" or (mode == "linear" and x.type.dtype not in (DType.i8, DType.u8)):
        c.require_float(x)          # 8-bit linear: onnxruntime's fixed-point kernel
    if c.version < 11:   # Resize-10: (X, scales), asymmetric coordinates, nearest = floor
        ct, nearest, scales_i = "asymmetric", "floor", 1
    else:
        ct = c.attr("coordinate_transformation_mode", "half_pixel")
        nearest = c.attr("nearest_mode", "round_prefer_floor")
        scales_i = 2
    if ct not in _RESIZE_CT:
        raise c.unsupported(f"attribute 'coordinate_transformation_mode' = {ct!r}")
    if nearest not in _NEAREST:
        raise c.unsupported(f"attribute 'nearest_mode' = {nearest!r}")
    if c.attr("antialias", 0):
        raise c.unsupported(f"attribute 'antialias' = {c.attr('antialias')!r}")
    policy = c.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise c.unsupported(f"attribute 'keep_aspect_ratio_policy' = {policy!r}")
    axes = c.attr("axes", None)
    axes = list(range(rank)) if axes is None else list(_norm_axes(axes, rank, c))
    scales = c.const(scales_i, "scales", optional=True)
    sizes = c.ints(3, "sizes", optional=True) if scales_i == 2 else None
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and len(sizes) == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        raise c.unsupported("exactly one of scales and sizes must be given")
    out, factor = list(x.type.shape), [1.0] * rank     # output shape, ONNX's scale per axis
    if sizes is not None:
        if len(sizes) != len(axes):
            raise c.unsupported(f"sizes {sizes} do not fit axes {axes}")
        ratios = [int(s) / x.type.shape[a] for a, s in zip(axes, sizes)]
        if policy != "stretch":          # one scale for every axis, output rounded half up
            scale = (min if policy == "not_larger" else max)(ratios)
            ratios = [scale] * len(axes)
            sizes = [int(scale * x.type.shape[a] + 0.5) for a in axes]
        for a, s, r in zip(axes, sizes, ratios):
            out[a], factor[a] = int(s), r
    else:
        scales = [float(s) for s in scales.reshape(-1)]
        if len(scales) != len(axes):
            raise c.unsupported(f"scales {scales} do not fit axes {axes}")
        for a, s in zip(axes, scales):
            out[a], factor[a] = int(x.type.shape[a] * s), s
    if tuple(out) == x.type.shape and all(f == 1.0 for f in factor):
        return x
    attrs = {"size": tuple(out), "mode": mode, "coordinate_transformation_mode": ct,
             "nearest_mode": nearest}
    if mode == "cubic":
        attrs |= {"cubic_coeff_a": float(c.attr("cubic_coeff_a", -0.75)),
                  "exclude_outside": bool(c.attr("exclude_outside", 0))}
    elif c.attr("exclude_outside", 0):
        raise c.unsupported("attribute 'exclude_outside' = 1 (cubic only)")
    if ct == "tf_crop_and_resize":       # the region of interest, as fractions per axis
        roi = c.const(1, "roi")
        if roi is None or roi.size != 2 * len(axes):
            raise c.unsupported(f"roi must hold {2 * len(axes)} values for axes {axes}")
        lo, hi = [0.0] * rank, [1.0] * rank
        for k, a in enumerate(axes):
            lo[a], hi[a] = float(roi.reshape(-1)[k]), float(roi.reshape(-1)[len(axes) + k])
        attrs |= {"roi": tuple(lo + hi),
                  "extrapolation_value": float(c.attr("extrapolation_value", 0.0))}
    if ct == "tf_crop_and_resize" or any(f != o / i for f, o, i in zip(factor, out, x.type.shape)):
        attrs["scales"] = tuple(factor)  # ONNX's scale differs from out / in: keep it
    return c.emit("resize", [x], attrs)


@converts("GridSample", attrs=("align_corners", "mode", "padding_mode"))
def _grid_sample(c: NodeCtx):
    x, grid = c.input(0), c.input(1)
    c.require_float(x, grid)
    if x.type.rank != 4:
        raise c.unsupported(f"{x.type.rank - 2}-D sampling: only 4-D (NCHW) input")
    mode = c.attr("mode", "linear" if c.opset >= 20 else "bilinear")
    mode = {"linear": "bilinear", "bilinear": "bilinear", "nearest": "nearest"}.get(mode, mode)
    if mode not in ("bilinear", "nearest"):
        raise c.unsupported(f"attribute 'mode' = {c.attr('mode')!r}")
    padding = c.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise c.unsupported(f"attribute 'padding_mode' = {padding!r}")
    return c.emit("grid_sample", [x, grid], {"mode": mode, "padding_mode": padding,
                                             "align_corners": bool(c.attr("align_corners", 0))})


@converts("TopK", attrs=("axis", "largest", "sorted"))
def _topk(c: NodeCtx):
    x = c.input(0)
    k = c.ints(1, "K")
    if len(k) != 1:
        raise c.unsupported(f"K must have one element, got {k}")
    axis = norm_axis(int(c.attr("axis", -1)), x.type.rank, c)
    return c.emit("topk", [x], {"k": k[0], "axis": axis, "largest": bool(c.attr("largest", 1)),
                                "sorted": bool(c.attr("sorted", 1))}, n_out=2)


# ---- constants and shape computations (folded at import) ------------------------------------

@converts("Constant", attrs=("value", "value_float", "value_floats", "value_int",
                             "value_ints", "sparse_value", "value_string", "value_strings"))
def _constant(c: NodeCtx):
    if len(c.attrs) != 1:
        raise c.unsupported("exactly one value attribute is needed")
    (name, v), = c.attrs.items()
    if name == "value":
        a = np.asarray(v)
    elif name == "value_float":
        a = np.array(v, np.float32)
    elif name == "value_floats":
        a = np.array(v, np.float32)
    elif name == "value_int":
        a = np.array(v, np.int64)
    elif name == "value_ints":
        a = np.array(v, np.int64)
    else:
        raise c.unsupported(f"attribute '{name}' is not supported")
    try:
        TensorType.of(a)
    except TypeError:
        raise c.unsupported(f"constant of dtype {a.dtype}") from None
    return c.constant(np.asarray(a, order="C"))


@converts("Shape", attrs=("start", "end"))
def _shape(c: NodeCtx):
    shape = list(c.input(0).type.shape)
    start = c.attr("start", 0)
    end = c.attr("end", None)
    return c.constant(np.array(shape[start:end], np.int64))


@converts("Size")
def _size(c: NodeCtx):
    return c.constant(np.array(c.input(0).type.numel, np.int64))


@converts("ConstantOfShape", attrs=("value",))
def _constant_of_shape(c: NodeCtx):
    shape = c.ints(0, "input")
    value = c.attr("value", np.zeros(1, np.float32))
    value = np.asarray(value)
    if value.size != 1:
        raise c.unsupported("attribute 'value' must have one element")
    if min(shape, default=0) < 0:
        raise c.unsupported(f"negative dimension in shape {shape}")
    if nbytes(shape, value.dtype.itemsize) > fold_bytes():     # too large to fold: a node
        return c.emit("expand", [c.constant(value.reshape(()))], {"shape": shape})
    return c.constant(np.full(shape, value.reshape(-1)[0], value.dtype))


@converts("Range", attrs=("stash_type",))
def _range(c: NodeCtx):
    start, limit, delta = (c.const(i, w) for i, w in enumerate(("start", "limit", "delta")))
    dtype = start.dtype
    stash = dtype
    if dtype == np.float16 and c.version >= 27:
        if c.attr("stash_type", 1) != 1:
            raise c.unsupported(f"attribute 'stash_type' = {c.attr('stash_type')} (only 1, "
                                "float32)")
        stash = np.dtype(np.float32)
    s, l, d = (np.asarray(v).astype(stash).reshape(()).item() for v in (start, limit, delta))
    if d == 0:
        raise c.unsupported("delta of 0")
    n = max(int(math.ceil((l - s) / d)), 0)
    _check_folded(c, n * np.dtype(stash).itemsize, "output")
    return c.constant((s + np.arange(n) * d).astype(stash).astype(dtype))


@converts("Einsum", attrs=("equation",))
def _einsum(c: NodeCtx):
    from .einsum import einsum
    c.require_float(*c.inputs)
    try:
        return einsum(lambda op, xs, attrs: c.emit(op, xs, attrs), c.attr("equation"), c.inputs)
    except UnsupportedError as e:
        raise c.unsupported(e.message) from None
