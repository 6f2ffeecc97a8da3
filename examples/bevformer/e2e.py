"""BEVFormer-tiny end to end: PyTorch model -> one bevir graph -> golden model, compared.

    python examples/bevformer/e2e.py --config test|tiny --out DIR [--seed 0] [--decompose]
                                     [--checkpoint bevformer_tiny_epoch_24.pth | --weights plain]
                                     [--hw "QC-U 8MB 16MAC x4"] [--cores N] [--score-threshold T]

Steps (the reference notebook's): make synthetic weights (seed) or load a checkpoint
(.pth via torch.load(weights_only=True), or .safetensors), and the test vectors;
export the backbone to ONNX and import it with bevir.from_onnx; import the head (encoder,
decoder, branches) with bevir.from_torch, its attention modules as custom ops; link both
into one verified graph; run the PyTorch reference and the bevir golden model; quantize
(INT8 backbone by onnxruntime, fixed-point head) and run the INT8 golden model; compile for
the GPNPU (partition, memory plan, per-core C programs through TVM), run the generated
program and check it against the INT8 golden model bit for bit; model its cycles; draw the
detections. Each step prints its time; the last table sets them beside the reference
flow's.

Writes into DIR: checkpoint.safetensors, test_vectors.safetensors, config.json,
backbone_fp32.onnx (once: the INT8 backbone flow reads it), model.bevir (+ .safetensors),
golden_outputs.safetensors, backbone_int8.onnx and .tranges, model_int8.bevir,
int8_outputs.safetensors, int8_layers.json/.png, program/ (the compiled per-core programs),
program_outputs.safetensors, cycles/ (per-core profiles, timeline.png, roofline.png, the
modelled and the measured traces trace.json and exec_trace.json),
detections*.png, report.json and report.html (all of it on one page).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "examples.bevformer"

import bevir  # noqa: E402
from bevir.fsutil import save_arrays  # noqa: E402
from bevir.passes.quant_config import QuantConfig  # noqa: E402
from bevir.passes.quantize import load_config  # noqa: E402
from bevir.scale import FrameFeed, ScaleError  # noqa: E402
from bevir.sim.compare import compare_graphs  # noqa: E402

from .config import CONFIGS, BEVFormerConfig  # noqa: E402
from .custom_ops import CUSTOM_OPS  # noqa: E402
from .decode import (FOUND_WITHIN_M, compare_detections, decode, found_objects,  # noqa: E402
                     print_comparison, print_detections)
from .inputs import make_inputs, save_test_vectors, scene_boxes  # noqa: E402
from .model import BEVFormer, split_model  # noqa: E402
from .report import reference_note, threshold_note  # noqa: E402
from . import quant  # noqa: E402,F401  (registers the reference-flow preset and inverse_sigmoid)
from .weights import PRESETS, build_model, save_checkpoint  # noqa: E402

HEAD_INPUTS = ("feats", "lidar2img", "can_bus", "prev_bev")
OUTPUTS = ("cls_scores", "bbox_preds")


def import_backbone(model: BEVFormer, img: torch.Tensor, path: Path) -> bevir.Graph:
    """torch -> ONNX -> bevir, as in the reference flow: img [6,3,H,W] -> feats [6,C,h,w]."""
    bevir.flows.backbone.export_onnx(split_model(model)[0], img.numpy(), path)
    return bevir.from_onnx(path)


def import_head(model: BEVFormer, feats: torch.Tensor, inputs: dict, decompose: bool = False
                ) -> bevir.Graph:
    """torch.export -> bevir: (feats, lidar2img, can_bus[, prev_bev]) -> (cls_scores,
    bbox_preds)."""
    with_prev = "prev_bev" in inputs
    _, head = split_model(model, with_prev_bev=with_prev)
    args = (feats, inputs["lidar2img"], inputs["can_bus"], inputs.get("prev_bev"))
    return bevir.from_torch(head, args, custom_ops=None if decompose else CUSTOM_OPS,
                            input_names=[n for n, a in zip(HEAD_INPUTS, args) if a is not None],
                            output_names=list(OUTPUTS), name="bevformer_head")


#: the backbone's FP32 ONNX export in a work folder (the name the INT8 backbone flow gives it)
BACKBONE_ONNX = "backbone_fp32.onnx"


def build_graph(model: BEVFormer, inputs: dict, workdir: Path, decompose: bool = False,
                backbone: bevir.Graph | None = None) -> bevir.Graph:
    """The whole model as one verified graph: (img, lidar2img, can_bus[, prev_bev]) -> outputs.
    ``backbone``: an imported backbone graph to use (e.g. the INT8 one), else the FP32 export
    (written to ``workdir / BACKBONE_ONNX``, where :func:`int8_graph` may take it from)."""
    if backbone is None:
        backbone = import_backbone(model, inputs["img"], workdir / BACKBONE_ONNX)
    with torch.no_grad():
        feats = split_model(model)[0](inputs["img"])
    head = import_head(model, feats, inputs, decompose)
    graph = bevir.compose(backbone, head, {"feats": "feats"}, name="bevformer")
    bevir.verify(graph)
    return graph


#: the INT8 flow after the INT8 backbone import: attention modules decomposed and fused, one
#: calibration forward pass (between the two pipelines), the reference-flow QuantConfig,
#: then the integer clean-up (the relus sunk below their dequantization become clamps of
#: the QLinear ops that make them, bit for bit) and the backbone bridge
INT8_PREPARE = "decompose,canonicalize,fuse,cse,dce"
INT8_FINISH = "sink-dequantize,fuse{enable=fuse-qlinear-clip},insert-bridges,cse,dce"
#: the reference flow's validation: at least this many of the top 10 match by BEV IoU > 0.5
REFERENCE_MIN_IOU_MATCH = 8
#: the worst layers printed and labelled in int8_layers.png
WORST_LAYERS = 5
#: ops that only convert between number formats: not what a worst layer is (their error is
#: their operand's format's)
CONVERSIONS = ("quantize", "dequantize", "fx_quantize", "fx_dequantize", "fx_requantize",
               "fx_bridge")


#: frames whose images calibrate the backbone (onnxruntime's calibrator, one process)
BACKBONE_CALIBRATION_FRAMES = 8


def int8_graph(model: BEVFormer, inputs: dict, feed: dict | FrameFeed, workdir: Path,
               config: QuantConfig | str = "reference-flow", progress: bool | None = None,
               fp32_onnx: Path | None = None
               ) -> tuple[bevir.Graph, dict, bevir.flows.QuantizedBackbone | None]:
    """The model quantized as the reference flow does: the backbone to INT8 ONNX by
    onnxruntime (calibrated on the frame's images) and imported, the head linked to it, one
    calibration forward pass, the head lowered to fixed point by ``config``, the hand-over
    bridged. The config's rule with affine activations (``backbone``) says how: its weights
    per tensor or per channel, or excluded (the FP32 backbone stays). ``feed``: the frame's
    golden inputs, or a frame set's frames (a ``bevir.scale.FrameFeed``: the head
    calibrated on all of them, on its workers; the backbone on the images of the first
    ``BACKBONE_CALIBRATION_FRAMES``). ``fp32_onnx``: the backbone's FP32 export of this
    model where :func:`build_graph` wrote it (``workdir / BACKBONE_ONNX``), else it is
    exported again. Returns (graph, quantize statistics, the backbone flow's result or
    None)."""
    from bevir.passes.quantize import quantize
    config = load_config(config)
    affine = next((r for r in config.rules if r.activations == "affine"), None)
    qb = None
    if affine is not None and not affine.exclude:
        images = (inputs["img"].numpy() if not isinstance(feed, FrameFeed) else
                  [feed.frames[i]["img"] for i in feed.indices[:BACKBONE_CALIBRATION_FRAMES]])
        qb = bevir.flows.quantize_backbone(fp32_onnx or split_model(model)[0], images, workdir,
                                           per_channel=affine.weights == "per_channel",
                                           progress=progress)
    q = build_graph(model, inputs, workdir, backbone=qb.graph if qb else None)
    bevir.optimize(q, INT8_PREPARE)
    bevir.calibrate(q, feed, progress=progress)
    if isinstance(feed, FrameFeed) and feed.failures:
        raise ScaleError(f"{len(feed.failures)} calibration frame(s) failed; the first: "
                         f"{feed.failures[0]}")
    stats = quantize(q, config)
    bevir.optimize(q, INT8_FINISH)
    bevir.verify(q)
    return q, stats, qb


def int8_frame(config: str | BEVFormerConfig, seed: int = 0) -> tuple[bevir.Graph, dict]:
    """The seed-``seed`` synthetic model of ``config`` quantized as the reference flow does
    (:func:`int8_graph`, in a temporary folder), and its frame's golden inputs."""
    import tempfile
    config = CONFIGS[config] if isinstance(config, str) else config
    model = build_model(config, seed).eval()
    inputs = make_inputs(config, seed, with_prev_bev=True)
    feed = {k: inputs[k].numpy() for k in ("img", "lidar2img", "can_bus", "prev_bev")}
    with tempfile.TemporaryDirectory() as d:
        q, _, _ = int8_graph(model, inputs, feed, Path(d))
    return q, feed


