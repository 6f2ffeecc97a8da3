"""The cycle model against hand-computed numbers (the formulas of docs/target.md), its
invariants (never negative, monotone in work), the multi-core schedule (waits, DDR shared
in time), host stages, and its outputs."""
from __future__ import annotations

import json

import numpy as np
import pytest

import bevir
from bevir import Builder, DType, FixedPointQuant, TensorType
from bevir.cli import main
from bevir.target import HWConfig, ScheduleError, model, schedule_of

#: a small machine whose numbers are easy to follow by hand
HW = HWConfig(pe_rows=4, pe_cols=4, macs_per_pe=8, alu_ops_per_pe=1, ocm_bytes_per_cycle=64,
              broadcast_bytes_per_cycle=8, ddr_bytes_per_cycle=32, ddr_latency_cycles=100,
              dma_burst_bytes=128, dma_setup_cycles=20, launch_cycles=10)
RNG = np.random.default_rng(0)


def ceil(a, b):
    return -(-a // b)


def dma(nbytes):                       # docs/target.md: set-up + whole bursts / bandwidth
    return HW.dma_setup_cycles + ceil(ceil(nbytes, 128) * 128, 32)


EXPOSED = HW.ddr_latency_cycles + dma(128)    # the first burst is not hidden


def fixed(shape, dtype=DType.i8, frac=4):
    return TensorType(shape, dtype, quant=FixedPointQuant((frac,)))


def conv_graph(c=16, o=8, h=10, w=10, k=3, dtype=DType.i8):
    b = Builder()
    x = b.input("x", fixed((1, c, h, w), dtype))
    wt = b.const(RNG.integers(-8, 8, (o, c, k, k)).astype(np.int8), "w", fixed((o, c, k, k)))
    b.output("y", b.fx_conv2d(x, wt, out_frac_bits=4, pads=(k // 2,) * 4))
    return b.graph


def linear_graph(m=32, k=24, n=20, dtype=DType.i8):
    b = Builder()
    x = b.input("x", fixed((m, k), dtype))
    w = b.const(RNG.integers(-8, 8, (n, k)).astype(np.int8), "w", fixed((n, k)))
    b.output("y", b.fx_linear(x, w, out_frac_bits=4))
    return b.graph


def own(busy, ddr):
    return HW.launch_cycles + EXPOSED + max(busy, ddr)


def test_conv_by_hand():
    # x [1,16,10,10] i8, w [8,16,3,3] i8, pads 1 -> y [1,8,10,10] i8; PEs 4x4, 8 lanes.
    # Unplanned, the program addresses x, w and y in DDR in place.
    r = model(conv_graph(), HW).records[0]
    xb, wb, yb = 1600, 1152, 800
    alu = ceil(4 * 800, 16)                     # the requantizing epilogue, per result
    ocm = ceil(xb + wb + yb, 64)
    ddr = dma(xb) + dma(wb) + dma(yb)
    # pixels/in-channels: OH/rows x OW/cols x C/lanes tiles, O*KH*KW steps; 9 weight passes
    mac_a, bcast_a = ceil(10, 4) * ceil(10, 4) * ceil(16, 8) * 8 * 9, ceil(wb * 9, 8)
    # pixels x out-channels: (OH*OW)/rows x O/cols x C/lanes tiles, KH*KW steps; 25 passes
    mac_c, bcast_c = ceil(100, 4) * ceil(8, 4) * ceil(16, 8) * 9, ceil(wb * 25, 8)
    # pixels/pes: (OH*OW)/PEs x C/lanes tiles, O*KH*KW steps; 7 weight passes
    mac_p, bcast_p = ceil(100, 16) * ceil(16, 8) * 8 * 9, ceil(wb * 7, 8)
    assert (mac_a, bcast_a, mac_c, bcast_c, mac_p, bcast_p, ocm, ddr) == (
        1296, 1296, 900, 3600, 1008, 1008, 56, 176)
    a, c = max(mac_a + alu, ocm, bcast_a), max(mac_c + alu, ocm, bcast_c)
    p = max(mac_p + alu, ocm, bcast_p)
    assert c > a                     # fewer MACs, but broadcasting the weights 25 times loses
    assert p < a                     # 112 PE slots for the 100 pixels where rows x cols take 144
    assert r.mapping == "pixels/pes" and r.own_cycles == own(p, ddr) == 1342
    assert (r.terms["mac"], r.terms["alu"], r.terms["ocm"], r.terms["broadcast"],
            r.terms["ddr"]) == (mac_p, alu, ocm, bcast_p, ddr)
    assert r.bound == "compute" and r.macs == 800 * 16 * 9 and r.ddr_bytes == xb + wb + yb
    assert r.utilisation == pytest.approx(r.macs / (r.own_cycles * 4 * 4 * 8))


def test_images_share_the_array_rows():
    # 4 images of 2x4 pixels: batch folded into the PE rows (8 rows of pixels, 2 tiles),
    # not an outer loop (4 images x 1 tile each)
    b = Builder()
    x = b.input("x", fixed((4, 8, 2, 4)))
    w = b.const(np.ones((8, 8, 1, 1), np.int8), "w", fixed((8, 8, 1, 1)))
    b.output("y", b.fx_conv2d(x, w, out_frac_bits=4))
    r = model(b.graph, HW).records[0]
    assert r.terms["mac"] == ceil(4 * 2, 4) * ceil(4, 4) * ceil(8, 8) * 8


def test_linear_by_hand():
    # x [32,24] i8 (input) by w [20,24] (const) -> [32,20] i8
    r = model(linear_graph(), HW).records[0]
    xb, wb, yb = 768, 480, 640
    alu = ceil(4 * 640, 16)
    ocm = ceil(xb + wb + yb, 64)
    mxn = max(ceil(32, 4) * ceil(20, 4) * ceil(24, 8) + alu, ocm, ceil(wb * 8, 8))  # 8 passes
    per_pe = max(ceil(32, 16) * ceil(24, 8) * 20 + alu, ocm, ceil(wb * 2, 8))       # 2 passes
    assert (mxn, per_pe) == (480, 280)          # the same MACs, fewer weight broadcasts
    assert r.mapping == "M/pes" and r.own_cycles == own(per_pe, dma(xb) + dma(wb) + dma(yb))


@pytest.mark.parametrize("make", [linear_graph, conv_graph])
def test_16bit_activations_take_two_passes_of_the_int8_lanes(make):
    narrow = model(make(dtype=DType.i8), HW).records[0]
    wide = model(make(dtype=DType.i16), HW).records[0]
    assert wide.terms["mac"] == 2 * narrow.terms["mac"] and wide.macs == narrow.macs


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
    bevir.quantize(g)
    return g


def test_alu_ops_come_from_the_op_and_reshapes_are_views_in_ddr_copies_on_chip():
    p = model(int8_graph(), HW)
    soft = next(r for r in p.records if r.op == "fx_softmax")
    per_element = bevir.ops.get_op("fx_softmax").cycle_cost.ops_per_element
    assert soft.terms["alu"] == ceil(per_element * 8 * 256, 16) and soft.terms["mac"] == 0
    # unplanned, every value lies in DDR: the reshape is a view of its operand's bytes
    reshape = next(r for r in p.records if r.op == "reshape")
    assert reshape.bound == "view" and reshape.own_cycles == 0 and reshape.ddr_bytes == 0
    # planned on chip, the program copies it (a kernel): its bytes through the array
    planned = bevir.optimize(int8_graph(), "plan-memory")
    reshape = next(r for r in model(planned, HW).records if r.op == "reshape")
    moved = reshape.bytes["read"] + reshape.bytes["written"]
    assert moved >= 2 * 8 * 256 and reshape.terms["ocm"] == ceil(moved, 64) > 0


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
        for rec in model(linear_graph(m, k, n), HW).records:
            assert rec.own_cycles > 0 and min(rec.terms.values()) >= 0
            assert rec.total_cycles >= rec.own_cycles


def chain_graph():
    b = Builder()
    x = b.input("x", fixed((1, 16, 10, 10)))
    w = b.const(np.ones((16, 16, 3, 3), np.int8), "w", fixed((16, 16, 3, 3)))
    y = b.fx_conv2d(x, w, out_frac_bits=4, pads=(1,) * 4)
    b.output("y", b.fx_relu(b.fx_relu(y, out_frac_bits=4), out_frac_bits=4))
    return b.graph


def test_ops_on_another_core_wait_for_their_operands():
    hw = HW.model_copy(update={"cores": 2})
    g = chain_graph()
    assert model(g, hw).cycles_per_core[1] == 0     # no core meta: everything on core 0
    g.nodes[1].meta["core"] = 1
    p = model(g, hw)
    conv, relu1, relu2 = sorted(p.records, key=lambda r: r.index)
    first = next(schedule_of(g, 2).steps(1))
    assert first.waits == [g.nodes[0].output.name]  # the flag of the conv's result
    assert relu1.core == 1 and relu1.start == conv.end + hw.barrier_cycles
    assert relu2.start == relu1.end + hw.barrier_cycles   # back to core 0, after its flag
    assert relu2.wait_cycles == relu2.start - conv.end
    assert p.wait_cycles_per_core == [relu2.wait_cycles, relu1.start]
    assert p.cycles_per_core == [sum(r.total_cycles for r in p.records if r.core == i)
                                 for i in range(2)]
    assert p.makespan == relu2.end
    g.nodes[1].meta["core"] = 2
    with pytest.raises(ScheduleError, match="core 2"):
        model(g, hw)


def two_streams(n=8192):
    """Two independent requantizations of two inputs, on cores 0 and 1."""
    b = Builder()
    for core in range(2):
        x = b.input(f"x{core}", fixed((n,)))
        y = b.fx_relu(x, out_frac_bits=4)
        y.producer.meta["core"] = core
        b.output(f"y{core}", y)
    return b.graph


def test_transfers_that_overlap_in_time_share_the_ddr_bandwidth():
    g, n = two_streams(), 8192
    work = 2 * ceil(ceil(n, 128) * 128, 32)          # x and y of one core, whole bandwidth
    both = model(g, HW.model_copy(update={"cores": 2}))
    for rec in both.records:
        assert rec.terms["ddr"] == 2 * HW.dma_setup_cycles + work
    # both cores move their bytes at once: each gets half the bandwidth
    for rec in both.records:
        assert rec.own_cycles == (HW.launch_cycles + EXPOSED + 2 * HW.dma_setup_cycles
                                  + 2 * work)
        assert rec.terms["ddr_shared"] == work and rec.bound == "ddr"
    g.nodes[1].meta["core"] = 0                       # one after the other on core 0
    serial = model(g, HW.model_copy(update={"cores": 2}))
    busy = lambda r: max(r.terms["compute"], r.terms["ocm"], r.terms["broadcast"])  # noqa: E731
    assert [r.own_cycles for r in serial.records] == [own(busy(r), r.terms["ddr"])
                                                      for r in serial.records]


def test_a_planned_graph_moves_what_the_plan_says():
    b = Builder()
    v = b.input("x", fixed((4096,)))                       # 4 KiB per tensor
    for _ in range(3):
        v = b.fx_relu(v, out_frac_bits=4)
    b.output("y", v)
    g = b.graph
    bevir.optimize(g, "plan-memory")                        # all in OCM
    first, middle, last = model(g, HW).records
    assert (first.ddr_bytes, middle.ddr_bytes, last.ddr_bytes) == (4096, 0, 4096)  # load, store
    assert (first.terms["ddr"], middle.terms["ddr"], last.terms["ddr"]) == (dma(4096), 0,
                                                                           dma(4096))
    assert middle.own_cycles == HW.launch_cycles + max(middle.terms["compute"],
                                                       middle.terms["ocm"])   # nothing exposed


def test_host_stages_are_host_work():
    b = Builder()
    x = b.input("x", TensorType((4, 16), DType.f32))
    q = b.fx_quantize(b.relu(x), out_frac_bits=4)      # float made and quantized on the host
    b.output("y", b.fx_relu(q, out_frac_bits=4))                   # then the device
    p = model(b.graph, HW)
    assert [h.op for h in p.host_records] == ["relu", "fx_quantize"]
    assert [r.op for r in p.records] == ["fx_relu"]
    s = p.summary()
    assert s["host"] == {"nodes": 2, "stages": 1, "device_stages": 1}


def test_summary_roofline_utilisation_and_bytes():
    hw = HWConfig.parse("QC-U 8MB 16MAC x4")
    p = model(conv_graph(), hw)
    s = p.summary()
    assert s["roofline_cycles"] == p.macs / (4 * hw.pes * 16)
    assert s["utilisation"] == pytest.approx(s["roofline_cycles"] / s["makespan_cycles"])
    assert s["hw_hash"] == hw.hash and s["hw"]["cores"] == 4
    assert s["ddr_bytes"] == 1600 + 1152 + 800 == sum(s["ddr_bytes_per_core"])
    assert s["hw_string"] == "QC-U 8MB 16MAC x4"


def test_cli_plans_an_unplanned_graph_and_writes_profiles_summary_and_plots(tmp_path, capsys):
    g = int8_graph()
    assert "fx_conv2d" in g.op_counts()
    bevir.save(g, tmp_path / "q.bevir")
    out = tmp_path / "perf"
    assert main(["sim", str(tmp_path / "q.bevir"), "--hw", "QC-U 8MB 16MAC x4",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "makespan" in text and "DDR" in text
    summary = json.loads((out / "summary.json").read_text())
    profiles = [json.loads((out / f"profile_core{i}.json").read_text()) for i in range(4)]
    assert summary["cycles_per_core"] == [sum(r["data"]["TotalCycles"] for r in prof)
                                          for prof in profiles]
    assert summary["makespan_cycles"] == max(summary["cycles_per_core"])
    assert summary["ddr_bytes"] == sum(r["bytes"]["ddr"] for prof in profiles for r in prof)
    assert {"utilisation", "roofline_cycles", "hw_hash", "top_ops",
            "wait_cycles_per_core", "ddr_bytes_per_core", "host"} <= set(summary)
    conv = next(r for prof in profiles for r in prof if r["op"] == "fx_conv2d")
    assert conv["bound"] in ("compute", "alu", "ocm", "broadcast", "ddr") and conv["macs"] > 0
    assert {"loc", "utilisation", "bytes", "mapping", "transfers"} <= set(conv)
    for png in ("timeline.png", "roofline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(tmp_path, capsys):
    bevir.save(conv_graph(), tmp_path / "m.bevir")
    assert main(["sim", str(tmp_path / "m.bevir"), "--hw", "QC-U 8QB",
                 "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bevir: error:") and "8QB" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
