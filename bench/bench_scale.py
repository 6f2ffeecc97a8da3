"""Frames per second of calibration and evaluation over a BEVFormer frame set: one process
against a local Ray with N workers on this machine, in one run; and what a 64-core cluster
would take for nuScenes' 6,019 validation frames at the measured per-worker rate (one core
per worker, perfect scaling: a lower bound).

    python bench/bench_scale.py [--configs test tiny] [--frames-test 96] [--frames-tiny 6]
                                [--workers 2] [--threads 1]

Both sides run the same task code (bevir.scale); the Ray side is measured warm (its
workers started and holding the models, as they are after the first chunks of a long
run). The one process uses numpy's BLAS threads on every core (its float convolutions and
matrix products run on both cores here), Ray's workers one thread each; ``--threads 1``
gives the one process one thread too, which measures how Ray's workers scale. Calibration
measures the float model (min/max of every activation); evaluation runs the float and the
INT8 model on every frame and compares them.

Goal (issue 21): Ray with 2 workers >= 1.7x one process.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def _threads(argv: list[str]) -> str | None:
    """--threads, read before numpy starts its BLAS threads."""
    for i, a in enumerate(argv):
        if a.startswith("--threads"):
            return a.split("=", 1)[1] if "=" in a else argv[i + 1]
    return None


if _threads(sys.argv):           # the process and its Ray workers alike
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = _threads(sys.argv)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from bevir.scale import Workers, calibrate, evaluate  # noqa: E402
from examples.bevformer.sequence import write_sequence  # noqa: E402
from examples.bevformer.signoff import models  # noqa: E402

NUSCENES_VAL_FRAMES, CLUSTER_CORES = 6019, 64


def rate(fn, frames: int) -> float:
    """Frames per second of ``fn()`` over ``frames`` frames."""
    t = time.perf_counter()
    fn()
    return frames / (time.perf_counter() - t)


def bench_config(config: str, count: int, workers: int, tmp: Path) -> list[str]:
    frames = write_sequence(config, tmp / config / "frames", scenes=2, frames=(count + 1) // 2,
                            progress=False)
    models(frames, tmp / config, Workers(), calibration_frames=2)
    # both sides run the saved models, as a user's run would
    graph, q = (bevir.load(tmp / config / f) for f in ("model.bevir", "model_int8.bevir"))
    ray = Workers(ray="local", cpus=workers)
    n = len(frames)
    # warm both sides: constants prepared, Ray's workers started and holding the models
    warm = list(range(min(n, 2 * workers)))
    for w in (Workers(), ray, ray):          # Ray twice: every worker holds the models
        evaluate(graph, q, frames, tmp / config / "warm", workers=w, indices=warm,
                 restart=True, plot=False)
        calibrate(graph, frames, workers=w, indices=warm, attach=False)
    lines = []
    for what, run in (
            ("calibrate", lambda w, out: calibrate(graph, frames, workers=w, attach=False)),
            ("evaluate", lambda w, out: evaluate(graph, q, frames, out, workers=w,
                                                 restart=True, plot=False))):
        one = rate(lambda: run(Workers(), tmp / config / f"{what}1"), n)
        many = rate(lambda: run(ray, tmp / config / f"{what}{workers}"), n)
        per_worker = many / workers         # a Ray worker runs on one core
        cluster_min = NUSCENES_VAL_FRAMES / (per_worker * CLUSTER_CORES) / 60
        lines.append(f"{what} {config}: 1 process {one:.3f} frames/s ({1 / one:.2f} s/frame), "
                     f"Ray {workers} workers {many:.3f} frames/s: speedup {many / one:.2f}x "
                     f"(goal >= 1.7x); {NUSCENES_VAL_FRAMES} frames on {CLUSTER_CORES} "
                     f"cores ~{cluster_min:.1f} min")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", default=["test", "tiny"])
    p.add_argument("--frames-test", type=int, default=96)
    p.add_argument("--frames-tiny", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", help="BLAS threads of the one process (default: numpy's, "
                   "all cores); Ray's workers use 1 each")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        lines = []
        for config in args.configs:
            count = args.frames_tiny if config == "tiny" else args.frames_test
            lines += bench_config(config, count, args.workers, Path(d))
    print("\n".join(["", "summary:"] + lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
