"""A graph written as ONNX, for onnxruntime, netron and the rest of the ecosystem.

    bevir.to_onnx(graph, "model.onnx")          # bevir export MODEL --onnx model.onnx

Each op declares its export (``OpDef.onnx_export``, built with the helpers of
:mod:`bevir.ops.onnx_export`). Float ops become the ONNX op they compute. A quantized op
becomes QDQ: its quantized operands pass through ``DequantizeLinear`` with their scales
(fixed point: ``2**-frac_bits``, zero point 0), its float counterpart computes, and
``QuantizeLinear`` gives the result's codes. Ops that only move data run on the codes
themselves. ONNX rounds half to even where the fixed-point target rounds half up, and
computes the float counterpart in float32, so a QDQ export agrees with the golden model
closely, not bit for bit. Opset 21 (int16 QDQ, LayerNormalization, Gelu).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CodegenError
from ..fsutil import write_atomic
from ..ir.graph import Graph, Value
from ..ir.opdef import get_op
from ..ir.types import AffineQuant, FixedPointQuant, Layout

OPSET = 21

class OnnxWriter:
    """The ONNX graph being written: names, initializers, nodes."""

    def __init__(self, graph: Graph):
        import onnx
        self.onnx, self.graph = onnx, graph
        self.nodes: list = []
        self.initializers: list = []
        self._names: dict[int, str] = {}
        self._dequantized: dict[int, str] = {}
        self._used: set[str] = set()

    def fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self._used:
            name, k = f"{hint}_{k}", k + 1
        self._used.add(name)
        return name

    def name(self, v: Value) -> str:
        """The ONNX name of ``v`` (a constant becomes an initializer when first named)."""
        if id(v) not in self._names:
            self._names[id(v)] = self.fresh(v.name)
            if v.is_const:
                self.initializers.append(self.onnx.numpy_helper.from_array(
                    np.asarray(v.const, order="C"), self._names[id(v)]))
        return self._names[id(v)]

    def const(self, array, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def emit(self, op_type: str, inputs: list, outputs: list[str] | int = 1, **attrs) -> list[str]:
        """One ONNX node; ``outputs``: names, or how many fresh ones. Returns the names."""
        if isinstance(outputs, int):
            outputs = [self.fresh(f"{op_type.lower()}_out") for _ in range(outputs)]
        ins = ["" if i is None else i for i in inputs]
        while ins and ins[-1] == "":
            ins.pop()
        self.nodes.append(self.onnx.helper.make_node(
            op_type, ins, outputs, name=self.fresh(f"{op_type}_{len(self.nodes)}"),
            **{k: v for k, v in attrs.items() if v is not None}))
        return outputs

    @staticmethod
    def quantization(v: Value) -> tuple[np.ndarray, np.ndarray, int | None]:
        """(scale float32, zero point, axis) of ``v``: per tensor (0-d) or per channel;
        fixed point is scale 2**-frac_bits, zero point 0."""
        q = v.type.quant
        if isinstance(q, AffineQuant):
            scale, zp = np.asarray(q.scale, np.float64), np.asarray(q.zero_point, np.int64)
        elif isinstance(q, FixedPointQuant):
            scale = np.exp2(-np.asarray(q.frac_bits, np.float64))
            zp = np.zeros(len(q.frac_bits), np.int64)
        else:
            raise CodegenError(f"value '{v.name}' has no quantization to export")
        if q.axis is None:
            scale, zp = scale.reshape(()), zp.reshape(())
        return scale.astype(np.float32), zp, q.axis

    def _broadcast(self, a: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
        """A per-channel vector shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
        return a if axis is None else a.reshape([-1] + [1] * (rank - 1 - axis))

    def _dequantize(self, codes: str, v: Value, scale, zp, axis, hint: str) -> str:
        """DequantizeLinear; int32 codes by arithmetic (onnxruntime's QDQ rewrites would
        otherwise create an int32 QuantizeLinear, which ONNX has not)."""
        if v.type.dtype.np == np.int32:
            rank = v.type.rank
            y = self.emit("Cast", [codes], 1, to=1)[0]                       # float32
            zero = self.const(self._broadcast(zp.astype(np.float32), axis, rank), "zp")
            y = self.emit("Sub", [y, zero], 1)[0]
            return self.emit("Mul", [y, self.const(self._broadcast(scale, axis, rank), "scale")],
                             [self.fresh(hint)])[0]
        return self.emit("DequantizeLinear", [codes, self.const(scale, "scale"),
                                              self.const(zp.astype(v.type.dtype.np), "zp")],
                         [self.fresh(hint)], axis=axis)[0]

    def dequantized(self, v: Value | None) -> str | None:
        """A float name for ``v``: itself, or its codes dequantized (once per value)."""
        if v is None or v.type.quant is None:
            return None if v is None else self.name(v)
        if id(v) not in self._dequantized:
            self._dequantized[id(v)] = self._dequantize(self.name(v), v, *self.quantization(v),
                                                        f"{v.name}_dq")
        return self._dequantized[id(v)]

    def dequantized_product(self, x: Value, w: Value, b: Value) -> str:
        """A float name for the bias ``b`` of a product of ``x`` and ``w``: its codes times
        scale(x) * scale(w) (per output channel when ``w`` is)."""
        scale = (self.quantization(x)[0].astype(np.float64) *
                 self.quantization(w)[0].astype(np.float64)).astype(np.float32)
        axis = None if scale.ndim == 0 else 0
        return self._dequantize(self.name(b), b, scale, np.zeros(scale.shape, np.int64), axis,
                                f"{b.name}_dq")

    def quantize(self, real: str, v: Value, out: str) -> None:
        """``real`` (float) to the codes of ``v``: QuantizeLinear, or for int32 (which it
        does not produce) the same steps: divide, round half to even, saturate, cast."""
        scale, zp, axis = self.quantization(v)
        if v.type.dtype.np != np.int32:
            self.emit("QuantizeLinear", [real, self.const(scale, "scale"),
                                         self.const(zp.astype(v.type.dtype.np), "zp")], [out],
                      axis=axis)
            return
        rank = v.type.rank
        y = self.emit("Div", [real, self.const(self._broadcast(scale, axis, rank), "scale")], 1)[0]
        zero = self.const(self._broadcast(zp.astype(np.float32), axis, rank), "zp")
        y = self.emit("Add", [self.emit("Round", [y], 1)[0], zero], 1)[0]
        y = self.emit("Clip", [y, self.const(np.float32(-2.0 ** 31), "lo"),
                               self.const(np.float32(2.0 ** 31 - 128), "hi")], 1)[0]
        self.emit("Cast", [y], [out], to=6)                                  # int32

    def ints(self, values, hint: str) -> str:
        return self.const(np.asarray(values, np.int64), hint)


