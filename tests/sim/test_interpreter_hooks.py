"""The interpreter's hooks: kernel overrides, before/after-node callbacks, the public
environment and partial runs from given values."""
import numpy as np
import pytest

import bevir
from bevir import InterpreterError, TensorType
from bevir.ir.builder import Builder

rng = np.random.default_rng(0)


def cnn() -> tuple[bevir.Graph, dict[str, np.ndarray]]:
    """x -> conv -> relu -> conv -> relu (+ x) -> out; values named c1, r1, c2, r2, out."""
    b = Builder("cnn")
    x = b.input("x", TensorType((1, 4, 6, 6)))
    y = x
    for i in (1, 2):
        w = b.const(rng.standard_normal((4, 4, 3, 3), np.float32), f"w{i}")
        y = b.conv2d(y, w, pads=(1, 1, 1, 1), name=f"c{i}", loc=f"/conv{i}")
        y = b.relu(y, name=f"r{i}", loc=f"/relu{i}")
    b.output("out", b.add(y, x, name="out", loc="/add"))
    return b.graph, {"x": rng.standard_normal((1, 4, 6, 6), np.float32)}


def relu_kernel(node, args):
    return [np.maximum(args[0], np.float32(0))]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ---- kernel overrides ---------------------------------------------------------------------
def test_a_reimplemented_kernel_gives_the_golden_outputs_bit_for_bit():
    g, x = cnn()
    calls = []

    def kernel(node, args):
        calls.append(node.name)
        return relu_kernel(node, args)

    golden = bevir.run(g, x, fetch="all")
    mine = bevir.Interpreter(g, kernels={"relu": kernel}).run(x, fetch="all")
    assert calls == ["%r1", "%r2"]
    assert same(mine, golden)


def test_an_override_changes_only_its_op_and_a_node_override_wins():
    g, x = cnn()
    golden = bevir.run(g, x, fetch="all")
    plus_one = lambda node, args: args[0] + np.float32(1)   # noqa: E731  (one array is accepted)
    zeros = lambda node, args: [np.zeros_like(args[0])]     # noqa: E731
    got = bevir.Interpreter(g, kernels={"relu": plus_one}, node_kernels={"%r2": zeros}).run(
        x, fetch="all")
    assert np.array_equal(got["c1"], golden["c1"])
    assert np.array_equal(got["r1"], golden["c1"] + 1)
    assert not np.array_equal(got["c2"], golden["c2"])        # reads the replaced r1
    assert not got["r2"].any() and np.array_equal(got["out"], x["x"])


def test_overrides_may_change_between_runs_and_reach_run_node_subclasses():
    g, x = cnn()
    seen = []

    class Spy(bevir.Interpreter):
        def run_node(self, node, args):
            seen.append(node.op)
            return super().run_node(node, args)

    interp = Spy(g)
    golden = interp.run(x, fetch=["r2"])
    interp.node_kernels["%out"] = lambda node, args: [args[0] - args[1]]
    assert np.array_equal(interp.run(x)["out"], golden["r2"] - x["x"])
    assert seen == ["conv2d", "relu", "conv2d", "relu", "add"] * 2


@pytest.mark.parametrize("kernel, message", [
    (lambda node, args: 1 / 0, "ZeroDivisionError: division by zero"),
    (lambda node, args: [args[0][:, :2]], r"result %r1 is float32\[1, 2, 6, 6\], declared"),
    (lambda node, args: [args[0], args[0]], "produced 2 results, declared 1"),
    (lambda node, args: (_ for _ in ()).throw(bevir.BevirError("no tile fits")), "no tile fits"),
])
def test_kernel_override_errors_name_the_node_op_and_source(kernel, message):
    g, x = cnn()
    with pytest.raises(InterpreterError, match=message) as e:
        bevir.Interpreter(g, kernels={"relu": kernel}).run(x)
    assert (e.value.node, e.value.op, e.value.loc) == ("%r1", "relu", "/relu1")


