"""The pass manager, pipelines, instruments, analyses and the canonicalize/cse/dce passes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import bevir
from bevir.passes.patterns import explain
from bevir import Builder, DType, Layout, PassError, TensorType, VerifyError
from bevir.ir.graph import Graph
from bevir.ops import OpDef
from tests.shared import CorruptType
from bevir.passes import (AnalysisManager, Canonicalize, CostSummary, DumpIR, Liveness, Pass,
                          PassManager, Reproducer, Statistics, Timing, VerifyEach, all_passes,
                          get_pass, make_pass, parse_pipeline, pipeline_text, replay)

F32 = DType.f32


# ---- test-only ops and passes (unique names) -------------------------------------------------
class _Sink(OpDef):
    """An op with effects: never folded, merged or removed."""
    name = "test_passes.sink"
    operands = ("x",)
    pure = False

    def infer(self, c, x):
        return x

    def compute(self, c, x):
        return x


class OptsPass(Pass):
    name = "test-opts"
    description = "options of every type"
    n: int = 3
    ratio: float = 0.5
    flag: bool = False
    mode: str = "fast"

    def run(self, graph, am):
        pass


class Explode(Pass):
    """Raises when the graph holds a node of ``op``."""
    name = "test-explode"
    op: str = "relu"

    def run(self, graph, am):
        if any(n.op == self.op for n in graph.nodes):
            raise RuntimeError(f"boom at {self.op}")


class CountingAnalysis:
    instances = 0

    def __init__(self, graph):
        type(self).instances += 1
        self.nodes = len(graph.nodes)


class UseAnalysis(Pass):
    name = "test-use-analysis"

    def run(self, graph, am):
        assert am.get(CountingAnalysis) is am.get(CountingAnalysis)


class Touch(Pass):
    """Changes the graph (renames a value) without invalidating CountingAnalysis."""
    name = "test-touch-preserving"
    preserves = (CountingAnalysis,)

    def run(self, graph, am):
        v = graph.nodes[0].outputs[0]
        graph.rename(v, graph.unique_name(v.name + "_t"))


class TouchAll(Pass):
    name = "test-touch"

    def run(self, graph, am):
        v = graph.nodes[0].outputs[0]
        graph.rename(v, graph.unique_name(v.name + "_t"))


class Noop(Pass):
    name = "test-noop"

    def run(self, graph, am):
        self.stat("visited", len(graph.nodes))


# ---- helpers ---------------------------------------------------------------------------------
def rng_array(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def mlp_graph() -> Graph:
    """x @ relu(w0 * 2) + b: a foldable weight expression, then live compute."""
    b = Builder("mlp")
    x = b.input("x", TensorType((4, 8)))
    w0 = b.const(rng_array((8, 6), 1), "w0")
    two = b.const(np.array(2.0, np.float32), "two")
    bias = b.const(rng_array((6,), 2), "bias")
    w = b.relu(b.mul(w0, two, loc="scale_w"), loc="relu_w", name="w")
    y = b.add(b.matmul(x, w, loc="fc"), bias, loc="fc.bias")
    b.output("y", b.relu(y, loc="act"))
    return b.graph


def run_both(before: Graph, after: Graph, inputs) -> None:
    """The outputs of the two graphs are bit-identical."""
    a, b = bevir.run(before, inputs), bevir.run(after, inputs)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def optimized(graph: Graph, pipeline: str, **kw) -> Graph:
    g = graph.clone()
    PassManager(pipeline, **kw).run(g)
    bevir.verify(g)
    return g


# ---- pipelines ---------------------------------------------------------------------------------
def test_builtin_passes_registered():
    passes = all_passes()
    for name in ("canonicalize", "cse", "dce"):
        assert name in passes and get_pass(name) is passes[name]
        assert passes[name].description


def test_pipeline_parse_and_print_round_trip():
    ps = parse_pipeline("canonicalize,cse,dce")
    assert [p.name for p in ps] == ["canonicalize", "cse", "dce"]
    assert pipeline_text(ps) == "canonicalize,cse,dce"
    ps = parse_pipeline("  canonicalize { fold_limit = 16 , max-rewrites=2 } ,\n cse , dce ")
    assert ps[0] == Canonicalize(fold_limit=16, max_rewrites=2)
    assert str(ps[0]) == "canonicalize{max_rewrites=2,fold_limit=16}"
    assert parse_pipeline(pipeline_text(ps)) == ps
    assert parse_pipeline("") == [] and pipeline_text([]) == ""


def test_options_are_typed():
    p, = parse_pipeline('test-opts{n=0x10 ratio=2 flag=true mode="a, b"}')
    assert (p.n, p.ratio, p.flag, p.mode) == (16, 2.0, True, "a, b")
    assert type(p.ratio) is float
    assert str(p) == 'test-opts{n=16,ratio=2.0,flag=true,mode="a, b"}'
    assert parse_pipeline(str(p)) == [p]
    assert str(OptsPass()) == "test-opts"                 # defaults are not printed
    assert str(OptsPass(flag=False, mode="slow")) == "test-opts{mode=slow}"
    assert make_pass("test-opts", n=5).n == 5


@pytest.mark.parametrize("text, words", [
    ("nope", ["unknown pass 'nope'", "canonicalize", "cse", "dce"]),
    ("canonicalize{bogus=1}", ["canonicalize", "bogus", "fold_limit"]),
    ("canonicalize{fold_limit=big}", ["canonicalize", "fold_limit", "int", "big"]),
    ("test-opts{flag=maybe}", ["test-opts", "flag", "bool"]),
    ("test-opts{ratio=fast}", ["test-opts", "ratio", "float"]),
    ("test-opts{n=1,n=2}", ["test-opts", "'n' given twice"]),
    ("cse,", ["expected a pass name"]),
    ("cse dce", ["expected ','"]),
    ("test-opts{n=1", ["expected '}'"]),
    ("test-opts{n}", ["expected '='"]),
])
def test_pipeline_errors(text, words):
    with pytest.raises(PassError) as e:
        parse_pipeline(text)
    for w in words:
        assert w in str(e.value)


def test_option_types_checked_in_python():
    with pytest.raises(PassError, match="test-opts.*'n' must be int"):
        OptsPass(n="3")
    with pytest.raises(PassError, match="'flag' must be bool"):
        OptsPass(flag=1)
    with pytest.raises(PassError, match="test-opts.*unexpected keyword"):
        make_pass("test-opts", bogus=1)
    with pytest.raises(TypeError, match="options are int, float, bool, str or HWConfig"):
        class Bad(Pass):
            name = "test-bad-option-type"
            items: list = None


def test_duplicate_pass_name_is_an_error():
    with pytest.raises(PassError, match="'cse' is defined twice"):
        class AnotherCSE(Pass):
            name = "cse"


def test_a_pass_class_is_a_dataclass():
    assert dataclasses.is_dataclass(OptsPass)
    assert [f.name for f in dataclasses.fields(OptsPass)] == ["n", "ratio", "flag", "mode"]
    assert OptsPass.options()["n"] == (int, 3)


# ---- the manager and instruments ------------------------------------------------------------------
def test_exception_in_a_pass_becomes_pass_error_and_stops_the_pipeline():
    g = mlp_graph()
    stats = Statistics()
    with pytest.raises(PassError) as e:
        PassManager("test-explode,test-noop", instruments=[stats]).run(g)
    assert str(e.value).startswith("pass 'test-explode' failed: RuntimeError: boom at relu")
    assert isinstance(e.value.__cause__, RuntimeError)
    assert e.value.pass_name == "test-explode"
    assert not stats.stats                          # test-noop never ran


def test_verify_each_names_the_pass_that_broke_the_ir():
    g = mlp_graph()
    with pytest.raises(PassError) as e:
        PassManager("test-noop,test-corrupt-type,test-noop").run(g)
    msg = str(e.value)
    assert msg.startswith("pass 'test-corrupt-type' produced invalid IR: ")
    assert "differ from inferred" in msg
    assert isinstance(e.value.__cause__, VerifyError)
    # without verification the broken graph goes through
    PassManager("test-corrupt-type", verify_each=False).run(mlp_graph())


def test_verify_each_checks_the_input():
    g = mlp_graph()
    CorruptType().run(g, AnalysisManager(g))
    with pytest.raises(VerifyError, match="input graph is invalid"):
        PassManager("cse", instruments=[VerifyEach()]).run(g)


def test_timing_report_lists_each_pass():
    timing = Timing()
    PassManager("canonicalize,cse,dce", instruments=[timing]).run(mlp_graph())
    report = timing.report()
    for name in ("canonicalize", "cse", "dce", "Total", "Execution time report", "%"):
        assert name in report
    assert [text for _, text in timing.rows] == ["canonicalize", "cse", "dce"]
    assert timing.total >= sum(timing.rows.values()) > 0


def test_dump_ir_writes_one_file_per_pass(tmp_path):
    dump = DumpIR(tmp_path / "all")
    PassManager("canonicalize,cse,cse,dce", instruments=[dump]).run(mlp_graph())
    names = sorted(p.name for p in (tmp_path / "all").iterdir())
    assert names == ["00_input.bevir", "01_canonicalize.bevir", "02_cse.bevir",
                     "03_cse.bevir", "04_dce.bevir"]
    first = (tmp_path / "all" / "00_input.bevir").read_text()
    assert "dense<...>" in first and "graph @mlp" in first   # large constants elided
    assert "(unchanged)" in (tmp_path / "all" / "03_cse.bevir").read_text()

    changed = DumpIR(tmp_path / "changed", only_changed=True)
    PassManager("canonicalize,cse,cse,dce", instruments=[changed]).run(mlp_graph())
    names = sorted(p.name for p in (tmp_path / "changed").iterdir())
    assert names == ["00_input.bevir", "01_canonicalize.bevir"]   # cse/dce found nothing


def test_statistics_report():
    stats = Statistics()
    g = mlp_graph()
    PassManager("canonicalize,test-noop,dce", instruments=[stats]).run(g)
    by = stats.by_pass()
    assert by["canonicalize"]["fold-constants"] == 2  # mul, then relu
    assert by["test-noop"] == {"visited": len(g.nodes)}
    assert by["dce"] == {}
    report = stats.report()
    assert "canonicalize" in report and "fold-constants" in report and "visited" in report


def test_reproducer_replays_the_failure(tmp_path):
    path = tmp_path / "repro.bevir"
    g = mlp_graph()
    with pytest.raises(PassError) as e:
        PassManager("canonicalize,test-explode{op=matmul},dce",
                    instruments=[Reproducer(path)]).run(g)
    text = path.read_text()
    first = text.splitlines()[0]
    assert first == '// bevir-reproducer: pipeline="test-explode{op=matmul}"'
    assert "dense<...>" not in text and "dense<\"0x" in text     # constants inline
    assert " mul(" not in text and "%w = const" in text          # the IR after canonicalize
    graph, passes = replay(path)
    assert pipeline_text(passes) == "test-explode{op=matmul}"
    with pytest.raises(PassError) as again:
        PassManager(passes).run(graph)
    assert str(again.value) == str(e.value)


def test_reproducer_of_a_verification_failure(tmp_path):
    path = tmp_path / "r.bevir"
    with pytest.raises(PassError, match="produced invalid IR"):
        PassManager("cse,test-corrupt-type", instruments=[Reproducer(path)]).run(mlp_graph())
    graph, passes = replay(path)
    bevir.verify(graph)                    # the IR before the pass was valid
    with pytest.raises(PassError, match="test-corrupt-type' produced invalid IR"):
        PassManager(passes).run(graph)


def test_no_snapshots_without_a_reproducer(monkeypatch):
    clones = []
    original = Graph.clone
    monkeypatch.setattr(Graph, "clone", lambda self: clones.append(1) or original(self))
    PassManager("canonicalize,cse,dce", instruments=[Timing()]).run(mlp_graph())
    assert clones == []
    PassManager("canonicalize,cse,dce", instruments=[Reproducer("unused")]).run(mlp_graph())
    assert len(clones) == 3


def test_replay_rejects_other_files(tmp_path):
    p = tmp_path / "plain.bevir"
    p.write_text(str(mlp_graph()))
    with pytest.raises(PassError, match="not a bevir reproducer"):
        replay(p)


# ---- analyses -----------------------------------------------------------------------------------
def test_analysis_cache_and_invalidation():
    g = mlp_graph()
    am = AnalysisManager(g)
    CountingAnalysis.instances = 0
    a = am.get(CountingAnalysis)
    assert am.get(CountingAnalysis) is a and am.cached(CountingAnalysis) is a
    assert CountingAnalysis.instances == 1 and am.computed == 1

    PassManager("test-use-analysis,test-noop,test-use-analysis").run(g, am)
    assert CountingAnalysis.instances == 1            # unchanged graph: kept
    PassManager("test-touch-preserving,test-use-analysis").run(g, am)
    assert CountingAnalysis.instances == 1            # changed, but preserved
    PassManager("test-touch,test-use-analysis").run(g, am)
    assert CountingAnalysis.instances == 2            # changed and not preserved: recomputed
    am.invalidate()
    assert am.cached(CountingAnalysis) is None


def test_liveness_and_cost_summary():
    b = Builder("g")
    x = b.input("x", TensorType((2, 3)))
    unused = b.const(np.ones((2, 3), np.float32), "unused")
    dead = b.relu(b.neg(x, name="dead0"), name="dead1")
    sink = b.op("test_passes.sink", b.exp(x, name="fx"), name="sunk")
    y = b.add(x, x, name="y")
    b.output("y", y)
    live = Liveness(b.graph)
    assert [n.output.name for n in live.dead_nodes] == ["dead0", "dead1"]
    assert live.dead_constants == [unused]
    assert live.is_live(sink.producer) and live.is_live(y) and not live.is_live(dead)
    cost = CostSummary(b.graph)
    assert cost.nodes == 5 and cost.params == 6 and cost.op_counts["neg"] == 1
    assert cost.bytes_written == 5 * 24 and cost.macs == 0


# ---- canonicalize -------------------------------------------------------------------------------
def test_constant_folding_computes_the_same():
    g = mlp_graph()
    opt = optimized(g, "canonicalize")
    assert opt.op_counts() == {"relu": 1, "add": 1, "matmul": 1}
    w = opt.value("w")                              # the folded weight keeps its name
    assert w.is_const and np.array_equal(w.const, np.maximum(g.value("w0").const * 2, 0))
    assert set(opt.constants) == {"w", "bias"}      # w0 and two became dead and went
    run_both(g, opt, {"x": rng_array((4, 8), 3)})


def test_folding_keeps_layout_and_quantization():
    b = Builder("q")
    q = bevir.AffineQuant((0.5,), (3,))
    t = TensorType((1, 2, 2, 2), DType.i8, Layout.nchw, q)
    c = b.const(np.arange(8, dtype=np.int8).reshape(t.shape), "c", t)
    x = b.input("x", t)
    y = b.add(x, b.identity(b.identity(c)))
    b.output("y", y)
    opt = optimized(b.graph, "canonicalize")
    folded = opt.nodes[0].inputs[1]
    assert opt.op_counts() == {"add": 1} and folded.is_const and folded.type == t


def test_fold_limit():
    b = Builder("big")
    x = b.input("x", TensorType((1000,)))
    c = b.const(rng_array((1000,)), "c")
    b.output("y", b.add(x, b.exp(c)))
    assert optimized(b.graph, "canonicalize{fold_limit=999}").op_counts() == {"add": 1, "exp": 1}
    assert optimized(b.graph, "canonicalize{fold_limit=1000}").op_counts() == {"add": 1}


def test_constant_op_folds_into_a_graph_constant():
    b = Builder("k")
    x = b.input("x", TensorType((3,)))
    k = b.constant(value=np.array([1, 2, 3], np.float32), name="k")
    b.output("y", b.mul(x, k))
    opt = optimized(b.graph, "canonicalize")
    assert opt.op_counts() == {"mul": 1} and opt.value("k").is_const


def test_no_op_removal():
    b = Builder("noops")
    x = b.input("x", TensorType((2, 3, 4, 5), F32, Layout.nchw))
    y = b.identity(x)
    y = b.reshape(y, shape=(2, 3, 4, 5))
    y = b.reshape(y, shape=(2, 3, 4, 5))               # plain -> plain: a no-op
    y = b.cast(y, to="f32")
    y = b.transpose(y, perm=(0, 1, 2, 3))
    y = b.slice(y, starts=(0,), ends=(100,), axes=(1,), steps=(1,))
    y = b.pad(y, pads=(0,) * 8)
    y = b.expand(y, shape=(1, 1, 1, 5))
    y = b.relu(y, loc="act")
    b.output("y", y)
    stats = Statistics()
    opt = optimized(b.graph, "canonicalize", instruments=[stats])
    # the first reshape makes an nchw tensor plain: it is a real type change and stays
    assert opt.op_counts() == {"relu": 1, "reshape": 1}
    assert stats.by_pass()["canonicalize"] == {"remove-identity": 4, "remove-identity-transpose": 1,
                                               "remove-full-slice": 1, "remove-zero-pad": 1}
    run_both(b.graph, opt, {"x": rng_array((2, 3, 4, 5))})


def test_real_data_movement_stays():
    b = Builder("keep")
    x = b.input("x", TensorType((2, 3)))
    y = b.slice(x, starts=(2,), ends=(-100,), axes=(1,), steps=(-1,))   # reversal: same type
    y = b.pad(y, pads=(0, 1, 0, 0))
    y = b.cast(y, to="f64")
    b.output("y", y)
    opt = optimized(b.graph, "canonicalize")
    assert opt.op_counts() == {"cast": 1, "pad": 1, "slice": 1}


def test_shape_ops_become_reshapes_and_chains_fold():
    b = Builder("shapes")
    x = b.input("x", TensorType((2, 1, 6)))
    y = b.squeeze(x, axes=(1,), loc="sq")                    # 2x6
    y = b.unsqueeze(y, axes=(0,), loc="unsq")                # 1x2x6
    y = b.flatten(y, axis=2, loc="flat", name="flat")        # 2x6
    y = b.reshape(y, shape=(3, 4), loc="r", name="r")
    b.output("y", b.neg(y))
    stats = Statistics()
    opt = optimized(b.graph, "canonicalize", instruments=[stats])
    assert opt.op_counts() == {"neg": 1, "reshape": 1}
    r = opt.nodes[0]
    assert r.op == "reshape" and r.inputs[0] is opt.inputs[0] and r.attrs["shape"] == (3, 4)
    assert r.loc == "r" and r.output.name == "r"             # provenance and name kept
    assert stats.by_pass()["canonicalize"]["shape-op-to-reshape"] == 3
    run_both(b.graph, opt, {"x": rng_array((2, 1, 6))})


def test_reshape_round_trip_disappears():
    b = Builder("rr")
    x = b.input("x", TensorType((2, 6)))
    y = b.unsqueeze(b.squeeze(b.unsqueeze(x, axes=(1,)), axes=(1,)), axes=(0,))
    y = b.reshape(y, shape=(2, 6))
    b.output("y", b.relu(y))
    opt = optimized(b.graph, "canonicalize")
    assert opt.op_counts() == {"relu": 1} and opt.nodes[0].inputs[0] is opt.inputs[0]


def test_transpose_chains():
    b = Builder("tt")
    x = b.input("x", TensorType((2, 3, 4, 5)))
    y = b.transpose(x, perm=(0, 2, 3, 1))                    # 2x4x5x3
    y = b.transpose(y, perm=(0, 3, 1, 2), loc="back")        # inverse: 2x3x4x5
    z = b.transpose(x, perm=(1, 0, 2, 3))
    z = b.transpose(z, perm=(0, 1, 3, 2), loc="second", name="z")
    b.output("y", b.add(y, y))
    b.output("z", z)
    opt = optimized(b.graph, "canonicalize")
    assert opt.op_counts() == {"add": 1, "transpose": 1}
    t = next(n for n in opt.nodes if n.op == "transpose")
    assert t.attrs["perm"] == (1, 0, 3, 2) and t.inputs[0] is opt.inputs[0]
    assert t.loc == "second" and opt.outputs["z"] is t.output and t.output.name == "z"
    run_both(b.graph, opt, {"x": rng_array((2, 3, 4, 5))})


def test_canonicalize_rules_are_patterns_that_explain_and_switch_off():
    b = Builder("why")
    x = b.input("x", TensorType((2, 6)))
    y = b.reshape(b.relu(x), shape=(3, 4), name="y")
    b.output("y", b.exp(b.add(b.const(np.ones(3, np.float32)), b.const(np.ones(3, np.float32)))))
    b.output("z", y)
    assert explain(b.graph, "fold-reshape-chain", "y") == (
        "fold-reshape-chain on reshape %y: matched, but declined: "
        "the operand is not made by a pure reshape")
    assert "operand %x is not a constant" in explain(b.graph, "fold-constants", b.graph.nodes[0])
    kept = optimized(b.graph, "canonicalize{disable=fold-constants}")
    assert kept.op_counts() == {"add": 1, "exp": 1, "relu": 1, "reshape": 1}
    stats = Statistics()
    opt = optimized(b.graph, "canonicalize", instruments=[stats])
    assert opt.op_counts() == {"relu": 1, "reshape": 1}
    assert stats.by_pass()["canonicalize"] == {"fold-constants": 2}      # add, then exp


def test_canonicalize_reaches_a_fixpoint_and_is_idempotent():
    g = optimized(mlp_graph(), "canonicalize")
    before = g.version
    PassManager("canonicalize").run(g)
    assert g.version == before


# ---- cse and dce ---------------------------------------------------------------------------------
def test_cse_merges_identical_nodes_and_constants():
    b = Builder("cse")
    x = b.input("x", TensorType((2, 3)))
    c1 = b.const(np.arange(6, dtype=np.float32).reshape(2, 3), "c1")
    c2 = b.const(np.arange(6, dtype=np.float32).reshape(2, 3), "c2")
    c3 = b.const(np.arange(6, dtype=np.int32).reshape(2, 3).astype(np.float32) * -1, "c3")
    a1 = b.add(x, c1)
    a2 = b.add(x, c2)                      # same after the constants merge
    k1 = b.constant(value=np.ones(3, np.float32))
    k2 = b.constant(value=np.ones(3, np.float32))
    k3 = b.constant(value=np.zeros(3, np.float32))
    g1 = b.gelu(x)
    g2 = b.gelu(x, approximate="tanh")     # different attrs: kept
    s1 = b.op("test_passes.sink", x)
    s2 = b.op("test_passes.sink", x)       # effects: kept
    out = b.mul(a1, a2)
    for v in (k1, k2, k3, g1, g2, s1, s2, c3):
        out = b.add(out, v)
    b.output("y", out)
    b.output("y2", a2)
    stats = Statistics()
    opt = optimized(b.graph, "cse", instruments=[stats])
    assert stats.by_pass()["cse"]["merged"] == 3          # c2, a2, k2
    assert set(opt.constants) == {"c1", "c3"}
    counts = opt.op_counts()
    assert counts["constant"] == 2 and counts["gelu"] == 2 and counts["test_passes.sink"] == 2
    assert len(opt.nodes) == len(b.graph.nodes) - 2
    mul = next(n for n in opt.nodes if n.op == "mul")
    assert mul.inputs[0] is mul.inputs[1] and opt.outputs["y2"] is mul.inputs[0]
    run_both(b.graph, opt, {"x": rng_array((2, 3))})


def test_cse_keeps_constants_that_differ_in_bits_or_type():
    b = Builder("bits")
    x = b.input("x", TensorType((1,)))
    pz = b.const(np.array([0.0], np.float32), "pz")
    nz = b.const(np.array([-0.0], np.float32), "nz")
    nchw = TensorType((1, 1, 1, 1), F32, Layout.nchw)
    p1 = b.const(np.zeros((1, 1, 1, 1), np.float32), "p1")
    p2 = b.const(np.zeros((1, 1, 1, 1), np.float32), "p2", nchw)
    b.output("a", b.add(x, pz))
    b.output("b", b.add(x, nz))
    b.output("c", p1)
    b.output("d", p2)
    opt = optimized(b.graph, "cse")
    assert set(opt.constants) == {"pz", "nz", "p1", "p2"}


def test_dce_removes_dead_nodes_and_constants():
    b = Builder("dce")
    x = b.input("x", TensorType((2, 3)))
    unused_input = b.input("u", TensorType((1,)))
    c = b.const(np.ones((2, 3), np.float32), "c")
    b.const(np.ones((5,), np.float32), "dead_const")
    d = b.exp(b.mul(x, c))                 # dead chain: exp(mul(x, c))
    b.neg(d)
    b.op("test_passes.sink", x)            # effects: stays
    b.output("y", b.relu(x))
    b.output("c_out", c)
    stats = Statistics()
    opt = optimized(b.graph, "dce", instruments=[stats])
    assert opt.op_counts() == {"relu": 1, "test_passes.sink": 1}
    assert set(opt.constants) == {"c"}
    assert [v.name for v in opt.inputs] == ["x", unused_input.name]
    assert stats.by_pass()["dce"]["removed"] == 4
    run_both(b.graph, opt, {"x": rng_array((2, 3)), "u": np.zeros(1, np.float32)})


def test_optimize_default_pipeline():
    g = mlp_graph()
    b = Builder(g)
    b.neg(g.inputs[0])                                     # dead
    ref = g.clone()
    assert bevir.optimize(g) is g
    assert g.op_counts() == {"relu": 1, "add": 1, "matmul": 1}
    run_both(ref, g, {"x": rng_array((4, 8), 5)})
    text = bevir.print_graph(g)
    assert bevir.print_graph(bevir.parse(text)) == text


def test_a_folding_failure_names_the_node():
    b = Builder("bad")
    c = b.const(np.arange(4, dtype=np.float32), "c")
    idx = b.const(np.array([7], np.int64), "idx")
    b.output("y", b.gather(c, idx, loc="Gather_3"))
    with pytest.raises(PassError) as e:
        PassManager("canonicalize").run(b.graph)
    msg = str(e.value)
    assert msg.startswith("pass 'canonicalize' failed: ")
    assert "op 'gather'" in msg and "from 'Gather_3'" in msg and "out of range" in msg