# ---- the writer ----------------------------------------------------------------------------
def to_onnx(graph: Graph, path: str | Path | None = None, opset: int = OPSET):
    """``graph`` as an ONNX ModelProto (checked by onnx.checker), written to ``path`` when
    given. Modules without an ONNX form of their own (the attention modules) are exported
    through their decomposition. Raises :class:`CodegenError` naming the node, op and
    source layer of anything else without an ONNX form (an op without an export, NHWC
    layouts, a partitioned graph)."""
    import onnx
    if any(get_op(n.op).onnx_export is None and get_op(n.op).decompose is not None
           for n in graph.nodes):
        from ..passes import optimize
        graph = graph.clone()
        optimize(graph, "decompose")
    e = OnnxWriter(graph)
    # an output keeps its value's name when a node makes that value; other output names
    # (a constant, an input, a value given out twice) are kept free for an Identity
    direct: dict[int, str] = {}
    for name, v in graph.outputs.items():
        if v.producer is not None and v.name == name and id(v) not in direct:
            direct[id(v)] = name
    e._used |= set(graph.outputs) - set(direct.values())
    for v in graph.inputs:
        e.name(v)
    for node in graph.nodes:
        opdef = get_op(node.op)
        where = dict(node=node.name, op=node.op, loc=node.loc)
        if opdef.onnx_export is None:
            raise CodegenError(f"op '{node.op}' has no ONNX export", **where)
        if any(v is not None and v.type.layout is Layout.nhwc for v in node.inputs + node.outputs):
            raise CodegenError("NHWC values have no ONNX form: export the graph before to-nhwc",
                               **where)
        ins = [None if v is None else e.name(v) for v in node.inputs]
        opdef.onnx_export(e, node, ins, [e.name(v) for v in node.outputs])
    e.nodes = _moves_before_dequantize(e, e.nodes)
    outputs = []
    for name, v in graph.outputs.items():
        if direct.get(id(v)) != name:
            e.emit("Identity", [e.name(v)], [name])
        outputs.append(_info(name, v))
    model = onnx.helper.make_model(
        onnx.helper.make_graph(e.nodes, graph.name, [_info(e.name(v), v) for v in graph.inputs],
                               outputs, e.initializers),
        opset_imports=[onnx.helper.make_opsetid("", opset)], producer_name="bevir")
    model.ir_version = 10
    onnx.checker.check_model(model)
    if path is not None:
        write_atomic(path, model.SerializeToString())
    return model


#: ONNX ops that only move elements: the same on codes as on the values they stand for
MOVES = ("Transpose", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Flatten")


def _moves_before_dequantize(e: OnnxWriter, nodes: list) -> list:
    """Per-tensor DequantizeLinear -> a data move becomes the move on the codes ->
    DequantizeLinear (repeatedly), so the graph has no dequantized value that only moves.
    onnxruntime's QDQ propagation does the same by itself, but it mistypes the zero point
    of int8 codes it has turned into uint8, and the session fails to load."""
    init = {i.name: i for i in e.initializers}
    made = {o: n for n in nodes for o in n.output}
    out = []
    for n in nodes:
        dq = made.get(n.input[0]) if n.op_type in MOVES and n.input else None
        if dq is not None and dq.op_type == "DequantizeLinear" and \
                init.get(dq.input[1]) is not None and not init[dq.input[1]].dims:
            codes = e.fresh(f"{n.output[0]}_codes")
            moved = e.onnx.helper.make_node(n.op_type, [dq.input[0]] + list(n.input[1:]), [codes],
                                            name=e.fresh(f"{n.name}_codes"))
            moved.attribute.extend(n.attribute)
            again = e.onnx.helper.make_node("DequantizeLinear", [codes] + list(dq.input[1:]),
                                            list(n.output), name=e.fresh(f"{dq.name}_moved"))
            out += [moved, again]
            made[codes], made[n.output[0]] = moved, again
        else:
            out.append(n)
    used = {i for n in out for i in n.input} | set(e.graph.outputs)
    return [n for n in out if n.op_type != "DequantizeLinear" or n.output[0] in used]


def _info(name: str, v: Value):
    import onnx
    elem = onnx.helper.np_dtype_to_tensor_dtype(v.type.dtype.np)
    return onnx.helper.make_tensor_value_info(name, elem, list(v.type.shape))
