"""Per-core C programs: a lowered graph's schedule compiled into one C program per core
(kernels called in order, OCM offsets from the memory plan, DDR copies, ready flags),
built with the system C compiler, run with one thread per core: 0 differing elements
against the golden model, for every fx op family on 1 to 4 cores, with and without a
memory plan, and for BEVFormer's INT8 graph on the QC-U 4-core preset. The programs count
what they move: per core and node, their bytes between DDR and OCM are the cycle model's.
The same graph compiles to byte-identical sources and manifest; the CLI compiles, runs,
checks and counts."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir.codegen import Program
from bevir.codegen.cprogram import CompiledProgram
from bevir.flows.sweep import model_point
from bevir.flows.target import compile_program, hw_config, simulate
from bevir.passes import make_pass
from bevir.target import HWConfig, model, schedule_of
from bevir.target.schedule import joined_in_ddr, lowerable
from bevir.testing import assert_bit_exact
from tests.shared import (FREE_SYNC, GRAPHS, assert_counted_as_modelled, check_trace,
                          partitioned, planned, program_nodes)


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("cores,plan", [(1, False), (2, True), (3, False), (4, True)])
def test_per_core_programs_are_bit_exact_and_count_what_the_model_charges(
        rng, tmp_path, name, cores, plan):
    graph, inputs = GRAPHS[name](rng)
    g = planned(graph, cores) if plan else partitioned(graph, cores)
    program = compile_program(g, tmp_path)
    assert program.cores == cores
    assert_bit_exact(program.run(inputs), bevir.run(graph, inputs))
    m = program.manifest
    steps = [s for p in m["programs"] for s in p["steps"]]
    assert {s["node"] for s in steps} == {n.name for n in g.nodes if n.op != "barrier"} | \
        {s["node"] for s in steps if s.get("barrier")}
    if plan:        # the planned offsets are the ones the program uses
        assert m["ocm"] and all(e["offset"] == next(o["offset"] for o in
                                g.value(e["value"]).meta["ocm"] if o["core"] == e["core"])
                                for e in m["ocm"])
    if cores > 1 and any(n.op == "core_gather" and not joined_in_ddr(n) for n in g.nodes):
        assert any(s["waits"] for s in steps)          # the cores exchange values
    for n in g.nodes:           # a join only the host reads: the pieces' stores make it
        if joined_in_ddr(n) and all(not lowerable(u) for u, _ in n.output.uses):
            assert not any(s["waits"] for s in steps if s["node"] == n.name)
    counts = assert_counted_as_modelled(program, HWConfig.parse("qc-u").with_cores(cores))
    assert counts["ddr_bytes"] > 0


def test_bevformer_int8_on_4_cores_is_bit_exact_counted_and_reproducible(bevformer_int8,
                                                                          tmp_path):
    """The per-core programs and the host build of the `test` INT8 frame for QC-U x4:
    bit-exact, counting what the model charges; compile's plan is what sim and the sweep
    model (exact cycles)."""
    q, feed = bevformer_int8
    hw = hw_config("QC-U 8MB 16MAC x4")
    a = compile_program(q, tmp_path / "a", hw=hw)
    out = a.run(feed)
    assert_bit_exact(out, bevir.run(q, feed))
    counts = assert_counted_as_modelled(a, hw)
    print(f"\ntest x4: {counts['ddr_bytes']:,} bytes between DDR and OCM, "
          f"{counts['transfers']:,} transfers, {counts['waits']:,} waits")
    assert_bit_exact(a.run(feed), out)                  # a second run, same program
    assert a.counters() == counts
    trace = a.trace().to_json()                         # its measured trace: every step
    nodes = check_trace(trace)
    assert {pid: c for pid, c in nodes.items() if pid} == program_nodes(a)
    assert sum(e.get("cat") == "host" for e in trace["traceEvents"]) == 2   # before, after
    m = a.manifest
    assert m["cores"] == 4 and [s["device"] for s in m["stages"]] == [False, True, False]
    assert all(b <= 8 * 2**20 for b in m["ocm_bytes"])
    # one plan: compile's planned graph, sim and a sweep point give the same cycles
    profile = simulate(q, hw)
    point = model_point(q, hw)
    assert model(a.graph, hw).makespan == profile.makespan == point.makespan
    assert model(a.graph, hw).cycles_per_core == profile.cycles_per_core
    assert profile.ddr_bytes == point.ddr_bytes == counts["ddr_bytes"]
    compile_program(q, tmp_path / "b", hw=hw)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.suffix in (".c", ".json"))
    assert len(files) > 100
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert_bit_exact(CompiledProgram.load(tmp_path / "b").run(feed), out)
    # the host build of the same partitioned graph
    assert_bit_exact(Program(a.graph, "llvm").run(feed), out)


def test_a_value_named_like_a_load_plans_and_runs(rng, tmp_path):
    """Buffers are identified by type, not by a string split at '@': values named x@1 and
    x@2 (and none named x), one of them spilled to DDR, plan and run bit-exact."""
    from bevir import DType, TensorType
    from bevir.ir.types import FixedPointQuant
    fx = lambda shape: TensorType(shape, DType.i8, quant=FixedPointQuant((4,)))  # noqa: E731
    b = bevir.Builder("names")
    x = b.input("a", fx((4096,)))
    y = b.fx_relu(x, out_frac_bits=4, name="x@1")
    z = b.fx_relu(y, out_frac_bits=4, name="x@2")
    v = b.fx_relu(b.fx_relu(z, out_frac_bits=4), out_frac_bits=4)
    b.output("y", b.fx_add(b.fx_add(v, y, out_frac_bits=4), z, out_frac_bits=4))
    inputs = {"a": rng.integers(-128, 128, 4096).astype(np.int8)}
    g = bevir.optimize(b.graph.clone(), "plan-memory{ocm=12288}")
    assert g.meta["memory_plan"]["ddr_values"]          # something waits in DDR
    program = compile_program(g, tmp_path)
    assert_bit_exact(program.run(inputs), bevir.run(b.graph, inputs))
    assert_counted_as_modelled(program, HWConfig.parse("qc-u"))


def test_cli_compiles_runs_and_checks(rng, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    from bevir.cli import main
    graph, inputs = GRAPHS["chain"](rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(inputs, str(tmp_path / "in.safetensors"))
    hw = tmp_path / "hw.json"                 # splits pay on this machine
    hw.write_text(partitioned.__globals__["FREE_SYNC"].with_cores(2).model_dump_json())
    assert main(["compile", str(tmp_path / "m.bevir"), "--hw", str(hw),
                 "-o", str(tmp_path / "prog")]) == 0
    text = capsys.readouterr().out
    assert "compiled @chain for 2 core(s)" in text and "stages (nodes): device " in text
    for extra in ([], ["--host"]):
        out = tmp_path / f"out{len(extra)}.safetensors"
        assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                     "-o", str(out), "--check", *extra]) == 0
        assert "check: 0 differing elements" in capsys.readouterr().out
        assert_bit_exact(load_file(str(out)), bevir.run(graph, inputs))
    counters = tmp_path / "counters.json"
    assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                 "--counters", str(counters)]) == 0
    assert main(["sim", str(tmp_path / "m.bevir"), "--hw", str(hw), "--out",
                 str(tmp_path / "perf"), "--no-plots"]) == 0
    summary = json.loads((tmp_path / "perf" / "summary.json").read_text())
    counted = json.loads(counters.read_text())
    assert counted["ddr_bytes"] == summary["ddr_bytes"] > 0
    assert [c["ddr_bytes"] for c in counted["cores"]] == summary["ddr_bytes_per_core"]
    assert "bytes between DDR and OCM" in capsys.readouterr().out
    assert main(["exec", str(tmp_path / "m.bevir")]) == 1
    assert capsys.readouterr().err.startswith("bevir: error:")


def test_a_wrong_kernel_is_caught_and_named_by_exec_check(rng, tmp_path, capsys):
    """A program built from a deliberately broken lowering: exec --check reports the
    difference and names the first kernel whose results differ from its golden op, and
    writes no output file."""
    from safetensors.numpy import save_file
    from bevir.cli import main
    from bevir.ops.fixed_point import FxAdd
    graph, inputs = GRAPHS["chain"](rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(inputs, str(tmp_path / "in.safetensors"))
    original = FxAdd.tvm_lowering

    def off_by_one(self, c, L, a, b):
        y = original(self, c, L, a, b)
        return L.compute(c.out_types[0], lambda *i: L.saturate(L.i64(y[i]) + L.i64(1), "int8"))
    mp = pytest.MonkeyPatch()
    mp.setattr(FxAdd, "tvm_lowering", off_by_one)
    try:
        assert main(["compile", str(tmp_path / "m.bevir"), "-o", str(tmp_path / "prog")]) == 0
        assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                     "--check", "-o", str(tmp_path / "out.safetensors")]) == 1
    finally:
        mp.undo()
    err = capsys.readouterr().err
    assert "first differing kernel: op 'fx_add'" in err and "from 'c/residual'" in err
    assert "out.safetensors not written" in err and not (tmp_path / "out.safetensors").exists()


def test_manifest_says_what_each_core_does(rng, tmp_path):
    graph, inputs = GRAPHS["conv_nhwc"](rng)
    program = compile_program(planned(graph, 2), tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m == program.manifest and m["format"] == "bevir-program"
    assert m["counters"] == ["ddr_bytes", "transfers", "waits", "kernel_calls"]
    for p in m["programs"]:
        for s in p["steps"]:
            assert s["loc"] is not None and (s["kernel"] in m["kernels"] or s.get("barrier"))
            moved = sum(a["bytes"] for a in s["args"] if a["mem"] == "ddr")
            assert s["ddr_bytes"] >= moved and s["transfers"] >= len(s["loads"]) + len(s["stores"])
            for a in s["args"]:
                assert a["mem"] in ("ocm", "ddr") and a["offset"] >= 0
    for k in m["kernels"].values():
        assert (tmp_path / k["file"]).exists()
    assert "cnt[" in (tmp_path / "core0.c").read_text()        # the program counts


def test_device_nodes_keep_graph_order_across_stages(rng, tmp_path):
    """A device node that depends only on a constant but comes after a host stage in graph
    order runs in the later device stage: the memory plan's liveness assumes graph order,
    so running it early would let later buffers overwrite its result."""
    from bevir import DType, TensorType
    from bevir.target import stages
    from bevir.ir.types import FixedPointQuant
    fx = lambda shape, f: TensorType(shape, DType.i8, quant=FixedPointQuant((f,)))  # noqa: E731
    b = bevir.Builder("order")
    x = b.input("x", fx((64,), 4))
    h = b.mul(b.fx_dequantize(b.fx_relu(x)), b.const(np.float32(2.0), "two"))   # host
    y = b.fx_relu(b.fx_quantize(h, out_frac_bits=3))     # quantized on the host: device
    late = b.fx_relu(b.const(rng.integers(-9, 9, 64).astype(np.int8), "k", fx((64,), 3)))
    b.output("y", b.fx_add(y, late, out_frac_bits=3))
    parts = stages(b.graph)
    assert [dev for dev, _ in parts] == [True, False, True]
    late_node = late.producer
    assert any(late_node in nodes for dev, nodes in parts[2:] if dev)
    inputs = {"x": rng.integers(-128, 128, 64).astype(np.int8)}
    program = compile_program(b.graph, tmp_path, hw="QC-U 8MB 16MAC x1")
    assert_bit_exact(program.run(inputs), bevir.run(b.graph, inputs))


def test_a_quantization_of_floats_the_host_computes_runs_on_the_host(rng, tmp_path):
    """The integers cross to the device, not the floats the host makes: a quantization of
    a host op's result (cut on the host or not) runs in the host stage, on the golden
    model; one of a graph input, cut on the host or not, stays on the device, as its floats
    cross either way. The device reads the cut's floats and the host's integers, nothing
    more; the program is bit-exact; the host's float ops are what the CLI names."""
    from bevir import DType, TensorType
    from bevir.cli.models import host_note
    from bevir.target import stages
    from bevir.target.schedule import narrows_host_floats
    b = bevir.Builder("host_quantize")
    x = b.input("x", TensorType((64, 32), DType.f32))
    rows = {"axes": (0,), "steps": (1,)}
    made = b.fx_quantize(b.slice(b.relu(x), starts=(0,), ends=(32,), **rows), out_frac_bits=4)
    cut = b.fx_quantize(b.slice(x, starts=(32,), ends=(64,), **rows), out_frac_bits=4)
    b.output("y", b.fx_add(made, cut, out_frac_bits=3))
    host, device = stages(b.graph)
    assert [n.op for n in host[1]] == ["relu", "slice", "fx_quantize", "slice"] and not host[0]
    assert [n.op for n in device[1]] == ["fx_quantize", "fx_add"] and device[0]
    assert [n.op for n in b.graph.nodes if narrows_host_floats(n)] == ["fx_quantize"]
    assert host_note(b.graph) == "on the host (float): 3 node(s) (slice 2, relu 1)"
    inputs = {"x": (rng.standard_normal((64, 32)) * 4).astype(np.float32)}
    hw = hw_config("QC-U 8MB 16MAC x1")
    program = compile_program(b.graph, tmp_path, hw=hw)
    assert_bit_exact(program.run(inputs), bevir.run(b.graph, inputs))
    counts = assert_counted_as_modelled(program, hw)
    assert counts["ddr_bytes"] == inputs["x"].nbytes // 2 + 2 * made.type.nbytes   # y stored