def int8_figures(float_out: dict, int8_out: dict, q: bevir.Graph, stats: dict,
                 config: BEVFormerConfig) -> dict:
    """The reference flow's check, INT8 golden against the float reference, both ways
    round (``comparison``: INT8 first, as the reference flow orders device and reference;
    ``comparison_float_first``), and ``check``, which passes when the stricter of the two
    keeps REFERENCE_MIN_IOU_MATCH of the top 10; plus SQNR and the float ops left between
    the image and the outputs."""
    from bevir.sim.compare import layer_error
    det_int8 = decode(int8_out["cls_scores"], int8_out["bbox_preds"], config)
    det_float = decode(float_out["cls_scores"], float_out["bbox_preds"], config)
    cmp, back = compare_detections(det_int8, det_float), compare_detections(det_float, det_int8)
    worst = min(cmp["bev_iou_match"], back["bev_iou_match"])
    sqnr = {k: layer_error(float_out[k], int8_out[k])[0] for k in OUTPUTS}
    counts = q.op_counts()
    return {"comparison": cmp, "comparison_float_first": back,
            "check": {"bev_iou_match_both_ways": worst, "min_iou_match": REFERENCE_MIN_IOU_MATCH,
                      "passed": worst >= REFERENCE_MIN_IOU_MATCH},
            "sqnr_db": sqnr, "quantize": stats,
            "fx_ops": sum(v for k, v in counts.items() if k.startswith("fx_")),
            "float_on_path": bevir.passes.float_ops_between(q, ["img"]).counts(),
            "nodes": len(q.nodes)}


