"""The precision search: groups with the worst local error get more precision, one notch a
step, until the target holds; the last config reproduces the last step."""
import numpy as np
import pytest

import bevir
from bevir import Builder, DType, TensorType
from bevir.passes.precision import (Evaluation, Target, best, next_move, notches, search,
                                    worst_groups)
from bevir.passes.quant_config import ConfigError, QuantConfig
from bevir.passes.quantize import quantize
from bevir.sim.compare import compare_graphs, layer_error

LAYERS = 4


def mlp() -> bevir.Graph:
    """Four matmul + relu layers; layer 2's weights have one output column 100x the others,
    which per-tensor INT8 weights cannot hold together with the rest."""
    rng = np.random.default_rng(3)
    b = Builder("mlp")
    h = b.input("x", TensorType((32, 16), DType.f32))
    for k in range(LAYERS):
        w = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
        if k == 2:
            w[:, 0] *= 100
        with b.loc(f"layer{k}"):
            h = b.relu(b.matmul(h, b.const(w), name=f"mm{k}"), name=f"act{k}")
    b.output("y", h)
    return b.graph


def per_layer_config() -> QuantConfig:
    return QuantConfig.build({"rules": [{"name": f"layer{k}", "where": [f"layer{k}"]}
                                        for k in range(LAYERS)],
                              "default": {"name": "rest"}})


@pytest.fixture(scope="module")
def evaluate():
    reference = mlp()
    rng = np.random.default_rng(4)
    samples = [{"x": rng.standard_normal((32, 16)).astype(np.float32)} for _ in range(3)]
    calls = []

    def run(config: QuantConfig) -> Evaluation:
        q = reference.clone()
        bevir.calibrate(q, samples, progress=False)
        quantize(q, config)
        bevir.optimize(q, "cse,dce")
        got, ref = bevir.run(q, samples[0])["y"], bevir.run(reference, samples[0])["y"]
        report = compare_graphs(reference, q, samples[0])
        calls.append(config)
        names = {v.name: v.producer for v in reference.values()}
        return Evaluation({"y_sqnr": layer_error(ref, got)[0]},
                          worst_groups(report, config, names.get))
    run.calls = calls
    return run


def test_the_search_moves_the_worst_group_until_the_target_holds(evaluate):
    start = evaluate(per_layer_config())
    assert start.worst[0] == "layer2"                 # the broken layer, by local error
    target = Target.parse(f"y_sqnr>={start.metrics['y_sqnr'] + 1.5:.2f}")   # per channel: +2 dB
    lines = []
    steps = search(per_layer_config(), evaluate, target, log=lines.append)
    assert [s.change for s in steps] == ["start", "layer2: weights per channel"]
    assert not steps[0].met and steps[-1].met
    assert steps[-1].config.group("layer2").weights == "per_channel"
    assert all(steps[-1].config.group(f"layer{k}").weights == "per_tensor" for k in (0, 1, 3))
    assert len(lines) == 2 and "[met: y_sqnr>=" in lines[-1]
    # the written config reproduces the last step
    again = evaluate(QuantConfig.model_validate_json(steps[-1].config.model_dump_json()))
    assert again.metrics == steps[-1].metrics


def test_without_a_closer_move_the_search_escalates_until_nothing_is_left(evaluate):
    """A target no move brings closer: from each config every move is tried; the closest
    is kept and the search goes on from it until no group can take more precision; the
    result is the kept step closest to the target."""
    target = Target.parse("y_sqnr<0")
    steps = search(per_layer_config(), evaluate, target, max_steps=80, log=None)
    last = [s for s in steps if s.kept][-1]
    assert not any(s.met for s in steps)
    assert next_move(last.config, [f"layer{k}" for k in range(LAYERS)]) is None
    assert all(last.config.group(f"layer{k}").exclude for k in range(LAYERS))
    assert sum(s.change.startswith("escalate: ") for s in steps) >= 1
    kept = [s for s in steps if s.kept]
    assert best(steps, target).metrics["y_sqnr"] == min(s.metrics["y_sqnr"] for s in kept)
    assert next_move(per_layer_config(), ["layer0"], {("layer0", "weights per channel"),
                                                      ("layer0", "activations 16-bit"),
                                                      ("layer0", "out of INT8 (float)")}) is None


def test_the_notches_in_order():
    """Per-channel weights, then 16-bit activations, then float; an affine group (its
    scales are onnxruntime's) has no 16-bit notch."""
    cfg = per_layer_config()
    path = []
    while (move := next_move(cfg, ["layer1"])) is not None:
        name, changes, what = move
        path.append(what)
        cfg = cfg.override(name, **changes)
    assert path == ["layer1: weights per channel", "layer1: activations 16-bit",
                    "layer1: out of INT8 (float)"]
    assert cfg.group("layer1").exclude and cfg.group("layer0") == per_layer_config().group("layer0")
    affine = per_layer_config().override("layer1", activations="affine")
    assert [w for _, w in notches(affine.group("layer1"))] == ["weights per channel",
                                                                 "out of INT8 (float)"]


def test_16bit_activations_lift_the_error_of_their_group(evaluate):
    """The last layer's product and relu at 16 bits: the output's rounding is 256x finer
    (a 16-bit result read by an 8-bit op would be rounded to 8 bits again); what is left
    is the error of the weights and of the layers before (+0.5 dB here)."""
    base = evaluate(per_layer_config())
    wide = evaluate(per_layer_config().override("layer3", activations="fixed16"))
    assert wide.metrics["y_sqnr"] > base.metrics["y_sqnr"] + 0.2, (wide.metrics, base.metrics)


