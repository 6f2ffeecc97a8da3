"""The typed quantization config: rules, the reference-flow preset on BEVFormer, files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bevir
from bevir import Builder, TensorType
from bevir.passes.quant_config import ConfigError, QuantConfig, Rule

import examples.bevformer.quant  # noqa: F401  (registers the reference-flow preset)


@pytest.fixture(scope="module")
def bevformer(tmp_path_factory):
    from examples.bevformer import e2e
    from examples.bevformer.config import CONFIGS
    from examples.bevformer.inputs import make_inputs
    from examples.bevformer.weights import build_model
    cfg = CONFIGS["test"]
    model = build_model(cfg, seed=0).eval()
    return cfg, e2e.build_graph(model, make_inputs(cfg, 0, with_prev_bev=True),
                                tmp_path_factory.mktemp("bev"), decompose=True)


def test_reference_flow_preset_groups_the_bevformer_graph(bevformer):
    cfg, graph = bevformer
    plan = QuantConfig.preset("reference-flow").plan(graph)
    counts = plan.counts()
    convs = sum(n.op == "conv2d" for n in graph.nodes)
    assert counts["backbone"] == convs                      # every backbone/neck conv
    by_group = {}
    for node, rule in plan:
        by_group.setdefault(rule.name, []).append(node)
        assert (rule.name == "backbone") == node.loc.startswith(("/img_backbone/", "/img_neck/"))
    for n in by_group["encoder"]:
        assert n.loc.startswith("pts_bbox_head.transformer.encoder.layers.")
    assert all(".attentions." in n.loc for n in by_group["decoder-attention"])
    assert all(".ffns." in n.loc for n in by_group["decoder-ffn"])
    assert len(by_group["decoder-ffn"]) == 2 * cfg.decoder_layers
    heads = by_group["heads"]
    assert heads and all(n.loc.startswith(("pts_bbox_head.cls_branches", "pts_bbox_head.reg_branches"))
                         for n in heads)
    assert {r.weights for _, r in plan if r.name in ("encoder", "decoder-ffn", "heads")} == {"per_channel"}
    assert {r.weights for _, r in plan if r.name in ("backbone", "decoder-attention")} == {"per_tensor"}
    assert all(r.name == "other" for n, r in plan if "can_bus_mlp" in n.loc)
    table = plan.table()
    assert table.splitlines()[0].split() == ["group", "ops", "weights", "activations", "example"]
    rows = {line.split()[0]: line.split()[1:4] for line in table.splitlines()[1:]}
    assert rows["backbone"] == [str(convs), "per_tensor", "affine"]
    assert rows["encoder"] == [str(counts["encoder"]), "per_channel", "fixed"]


def _linear_graph():
    b = Builder("g")
    x = b.input("x", TensorType((4, 4)))
    rng = np.random.default_rng(0)
    with b.loc("enc.layers.0.ffn"):
        y = b.matmul(x, b.const(rng.standard_normal((4, 4)).astype(np.float32), "w0"))
    with b.loc("dec.layers.0.attn"):
        y = b.matmul(y, b.const(rng.standard_normal((4, 4)).astype(np.float32), "w1"))
    y = b.matmul(y, y)                                    # no constant weight: not planned
    b.output("y", y)
    return b.graph


def test_first_matching_rule_wins_and_ops_filter():
    cfg = QuantConfig.build({"rules": [
        {"name": "conv-only", "ops": ["conv2d"], "where": ["*"]},
        {"name": "enc", "where": ["enc.*"], "weights": "per_channel"},
        {"name": "all", "where": ["*"], "exclude": True}]})
    plan = cfg.plan(_linear_graph())
    assert [(n.loc, r.name) for n, r in plan] == [("enc.layers.0.ffn", "enc"),
                                                  ("dec.layers.0.attn", "all")]


def test_override_switches_a_group_and_keeps_the_rest():
    cfg = QuantConfig.preset("reference-flow")
    new = cfg.override("decoder-attention", weights="per_channel")
    assert new.group("decoder-attention").weights == "per_channel"
    assert cfg.group("decoder-attention").weights == "per_tensor"      # configs are values
    assert [r.name for r in new.rules] == [r.name for r in cfg.rules]
    assert new.override("other", exclude=True).default.exclude
    with pytest.raises(ConfigError, match="no rule group 'decoder'"):
        cfg.override("decoder", exclude=True)


def test_save_and_load_round_trip(tmp_path):
    cfg = QuantConfig.preset("reference-flow").override("heads", exclude=True)
    assert QuantConfig.load(cfg.save(tmp_path / "q.json")) == cfg


@pytest.mark.parametrize("data,match", [
    ({"rules": [{"name": "a", "weights": "per_row"}]}, r"rules\.0\.weights"),
    ({"rules": [{"name": "a", "colour": 1}]}, r"rules\.0\.colour: Extra inputs"),
    ({"rules": [{"name": ""}]}, r"rules\.0\.name"),
    ({"rules": [{"name": "a"}, {"name": "a"}]}, "repeated: a"),
    ({"calibration": "average"}, "calibration"),
    ({"percentile": 120}, "percentile"),
    ({"default": {"name": "d", "exclude": "yes"}}, r"default\.exclude: Input should be a valid "
                                                  "boolean"),
    ({"rules": [{"name": "a", "exclude": 1}]}, r"rules\.0\.exclude: Input should be a valid "
                                               "boolean"),
    ({"percentile": "99"}, "percentile: Input should be a valid number"),
    ({"widen_to": "30"}, "widen_to: Input should be a valid number"),
    ({"widen_to": 0}, "widen_to: Input should be greater than 0"),
])
def test_bad_configs_raise_config_error_naming_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        QuantConfig.build(data)


def test_bad_files_and_presets(tmp_path):
    (tmp_path / "bad.json").write_text("{rules")
    with pytest.raises(ConfigError, match="bad.json: not JSON"):
        QuantConfig.load(tmp_path / "bad.json")
    (tmp_path / "deep.json").write_text('{"rules": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="deep.json: JSON nested too deeply"):
        QuantConfig.load(tmp_path / "deep.json")
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(ConfigError, match="expected a JSON object"):
        QuantConfig.load(tmp_path / "list.json")
    with pytest.raises(ConfigError, match="presets: default, reference-flow"):
        QuantConfig.preset("fast")
    assert issubclass(ConfigError, bevir.BevirError)


def test_rule_selects_by_glob():
    r = Rule(name="r", where=("a.*.ffn", "b"))
    g = _linear_graph()
    assert not r.selects(g.nodes[-1])
    assert Rule(name="any").selects(g.nodes[-1])


def test_the_shipped_tiny_search_result_is_the_preset_with_more_precision():
    """examples/bevformer/data/tiny_search_quant_config.json (the precision search's result
    on tiny, docs/quantization.md) loads, has the preset's groups in order and differs from
    the preset only by notches the search takes."""
    from bevir.passes.precision import notches
    path = (Path(__file__).resolve().parents[2] / "examples" / "bevformer" / "data"
            / "tiny_search_quant_config.json")
    found, preset = QuantConfig.load(path), QuantConfig.preset("reference-flow")
    names = [r.name for r in (*preset.rules, preset.default)]
    assert [r.name for r in (*found.rules, found.default)] == names
    assert found.sources == preset.sources
    for name in names:
        rule, start = found.group(name), preset.group(name)
        reachable, cfg = [start], preset
        while (moves := notches(cfg.group(name))):
            cfg = cfg.override(name, **moves[0][0])
            reachable.append(cfg.group(name))
        assert rule in reachable, name
    assert found != preset


def test_the_default_preset_names_no_model_and_widens_to_30_db():
    """Per-channel weights, 8-bit activations, no rule naming a layer; 16-bit activations
    where local error calls for them, to 30 dB against float (bevir quantize)."""
    cfg = QuantConfig.preset("default")
    assert cfg.rules == () and cfg.default.weights == "per_channel"
    assert cfg.default.activations == "fixed" and cfg.widen_to == 30.0