def test_an_override_for_an_unknown_op_or_node_is_refused():
    g, x = cnn()
    with pytest.raises(InterpreterError, match="unknown op 'rleu'"):
        bevir.Interpreter(g, kernels={"rleu": relu_kernel}).run(x)
    with pytest.raises(InterpreterError, match=r"node\(s\) \['%r9'\] not in graph @cnn"):
        bevir.Interpreter(g, node_kernels={"%r9": relu_kernel}).run(x)


# ---- callbacks ----------------------------------------------------------------------------
def test_callbacks_see_each_node_and_may_replace_its_results():
    g, x = cnn()
    golden = bevir.run(g, x, fetch="all")
    log = []

    def start(node, args):
        log.append(("start", node.name, [a.shape for a in args]))

    def end(node, args, results):
        log.append(("end", node.name, np.array_equal(results[0], golden[node.outputs[0].name])))
        return [results[0] * 0] if node.name == "%r2" else None

    got = bevir.Interpreter(g, on_node_start=start, on_node_end=end).run(x)
    assert [e[:2] for e in log[:4]] == [("start", "%c1"), ("end", "%c1"), ("start", "%r1"),
                                        ("end", "%r1")]
    assert log[0][2] == [(1, 4, 6, 6), (4, 4, 3, 3)]
    # the golden results, until the add reads the replaced r2
    assert [ok for kind, _, ok in log if kind == "end"] == [True] * 4 + [False]
    assert np.array_equal(got["out"], x["x"])                   # r2 replaced by zeros


def test_a_callback_that_replaces_with_a_wrong_type_or_fails_is_named():
    g, x = cnn()
    with pytest.raises(InterpreterError, match=r"result %c1 is float64\[1, 4, 6, 6\]") as e:
        bevir.Interpreter(g, on_node_end=lambda n, a, r: [r[0].astype(np.float64)]).run(x)
    assert e.value.node == "%c1"
    with pytest.raises(InterpreterError, match="KeyError") as e:
        bevir.Interpreter(g, on_node_start=lambda n, a: {}[n.name]).run(x)
    assert (e.value.node, e.value.loc) == ("%c1", "/conv1")


def test_checking_one_kernel_at_a_time_against_the_golden_model():
    """The code generator's check: each node runs its candidate kernel and is compared with
    the golden one on the same operands; the run continues on golden values."""
    g, x = cnn()
    off_by_one = {"%r2"}

    def candidate(node, args):
        out = relu_kernel(node, args)[0]
        return [out + np.float32(1)] if node.name in off_by_one else [out]

    differing = {}

    def compare(node, args, results):
        golden = node.opdef.run(node, args)
        differing[node.name] = int(sum(np.count_nonzero(r != e) for r, e in zip(results, golden)))
        return golden

    got = bevir.Interpreter(g, kernels={"relu": candidate}, on_node_end=compare).run(x)
    assert differing == {"%c1": 0, "%r1": 0, "%c2": 0, "%r2": 4 * 6 * 6, "%out": 0}
    assert same(got, bevir.run(g, x))


# ---- the environment ----------------------------------------------------------------------
def test_env_holds_live_values_by_name_during_and_after_the_run():
    g, x = cnn()
    interp = bevir.Interpreter(g)
    live = {}
    interp.on_node_start = lambda node, args: live.setdefault(node.name, sorted(interp.env))
    interp.run(x)
    consts = ["w1", "w2"]
    assert live["%c1"] == sorted(consts + ["x"])
    assert live["%c2"] == sorted(consts + ["r1", "x"])      # c1 was freed after relu1
    assert sorted(interp.env) == sorted(consts + ["out"])   # the add freed r2 and x
    assert "c1" not in interp.env and np.array_equal(interp.env["w1"], g.value("w1").const)


def test_fetched_values_stay_alive_in_env():
    g, x = cnn()
    interp = bevir.Interpreter(g)
    out = interp.run(x, fetch=["c1", "x"])
    assert set(out) == {"out", "c1", "x"} and np.array_equal(out["x"], x["x"])
    assert {"c1", "x", "out"} <= set(interp.env) and "r1" not in interp.env
    interp.run(x, fetch="all")
    assert {v.name for v in g.values()} == set(interp.env)
    with pytest.raises(InterpreterError, match="no value %nope"):
        interp.run(x, fetch=["nope"])


