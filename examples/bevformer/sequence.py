"""Synthetic BEVFormer *sequences* on the scene-0061 rig, written as a bevir frame set.

    python examples/bevformer/sequence.py --config test|tiny --scenes N --frames T --out DIR
                                          [--seed S] [--model-seed S] [--frames-per-shard K]

Each of the N scenes is a static world of boxes (``make_scene(seed * 1000 + s, config)``,
placed in the scene's first lidar frame) that the ego drives through for T key frames, 0.5 s
apart (the boxes leave the config's slots as it moves, where the synthetic detector does
not look for them):
constant speed (3..10 m/s) along its heading, a small constant yaw rate, a random start yaw.
Every frame holds the golden graph's inputs: ``img`` (the six views of the world seen from
the current lidar pose), ``lidar2img`` (the rig's, the same every frame), ``can_bus`` (the
current pose, and the translation / yaw deltas to the previous frame, as BEVFormer's
``forward_test`` rewrites them) and ``prev_bev``.

``prev_bev`` is teacher-forced: the float PyTorch model is run over the sequence in order
(after a warm-up frame one step before t=0, run without prev_bev) and each frame stores the
previous frame's ``bev_embed``. So every frame is self-contained: a model under test (a
quantized graph, a compiled program) can evaluate any frame on any worker, independently of
the others, and its error does not feed back into later frames.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "examples.bevformer"

from bevir.errors import BevirError  # noqa: E402
from bevir.progress import Progress  # noqa: E402
from bevir.scale.frames import Frames, FrameWriter  # noqa: E402

from .config import CONFIGS, BEVFormerConfig  # noqa: E402
from .decode import detection_head  # noqa: E402
from .inputs import lidar2img_for, load_calibration, make_images, make_scene  # noqa: E402
from .model import BEVFormer  # noqa: E402
from .weights import build_model  # noqa: E402

STEP_S = 0.5                        # nuScenes key frames are 2 Hz
SPEED_RANGE = (3.0, 10.0)           # m/s
MAX_YAW_RATE = 0.08                 # rad/s: up to 2.3 degrees a frame, a gentle bend
SCENES_PER_SEED = 1000              # scene seeds are seed * 1000 + s


class SequenceError(BevirError):
    """A sequence that cannot be generated as asked."""


# ---------------------------------------------------------------------------------------------
# poses: 2D rigid transforms (3x3 homogeneous); the world is flat, so z and tilt stay fixed
# ---------------------------------------------------------------------------------------------

def se2(x: float, y: float, yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, x], [s, c, y], [0.0, 0.0, 1.0]])


def se2_yaw(T: np.ndarray) -> float:
    return math.atan2(T[1, 0], T[0, 0])


def lidar2ego() -> np.ndarray:
    """The rig's lidar in the ego frame (x forward, y left), flattened to 2D: about 0.94 m
    ahead of the ego origin and turned -90 degrees, so lidar x points right, y forward."""
    calib = load_calibration()
    w, x, y, z = calib["lidar2ego_rotation_wxyz"]
    tx, ty, _ = calib["lidar2ego_translation"]
    return se2(tx, ty, math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def trajectory(rng: np.random.Generator, steps: int) -> tuple[list[np.ndarray], float, float]:
    """(ego2global poses, speed m/s, yaw rate rad/s) for ``steps`` key frames: each step
    turns by yaw_rate * STEP_S and moves speed * STEP_S along the chord of the arc (heading
    half-way through the turn), so the translation per step is exactly speed * STEP_S."""
    speed = float(rng.uniform(*SPEED_RANGE))
    yaw_rate = float(rng.uniform(-MAX_YAW_RATE, MAX_YAW_RATE))
    # a start somewhere on a nuScenes-sized map; only deltas reach the model
    x, y, yaw = (float(rng.uniform(300, 2000)), float(rng.uniform(300, 2000)),
                 float(rng.uniform(0, 2 * math.pi)))
    poses = []
    for _ in range(steps):
        poses.append(se2(x, y, yaw))
        mid = yaw + yaw_rate * STEP_S / 2
        x, y = x + speed * STEP_S * math.cos(mid), y + speed * STEP_S * math.sin(mid)
        yaw += yaw_rate * STEP_S
    return poses, speed, yaw_rate


def move_boxes(boxes: list[dict], T: np.ndarray) -> list[dict]:
    """``boxes`` (make_scene's dicts) under the rigid transform ``T``; yaw turns with it
    (box yaw is counter-clockwise, as in inputs._box_corners)."""
    out = []
    for b in boxes:
        cx, cy, _ = T @ np.array([b["cx"], b["cy"], 1.0])
        out.append({**b, "cx": float(cx), "cy": float(cy), "yaw": b["yaw"] + se2_yaw(T)})
    return out


# ---------------------------------------------------------------------------------------------
# can_bus
# ---------------------------------------------------------------------------------------------

def patch_angle(ego2global: np.ndarray) -> float:
    """The ego yaw in degrees in [0, 360), as the nuScenes info files store can_bus[-1]."""
    return math.degrees(se2_yaw(ego2global)) % 360.0


def can_bus_for(pose: np.ndarray, prev: np.ndarray | None, speed: float, yaw_rate: float,
                rng: np.random.Generator) -> np.ndarray:
    """(18,) float32 as forward_test hands it to the model (layout: inputs.make_can_bus):
    [0:3] ego translation since ``prev`` (global frame), [17] the change of the [0, 360)
    yaw in degrees (so it jumps by 360 when the yaw wraps, as in nuScenes), both 0 without
    ``prev``; the CAN signals of constant speed on a constant bend, with sensor noise."""
    yaw = math.radians(patch_angle(pose))
    cb = np.zeros(18)
    if prev is not None:
        cb[0:2] = pose[:2, 2] - prev[:2, 2]
        cb[17] = patch_angle(pose) - patch_angle(prev)
    cb[3:7] = [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
    # accel in the ego frame: the centripetal speed * yaw_rate to the left, gravity up
    cb[7:10] = [rng.normal(0, 0.1), speed * yaw_rate + rng.normal(0, 0.05),
                9.81 + rng.normal(0, 0.05)]
    cb[10:13] = [rng.normal(0, 0.005), rng.normal(0, 0.005), yaw_rate + rng.normal(0, 0.002)]
    cb[13:16] = [speed, rng.normal(0, 0.05), 0.0]
    cb[16] = yaw
    return cb.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# frames
# ---------------------------------------------------------------------------------------------

def scene_inputs(config: BEVFormerConfig, scene_seed: int, frames: int
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Yields the float32 inputs (img, lidar2img, can_bus; no prev_bev) of the warm-up frame
    (t = -1, without deltas) and then of frames 0..frames-1 of one scene."""
    rng = np.random.default_rng(scene_seed)
    poses, speed, yaw_rate = trajectory(rng, frames + 1)
    l2i = lidar2img_for(config)
    l2e = lidar2ego()
    scene2global = poses[1] @ l2e               # the boxes sit in the lidar frame of t = 0
    boxes = make_scene(scene_seed, config)
    lidar2img = l2i.astype(np.float32)
    for k, pose in enumerate(poses):
        lidar_from_scene = np.linalg.inv(pose @ l2e) @ scene2global
        # the render seed stays the scene's: the skyline is far away and does not move
        img = make_images(config, scene_seed, l2i, move_boxes(boxes, lidar_from_scene))
        prev = poses[k - 1] if k > 0 else None            # the warm-up frame has no deltas
        yield {"img": img.numpy(), "lidar2img": lidar2img,
               "can_bus": can_bus_for(pose, prev, speed, yaw_rate, rng)}


def bev_embed(model: BEVFormer, frame: dict, prev_bev: np.ndarray | None) -> np.ndarray:
    """The model's bev_embed (Q, C) float32 for one frame: the next frame's prev_bev."""
    args = [torch.from_numpy(frame[k]) for k in ("img", "lidar2img", "can_bus")]
    prev = None if prev_bev is None else torch.from_numpy(prev_bev)
    with torch.no_grad():
        _, _, bev = model(*args, prev, return_bev=True)
    return bev.to(torch.float32).contiguous().numpy()


def resolve_config(config: BEVFormerConfig | str) -> BEVFormerConfig:
    if isinstance(config, BEVFormerConfig):
        return config
    if config not in CONFIGS:
        raise SequenceError(f"unknown config {config!r}; the presets are {sorted(CONFIGS)}")
    return CONFIGS[config]


def _check_sizes(scenes: int, frames: int, seed: int, frames_per_shard: int) -> None:
    if not 1 <= scenes <= SCENES_PER_SEED:
        raise SequenceError(f"scenes must be 1..{SCENES_PER_SEED} (scene seeds are "
                            f"seed * {SCENES_PER_SEED} + s), got {scenes}")
    if frames < 1:
        raise SequenceError(f"frames must be >= 1, got {frames}")
    if seed < 0:
        raise SequenceError(f"seed must be >= 0, got {seed}")
    if frames_per_shard < 1:
        raise SequenceError(f"frames_per_shard must be >= 1, got {frames_per_shard}")


def write_sequence(config: BEVFormerConfig | str, out: str | Path, scenes: int, frames: int,
                   seed: int = 0, model_seed: int = 0, frames_per_shard: int = 8,
                   progress: bool | None = None) -> Frames:
    """Writes ``scenes`` x ``frames`` frames (tags scene, t) into the empty folder ``out``;
    see the module docstring. Deterministic in (config, seed, model_seed)."""
    config = resolve_config(config)
    _check_sizes(scenes, frames, seed, frames_per_shard)
    meta = {"generator": "examples.bevformer.sequence", "config": config.name,
            "config_dict": config.to_dict(), "seed": seed, "model_seed": model_seed,
            "scenes": scenes, "frames_per_scene": frames,
            "detections": detection_head(config).to_json()}
    writer = FrameWriter(out, frames_per_shard, meta)     # first: a used folder fails fast
    model = build_model(config, model_seed).eval()
    with Progress(scenes * frames, "frames", progress) as bar:
        for s in range(scenes):
            prev_bev = None
            for k, frame in enumerate(scene_inputs(config, seed * SCENES_PER_SEED + s, frames)):
                if k > 0:                                   # k = 0 is the warm-up frame
                    writer.add({**frame, "prev_bev": prev_bev}, scene=s, t=k - 1)
                    bar.update()
                if k < frames:                              # the last one's is not used
                    prev_bev = bev_embed(model, frame, prev_bev)
    return writer.close()


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="test", choices=sorted(CONFIGS))
    ap.add_argument("--scenes", type=int, required=True)
    ap.add_argument("--frames", type=int, required=True, help="key frames per scene")
    ap.add_argument("--out", type=Path, required=True, help="an empty (or new) folder")
    ap.add_argument("--seed", type=int, default=0, help="scenes and trajectories")
    ap.add_argument("--model-seed", type=int, default=0, help="the synthetic weights")
    ap.add_argument("--frames-per-shard", type=int, default=8)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        fs = write_sequence(args.config, args.out, args.scenes, args.frames, args.seed,
                            args.model_seed, args.frames_per_shard)
    except (BevirError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    secs = time.perf_counter() - start
    print(f"wrote {len(fs)} frames (scenes {args.scenes} x frames {args.frames}) to {args.out}: "
          f"{_size(args.out) / 2**20:.1f} MiB, {secs:.1f} s ({secs / len(fs):.2f} s/frame)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