#: what ``--override GROUP=HOW`` changes in the group
OVERRIDES = {"per_channel": {"weights": "per_channel", "exclude": False},
             "per_tensor": {"weights": "per_tensor", "exclude": False},
             "fixed16": {"activations": "fixed16", "exclude": False},
             "exclude": {"exclude": True}}


def overridden(config: QuantConfig, overrides: list[str]) -> QuantConfig:
    """``config`` with ``GROUP=per_channel|per_tensor|fixed16|exclude`` overrides applied."""
    for item in overrides:
        group, _, how = item.partition("=")
        if how not in OVERRIDES:
            raise SystemExit(f"--override {item}: expected GROUP={'|'.join(OVERRIDES)}")
        config = config.override(group, **OVERRIDES[how])
    return config


def golden_inputs(graph: bevir.Graph, inputs: dict) -> dict[str, np.ndarray]:
    return {v.name: inputs[v.name].numpy() for v in graph.inputs}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def c5_channels(c5: torch.Tensor) -> dict[str, int]:
    """The backbone's C5 channels on the frame: how many, and how many are constant
    (standard deviation below 1e-3 of the mean's magnitude: they carry no information)."""
    mean, std = c5.double().mean((0, 2, 3)), c5.double().std((0, 2, 3))
    return {"channels": int(c5.shape[1]), "constant": int((std <= 1e-3 * mean.abs() + 1e-12).sum())}


def _perturbed_sqnr(run, modules: list[nn.Module], names: tuple[str, ...], snr_db: float,
                    seed: int) -> dict[str, float]:
    """SQNR (dB) of ``run()``'s results (named ``names``) when Gaussian noise ``snr_db``
    below the rms of each of ``modules``' first input is added there."""
    from bevir.sim.compare import layer_error
    g = torch.Generator().manual_seed(seed)
    rel = 10.0 ** (-snr_db / 20)

    def perturb(_mod, args):
        x = args[0]
        return (x + rel * x.pow(2).mean().sqrt() * torch.randn(x.shape, generator=g),) + args[1:]
    with torch.no_grad():
        ref = run()
        hooks = [m.register_forward_pre_hook(perturb) for m in modules]
        try:
            out = run()
        finally:
            for h in hooks:
                h.remove()
    return {k: layer_error(r.numpy(), o.numpy())[0] for k, r, o in zip(names, ref, out)}


def noise_sensitivity(model: BEVFormer, inputs: dict, snr_db: float = 40.0, seed: int = 0
                      ) -> dict[str, float]:
    """SQNR (dB) of the float model's outputs when Gaussian noise ``snr_db`` below each
    decoder layer's input is added there: how much the model itself amplifies small
    errors. INT8 activations are ~30-40 dB; a model whose outputs fall far below that
    from 40 dB noise cannot pass an INT8 validation whatever the quantization."""
    from .model import DecoderLayer
    args = (inputs["img"], inputs["lidar2img"], inputs["can_bus"], inputs["prev_bev"])
    layers = [m for m in model.modules() if isinstance(m, DecoderLayer)]
    return _perturbed_sqnr(lambda: model(*args), layers, OUTPUTS, snr_db, seed)