GROUPS = [f"g{k}" for k in range(4)]


def plateau(needed=("g1", "g3")):
    """An evaluation whose metric is flat (0) until every group in ``needed`` is float,
    then 10: no single move brings it closer, as whole-box matches behave on a model
    sensitive everywhere. Groups ranked g0..g3; ``precision`` counts the notches taken."""
    calls = []

    def run(config: QuantConfig) -> Evaluation:
        calls.append(config)
        rules = [config.group(g) for g in GROUPS]
        score = 10.0 if all(config.group(g).exclude for g in needed) else 0.0
        precision = sum(r.exclude * 2 or r.weights == "per_channel" for r in rules)
        return Evaluation({"top10_iou": score, "precision": float(precision)}, list(GROUPS))
    run.calls = calls
    return run


def group_config() -> QuantConfig:
    return QuantConfig.build({"rules": [{"name": g, "where": [g]} for g in GROUPS],
                              "default": {"name": "rest"}})


@pytest.mark.parametrize("tiebreak", [(), ("precision",)], ids=["escalate", "tiebreak"])
def test_a_plateau_is_crossed_and_what_was_not_needed_given_back(tiebreak):
    run = plateau()
    target = Target.parse("top10_iou>=9")
    lines = []
    steps = search(group_config(), run, target, max_steps=100, tiebreak=tiebreak, log=lines.append)
    result = best(steps, target)
    assert result.met and result is [s for s in steps if s.kept][-1]
    # only the groups the target needs stay out of INT8; the rest is back as at the start
    assert {g for g in GROUPS if result.config.group(g).exclude} == {"g1", "g3"}
    assert all(result.config.group(g) == group_config().group(g) for g in ("g0", "g2"))
    assert any("back as at start" in line for line in lines)
    assert len(run.calls) == len({c.model_dump_json() for c in run.calls})   # none twice
    if not tiebreak:
        assert any(s.change.startswith("escalate: ") for s in steps)


@pytest.mark.parametrize("text, problem", [("sqnr", "expected METRIC>=VALUE"),
                                           ("sqnr=>3", "expected METRIC>=VALUE")])
def test_targets_parse_or_say_why(text, problem):
    with pytest.raises(ConfigError, match=problem):
        Target.parse(text)
    t = Target.parse(" top10_iou >= 9 ")
    assert (t.metric, t.op, t.value, str(t)) == ("top10_iou", ">=", 9.0, "top10_iou>=9")
    with pytest.raises(ConfigError, match="not measured; metrics: cls_sqnr"):
        t.met({"cls_sqnr": 30.0})


def test_the_e2e_search_writes_the_best_config(tmp_path, capsys):
    """The BEVFormer `test` frame, three steps toward an out-of-reach cls SQNR: each step
    printed, quant_config.json holds the best config."""
    from examples.bevformer import e2e
    from examples.bevformer.config import CONFIGS
    import bevir.passes.precision as precision
    start = QuantConfig.preset("reference-flow")
    seen = []
    real = precision.search

    def spy(*a, **k):
        seen.extend(real(*a, **{**k, "max_steps": 3}))
        return seen
    precision.search = spy
    try:
        final = e2e.precision_search(CONFIGS["test"], tmp_path, 0, start, "cls_sqnr>=99")
    finally:
        precision.search = real
    out = capsys.readouterr().out
    assert "precision search for cls_sqnr>=99" in out and out.count("[not met: cls_sqnr>=99]") == 3
    assert len(seen) == 3 and final == best(seen).config
    assert QuantConfig.load(tmp_path / "quant_config.json") == final


def test_widen_moves_the_worst_layers_to_16_bits_until_the_target_holds():
    """From 8-bit activations, widen moves layers (by provenance) with the worst local
    error to 16 bits, a share a step, until the output's SQNR reaches the target; the
    config it returns reproduces that SQNR and widens no further; a target already met
    widens nothing."""
    from bevir.passes.precision import widen
    graph = mlp()
    rng = np.random.default_rng(5)
    bevir.calibrate(graph, [{"x": rng.standard_normal((32, 16)).astype(np.float32)}
                            for _ in range(3)], progress=False)
    feed = {"x": rng.standard_normal((32, 16)).astype(np.float32)}
    start = QuantConfig.build({"default": {"name": "default", "weights": "per_channel"}})

    def sqnr(config):
        q = graph.clone()
        quantize(q, config)
        return layer_error(bevir.run(graph, feed)["y"], bevir.run(q, feed)["y"])[0]
    eight = sqnr(start)
    target = eight + 6                  # a target 8-bit activations miss by 6 dB
    cfg, got, layers = widen(graph, feed, start, target, share=0.25)
    assert got >= target and 1 <= layers <= LAYERS, (eight, got, layers)
    assert cfg.rules[0].name == "widened" and cfg.rules[0].activations == "fixed16"
    assert set(cfg.rules[0].where) <= {f"layer{k}" for k in range(LAYERS)}
    assert cfg.widen_to is None and sqnr(cfg) == pytest.approx(got)
    same, met, none = widen(graph, feed, start, eight - 1)
    assert none == 0 and same.rules == start.rules and met == pytest.approx(eight)
