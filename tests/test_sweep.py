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
from bevir.hw import MB, HWConfig
from bevir.ir.types import FixedPointQuant
from bevir.sim.cycles import model
from bevir.sim.fit import FitError, fit_efficiency
from bevir.flows.sweep import format_table, partitioned, sweep, write

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


def test_more_macs_or_ocm_never_slow_the_same_partition(points):
    """For one partition, each term of every op is non-increasing in MACs per PE and in
    OCM (fewer tiles, fewer spills), so the makespan is too."""
    at = {(p.hw.cores, p.hw.macs_per_pe, p.hw.ocm_bytes): p.makespan for p in points}
    for c in CORES:
        for o in OCM:
            assert at[c, 16, o] <= at[c, 8, o]
        for m in MACS:
            assert at[c, m, 4 * MB] <= at[c, m, MB // 4]
    # the compute-bound conv gains from twice the lanes; the small OCM spills it to DDR
    g = partitioned(net(), 1)
    conv = [model(g, BASE.model_copy(update={"macs_per_pe": m, "ocm_bytes": 4 * MB}))
            .records[0] for m in (8, 16)]
    assert conv[0].bound == "compute" and conv[1].terms["mac"] < conv[0].terms["mac"]
    assert at[1, 16, 4 * MB] < at[1, 8, 4 * MB]
    assert at[1, 16, MB // 4] > at[1, 16, 4 * MB]


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
    g = partitioned(net(), 2)
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
    """Spilled to DDR (a 64 KB OCM), the conv is DDR-bound even at half efficiency: its
    time says nothing about compute, so the class keeps its factor."""
    g = partitioned(net(), 1)
    small = BASE.model_copy(update={"ocm_bytes": 64 * 1024, "ddr_bytes_per_cycle": 0.5})
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
    (tmp_path / "m.json").write_text(json.dumps(measured(g, truth)))
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
    """docs/target.md's conv at half efficiency switches to its pixels x out-channels
    mapping and becomes OCM-bound (10 + max(ceil(950 / 0.5), 1950) + 124 = 2084 cycles),
    so any factor in [950 / 1950, 1346 / 1950] explains it: the fit ends inside that range
    with the measurement reproduced."""
    hw = HWConfig(pe_rows=4, pe_cols=4, macs_per_pe=8, ocm_bytes_per_cycle=64,
                  ddr_bytes_per_cycle=32, ddr_latency_cycles=100, dma_burst_bytes=128,
                  dma_setup_cycles=20, launch_cycles=10)
    b = bevir.Builder()
    x = b.input("x", TensorType((1, 16, 10, 10), DType.f32))
    b.output("y", b.conv2d(x, b.const(np.ones((8, 16, 3, 3), np.float32)), pads=(1,) * 4))
    m = measured(b.graph, hw.model_copy(update={"efficiency": {"conv": 0.5}}))
    assert m[0]["data"]["TotalCycles"] == 2084
    fit = fit_efficiency(b.graph, hw, m)
    assert 950 / 1950 <= fit.hw.efficiency_of("conv") <= 1346 / 1950
    assert fit.error_after == 0 < fit.error_before