def test_an_unchanged_graph_compiles_from_the_cache(rng, tmp_path, monkeypatch):
    """The second compile of a graph copies the first one's files (no planning, lowering
    or C build), byte for byte, and runs the same; another hw plans and builds afresh."""
    import bevir.codegen.cprogram as cp
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path / "cache"))
    graph, inputs = GRAPHS["chain"](rng)
    first = compile_program(graph, tmp_path / "a", hw="QC-U 8MB 16MAC x2")
    monkeypatch.setattr(cp, "write_program", lambda *a, **k: pytest.fail("built again"))
    second = compile_program(graph, tmp_path / "b", hw="QC-U 8MB 16MAC x2")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")
                           if p.is_file())
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert_bit_exact(second.run(inputs), first.run(inputs))
    with pytest.raises(pytest.fail.Exception, match="built again"):
        compile_program(graph, tmp_path / "c", hw="QC-U 8MB 16MAC x4")


def compile_in_a_new_process(model: Path, out: Path, cache: Path, hw: str,
                             seed: int) -> dict:
    """``compile`` of the saved ``model`` in a fresh process (hash seed ``seed``): its
    time and how often it planned, lowered and built."""
    import os
    import subprocess
    env = dict(os.environ, BEVIR_CACHE=str(cache), PYTHONHASHSEED=str(seed))
    tool = Path(__file__).resolve().parents[2] / "tools" / "compile_counted.py"
    done = subprocess.run([sys.executable, str(tool), str(model), str(out), hw],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_from_the_cache_and_builds_nothing(rng, tmp_path):
    """Kernel sources and programs are cached under keys that are the same in every
    process (whatever the hash seed): a second process compiling the same graph plans,
    lowers and builds nothing, and adds nothing to the cache."""
    graph, inputs = GRAPHS["chain"](rng)
    bevir.save(graph, tmp_path / "m.bevir")
    cache = tmp_path / "cache"
    hw = FREE_SYNC.with_cores(2).to_json()          # splits pay on it: 2 cores
    cold = compile_in_a_new_process(tmp_path / "m.bevir", tmp_path / "a", cache, hw, seed=1)
    entries = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    warm = compile_in_a_new_process(tmp_path / "m.bevir", tmp_path / "b", cache, hw, seed=2)
    print(f"compile of @chain for 2 cores: cold {cold['seconds']:.2f} s, "
          f"a second process {warm['seconds']:.2f} s")
    assert cold["built"]["_kernel_source"] > 0 and cold["built"]["build_shared"] == 2
    assert warm["built"] == {}
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == entries
    assert_bit_exact(CompiledProgram.load(tmp_path / "b").run(inputs), bevir.run(graph, inputs))


def test_a_float_graph_is_refused_naming_its_ops(tmp_path, capsys):
    """Nothing for the device (a float model): one line naming the ops, no folder."""
    from bevir.cli import main
    b = bevir.Builder("floaty")
    x = b.input("x", bevir.TensorType((4, 8)))
    b.output("y", b.relu(b.add(x, x)))
    with pytest.raises(bevir.BevirError, match=r"@floaty has nothing to run on the device: "
                       r"none of its 2 nodes is integer \((add x1, relu x1|relu x1, add x1)\)"):
        compile_program(b.graph, tmp_path / "prog")
    assert not (tmp_path / "prog").exists()
    bevir.save(b.graph, tmp_path / "f.bevir")
    assert main(["compile", str(tmp_path / "f.bevir"), "-o", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "quantize it first" in err


def test_compile_names_the_host_round_trips(rng, tmp_path, capsys):
    """A float op left between two integer parts: two device stages, and compile says
    which op makes the round trip through the host (the quantization of its result runs
    on the host with it, not named)."""
    from bevir import DType, TensorType
    from bevir.cli import main
    from bevir.ir.types import FixedPointQuant
    from bevir.target.schedule import host_round_trips
    fx = TensorType((64,), DType.i8, quant=FixedPointQuant((4,)))
    b = bevir.Builder("trip")
    h = b.fx_relu(b.input("a", fx), out_frac_bits=4)
    f = b.sigmoid(b.fx_dequantize(h), loc="head/sigmoid")
    b.output("y", b.fx_relu(b.fx_quantize(f, out_frac_bits=6), out_frac_bits=6))
    assert [[n.op for n in nodes] for nodes in host_round_trips(b.graph)] == [["sigmoid",
                                                                               "fx_quantize"]]
    inputs = {"a": rng.integers(-128, 128, 64).astype(np.int8)}
    assert_bit_exact(compile_program(b.graph, tmp_path / "prog").run(inputs),
                     bevir.run(b.graph, inputs))
    bevir.save(b.graph, tmp_path / "t.bevir")
    assert main(["compile", str(tmp_path / "t.bevir"), "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "stages (nodes): device 2, host 2, device 1" in out
    assert "note: 1 host round trip(s) between device stages, through float ops the " \
           "quantization left: sigmoid 'head/sigmoid'" in out


def test_a_reshape_in_ddr_is_a_view_that_moves_nothing(rng, tmp_path):
    """A reshape whose operand and result both lie in DDR is a view: its result is its
    operand's DDR slot, its step calls no kernel and moves no byte, and the programs stay
    bit-exact and counted as modelled; planned on chip, the same reshape is a kernel."""
    from tests.shared import fx, ints
    b = bevir.Builder("view")
    x = b.input("x", fx((4, 6, 8), 5))
    y = b.fx_add(x, x, out_frac_bits=4, name="y")
    r = b.reshape(y, shape=[4, 48], name="r")
    b.output("z", b.fx_add(r, r, out_frac_bits=3))
    feed = {"x": ints(rng, (4, 6, 8))}
    for cores, plan in ((1, False), (2, False), (1, True)):
        g = planned(b.graph, cores) if plan else partitioned(b.graph, cores)
        program = compile_program(g, tmp_path / f"x{cores}{plan}")
        assert_bit_exact(program.run(feed), bevir.run(b.graph, feed))
        assert_counted_as_modelled(program, HWConfig.parse("qc-u").with_cores(cores))
        m = program.manifest
        reshapes = {n.name: n for n in g.nodes if n.op == "reshape"}    # or its pieces
        steps = [s for p in m["programs"] for s in p["steps"] if s["node"] in reshapes]
        assert steps
        records = model(g, HWConfig.parse("qc-u").with_cores(cores)).records
        for step in steps:
            n = reshapes[step["node"]]
            if plan:            # in OCM: a kernel copies it
                assert step["kernel"] and n.output.name not in m["ddr"]
            else:
                assert step["kernel"] is None and step["ddr_bytes"] == 0 and not step["args"]
                assert m["ddr"][n.output.name] == m["ddr"][n.inputs[0].name]
                assert [r.bound for r in records if r.name == n.name] == ["view"]


def test_loads_and_spills_run_on_each_core_s_dma_engine_while_it_computes(rng, tmp_path):
    """A load the memory plan placed runs on the core's DMA engine (a thread with a queue
    in the programs): the core issues it and goes on, the first step reading it waits for
    it; a store of a value only its core reads (the skip) too, waited for after the core's
    next node, before the step's own loads. Bit-exact on 1 and 2 cores, counted as
    modelled; in the model each transfer runs after its issue and before the step that waits
    for it, overlapping the steps between."""
    from tests.shared import prefetching
    graph, feed = prefetching(rng)
    both = 0
    for cores, ocm in ((1, "100KB"), (2, "64KB")):          # the skip waits in DDR
        hw = HWConfig.parse(f"QC-U {ocm} 16MAC").with_cores(cores)
        g = bevir.optimize(partitioned(graph, cores), [make_pass("plan-memory", hw=hw)])
        program = compile_program(g, tmp_path / f"x{cores}")
        assert_bit_exact(program.run(feed), bevir.run(graph, feed))
        assert_counted_as_modelled(program, hw)
        # each step waits for its core's engine before it loads, as the model does: a
        # load may land on the source of a spill the step waits for
        for source in (tmp_path / f"x{cores}").rglob("core*.c"):
            for block in source.read_text().split("  /* ")[1:]:
                lines = block.splitlines()
                waits = [i for i, line in enumerate(lines) if "bevir_dma_wait(" in line]
                loads = [i for i, line in enumerate(lines) if "memcpy(ocm" in line]
                assert not (waits and loads) or max(waits) < min(loads)
                both += bool(waits and loads)
        steps = [s for p in program.manifest["programs"] for s in p["steps"]]
        issued = [s for s in steps if s["op"] == "dma_copy" and s["kernel"] is None]
        assert issued and all(s["ddr_bytes"] > 0 for s in issued)
        records = model(g, hw).records
        assert {"prefetch", "spill"} <= {r.bound for r in records}
        for r in (r for r in records if r.bound in ("prefetch", "spill")):
            assert r.own_cycles == 0 and r.dma[0] >= r.start
            moved = g.nodes[r.index].output.name
            waiter = next(st for st in schedule_of(g).steps(r.core) if moved in st.dma_waits)
            after = [u for u in records if u.core == r.core and u.index > r.index
                     and g.nodes[u.index] is waiter.node]
            assert after and after[0].start >= r.dma[1]
    assert both, "no step both waits for its engine and loads: the order went unchecked"
