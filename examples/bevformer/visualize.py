"""The reference flow's "Figure 7" views: the six surround cameras with the 3D boxes
projected through the model's own ``lidar2img``, beside a top-down bird's-eye view.

    figure7(images, lidar2img, [View(det, "generated program", "#d62728")], config, "fig.png")

Boxes are in ``decode``'s layout, [cx, cy, cz (bottom centre), w, l, h, rot, ...] in the
LiDAR frame; their footprint is :func:`decode.bev_corners` (the one the BEV IoU uses), so
the camera views and the BEV view draw the same box. Box edges that pass behind a camera
are clipped at its near plane instead of being drawn across the image.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bevir.extras import pyplot

from .config import CAMERA_ORDER, BEVFormerConfig
from .decode import bev_corners

plt = pyplot()

#: the surround layout: FRONT_LEFT | FRONT | FRONT_RIGHT over BACK_LEFT | BACK | BACK_RIGHT
GRID = (("CAM_FRONT_LEFT", "CAM_FRONT", "CAM_FRONT_RIGHT"),
        ("CAM_BACK_LEFT", "CAM_BACK", "CAM_BACK_RIGHT"))
#: the 12 edges of a box from :func:`box_corners` (bottom face, top face, pillars)
EDGES = [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4),
         (0, 4), (1, 5), (2, 6), (3, 7)]
NEAR = 0.1          # metres in front of the camera: nearer parts of an edge are clipped


@dataclass
class View:
    """One detection source drawn in a figure (``dashed``: the ground truth's style)."""
    detections: dict
    label: str
    color: str
    dashed: bool = False

    @property
    def style(self) -> str:
        return "--" if self.dashed else "-"


def filter_by_score(det: dict, threshold: float) -> dict:
    """The detections whose score is at least ``threshold``."""
    keep = np.asarray(det["scores"]) >= threshold
    return {k: np.asarray(v)[keep] for k, v in det.items()}


def camera_images(img: np.ndarray, config: BEVFormerConfig) -> np.ndarray:
    """Normalized model input [N, 3, H, W] -> [N, h, W, 3] uint8 RGB without the bottom pad."""
    rgb = img.transpose(0, 2, 3, 1)[:, : config.resized_h]
    rgb = rgb * np.asarray(config.img_std) + np.asarray(config.img_mean)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def box_corners(box) -> np.ndarray:
    """(8, 3) corners of [cx, cy, cz, w, l, h, rot, ...]: the bottom face, then the top."""
    foot = bev_corners(box)
    z0 = float(box[2])
    z1 = z0 + float(box[5])
    return np.concatenate([np.c_[foot, np.full(4, z0)], np.c_[foot, np.full(4, z1)]])


def project(points: np.ndarray, lidar2img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, 3) LiDAR points -> ((M, 2) pixel coordinates, (M,) depth in front of the camera)."""
    p = np.c_[points, np.ones(len(points))] @ np.asarray(lidar2img, np.float64).T
    depth = p[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        return p[:, :2] / depth[:, None], depth


def box_segments(box, lidar2img: np.ndarray, near: float = NEAR) -> list[np.ndarray]:
    """The box's edges in pixels, each (2, 2); edges wholly behind the near plane are
    dropped, edges crossing it are cut there (in homogeneous coordinates, where the
    projection is linear)."""
    hom = np.c_[box_corners(box), np.ones(8)] @ np.asarray(lidar2img, np.float64).T
    segments = []
    for i, j in EDGES:
        a, b = hom[i], hom[j]
        if a[2] < near and b[2] < near:
            continue
        if a[2] < near:
            a = a + (near - a[2]) / (b[2] - a[2]) * (b - a)
        elif b[2] < near:
            b = b + (near - b[2]) / (a[2] - b[2]) * (a - b)
        segments.append(np.stack([a[:2] / a[2], b[:2] / b[2]]))
    return segments


def draw_camera(ax, image: np.ndarray, lidar2img: np.ndarray, views: list[View], name: str) -> None:
    h, w = image.shape[:2]
    ax.imshow(image, extent=(0, w, h, 0), interpolation="nearest")
    for view in views:
        for box in view.detections["bboxes"]:
            for seg in box_segments(box, lidar2img):
                ax.plot(seg[:, 0], seg[:, 1], color=view.color, lw=1.0, ls=view.style)
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_title(name.removeprefix("CAM_"), fontsize=8)
    ax.axis("off")


def draw_bev(ax, views: list[View], config: BEVFormerConfig, class_names=None) -> None:
    """Footprints seen from above (x right, y forward), the ego car at the origin."""
    class_names = class_names or config.class_names
    for view in views:
        for k, box in enumerate(view.detections["bboxes"]):
            foot = bev_corners(box)
            ax.fill(foot[:, 0], foot[:, 1], facecolor="none", edgecolor=view.color, lw=1.2,
                    ls=view.style)
            front = foot[1:3].mean(0)                    # the heading: centre -> front edge
            ax.plot([box[0], front[0]], [box[1], front[1]], color=view.color, lw=1.0,
                    ls=view.style)
            if view is views[0]:
                label = class_names[int(view.detections["labels"][k])]
                ax.text(box[0], box[1], f" {label}", color=view.color, fontsize=6)
    ax.add_patch(plt.Rectangle((-0.95, -2.25), 1.9, 4.5, color="black"))
    x0, y0, _, x1, y1, _ = config.pc_range
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_aspect("equal")
    ax.grid(True, lw=0.3)
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title("bird's-eye view", fontsize=9)
    ax.legend(handles=[plt.Line2D([], [], color=v.color, ls=v.style, label=f"{v.label} "
                                  f"({len(v.detections['scores'])})") for v in views],
              fontsize=7, loc="upper right")


def figure7(images: np.ndarray, lidar2img: np.ndarray, views: list[View],
            config: BEVFormerConfig, path: str | Path, title: str = "") -> Path:
    """The six cameras (``images`` [N, h, w, 3] in model camera order) with every view's
    boxes, and the BEV view, written as a PNG to ``path``."""
    fig = plt.figure(figsize=(16, 5.2))
    grid = fig.add_gridspec(2, 4, width_ratios=[1, 1, 1, 0.95])
    for r, row in enumerate(GRID):
        for c, name in enumerate(row):
            ax = fig.add_subplot(grid[r, c])
            k = CAMERA_ORDER.index(name)
            if k < len(images):
                draw_camera(ax, images[k], lidar2img[k], views, name)
            else:
                ax.axis("off")
    draw_bev(fig.add_subplot(grid[:, 3]), views, config)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
