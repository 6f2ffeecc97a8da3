"""Sign the INT8 BEVFormer off on a data set, on Ray or in one process.

    python examples/bevformer/signoff.py --config test --out out/signoff_test \\
        [--frames DIR | --scenes 4 --length 50] [--calibration-frames 32] [--limit N] \\
        [--ray [ADDRESS]] [--workers N]

Steps: a frame set (the one given, else a synthetic sequence written with
``sequence.py`` into OUT/frames); the float model as one bevir graph; the INT8 model as the
reference flow builds it, but calibrated on ``--calibration-frames`` frames spread over the
set (the head's ranges measured on the workers and merged exactly; the backbone's by
onnxruntime on the first few frames' images); then every frame evaluated, float against
INT8, on the workers: SQNR of both outputs and the reference flow's top-10 check both
ways. Writes OUT/model.bevir, OUT/model_int8.bevir, OUT/eval/ (per-frame results,
summary.json, iou_matches.png) and OUT/signoff.json (timings and the summary).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "examples.bevformer"

import bevir  # noqa: E402
from bevir.scale import FrameFeed, Frames, Workers  # noqa: E402

from .config import CONFIGS  # noqa: E402
from .e2e import BACKBONE_ONNX, build_graph, int8_graph  # noqa: E402
from .sequence import write_sequence  # noqa: E402
from .weights import build_model  # noqa: E402


def spread(count: int, n: int) -> list[int]:
    """``n`` frame indices evenly spread over ``count`` frames (all when n >= count)."""
    if n >= count:
        return list(range(count))
    return sorted({int(i) for i in np.linspace(0, count - 1, n).round()})


def models(frames: Frames, out: Path, workers: Workers, calibration_frames: int,
           progress: bool | None = None) -> tuple[bevir.Graph, bevir.Graph, dict]:
    """The float and INT8 graphs of the frame set's model (saved in ``out``), the INT8
    one calibrated on ``calibration_frames`` frames of the set; and the seconds each took."""
    out.mkdir(parents=True, exist_ok=True)
    config = CONFIGS[frames.meta["config"]]
    model = build_model(config, frames.meta["model_seed"]).eval()
    inputs = {k: torch.from_numpy(np.array(v)) for k, v in frames[0].items()}
    seconds = {}
    t = time.perf_counter()
    graph = build_graph(model, inputs, out)
    bevir.save(graph, out / "model.bevir")
    seconds["float_graph"] = time.perf_counter() - t
    t = time.perf_counter()
    feed = FrameFeed(frames, workers, spread(len(frames), calibration_frames), progress)
    q, _, _ = int8_graph(model, inputs, feed, out, progress=progress,
                         fp32_onnx=out / BACKBONE_ONNX)
    bevir.save(q, out / "model_int8.bevir")
    seconds["int8_graph"] = time.perf_counter() - t
    return graph, q, seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="test", choices=sorted(CONFIGS))
    p.add_argument("--out", required=True)
    p.add_argument("--frames", help="a frame set (default: write one into OUT/frames)")
    p.add_argument("--scenes", type=int, default=4)
    p.add_argument("--length", type=int, default=50, help="frames per scene")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibration-frames", type=int, default=32)
    p.add_argument("--limit", type=int, help="evaluate only the first N frames")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS")
    p.add_argument("--workers", type=int, help="cores of the embedded Ray")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workers = Workers(ray=args.ray, cpus=args.workers)
    try:
        report = signoff(args, out, workers)
    except bevir.BevirError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(report["table"])
    print(f"wrote {out / 'signoff.json'}, {out / 'eval'}/")
    return 0


def signoff(args, out: Path, workers: Workers) -> dict:
    t0 = time.perf_counter()
    if args.frames:
        frames = Frames(args.frames)
    elif (out / "frames" / "frames.json").exists():
        frames = Frames(out / "frames")
    else:
        frames = write_sequence(args.config, out / "frames", args.scenes, args.length,
                                seed=args.seed, progress=None)
    seconds = {"frames": time.perf_counter() - t0}
    print(f"frames: {frames}", file=sys.stderr)
    graph, q, built = models(frames, out, workers, args.calibration_frames)
    seconds.update(built)
    t = time.perf_counter()
    indices = range(min(len(frames), args.limit or len(frames)))
    ev = bevir.scale.evaluate(graph, q, frames, out / "eval", workers=workers, indices=indices)
    seconds["evaluate"] = time.perf_counter() - t
    report = {"config": frames.meta["config"], "frames": len(indices),
              "workers": workers.count, "ray": workers.ray, "seconds": seconds,
              "summary": ev.summary(), "table": ev.table()}
    (out / "signoff.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    sys.exit(main())
