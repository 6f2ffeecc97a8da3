"""The whole BEVFormer (test config) as one bevir graph reproduces the PyTorch model."""
import copy
import functools
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import bevir
from bevir.passes.quant_config import QuantConfig

from examples.bevformer import e2e
from examples.bevformer import model as model_module
from examples.bevformer.config import CONFIGS
from examples.bevformer.decode import compare_detections, decode
from examples.bevformer.inputs import make_inputs
from examples.bevformer.weights import build_model, make_checkpoint, save_checkpoint
from tests.e2e_digests import e2e_argv, output_digests, platform_key, stored

CFG = CONFIGS["test"]

# ---- requirements ----------------------------------------------------------------------------
#: float: the golden float32 graph is as accurate as PyTorch's float32 run of the same model,
#: both measured against its float64 run: at most one bit lost (factor 2) in the max abs error
#: per output. Measured on `test` (golden / PyTorch): 0.54..1.57, i.e. at most 0.65 bit.
FLOAT_ERROR_FACTOR = 2.0
#: INT8 against the float golden, on `test` with the conditioned synthetic weights (measured:
#: BEV IoU 8/10 both ways round, mean IoU 0.602, label 10/10, score diff max 0.012 mean 0.008,
#: SQNR cls 37.4 dB bbox 35.2 dB; the plain preset gave 7/10, 0.511, 2/10, 0.061, 0.024,
#: 28.2 and 31.3 dB):
#: - the reference flow's check (its notebook, step 5: MIN_IOU_MATCH = 8): at least 8 of the
#:   top-10 boxes match by BEV IoU > 0.5. Margin 0: the synthetic model sits at the bound.
INT8_MIN_IOU_MATCH = 8
#: - mean IoU of the top-10 best matches at least the reference flow's per-box match
#:   threshold (0.5): the average box would pass (its passing run: 0.867). Margin 0.102.
INT8_MIN_MEAN_IOU = 0.5
#: - top-10 score difference no larger than in the reference flow's passing INT8 run
#:   (4-core vs CPU: max 0.071, mean 0.0267). Margins 0.059 and 0.019.
INT8_MAX_SCORE_DIFF, INT8_MEAN_SCORE_DIFF = 0.071, 0.0267
#: - label match (no figure stated by the reference flow): its passing run's 8/10. (Chance
#:   is 1/10 a position with 10 classes: 8 or more of 10 by chance has probability 4e-7.)
#:   Margin 2.
INT8_MIN_LABEL_MATCH = 8
#: - SQNR (no figure stated): a floor, output error power at most 1 % of the signal (20 dB).
#:   Below it the error is a fault rather than rounding: one INT8 rounding is 50 dB
#:   (6.02 * 8 + 1.76) and the model costs 40 dB noise only 2 dB (float_noise_sensitivity).
#:   Margins 17.4 and 15.2 dB.
INT8_MIN_SQNR_DB = 20.0
#: - the INT8 backbone and neck (per-tensor weights and activations) against the float ones:
#:   the stand-in's goal, a trained model's figure (measured 32.1 dB; 25.7 on `tiny`).
INT8_MIN_NECK_SQNR_DB = 25.0


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=0).eval()


class _Float64Torch(types.ModuleType):
    """torch, with float32 meaning float64: the model's explicit float32 tensors (grids,
    reference points) follow a float64 run."""
    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture(scope="module")
def float64_outputs(model):
    """with_prev -> (cls_scores, bbox_preds) of the model run in float64 (once per input set)."""
    return functools.cache(lambda with_prev: float64_reference(
        model, model_args(make_inputs(CFG, 0, with_prev_bev=with_prev))))


def model_args(inputs: dict) -> tuple:
    return inputs["img"], inputs["lidar2img"], inputs["can_bus"], inputs.get("prev_bev")


def float64_reference(model, args) -> tuple[np.ndarray, np.ndarray]:
    """The same model and inputs evaluated in float64."""
    with pytest.MonkeyPatch.context() as m, torch.no_grad():
        m.setattr(model_module, "torch", _Float64Torch("torch"))
        out = copy.deepcopy(model).double()(*[a if a is None else a.double() for a in args])
    return tuple(o.numpy() for o in out)


@pytest.mark.parametrize("decompose", [False, True], ids=["custom-ops", "decomposed"])
@pytest.mark.parametrize("with_prev", [True, False], ids=["prev_bev", "first-frame"])
def test_one_graph_matches_pytorch(model, float64_outputs, tmp_path, decompose, with_prev):
    inputs = make_inputs(CFG, 0, with_prev_bev=with_prev)
    graph = e2e.build_graph(model, inputs, tmp_path, decompose=decompose)
    assert [v.name for v in graph.inputs] == ["img", "lidar2img", "can_bus"] + ["prev_bev"] * with_prev
    golden = bevir.run(graph, e2e.golden_inputs(graph, inputs))
    with torch.no_grad():
        cls, bbox = model(*model_args(inputs))
    for name, torch32, exact in zip(("cls_scores", "bbox_preds"), (cls, bbox),
                                    float64_outputs(with_prev)):
        assert exact.dtype == np.float64
        err_golden = np.abs(golden[name] - exact).max()
        err_torch = np.abs(torch32.numpy() - exact).max()
        print(f"\n{name}: max |golden - f64| {err_golden:.3g}, |torch32 - f64| {err_torch:.3g}, "
              f"|golden - torch32| {np.abs(golden[name] - torch32.numpy()).max():.3g}")
        assert err_torch > 0, name                   # the reference really ran in float64
        assert err_golden <= FLOAT_ERROR_FACTOR * err_torch, name
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


