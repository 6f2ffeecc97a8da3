"""3D-detection post-processing in numpy, independent of any model: the NMS-free decode of a
DETR-style 3D head (:class:`DetectionHead`), rotated BEV IoU and detection comparison.

    head = DetectionHead(num_classes=10, post_center_range=(-61.2, -61.2, -10.0, 61.2, 61.2, 10.0))
    det = head.decode(outputs[head.cls], outputs[head.bbox])
    cmp = compare_both_ways(det, det_reference)

Box layout of ``decode``: [cx, cy, cz (bottom centre), w, l, h, rot, vx, vy] in the LiDAR
frame, as ``LiDARInstance3DBoxes`` (mmdet3d v0.17) receives it from ``get_bboxes``.

BEV footprints for the IoU follow mmdet3d v0.17's LiDAR box corners: extent ``w`` along the
box's local x axis, ``l`` along its local y axis, rotated by ``-rot`` (v0.17's
``rotation_3d_in_axis(..., axis=2)``). The IoU of two boxes does not depend on that sign
convention as long as both boxes use the same one.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..errors import BevirError


class DetectionError(BevirError):
    """A detection head description is missing a field or has one of the wrong type."""


def _np(x) -> np.ndarray:
    # duck-typed so that torch tensors work without importing torch here
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


@dataclass(frozen=True, kw_only=True)
class DetectionHead:
    """The decode of an NMS-free DETR-style 3D head: class logits [Nq, num_classes] in graph
    output ``cls``, denormalized boxes [Nq, 10] (cx, cy, log w, log l, cz, log h, sin, cos,
    vx, vy) in ``bbox``. Keyword-only: ``post_center_range`` has no default but follows
    ``max_num``, which does."""
    num_classes: int
    max_num: int = 300
    post_center_range: tuple[float, ...]     # (x_min, y_min, z_min, x_max, y_max, z_max)
    score_threshold: float | None = None
    cls: str = "cls_scores"
    bbox: str = "bbox_preds"

    def to_json(self) -> dict:
        return {"num_classes": self.num_classes, "max_num": self.max_num,
                "post_center_range": [float(v) for v in self.post_center_range],
                "score_threshold": self.score_threshold, "cls": self.cls, "bbox": self.bbox}

    @classmethod
    def from_json(cls, d: dict) -> "DetectionHead":
        if not isinstance(d, dict):
            raise DetectionError(f"detection head: expected an object, got {type(d).__name__}")
        unknown = sorted(set(d) - {"num_classes", "max_num", "post_center_range",
                                   "score_threshold", "cls", "bbox"})
        if unknown:
            raise DetectionError(f"detection head: unknown field(s) {', '.join(unknown)}")
        for key in ("num_classes", "post_center_range"):
            if key not in d:
                raise DetectionError(f"detection head: missing field '{key}'")
        for key in ("num_classes", "max_num"):
            if key in d and not (_is_int(d[key]) and d[key] > 0):
                raise DetectionError(f"detection head: field '{key}' must be a positive "
                                     f"integer, got {d[key]!r}")
        pcr = d["post_center_range"]
        if not (isinstance(pcr, (list, tuple)) and len(pcr) == 6 and all(map(_is_real, pcr))):
            raise DetectionError("detection head: field 'post_center_range' must be 6 numbers, "
                                 f"got {pcr!r}")
        thr = d.get("score_threshold")
        if thr is not None and not _is_real(thr):
            raise DetectionError(f"detection head: field 'score_threshold' must be a number or "
                                 f"null, got {thr!r}")
        for key in ("cls", "bbox"):
            if key in d and not isinstance(d[key], str):
                raise DetectionError(f"detection head: field '{key}' must be a string, "
                                     f"got {d[key]!r}")
        return cls(**{**d, "post_center_range": tuple(float(v) for v in pcr),
                      "score_threshold": None if thr is None else float(thr)})

    def decode(self, cls_scores, bbox_preds, score_threshold: float | None = None) -> dict:
        """cls_scores (Nq, num_classes) logits, bbox_preds (Nq, 10) denormalized
        -> dict(labels int64 (N,), scores float32 (N,), bboxes float32 (N, 9)), sorted by score.

        NMSFreeCoder: sigmoid, top-k (max_num) over all query x class scores, label = idx %
        num_classes, query = idx // num_classes, post_center_range filter on the gravity
        centre, score threshold ``score_threshold`` (else the head's; None: none); then the
        gravity-centre z is moved to the bottom centre (z - h/2)."""
        cls = _np(cls_scores).astype(np.float32)
        bb = _np(bbox_preds).astype(np.float32)
        nc = self.num_classes
        s = _sigmoid(cls).reshape(-1)
        k = min(self.max_num, s.size)
        idx = np.argsort(-s, kind="stable")[:k]          # stable: ties keep query-major order
        scores = s[idx]
        labels = (idx % nc).astype(np.int64)
        b = bb[idx // nc]
        rot = np.arctan2(b[:, 6], b[:, 7])
        boxes = np.stack([b[:, 0], b[:, 1], b[:, 4], np.exp(b[:, 2]), np.exp(b[:, 3]),
                          np.exp(b[:, 5]), rot, b[:, 8], b[:, 9]], -1).astype(np.float32)
        pcr = np.asarray(self.post_center_range, dtype=np.float32)
        keep = (boxes[:, :3] >= pcr[:3]).all(1) & (boxes[:, :3] <= pcr[3:]).all(1)
        thr = self.score_threshold if score_threshold is None else score_threshold
        if thr is not None:
            keep &= scores > thr
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        boxes[:, 2] = boxes[:, 2] - boxes[:, 5] * 0.5
        return {"labels": labels, "scores": scores.astype(np.float32), "bboxes": boxes}


# ---------------------------------------------------------------------------------------------
# rotated BEV IoU (Sutherland-Hodgman clipping of convex polygons)
# ---------------------------------------------------------------------------------------------

def bev_corners(box) -> np.ndarray:
    """(4, 2) counter-clockwise BEV corners of [cx, cy, cz, w, l, h, rot, ...]."""
    cx, cy, w, l, rot = float(box[0]), float(box[1]), float(box[3]), float(box[4]), float(box[6])
    local = np.array([[-w / 2, -l / 2], [w / 2, -l / 2], [w / 2, l / 2], [-w / 2, l / 2]])
    c, s = np.cos(-rot), np.sin(-rot)
    r = np.array([[c, -s], [s, c]])
    return local @ r.T + np.array([cx, cy])


def polygon_area(p: np.ndarray) -> float:
    """Signed area (shoelace) of the (n, 2) polygon ``p``: positive when counter-clockwise."""
    if len(p) < 3:
        return 0.0
    x, y = p[:, 0], p[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def clip_polygon(subject: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman: ``subject`` clipped by the convex counter-clockwise ``clip``."""
    out = [tuple(p) for p in subject]
    m = len(clip)
    for i in range(m):
        if not out:
            break
        a, b = clip[i], clip[(i + 1) % m]
        ex, ey = b[0] - a[0], b[1] - a[1]

        def side(p):
            return ex * (p[1] - a[1]) - ey * (p[0] - a[0])      # > 0: left of a->b (inside)

        inp, out = out, []
        for j in range(len(inp)):
            p, q = inp[j], inp[(j + 1) % len(inp)]
            sp, sq = side(p), side(q)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return np.asarray(out, dtype=np.float64).reshape(-1, 2)


def bev_iou(box_a, box_b) -> float:
    """Rotated bird's-eye-view IoU of two boxes in ``decode``'s layout (0 for empty unions)."""
    pa, pb = bev_corners(box_a), bev_corners(box_b)
    inter = abs(polygon_area(clip_polygon(pa, pb)))
    union = abs(polygon_area(pa)) + abs(polygon_area(pb)) - inter
    return inter / union if union > 0 else 0.0


def compare_detections(det_a: dict, det_b: dict, top: int = 10, iou_threshold: float = 0.5) -> dict:
    """Top-``top`` comparison of two score-sorted detection sets:
    top10_label_match: positions k < top where the labels agree;
    score_diff_max / score_diff_mean: |score_a[k] - score_b[k]| over those positions;
    bev_iou_match: boxes of A's top whose best rotated BEV IoU with B's top is > iou_threshold;
    mean_iou: mean of those best IoUs (over A's top)."""
    na, nb = min(top, len(det_a["scores"])), min(top, len(det_b["scores"]))
    n = min(na, nb)
    la, lb = np.asarray(det_a["labels"][:n]), np.asarray(det_b["labels"][:n])
    sd = np.abs(np.asarray(det_a["scores"][:n], np.float64)
                - np.asarray(det_b["scores"][:n], np.float64))
    best = np.zeros(na)
    for i in range(na):
        for j in range(nb):
            best[i] = max(best[i], bev_iou(det_a["bboxes"][i], det_b["bboxes"][j]))
    return {"top10_label_match": int((la == lb).sum()),
            "score_diff_max": float(sd.max()) if n else 0.0,
            "score_diff_mean": float(sd.mean()) if n else 0.0,
            "bev_iou_match": int((best > iou_threshold).sum()),
            "mean_iou": float(best.mean()) if na else 0.0,
            "num_a": int(len(det_a["scores"])), "num_b": int(len(det_b["scores"]))}


def compare_both_ways(det_a: dict, det_b: dict, top: int = 10, iou_threshold: float = 0.5) -> dict:
    """``compare_detections(det_a, det_b)`` plus ``bev_iou_match_ba`` and ``mean_iou_ba`` from
    ``compare_detections(det_b, det_a)``: the box match is asymmetric (a box of A that B
    lacks costs only A -> B), and the reference flow's check takes both directions."""
    ab = compare_detections(det_a, det_b, top, iou_threshold)
    ba = compare_detections(det_b, det_a, top, iou_threshold)
    return {**ab, "bev_iou_match_ba": ba["bev_iou_match"], "mean_iou_ba": ba["mean_iou"]}