def backbone_noise_sensitivity(model: BEVFormer, inputs: dict, snr_db: float = 40.0,
                               seed: int = 0) -> dict[str, float]:
    """SQNR (dB) of the neck's output (``feats``) when Gaussian noise ``snr_db`` below each
    backbone and neck convolution's input is added there, as INT8 quantizes each of them:
    the neck SQNR the backbone allows an activation format of that precision (8-bit
    per-tensor activations give ~27-35 dB on these heavy-tailed maps)."""
    convs = [m for part in (model.img_backbone, model.img_neck) for m in part.modules()
             if isinstance(m, nn.Conv2d)]
    return _perturbed_sqnr(lambda: (model.backbone(inputs["img"]),), convs, ("feats",), snr_db,
                           seed)


#: the reference flow's times where its notebook states one: (what, the steps of this flow
#: that do the same, seconds, the config it ran). Its step 4 prints "Running full E2E on ISS
#: - 4-core (~60 min)", for BEVFormer-tiny.
REFERENCE_TIMES = [("device build + run, 4 cores", ("device: compile", "device: run"), 3600.0,
                    "tiny")]

DEFAULT_HW = "QC-U 8MB 16MAC x4"


class Steps:
    """The flow's steps: each prints its name as it starts and its time as it ends; the
    times are kept for the report."""

    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, name: str, fn):
        print(f"\n== {name}", flush=True)
        result, self.times[name] = timed(fn)
        print(f"   ({name}: {self.times[name]:.2f} s)", flush=True)
        return result

    def against_reference(self, config: str) -> list[dict]:
        """The reference flow's stated times beside this run's time for the same work; the
        ratio only where this run is of the config the reference flow ran (else None)."""
        rows = []
        for what, spans, ref, ref_config in REFERENCE_TIMES:
            if all(s in self.times for s in spans):
                t = sum(self.times[s] for s in spans)
                rows.append({"what": what, "bevir_s": t, "reference_s": ref,
                             "reference_config": ref_config, "config": config,
                             "ratio": t / ref if config == ref_config else None})
        return rows

    def table(self, config: str) -> str:
        rows = [f"  {name:<30} {t:8.2f} s" for name, t in self.times.items()]
        rows.append(f"  {'total':<30} {sum(self.times.values()):8.2f} s")
        rows += [f"  {r['what']:<30} {r['bevir_s']:8.2f} s   {reference_note(r)}"
                 for r in self.against_reference(config)]
        return "\n".join(rows)


def int8_reference(graph: bevir.Graph) -> bevir.Graph:
    """The float graph the INT8 one is compared with, value by value: the same preparation
    (decompose, fuse) before quantization."""
    reference = graph.clone()
    bevir.optimize(reference, INT8_PREPARE)
    return reference


