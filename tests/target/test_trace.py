"""Traces in the Trace Event format (Perfetto, chrome://tracing): ``bevir sim --trace``
(the cycle model's run) and ``bevir exec --trace`` (a compiled program's run, measured on
the host). The files are well formed (every slice on a named lane, slices on one lane
nested or apart, never overlapping), and every node of the plan appears once per core it
runs on, with its op and source layer."""
from __future__ import annotations

import json

import pytest

import bevir
from bevir.codegen.cprogram import CompiledProgram
from bevir.flows.target import compile_program
from bevir.target import model
from bevir.target.trace import model_trace
from tests.shared import FREE_SYNC, GRAPHS, check_trace, partitioned, planned, program_nodes

@pytest.mark.parametrize("cores", [1, 2, 3])
def test_sim_and_exec_traces_show_every_step_once_per_core(rng, tmp_path, cores):
    graph, inputs = GRAPHS["chain"](rng)
    g = planned(graph, cores) if cores != 3 else partitioned(graph, cores)
    program = compile_program(g, tmp_path)
    program.run(inputs)
    wanted = program_nodes(program)
    measured = check_trace(program.trace().to_json())
    assert {pid: c for pid, c in measured.items() if pid} == wanted
    assert all(n == 1 for c in wanted.values() for n in c.values())
    profile = model(program.graph, FREE_SYNC.with_cores(cores))
    modelled = check_trace(model_trace(profile).to_json())
    assert modelled == wanted
    # a core's steps follow one another in program order, measured and modelled
    for data in (program.trace().to_json(), model_trace(profile).to_json()):
        for pid, counter in wanted.items():
            steps = [e for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] == pid
                     and e["name"] in counter]
            order = [s["node"] for p in program.manifest["programs"] if p["core"] + 1 == pid
                     for s in p["steps"]]
            assert [e["name"] for e in sorted(steps, key=lambda e: e["ts"])] == order


def test_the_model_trace_shows_dma_and_waits(rng):
    """On 2 cores with a plan the model moves bytes (DMA slices with the node's bytes)
    and a core waits for the other's values (wait slices before the step that waits)."""
    graph, _ = GRAPHS["chain"](rng)
    profile = model(planned(graph, 2), FREE_SYNC.with_cores(2))
    events = [e for e in model_trace(profile).to_json()["traceEvents"] if e["ph"] == "X"]
    dma = [e for e in events if e["name"] == "dma"]
    assert sum(e["args"]["bytes"] for e in dma) == profile.ddr_bytes > 0
    waits = [e for e in events if e["name"] == "wait"]
    assert len(waits) == sum(1 for r in profile.records if r.wait_cycles)
    end = max(e["ts"] + e["dur"] for e in events)
    assert end == pytest.approx(profile.makespan / (profile.hw.clock_ghz * 1e3))


def test_the_dma_engine_has_its_own_lane(rng):
    """A load the DMA engine runs ahead of its reader, and a store it runs while the
    core goes on, overlap the transfers the steps in between make themselves: they lie on
    the core's DMA engine lane, theirs on the DMA lane, and the trace stays well formed."""
    from bevir.passes import make_pass
    from bevir.target import HWConfig
    from tests.shared import prefetching
    graph, _ = prefetching(rng)
    hw = HWConfig.parse("QC-U 100KB 16MAC")
    profile = model(bevir.optimize(partitioned(graph, 1), [make_pass("plan-memory", hw=hw)]),
                    hw)
    events = model_trace(profile).to_json()
    check_trace(events)
    lanes = {e["args"]["node"]: e["tid"] for e in events["traceEvents"]
             if e["ph"] == "X" and e["name"] == "dma"}
    ahead = {r.name for r in profile.records if r.bound in ("prefetch", "spill")}
    assert {r.bound for r in profile.records if r.name in ahead} == {"prefetch", "spill"}
    assert {lanes[n] for n in ahead} == {2}
    assert {tid for n, tid in lanes.items() if n not in ahead} == {1}


def test_cli_writes_both_traces(rng, tmp_path, capsys):
    from safetensors.numpy import save_file
    from bevir.cli import main
    graph, inputs = GRAPHS["chain"](rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(inputs, str(tmp_path / "in.safetensors"))
    hw = tmp_path / "hw.json"
    hw.write_text(FREE_SYNC.with_cores(2).model_dump_json())
    assert main(["compile", str(tmp_path / "m.bevir"), "--hw", str(hw),
                 "-o", str(tmp_path / "prog")]) == 0
    assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                 "--trace", str(tmp_path / "exec.json")]) == 0
    assert main(["sim", str(tmp_path / "m.bevir"), "--hw", str(hw), "--out",
                 str(tmp_path / "perf"), "--no-plots", "--trace",
                 str(tmp_path / "sim.json")]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    program = CompiledProgram.load(tmp_path / "prog")
    wanted = program_nodes(program)
    for name in ("exec.json", "sim.json"):
        nodes = check_trace(json.loads((tmp_path / name).read_text()))
        assert {pid: c for pid, c in nodes.items() if pid} == wanted, name
    assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                 "--host", "--trace", str(tmp_path / "x.json")]) == 1
    assert "--trace" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_a_trace_before_a_run_is_one_line(rng, tmp_path):
    graph, _ = GRAPHS["chain"](rng)
    program = compile_program(graph, tmp_path)
    with pytest.raises(bevir.BevirError, match="has not run yet"):
        program.trace()
