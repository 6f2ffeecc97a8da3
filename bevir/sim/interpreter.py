"""The golden interpreter: runs a graph with the op registry's numpy semantics.

Hooks (all optional; unused, they cost one ``None`` check per node):

- ``kernels={"conv2d": fn}`` / ``node_kernels={"%y": fn}``: replace an op's (or one
  node's) kernel; ``fn(node, args) -> list[np.ndarray]`` like :meth:`OpDef.run`;
- ``on_node_start(node, args)`` before each node, ``on_node_end(node, args, results)``
  after it (returning a list replaces the results);
- ``run(inputs, initial_env={name: array})``: start from given values (a partial run);
- ``interp.env``: the live values by name, during and after a run.

Subclassing and overriding :meth:`Interpreter.run_node` still works. See docs/interpreter.md.
"""
from __future__ import annotations

import difflib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import BevirError, InterpreterError, raised_at, source_of
from ..ir.graph import Graph, Node, Value
from ..ir.limits import tensor_bytes, tensor_too_big
from ..ir.types import DType
from ..ir.opdef import OpDef, get_op
from ..ops import native

Args = list[np.ndarray | None]
#: a kernel: computes a node's results from its operand arrays (None: omitted operand)
Kernel = Callable[[Node, Args], list[np.ndarray]]
NodeStart = Callable[[Node, Args], None]
#: returns None to keep the results, or a list of arrays to replace them
NodeEnd = Callable[[Node, Args, list[np.ndarray]], list[np.ndarray] | None]


