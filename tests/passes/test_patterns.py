"""The pattern-rewriting machinery: matching DSL, driver, statistics, explanations."""
import numpy as np
import pytest

import bevir
from bevir import Builder, DType, TensorType
from bevir.passes.patterns import (ConvergenceError, PatternPass, RewritePattern,
                                   apply_patterns, const, explain, fused_loc, match_pattern,
                                   op)

F32 = DType.f32


class AddZero(RewritePattern):
    name = "test-add-zero"
    pattern = op("add", "x", const("zero"), commutative=True)

    def check(self, m):
        if np.any(m["zero"].const):
            return "the constant is not all zeros"

    def rewrite(self, rw, m):
        rw.replace(m.root, m["x"])


class ReluRelu(RewritePattern):
    name = "test-relu-relu"
    benefit = 2
    pattern = op("relu", op("relu", "x", name="inner"))

    def rewrite(self, rw, m):
        rw.replace(m.root, m["inner"])


class ReluToClip(RewritePattern):
    name = "test-relu-to-clip"
    pattern = op("relu", "x")

    def rewrite(self, rw, m):
        rw.replace(m.root, rw.create("clip", [m["x"]], {"min": 0.0}))


class ClipToRelu(RewritePattern):
    name = "test-clip-to-relu"
    pattern = op("clip", "x", attrs={"min": 0.0, "max": None})

    def rewrite(self, rw, m):
        rw.replace(m.root, rw.create("relu", [m["x"]]))


class Simplify(PatternPass):
    name = "test-simplify"
    patterns = (AddZero, ReluRelu)


def _graph(zero=0.0, relus=3):
    b = Builder("g")
    x = b.input("x", TensorType((2, 3), F32))
    with b.loc("m.add"):
        y = b.add(x, b.const(np.full((3,), zero, np.float32), "z"))
    for i in range(relus):
        with b.loc(f"m.relu{i}"):
            y = b.relu(y)
    b.output("y", y)
    return b.graph


def _run(g):
    return bevir.run(g, {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)})["y"]


def test_fixpoint_through_several_rounds():
    g = _graph()
    before = _run(g)
    pm = bevir.passes.PassManager("test-simplify")
    pm.run(g)
    assert [n.op for n in g.nodes] == ["relu"]
    assert np.array_equal(_run(g), before)
    p = pm.passes[0]
    st = p.pattern_stats
    assert st["test-add-zero"].applied == 1 and st["test-relu-relu"].applied == 2
    assert st["test-relu-relu"].tries >= 3 and st["test-add-zero"].tries >= 1
    assert p.statistics == {"test-add-zero": 1, "test-relu-relu": 2}
    assert not g.constants                          # the dead zero constant went too


def test_result_names_and_provenance_survive():
    g = _graph(relus=2)
    bevir.optimize(g, "test-simplify{disable=test-add-zero}")
    assert [n.op for n in g.nodes] == ["add", "relu"]
    g2 = _graph(relus=1)
    name = g2.outputs["y"].name
    apply_patterns(g2, [ReluToClip()])
    assert g2.nodes[-1].op == "clip" and g2.nodes[-1].loc == "m.relu0"
    assert g2.outputs["y"].name == name


def test_fused_loc():
    assert fused_loc(["a", "b", "a", "", "b+c"]) == "a+b+c"


def test_check_declines_with_reason():
    g = _graph(zero=1.0, relus=1)
    add = g.nodes[0]
    assert "declined: the constant is not all zeros" in explain(g, "test-add-zero", add)
    apply_patterns(g, [AddZero()])
    assert [n.op for n in g.nodes] == ["add", "relu"]


def test_explain_best_near_miss():
    g = _graph(relus=1)
    text = explain(g, "test-relu-relu")
    assert "best candidate relu" in text and "is not relu" in text
    assert "add" in text
    assert explain(g, "test-relu-relu", g.nodes[-1].outputs[0].name).endswith(
        "no match: add %" + g.nodes[0].outputs[0].name + " is not relu")
    assert "no node of op clip" in explain(g, "test-clip-to-relu")


def test_commutative_and_interior_uses():
    b = Builder("g")
    x = b.input("x", TensorType((3,), F32))
    z = b.const(np.zeros(3, np.float32), "z")
    r = b.relu(x)
    s = b.relu(r)
    b.output("s", s)
    b.output("r", r)                    # the inner relu is a graph output too
    y = b.add(z, x)                     # constant first: matches through commutativity
    b.output("y", y)
    m = match_pattern(AddZero.pattern, y.producer)
    assert m and m["x"] is x and m["zero"] is z
    miss = match_pattern(ReluRelu.pattern, s.producer)
    assert not miss and "used outside the pattern" in miss.reason


def test_benefit_orders_patterns():
    class AddZeroFirst(AddZero):
        name = "test-add-zero-first"
        benefit = 5

    stats = {}
    apply_patterns(_graph(relus=1), [AddZero(), AddZeroFirst()], stats=stats)
    assert stats["test-add-zero-first"].applied == 1
    assert stats["test-add-zero"].applied == stats["test-add-zero"].tries == 0


def test_benefit_orders_patterns_for_every_op_against_those_for_one():
    class ReluAnywhere(RewritePattern):       # no roots: tried on every node
        name = "test-relu-anywhere"
        benefit = 5

        def match(self, node):
            return match_pattern(op("relu", "x"), node)

        def rewrite(self, rw, m):
            rw.replace(m.root, m["x"])

    stats = {}
    apply_patterns(_graph(relus=1), [ReluToClip(), ReluAnywhere()], stats=stats)
    assert stats["test-relu-anywhere"].applied == 1 and stats["test-relu-to-clip"].tries == 0


def test_a_new_pattern_in_a_subclass_brings_its_roots():
    class AddZeroOnSub(AddZero):
        name = "test-add-zero-on-sub"
        pattern = op("sub", "x", const("zero"))

    assert AddZero.roots == ("add",) and AddZeroOnSub.roots == ("sub",)


def test_non_convergence_names_the_patterns():
    g = _graph(relus=1)
    with pytest.raises(ConvergenceError) as e:
        apply_patterns(g, [ReluToClip(), ClipToRelu()], max_rewrites=20)
    assert "test-relu-to-clip" in str(e.value) and "test-clip-to-relu" in str(e.value)


def test_unknown_pattern_in_pipeline_is_an_error():
    with pytest.raises(bevir.PassError, match="no pattern 'nope'"):
        bevir.optimize(_graph(), "test-simplify{disable=nope}")


def test_rewrite_that_changes_nothing_is_an_error():
    class Lazy(RewritePattern):
        name = "test-lazy"
        pattern = op("relu", "x")

        def rewrite(self, rw, m):
            pass

    with pytest.raises(bevir.PassError, match="changed nothing"):
        apply_patterns(_graph(), [Lazy()])


def test_rewrite_budget_stops_the_driver():
    from bevir.passes.rewrites import limit_rewrites
    g = _graph(relus=4)
    with limit_rewrites(2) as log:
        apply_patterns(g, [AddZero(), ReluRelu()])
    assert log.count == 2
    assert len(g.nodes) == 5 - 2
