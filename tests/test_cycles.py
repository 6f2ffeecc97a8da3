"""The cycle model against hand-computed numbers (the formulas of docs/target.md), its
invariants (never negative, monotone in work), the multi-core schedule, and its outputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

import bevir
from bevir import Builder, DType, TensorType
from bevir.cli import main
from bevir.hw import HWConfig
from bevir.sim.cycles import CycleModelError, model

#: a small machine whose numbers are easy to follow by hand
HW = HWConfig(pe_rows=4, pe_cols=4, macs_per_pe=8, alu_ops_per_pe=1, ocm_bytes_per_cycle=64,
              ddr_bytes_per_cycle=32, ddr_latency_cycles=100, dma_burst_bytes=128,
              dma_setup_cycles=20, launch_cycles=10)
RNG = np.random.default_rng(0)


def ceil(a, b):
    return -(-a // b)


def dma(nbytes):                       # docs/target.md: set-up + whole bursts / DDR share
    return HW.dma_setup_cycles + ceil(ceil(nbytes, 128) * 128, 32)


EXPOSED = HW.ddr_latency_cycles + dma(128)    # the first burst is not hidden


def conv_graph(c=16, o=8, h=10, w=10, k=3):
    b = Builder()
    x = b.input("x", TensorType((1, c, h, w), DType.f32))
    b.output("y", b.conv2d(x, b.const(RNG.normal(size=(o, c, k, k)).astype(np.float32)),
                           pads=(k // 2,) * 4))
    return b.graph


def matmul_graph(m=32, k=24, n=20):
    b = Builder()
    a = b.input("a", TensorType((m, k), DType.f32))
    b.output("y", b.matmul(a, b.const(RNG.normal(size=(k, n)).astype(np.float32))))
    return b.graph


def own(compute, ocm, ddr):
    return HW.launch_cycles + max(compute, ocm, ddr) + EXPOSED


def test_conv_by_hand():
    # x [1,16,10,10] f32, w [8,16,3,3], pads 1 -> y [1,8,10,10]; PEs 4x4, 8 lanes
    r = model(conv_graph(), HW).records[0]
    xb, wb, yb = 16 * 100 * 4, 8 * 16 * 9 * 4, 8 * 100 * 4
    alu = ceil(1 * 800, 16)                                   # bias epilogue, per result
    ddr = dma(xb) + dma(wb) + dma(yb)                         # input, weight, output
    # pixels/in-channels: OH/rows x OW/cols x C/lanes tiles, O*KH*KW steps; 9 weight passes
    mac_a, passes_a = ceil(10, 4) * ceil(10, 4) * ceil(16, 8) * 8 * 9, ceil(10, 4) ** 2
    ocm_a = ceil(xb + wb + yb + wb * passes_a - wb, 64)
    # pixels x out-channels: (OH*OW)/rows x O/cols x C/lanes tiles, KH*KW steps; 25 passes
    mac_c, passes_c = ceil(100, 4) * ceil(8, 4) * ceil(16, 8) * 9, ceil(100, 4)
    ocm_c = ceil(xb + wb + yb + wb * passes_c - wb, 64)
    a, cc = own(mac_a + alu, ocm_a, ddr), own(mac_c + alu, ocm_c, ddr)
    assert (mac_a, ocm_a, mac_c, ocm_c) == (1296, 798, 900, 1950)   # the doc's numbers
    assert cc > a                     # fewer MACs, but the weight re-reads lose
    assert r.mapping == "pixels/in-channels" and r.own_cycles == a == 1480
    assert r.terms["mac"] == mac_a and r.terms["alu"] == alu and r.terms["ddr"] == ddr
    assert r.bound == "compute" and r.macs == 800 * 16 * 9
    assert r.utilisation == pytest.approx(r.macs / (a * 4 * 4 * 8))


def test_matmul_by_hand():
    # a [32,24] f32 (input) @ b [24,20] (const) -> [32,20]
    r = model(matmul_graph(), HW).records[0]
    ab, bb, yb = 32 * 24 * 4, 24 * 20 * 4, 32 * 20 * 4
    alu = ceil(640, 16)
    ddr = dma(ab) + dma(bb) + dma(yb)
    mxn = own(ceil(32, 4) * ceil(20, 4) * ceil(24, 8) + alu,          # M/rows x N/cols x K/lanes
              ceil(ab + bb + yb + bb * ceil(32, 4) - bb, 64), ddr)   # 8 passes along M
    per_pe = own(ceil(32, 16) * ceil(24, 8) * 20 + alu,              # M/PEs x K/lanes, N steps
                 ceil(ab + bb + yb + bb * ceil(32, 16) - bb, 64), ddr)
    assert (mxn, per_pe) == (462, 430)
    assert r.mapping == "M/pes" and r.own_cycles == per_pe and r.bound == "ddr"


@pytest.mark.parametrize("op", ["fx_linear", "fx_conv2d"])
def test_16bit_activations_take_two_passes_of_the_int8_lanes(op):
    def fixed(shape, dtype=DType.i8):
        return TensorType(shape, dtype, quant=bevir.FixedPointQuant((4,)))

    def product(dtype):
        b = Builder()
        x_shape, w_shape = ((32, 24), (20, 24)) if op == "fx_linear" else \
            ((1, 16, 10, 10), (8, 16, 3, 3))
        x = b.input("x", fixed(x_shape, dtype))
        w = b.const(np.ones(w_shape, np.int8), "w", fixed(w_shape))
        attrs = {} if op == "fx_linear" else {"pads": (1, 1, 1, 1)}
        b.output("y", getattr(b, op)(x, w, out_frac_bits=4, **attrs))
        return model(b.graph, HW).records[0]
    narrow, wide = product(DType.i8), product(DType.i16)
    assert wide.terms["mac"] == 2 * narrow.terms["mac"] and wide.macs == narrow.macs


def test_alu_ops_come_from_the_op():
    b = Builder()
    x = b.input("x", TensorType((1, 64, 64), DType.f32))
    b.output("y", b.reshape(b.softmax(x), shape=(64, 64)))
    soft, reshape = model(b.graph, HW).records
    per_element = bevir.ops.get_op("softmax").cycle_cost.ops_per_element
    assert soft.terms["alu"] == ceil(per_element * 4096, 16) and soft.terms["mac"] == 0
    assert soft.bound == "alu"
    assert reshape.own_cycles == 0 and reshape.bound == "view"     # a view costs nothing


def test_efficiency_divides_compute():
    half = HW.model_copy(update={"efficiency": {"conv": 0.5}})
    full, slow = model(conv_graph(), HW).records[0], model(conv_graph(), half).records[0]
    assert slow.terms["compute"] == 2 * (slow.terms["mac"] + slow.terms["alu"])
    assert slow.own_cycles > full.own_cycles


@pytest.mark.parametrize("grow", [dict(h=20, w=20), dict(c=32), dict(o=16), dict(k=5)])
def test_cycles_grow_with_work(grow):
    small = model(conv_graph(), HW).records[0]
    big = model(conv_graph(**grow), HW).records[0]
    assert big.macs > small.macs and big.own_cycles > small.own_cycles


def test_cycles_never_negative():
    for seed in range(20):
        r = np.random.default_rng(seed)
        m, k, n = (int(v) for v in r.integers(1, 70, 3))
        for rec in model(matmul_graph(m, k, n), HW).records:
            assert rec.own_cycles > 0 and min(rec.terms.values()) >= 0
            assert rec.total_cycles >= rec.own_cycles


def chain_graph():
    b = Builder()
    x = b.input("x", TensorType((1, 16, 10, 10), DType.f32))
    y = b.conv2d(x, b.const(RNG.normal(size=(16, 16, 3, 3)).astype(np.float32)), pads=(1,) * 4)
    b.output("y", b.relu(b.relu(y)))
    return b.graph


def test_ops_on_another_core_wait_for_their_operands():
    hw = HW.model_copy(update={"cores": 2})
    g = chain_graph()
    base = model(g, hw)
    assert base.cycles_per_core[1] == 0            # no core meta: everything on core 0
    g.nodes[1].meta["core"] = 1
    p = model(g, hw)
    conv, relu1, relu2 = p.records
    assert relu1.core == 1 and relu1.start == conv.end + hw.barrier_cycles
    assert relu2.start == relu1.end + hw.barrier_cycles   # back to core 0, after the barrier
    assert relu2.wait_cycles == relu2.start - conv.end
    assert p.cycles_per_core == [sum(r.total_cycles for r in p.records if r.core == i)
                                 for i in range(2)]
    assert p.makespan == relu2.end
    g.nodes[1].meta["core"] = 2
    with pytest.raises(CycleModelError, match="core 2"):
        model(g, hw)



def test_the_pieces_of_a_split_op_share_the_ddr_bandwidth():
    hw = HW.model_copy(update={"cores": 4})
    g = matmul_graph()
    alone = model(g, hw).records[0]
    assert alone.terms["ddr"] == sum(map(dma, (32 * 24 * 4, 24 * 20 * 4, 32 * 20 * 4)))
    for pieces in (2, 4, 8):                           # 8 pieces: still 4 cores at most
        g.nodes[0].meta["piece"] = {"of": "y", "kind": "rows", "index": 0, "pieces": pieces}
        share = 32 / min(pieces, 4)                    # DDR bytes per cycle per core
        want = sum(HW.dma_setup_cycles + ceil(ceil(b, 128) * 128, share)
                   for b in (32 * 24 * 4, 24 * 20 * 4, 32 * 20 * 4))
        assert model(g, hw).records[0].terms["ddr"] == want > alone.terms["ddr"]


def test_a_planned_graph_moves_what_the_plan_says():
    b = Builder()
    v = b.input("x", TensorType((1024,), DType.f32))       # 4 KiB per tensor
    for _ in range(3):
        v = b.relu(v)
    b.output("y", v)
    g = b.graph
    bevir.optimize(g, "plan-memory")                        # all in OCM
    first, middle, last = model(g, HW).records
    assert (first.terms["ddr"], middle.terms["ddr"], last.terms["ddr"]) == (dma(4096), 0,
                                                                           dma(4096))
    assert middle.own_cycles == HW.launch_cycles + max(middle.terms["compute"],
                                                       middle.terms["ocm"])   # nothing exposed
    b = Builder()                          # two matmuls: their weights do not both fit
    x = b.input("x", TensorType((32, 32), DType.f32))
    w1, w2 = (b.const(RNG.normal(size=(32, 32)).astype(np.float32)) for _ in range(2))
    b.output("y", b.matmul(b.matmul(x, w1), w2))
    g, t = b.graph, 32 * 32 * 4
    bevir.optimize(g, f"plan-memory{{ocm={3 * t + 64} double_buffer=false}}")
    loads = [r for r in model(g, HW).records if r.op == "dma_copy"]
    mm1, mm2 = [r for r in model(g, HW).records if r.op == "matmul"]
    assert len(loads) == 2 and all(r.terms["ddr"] == dma(t) for r in loads)   # w1, w2
    assert (mm1.terms["ddr"], mm2.terms["ddr"]) == (dma(t), dma(t))   # reads x, writes y

def split_relu_graph(n=1024):
    """relu split by rows over 2 cores as the partition pass writes it."""
    b = Builder()
    x = b.input("x", TensorType((2, n), DType.f32))
    pieces = []
    for core in range(2):
        s = b.core_slice(x, axis=0, start=core, stop=core + 1)
        pieces.append(b.relu(s))
        s.producer.meta["core"] = pieces[-1].producer.meta["core"] = core
    done = b.barrier(*pieces)
    b.output("y", b.core_gather(*done, axis=0))
    return b.graph


def test_a_barrier_moves_nothing_and_in_ddr_slices_and_gathers_are_addressed_in_place():
    hw = HW.model_copy(update={"cores": 2})
    g = split_relu_graph()
    recs = {r.op: r for r in model(g, hw).records}
    assert recs["barrier"].own_cycles == 0                 # it only orders the cores
    assert recs["core_gather"].own_cycles > 0              # in OCM it copies the pieces
    t = 1024 * 4
    bevir.optimize(g, f"plan-memory{{cores=2 ocm={t}}}")   # the whole tensors do not fit
    streamed = {n.op for n in g.nodes if "stream" in n.meta}
    assert {"core_slice", "core_gather"} <= streamed
    p = model(g, hw)
    for r in p.records:
        if r.op in ("core_slice", "core_gather", "barrier"):
            assert r.own_cycles == 0, r
    relus = [r for r in p.records if r.op == "relu"]
    assert [r.core for r in relus] == [0, 1] and all(r.terms["ddr"] > 0 for r in relus)
    assert bevir.run(g, {"x": np.arange(2 * 1024, dtype=np.float32).reshape(2, 1024) - 1000}
                     )["y"].min() == 0


def test_summary_roofline_and_utilisation():
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    p = model(conv_graph(), hw)
    s = p.summary()
    assert s["roofline_cycles"] == p.macs / (4 * hw.pes * 16)
    assert s["utilisation"] == pytest.approx(s["roofline_cycles"] / s["makespan_cycles"])
    assert s["hw_hash"] == hw.hash and s["hw"]["cores"] == 4


def int8_graph():
    """A small conv net through calibrate and quantize: fx ops, as the e2e INT8 graph."""
    b = Builder()
    x = b.input("x", TensorType((1, 3, 16, 16), DType.f32))
    y = b.relu(b.conv2d(x, b.const(RNG.normal(size=(8, 3, 3, 3)).astype(np.float32)),
                        pads=(1,) * 4))
    y = b.conv2d(y, b.const(RNG.normal(size=(8, 8, 1, 1)).astype(np.float32)))
    b.output("y", b.softmax(b.reshape(y, shape=(1, 8, 256))))
    g = b.graph
    bevir.calibrate(g, [{"x": RNG.normal(size=(1, 3, 16, 16)).astype(np.float32)}
                        for _ in range(2)])
    bevir.quantize(g, "reference-flow")
    return g


def test_cli_writes_profiles_summary_and_plots(tmp_path, capsys):
    g = int8_graph()
    assert "fx_conv2d" in g.op_counts()
    bevir.save(g, tmp_path / "q.bevir")
    out = tmp_path / "perf"
    assert main(["sim", str(tmp_path / "q.bevir"), "--hw", "QC-U 8MB 16MAC x4",
                 "--out", str(out)]) == 0
    assert "makespan" in capsys.readouterr().out
    profiles = [json.loads((out / f"profile_core{i}.json").read_text()) for i in range(4)]
    summary = json.loads((out / "summary.json").read_text())
    assert len(profiles[0]) == len(g.nodes) and profiles[1] == []
    assert summary["makespan_cycles"] == sum(r["data"]["TotalCycles"] for r in profiles[0])
    assert summary["cycles_per_core"] == [summary["makespan_cycles"], 0, 0, 0]
    assert {"utilisation", "roofline_cycles", "hw_hash", "top_ops"} <= set(summary)
    conv = next(r for r in profiles[0] if r["op"] == "fx_conv2d")
    assert conv["bound"] in ("compute", "alu", "ocm", "ddr") and conv["macs"] > 0
    assert {"loc", "utilisation", "bytes", "mapping"} <= set(conv)
    for png in ("timeline.png", "roofline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(tmp_path, capsys):
    bevir.save(conv_graph(), tmp_path / "m.bevir")
    assert main(["sim", str(tmp_path / "m.bevir"), "--hw", "QC-U 8QB",
                 "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bevir: error:") and "8QB" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