# ---- partial runs -------------------------------------------------------------------------
def test_a_partial_run_from_a_cut_recomputes_only_what_follows():
    g, x = cnn()
    golden = bevir.run(g, x, fetch="all")
    ran = []
    interp = bevir.Interpreter(g, on_node_start=lambda node, args: ran.append(node.name))
    got = interp.run({}, fetch=["r2"], initial_env={"r1": golden["r1"], "x": x["x"]})
    assert ran == ["%c2", "%r2", "%out"]                      # c1 leads only to r1: skipped
    assert same(got, {k: golden[k] for k in ("out", "r2")})
    ran.clear()
    got = bevir.run(g, {}, fetch=["r2"], initial_env={"r1": golden["r1"]},
                    interpreter=lambda g: interp)
    assert ran == ["%c2", "%r2"] and same(got, {"r2": golden["r2"]})   # add needs x


def test_given_values_replace_what_their_nodes_would_compute():
    g, x = cnn()
    r1 = np.ones((1, 4, 6, 6), np.float32)
    got = bevir.Interpreter(g).run(x, fetch=["c1"], initial_env={"r1": r1})
    full = bevir.Interpreter(g, node_kernels={"%r1": lambda n, a: [r1]}).run(x, fetch=["c1"])
    assert same(got, full)


def test_uncomputable_fetches_and_mistyped_given_values_are_refused():
    g, x = cnn()
    golden = bevir.run(g, x, fetch="all")
    with pytest.raises(InterpreterError, match="value %c1 was not computed"):
        bevir.Interpreter(g).run({}, fetch=["c1"], initial_env={"r1": golden["r1"]})
    with pytest.raises(InterpreterError, match=r"initial value %r1 is float64\[1, 4, 6, 6\]"):
        bevir.Interpreter(g).run(x, initial_env={"r1": golden["r1"].astype(np.float64)})
    with pytest.raises(InterpreterError, match="no value %r7"):
        bevir.Interpreter(g).run(x, initial_env={"r7": golden["r1"]})


def test_a_partial_run_must_give_all_results_of_a_node_or_none():
    b = Builder()
    x = b.input("x", TensorType((4, 2)))
    lo, hi = b.split(x, axis=0, sizes=(1, 3), name=["lo", "hi"])
    b.output("lo", b.relu(lo, name="rl"))
    b.output("hi", b.relu(hi, name="rh"))
    with pytest.raises(InterpreterError, match="gives some of the node's results") as e:
        bevir.Interpreter(b.graph).run({}, initial_env={"lo": np.ones((1, 2), np.float32)})
    assert e.value.node == "%lo"
    both = {"lo": np.ones((1, 2), np.float32), "hi": -np.ones((3, 2), np.float32)}
    got = bevir.Interpreter(b.graph).run({}, initial_env=both)
    assert np.array_equal(got["lo"], both["lo"]) and not got["hi"].any()


def test_a_graph_changed_between_runs_runs_as_changed():
    """What the interpreter works out once per graph (last uses, values by name) follows
    the graph's version: a value renamed and an input rewired after a run count."""
    b = Builder("g")
    x = b.input("x", TensorType((4,)))
    h = b.relu(x)
    b.output("y", b.neg(h))
    graph, a = b.graph, np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    assert bevir.run(graph, {"x": a}, fetch=[h.name])[h.name].tolist() == [0, 2, 0, 4]
    graph.rename(h, "hidden")
    neg = next(n for n in graph.nodes if n.op == "neg")
    neg.set_input(0, x)                     # y = -x now; hidden is no longer read
    out = bevir.run(graph, {"x": a}, fetch=["hidden"])
    assert out["hidden"].tolist() == [0, 2, 0, 4] and out["y"].tolist() == [1, -2, 3, -4]