def int8_stage(model: BEVFormer, inputs: dict, graph: bevir.Graph, feed: dict, golden: dict,
               config: BEVFormerConfig, out: Path, quant_config: QuantConfig,
               steps: Steps | None = None) -> tuple[dict, dict]:
    """INT8 golden vs float reference: quantize, run, compare the detections and every
    layer; writes int8_outputs.safetensors, int8_layers.json and int8_layers.png.
    Returns (figures, the INT8 golden outputs, the INT8 graph)."""
    steps = steps or Steps()
    q, stats, qb = steps("INT8 quantize", lambda: int8_graph(model, inputs, feed, out, quant_config,
                                                             fp32_onnx=out / BACKBONE_ONNX))
    bevir.save(q, out / "model_int8.bevir")
    int8_out = steps("INT8 golden run", lambda: bevir.run(q, feed))
    t_quant, t_int8 = steps.times["INT8 quantize"], steps.times["INT8 golden run"]
    save_arrays({k: int8_out[k] for k in OUTPUTS}, out / "int8_outputs.safetensors")
    figures = int8_figures(golden, int8_out, q, stats, config)
    figures["time_s"] = {"quantize": t_quant, "int8_golden": t_int8}
    figures["float_noise_sensitivity_40db"] = noise_sensitivity(model, inputs)
    figures["backbone_noise_sensitivity_40db"] = backbone_noise_sensitivity(model, inputs)
    reference = int8_reference(graph)
    layers = compare_graphs(reference, q, feed)
    figures["sqnr_db"]["feats"] = layers["feats"].sqnr_db      # the INT8 backbone + neck
    layers.save_json(out / "int8_layers.json")
    layers.plot(out / "int8_layers.png", title=f"INT8 vs float, per layer ({config.name})",
                label_worst=WORST_LAYERS, skip_ops=CONVERSIONS)
    figures["worst_layers"] = [       # ranked by their own (teacher-forced) error
        {"layer": e.layer, "op": e.op, "local_sqnr_db": e.local_sqnr_db, "sqnr_db": e.sqnr_db,
         "group": quant_config.rule_for(reference.value(e.value).producer).name}
        for e in layers.worst(WORST_LAYERS, skip_ops=CONVERSIONS)]
    conversions = [e for e in layers.layers if e.op in CONVERSIONS]
    figures["worst_conversion"] = min(
        ({"layer": e.layer, "op": e.op, "sqnr_db": e.sqnr_db} for e in conversions),
        key=lambda w: w["sqnr_db"], default=None)
    print("INT8 golden vs float reference:")
    print_comparison(figures["comparison"], "INT8 golden", "float golden")
    back, check = figures["comparison_float_first"], figures["check"]
    print(f"  the other way round (float first): BEV IoU match {back['bev_iou_match']}/10 "
          f"(mean IoU={back['mean_iou']:.3f}), labels {back['top10_label_match']}/10")
    print(f"  [{'PASS' if check['passed'] else 'FAIL'}] the reference flow's check, both ways: "
          f"{check['bev_iou_match_both_ways']}/10 (threshold {check['min_iou_match']})")
    print(f"  SQNR: cls {figures['sqnr_db']['cls_scores']:.1f} dB, bbox "
          f"{figures['sqnr_db']['bbox_preds']:.1f} dB; {figures['fx_ops']} fixed-point ops; "
          f"float between image and outputs: {figures['float_on_path'] or 'none'}")
    sens = figures["float_noise_sensitivity_40db"]
    print(f"  float model with 40 dB noise at each decoder layer: cls {sens['cls_scores']:.1f} dB, "
          f"bbox {sens['bbox_preds']:.1f} dB (how far the model itself amplifies errors)")
    print(f"  INT8 backbone and neck: {figures['sqnr_db']['feats']:.1f} dB; float backbone with "
          f"40 dB noise at each convolution's input: neck "
          f"{figures['backbone_noise_sensitivity_40db']['feats']:.1f} dB")
    print("  worst layers (re-run with --override GROUP=per_channel|fixed16|exclude):")
    print("    local  accumulated (dB)")
    for w in figures["worst_layers"]:
        local = "-" if w["local_sqnr_db"] is None else f"{w['local_sqnr_db']:.1f}"
        print(f"    {local:>5}  {w['sqnr_db']:5.1f}  {w['op']:<18} {w['layer']}  [{w['group']}]")
    conv = figures["worst_conversion"]
    if conv:
        print(f"  format conversions are not ranked (grey in int8_layers.png: their error is "
              f"their operand's format's); the lowest: {conv['sqnr_db']:.1f} dB, {conv['op']} "
              f"{conv['layer']}")
    return figures, int8_out, q


def device_stage(q: bevir.Graph, feed: dict, int8_out: dict, config: BEVFormerConfig, out: Path,
                 hw: str, steps: Steps, progress: bool | None = None) -> tuple[dict, dict]:
    """The INT8 graph on the GPNPU: partitioned for ``hw``, memory-planned, compiled to
    per-core C programs (out/program), run, checked against the INT8 golden model
    element by element and detection by detection; its cycles modelled (out/cycles).
    Returns (figures, the program's outputs)."""
    from bevir.flows.target import hw_config
    from bevir.target.cycles import model as cycle_model
    from bevir.target.trace import model_trace
    prog = steps("device: compile", lambda: bevir.compile(q, out / "program", hw=hw,
                                                          progress=progress))
    dev = steps("device: run", lambda: prog.run(feed))
    save_arrays({k: dev[k] for k in OUTPUTS}, out / "program_outputs.safetensors")
    differing = {k: int(np.count_nonzero(dev[k] != int8_out[k])) for k in OUTPUTS}
    cmp = compare_detections(decode(dev["cls_scores"], dev["bbox_preds"], config),
                             decode(int8_out["cls_scores"], int8_out["bbox_preds"], config))
    print("generated program vs INT8 golden model:")
    print(f"  differing elements: {differing} of "
          f"{ {k: int(dev[k].size) for k in OUTPUTS} }")
    print_comparison(cmp, "program", "INT8 golden")
    profile = steps("cycle model", lambda: cycle_model(prog.graph, hw_config(hw)))
    profile.write(out / "cycles")
    model_trace(profile).write(out / "cycles" / "trace.json")
    prog.trace().write(out / "cycles" / "exec_trace.json")       # the run above, measured
    summary = profile.summary()
    print(f"  {summary['hw_string']}: makespan {summary['makespan_cycles']:,} cycles "
          f"({summary['makespan_ms']:.2f} ms), per core "
          f"{', '.join(f'{c:,}' for c in summary['cycles_per_core'])}; "
          f"utilisation {summary['utilisation']:.1%}")
    for r in summary["top_ops"][:3]:
        print(f"    {r['cycles']:>12,} cycles  core {r['core']}  {r['op']:<16} {r['loc']}  "
              f"[{r['bound']}-bound]")
    m = prog.manifest
    figures = {"hw": hw, "differing": differing, "comparison": cmp,
               "kernels": len(m["kernels"]), "program_dir": str(out / "program"),
               "cycles": {k: summary[k] for k in ("makespan_cycles", "cycles_per_core",
                                                  "wait_cycles_per_core", "makespan_ms",
                                                  "utilisation", "macs", "ddr_bytes",
                                                  "cycles_by_bound", "top_ops")}}
    return figures, dev


