"""Numeric verification of passes: the rewrite budget, VerifyNumerics, bisection,
reproducers, tolerances and the CLI flags."""
from __future__ import annotations

import re
import tempfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bevir
from bevir import AffineQuant, Builder, DType, PassError, TensorType
from bevir.cli import main
from bevir.passes import (Canonicalize, Pass, PassManager, VerifyEach, VerifyNumerics,
                          parse_pipeline, probe_inputs)
from bevir.passes.canonicalize import RemoveIdentity
from bevir.passes import patterns
from bevir.passes.fuse import FusionPattern
from bevir.passes.patterns import PatternPass
from bevir.passes import instruments as instruments_module
from bevir.passes.rewrites import limit_rewrites, rewrite_permitted


@pytest.fixture(autouse=True)
def _private_tempdir(tmp_path, monkeypatch):
    """Default reproducer directories land in the test's tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


# ---- graphs ------------------------------------------------------------------------------
def float_graph(relus: int = 5) -> bevir.Graph:
    """relu/add chain with provenance, plus foldable constants, a reshape chain, a common
    subexpression and a dead node, so that canonicalize, cse and dce all rewrite."""
    b = Builder("float")
    x = b.input("x", TensorType((2, 3)))
    y = x
    for i in range(relus):
        with b.loc(f"m/relu{i}"):
            y = b.add(b.relu(y), x)
    two = b.add(b.const(np.float32(1.0)), b.const(np.float32(1.0)))
    y = b.reshape(b.reshape(y, shape=(6,)), shape=(3, 2))
    b.neg(x)
    b.output("y", b.mul(y, two))
    b.output("z", b.mul(y, two))
    return b.graph


def int_graph() -> bevir.Graph:
    """Quantized ops (bevir.ops.qlinear): a foldable quantize of a constant, a duplicated
    qlinear_add, a reshape chain, a dead node; integer and dequantized outputs."""
    rng = np.random.default_rng(1)
    b = Builder("qnet")
    x = b.input("x", TensorType((2, 8), DType.i8, quant=AffineQuant((0.05,), (3,))))
    w = b.quantize(b.const(rng.standard_normal(8).astype(np.float32)), dtype="i8",
                   scale=[0.02], zero_point=[0])
    out = dict(out_dtype="i8", out_scale=0.06, out_zero_point=-2)
    a1 = b.qlinear_add(x, w, **out, loc="add1")
    a2 = b.qlinear_add(x, w, **out, loc="add2")
    m = b.qlinear_mul(a1, a2, out_dtype="i8", out_scale=0.1, out_zero_point=1, loc="mul")
    b.qlinear_add(x, x, **out)
    b.output("y", b.reshape(b.reshape(m, shape=(16,)), shape=(4, 4)))
    b.output("f", b.dequantize(a1))
    b.output("a", a1)
    return b.graph


# ---- test-local passes (unique names) ----------------------------------------------------
def _swap(graph, node, op: str, *inputs) -> None:
    new = graph.create_node(op, list(inputs or node.inputs), loc=node.loc, before=node)
    graph.replace_node(node, new.outputs)


class WrongThird(Pass):
    """Rewrites every relu into a relu, asking the budget first; the 3rd becomes a sigmoid."""
    name = "test-vn-wrong-third"

    def run(self, graph, am):
        for k, node in enumerate([n for n in graph.nodes if n.op == "relu"], start=1):
            if not rewrite_permitted("wrong-third:relu", node):
                return
            _swap(graph, node, "sigmoid" if k == 3 else "relu")


class WrongUnbudgeted(Pass):
    """Turns the first relu into a sigmoid without asking the budget."""
    name = "test-vn-wrong-unbudgeted"

    def run(self, graph, am):
        _swap(graph, next(n for n in graph.nodes if n.op == "relu"), "sigmoid")


class Scale(Pass):
    """Multiplies every output by ``factor``; declares a tolerance of 1e-3."""
    name = "test-vn-scale"
    tolerance = 1e-3

    factor: float = 1.0

    def run(self, graph, am):
        for name, v in list(graph.outputs.items()):
            c = graph.add_const(np.asarray(self.factor, v.type.dtype.np))
            graph.set_output(name, graph.create_node("mul", [v, c]).output)


class ExactScale(Scale):
    """Scale, but claiming bit-identity (tolerance 0)."""
    name = "test-vn-exact-scale"
    tolerance = 0.0


class NudgeConst(Pass):
    """Adds 10 to the first element of every integer constant; claims a big tolerance,
    which a quantized graph must ignore."""
    name = "test-vn-nudge-const"
    tolerance = 1.0

    def run(self, graph, am):
        for v in [c for c in graph.constants.values() if c.type.dtype.is_int]:
            data = v.const.copy()
            data.flat[0] = data.flat[0] - 10 if data.flat[0] > 0 else data.flat[0] + 10
            graph.replace_all_uses(v, graph.add_const(data, None, v.type))


class Perturb(Pass):
    """Changes results on purpose, and says so."""
    name = "test-vn-perturb"
    semantics_preserving = False

    def run(self, graph, am):
        Scale(factor=3.0).run(graph, am)


# ---- the rewrite budget ------------------------------------------------------------------
def test_without_a_budget_every_rewrite_is_permitted():
    assert all(rewrite_permitted("anything") for _ in range(3))


def test_budget_logs_canonicalize_rewrites_and_stops_the_pass():
    g = float_graph()
    with limit_rewrites(None) as full:
        bevir.optimize(g.clone(), "canonicalize")
    whats = [e.what for e in full.entries]
    assert "fold-constants" in whats and "fold-reshape-chain" in whats
    with limit_rewrites(1) as log:
        bevir.optimize(g, "canonicalize")
    assert log.count == 1 and log.refused >= 1
    first = log.entries[0]
    assert (first.index, first.what) == (1, full.entries[0].what)
    assert first.node.startswith("%") and first.op == "add"
    assert str(first) == f"rewrite #1 fold-constants on node {first.node} (op 'add')"
    assert g.op_counts().get("reshape") == 2          # the chain was not folded


def test_budget_limits_cse_and_dce():
    g = float_graph()
    bevir.optimize(g, "canonicalize")
    with limit_rewrites(0) as log:
        bevir.optimize(g, "cse,dce")
    assert log.count == 0 and log.refused == 2
    assert g.op_counts()["mul"] == 2 and "neg" in g.op_counts()
    with limit_rewrites(None) as log:
        bevir.optimize(g, "cse,dce")
    assert [e.what for e in log.entries] == ["cse:merge", "dce:erase"]
    assert g.op_counts()["mul"] == 1 and "neg" not in g.op_counts()


def test_budgets_nest_and_reject_bad_limits():
    with limit_rewrites(5) as outer:
        assert rewrite_permitted("a")
        with limit_rewrites(0) as inner:
            assert not rewrite_permitted("b")
        assert rewrite_permitted("c")
    assert [e.what for e in outer.entries] == ["a", "c"] and inner.refused == 1
    with pytest.raises(PassError, match="limit"):
        with limit_rewrites(-1):
            pass


# ---- clean pipelines -----------------------------------------------------------------------
@pytest.mark.parametrize("make", [float_graph, int_graph], ids=["float", "int"])
def test_clean_pipeline_passes(make):
    g = make()
    vn = VerifyNumerics()
    bevir.optimize(g, "canonicalize,cse,dce", instruments=[vn])
    assert [c.pass_text for c in vn.checks] == ["canonicalize", "cse", "dce"]
    assert all(c.changed and c.ok for c in vn.checks)
    assert all(d == 0.0 for c in vn.checks for d in c.diffs.values())
    assert set(vn.checks[0].diffs) == set(g.outputs)
    assert "MISMATCH" not in vn.report() and vn.summary().startswith("numerics: 3 pass(es)")


def test_optimize_takes_verify_numerics_and_orders_verification_first():
    g = float_graph()
    probe = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
    bevir.optimize(g, "canonicalize,cse,dce", verify_numerics=probe)
    pm = PassManager("dce", verify_numerics=True)
    kinds = [type(i) for i in pm.instruments]
    assert kinds == [VerifyEach, VerifyNumerics]
    with pytest.raises(PassError, match="test-vn-wrong-third"):
        bevir.optimize(float_graph(), "test-vn-wrong-third", verify_numerics=probe)


def test_default_probe_inputs_are_seeded_and_in_range():
    g = int_graph()
    a, b, c = probe_inputs(g), probe_inputs(g), probe_inputs(g, seed=1)
    assert np.array_equal(a["x"], b["x"]) and not np.array_equal(a["x"], c["x"])
    assert a["x"].dtype == np.int8 and a["x"].min() < -100 and a["x"].max() > 100


def test_unchanged_pass_is_not_interpreted(monkeypatch):
    g = float_graph()
    bevir.optimize(g, "canonicalize,cse,dce")
    calls = []
    real = instruments_module.run
    monkeypatch.setattr(instruments_module, "run", lambda *a: calls.append(1) or real(*a))
    vn = VerifyNumerics()
    bevir.optimize(g, "dce,cse", instruments=[vn])
    assert len(calls) == 1                      # the reference, before the pipeline
    assert [c.changed for c in vn.checks] == [False, False]


def test_non_preserving_pass_is_skipped_and_the_reference_restarts():
    vn = VerifyNumerics()
    bevir.optimize(float_graph(), "test-vn-perturb,canonicalize,cse", instruments=[vn])
    assert [c.pass_text for c in vn.checks] == ["canonicalize", "cse"]
    assert all(c.ok for c in vn.checks)


def test_missing_probe_input_is_an_error():
    with pytest.raises(PassError, match=r"lack graph input\(s\) \['x'\]"):
        bevir.optimize(float_graph(), "dce", instruments=[VerifyNumerics({"other": 1})])


# ---- mismatches, bisection and reproducers -------------------------------------------------
def test_broken_pass_is_bisected_to_its_third_rewrite(tmp_path):
    g = float_graph()
    vn = VerifyNumerics(reproducer_dir=tmp_path / "repro")
    with pytest.raises(PassError) as info:
        bevir.optimize(g, "canonicalize,test-vn-wrong-third,cse", instruments=[vn])
    e = info.value
    assert e.pass_name == "test-vn-wrong-third" and e.output == "y"
    assert (e.rewrite.index, e.rewrite.what, e.rewrite.loc) == (3, "wrong-third:relu",
                                                                "m/relu2")
    third = [n for n in bevir.optimize(float_graph(), "canonicalize").nodes if n.op == "relu"][2]
    assert (e.node, e.op) == (third.name, "relu")
    msg = str(e)
    assert msg.startswith("pass 'test-vn-wrong-third' changed the results: output 'y'")
    assert f"first differing {e.rewrite}" in msg and "bisected over 5 rewrites" in msg
    assert f"reproducer: {tmp_path / 'repro'}" in msg
    assert vn.checks[-1].failing == ["y", "z"]


def test_reproducer_reloads_and_reproduces(tmp_path):
    repro = tmp_path / "repro"
    with pytest.raises(PassError):
        bevir.optimize(float_graph(), "canonicalize,test-vn-wrong-third",
                       instruments=[VerifyNumerics(reproducer_dir=repro)])
    names = {p.name for p in repro.iterdir()}
    assert {"graph.bevir", "graph.safetensors", "inputs.safetensors", "expected.safetensors",
            "actual.safetensors", "pipeline.txt", "rewrite.txt"} <= names
    graph = bevir.load(repro / "graph.bevir")
    inputs = load_file(repro / "inputs.safetensors")
    expected = load_file(repro / "expected.safetensors")
    before = bevir.run(graph, inputs)
    assert all(np.array_equal(before[k], expected[k]) for k in expected)
    assert "rewrite #3 wrong-third:relu" in (repro / "rewrite.txt").read_text()
    passes = parse_pipeline((repro / "pipeline.txt").read_text().strip())
    PassManager(passes).run(graph)
    after = bevir.run(graph, inputs)
    assert np.abs(after["y"] - expected["y"]).max() > 0.01
    assert np.array_equal(after["y"], load_file(repro / "actual.safetensors")["y"])


def test_default_reproducer_is_a_temp_dir_named_in_the_message():
    vn = VerifyNumerics()
    with pytest.raises(PassError) as info:
        bevir.optimize(float_graph(), "test-vn-wrong-third", instruments=[vn])
    assert vn.reproducer is not None and vn.reproducer.name.startswith("bevir-numerics-")
    assert str(info.value).endswith(f"reproducer: {vn.reproducer}")
    assert (vn.reproducer / "graph.bevir").exists()


def test_unbudgeted_pass_cannot_be_narrowed_down():
    with pytest.raises(PassError, match="test-vn-wrong-unbudgeted") as info:
        bevir.optimize(float_graph(), "test-vn-wrong-unbudgeted", verify_numerics=True)
    assert ("cannot narrow down: the pass made no rewrite through the rewrite budget"
            in str(info.value))
    assert info.value.rewrite is None


class ReluIsIdentity(RemoveIdentity):
    """Wrong on purpose: relu(x) is not x."""
    name = "test-vn-relu-is-identity"
    pattern = patterns.op("relu", ...)


def test_wrong_canonicalization_is_bisected_to_its_rewrite(monkeypatch):
    monkeypatch.setattr(Canonicalize, "patterns", Canonicalize.patterns + (ReluIsIdentity,))

    b = Builder()
    x = b.input("x", TensorType((4,)))
    two = b.add(b.const(np.float32(1.0)), b.const(np.float32(1.0)))    # rewrite #1: a fold
    b.output("y", b.mul(b.relu(x, loc="m/act"), two))
    with pytest.raises(PassError, match="pass 'canonicalize' changed the results") as info:
        bevir.optimize(b.graph, "canonicalize", verify_numerics=True)
    r = info.value.rewrite
    assert (r.index, r.what, r.op, r.loc) == (2, "test-vn-relu-is-identity", "relu", "m/act")
    assert str(r) in str(info.value)


# ---- tolerance -----------------------------------------------------------------------------
def test_tolerance_allows_small_float_changes():
    vn = VerifyNumerics()
    bevir.optimize(float_graph(), "test-vn-scale{factor=1.0001}", instruments=[vn])
    (check,) = vn.checks
    assert 0 < check.diffs["y"] <= check.bounds["y"]
    before = bevir.run(float_graph(), vn.probe)["y"]
    assert check.bounds["y"] == pytest.approx(1e-3 * np.abs(before).max())


def test_change_above_tolerance_fails():
    with pytest.raises(PassError, match=r"output 'y' max abs diff .* \(allowed "):
        bevir.optimize(float_graph(), "test-vn-scale{factor=1.01}", verify_numerics=True)


def test_atol_widens_float_bound():
    bevir.optimize(float_graph(), "test-vn-scale{factor=1.01}",
                   instruments=[VerifyNumerics(atol=10.0)])


def test_atol_never_loosens_a_pass_that_declares_tolerance_0():
    vn = VerifyNumerics(atol=1e-3)
    with pytest.raises(PassError, match=r"output 'y' max abs diff \S+ \(must be bit-identical\)"):
        bevir.optimize(float_graph(), "test-vn-exact-scale{factor=1.000001}", instruments=[vn])
    (check,) = vn.checks
    assert 0 < check.diffs["y"] < 1e-3 and check.bounds == {"y": 0.0, "z": 0.0}


def test_integer_outputs_must_be_bit_identical_whatever_the_tolerance():
    with pytest.raises(PassError) as info:
        bevir.optimize(int_graph(), "canonicalize,test-vn-nudge-const",
                       instruments=[VerifyNumerics(atol=100.0)])
    msg = str(info.value)
    assert re.search(r"output 'a' max abs diff [1-9]\d* \(must be bit-identical\)", msg), msg
    # a float output of a quantized graph is held to bit-identity too
    assert re.search(r"output 'f' max abs diff \S+ \(must be bit-identical\)", msg), msg


# ---- CLI -----------------------------------------------------------------------------------
def _save(tmp_path, graph) -> str:
    path = tmp_path / "model.bevir"
    bevir.save(graph, path)
    return str(path)


def test_cli_verify_numerics_clean(tmp_path, capsys):
    model = _save(tmp_path, float_graph())
    save_file({"x": np.ones((2, 3), np.float32)}, str(tmp_path / "probe.safetensors"))
    assert main(["opt", model, "-p", "canonicalize,cse,dce", "-o", str(tmp_path / "o.bevir"),
                 "--verify-numerics", "--probe-inputs", str(tmp_path / "probe.safetensors")]) == 0
    err = capsys.readouterr().err
    assert "numerics: 3 pass(es) checked" in err and "y 0, z 0" in err


def test_cli_verify_numerics_mismatch_prints_one_line(tmp_path, capsys):
    model = _save(tmp_path, float_graph())
    repro = tmp_path / "repro"
    assert main(["opt", model, "-p", "test-vn-wrong-third", "--verify-numerics",
                 "--numerics-reproducer", str(repro)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bevir: error: pass 'test-vn-wrong-third'")
    assert "rewrite #3 wrong-third:relu" in lines[0] and (repro / "graph.bevir").exists()


def test_cli_numerics_atol(tmp_path, capsys):
    model = _save(tmp_path, float_graph())
    assert main(["opt", model, "-p", "test-vn-scale{factor=1.01}", "--verify-numerics"]) == 1
    capsys.readouterr()
    assert main(["opt", model, "-p", "test-vn-scale{factor=1.01}", "--numerics-atol", "10"]) == 0


# ---- each rewrite held to its own pattern's claim ------------------------------------------
class ExpLogIsIdentity(FusionPattern):
    """exp(log(v)) -> v, claiming bit-identity: wrong in the last bits on purpose."""
    name = "test-vn-exp-log"
    pattern = patterns.op("exp", patterns.op("log", "v"))

    def replacement(self, m):
        return "identity", [m["v"]], {}


class SqrtOfSquare(FusionPattern):
    """sqrt(a * a) -> abs(a), claiming a small tolerance (as a reassociating fusion does)."""
    name = "test-vn-sqrt-square"
    tolerance = 1e-3
    pattern = patterns.op("sqrt", patterns.op("mul", "a", "b"))

    def replacement(self, m):
        return "abs", [m["a"]], {}


class Mixed(PatternPass):
    """A pass of one pattern claiming exactness and one claiming a tolerance."""
    name = "test-vn-mixed"
    patterns = (ExpLogIsIdentity, SqrtOfSquare)
    tolerance = 1e-3


def mixed_graph(exp_log: bool = True, sqrt: bool = True) -> bevir.Graph:
    b = Builder("mixed")
    x = b.input("x", TensorType((256,)))
    v = b.add(b.mul(x, x), b.const(np.float32(1.0)))
    if exp_log:
        b.output("y", b.exp(b.log(v), loc="m/exp"))
    if sqrt:
        b.output("z", b.sqrt(b.mul(x, x)))
    return b.graph


def test_an_exact_rewrite_beside_a_loose_one_is_held_to_bit_identity():
    """The pass as a whole may change floats by 1e-3, but the exp-log rewrite claims
    exactness: checked alone, its last-bit error fails and is bisected to it."""
    vn = VerifyNumerics()
    with pytest.raises(PassError, match=r"output 'y' max abs diff \S+ \(must be bit-identical\)"
                       ) as info:
        bevir.optimize(mixed_graph(), "test-vn-mixed", instruments=[vn])
    whole, part = vn.checks
    assert whole.ok and 0 < whole.diffs["y"] <= whole.bounds["y"]      # hidden before
    assert part.pass_text == "test-vn-mixed{disable=test-vn-sqrt-square}"
    assert part.bounds["y"] == 0.0 and part.diffs["y"] > 0
    assert info.value.rewrite.what == "test-vn-exp-log" and info.value.loc == "m/exp"


def test_a_pass_claims_only_what_its_fired_patterns_claim():
    vn = VerifyNumerics()                        # only the exact pattern fires: bit-identity
    with pytest.raises(PassError, match="must be bit-identical"):
        bevir.optimize(mixed_graph(sqrt=False), "test-vn-mixed", instruments=[vn])
    assert vn.checks[0].bounds == {"y": 0.0}
    vn = VerifyNumerics()                        # only the loose one: its tolerance
    bevir.optimize(mixed_graph(exp_log=False), "test-vn-mixed", instruments=[vn])
    (check,) = vn.checks
    assert check.ok and check.bounds["z"] > 0


def test_no_exact_part_is_checked_where_no_exact_rewrite_fired():
    vn = VerifyNumerics()
    bevir.optimize(mixed_graph(), "test-vn-mixed{disable=test-vn-exp-log}", instruments=[vn])
    assert [c.pass_text for c in vn.checks] == ["test-vn-mixed{disable=test-vn-exp-log}"]
