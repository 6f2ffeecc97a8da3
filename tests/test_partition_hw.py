"""The partition pass with a hardware config takes its costs from the cycle model: every
candidate's cycles are the model's own figures (the whole op on one core, and each piece as
the model costs it in the partitioned graph), the plan carries the config's hash, the cores
default to the config's, and the partitioned graph stays bit-identical."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import DType, TensorType
from bevir.errors import PassError
from bevir.hw import HWConfig
from bevir.ir.types import FixedPointQuant
from bevir.passes.partition import plan_of
from bevir.sim.cycles import model

QCU = "QC-U 8MB 16MAC x4"


def fx(shape, frac) -> TensorType:
    return TensorType(shape, DType.i8, quant=FixedPointQuant((frac,), None))


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int64).astype(np.int8)


def mlp(rng):
    """Two linears and an add, big enough that the model splits the linears."""
    b = bevir.Builder("mlp")
    x = b.input("x", fx((1, 256, 128), 5))
    w1 = b.const(ints(rng, (256, 128)), "w1", fx((256, 128), 7))
    w2 = b.const(ints(rng, (128, 256)), "w2", fx((128, 256), 7))
    h = b.fx_linear(x, w1, out_frac_bits=4, loc="net/fc1", name="h")
    y = b.fx_linear(h, w2, out_frac_bits=4, loc="net/fc2", name="y")
    b.output("z", b.fx_add(y, x, out_frac_bits=4, loc="net/res"))
    return b.graph, {"x": ints(rng, (1, 256, 128))}


@pytest.fixture
def rng():
    return np.random.default_rng(16)


def test_costs_are_the_cycle_models_and_the_plan_carries_the_hash(rng):
    graph, feed = mlp(rng)
    hw = HWConfig.parse(QCU)
    whole = model(graph, hw).records
    reference = bevir.run(graph, feed)
    g = bevir.optimize(graph.clone(), f'partition{{hw="{QCU}"}}')
    plan = plan_of(g)
    assert plan["cores"] == hw.cores
    assert plan["cost"]["hw_hash"] == hw.hash
    for entry, rec in zip(plan["ops"], whole):       # one core: the model's own cycles
        assert entry["candidates"][0] == {"split": "none", "applies": True,
                                          "cycles": rec.own_cycles}
    split = [e for e in plan["ops"] if e["choice"] != "none"]
    assert split, "the model should split the linears"
    pieces = {r.name: r for r in model(g, hw).records}
    for e in split:
        chosen = next(c for c in e["candidates"] if c["split"] == e["choice"])
        assert chosen["cycles"] == min(c["cycles"] for c in e["candidates"] if c["applies"])
        nodes = [n for n in g.nodes if n.op == e["op"] and n.output.name.startswith(
            next(n0.output.name for n0 in graph.nodes if n0.name == e["node"]) + ".c")]
        assert len(nodes) == len(chosen["sizes"])
        assert chosen["per_core"] == [pieces[n.name].own_cycles for n in nodes]
        assert chosen["cycles"] == max(chosen["per_core"]) + hw.barrier_cycles
    out = bevir.run(g, feed)
    assert all(np.array_equal(out[k], reference[k]) for k in reference)


def test_hw_costs_differ_from_the_placeholder(rng):
    graph, _ = mlp(rng)
    by_hw = plan_of(bevir.optimize(graph.clone(), f'partition{{hw="{QCU}"}}'))
    by_split = plan_of(bevir.optimize(graph.clone(), "partition{cores=4}"))
    assert [e["candidates"] for e in by_hw["ops"]] != [e["candidates"] for e in by_split["ops"]]
    assert "hw_hash" not in by_split["cost"]


@pytest.mark.parametrize("text, cores", [("QC-U 8MB 16MAC x2", 2), ("qc-u", 1)])
def test_cores_default_to_the_configs(rng, text, cores):
    graph, _ = mlp(rng)
    g = bevir.optimize(graph.clone(), f'partition{{hw="{text}"}}')
    assert plan_of(g)["cores"] == cores
    assert {n.meta["core"] for n in g.nodes if "core" in n.meta} <= set(range(cores))


@pytest.mark.parametrize("options, message", [
    (f'cores=8, hw="{QCU}"', "the config 16x16 8MB 16MAC x4 has 4"),
    (f'macs_per_cycle=100, hw="{QCU}"', "macs_per_cycle configure the placeholder"),
])
def test_options_that_contradict_the_config_are_errors(rng, options, message):
    graph, _ = mlp(rng)
    with pytest.raises(PassError, match=message):
        bevir.optimize(graph, f"partition{{{options}}}")


def test_plan_memory_takes_ocm_cores_and_shared_from_the_config(rng):
    graph, feed = mlp(rng)
    reference = bevir.run(graph, feed)
    g = bevir.optimize(graph.clone(), f'partition{{hw="{QCU}"}},plan-memory{{hw="{QCU}"}}')
    options = g.meta["memory_plan"]["options"]
    hw = HWConfig.parse(QCU)
    assert (options["ocm"], options["cores"], options["shared"]) == (hw.ocm_bytes, 4, False)
    assert options["hw_hash"] == hw.hash
    assert {c["core"] for c in g.meta["memory_plan"]["cores"]} == {0, 1, 2, 3}
    small = bevir.optimize(graph.clone(), 'plan-memory{hw="QC-U 160KB 16MAC x1 shared"}')
    assert small.meta["memory_plan"]["options"]["shared"] is True
    assert any(n.op == "dma_copy" for n in small.nodes)       # 160 KB: x waits in DDR
    for planned in (g, small):
        out = bevir.run(planned, feed)
        assert all(np.array_equal(out[k], reference[k]) for k in reference)


def test_plan_memory_options_that_contradict_the_config_are_errors():
    with pytest.raises(PassError, match=r"cores=2 contradicts hw='QC-U 8MB 16MAC x4' \(cores 4\)"):
        bevir.passes.parse_pipeline(f'plan-memory{{cores=2, hw="{QCU}"}}')


def test_cli_run_partitions_with_the_cycle_model(rng, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    from bevir.cli import main
    graph, feed = mlp(rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(feed, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    assert main(["run", str(tmp_path / "m.bevir"), "--inputs", str(tmp_path / "in.safetensors"),
                 "-o", str(out), "--cores", "4", "--hw", QCU]) == 0
    err = capsys.readouterr().err
    by_hw = plan_of(bevir.optimize(graph.clone(), f'partition{{hw="{QCU}"}}'))
    assert f"ops split: {sum(e['choice'] != 'none' for e in by_hw['ops'])} of" in err
    got, reference = load_file(str(out)), bevir.run(graph, feed)
    assert all(np.array_equal(got[k], reference[k]) for k in reference)
