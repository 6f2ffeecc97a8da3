"""The golden interpreter: runs a graph with the op registry's numpy semantics.

Subclass :class:`Interpreter` and override :meth:`Interpreter.run_node` to observe or
alter each node's results (calibration and debugging tools do this).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..errors import BevirError, InterpreterError
from ..ir.graph import Graph, Node, Value
from ..ir.types import DType


class Interpreter:
    """Evaluates a graph node by node, freeing each value after its last use."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._last_use = self._last_uses(graph)

    @staticmethod
    def _last_uses(graph: Graph) -> dict[int, list[Value]]:
        """node index -> values whose last use is that node."""
        last: dict[int, int] = {}
        vals: dict[int, Value] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                if v is not None and not v.is_const:
                    last[id(v)], vals[id(v)] = i, v
        out: dict[int, list[Value]] = {}
        for vid, i in last.items():
            out.setdefault(i, []).append(vals[vid])
        return out

    def run_node(self, node: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
        """Compute one node; the hook for subclasses."""
        return node.opdef.run(node, args)

    def run(self, inputs: Mapping[str, np.ndarray], fetch: Iterable[str] | str | None = None
            ) -> dict[str, np.ndarray]:
        """Run the graph on ``inputs`` (name -> array).

        Returns the graph outputs by name, plus the values named in ``fetch`` (or every
        value when ``fetch == "all"``) by value name. Each input array is checked and
        converted by :func:`_bind_input`: same kind of dtype, no value changed.
        """
        g = self.graph
        keep_all = fetch == "all"
        wanted = set() if fetch is None or keep_all else set(fetch)
        env: dict[int, np.ndarray] = {id(v): v.const for v in g.constants.values()}
        self._bind_inputs(inputs, env)
        outputs = {id(v) for v in g.outputs.values()}
        fetched: dict[str, np.ndarray] = {}
        for i, node in enumerate(g.nodes):
            args = [None if v is None else env[id(v)] for v in node.inputs]
            try:
                results = self.run_node(node, args)
            except BevirError as e:
                if e.node:
                    raise
                raise InterpreterError(e.message, node=node.name, op=node.op, loc=node.loc) from e
            except Exception as e:
                raise InterpreterError(f"{type(e).__name__}: {e}", node=node.name, op=node.op,
                                       loc=node.loc) from e
            self._check(node, results)
            for v, r in zip(node.outputs, results):
                env[id(v)] = r
                if keep_all or v.name in wanted:
                    fetched[v.name] = r
            for v in self._last_use.get(i, ()):
                if id(v) not in outputs:
                    env.pop(id(v), None)
        for name in wanted - set(fetched):
            v = g.value(name)
            fetched[name] = env.get(id(v), v.const)
        result = {k: env[id(v)] for k, v in g.outputs.items()}
        result.update({k: v for k, v in fetched.items() if k not in result})
        return result

    def _bind_inputs(self, inputs: Mapping[str, np.ndarray], env: dict[int, np.ndarray]) -> None:
        missing = [v.name for v in self.graph.inputs if v.name not in inputs]
        if missing:
            raise InterpreterError(f"missing graph input(s) {missing}")
        for v in self.graph.inputs:
            a = np.asarray(inputs[v.name])
            if tuple(a.shape) != v.type.shape:
                raise InterpreterError(f"input %{v.name} has shape {list(a.shape)}, "
                                       f"expected {list(v.type.shape)}")
            env[id(v)] = _bind_input(v.name, a, v.type.dtype)

    @staticmethod
    def _check(node: Node, results: list[np.ndarray]) -> None:
        if len(results) != len(node.outputs):
            raise InterpreterError(f"produced {len(results)} results, declared "
                                   f"{len(node.outputs)}", node=node.name, op=node.op, loc=node.loc)
        for v, r in zip(node.outputs, results):
            if not v.type.matches(r):
                raise InterpreterError(f"result %{v.name} is {r.dtype}{list(r.shape)}, declared "
                                       f"{v.type}", node=node.name, op=node.op, loc=node.loc)


def _kind(dtype: np.dtype) -> str:
    return {"i": "integer", "u": "integer", "f": "float", "b": "bool"}.get(dtype.kind,
                                                                          str(dtype))


def _bind_input(name: str, a: np.ndarray, dtype: DType) -> np.ndarray:
    """The array a graph input of element type ``dtype`` takes: ``a`` itself when its dtype
    is ``dtype``, else ``a`` converted when that changes no value beyond float rounding.

    - the kinds must agree: integer (signed or unsigned) for an integer input, float for a
      float input, bool for a bool input; no cast from one kind to another;
    - an integer array converts when every value lies in the input's range (int64 codes
      of an int8 input are fine; 300 is refused, not wrapped to 44);
    - a float array converts with round-to-nearest (float64 data for a float32 input),
      unless a finite value would overflow to infinity.

    Anything else raises :class:`InterpreterError` naming the input.
    """
    want_np = dtype.np
    if a.dtype == want_np:
        return a
    got, want = _kind(a.dtype), _kind(want_np)
    if got != want:
        raise InterpreterError(f"input %{name} has dtype {a.dtype} ({got}), expected {dtype} "
                               f"({want}); cast it explicitly if that is meant")
    if got == "integer" and a.size:
        info = np.iinfo(want_np)
        bad = (a < info.min) | (a > info.max)
        if bad.any():
            raise InterpreterError(f"input %{name}: {a.dtype} value {a[bad].flat[0]} is outside "
                                   f"the {dtype} range [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):
        b = a.astype(want_np)
    if got == "float":
        bad = np.isinf(b) & np.isfinite(a)
        if bad.any():
            raise InterpreterError(f"input %{name}: {a.dtype} value {a[bad].flat[0]} overflows "
                                   f"{dtype}")
    return b


def run(graph: Graph, inputs: Mapping[str, np.ndarray], fetch: Iterable[str] | str | None = None,
        interpreter: Callable[[Graph], Interpreter] = Interpreter) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` with the golden interpreter; see :meth:`Interpreter.run`."""
    return interpreter(graph).run(inputs, fetch)