@pytest.fixture(scope="module")
def e2e_out(tmp_path_factory) -> Path:
    """The e2e script's output folder: the CLI run with an official-style .pth checkpoint
    (here the seed-0 synthetic weights)."""
    out = tmp_path_factory.mktemp("e2e")
    assert e2e.main(e2e_argv(out)) == 0
    return out


def test_e2e_script_writes_its_artifacts(e2e_out):
    tmp_path = e2e_out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["weights"] == {"synthetic": "false", "source": str(tmp_path / "weights.pth")}
    for name in ("checkpoint.safetensors", "test_vectors.safetensors", "config.json", "model.bevir",
                 "model.safetensors", "golden_outputs.safetensors", "int8_outputs.safetensors",
                 "report.json", "backbone_int8.onnx", "model_int8.bevir", "int8_layers.json",
                 "int8_layers.png"):
        assert (tmp_path / name).exists(), name
    assert report["comparison"]["bev_iou_match"] == 10
    int8 = report["int8"]
    assert int8["fx_ops"] > 100 and int8["quantize"]["lowered-gemm"] > 0
    assert min(int8["sqnr_db"].values()) > INT8_MIN_SQNR_DB
    cmp = int8["comparison"]
    back = int8["comparison_float_first"]           # the same check, the other way round
    assert (back["num_a"], back["num_b"]) == (cmp["num_b"], cmp["num_a"])
    assert int8["check"] == {"bev_iou_match_both_ways": min(cmp["bev_iou_match"], back["bev_iou_match"]),
                             "min_iou_match": INT8_MIN_IOU_MATCH,
                             "passed": min(cmp["bev_iou_match"], back["bev_iou_match"]) >= INT8_MIN_IOU_MATCH}
    assert cmp["mean_iou"] >= INT8_MIN_MEAN_IOU
    assert cmp["score_diff_max"] <= INT8_MAX_SCORE_DIFF
    assert cmp["score_diff_mean"] <= INT8_MEAN_SCORE_DIFF
    # the INT8 backbone hands over through one bridge; what stays float between the image
    # and the outputs is the box decoding (host post-processing in the reference flow)
    q = bevir.load(tmp_path / "model_int8.bevir")
    bevir.verify(q)
    assert q.op_counts()["fx_bridge"] == 1 and q.op_counts()["qlinear_conv"] > 10
    cfg = QuantConfig.preset("reference-flow")
    left = bevir.passes.float_ops_between(q, ["img"]).nodes
    decoding = [n for n in left if n.op != "fx_dequantize"]
    assert decoding and {cfg.rule_for(n).name for n in decoding} == {"box-decoding"}
    # the other float values are the conversions into it
    assert all({cfg.rule_for(u).name for u in n.output.users} == {"box-decoding"}
               for n in left if n.op == "fx_dequantize")
    assert int8["float_on_path"] == bevir.passes.float_ops_between(q, ["img"]).counts()
    assert len(int8["worst_layers"]) == 5 and all(w["group"] for w in int8["worst_layers"])
    assert not {w["op"] for w in int8["worst_layers"]} & set(e2e.CONVERSIONS)
    sens = int8["float_noise_sensitivity_40db"]
    assert set(sens) == {"cls_scores", "bbox_preds"} and all(v > 0 for v in sens.values())
    # noise 40 dB below each of the 19 convolutions' inputs leaves the neck below 40 dB
    (neck,) = int8["backbone_noise_sensitivity_40db"].values()
    assert 0 < neck < 40
    # the conditioned backbone keeps every C5 channel, and its per-tensor INT8 neck
    # (onnxruntime's QOperator model) is within 25 dB of the float one (issue 20)
    assert report["c5_channels"]["constant"] == 0
    assert int8["sqnr_db"]["feats"] >= INT8_MIN_NECK_SQNR_DB
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


