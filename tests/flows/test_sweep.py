"""The design-space sweep (one graph on a grid of HWConfigs: table, files, what must be
monotone) and fitting the efficiency factors to a measured profile (a profile made with a
known efficiency is recovered)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import bevir
from bevir import DType, Layout, TensorType
from bevir.cli import main
from bevir.target import MB, HWConfig
from bevir.ir.types import FixedPointQuant
from bevir.target.cycles import model
from bevir.target.fit import FitError, fit_efficiency
from bevir.flows.sweep import format_table, sweep, write
from bevir.flows.target import plan, simulate
from bevir.passes import make_pass

BASE = HWConfig.preset("qc-u")
CORES, MACS, OCM = [1, 2, 4], [8, 16], [MB // 4, 4 * MB]


def fx(shape, frac, layout=Layout.plain) -> TensorType:
    return TensorType(shape, DType.i8, layout, FixedPointQuant((frac,)))


def net() -> bevir.Graph:
    """conv -> linear -> layer norm, INT8: MAC-heavy and ALU-heavy ops, big enough that a
    256 KB OCM spills the conv."""
    rng = np.random.default_rng(0)
    ints = lambda shape: rng.integers(-128, 128, shape).astype(np.int8)   # noqa: E731
    b = bevir.Builder("net")
    x = b.input("x", fx((1, 64, 64, 32), 5, Layout.nhwc))
    y = b.fx_conv2d(x, b.const(ints((64, 32, 3, 3)), "w", fx((64, 32, 3, 3), 7)),
                    pads=(1, 1, 1, 1), out_frac_bits=3, loc="n/conv")
    y = b.reshape(y, shape=(4096, 64), loc="n/flat")
    y = b.fx_linear(y, b.const(ints((128, 64)), "wl", fx((128, 64), 8)), out_frac_bits=4,
                    loc="n/proj")
    b.output("y", b.fx_layer_norm(y, out_frac_bits=5, loc="n/norm"))
    return b.graph


@pytest.fixture(scope="module")
def points():
    return sweep(net(), BASE, cores=CORES, macs=MACS, ocm=OCM)


# ---- sweep -------------------------------------------------------------------------------
@pytest.mark.slow          # the sweep plans 12 points (~30 s of the quick loop)
def test_one_point_per_config_in_grid_order(points):
    assert len(points) == len(CORES) * len(MACS) * len(OCM)
    assert [(p.hw.cores, p.hw.macs_per_pe, p.hw.ocm_bytes) for p in points] == \
        [(c, m, o) for c in CORES for m in MACS for o in OCM]
    for p in points:      # the rest of the base is kept; the records add up per core
        assert p.hw.pe_rows == BASE.pe_rows and p.hw.ddr_bytes_per_cycle == BASE.ddr_bytes_per_cycle
        assert p.makespan == max(p.cycles_per_core) > 0 and len(p.cycles_per_core) == p.hw.cores
        assert 0 < p.utilisation <= 1
    lines = format_table(points).splitlines()
    assert len(lines) == 1 + len(points) and lines[0].split()[:2] == ["config", "makespan"]
    best = min(points, key=lambda p: p.makespan)
    assert [line for line in lines if line.startswith("*")][0].split()[1:5] == \
        best.label.split()


@pytest.mark.slow          # the sweep plans 12 points (~30 s of the quick loop)
def test_a_point_is_what_sim_reports_for_the_plan_compile_makes(points):
    """Each point plans the graph as ``bevir compile`` does and models that plan: the
    figures of :func:`bevir.flows.target.simulate`, and of the planned graph itself."""
    for p in points[::3]:
        profile = simulate(net(), p.hw)
        assert (p.makespan, p.cycles_per_core, p.ddr_bytes) == \
            (profile.makespan, profile.cycles_per_core, profile.ddr_bytes)
        assert model(plan(net(), p.hw), p.hw).makespan == p.makespan


def test_more_macs_or_ocm_never_slow_the_same_partition():
    """For one plan, each term of every op is non-increasing in MACs per PE; for one
    partition, a larger OCM spills less."""
    g = plan(net(), BASE)
    slow, fast = (model(g, BASE.model_copy(update={"macs_per_pe": m})) for m in (8, 16))
    assert fast.makespan < slow.makespan
    for a, b in zip(slow.records, fast.records):
        assert b.terms["mac"] <= a.terms["mac"] and b.own_cycles <= a.own_cycles
    conv = slow.records[0]
    assert conv.op == "fx_conv2d" and conv.bound == "compute"
    small, large = (model(bevir.optimize(net(), f"plan-memory{{ocm={o}}}"),
                          BASE.model_copy(update={"ocm_bytes": o})) for o in OCM)
    assert large.makespan < small.makespan and large.ddr_bytes < small.ddr_bytes


@pytest.mark.slow          # the sweep plans 12 points (~30 s of the quick loop)
def test_sweep_writes_json_and_plot(points, tmp_path):
    files = write(points, tmp_path)
    assert [f.name for f in files] == ["sweep.json", "sweep.png"]
    data = json.loads((tmp_path / "sweep.json").read_text())["points"]
    assert [d["makespan_cycles"] for d in data] == [p.makespan for p in points]
    assert data[0]["hw_hash"] == points[0].hw.hash and data[0]["cycles_per_core"]
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_sweep(tmp_path, capsys):
    bevir.save(net(), tmp_path / "net.bevir")
    assert main(["sweep", str(tmp_path / "net.bevir"), "--cores", "1,2", "--macs", "8,16",
                 "--ocm", "4MB", "--out", str(tmp_path / "s"), "--no-plots"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 + 4 + 1          # header, 4 configs, wrote sweep.json
    assert "sweep 4/4:" in err and (tmp_path / "s" / "sweep.json").exists()
    assert not (tmp_path / "s" / "sweep.png").exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--ocm", "4XB", "--ocm: cannot read size '4XB'"),
    ("--cores", "1,two", "--cores: cannot read 'two'"),
    ("--cores", "0", "cores: Input should be greater than or equal to 1")])
def test_cli_sweep_bad_value_is_one_line(tmp_path, capsys, flag, value, message):
    bevir.save(net(), tmp_path / "net.bevir")
    assert main(["sweep", str(tmp_path / "net.bevir"), flag, value,
                 "--out", str(tmp_path / "s")]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("bevir: error: ") and message in err and err.count("\n") == 1


# ---- fit ---------------------------------------------------------------------------------
def measured(graph, hw) -> list[dict]:
    """A 'measured' profile: what the model says on ``hw``, in the vendor's shape only
    (name, loc, data.TotalCycles: no OwnCycles, no terms)."""
    return [{"name": r.name, "loc": r.loc, "data": {"TotalCycles": r.total_cycles}}
            for r in model(graph, hw).records]


def test_fit_recovers_a_halved_efficiency():
    g = bevir.optimize(net(), [make_pass("partition", hw=BASE.with_cores(2))])
    truth = BASE.model_copy(update={"cores": 2, "efficiency": {"conv": 0.5}})
    base = BASE.model_copy(update={"cores": 2})
    fit = fit_efficiency(g, base, measured(g, truth))
    by_class = {c.op_class: c for c in fit.classes}
    assert by_class["conv"].used >= 2                   # both cores' conv pieces
    assert by_class["conv"].efficiency == pytest.approx(0.5, rel=1e-3)
    assert by_class["matmul"].efficiency == pytest.approx(1.0)    # as measured
    assert fit.error_before > 0 and fit.error_after < fit.error_before / 10
    assert fit.hw.efficiency_of("conv") == by_class["conv"].efficiency


def test_fit_leaves_memory_bound_records_out():
    """Read from DDR at half a byte a cycle, the conv is DDR-bound even at half
    efficiency: its time says nothing about compute, so the class keeps its factor."""
    g = net()
    small = BASE.model_copy(update={"ddr_bytes_per_cycle": 0.5})
    rec = model(g, small.model_copy(update={"efficiency": {"conv": 0.5}})).records[0]
    assert rec.op_class == "conv" and rec.bound == "ddr"
    fit = fit_efficiency(g, small, measured(g, small.model_copy(
        update={"efficiency": {"conv": 0.5}})))
    conv = {c.op_class: c for c in fit.classes}["conv"]
    assert (conv.used, conv.memory_bound, conv.efficiency) == (0, 1, 1.0)


def test_fit_of_an_unrelated_profile_is_an_error():
    with pytest.raises(FitError, match="no measured record matches"):
        fit_efficiency(net(), BASE, [{"name": "other", "data": {"TotalCycles": 5}}])
    with pytest.raises(FitError, match="data.TotalCycles"):
        fit_efficiency(net(), BASE, [{"name": "%0", "data": {}}])


def test_cli_sim_fit_writes_the_fitted_config(tmp_path, capsys):
    g = net()
    bevir.save(g, tmp_path / "net.bevir")
    truth = BASE.model_copy(update={"efficiency": {"norm": 0.25}})
    # measured on the plan sim makes (one core: the efficiency does not change it)
    (tmp_path / "m.json").write_text(json.dumps(measured(plan(g, truth), truth)))
    assert main(["sim", str(tmp_path / "net.bevir"), "--hw", "qc-u", "--fit",
                 str(tmp_path / "m.json"), "--out", str(tmp_path / "o"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    hw = HWConfig(**json.loads((tmp_path / "o" / "hw.json").read_text()))
    assert hw.efficiency_of("norm") == pytest.approx(0.25, rel=1e-3)
    assert "norm" in out and json.loads((tmp_path / "o" / "fit.json").read_text())[
        "error_after"] < 1e-3
    # the fitted config feeds sim again as --hw FILE.json
    assert main(["sim", str(tmp_path / "net.bevir"), "--hw", str(tmp_path / "o" / "hw.json"),
                 "--out", str(tmp_path / "o2"), "--no-plots"]) == 0
    assert json.loads((tmp_path / "o2" / "summary.json").read_text())["hw_hash"] == hw.hash


def test_fit_follows_a_mapping_that_changes_with_efficiency():
    """docs/target.md's conv (with a 16-byte broadcast bus) at half efficiency switches to
    its pixels x out-channels mapping: 900 MAC + 200 ALU cycles become 2200, above its 1800
    broadcast cycles, so 10 + 124 + 2200 = 2334. The first fit explains that with the
    pixels/pes mapping (1208 cycles of work: 1208 / 2200); there the other mapping wins,
    whose work (1100) gives 0.5, which reproduces the measurement."""
    hw = HWConfig(pe_rows=4, pe_cols=4, macs_per_pe=8, ocm_bytes_per_cycle=64,
                  broadcast_bytes_per_cycle=16, ddr_bytes_per_cycle=32,
                  ddr_latency_cycles=100, dma_burst_bytes=128, dma_setup_cycles=20,
                  launch_cycles=10)
    b = bevir.Builder()
    x = b.input("x", fx((1, 16, 10, 10), 4))
    w = b.const(np.ones((8, 16, 3, 3), np.int8), "w", fx((8, 16, 3, 3), 4))
    b.output("y", b.fx_conv2d(x, w, pads=(1,) * 4, out_frac_bits=4))
    assert model(b.graph, hw).records[0].mapping == "pixels/pes"
    m = measured(b.graph, hw.model_copy(update={"efficiency": {"conv": 0.5}}))
    assert m[0]["data"]["TotalCycles"] == 2334
    fit = fit_efficiency(b.graph, hw, m)
    assert fit.hw.efficiency_of("conv") == pytest.approx(0.5)
    assert model(b.graph, fit.hw).records[0].mapping == "pixels x out-channels"
    assert fit.error_after == 0 < fit.error_before
