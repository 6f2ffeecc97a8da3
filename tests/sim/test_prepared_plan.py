"""The interpreter's prepared plan: each node's golden kernel bound once per graph version
(OpDef.bind: its context, whether it reads C-ordered operands, its results' declared
types) and reused by every run, giving the bits of the unprepared semantics; a graph
changed after a run is prepared again, never served from the stale plan."""
import numpy as np
import pytest

import bevir
from bevir import InterpreterError, TensorType
from bevir.ir.opdef import get_op
from bevir.ir.types import Layout
from bevir.ir.builder import Builder
from bevir.ops import native
from bevir.sim.interpreter import Interpreter, _graph_facts


class Unprepared(Interpreter):
    """Each node computed as OpDef.run's docstring defines it, from scratch: a context made
    for the call and every operand C-ordered (but for data movement and the ops that read
    any memory order)."""

    def run_node(self, node, args):
        op = node.opdef
        if not (op.moves_data or op.any_memory_order):
            args = [None if a is None else np.ascontiguousarray(a) for a in args]
        out = op.compute(op.ctx(node), *args)
        return [np.asarray(o) for o in ([out] if isinstance(out, np.ndarray) else out)]


def model(rng) -> tuple[bevir.Graph, dict[str, np.ndarray]]:
    """A convolution, a transposed view read by a layer norm (a reduction over a strided
    axis unless copied), a split into two results and a softmax."""
    b = Builder("m")
    x = b.input("x", TensorType((1, 3, 12, 10)))
    y = b.conv2d(x, b.const(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
                 b.const(rng.standard_normal(8).astype(np.float32)), pads=(1, 1, 1, 1))
    t = b.transpose(b.relu(y), perm=(0, 2, 3, 1))
    n = b.layer_norm(t, axis=-1)
    lo, hi = b.split(n, axis=3, sizes=(3, 5))
    b.output("lo", b.softmax(lo, axis=-1))
    b.output("hi", hi)
    return b.graph, {"x": rng.standard_normal((1, 3, 12, 10)).astype(np.float32)}


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_prepared_runs_give_the_bits_of_the_unprepared_semantics(rng):
    graph, feed = model(rng)
    first = bevir.run(graph, feed, fetch="all")
    again = bevir.run(graph, feed, fetch="all")          # the plan the first run prepared
    assert same_bits(first, again)
    assert same_bits(first, Unprepared(graph).run(feed, fetch="all"))


def hardsigmoid_graph() -> tuple[bevir.Graph, np.ndarray]:
    b = Builder("g")
    x = b.input("x", TensorType((5,)))
    b.output("y", b.hardsigmoid(x, alpha=0.2, beta=0.5))
    return b.graph, np.array([-4, -1, 0, 1, 4], np.float32)


def test_a_node_replaced_after_a_run_runs_as_replaced():
    graph, x = hardsigmoid_graph()
    old = graph.nodes[0]
    assert bevir.run(graph, {"x": x})["y"].tolist() == pytest.approx([0, 0.3, 0.5, 0.7, 1])
    new = graph.create_node("hardsigmoid", old.inputs, {"alpha": 0.5, "beta": 0.5},
                            after=old)
    graph.replace_all_uses(old.outputs[0], new.outputs[0])
    graph.erase(old)
    assert bevir.run(graph, {"x": x})["y"].tolist() == [0, 0, 0.5, 1, 1]


def test_attributes_and_types_changed_with_the_version_are_read_again():
    """A pass that sets a node's fields itself and bumps the graph's version (as the pass
    manager requires of a change): the next run binds the node anew."""
    graph, x = hardsigmoid_graph()
    node = graph.nodes[0]
    bevir.run(graph, {"x": x})
    node.attrs = dict(node.attrs, alpha=0.25)
    graph.version += 1
    assert bevir.run(graph, {"x": x})["y"].tolist() == [0, 0.25, 0.5, 0.75, 1]
    node.outputs[0].type = TensorType((5,), "f16")       # now declared otherwise
    graph.version += 1
    with pytest.raises(InterpreterError, match="declared tensor<5xf16>"):
        bevir.run(graph, {"x": x})


def test_a_wrong_result_is_still_named_with_its_declared_type():
    """The plan's quick check of the results defers to the full one, which names them."""
    graph, x = hardsigmoid_graph()
    bad = Interpreter(graph, kernels={"hardsigmoid": lambda node, args: [args[0][:2]]})
    with pytest.raises(InterpreterError, match=r"result %\S+ is float32\[2\], declared"):
        bad.run({"x": x})
    two = Interpreter(graph, kernels={"hardsigmoid": lambda node, args: [args[0]] * 2})
    with pytest.raises(InterpreterError, match="produced 2 results, declared 1"):
        two.run({"x": x})


def prepared_ops_model(rng, layout: Layout) -> tuple[bevir.Graph, dict[str, np.ndarray]]:
    """The ops a plan prepares once per weight: a batch norm, a squeeze-excitation's
    pointwise convolutions on a 1x1 map (numpy's GEMM: BLAS sums one row otherwise than the
    native products), a 3x3 conv2d_act, a linear layer."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)     # noqa: E731
    b = Builder("m")
    shape = (2, 6, 6, 8) if layout is Layout.nhwc else (2, 8, 6, 6)
    x = b.input("x", TensorType(shape, layout=layout))
    y = b.batch_norm(x, b.const(f32(8)), b.const(f32(8)), b.const(f32(8)),
                     b.const(np.abs(f32(8)) + 0.5))
    y = b.conv2d_act(y, b.const(f32(16, 8, 3, 3)), b.const(f32(16)), pads=(1, 1, 1, 1),
                     activation="relu")
    pooled = b.global_avgpool(y)
    squeezed = b.conv2d_act(pooled, b.const(f32(4, 16, 1, 1)), b.const(f32(4)),
                            activation="relu")
    b.output("se", b.conv2d(squeezed, b.const(f32(16, 4, 1, 1)), b.const(f32(16))))
    flat = b.reshape(pooled, shape=(2, 16))
    b.output("fc", b.matmul_act(flat, b.const(f32(10, 16)), b.const(f32(10)), trans_b=True,
                                activation="relu"))
    return b.graph, {"x": f32(*shape)}


@pytest.mark.parametrize("layout", [Layout.nhwc, Layout.plain])
def test_prepared_products_give_the_bits_of_their_unprepared_compute(layout, monkeypatch, rng):
    """Each op that defines OpDef.prepare is prepared once per plan (not at every run) and
    gives the bits of its compute, natively and in numpy's code."""
    graph, feed = prepared_ops_model(rng, layout)
    calls = []
    for op in ("batch_norm", "conv2d", "conv2d_act", "matmul_act"):
        opdef, real = get_op(op), type(get_op(op)).prepare
        monkeypatch.setattr(opdef, "prepare",
                            lambda *a, _real=real, _op=opdef: calls.append(a) or _real(_op, *a))
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        calls.clear()
        first = bevir.run(graph, feed)
        assert len(calls) == 5                  # one per node, on its plan's first run
        again = bevir.run(graph, feed)
        assert len(calls) == 5
        assert same_bits(first, again)
        assert same_bits(first, Unprepared(graph).run(feed))


def test_a_node_run_with_other_weights_computes_with_them(rng):
    """OpDef.run of a prepared op on arrays that are not the node's constants (a piece of a
    split node, a kernel hook's operands) computes with the arrays given."""
    graph, feed = prepared_ops_model(rng, Layout.nhwc)
    node = next(n for n in graph.nodes if n.op == "conv2d_act")
    x = rng.standard_normal(node.inputs[0].type.shape).astype(np.float32)
    w = rng.standard_normal(node.inputs[1].type.shape).astype(np.float32)
    bias = node.inputs[2].const
    (got,) = node.opdef.run(node, [x, w, bias])
    want = node.opdef.compute(node.opdef.ctx(node), x, w, bias)
    assert got.tobytes() == want.tobytes()
    (own,) = node.opdef.run(node, [x, node.inputs[1].const, bias])
    assert own.tobytes() != got.tobytes()


def residual_model(rng, shared: bool = False) -> tuple[bevir.Graph, dict[str, np.ndarray]]:
    """Convolutions each read only by an add: an add_relu (a residual block's end), an add
    with the convolution's result second, an add of a broadcast bias; with ``shared``, the
    first convolution's result also a graph output."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)     # noqa: E731
    b = Builder("res")
    x = b.input("x", TensorType((1, 5, 6, 8), layout=Layout.nhwc))
    y = b.conv2d(x, b.const(f32(8, 8, 3, 3)), b.const(f32(8)), pads=(1, 1, 1, 1))
    r = b.add_relu(y, x)
    s = b.add(r, b.conv2d(r, b.const(f32(8, 8, 1, 1)), None))
    b.output("out", b.add(b.const(f32(8)), b.conv2d(s, b.const(f32(8, 8, 1, 1)), None)))
    if shared:
        b.output("y", y)
    feed = {"x": f32(1, 5, 6, 8)}
    feed["x"].reshape(-1)[::7] = np.nan                 # NaNs meet NaNs in the adds
    return b.graph, feed


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_a_plain_run_joins_a_convolution_and_the_add_that_reads_it_with_the_same_bits(
        native_on, monkeypatch, rng):
    """Each convolution read only by an add runs with it as one step of a plain run: the
    native product adds the other operand in its own pass (OpDef.bind_sum: in either
    operand order, then add_relu's relu), else the sum is written into the product's
    result (a broadcast operand, numpy's code); the bits of the node-by-node run (with a
    hook) and of the unprepared semantics, NaNs included."""
    from bevir.ops import linalg
    monkeypatch.setenv("BEVIR_NATIVE", native_on)
    summed = []
    real = linalg.conv2d_sum_runner

    def counted(*args):
        run = real(*args)
        return None if run is None else (lambda *a: summed.append(a[2]) or run(*a))
    monkeypatch.setattr(linalg, "conv2d_sum_runner", counted)
    graph, feed = residual_model(rng)
    facts = _graph_facts(graph, native.enabled())
    assert len(facts.steps) == 6 and len(facts.plain) == 3
    plain = bevir.run(graph, feed)
    assert summed == ([False, True] if native_on == "1" else [])
    hooked = Interpreter(graph, on_node_start=lambda node, args: None).run(feed)
    assert same_bits(plain, hooked) and same_bits(plain, Unprepared(graph).run(feed))
    assert np.isnan(plain["out"]).any()


def test_a_result_read_elsewhere_is_not_written_into(rng):
    """A convolution result that is also a graph output keeps its own array."""
    graph, feed = residual_model(rng, shared=True)
    facts = _graph_facts(graph, native.enabled())
    assert len(facts.plain) == 4                        # the first pair runs apart
    got = bevir.run(graph, feed)
    assert same_bits(got, Unprepared(graph).run(feed))


def test_an_error_in_a_joined_step_names_its_node(monkeypatch, rng):
    graph, feed = residual_model(rng)
    conv = graph.nodes[0]

    def fail(self, c, x, w, b=None):
        raise RuntimeError("no kernel today")
    monkeypatch.setattr(type(conv.opdef), "prepare", fail)
    with pytest.raises(InterpreterError, match="no kernel today") as err:
        bevir.run(graph, feed)
    assert err.value.node == conv.name


def test_a_chain_of_sums_runs_as_one_step(rng):
    """A mobileone-like branch sum: two convolutions, their sum (in the second one's
    pass), a scalar added into that sum's array and relu: one step of a plain run, with
    the bits of the nodes run one by one."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)     # noqa: E731
    b = Builder("chain")
    x = b.input("x", TensorType((1, 6, 5, 8), layout=Layout.nhwc))
    one = b.conv2d(x, b.const(f32(8, 8, 1, 1)), b.const(f32(8)))
    three = b.conv2d(x, b.const(f32(8, 8, 3, 3)), b.const(f32(8)), pads=(1, 1, 1, 1))
    b.output("y", b.add_relu(b.add(three, one), b.const(np.float32(0.25))))
    facts = _graph_facts(b.graph, native.enabled())
    assert len(facts.steps) == 4 and len(facts.plain) == 2     # the 3x3 conv runs apart
    feed = {"x": f32(1, 6, 5, 8)}
    hooked = Interpreter(b.graph, on_node_start=lambda node, args: None).run(feed)
    assert same_bits(bevir.run(b.graph, feed), hooked)