def test_e2e_device_stage_is_bit_exact_and_drawn(e2e_out):
    """The generated 4-core program agrees with the INT8 golden model on every element and
    every detection; cycles, pictures and report.html are written."""
    report = json.loads((e2e_out / "report.json").read_text())
    dev = report["device"]
    assert dev["differing"] == {"cls_scores": 0, "bbox_preds": 0}
    assert dev["comparison"]["bev_iou_match"] == 10 and dev["comparison"]["mean_iou"] == 1.0
    assert dev["comparison"]["top10_label_match"] == 10 and dev["comparison"]["score_diff_max"] == 0
    assert report["detections"]["program"] == report["detections"]["INT8 golden"]
    from safetensors.numpy import load_file
    prog, int8 = (load_file(str(e2e_out / f)) for f in ("program_outputs.safetensors",
                                                        "int8_outputs.safetensors"))
    assert all(np.array_equal(prog[k], int8[k]) for k in int8)
    manifest = json.loads((e2e_out / "program" / "manifest.json").read_text())
    assert manifest["cores"] == 4 and len(manifest["kernels"]) == dev["kernels"] > 50
    cyc = dev["cycles"]
    assert len(cyc["cycles_per_core"]) == 4 and cyc["makespan_cycles"] == max(cyc["cycles_per_core"])
    assert 0 < cyc["utilisation"] <= 1
    assert [r["what"] for r in report["against_reference_flow"]] == ["device build + run, 4 cores"]
    assert set(report["steps_s"]) >= {"float import", "INT8 quantize", "device: compile",
                                      "device: run", "cycle model", "pictures"}
    page = (e2e_out / "report.html").read_text()
    pictures = [f for f, _ in report["pictures"]] + ["int8_layers.png", "cycles/timeline.png",
                                                     "cycles/roofline.png"]
    assert [f for f, _ in report["pictures"]] == ["detections.png", "detections_vs_int8.png",
                                                  "detections_vs_float.png"]
    for f in pictures:
        assert f'src="{f}"' in page and (e2e_out / f).stat().st_size > 10_000, f
    from tests.shared import check_trace      # the traces the report links
    for f in ("cycles/trace.json", "cycles/exec_trace.json"):
        assert f"href='{f}'" in page
        nodes = check_trace(json.loads((e2e_out / f).read_text()))
        assert {pid: sum(c.values()) for pid, c in nodes.items() if pid} == \
            {p["core"] + 1: len(p["steps"]) for p in manifest["programs"]}, f


def test_e2e_reports_the_scene_objects(e2e_out):
    """The report counts, per model, the synthetic scene's objects found above the score
    threshold and the other boxes above it and says what the threshold separates; the
    program's count is the INT8 golden model's (bit-exact outputs)."""
    from examples.bevformer.inputs import scene_boxes
    report = json.loads((e2e_out / "report.json").read_text())
    scene = report["scene_objects"]
    assert scene["objects"] == len(scene_boxes(0, "test")["scores"]) > 0
    assert set(scene["found"]) == {"float", "INT8 golden", "program"}
    for name, f in scene["found"].items():
        assert f["found"] + len(f["missed"]) == scene["objects"] and len(f["scores"]) == f["found"]
        assert all(v >= scene["threshold"] for v in f["scores"]), name
        assert f["best_other"] >= scene["threshold"] or f["extra"] == 0, name
    assert scene["found"]["program"] == scene["found"]["INT8 golden"]
    page = (e2e_out / "report.html").read_text()
    assert f"holds {scene['objects']} objects" in page and "--score-threshold" in page


def test_e2e_detections_sit_on_the_scene_objects(e2e_out):
    """The program's boxes above the score threshold sit on the synthetic scene's objects
    (most of them found, no box elsewhere), as the INT8 golden and float models' do, and
    INT8 finds as many as float; the report says so in words."""
    scene = json.loads((e2e_out / "report.json").read_text())["scene_objects"]
    found = scene["found"]
    assert set(found) == {"float", "INT8 golden", "program"} and scene["objects"] >= 3
    for name, f in found.items():
        assert f["found"] >= scene["objects"] - 1 and f["extra"] == 0, (name, f)
        assert f["best_other"] < scene["threshold"] <= min(f["scores"]), (name, f)
    assert found["program"] == found["INT8 golden"]
    assert found["INT8 golden"]["found"] == found["float"]["found"]     # INT8 loses none
    page = (e2e_out / "report.html").read_text()
    assert f"holds {scene['objects']} objects" in page and "--score-threshold" in page


def test_e2e_outputs_match_the_stored_digests(e2e_out):
    """Float golden and INT8 outputs byte-identical to the digests stored for this platform
    (tests/e2e_digests.py: regenerate only for an intended numerics change)."""
    digests = stored()
    if digests is None:
        pytest.skip(f"no stored e2e digests for platform '{platform_key()}': "
                    "python -m tests.e2e_digests adds them")
    assert output_digests(e2e_out) == digests


@pytest.mark.xfail(strict=False, reason=(
    "the synthetic test model sits at INT8_MIN_IOU_MATCH (8/10 both ways round with the "
    "conditioned weights here; the plain preset swung between 5 and 8 of 10 with float "
    "rounding alone), so float rounding of another processor can take it below"))
def test_int8_top10_matches_pass_the_reference_flows_check(e2e_out):
    int8 = json.loads((e2e_out / "report.json").read_text())["int8"]
    cmp, back = int8["comparison"], int8["comparison_float_first"]
    print(f"INT8 vs float top-10: BEV IoU {cmp['bev_iou_match']}/10 (float first "
          f"{back['bev_iou_match']}/10), label {cmp['top10_label_match']}/10")
    assert int8["check"]["passed"]
    assert cmp["top10_label_match"] >= INT8_MIN_LABEL_MATCH


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