def scene_objects(detections: dict[str, dict], scene: dict, threshold: float,
                  config: BEVFormerConfig) -> dict:
    """How many of the synthetic scene's objects each model found (decode.found_objects:
    a detection of the class, score at least ``threshold``, centre within FOUND_WITHIN_M)."""
    return {"objects": len(scene["scores"]), "threshold": threshold,
            "within_m": FOUND_WITHIN_M, "kept": config.max_num,
            "found": {name: found_objects(d, scene, threshold) for name, d in detections.items()}}


def print_scene_objects(figures: dict) -> None:
    found, t = figures["found"], figures["threshold"]
    print(f"the scene's {figures['objects']} objects found (a detection of the class, score >= "
          f"{t}, centre within {figures['within_m']:g} m): " + ", ".join(
              f"{name} {f['found']}/{f['objects']}" for name, f in found.items())
          + "; other detections >= " + f"{t}: " + ", ".join(
              f"{name} {f['extra']}" for name, f in found.items()))
    print("  " + threshold_note(figures))


def pictures(out: Path, inputs: dict, config: BEVFormerConfig, detections: dict[str, dict],
             scene: dict, threshold: float) -> list[tuple[str, str]]:
    """The reference flow's three Figure-7 views of ``detections`` (name -> decoded): the
    deployed result beside the scene's objects (the ground truth), against the INT8 golden
    model, against the float model. Returns (file, caption) of each picture written."""
    from .visualize import View, camera_images, figure7, filter_by_score
    images = camera_images(inputs["img"].numpy(), config)
    l2i = inputs["lidar2img"].numpy()
    main = "program" if "program" in detections else "INT8 golden"
    colors = {"program": ("#d62728", "red"), "INT8 golden": ("#1f77b4", "blue"),
              "float": ("#2ca02c", "green"), "scene": ("#ffd700", "gold")}
    views = {k: View(filter_by_score(d, threshold), k, colors[k][0])
             for k, d in detections.items()}
    views["scene"] = View(scene, "scene's objects", colors["scene"][0], dashed=True)
    figs = [("detections.png", [main, "scene"], f"{main} ({colors[main][1]}, score >= "
             f"{threshold}) and the scene's objects ({colors['scene'][1]}, dashed)")]
    figs += [(f"detections_vs_{other.split()[0].lower()}.png", [main, other],
              f"{main} ({colors[main][1]}) against {other} ({colors[other][1]}) "
              f"(score >= {threshold})")
             for other in ("INT8 golden", "float") if other != main]
    written = []
    for fname, names, title in figs:
        figure7(images, l2i, [views[n] for n in names], config, out / fname, title)
        written.append((fname, title))
    return written


