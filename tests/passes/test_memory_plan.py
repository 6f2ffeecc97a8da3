"""plan-memory: OCM offsets from liveness, DDR and dma_copy where the OCM is too small, the
verifier of a plan, determinism, and the plan as data through save/load."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import Builder, DType, TensorType
from bevir.passes import Statistics
from bevir.passes.memory_plan import memory_plan_of, verify_memory_plan

ROOT = Path(__file__).resolve().parents[2]


# ---- graphs whose optimum is known ---------------------------------------------------------
def chain(n: int = 3, size: int = 256) -> bevir.Graph:
    """x -> relu -> ... -> y: two buffers of ``4 * size`` bytes live at every step."""
    b = Builder("chain")
    v = b.input("x", TensorType((size,), DType.f32))
    for _ in range(n):
        v = b.relu(v)
    b.output("y", v)
    return b.graph


def diamond() -> bevir.Graph:
    """a feeds two branches of different sizes that meet again."""
    b = Builder("diamond")
    x = b.input("x", TensorType((1, 256), DType.f32))
    a = b.relu(x)
    wide = b.concat(a, a, axis=1)                                   # 2 KiB
    narrow = b.slice(a, starts=(0,), ends=(64,), axes=(1,), steps=(1,))   # 256 B
    back = b.slice(b.relu(wide), starts=(0,), ends=(64,), axes=(1,), steps=(1,))
    b.output("y", b.add(back, b.relu(narrow)))
    return b.graph


def residual(n: int = 64, seed: int = 0) -> bevir.Graph:
    """relu(h + W2 relu(W1 h)) with h = relu(x): the skip h lives across the block."""
    rng = np.random.default_rng(seed)
    b = Builder("residual")
    x = b.input("x", TensorType((n, n), DType.f32))
    h = b.relu(x)
    w1, w2 = (b.const(rng.normal(size=(n, n)).astype(np.float32)) for _ in range(2))
    y = b.matmul(b.relu(b.matmul(h, w1)), w2)
    b.output("y", b.relu(b.add(h, y)))
    return b.graph


def mlp(layers: int = 4, n: int = 32, seed: int = 0, mirrored: bool = False) -> bevir.Graph:
    """A chain of matmuls, each with its own weight (``mirrored``: then the same weights
    again in reverse order, so that each weight is live across the middle layers)."""
    rng = np.random.default_rng(seed)
    b = Builder("mlp")
    v = b.input("x", TensorType((n, n), DType.f32))
    weights = [b.const(rng.normal(size=(n, n)).astype(np.float32)) for _ in range(layers)]
    for w in weights + (weights[::-1] if mirrored else []):
        v = b.relu(b.matmul(v, w))
    b.output("y", v)
    return b.graph


def random_dag(rng: np.random.Generator, nodes: int = 30) -> bevir.Graph:
    """Adds and concats over earlier values of assorted sizes."""
    b = Builder("dag")
    vals = [b.input("x", TensorType((1, 64), DType.f32))]
    for _ in range(nodes):
        a, c = (vals[int(i)] for i in rng.integers(max(0, len(vals) - 6), len(vals), 2))
        if rng.random() < 0.3 and a.type.shape[1] < 1024:
            vals.append(b.concat(a, c, axis=1))
        else:
            vals.append(b.relu(a))
    b.output("y", vals[-1])
    return b.graph


def independent_bound(graph: bevir.Graph, align: int) -> int:
    """max over nodes of the bytes live there: a value from its producer (graph inputs from
    the first node) to its last reader (graph outputs to the last node), a constant from
    its first reader to its last."""
    size = lambda v: -(-v.type.nbytes // align) * align  # noqa: E731
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    last = len(graph.nodes) - 1
    spans = [(min(index[id(u)] for u, _ in c.uses), max(index[id(u)] for u, _ in c.uses),
              size(c)) for c in graph.constants.values() if c.uses]
    for v in list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]:
        start = index[id(v.producer)] if v.producer is not None else 0
        ends = [index[id(u)] for u, _ in v.uses] + [start]
        if any(o is v for o in graph.outputs.values()):
            ends.append(last)
        spans.append((start, max(ends), size(v)))
    return max(sum(s for a, e, s in spans if a <= t <= e) for t in range(last + 1))


def plan(graph: bevir.Graph, pipeline: str = "plan-memory") -> bevir.Graph:
    bevir.optimize(graph, pipeline)
    return graph


# ---- the plan reaches the bound -------------------------------------------------------------
@pytest.mark.parametrize("make", [chain, diamond, residual, mlp])
def test_the_plan_reaches_the_lower_bound_on_graphs_with_a_known_optimum(make):
    graph = make()
    bound = independent_bound(graph, 64)
    p = memory_plan_of(plan(graph))
    print(make.__name__, p.summary())
    (core,) = p.cores
    assert core["lower_bound"] == bound
    assert core["peak"] / bound <= 1.05
    assert p.ddr_values == [] and p.dma_ops == 0          # 8 MiB holds all of it
    # every value a node touches has its buffer, within the OCM
    assert {b["value"] for b in p.buffers} == {v.name for v in graph.values() if v.uses
                                               or v.producer is not None}


def test_a_chain_uses_exactly_two_buffers():
    graph = plan(chain(n=5, size=256))
    offsets = {v.meta["ocm"][0]["offset"] for n in graph.nodes for v in n.outputs}
    assert offsets | {graph.inputs[0].meta["ocm"][0]["offset"]} == {0, 1024}
    assert memory_plan_of(graph).cores[0]["peak"] == 2 * 1024


def test_the_search_never_does_worse_than_best_fit_alone(rng):
    for _ in range(5):
        graph = random_dag(rng)
        greedy, searched = graph.clone(), graph
        plan(greedy, "plan-memory{search_steps=0}")
        plan(searched, "plan-memory{search_steps=300, search_patience=300, seed=1}")
        g, s = memory_plan_of(greedy).cores[0], memory_plan_of(searched).cores[0]
        print(f"best fit {g['peak']}, searched {s['peak']}, bound {s['lower_bound']}")
        assert s["lower_bound"] == g["lower_bound"] == independent_bound(graph, 64)
        assert s["lower_bound"] <= s["peak"] <= g["peak"]
        assert s["peak"] == s["lower_bound"] or s["search_steps"] == 300   # stops at the bound


def test_alignment_rounds_sizes_and_offsets():
    graph = plan(diamond(), "plan-memory{align=512}")
    for b in memory_plan_of(graph).buffers:
        assert b["offset"] % 512 == 0 and b["size"] % 512 == 0
    assert memory_plan_of(graph).cores[0]["lower_bound"] == independent_bound(diamond(), 512)


def test_statistics_report_the_bound_and_the_peak():
    stats = Statistics()
    graph = residual()
    bevir.optimize(graph, "plan-memory{ocm=1048576}", instruments=[stats])
    s = stats.by_pass()["plan-memory{ocm=1048576}"]
    assert s["lower-bound"] == independent_bound(residual(), 64) <= s["peak"]
    assert graph.meta["memory_plan"]["cores"][0]["lower_bound"] == s["lower-bound"]


# ---- what does not fit ----------------------------------------------------------------------
def test_values_that_do_not_fit_go_to_ddr_with_dma_and_the_results_stay_bit_identical(rng):
    graph = residual()
    x = {"x": rng.normal(size=(64, 64)).astype(np.float32)}
    before = bevir.run(graph, x)["y"]
    tensor = 64 * 64 * 4
    plan(graph, f"plan-memory{{ocm={3 * tensor + 1024}}}")     # one op's operands + result fit
    p = memory_plan_of(graph)
    print(p.summary())
    dmas = [n for n in graph.nodes if n.op == "dma_copy"]
    assert {(n.attrs["src"], n.attrs["dst"]) for n in dmas} == {("ddr", "ocm"), ("ocm", "ddr")}
    assert p.dma_ops == len(dmas) and p.ddr_bytes >= tensor    # the skip (each weight is
    #                                                    on chip only while its matmul runs)
    assert p.cores[0]["peak"] <= 3 * tensor + 1024
    # an activation spilled: stored after its producer, loaded again before its reader
    stored = [n.inputs[0] for n in dmas if n.attrs["dst"] == "ddr"]
    assert stored and all(v.producer is not None and v.producer.op != "dma_copy" for v in stored)
    assert all(u.op == "dma_copy" for n in dmas if n.attrs["dst"] == "ddr" for u in n.output.users)
    assert np.array_equal(bevir.run(graph, x)["y"], before)    # dma_copy is the identity
    verify_memory_plan(graph)


def test_plans_under_a_tight_ocm_fit_it_and_run_bit_identical():
    """Random graphs at 30-70 % of their bound: each plan fits its OCM, verifies and runs
    like the graph did, or is refused naming an op; some need a value moved to DDR because
    best fit fragments (the placement search gives up early and the fit loop spills)."""
    fragmented = planned = 0
    for seed in range(40):
        bound = independent_bound(random_dag(np.random.default_rng(seed), 40), 64)
        for frac in (0.3, 0.5, 0.7):
            graph = random_dag(np.random.default_rng(seed), 40)
            x = {"x": np.random.default_rng(seed).normal(size=(1, 64)).astype(np.float32)}
            before = bevir.run(graph, x)["y"]
            ocm, stats = int(bound * frac) // 64 * 64, Statistics()
            try:
                bevir.optimize(graph, f"plan-memory{{ocm={ocm}}}", instruments=[stats])
            except bevir.PassError as e:
                assert e.op and "bytes" in str(e)
                continue
            planned += 1
            (s,) = stats.by_pass().values()
            fragmented += s.get("fragmentation-spills", 0) > 0
            assert memory_plan_of(graph).cores[0]["peak"] <= ocm
            assert np.array_equal(bevir.run(graph, x)["y"], before)
    print(f"{planned} planned, {fragmented} needed a spill for fragmentation")
    assert planned >= 100 and fragmented >= 5


def test_loads_are_double_buffered_where_the_ocm_allows():
    tensor = 32 * 32 * 4
    graph = mlp(layers=4, mirrored=True)
    plan(graph, f"plan-memory{{ocm={5 * tensor}}}")     # activations fit, the 4 weights do not
    p = memory_plan_of(graph)
    loads = [n for n in graph.nodes if n.op == "dma_copy" and n.attrs["dst"] == "ocm"]
    assert p.prefetched_loads >= 1 and len(loads) >= 2
    order = graph.nodes
    early = [n for n in loads if order[order.index(n) + 1].op not in ("dma_copy",)
             and order[order.index(n) + 1] not in n.output.users]
    assert len(early) == p.prefetched_loads                  # issued before the node ahead
    single = plan(mlp(layers=4, mirrored=True),
                  f"plan-memory{{ocm={5 * tensor}, double_buffer=false}}")
    assert memory_plan_of(single).prefetched_loads == 0
    assert memory_plan_of(single).cores[0]["peak"] <= p.cores[0]["peak"]


def test_where_early_loads_fragment_the_placement_half_the_window_is_tried(monkeypatch):
    """Where the loads issued ``prefetch_window`` nodes early fragment the placement (made
    to here for windows over 2), the plan tries half the window, then half again, before
    issuing every load one node early: the loads stay 2 nodes early."""
    from bevir.passes.memory_plan import PlanMemory
    tensor = 32 * 32 * 4
    tried: list[int] = []
    issue, place = PlanMemory._issue_step, PlanMemory._place_prefetched

    def issue_step(self, tl, name, i, window, floor):
        if not tried or tried[-1] != window:
            tried.append(window)
        return issue(self, tl, name, i, window, floor)
    monkeypatch.setattr(PlanMemory, "_issue_step", issue_step)
    monkeypatch.setattr(PlanMemory, "_place_prefetched",
                        lambda self, tl: tried[-1] <= 2 and place(self, tl))
    graph = plan(mlp(layers=4, mirrored=True), f"plan-memory{{ocm={5 * tensor}}}")
    assert tried == [8, 4, 2]
    assert memory_plan_of(graph).prefetched_loads >= 1
    with pytest.raises(bevir.BevirError, match="prefetch_window"):
        plan(mlp(layers=4, mirrored=True), "plan-memory{prefetch_window=0}")


def test_an_impossible_plan_names_the_op_and_the_bytes_it_needs():
    graph = residual()                          # matmul(h, w1): 3 tensors of 16 KiB at once
    need = 3 * 64 * 64 * 4
    with pytest.raises(bevir.PassError) as e:
        plan(graph, f"plan-memory{{ocm={need - 64} stream=false}}")
    print(e.value)
    assert "op 'matmul'" in str(e.value) and f"needs {need} bytes" in str(e.value)
    assert f"than the {need - 64} bytes" in str(e.value)



def test_an_op_larger_than_the_ocm_streams_its_operands_through_a_stage_buffer(rng):
    graph = residual()
    x = {"x": rng.normal(size=(64, 64)).astype(np.float32)}
    before = bevir.run(graph, x)["y"]
    ocm = 2 * 64 * 64 * 4              # matmul and add touch 3 tensors: 1.5x this; relu fits
    stats = Statistics()
    bevir.optimize(graph, f"plan-memory{{ocm={ocm}}}", instruments=[stats])
    streamed = [n for n in graph.nodes if "stream" in n.meta]
    assert sorted(n.op for n in streamed) == ["add", "matmul", "matmul"]
    for n in streamed:
        s = n.meta["stream"]
        assert s["stripes"] >= 2 and s["size"] <= ocm // 2 and s["offset"] + s["size"] <= ocm
        assert all(v.meta.get("mem") == "ddr" for v in list(n.inputs) + n.outputs)
    assert memory_plan_of(graph).cores[0]["peak"] <= ocm
    assert np.array_equal(bevir.run(graph, x)["y"], before)
    verify_memory_plan(graph)


# ---- the verifier ---------------------------------------------------------------------------
def _live_pair(graph):
    """Two values whose buffers are live at a common step (a matmul's operand and result)."""
    node = next(n for n in graph.nodes if n.op == "matmul")
    return node.inputs[0], node.output


def test_the_verifier_finds_overlapping_buffers():
    graph = plan(residual())
    a, b = _live_pair(graph)
    b.meta["ocm"] = [dict(b.meta["ocm"][0], offset=a.meta["ocm"][0]["offset"] + 64)]
    with pytest.raises(bevir.VerifyError, match=f"%{a.name} .* and %{b.name} .* overlap|"
                                                f"%{b.name} .* and %{a.name} .* overlap"):
        verify_memory_plan(graph)


@pytest.mark.parametrize("corrupt, message", [
    (lambda v, ocm: v.meta.update(ocm=[dict(v.meta["ocm"][0], offset=ocm - 64)]), "within"),
    (lambda v, ocm: v.meta.update(ocm=[dict(v.meta["ocm"][0], offset=32)]), "aligned"),
    (lambda v, ocm: v.meta.pop("ocm"), "neither placed"),
    (lambda v, ocm: v.meta.update(mem="ddr"), "in DDR but read by a node"),
])
def test_the_verifier_finds_buffers_outside_the_ocm_unplaced_or_unstaged(corrupt, message):
    graph = plan(residual(), "plan-memory{ocm=1048576}")
    verify_memory_plan(graph)
    corrupt(_live_pair(graph)[1], 1048576)
    with pytest.raises(bevir.VerifyError, match=message):
        verify_memory_plan(graph)


# ---- cores ----------------------------------------------------------------------------------
def test_per_core_ocms_hold_what_each_core_touches_and_a_shared_one_holds_all():
    def two_cores():
        graph = mlp(layers=4)
        for i, n in enumerate(graph.nodes):
            n.meta["core"] = i * 2 // len(graph.nodes)        # first half on 0, rest on 1
        return graph
    per_core = plan(two_cores(), "plan-memory{cores=2}")
    p = memory_plan_of(per_core)
    assert [c["core"] for c in p.cores] == [0, 1]
    handover = [v for n in per_core.nodes if n.meta["core"] == 0 for v in n.outputs
                if any(u.meta["core"] == 1 for u in v.users)]
    assert handover and all(sorted(x["core"] for x in v.meta["ocm"]) == [0, 1] for v in handover)
    shared = memory_plan_of(plan(two_cores(), "plan-memory{cores=2, shared=true}"))
    assert [c["core"] for c in shared.cores] == [0]
    assert shared.cores[0]["lower_bound"] >= max(c["lower_bound"] for c in p.cores)
    with pytest.raises(bevir.PassError, match="core 1 is not one of the 1 cores"):
        plan(two_cores(), "plan-memory{cores=1}")


# ---- the plan as data -----------------------------------------------------------------------
def test_same_graph_and_options_give_the_same_plan_byte_for_byte():
    text = [memory_plan_of(plan(residual(), "plan-memory{ocm=50000, seed=3}")).to_json()
            for _ in range(2)]
    assert text[0] == text[1]
    code = (f"from {__name__} import residual, plan;"      # this module, from the repository root
            "from bevir.passes.memory_plan import memory_plan_of;"
            "print(memory_plan_of(plan(residual(), 'plan-memory{ocm=50000, seed=3}')).to_json())")
    # another process, with another string hash salt (set iteration order would show)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert out.stdout.strip() == text[0]


def test_the_plan_survives_save_and_load(tmp_path):
    graph = plan(residual(), "plan-memory{ocm=50000}")
    loaded = bevir.load(bevir.save(graph, tmp_path / "planned.bevir"))
    assert memory_plan_of(loaded).to_json() == memory_plan_of(graph).to_json()
    assert str(loaded) == str(graph)
    verify_memory_plan(loaded)
    with pytest.raises(bevir.PassError, match="already has a memory plan"):
        plan(loaded)


def test_what_the_host_cuts_for_a_core_arrives_while_the_core_computes(rng, tmp_path):
    """A float tensor the host passes to the device to read once (a camera's rows, cut on
    the host and quantized on the device) is loaded by the core's DMA engine while the nodes
    before its reader run, not by its reader (a quantize, with little work to hide a
    load under); the host's node runs with its stage, whatever its place in graph order.
    Bit for bit the same, in the golden model and the C program, which counts what the
    model charges."""
    from bevir.flows.target import compile_program
    from bevir.passes.target import plan_for_target
    from bevir.target import HWConfig
    from bevir.target.schedule import schedule_of, stages
    from bevir.testing import assert_bit_exact
    from tests.shared import assert_counted_as_modelled, fx, ints
    b = Builder("fed")
    a = b.input("a", fx((64, 64), 5))
    cam = b.input("cam", TensorType((128, 64)))
    h = a
    for k in range(3):                                           # device work first
        w = b.const(ints(rng, (64, 64)), f"w{k}", fx((64, 64), 7))
        h = b.fx_linear(h, w, out_frac_bits=5, name=f"fc{k}")
    rows = b.slice(cam, starts=(32,), ends=(96,), axes=(0,), steps=(1,), name="rows")  # host
    q = b.fx_quantize(rows, out_frac_bits=5, name="q")
    b.output("y", b.fx_add(h, q, out_frac_bits=4))
    hw = HWConfig.parse("QC-U 8MB 16MAC x1")
    planned = plan_for_target(b.graph, hw)
    assert [dev for dev, _ in stages(planned)] == [False, True]
    assert planned.nodes[0].output.name == "rows"                # host first: its stage
    load = planned.value("q").producer.inputs[0].producer
    assert load.op == "dma_copy" and load.inputs[0].name == "rows"
    steps = {s.node.name: s for s in schedule_of(planned).steps()}
    assert steps[load.name].prefetch and load.output.name in steps["%q"].dma_waits
    order = planned.nodes
    assert order.index(load) < order.index(planned.value("fc2").producer)   # issued early
    feed = {"a": ints(rng, (64, 64)), "cam": rng.normal(size=(128, 64)).astype(np.float32)}
    assert_bit_exact(bevir.run(planned, feed), bevir.run(b.graph, feed))
    program = compile_program(b.graph, tmp_path, hw=hw)
    assert_bit_exact(program.run(feed), bevir.run(b.graph, feed))
    assert_counted_as_modelled(program, hw)


def test_loads_stay_early_where_they_fit_and_run_in_their_readers_order(bevformer_int8):
    """BEVFormer's `test` frame in 512 KB of OCM: with every load issued early the placement
    fragments; only the loads in flight where it overflows are issued at their readers, the
    others stay early. A core's DMA engine runs its loads in the order they were issued:
    each core's loads come in the order of the nodes they load for. The plan runs bit for
    bit as the graph does."""
    from bevir.passes.target import target_pipeline
    from bevir.target import HWConfig
    from bevir.testing import assert_bit_exact
    q, feed = bevformer_int8
    stats = Statistics()
    g = bevir.optimize(q.clone(), target_pipeline(HWConfig.parse("QC-U 512KB 16MAC x1")),
                       instruments=[stats])
    (moved,) = (c for text, c in stats.by_pass().items() if text.startswith("plan-memory"))
    early, order = memory_plan_of(g).prefetched_loads, {id(n): i for i, n in enumerate(g.nodes)}
    print(f"\n{early} loads issued early, {moved['prefetches-delayed']} issued later")
    assert moved["prefetches-delayed"] > 0 and early > 0
    loads = [n for n in g.nodes if n.op == "dma_copy" and n.attrs["dst"] == "ocm"]
    readers = [min(order[id(u)] for u in n.output.users) for n in loads]
    assert readers == sorted(readers)
    assert sum(order[id(n)] + 1 < r for n, r in zip(loads, readers)) >= early
    assert_bit_exact(bevir.run(g, feed), bevir.run(q, feed))


def test_a_value_moved_to_ddr_is_read_in_ocm_by_the_next_node():
    """A value read at once and again much later moves to DDR (an OCM of two tensors): it
    is stored after its producer, the next node reads it where it is (a load there would
    hide behind nothing and keep the same bytes live), the later reader reads the store."""
    b = Builder("skip")
    x = b.input("x", TensorType((1024,), DType.f32))
    a = b.relu(x)
    h = b.relu(a)
    for _ in range(4):
        h = b.relu(b.sigmoid(h))
    b.output("y", b.add(h, a))
    graph = b.graph
    feed = {"x": np.random.default_rng(0).normal(size=(1024,)).astype(np.float32)}
    before = bevir.run(graph, feed)["y"]
    plan(graph, "plan-memory{ocm=8192}")
    first = graph.nodes[0].output
    store = [n for n in graph.nodes if n.op == "dma_copy" and n.inputs[0] is first]
    assert len(store) == 1 and store[0].attrs["dst"] == "ddr"
    assert sorted(u.op for u in first.users) == ["dma_copy", "relu"]    # the store, the next node
    assert not any(n.op == "dma_copy" and n.attrs["dst"] == "ocm" and n.inputs[0] is store[0].output
                   for n in graph.nodes)
    assert np.array_equal(bevir.run(graph, feed)["y"], before)


# ---- results written over their operands ---------------------------------------------------
def residual_block(rng, tail: bool = True):
    """skip -> linear -> add(h, skip) -> linear: the add's operands both die at it."""
    from tests.shared import fx, ints
    b = Builder("block")
    x = b.input("x", fx((64, 256), 5))
    skip = b.fx_relu(x, out_frac_bits=5, name="skip")
    w = b.const(ints(rng, (256, 256)), "w", fx((256, 256), 7))
    h = b.fx_linear(skip, w, out_frac_bits=5, name="h")
    y = b.fx_add(h, skip, out_frac_bits=4, name="y")
    if tail:
        w2 = b.const(ints(rng, (256, 256)), "w2", fx((256, 256), 7))
        y = b.fx_linear(y, w2, out_frac_bits=4, name="out")
    b.output("out", y)
    return b.graph, {"x": ints(rng, (64, 256))}


def test_an_add_writes_its_result_over_an_operand_that_dies_at_it(rng, tmp_path):
    """The residual add's result takes the buffer of its first operand (both die at it, of
    one type): at the add two tensors are live, not three, and the C program, whose add
    kernel then writes where it reads, computes the golden model's integers and counts
    what the model charges."""
    from bevir.flows.target import compile_program
    from bevir.passes import make_pass
    from bevir.target import HWConfig
    from bevir.testing import assert_bit_exact
    from tests.shared import assert_counted_as_modelled
    graph, feed = residual_block(rng)
    hw = HWConfig.parse("QC-U 8MB 16MAC x1")
    g = bevir.optimize(graph.clone(), [make_pass("plan-memory", hw=hw)])
    add = g.value("y").producer
    assert add.meta["in_place"] == 0 and add.inputs[0].name == "h"
    assert g.value("y").meta["ocm"] == g.value("h").meta["ocm"]
    verify_memory_plan(g)
    at = g.nodes.index(add)
    live = {b["value"]: b for b in memory_plan_of(g).buffers if b["start"] <= at <= b["end"]}
    assert set(live) == {"skip", "h"}                        # h's buffer holds y after it
    assert live["h"]["end"] > at
    program = compile_program(graph, tmp_path, hw=hw)
    assert program.graph.value("y").producer.meta["in_place"] == 0
    assert_bit_exact(program.run(feed), bevir.run(graph, feed))
    assert_counted_as_modelled(program, hw)


def test_a_result_the_graph_returns_or_an_operand_read_later_keeps_its_own_buffer(rng):
    graph, _ = residual_block(rng, tail=False)               # y is the graph's output
    g = plan(graph)
    assert "in_place" not in g.value("y").producer.meta
    b = Builder("later")
    from tests.shared import fx
    x = b.input("x", fx((64, 256), 5))
    a = b.fx_relu(x, out_frac_bits=5, name="a")
    c = b.fx_relu(x, out_frac_bits=5, name="c")
    s = b.fx_add(a, c, out_frac_bits=4, name="s")             # a is read again below
    b.output("out", b.fx_add(s, a, out_frac_bits=3, name="t"))
    g = plan(b.graph)
    assert g.value("s").producer.meta.get("in_place") == 1     # over c, not a
    verify_memory_plan(g)
