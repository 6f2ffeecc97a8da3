"""The ONNX importer: reads a model, drives the converters node by node, folds
constant nodes (bevir's own semantics, else onnx's reference evaluator)."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import BevirError, InterpreterError, UnsupportedError
from ...ir.graph import Graph, Node, Value
from ...ir.limits import fold_bytes, nbytes, tensor_too_big
from ...ir.types import TensorType
from ...ops import get_op
from .registry import (CONVERTERS, DEFAULT_DOMAINS, DOMAIN_CONVERTERS, MAX_OPSET, MIN_OPSET,
                       ONNX_DTYPES, NodeCtx, OnnxLoadError, op_version, tensor_array)

# ---- the importer --------------------------------------------------------------------------

class Importer:
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
            if t.data_type not in ONNX_DTYPES:
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
        if node.domain not in DEFAULT_DOMAINS:
            entry = DOMAIN_CONVERTERS.get((node.domain, node.op_type))
            if entry is None and not self.all_constant(node):
                raise UnsupportedError(f"unsupported ONNX op '{node.op_type}' of domain "
                                       f"'{node.domain}' (default-domain opset {self.opset})",
                                       op=node.op_type, node=loc)
        else:
            entry = CONVERTERS.get(node.op_type)
        if entry is None and self.all_constant(node):
            self.fold_with_reference(node, loc)
            return
        if entry is None and node.domain in DEFAULT_DOMAINS:
            raise UnsupportedError(f"unsupported ONNX op '{node.op_type}' (opset {self.opset})",
                                   op=node.op_type, node=loc)
        version = None
        if node.domain in DEFAULT_DOMAINS:
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
        check_folded(None, _predicted_bytes(model), f"folding '{node.op_type}'",
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
        if not t.HasField("shape") or min(dims, default=0) < 0 or t.elem_type not in ONNX_DTYPES:
            return 0
        total += nbytes(dims, ONNX_DTYPES[t.elem_type].np.itemsize)
    return total


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
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


def check_folded(c: NodeCtx | None, n_bytes: int, what: str, **where) -> None:
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
    if tt.elem_type not in ONNX_DTYPES:
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
    dtype = ONNX_DTYPES[tt.elem_type]
    too_big = tensor_too_big(dims, dtype.np.itemsize)
    if too_big:
        raise UnsupportedError(f"graph input '{vi.name}': {too_big}")
    return TensorType(tuple(dims), dtype)


def _check_declared_shape(vi: onnx.ValueInfoProto, v: Value) -> None:
    """A graph output's declared shape must not contradict the computed one: the rank, and
    every dimension declared as a number (symbolic or unknown ones match anything)."""
    from ...errors import VerifyError
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
    return Importer(m, keep_dequantize=is_qdq(m)).run()