class Env(Mapping[str, np.ndarray]):
    """The interpreter's live values by value name (read-only): constants, graph inputs
    and results not yet freed, and after a run the outputs and fetched values."""

    def __init__(self, values: Mapping[str, Value], arrays: dict[int, np.ndarray]):
        self._values, self._arrays = values, arrays

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._values.get(name)
        if v is None or id(v) not in self._arrays:
            raise KeyError(name)
        return self._arrays[id(v)]

    def __iter__(self) -> Iterator[str]:
        return (name for name, v in self._values.items() if id(v) in self._arrays)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Interpreter:
    """Evaluates a graph node by node, freeing each value after its last use.

    ``kernels`` (op name -> kernel) and ``node_kernels`` (node name, e.g. ``"%y"``, ->
    kernel; wins over ``kernels``) replace the golden kernels; ``on_node_start`` and
    ``on_node_end`` observe each node and may replace its results. All four are public
    attributes and may be changed between runs.
    """

    def __init__(self, graph: Graph, *, kernels: Mapping[str, Kernel] | None = None,
                 node_kernels: Mapping[str, Kernel] | None = None,
                 on_node_start: NodeStart | None = None, on_node_end: NodeEnd | None = None):
        self.graph = graph
        self.kernels: dict[str, Kernel] = dict(kernels or {})
        self.node_kernels: dict[str, Kernel] = dict(node_kernels or {})
        self.on_node_start, self.on_node_end = on_node_start, on_node_end
        facts = _graph_facts(graph, native.enabled())
        self._steps, self._values, self._largest = facts.steps, facts.values, facts.largest
        self._arrays: dict[int, np.ndarray] = {}
        self._overrides: dict[Node, Kernel] = {}

    @property
    def env(self) -> Env:
        """The current (or last) run's values by name; see :class:`Env`."""
        return Env(self._values, self._arrays)

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

    def run_node(self, node: Node, args: Args) -> list[np.ndarray]:
        """Compute one node: its kernel override if it has one, else the golden semantics.
        The hook for subclasses (call ``super().run_node``)."""
        if self._overrides:
            kernel = self._overrides.get(node)
            if kernel is not None:
                out = kernel(node, args)
                return [np.asarray(o) for o in ([out] if isinstance(out, np.ndarray) else out)]
        return node.opdef.run(node, args)

    def run(self, inputs: Mapping[str, np.ndarray], fetch: Iterable[str] | str | None = None,
            *, initial_env: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run the graph on ``inputs`` (name -> array).

        Returns the graph outputs by name, plus the values named in ``fetch`` (or every
        node result when ``fetch == "all"``) by value name; those stay in :attr:`env`.
        Each input array is checked and converted by :func:`bind_input`: same kind of
        dtype, no value changed.

        ``initial_env`` (value name -> array) makes a partial run: the given values are not
        recomputed (a node whose results are all given is skipped), graph inputs may be
        left out, and only the nodes that lead to an output or a fetched value and whose
        operands are available run; the outputs that could not be computed are left out
        of the result.
        """
        g = self.graph
        keep_all = fetch == "all"
        wanted = set() if fetch is None or keep_all else set(fetch)
        env = self._arrays = {id(v): v.const for v in g.constants.values()}
        keep = {id(v) for v in g.outputs.values()} | {id(self._value(n)) for n in wanted}
        given = self._bind(inputs, initial_env, env)
        plan = None if given is None else self._plan(env, given, None if keep_all else keep)
        if self._largest > tensor_bytes():
            self._refuse_large(plan)
        facts = _graph_facts(g, native.enabled())      # kernels prepared for it
        splits = native.splits()
        with native.serial_blas(facts.splits):
            fetched = self._execute(inputs, facts, env, plan, keep, wanted, keep_all)
        facts.splits |= native.splits() != splits
        env = self._arrays                        # a failed plain run starts a new one
        for name in wanted - set(fetched):
            fetched[name] = self._computed(name, env)
        result = {k: env[id(v)] for k, v in g.outputs.items() if id(v) in env}
        result.update({k: v for k, v in fetched.items() if k not in result})
        return result

    def _execute(self, inputs: Mapping[str, np.ndarray], facts: Facts,
                 env: dict[int, np.ndarray], plan: set[Node] | None, keep: set[int],
                 wanted: set[str], keep_all: bool) -> dict[str, np.ndarray]:
        """The steps of a run, plain where nothing watches them: the fetched values."""
        self._steps = facts.steps
        self._overrides = self._resolve_kernels()
        # the golden kernels called straight from the op (no override, no run_node subclass)
        direct = not self._overrides and type(self).run_node is _RUN_NODE
        if (direct and plan is None and not keep_all and not wanted
                and self.on_node_start is None and self.on_node_end is None):
            try:
                _run_plain(facts.plain, env)
            except Exception:
                # again node by node, from the start: the node that fails is named
                env = self._arrays = {id(v): v.const for v in self.graph.constants.values()}
                self._bind(inputs, None, env)
                self._run_steps(env, None, keep, wanted, keep_all, direct)
            return {}
        return self._run_steps(env, plan, keep, wanted, keep_all, direct)

    def _run_steps(self, env: dict[int, np.ndarray], plan: set[Node] | None, keep: set[int],
                   wanted: set[str], keep_all: bool, direct: bool) -> dict[str, np.ndarray]:
        """The nodes of ``plan`` (None: all) with the hooks, overrides and fetched values
        of a run: the fetched values by name."""
        start, end = self.on_node_start, self.on_node_end
        collect = keep_all or bool(wanted)
        fetched: dict[str, np.ndarray] = {}
        for node, bound, ins, outs, frees, declared in self._steps:
            if plan is None or node in plan:
                args = [None if k is None else env[k] for k in ins]
                try:
                    if start is not None:
                        start(node, args)
                    results = bound(args) if direct else self.run_node(node, args)
                    if not _fits(results, declared):
                        self._check(node, results)        # raises, naming the result
                    if end is not None:
                        results = self._replaced(node, results, end(node, args, results))
                except Exception as e:
                    if isinstance(e, BevirError) and e.node:
                        raise
                    raise _node_error(node, e) from e
                for k, r in zip(outs, results):
                    env[k] = r
                if collect:
                    fetched.update((v.name, r) for v, r in zip(node.outputs, results)
                                   if keep_all or v.name in wanted)
            if not keep_all:                      # fetch="all" frees nothing
                for k in frees:
                    if k not in keep:
                        env.pop(k, None)
        return fetched

    def _bind_inputs(self, inputs: Mapping[str, np.ndarray], env: dict[int, np.ndarray]) -> None:
        check_input_names(self.graph, inputs)
        for v in self.graph.inputs:
            a = np.asarray(inputs[v.name])
            if tuple(a.shape) != v.type.shape:
                raise InterpreterError(f"input %{v.name} has shape {list(a.shape)}, "
                                       f"expected {list(v.type.shape)}")
            env[id(v)] = bind_input(v.name, a, v.type.dtype)

    def _refuse_large(self, plan) -> None:
        """An error naming the first node that would run whose result is larger than the
        per-tensor limit (raised before anything runs)."""
        for node, *_ in self._steps:
            for v in node.outputs:
                too_big = tensor_too_big(v.type.shape, v.type.dtype.np.itemsize)
                if too_big and (plan is None or node in plan):
                    raise InterpreterError(f"result %{v.name}: {too_big}", node=node.name,
                                           op=node.op, loc=node.loc)

    @staticmethod
    def _check(node: Node, results: list[np.ndarray]) -> None:
        if len(results) != len(node.outputs):
            raise InterpreterError(f"produced {len(results)} results, declared "
                                   f"{len(node.outputs)}", node=node.name, op=node.op, loc=node.loc)
        for v, r in zip(node.outputs, results):
            if not v.type.matches(r):
                raise InterpreterError(f"result %{v.name} is {r.dtype}{list(r.shape)}, declared "
                                       f"{v.type}", node=node.name, op=node.op, loc=node.loc)

    # ---- hooks ----------------------------------------------------------------------------
    def _value(self, name: str) -> Value:
        v = self._values.get(name)
        if v is None:
            raise InterpreterError(f"no value %{name} in graph @{self.graph.name}")
        return v

    def _computed(self, name: str, env: dict[int, np.ndarray]) -> np.ndarray:
        """A fetched value that no node of this run produced: an input, a constant, a given
        value; in a partial run, one that could not be computed is an error."""
        v = self._value(name)
        if id(v) not in env:
            raise InterpreterError(f"value %{name} was not computed: the values it depends on "
                                   "were not given")
        return env[id(v)]

    def _bind(self, inputs: Mapping[str, np.ndarray], initial_env: Mapping[str, np.ndarray] | None,
              env: dict[int, np.ndarray]) -> set[int] | None:
        """Bind the inputs (and the given values of a partial run, whose ids it returns).

        All graph inputs given: they are checked (and cast) as in a full run. Otherwise, in
        a partial run, the given ones must match their declared types exactly, like the
        ``initial_env`` values (which stand for node results)."""
        complete = all(v.name in inputs for v in self.graph.inputs)
        if initial_env is None or complete:
            self._bind_inputs(inputs, env)
        if initial_env is None:
            return None
        given = dict(initial_env) if complete else {**inputs, **initial_env}
        for name, array in given.items():
            v = self._value(name)
            a = np.asarray(array)
            if not v.type.matches(a):
                raise InterpreterError(f"initial value %{name} is {a.dtype}{list(a.shape)}, "
                                       f"declared {v.type}")
            env[id(v)] = a
        ids = {id(self._values[n]) for n in given}
        for node in self.graph.nodes:
            if 0 < sum(id(v) in ids for v in node.outputs) < len(node.outputs):
                raise InterpreterError("initial_env gives some of the node's results but not "
                                       "all", node=node.name, op=node.op, loc=node.loc)
        return ids

    def _plan(self, env: dict[int, np.ndarray], given: set[int], wanted: set[int] | None
              ) -> set[Node]:
        """The nodes a partial run runs: those whose results are not given, whose operands
        are available, and whose results lead to a wanted value (None: every value)."""
        available = set(env)
        runnable = []
        for node in self.graph.nodes:
            if not all(id(v) in given for v in node.outputs) and \
                    all(v is None or id(v) in available for v in node.inputs):
                runnable.append(node)
                available.update(id(v) for v in node.outputs)
        if wanted is None:
            return set(runnable)
        needed, plan = set(wanted), set()
        for node in reversed(runnable):
            if any(id(v) in needed for v in node.outputs):
                plan.add(node)
                needed.update(id(v) for v in node.inputs if v is not None)
        return plan

    def _replaced(self, node: Node, results: list[np.ndarray], new: list[np.ndarray] | None
                  ) -> list[np.ndarray]:
        """The results an ``on_node_end`` callback returned (checked), or the kernel's."""
        if new is None:
            return results
        new = [np.asarray(r) for r in new]
        self._check(node, new)
        return new

    def _resolve_kernels(self) -> dict[Node, Kernel]:
        """node -> its kernel override, checking that every override names an op or a node."""
        if not self.kernels and not self.node_kernels:
            return {}
        for op in self.kernels:
            try:
                get_op(op)
            except BevirError:
                raise InterpreterError(f"kernel override for unknown op '{op}'", op=op) from None
        nodes = {n.name: n for n in self.graph.nodes}
        unknown = sorted(set(self.node_kernels) - set(nodes))
        if unknown:
            raise InterpreterError(f"kernel override for node(s) {unknown} not in graph "
                                   f"@{self.graph.name}")
        out = {n: self.kernels[n.op] for n in self.graph.nodes if n.op in self.kernels}
        out.update((nodes[name], k) for name, k in self.node_kernels.items())
        return out


#: the interpreter's (unbound) golden run_node: where a subclass keeps it, a run may call
#: each op's kernel itself
_RUN_NODE = Interpreter.run_node

#: what a result must be: its shape and numpy dtype
Declared = tuple[tuple[int, ...], np.dtype]
#: one node of a run, prepared once per graph version (the run's plan): the node, its
#: golden kernel bound to it (OpDef.bind), its operands' keys in the run's arrays (None: an
#: omitted operand), its results' keys, the keys of the values it uses last, its results'
#: declared shapes and dtypes
Step = tuple[Node, Callable[[Args], list[np.ndarray]], tuple[int | None, ...],
             tuple[int, ...], tuple[int, ...], tuple[Declared, ...]]
#: one step of a plain run (:func:`_plain_steps`): its function of its operands, their
#: keys, its results' keys and declared types, the keys of the values it frees
PlainStep = tuple[Callable[[Args], list[np.ndarray]], tuple[int | None, ...], tuple[int, ...],
                  tuple[Declared, ...], tuple[int, ...]]


@dataclass(slots=True)
class Facts:
    """What a graph's runs are prepared with, once per graph version."""

    #: graph version, whether native kernels run
    key: tuple[int, bool]
    steps: list[Step]
    #: the steps of a plain run (no hooks, overrides, fetch or partial plan)
    plain: list[PlainStep]
    #: the graph's values by name
    values: dict[str, Value]
    #: the largest result, in bytes
    largest: int
    #: whether a run split native calls over threads (later runs hold BLAS to one)
    splits: bool = False


#: each graph's facts, while its version stays (bevir.run makes an interpreter per run)
_FACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _graph_facts(graph: Graph, native_kernels: bool) -> Facts:
    """The graph's steps (and a plain run's), its values by name and its largest result in
    bytes: prepared again whenever the graph's version changes (every change through the
    Graph API bumps it), so no step outlives the node it was made from, or whether native
    kernels run (``native_kernels``; the bound kernels prepare their native calls once)."""
    key = (graph.version, native_kernels)
    hit = _FACTS.get(graph)
    if hit is None or hit.key != key:
        last_use = Interpreter._last_uses(graph)
        steps = [(n, _bound(n), tuple(None if v is None else id(v) for v in n.inputs),
                  tuple(id(v) for v in n.outputs), tuple(id(v) for v in last_use.get(i, ())),
                  tuple((v.type.shape, v.type.dtype.np) for v in n.outputs))
                 for i, n in enumerate(graph.nodes)]
        largest = max((v.type.nbytes for n in graph.nodes for v in n.outputs), default=0)
        hit = Facts(key, steps, _plain_steps(graph, steps), {v.name: v for v in graph.values()},
                    largest)
        _FACTS[graph] = hit
    return hit


def _plain_steps(graph: Graph, steps: list[Step]) -> list[PlainStep]:
    """The steps of a plain run: each node's, but where a node can write its result into
    an operand's array (OpDef.bind_in_place) that is the only use of a fresh result
    (OpDef.fresh_results: a convolution's read by the add after it, a sum's read by the
    next), the producer's step and the node run as one step at the node's place, the
    result written into the operand (one allocation, one array and one step fewer); a
    product may compute a sum that reads it in its own pass (:func:`_summing`). Each value
    is freed after its last use, but the graph's outputs."""
    outputs = {id(v) for v in graph.outputs.values()}
    # each step: [function, operand keys, result keys, declared, its nodes]
    plain: list[list | None] = []
    at: dict[int, int] = {}                       # a node's id -> its step in plain
    for node, bound, ins, outs, _, declared in steps:
        entry = [bound, ins, outs, declared, (node,)]
        # the operands whose array the node may write into, a product that sums first
        donors = []
        for k, v in enumerate(node.inputs):
            consume = _in_place(node, k) if _donor(v, node, outputs) else None
            if consume is not None:
                p_nodes = plain[at[id(v.producer)]][4]
                summing = _summing(p_nodes[0], node, k) if len(p_nodes) == 1 else None
                donors.append((summing is None, k, consume, summing))
        if donors:
            _, k, consume, summing = min(donors, key=lambda d: d[:2])
            p = at[id(node.inputs[k].producer)]
            fn, p_ins, _, p_declared, p_nodes = plain[p]
            plain[p] = None                       # runs within this node's step
            entry = [_fused(fn, p_declared[0], len(p_ins), consume, k, summing),
                     p_ins + ins[:k] + (None,) + ins[k + 1:], outs, declared,
                     p_nodes + (node,)]
        at.update((id(n), len(plain)) for n in entry[4])
        plain.append(entry)
    kept = [tuple(e[:4]) for e in plain if e is not None]
    last: dict[int, int] = {}
    for i, (_, ins, _, _) in enumerate(kept):
        last.update((k, i) for k in ins if k is not None)
    keep = outputs | {id(v) for v in graph.constants.values()}
    frees: dict[int, list[int]] = {}
    for k, i in last.items():
        if k not in keep:
            frees.setdefault(i, []).append(k)
    return [step + (tuple(frees.get(i, ())),) for i, step in enumerate(kept)]


def _donor(v: Value | None, reader: Node, outputs: set[int]) -> bool:
    """Whether ``v`` is a fresh result (OpDef.fresh_results) that only ``reader`` reads,
    once, and no graph output: its array may take the reader's result."""
    if v is None or v.producer is None or id(v) in outputs or len(v.uses) != 1:
        return False
    try:
        return v.producer.opdef.fresh_results and len(v.producer.outputs) == 1
    except BevirError:                          # an unknown op
        return False


def _in_place(node: Node, operand: int) -> Callable[[Args], list[np.ndarray]] | None:
    """The node's kernel writing into operand ``operand`` (OpDef.bind_in_place), or None."""
    try:
        return node.opdef.bind_in_place(node, operand)
    except BevirError:                          # an unknown op
        return None


def _summing(producer: Node, reader: Node, operand: int
             ) -> Callable[[Args, np.ndarray], np.ndarray | None] | None:
    """Where ``reader`` is a sum (OpDef.sum_activation) of ``producer``'s result, its
    operand ``operand``, and the other operand: the producer computing it in its own pass
    (OpDef.bind_sum), or None."""
    activation = reader.opdef.sum_activation
    if activation is None or len(reader.inputs) != 2:
        return None
    return producer.opdef.bind_sum(producer, operand == 1, activation)


def _fused(produce: Callable[[Args], list[np.ndarray]], declared: Declared, count: int,
           consume: Callable[[Args], list[np.ndarray]], operand: int,
           summing: Callable[[Args, np.ndarray], np.ndarray | None] | None = None
           ) -> Callable[[Args], list[np.ndarray]]:
    """One step of two nodes: ``produce`` on the first ``count`` operands, its result (of
    the ``declared`` shape and dtype, else a ValueError) handed to ``consume`` as operand
    ``operand`` of the rest; or, where given and able for the arrays, ``summing`` (the
    producer computing the reader's sum with the other operand in its own pass)."""
    shape, dtype = declared

    def run(args: Args) -> list[np.ndarray]:
        rest = args[count:]
        if summing is not None:
            y = summing(args[:count], rest[1 - operand])
            if y is not None:
                return [y]
        (y,) = produce(args[:count])
        if y.shape != shape or y.dtype != dtype:
            raise ValueError(f"a result is {y.dtype}{list(y.shape)}, declared otherwise")
        rest[operand] = y
        return consume(rest)
    return run


def _run_plain(steps: list[PlainStep], env: dict[int, np.ndarray]) -> None:
    """A plain run of ``steps`` on ``env``: nothing per step but its kernel call, the check
    of its results (a ValueError where one is not as declared) and the values it frees."""
    for fn, ins, outs, declared, drops in steps:
        results = fn(list(map(env.get, ins)))
        if not _fits(results, declared):
            raise ValueError("a result is not as declared")
        for k, r in zip(outs, results):
            env[k] = r
        for k in drops:
            del env[k]


def _bound(node: Node) -> Callable[[Args], list[np.ndarray]]:
    """The node's golden kernel as a function of its operands (the op's own ``run`` where
    it defines one; where its op is not registered, a function that asks for it again,
    raising what :meth:`Interpreter.run_node` raises)."""
    try:
        opdef = node.opdef
    except BevirError:
        return lambda args: node.opdef.run(node, args)
    if type(opdef).run is not OpDef.run:
        return functools.partial(opdef.run, node)
    return opdef.bind(node)


def _fits(results: list[np.ndarray], declared: tuple[Declared, ...]) -> bool:
    """Whether ``results`` are as many as declared, each of its declared shape and dtype
    (:meth:`Interpreter._check` names the first that is not)."""
    if len(results) != len(declared):
        return False
    for r, (shape, dtype) in zip(results, declared):
        if r.shape != shape or r.dtype != dtype:
            return False
    return True


def _node_error(node: Node, e: Exception) -> InterpreterError:
    """An error from a node's kernel or hooks, as an InterpreterError naming the node."""
    message = e.message if isinstance(e, BevirError) else \
        f"{type(e).__name__}: {e}{raised_at(e, source_of(node.opdef))}"
    return InterpreterError(message, node=node.name, op=node.op, loc=node.loc)


def _kind(dtype: np.dtype) -> str:
    return {"i": "integer", "u": "integer", "f": "float", "b": "bool"}.get(dtype.kind,
                                                                          str(dtype))


def check_input_names(graph: Graph, names: Iterable[str]) -> None:
    """Raise an InterpreterError unless ``names`` are exactly ``graph``'s inputs, naming
    each given name the graph does not know (and the input it may stand for) and each
    input left out."""
    declared = [v.name for v in graph.inputs]
    unknown = [n for n in names if n not in declared]
    missing = [n for n in declared if n not in set(names)]
    if not unknown and not missing:
        return
    problems, lower = [], {m.lower(): m for m in missing}
    for name in unknown:
        close = difflib.get_close_matches(name.lower(), list(lower), n=1)
        problems.append(f"'{name}' is not an input of @{graph.name}"
                        + (f" (did you mean '{lower[close[0]]}'?)" if close else ""))
    if missing:
        problems.append(f"missing input(s) {missing}")
    raise InterpreterError("; ".join(problems) + f"; its inputs: {declared}")


def bind_input(name: str, a: np.ndarray, dtype: DType) -> np.ndarray:
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
        interpreter: Callable[[Graph], Interpreter] = Interpreter, *,
        initial_env: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run ``graph`` on ``inputs`` with the golden interpreter; see :meth:`Interpreter.run`."""
    return interpreter(graph).run(inputs, fetch, initial_env=initial_env)
