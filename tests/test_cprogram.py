"""Per-core C programs: a partitioned graph compiled into one C program per core (kernels
called in graph order, OCM offsets from the memory plan, DDR copies, ready flags and
barriers), built with the system C compiler, run with one thread per core: 0 differing
elements against the golden model, for every fx op family on 1 to 4 cores, with and
without a memory plan, and for BEVFormer's INT8 graph on the QC-U 4-core preset; the same
graph compiles to byte-identical sources and manifest; the CLI compiles, runs and checks."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir.codegen import Program
from bevir.codegen.cprogram import CompiledProgram, compile
from bevir.passes import make_pass
from bevir.testing import assert_bit_exact
from test_partition import GRAPHS, partitioned


@pytest.fixture(scope="module")
def bevformer_int8():
    """The `test` config's INT8 graph as the e2e flow builds it, and its inputs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.bevformer import e2e
    return e2e.int8_frame("test")


def planned(graph, cores: int):
    g = partitioned(graph, cores, barrier_cycles=0)
    bevir.optimize(g, [make_pass("plan-memory", hw=f"QC-U 8MB 16MAC x{cores}")])
    return g


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("cores,plan", [(1, False), (2, True), (3, False), (4, True)])
def test_per_core_programs_are_bit_exact(rng, tmp_path, name, cores, plan):
    graph, inputs = GRAPHS[name](rng)
    g = planned(graph, cores) if plan else partitioned(graph, cores, barrier_cycles=0)
    program = compile(g, tmp_path)
    assert program.cores == cores
    assert_bit_exact(program.run(inputs), bevir.run(graph, inputs))
    m = program.manifest
    steps = [s for p in m["programs"] for s in p["steps"]]
    assert {s["node"] for s in steps} == {n.name for n in g.nodes}
    if plan:        # the planned offsets are the ones the program uses
        assert m["ocm"] and all(e["offset"] == next(o["offset"] for o in
                                g.value(e["value"]).meta["ocm"] if o["core"] == e["core"])
                                for e in m["ocm"])
    if cores > 1:
        assert all(sum(s.get("barrier", False) for s in p["steps"]) == g.op_counts()["barrier"]
                   for p in m["programs"])
        assert any(s["waits"] for s in steps) and any(s["loads"] or s["stores"] for s in steps) \
            or not plan


def test_bevformer_int8_on_4_cores_is_bit_exact_and_reproducible(bevformer_int8, tmp_path):
    """The per-core programs and the host build of the `test` INT8 frame for QC-U x4."""
    q, feed = bevformer_int8
    a = compile(q, tmp_path / "a", hw="QC-U 8MB 16MAC x4")
    out = a.run(feed)
    assert_bit_exact(out, bevir.run(q, feed))
    assert_bit_exact(a.run(feed), out)                  # a second run, same program
    m = a.manifest
    assert m["cores"] == 4 and [s["device"] for s in m["stages"]] == [False, True, False]
    assert all(b <= 8 * 2**20 for b in m["ocm_bytes"])
    compile(q, tmp_path / "b", hw="QC-U 8MB 16MAC x4")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                   if p.suffix in (".c", ".json"))
    assert len(files) > 100
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert_bit_exact(CompiledProgram.load(tmp_path / "b").run(feed), out)
    # the host build of the same partitioned graph
    assert_bit_exact(Program(a.graph, "llvm").run(feed), out)


