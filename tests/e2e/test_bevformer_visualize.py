"""The Figure-7 views: boxes projected through lidar2img, clipped at the near plane."""

import numpy as np
import pytest

from examples.bevformer.config import CAMERA_ORDER, CONFIGS
from examples.bevformer.decode import bev_corners
from examples.bevformer.inputs import (lidar2img_for, make_images, make_scene,
                                       render_camera, scene_boxes)
from examples.bevformer.visualize import (NEAR, View, box_corners, box_segments,
                                          camera_images, figure7, filter_by_score, project)

F, CU, CV = 400.0, 320.0, 240.0
#: a pinhole camera at the LiDAR origin looking along +y: camera x = x, camera y = -z,
#: depth = y; u = F x / y + CU, v = -F z / y + CV
PINHOLE = np.array([[F, CU, 0, 0], [0, CV, -F, 0], [0, 1, 0, 0], [0, 0, 0, 1]], np.float64)


def test_a_projected_corner_matches_the_hand_computation():
    box = [10.0, 20.0, -1.0, 2.0, 4.0, 1.5, 0.0]            # cx, cy, bottom z, w, l, h, rot
    corners = box_corners(box)
    # rot 0: the first footprint corner is (cx - w/2, cy - l/2), the bottom face first
    assert np.allclose(corners[0], [9.0, 18.0, -1.0]) and np.allclose(corners[4], [9.0, 18.0, 0.5])
    uv, depth = project(corners[:1], PINHOLE)
    assert depth[0] == 18.0
    assert np.allclose(uv[0], [F * 9 / 18 + CU, -F * -1 / 18 + CV])       # (520, 262.2)
    # the real front camera: a point straight ahead lands near the middle column
    l2i = lidar2img_for(CONFIGS["tiny"])[CAMERA_ORDER.index("CAM_FRONT")]
    uv, depth = project(np.array([[0.0, 30.0, 0.0]]), l2i)
    assert depth[0] > 0 and abs(uv[0, 0] - CONFIGS["tiny"].img_w / 2) < 40


def test_edges_behind_the_camera_are_cut_at_the_near_plane():
    box = [0.0, 0.0, -1.0, 2.0, 4.0, 1.5, 0.0]               # y from -2 to 2: half behind
    segments = box_segments(box, PINHOLE)
    # of 12 edges: the 2 crosswise edges and 2 pillars at y = 2 are kept whole, those at
    # y = -2 dropped, the 4 edges along y cut where the depth is NEAR
    assert len(segments) == 8
    pts = np.concatenate(segments)
    assert np.isfinite(pts).all()
    cut = pts[np.isclose(pts[:, 0], F * 1.0 / NEAR + CU) | np.isclose(pts[:, 0], F * -1.0 / NEAR + CU)]
    assert len(cut) == 4                                    # the cut ends, on the near plane
    assert box_segments([0.0, -30.0, -1.0, 2.0, 4.0, 1.5, 0.0], PINHOLE) == []   # all behind


def test_camera_images_undo_the_normalization():
    cfg = CONFIGS["test"]
    img = make_images(cfg, 0).numpy()
    rgb = camera_images(img, cfg)
    assert rgb.shape == (cfg.num_cams, cfg.resized_h, cfg.img_w, 3) and rgb.dtype == np.uint8
    again = (rgb.astype(np.float64) - np.asarray(cfg.img_mean)) / np.asarray(cfg.img_std)
    assert np.abs(again.transpose(0, 3, 1, 2) - img[:, :, : cfg.resized_h]).max() < 0.5 / 57


@pytest.fixture
def detections():
    boxes = np.array([[-3.0, 15.0, -1.8, 1.9, 4.5, 1.6, 0.1, 0, 0],
                      [4.0, -20.0, -1.8, 1.9, 4.5, 1.6, 1.5, 0, 0]], np.float32)
    return {"labels": np.array([0, 8]), "scores": np.array([0.9, 0.2], np.float32),
            "bboxes": boxes}


def test_figure7_draws_every_source(tmp_path, detections):
    cfg = CONFIGS["test"]
    images = camera_images(make_images(cfg, 0).numpy(), cfg)
    kept = filter_by_score(detections, 0.5)
    assert len(kept["scores"]) == 1 and kept["labels"][0] == 0
    path = figure7(images, lidar2img_for(cfg), [View(detections, "a", "red"), View(kept, "b", "blue")],
                   cfg, tmp_path / "fig.png", "test")
    from PIL import Image
    rgb = np.asarray(Image.open(path).convert("RGB")).astype(int)
    red = (rgb[..., 0] > 200) & (rgb[..., 1] < 60) & (rgb[..., 2] < 60)
    assert red.sum() > 50                                   # the boxes are drawn
    assert np.allclose(bev_corners(detections["bboxes"][0]).mean(0), [-3.0, 15.0])


def test_scene_boxes_project_onto_the_objects_the_images_show():
    """The synthetic scene's boxes, drawn as detections are, land on the pixels the
    renderer painted them with: where the camera views put a box is where it is."""
    cfg = CONFIGS["tiny"]
    scene, det = make_scene(0, cfg), scene_boxes(0, cfg)
    checked = 0
    for P in lidar2img_for(cfg):
        img = render_camera(P, cfg.resized_h, cfg.img_w, scene, np.random.default_rng(0))
        for b, box in zip(scene, det["bboxes"]):
            uv, depth = project(box_corners(box), P)
            if depth.min() < 0.5:
                continue
            u, v = uv.mean(0)              # mid-height: below a car's windows, above its shadow
            if 0 <= u < cfg.img_w and 0 <= v < cfg.resized_h:
                assert np.abs(img[int(v), int(u)] - b["color"]).max() < 60, (b["kind"], u, v)
                checked += 1
    assert checked >= 4