def run(config: BEVFormerConfig, out: Path, seed: int = 0, decompose: bool = False,
        quant_config: QuantConfig | None = None, checkpoint: Path | None = None,
        hw: str | None = DEFAULT_HW, score_threshold: float = 0.3,
        progress: bool | None = None, weights_preset: str = "conditioned") -> dict:
    """The whole flow into ``out``; weights from ``checkpoint`` if given, else synthetic
    (seed). ``hw`` None stops after the INT8 golden model (no device stage)."""
    quant_config = quant_config or QuantConfig.preset("reference-flow")
    model = build_model(config, seed, checkpoint, weights_preset)  # fails before writing
    out.mkdir(parents=True, exist_ok=True)
    steps = Steps()
    weights = {"synthetic": "false", "source": str(checkpoint)} if checkpoint else \
        {"synthetic": "true", "seed": str(seed), "preset": weights_preset}
    save_checkpoint(out / "checkpoint.safetensors", model.state_dict(),
                    metadata={"config": config.name, **weights})
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    inputs = make_inputs(config, seed, with_prev_bev=True)

    c5 = []                                  # the warm-up forward keeps C5 for the report
    hook = model.img_backbone.register_forward_hook(lambda m, a, out: c5.append(out))
    with torch.no_grad():
        model(inputs["img"], inputs["lidar2img"], inputs["can_bus"], inputs["prev_bev"])  # warm-up
        hook.remove()
        (cls_t, bbox_t), t_torch = timed(lambda: model(inputs["img"], inputs["lidar2img"],
                                                       inputs["can_bus"], inputs["prev_bev"]))
    save_test_vectors(out / "test_vectors.safetensors", inputs, (cls_t, bbox_t),
                      metadata={"config": config.name, "seed": str(seed)})

    graph = steps("float import", lambda: build_graph(model, inputs, out, decompose))
    bevir.save(graph, out / "model.bevir")
    feed = golden_inputs(graph, inputs)
    golden = steps("float golden run", lambda: bevir.run(graph, feed))
    save_arrays({k: golden[k] for k in OUTPUTS}, out / "golden_outputs.safetensors")

    det_t = decode(cls_t, bbox_t, config)
    det_g = decode(golden["cls_scores"], golden["bbox_preds"], config)
    print("PyTorch reference detections:")
    print_detections(det_t)
    print("bevir golden detections:")
    print_detections(det_g)
    cmp = compare_detections(det_g, det_t)
    print_comparison(cmp, "bevir golden", "PyTorch")
    report = {
        "config": config.name, "weights": weights,
        "nodes": len(graph.nodes), "op_counts": graph.op_counts(), "parameters": graph.num_params(),
        "max_abs_diff": {k: float(np.abs(golden[k] - t.numpy()).max())
                         for k, t in zip(OUTPUTS, (cls_t, bbox_t))},
        "comparison": {k: (float(v) if isinstance(v, (float, np.floating)) else v)
                       for k, v in cmp.items()},
        "time_s": {"torch_eager": t_torch, "bevir_golden": steps.times["float golden run"],
                   "import": steps.times["float import"]},
    }
    report["golden_over_torch"] = report["time_s"]["bevir_golden"] / t_torch
    report["c5_channels"] = c5_channels(c5[0])
    print(f"max |golden - torch|: cls {report['max_abs_diff']['cls_scores']:.2e}, "
          f"bbox {report['max_abs_diff']['bbox_preds']:.2e}; golden "
          f"{report['time_s']['bevir_golden']:.2f}s vs torch eager {t_torch:.2f}s")

    report["int8"], int8_out, q = int8_stage(model, inputs, graph, feed, golden, config, out,
                                             quant_config, steps)
    detections = {"float": det_g, "INT8 golden": decode(int8_out["cls_scores"],
                                                        int8_out["bbox_preds"], config)}
    if hw:
        report["device"], dev = device_stage(q, feed, int8_out, config, out, hw, steps, progress)
        detections["program"] = decode(dev["cls_scores"], dev["bbox_preds"], config)
    scene = scene_boxes(seed, config)                  # what the synthetic images show
    report["pictures"] = steps("pictures", lambda: pictures(out, inputs, config, detections,
                                                            scene, score_threshold))
    report["detections"] = {k: len(d["scores"]) for k, d in detections.items()}
    report["scene_objects"] = scene_objects(detections, scene, score_threshold, config)
    print_scene_objects(report["scene_objects"])
    report["steps_s"] = dict(steps.times)
    report["against_reference_flow"] = steps.against_reference(config.name)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    from .report import write_html
    write_html(out / "report.html", report)
    print("\nsteps (this machine; the reference flow's time where its notebook states one):")
    print(steps.table(config.name))
    print(f"wrote {out} (open report.html)")
    return report


