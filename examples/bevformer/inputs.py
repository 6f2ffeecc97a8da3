"""Deterministic synthetic (but structured) BEVFormer inputs on the real nuScenes calibration.

Images are rendered directly at the config's resized resolution (``int(1600*s) x int(900*s)``;
800x450 for tiny) with the scaled ``lidar2img`` of each camera, so the six views show one
consistent 3D scene: sky gradient, a skyline of blocks along the horizon, a road plane with
lane markings (ground z = -1.84 m in the lidar frame), and 3D boxes ("vehicles",
"pedestrians", "cones") projected into every camera that sees them, plus smooth colour noise.
They are then normalized with the mean/std of section 1 (RGB) and zero-padded at the bottom
to ``img_h`` (the pad is zeros of the *normalized* image, as in ``PadMultiViewImage``).

``lidar2img`` for a config is ``diag(s, s, 1, 1) @ lidar2img_raw`` with ``s = img_scale``
(0.5 for tiny, 0.06 for test): ``RandomScaleImageMultiViewImage`` scales both image axes by
the same factor and the same ``scale_factor`` matrix.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .config import CAMERA_ORDER, BEVFormerConfig

CALIB_PATH = Path(os.environ.get(
    "BEVFORMER_CALIB", Path(__file__).resolve().parent / "data" / "nuscenes_scene0061_calib.json"))
GROUND_Z = -1.84          # lidar is 1.84 m above the ego origin (lidar2ego_translation z)
#: the colour of the dark strip at every object's foot (wheels, feet, its contact shadow), and
#: its least height in pixels: nothing else in the scene is that dark (the synthetic
#: weights' backbone finds objects by it, see objectness.py)
SHADOW, SHADOW_ROWS = np.array([6, 6, 8]), 2


def load_calibration(path: str | Path = CALIB_PATH) -> dict:
    with open(path) as f:
        return json.load(f)


def lidar2img_raw(path: str | Path = CALIB_PATH) -> np.ndarray:
    """(6, 4, 4) float64 for the raw 1600x900 images, camera order of section 1."""
    calib = load_calibration(path)
    order = calib.get("camera_order", list(CAMERA_ORDER))
    assert tuple(order) == CAMERA_ORDER, order
    return np.stack([np.asarray(calib["cameras"][c]["lidar2img"], dtype=np.float64) for c in order])


def lidar2img_for(config: BEVFormerConfig, path: str | Path = CALIB_PATH) -> np.ndarray:
    """(num_cams, 4, 4) float64: diag(s, s, 1, 1) @ raw (s = config.img_scale)."""
    s = np.diag([config.img_scale, config.img_scale, 1.0, 1.0])
    return (s @ lidar2img_raw(path))[: config.num_cams]


# ---------------------------------------------------------------------------------------------
# scene
# ---------------------------------------------------------------------------------------------

_BOX_TYPES = {  # w, l, h, colours: warm or dark ones, which the background never is
    "car": ((1.9, 4.5, 1.6), [(180, 30, 30), (22, 22, 26), (140, 25, 30), (210, 170, 40),
                              (30, 32, 38)]),
    "truck": ((2.5, 7.0, 3.0), [(200, 140, 40), (150, 40, 30)]),
    "pedestrian": ((0.6, 0.7, 1.75), [(30, 26, 40), (160, 60, 40)]),
    "traffic_cone": ((0.4, 0.4, 0.8), [(240, 110, 20)]),
}


#: where the synthetic scenes put objects, per config: (x, y, kind) in the lidar frame, at
#: centres of ``test``'s 10.24 m BEV cells (which are centres of ``tiny``'s 2.048 m cells
#: too). The synthetic weights' object queries sit on them, one each (converge.py), and
#: each config's are places its backbone's C5 maps tell apart (objectness.py): ``test``'s
#: 2x3 maps see little more than a camera's middle, so it has one vehicle per camera;
#: ``tiny``'s 15x25 maps tell apart places 2.5 C5 columns apart in each camera. Vehicles
#: only, and at most 10: the reference flow's INT8 check matches the top 10 boxes by BEV
#: IoU > 0.5, which a pedestrian's or a cone's box loses to the INT8 grid of reference
#: points (0.8 m), and which ten of more objects found with near-equal scores make the top
#: 10 is INT8's rounding's choice.
SLOTS: dict[str, tuple[tuple[float, float, str], ...]] = {
    "test": ((5.12, 5.12, "car"), (-5.12, 5.12, "car"), (-5.12, 25.6, "car"),
             (15.36, -5.12, "car"), (-15.36, -5.12, "car"), (5.12, -15.36, "car")),
    "tiny": ((5.12, 5.12, "car"), (-5.12, 5.12, "car"), (-5.12, 35.84, "truck"),
             (5.12, 25.6, "car"), (-5.12, 15.36, "car"), (25.6, 5.12, "car"),
             (-25.6, -5.12, "car"), (5.12, -25.6, "car"), (-5.12, -25.6, "car"),
             (15.36, -25.6, "truck")),
}
#: the chance that a scene holds an object at a slot
OCCUPANCY = 0.75


def slots(config: BEVFormerConfig | str) -> tuple[tuple[float, float, str], ...]:
    """The scene slots of ``config`` (by name; a config of another name takes ``tiny``'s)."""
    name = config if isinstance(config, str) else config.name
    return SLOTS.get(name, SLOTS["tiny"])


def make_scene(seed: int, config: BEVFormerConfig | str,
               occupied: Sequence[bool] | None = None) -> list[dict]:
    """3D boxes in the lidar frame (x right, y forward, z up): slot (its index in
    ``config``'s SLOTS), kind, cx, cy, bottom z, w, l, h, yaw (of the length axis from +y),
    colour. Each slot holds an object of its kind with the chance OCCUPANCY (or where
    ``occupied`` says), a few centimetres off its centre, along the road."""
    rng = np.random.default_rng(seed + 1000)
    boxes = []
    for i, (x, y, kind) in enumerate(slots(config)):
        (w, l, h), cols = _BOX_TYPES[kind]
        here, s, (dx, dy, yaw) = rng.random(), rng.uniform(0.95, 1.05, 3), rng.normal(0, 0.1, 3)
        color = cols[int(rng.integers(len(cols)))]
        if (here < OCCUPANCY) if occupied is None else occupied[i]:
            boxes.append(dict(slot=i, kind=kind, cx=x + float(dx), cy=y + float(dy), cz=GROUND_Z,
                              w=w * s[0], l=l * s[1], h=h * s[2], yaw=0.3 * float(yaw),
                              color=color))
    return boxes


def scene_boxes(seed: int, config: BEVFormerConfig | str,
                occupied: Sequence[bool] | None = None) -> dict:
    """The scene of ``make_scene(seed, config, occupied)`` as detections in ``decode``'s
    layout ([cx, cy, cz (bottom), w, l, h, rot, vx, vy]; rot = -yaw, as decode's footprint
    turns by -rot), labels of CLASS_NAMES, scores 1: what the images show, for drawing
    beside detections."""
    from .config import CLASS_NAMES
    scene = make_scene(seed, config, occupied)
    boxes = np.array([[b["cx"], b["cy"], b["cz"], b["w"], b["l"], b["h"], -b["yaw"], 0.0, 0.0]
                      for b in scene], np.float32).reshape(-1, 9)
    return {"labels": np.array([CLASS_NAMES.index(b["kind"]) for b in scene], np.int64),
            "scores": np.ones(len(scene), np.float32), "bboxes": boxes}


def _box_corners(b: dict) -> np.ndarray:
    """(8, 3) corners; the length axis points along yaw measured from +y."""
    dx = np.array([-1, 1, 1, -1, -1, 1, 1, -1]) * b["w"] / 2
    dy = np.array([-1, -1, 1, 1, -1, -1, 1, 1]) * b["l"] / 2
    dz = np.array([0, 0, 0, 0, 1, 1, 1, 1]) * b["h"]
    c, s = math.cos(b["yaw"]), math.sin(b["yaw"])
    x = b["cx"] + c * dx - s * dy
    y = b["cy"] + s * dx + c * dy
    return np.stack([x, y, b["cz"] + dz], -1)


def _upsample(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize (align_corners=True style) of (hh, ww, c) to (h, w, c)."""
    hh, ww = a.shape[:2]
    ys = np.linspace(0, hh - 1, h)
    xs = np.linspace(0, ww - 1, w)
    y0 = np.floor(ys).astype(int).clip(0, hh - 2)
    x0 = np.floor(xs).astype(int).clip(0, ww - 2)
    fy = (ys - y0)[:, None, None]
    fx = (xs - x0)[None, :, None]
    a00 = a[y0][:, x0]
    a01 = a[y0][:, x0 + 1]
    a10 = a[y0 + 1][:, x0]
    a11 = a[y0 + 1][:, x0 + 1]
    return (a00 * (1 - fy) * (1 - fx) + a01 * (1 - fy) * fx + a10 * fy * (1 - fx) + a11 * fy * fx)


def render_camera(P: np.ndarray, h: int, w: int, boxes: list[dict], rng: np.random.Generator
                  ) -> np.ndarray:
    """(h, w, 3) float64 RGB in [0, 255] for the (scaled) lidar2img ``P``."""
    jj, ii = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    # ground plane homography: [u d, v d, d] = H @ [x, y, 1]
    H = np.stack([P[:3, 0], P[:3, 1], P[:3, 2] * GROUND_Z + P[:3, 3]], -1)
    g = np.linalg.solve(H, np.stack([jj.ravel(), ii.ravel(), np.ones(h * w)]))
    gx, gy = (g[0] / g[2]).reshape(h, w), (g[1] / g[2]).reshape(h, w)
    depth = (P[2, 0] * gx + P[2, 1] * gy + P[2, 2] * GROUND_Z + P[2, 3])
    dist = np.hypot(gx, gy)
    ground = (depth > 0) & (dist < 90.0)

    img = np.zeros((h, w, 3))
    # sky: light near the horizon, deeper blue at the top
    t = (ii / h)[..., None]
    img[:] = np.array([70, 120, 200]) * (1 - t) + np.array([190, 210, 235]) * t
    # skyline blocks just above the horizon
    horizon = np.where(ground.any(0), ground.argmax(0), h).astype(float)
    nblk = 12
    blk = np.minimum((np.arange(w) * nblk) // w, nblk - 1)
    bh = rng.uniform(0.04, 0.18, nblk)[blk] * h
    bcol = (rng.uniform(105, 175, nblk)[:, None] + np.array([-5, 0, 8]))[blk]    # blue-grey
    sky_line = (ii >= horizon[None, :] - bh[None, :]) & ~ground
    img[sky_line] = np.broadcast_to(bcol[None], (h, w, 3))[sky_line]
    # road, lane markings, kerb and verge
    asphalt = np.array([88, 88, 92]) + 6 * np.sin(gx * 1.7)[..., None] * np.cos(gy * 0.9)[..., None]
    road = ground & (np.abs(gx) < 7.0)
    verge = ground & ~road
    img[road] = asphalt[road]
    img[verge] = (np.array([85, 125, 65]) + 10 * np.sin(gy * 0.5)[..., None])[verge]
    dashed = (np.mod(gy, 6.0) < 3.0)
    marks = road & (((np.abs(np.abs(gx) - 3.5) < 0.08) & dashed) | (np.abs(gx) < 0.08)
                    | (np.abs(np.abs(gx) - 6.8) < 0.12))
    img[marks] = np.array([235, 235, 225])
    # boxes, far to near (painter's order)
    order = sorted(boxes, key=lambda b: -math.hypot(b["cx"], b["cy"]))
    for b in order:
        cs = _box_corners(b)
        p = P @ np.concatenate([cs, np.ones((8, 1))], -1).T
        if (p[2] < 0.5).any():
            continue
        u, v = p[0] / p[2], p[1] / p[2]
        u0, u1 = int(np.floor(u.min())), int(np.ceil(u.max()))
        v0, v1 = int(np.floor(v.min())), int(np.ceil(v.max()))
        if u1 <= 0 or v1 <= 0 or u0 >= w or v0 >= h:
            continue
        cu0, cu1, cv0, cv1 = max(u0, 0), min(u1, w), max(v0, 0), min(v1, h)
        col = np.array(b["color"], dtype=float)
        img[cv0:cv1, cu0:cu1] = col
        hgt = v1 - v0
        if b["kind"] in ("car", "truck"):
            wv1 = min(v0 + int(0.35 * hgt), h)                     # windows
            if wv1 > cv0:
                img[cv0:wv1, cu0:cu1] = 0.45 * col + 0.55 * np.array([40, 50, 60])
        sv0 = max(v1 - max(int(0.15 * hgt), SHADOW_ROWS), 0)       # wheels, feet and shadow
        if sv0 < cv1:
            img[max(sv0, cv0):cv1, cu0:cu1] = SHADOW
    # smooth colour noise + a little pixel noise
    low = rng.normal(0, 1, (max(h // 16, 2), max(w // 16, 2), 3))
    img += 12.0 * _upsample(low, h, w) + rng.normal(0, 2.0, (h, w, 3))
    return np.clip(img, 0, 255)


def make_images(config: BEVFormerConfig, seed: int, lidar2img: np.ndarray | None = None,
                boxes: list[dict] | None = None) -> torch.Tensor:
    """(num_cams, 3, img_h, img_w) float32, normalized RGB, zero-padded at the bottom.
    ``boxes`` (lidar frame, as :func:`make_scene` gives them) default to
    ``make_scene(seed, config)``;
    ``seed`` also drives the skyline and the noise."""
    if lidar2img is None:
        lidar2img = lidar2img_for(config)
    rng = np.random.default_rng(seed)
    if boxes is None:
        boxes = make_scene(seed, config)
    h, w = config.resized_h, config.img_w
    mean = np.asarray(config.img_mean)
    std = np.asarray(config.img_std)
    out = np.zeros((config.num_cams, 3, config.img_h, config.img_w), dtype=np.float32)
    for n in range(config.num_cams):
        rgb = render_camera(lidar2img[n], h, w, boxes, rng)
        out[n, :, :h, :] = ((rgb - mean) / std).transpose(2, 0, 1)
    return torch.from_numpy(out)


def make_can_bus(seed: int, with_prev_bev: bool) -> torch.Tensor:
    """(18,) as rewritten by forward_test: [0:3] delta ego translation (global frame) or 0,
    [3:7] ego2global quaternion (w,x,y,z), [7:10] accel, [10:13] rotation rate, [13:16] velocity,
    [16] absolute yaw (rad, [0, 2pi)), [17] delta yaw (deg) or 0."""
    rng = np.random.default_rng(seed + 7)
    yaw = float(rng.uniform(0, 2 * math.pi))
    speed = float(rng.uniform(4.0, 8.0))                    # m/s, 0.5 s between keyframes
    dyaw_deg = float(rng.uniform(0.5, 2.5)) * (1 if rng.random() < 0.5 else -1)
    cb = np.zeros(18, dtype=np.float64)
    if with_prev_bev:
        fwd, lat = speed * 0.5, float(rng.normal(0, 0.1))
        cb[0] = fwd * math.cos(yaw) - lat * math.sin(yaw)
        cb[1] = fwd * math.sin(yaw) + lat * math.cos(yaw)
        cb[2] = float(rng.normal(0, 0.02))
        cb[17] = dyaw_deg
    cb[3:7] = [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
    cb[7:10] = [float(rng.normal(0.2, 0.3)), float(rng.normal(0, 0.2)),
                9.81 + float(rng.normal(0, 0.05))]
    cb[10:13] = [float(rng.normal(0, 0.005)), float(rng.normal(0, 0.005)),
                 dyaw_deg * math.pi / 180 / 0.5]
    cb[13:16] = [speed, float(rng.normal(0, 0.05)), 0.0]
    cb[16] = yaw
    return torch.tensor(cb, dtype=torch.float32)


def make_prev_bev(config: BEVFormerConfig, seed: int) -> torch.Tensor:
    """(bev_h*bev_w, C): a spatially smooth field, standardized per token like a LayerNorm
    output (the shape and statistics of the previous frame's bev_embed)."""
    rng = np.random.default_rng(seed + 13)
    c = config.embed_dims
    low = rng.normal(0, 1, (max(config.bev_h // 5, 2), max(config.bev_w // 5, 2), c))
    f = (_upsample(low, config.bev_h, config.bev_w)
         + 0.3 * rng.normal(0, 1, (config.bev_h, config.bev_w, c)))
    f = f.reshape(config.num_bev, c)
    f = (f - f.mean(-1, keepdims=True)) / (f.std(-1, keepdims=True) + 1e-5)
    return torch.from_numpy(f.astype(np.float32))


def make_inputs(config: BEVFormerConfig, seed: int = 0, with_prev_bev: bool = False
                ) -> dict[str, torch.Tensor]:
    """dict(img [N,3,H,W], lidar2img [N,4,4], can_bus [18], prev_bev [Q,C] if with_prev_bev)."""
    l2i = lidar2img_for(config)
    out = {"img": make_images(config, seed, l2i),
           "lidar2img": torch.from_numpy(l2i.astype(np.float32)),
           "can_bus": make_can_bus(seed, with_prev_bev)}
    if with_prev_bev:
        out["prev_bev"] = make_prev_bev(config, seed)
    return out


def save_test_vectors(path: str | Path, inputs: dict, outputs,
                      metadata: dict[str, str] | None = None) -> None:
    """safetensors with img, lidar2img, can_bus, prev_bev (when used), cls_scores, bbox_preds
    (and bev_embed when ``outputs`` holds it). ``outputs``: (cls, bbox[, bev]) or a dict."""
    if isinstance(outputs, dict):
        outs = dict(outputs)
    else:
        outs = {"cls_scores": outputs[0], "bbox_preds": outputs[1]}
        if len(outputs) > 2:
            outs["bev_embed"] = outputs[2]
    tensors = {}
    for k in ("img", "lidar2img", "can_bus", "prev_bev"):
        if inputs.get(k) is not None:
            tensors[k] = inputs[k]
    tensors.update(outs)
    from bevir.fsutil import save_arrays
    save_arrays({k: torch.as_tensor(v).detach().to(torch.float32).numpy()
                 for k, v in tensors.items()}, path, metadata)
