"""The whole BEVFormer (test config) as one bevir graph reproduces the PyTorch model."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bevir
from bevir.passes.quant_config import QuantConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.decode import compare_detections, decode  # noqa: E402
from examples.bevformer.inputs import make_inputs  # noqa: E402
from examples.bevformer.weights import build_model, make_checkpoint, save_checkpoint  # noqa: E402
from tests.e2e_digests import e2e_argv, output_digests, stored  # noqa: E402

CFG = CONFIGS["test"]


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=0).eval()


@pytest.mark.parametrize("decompose", [False, True], ids=["custom-ops", "decomposed"])
@pytest.mark.parametrize("with_prev", [True, False], ids=["prev_bev", "first-frame"])
def test_one_graph_matches_pytorch(model, tmp_path, decompose, with_prev):
    inputs = make_inputs(CFG, 0, with_prev_bev=with_prev)
    graph = e2e.build_graph(model, inputs, tmp_path, decompose=decompose)
    assert [v.name for v in graph.inputs] == ["img", "lidar2img", "can_bus"] + ["prev_bev"] * with_prev
    golden = bevir.run(graph, e2e.golden_inputs(graph, inputs))
    with torch.no_grad():
        cls, bbox = model(inputs["img"], inputs["lidar2img"], inputs["can_bus"], inputs.get("prev_bev"))
    assert np.abs(golden["cls_scores"] - cls.numpy()).max() <= 1e-3
    assert np.abs(golden["bbox_preds"] - bbox.numpy()).max() <= 1e-3
    cmp = compare_detections(decode(golden["cls_scores"], golden["bbox_preds"], CFG), decode(cls, bbox, CFG))
    assert cmp["bev_iou_match"] == 10 and cmp["top10_label_match"] == 10
    counts = graph.op_counts()
    if decompose:
        assert "temporal_self_attention" not in counts and counts["grid_sample"] > 0
    else:
        assert counts["temporal_self_attention"] == counts["spatial_cross_attention"] == CFG.encoder_layers
        assert counts["deformable_cross_attention"] == counts["multihead_attention"] == CFG.decoder_layers
        assert counts["ffn"] == CFG.encoder_layers + CFG.decoder_layers
        tsa = next(n for n in graph.nodes if n.op == "temporal_self_attention")
        assert tsa.loc == "pts_bbox_head.transformer.encoder.layers.0.attentions.0"
        assert tsa.inputs[-1].name == "pts_bbox_head.transformer.encoder.layers.0.attentions.0.output_proj.bias"
    # backbone nodes carry ONNX node names, head nodes module paths
    assert any(n.loc.startswith("/img_backbone/") for n in graph.nodes)


def test_e2e_script_writes_its_artifacts(tmp_path):
    # the CLI with an official-style .pth checkpoint (here the seed-0 synthetic weights)
    assert e2e.main(e2e_argv(tmp_path)) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["weights"] == {"synthetic": "false", "source": str(tmp_path / "weights.pth")}
    # float golden and INT8 outputs byte-identical to the stored digests (see
    # tests/e2e_digests.py: regenerate only for an intended numerics change)
    assert output_digests(tmp_path) == stored()
    for name in ("checkpoint.safetensors", "test_vectors.safetensors", "config.json", "model.bevir",
                 "model.safetensors", "golden_outputs.safetensors", "int8_outputs.safetensors",
                 "report.json", "backbone_int8.onnx", "model_int8.bevir", "int8_layers.json",
                 "int8_layers.png"):
        assert (tmp_path / name).exists(), name
    assert report["comparison"]["bev_iou_match"] == 10
    int8 = report["int8"]
    assert int8["fx_ops"] > 100 and int8["quantize"]["lowered-gemm"] > 0
    assert int8["sqnr_db"]["cls_scores"] > 20 and int8["sqnr_db"]["bbox_preds"] > 20
    assert int8["comparison"]["bev_iou_match"] >= 8             # the reference flow's check
    # the INT8 backbone hands over through one bridge; what stays float between the image
    # and the outputs is the box decoding (host post-processing in the reference flow)
    q = bevir.load(tmp_path / "model_int8.bevir")
    bevir.verify(q)
    assert q.op_counts()["fx_bridge"] == 1 and q.op_counts()["qlinear_conv"] > 10
    cfg = QuantConfig.preset("reference-flow")
    left = bevir.float_ops_between(q, ["img"]).nodes
    decoding = [n for n in left if n.op != "fx_dequantize"]
    assert decoding and {cfg.rule_for(n).name for n in decoding} == {"box-decoding"}
    # the other float values are the conversions into it
    assert all({cfg.rule_for(u).name for u in n.output.users} == {"box-decoding"}
               for n in left if n.op == "fx_dequantize")
    assert int8["float_on_path"] == bevir.float_ops_between(q, ["img"]).counts()
    assert len(int8["worst_layers"]) == 5 and all(w["group"] for w in int8["worst_layers"])
    assert not {w["op"] for w in int8["worst_layers"]} & set(e2e.CONVERSIONS)
    sens = int8["float_noise_sensitivity_40db"]
    assert set(sens) == {"cls_scores", "bbox_preds"} and all(v > 0 for v in sens.values())
    layers = json.loads((tmp_path / "int8_layers.json").read_text())
    assert len(layers["layers"]) > 100
    # the saved program reruns bit-identically to the script's run
    from safetensors.numpy import load_file
    saved = load_file(str(tmp_path / "int8_outputs.safetensors"))
    again = bevir.run(q, e2e.golden_inputs(q, make_inputs(CFG, 0, with_prev_bev=True)))
    assert all(np.array_equal(saved[k], again[k]) for k in saved)
    assert json.loads((tmp_path / "report.json").read_text())["int8"]["nodes"] == int8["nodes"]
    g = bevir.load(tmp_path / "model.bevir")
    bevir.verify(g)
    assert len(g.nodes) == report["nodes"]


def test_override_switches_a_group_per_channel_or_excludes_it():
    cfg = QuantConfig.preset("reference-flow")
    name = next(r.name for r in cfg.rules if r.name != "box-decoding")
    changed = e2e.overridden(cfg, [f"{name}=exclude", "box-decoding=per_tensor"])
    assert changed.group(name).exclude and not cfg.group(name).exclude
    assert changed.group("box-decoding").weights == "per_tensor"
    assert not changed.group("box-decoding").exclude
    with pytest.raises(SystemExit, match="expected GROUP"):
        e2e.overridden(cfg, [f"{name}=sometimes"])


def test_e2e_rejects_a_checkpoint_that_does_not_fit(tmp_path, capsys):
    sd = make_checkpoint(CFG, seed=0)
    key = "pts_bbox_head.transformer.encoder.layers.0.ffns.0.layers.0.0.weight"
    sd[key] = sd[key][:, :-1]
    del sd[next(iter(sd))]
    sd["extra.weight"] = torch.zeros(1)
    pth = tmp_path / "bad.pth"
    save_checkpoint(pth, sd)
    out = tmp_path / "out"
    assert e2e.main(["--config", "test", "--checkpoint", str(pth), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not fit config 'test'" in err
    assert "1 missing" in err and "1 unexpected" in err and f"1 shape mismatch (first: {key}" in err
    assert not out.exists()                                   # nothing written
