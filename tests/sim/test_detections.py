"""bevir.sim.detections: the NMS-free decode, rotated BEV IoU and detection comparison."""
import json
import math

import numpy as np
import pytest

from bevir.errors import BevirError
from bevir.sim.detections import (DetectionError, DetectionHead, bev_iou, compare_both_ways,
                                  compare_detections)

from examples.bevformer import decode as D
from examples.bevformer.config import CONFIGS

PCR = (-50.0, -50.0, -5.0, 50.0, 50.0, 5.0)
HEAD = DetectionHead(num_classes=3, max_num=4, post_center_range=PCR)


def _bbox(cx, cy, cz, w, l, h, rot, vx=0.0, vy=0.0) -> list[float]:
    """A denormalized head box (log sizes, sin/cos of rot) for a box with these extents."""
    return [cx, cy, math.log(w), math.log(l), cz, math.log(h), math.sin(rot), math.cos(rot), vx, vy]


def _det(boxes, labels=None, scores=None) -> dict:
    n = len(boxes)
    return {"bboxes": np.asarray(boxes, np.float32),
            "labels": np.zeros(n, np.int64) if labels is None else np.asarray(labels),
            "scores": np.linspace(0.9, 0.5, n) if scores is None else np.asarray(scores)}


def test_decode_hand_made():
    cls = np.full((3, 3), -10.0, np.float32)
    cls[0, 2], cls[1, 0], cls[2, 1] = 3.0, 2.0, 1.0        # query 2 is out of range below
    bbox = np.array([_bbox(1.0, 2.0, 0.5, 2.0, 4.0, 1.5, 0.3, 0.1, -0.2),
                     _bbox(-3.0, 4.0, -1.0, 1.0, 1.0, 2.0, -2.5),
                     _bbox(60.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0)], np.float32)
    det = HEAD.decode(cls, bbox)
    # top 4 of 9 scores: (q0, c2), (q1, c0), (q2, c1) dropped, then the first -10 tie (q0, c0)
    assert det["labels"].tolist() == [2, 0, 0]
    assert det["labels"].dtype == np.int64 and det["scores"].dtype == np.float32
    assert det["scores"][0] == pytest.approx(1 / (1 + math.exp(-3.0)))
    b = det["bboxes"]
    assert b.shape == (3, 9) and b.dtype == np.float32
    np.testing.assert_allclose(b[0], [1.0, 2.0, 0.5 - 0.75, 2.0, 4.0, 1.5, 0.3, 0.1, -0.2], rtol=1e-6)
    np.testing.assert_allclose(b[1, 3:7], [1.0, 1.0, 2.0, -2.5], rtol=1e-6)
    assert b[1, 2] == pytest.approx(-2.0)                 # bottom centre: cz - h / 2
    assert np.all(np.abs(b[:, 0]) <= 50)                  # the x = 60 box is gone
    # a threshold (argument over the head's None) keeps the confident two
    assert HEAD.decode(cls, bbox, score_threshold=0.5)["labels"].tolist() == [2, 0]


def test_bev_iou():
    a = [0, 0, -1, 2.0, 4.0, 1.5, 0.3, 0, 0]
    assert bev_iou(a, a) == pytest.approx(1.0, abs=1e-12)
    far = list(a)
    far[0] += 10.0
    assert bev_iou(a, far) == 0.0
    half = [0, 0, -1, 2.0, 4.0, 1.5, 0.0, 0, 0]
    shifted = list(half)
    shifted[0] += 1.0                                     # half of w: overlap 4 of union 12
    assert abs(bev_iou(half, shifted) - 1 / 3) < 1e-9
    turned = list(a)
    turned[6] += math.pi                                  # a rectangle turned by pi is itself
    assert bev_iou(a, turned) == pytest.approx(1.0, abs=1e-9)


def test_compare_both_ways_asymmetric():
    common = [[10.0 * i, 0, -1, 2.0, 4.0, 1.5, 0.0, 0, 0] for i in range(3)]
    lone = [0, 30.0, -1, 2.0, 4.0, 1.5, 0.0, 0, 0]              # A has it, B has nothing near
    da, db = _det(common + [lone]), _det(common)
    c = compare_both_ways(da, db)
    assert {k: c[k] for k in compare_detections(da, db)} == compare_detections(da, db)
    # A -> B misses the lone box, B -> A matches all of B
    assert (c["num_a"], c["bev_iou_match"], c["mean_iou"]) == (4, 3, pytest.approx(3 / 4))
    assert (c["num_b"], c["bev_iou_match_ba"], c["mean_iou_ba"]) == (3, 3, pytest.approx(1.0))
    # A's extra box is a near copy of one of B's: it matches that box, so the counts differ
    near = list(common[0])
    near[0] += 0.2
    c = compare_both_ways(_det(common + [near]), db)
    assert (c["bev_iou_match"], c["bev_iou_match_ba"]) == (4, 3)


def test_head_json_round_trip():
    head = DetectionHead(num_classes=10, post_center_range=PCR, score_threshold=0.1,
                         cls="logits", bbox="boxes")
    d = json.loads(json.dumps(head.to_json()))
    assert DetectionHead.from_json(d) == head
    assert DetectionHead.from_json({"num_classes": 3, "post_center_range": [0, 0, 0, 1, 1, 1]}) \
        == DetectionHead(num_classes=3, post_center_range=(0.0, 0.0, 0.0, 1.0, 1.0, 1.0))


@pytest.mark.parametrize("d, field", [
    ({"post_center_range": list(PCR)}, "num_classes"),
    ({"num_classes": 10}, "post_center_range"),
    ({"num_classes": "10", "post_center_range": list(PCR)}, "num_classes"),
    ({"num_classes": 10, "max_num": 1.5, "post_center_range": list(PCR)}, "max_num"),
    ({"num_classes": 10, "post_center_range": [1, 2, 3]}, "post_center_range"),
    ({"num_classes": 10, "post_center_range": list(PCR), "score_threshold": "x"}, "score_threshold"),
    ({"num_classes": 10, "post_center_range": list(PCR), "cls": 3}, "cls"),
    ({"num_classes": 10, "post_center_range": list(PCR), "boxes": "b"}, "boxes"),
])
def test_head_bad_json(d, field):
    with pytest.raises(DetectionError, match=field) as e:
        DetectionHead.from_json(d)
    assert isinstance(e.value, BevirError) and "\n" not in str(e.value)


def test_bevformer_decode_is_the_head():
    cfg = CONFIGS["test"]
    rng = np.random.default_rng(0)
    nq = 50
    cls = rng.normal(0, 3, (nq, cfg.num_classes)).astype(np.float32)
    bbox = rng.normal(0, 1, (nq, 10)).astype(np.float32)
    bbox[:, :2] *= 40                                     # some centres out of range
    head = D.detection_head(cfg)
    for thr in (None, 0.3):
        want, got = head.decode(cls, bbox, thr), D.decode(cls, bbox, cfg, thr)
        for k in ("labels", "scores", "bboxes"):
            assert want[k].dtype == got[k].dtype and want[k].tobytes() == got[k].tobytes()
    assert 0 < len(head.decode(cls, bbox)["scores"]) < min(cfg.max_num, nq * cfg.num_classes)