def precision_search(config: BEVFormerConfig, out: Path, seed: int, quant_config: QuantConfig,
                     target: str, checkpoint: Path | None = None,
                     weights_preset: str = "conditioned", max_steps: int = 40) -> QuantConfig:
    """The precision search (bevir.passes.precision) on this model's frame: each step
    quantizes with the config, runs the INT8 golden model and measures top10_iou (the
    reference flow's check, the stricter way round), cls_sqnr, bbox_sqnr and its cost,
    ``cycles`` (the GPNPU cycle model, one core); groups are ranked by their worst local
    error; at most ``max_steps`` evaluations. Prints the path, writes ``out/quant_config.json``
    (the last config) and returns it."""
    import tempfile
    from bevir.flows.target import hw_config, simulate
    from bevir.passes.precision import Evaluation, Target, best, search, worst_groups
    from bevir.sim.compare import layer_error
    goal = Target.parse(target)
    hw = hw_config(DEFAULT_HW, cores=1)
    model = build_model(config, seed, checkpoint, weights_preset)
    inputs = make_inputs(config, seed, with_prev_bev=True)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        graph = build_graph(model, inputs, Path(work))
        feed = golden_inputs(graph, inputs)
        golden = bevir.run(graph, feed)
        reference = int8_reference(graph)
        producers = {v.name: v.producer for v in reference.values()}
        det_float = decode(golden["cls_scores"], golden["bbox_preds"], config)

        def evaluate(qc: QuantConfig) -> Evaluation:
            q, _, _ = int8_graph(model, inputs, feed, Path(work), qc, progress=False,
                                 fp32_onnx=Path(work) / BACKBONE_ONNX)
            got = bevir.run(q, feed)
            det = decode(got["cls_scores"], got["bbox_preds"], config)
            iou = min(compare_detections(det, det_float)["bev_iou_match"],
                      compare_detections(det_float, det)["bev_iou_match"])
            report = compare_graphs(reference, q, feed)
            cycles = simulate(q, hw).makespan       # its cost: planned on one core, modelled
            return Evaluation({"top10_iou": iou, "cycles": float(cycles),
                               **{f"{k.split('_')[0]}_sqnr": layer_error(golden[k], got[k])[0]
                                  for k in OUTPUTS}},
                              worst_groups(report, qc, producers.get))
        print(f"\n== precision search for {goal}")
        # whole-box matches move in steps: ties go to the config with the better scores
        steps = search(quant_config, evaluate, goal, max_steps=max_steps,
                       tiebreak=("cls_sqnr", "bbox_sqnr"))
    result = best(steps, goal)
    result.config.save(out / "quant_config.json")
    print(f"   {'met' if result.met else 'not met'} after {len(steps) - 1} step(s) "
          f"(result: {result.change}); wrote {out / 'quant_config.json'} (--quant-config "
          "reproduces it)")
    return result.config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="test", choices=sorted(CONFIGS))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decompose", action="store_true",
                    help="import the attention modules op by op instead of as custom ops")
    ap.add_argument("--quant-config", default="reference-flow",
                    help="a QuantConfig preset name or JSON file")
    ap.add_argument("--override", action="append", default=[],
                    metavar="GROUP=per_channel|per_tensor|fixed16|exclude",
                    help="switch a rule group of the quantization config (repeatable)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="trained weights (.pth or .safetensors) instead of synthetic ones")
    ap.add_argument("--weights", default="conditioned", choices=PRESETS,
                    help="the synthetic weight preset (without --checkpoint)")
    ap.add_argument("--hw", default=DEFAULT_HW,
                    help="the GPNPU (a preset or vendor string) the device stage compiles for")
    ap.add_argument("--cores", type=int, default=None,
                    help="cores of --hw to use (0: no device stage, stop after the INT8 golden "
                         "run)")
    ap.add_argument("--score-threshold", type=float, default=0.3,
                    help="detections drawn in the pictures: score at least this")
    ap.add_argument("--target", metavar="METRIC>=VALUE",
                    help="first search the quantization config for this target (top10_iou: "
                         "the reference flow's check both ways round; cls_sqnr, bbox_sqnr in "
                         "dB), moving the groups with the worst local error one notch a step; "
                         "writes quant_config.json, and the flow then runs with it")
    ap.add_argument("--max-steps", type=int, default=40,
                    help="the most configurations --target evaluates")
    args = ap.parse_args(argv)
    hw = None if args.cores == 0 else args.hw
    out = args.out or Path("out") / f"bevformer_{args.config}"
    try:
        if hw and args.cores:
            from bevir.flows.target import hw_config
            hw = hw_config(hw, args.cores).option_text()
        quant_config = overridden(load_config(args.quant_config), args.override)
        if args.target:
            quant_config = precision_search(CONFIGS[args.config], out, args.seed, quant_config,
                                            args.target, args.checkpoint, args.weights,
                                            args.max_steps)
        run(CONFIGS[args.config], out, args.seed, args.decompose, quant_config,
            args.checkpoint, hw, args.score_threshold, weights_preset=args.weights)
    except (bevir.BevirError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
