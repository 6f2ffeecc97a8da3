"""The partition pass and plan-memory take a hardware config as a typed pass option (parsed
once, printed back in the pipeline text); the partition costs by the config's cycle model,
the plan carries the config and its hash, cores default to the config's, and options that
contradict the config are errors. The planning pipeline keeps a split only where it pays."""
from __future__ import annotations

import json

import numpy as np
import pytest

import bevir
from bevir import DType, TensorType
from bevir.errors import PassError
from bevir.ir.types import FixedPointQuant
from bevir.passes import make_pass, parse_pipeline, pipeline_text
from bevir.passes.partition import plan_of
from bevir.passes.target import plan_for_target
from bevir.target import HWConfig, model
from tests.shared import check_never_slower

QCU = "QC-U 8MB 16MAC x4"


def fx(shape, frac) -> TensorType:
    return TensorType(shape, DType.i8, quant=FixedPointQuant((frac,), None))


def ints(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int64).astype(np.int8)


def mlp(rng, tokens=2048, d=256, hidden=None):
    """Two linears and an add, big enough that the model splits the linears (their MACs
    per DDR byte outweigh the bandwidth the cores share)."""
    b = bevir.Builder("mlp")
    hidden = hidden or 4 * d
    x = b.input("x", fx((1, tokens, d), 5))
    w1 = b.const(ints(rng, (hidden, d)), "w1", fx((hidden, d), 7))
    w2 = b.const(ints(rng, (d, hidden)), "w2", fx((d, hidden), 7))
    h = b.fx_linear(x, w1, out_frac_bits=4, loc="net/fc1", name="h")
    y = b.fx_linear(h, w2, out_frac_bits=4, loc="net/fc2", name="y")
    b.output("z", b.fx_add(y, x, out_frac_bits=4, loc="net/res"))
    return b.graph, {"x": ints(rng, (1, tokens, d))}


@pytest.fixture
def rng():
    return np.random.default_rng(16)


@pytest.mark.parametrize("text", [QCU, "qc-u-4c", '{"cores": 2, "ddr_bytes_per_cycle": 8}'])
def test_a_hardware_config_is_a_pass_option_that_prints_back(text):
    p = parse_pipeline("partition{hw=" + json.dumps(text) + "}")[0]
    assert isinstance(p.hw, HWConfig)
    again = parse_pipeline(pipeline_text([p]))[0]
    assert again.hw.hash == p.hw.hash and str(again) == str(p)
    with pytest.raises(PassError, match="option 'hw'.*8QB"):
        parse_pipeline('partition{hw="QC-U 8QB"}')


def test_costs_are_the_cycle_models_and_the_plan_carries_the_hash(rng):
    graph, feed = mlp(rng)
    hw = HWConfig.parse(QCU)
    reference = bevir.run(graph, feed)
    g = bevir.optimize(graph.clone(), [make_pass("partition", hw=hw)])
    plan = plan_of(g)
    assert plan["cores"] == hw.cores and plan["hw"] == QCU and plan["hw_hash"] == hw.hash
    split = [e for e in plan["ops"] if e["choice"] != "none"]
    assert {e["op"] for e in split} >= {"fx_linear"}, "the model should split the linears"
    assert "barrier" not in g.op_counts()
    out = bevir.run(g, feed)
    assert all(np.array_equal(out[k], reference[k]) for k in reference)


@pytest.mark.parametrize("text, cores", [("QC-U 8MB 16MAC x2", 2), ("qc-u", 1)])
def test_cores_default_to_the_configs(rng, text, cores):
    graph, _ = mlp(rng)
    g = bevir.optimize(graph.clone(), f'partition{{hw="{text}"}}')
    assert plan_of(g)["cores"] == cores
    assert {n.meta["core"] for n in g.nodes if "core" in n.meta} <= set(range(cores))


def test_options_that_contradict_the_config_are_errors(rng):
    graph, _ = mlp(rng)
    with pytest.raises(PassError, match="cores=8 must be 0 .* to 4"):
        bevir.optimize(graph, f'partition{{cores=8, hw="{QCU}"}}')


def test_plan_memory_takes_ocm_cores_and_shared_from_the_config(rng):
    graph, feed = mlp(rng, tokens=256, d=128, hidden=256)
    reference = bevir.run(graph, feed)
    g = bevir.optimize(graph.clone(), f'partition{{hw="{QCU}"}},plan-memory{{hw="{QCU}"}}')
    options = g.meta["memory_plan"]["options"]
    hw = HWConfig.parse(QCU)
    assert (options["ocm"], options["cores"], options["shared"]) == (hw.ocm_bytes, 4, False)
    assert options["hw_hash"] == hw.hash
    small = bevir.optimize(graph.clone(), 'plan-memory{hw="QC-U 128KB 16MAC x1 shared"}')
    assert small.meta["memory_plan"]["options"]["shared"] is True
    assert any(n.op == "dma_copy" for n in small.nodes)       # 128 KB: x waits in DDR
    for planned in (g, small):
        out = bevir.run(planned, feed)
        assert all(np.array_equal(out[k], reference[k]) for k in reference)


def test_plan_memory_options_that_contradict_the_config_are_errors():
    with pytest.raises(PassError, match=r"cores=2 contradicts hw='QC-U 8MB 16MAC x4' \(cores 4\)"):
        parse_pipeline(f'plan-memory{{cores=2, hw="{QCU}"}}')


@pytest.mark.parametrize("cores", [2, 3, 4])
def test_the_pipeline_keeps_a_split_only_where_it_pays(rng, cores):
    """The planned graph is never slower than the one-core plan, and its figures say so."""
    hw = HWConfig.parse(QCU).with_cores(cores)
    for tokens in (4, 2048):            # too small to split, and large enough to
        graph, feed = mlp(rng, tokens)
        g = plan_for_target(graph, hw, cache=False)
        m = g.meta["partition"]["modelled"]
        one = model(plan_for_target(graph, hw.with_cores(1), cache=False), hw).makespan
        check_never_slower(m, one, model(g, hw).makespan)
        # 2048 tokens: faster than one core's MAC roofline, so one core is not planned
        assert ("one_core_at_least" in m) == (tokens == 2048)
        assert plan_of(g)["cores"] == (cores if m["kept"] else 1)
        out, reference = bevir.run(g, feed), bevir.run(graph, feed)
        assert all(np.array_equal(out[k], reference[k]) for k in reference)
    assert m["kept"]                    # 2048 tokens: the linears are worth the cores


def test_cli_run_plans_with_the_cycle_model(rng, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file
    from bevir.cli import main
    graph, feed = mlp(rng)
    bevir.save(graph, tmp_path / "m.bevir")
    save_file(feed, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    assert main(["run", str(tmp_path / "m.bevir"), "--inputs", str(tmp_path / "in.safetensors"),
                 "-o", str(out), "--hw", QCU]) == 0
    err = capsys.readouterr().err
    g = plan_for_target(graph, HWConfig.parse(QCU))
    assert f"ops split or copied: {sum(e['choice'] != 'none' for e in plan_of(g)['ops'])} of" in err
    assert "modelled makespan" in err
    got, reference = load_file(str(out)), bevir.run(graph, feed)
    assert all(np.array_equal(got[k], reference[k]) for k in reference)