def test_cli_compiles_runs_and_checks(rng, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    from bevir.cli import main
    graph, inputs = GRAPHS["chain"](rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(inputs, str(tmp_path / "in.safetensors"))
    assert main(["compile", str(tmp_path / "m.bevir"), "--hw", "QC-U 8MB 16MAC x2",
                 "-o", str(tmp_path / "prog")]) == 0
    assert "compiled @chain for 2 core(s)" in capsys.readouterr().out
    for extra in ([], ["--host"]):
        out = tmp_path / f"out{len(extra)}.safetensors"
        assert main(["exec", str(tmp_path / "prog"), "--inputs", str(tmp_path / "in.safetensors"),
                     "-o", str(out), "--check", *extra]) == 0
        assert "check: 0 differing elements" in capsys.readouterr().out
        assert_bit_exact(load_file(str(out)), bevir.run(graph, inputs))
    assert main(["exec", str(tmp_path / "m.bevir")]) == 1
    assert capsys.readouterr().err.startswith("bevir: error:")


def test_a_wrong_kernel_is_caught_and_named_by_exec_check(rng, tmp_path, capsys):
    """A program built from a deliberately broken lowering: exec --check reports the
    difference and names the first kernel whose results differ from its golden op."""
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
                     "--check"]) == 1
    finally:
        mp.undo()
    err = capsys.readouterr().err
    assert "first differing kernel: op 'fx_add'" in err and "from 'c/residual'" in err


def test_manifest_says_what_each_core_does(rng, tmp_path):
    graph, inputs = GRAPHS["conv_nhwc"](rng)
    program = compile(planned(graph, 2), tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m == program.manifest and m["format"] == "bevir-program"
    for p in m["programs"]:
        for s in p["steps"]:
            assert s["loc"] is not None and (s["kernel"] in m["kernels"] or s.get("barrier"))
            for a in s["args"]:
                assert a["mem"] in ("ocm", "ddr") and a["offset"] >= 0
    for k in m["kernels"].values():
        assert (tmp_path / k["file"]).exists()
    assert (tmp_path / "core0.c").read_text().count("bevir_barrier(bar, 2)") == 1


def test_device_nodes_keep_graph_order_across_stages(rng, tmp_path):
    """A device node that depends only on a constant but comes after a host stage in graph
    order runs in the later device stage: the memory plan's liveness assumes graph order,
    so running it early would let later buffers overwrite its result."""
    from bevir import DType, TensorType
    from bevir.codegen.lower import stages
    from bevir.ir.types import FixedPointQuant
    fx = lambda shape, f: TensorType(shape, DType.i8, quant=FixedPointQuant((f,)))  # noqa: E731
    b = bevir.Builder("order")
    x = b.input("x", fx((64,), 4))
    h = b.mul(b.fx_dequantize(b.fx_relu(x)), b.const(np.float32(2.0), "two"))   # host
    y = b.fx_quantize(h, out_frac_bits=3)                                         # device
    late = b.fx_relu(b.const(rng.integers(-9, 9, 64).astype(np.int8), "k", fx((64,), 3)))
    b.output("y", b.fx_add(y, late, out_frac_bits=3))
    parts = stages(b.graph)
    assert [dev for dev, _ in parts] == [True, False, True]
    late_node = late.producer
    assert any(late_node in nodes for dev, nodes in parts[2:] if dev)
    inputs = {"x": rng.integers(-128, 128, 64).astype(np.int8)}
    program = compile(b.graph, tmp_path, hw="QC-U 8MB 16MAC x1")
    assert_bit_exact(program.run(inputs), bevir.run(b.graph, inputs))


def test_an_unchanged_graph_compiles_from_the_cache(rng, tmp_path, monkeypatch):
    """The second compile of a graph copies the first one's files (no planning, lowering
    or C build), byte for byte, and runs the same; another hw plans and builds afresh."""
    import bevir.codegen.cprogram as cp
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path / "cache"))
    graph, inputs = GRAPHS["chain"](rng)
    first = compile(graph, tmp_path / "a", hw="QC-U 8MB 16MAC x2")
    monkeypatch.setattr(cp, "write_program", lambda *a, **k: pytest.fail("built again"))
    second = compile(graph, tmp_path / "b", hw="QC-U 8MB 16MAC x2")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")
                           if p.is_file())
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert_bit_exact(second.run(inputs), first.run(inputs))
    with pytest.raises(pytest.fail.Exception, match="built again"):
        compile(graph, tmp_path / "c", hw="QC-U 8MB 16MAC x4")
