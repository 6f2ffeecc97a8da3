"""The ONNX frontend's converter registry, the context a converter gets (NodeCtx),
the supported opsets and version notes, and helpers shared by converters."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import BevirError, UnsupportedError
from ...ir.graph import Value
from ...ir.limits import tensor_too_big
from ...ir.types import DType

if TYPE_CHECKING:
    from .importer import Importer

#: the default-domain opsets imported; MAX_OPSET is the newest one of the onnx package the
#: version notes were checked against (tests/test_onnx_opsets.py keeps them in step). An
#: older model imports when each of its ops has the version it has in MIN_OPSET.
MIN_OPSET, MAX_OPSET = 10, 28

DEFAULT_DOMAINS = ("", "ai.onnx")

ONNX_DTYPES = {
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


CONVERTERS: dict[str, _Entry] = {}
#: converters of ops in other domains (com.microsoft contrib ops), by (domain, op_type)
DOMAIN_CONVERTERS: dict[tuple[str, str], _Entry] = {}


def converts(*op_types: str, attrs: Sequence[str] = (),
             domain: str = "") -> Callable[[Converter], Converter]:
    """Register a converter for ONNX ``op_types`` of ``domain`` (default: ai.onnx);
    ``attrs`` are the attributes it reads (any other attribute on a node is rejected with
    UnsupportedError)."""
    table = CONVERTERS if domain in DEFAULT_DOMAINS else DOMAIN_CONVERTERS

    def register(fn: Converter) -> Converter:
        for t in op_types:
            key = t if table is CONVERTERS else (domain, t)
            if key in table:
                raise ValueError(f"ONNX op '{t}' has two converters")
            table[key] = _Entry(fn, frozenset(attrs))
        return fn
    return register


def supported_ops() -> frozenset[str]:
    """The ONNX op types (default domain) the importer has a converter for."""
    return frozenset(CONVERTERS)


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
        if t.data_type in ONNX_DTYPES else 1
    too_big = tensor_too_big(dims, item)
    if too_big:
        raise UnsupportedError(f"{what}: {too_big}", **where)
    if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type in ONNX_DTYPES:
        stored = len(t.raw_data) if t.HasField("raw_data") else \
            max(len(getattr(t, f)) for f in _TYPED_FIELDS)
        held = stored // item if t.HasField("raw_data") else stored
        if held != numel or (t.HasField("raw_data") and stored % item):
            raise UnsupportedError(f"{what} declares shape {dims} ({numel} elements) but "
                                   f"holds {stored} "
                                   f"{'bytes' if t.HasField('raw_data') else 'values'}",
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

    def __init__(self, imp: Importer, node: onnx.NodeProto, index: int,
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


# ---- helpers shared by converters -----------------------------------------------------------

def norm_axis(axis: int, rank: int, c: NodeCtx) -> int:
    if not -rank <= axis < max(rank, 1):
        raise c.unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def norm_axes(axes, rank: int, c: NodeCtx) -> tuple[int, ...]:
    return tuple(norm_axis(int(a), rank, c) for a in axes)


def scalar(c: NodeCtx, value, like: Value) -> Value:
    return c.constant(np.asarray(value, dtype=like.type.dtype.np), like)


def negative(c: NodeCtx, x: Value) -> Value:
    if x.type.dtype.is_float:
        return c.emit("neg", [x])
    return c.emit("sub", [scalar(c, 0, x), x])


def absolute(c: NodeCtx, x: Value) -> Value:
    if x.type.dtype.is_float:
        return c.emit("abs", [x])
    return c.emit("max", [x, negative(c, x)])


def spatial_pads(c: NodeCtx, in_sizes, kernel, strides, dilations) -> tuple[int, ...]:
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
    pads = spatial_pads(c, x.type.shape[2:], kernel, strides, dil)
    return strides, pads, dil
