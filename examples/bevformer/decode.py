"""NMS-free decode (spec section 2.9), detection printing and detection comparison, in numpy.

Box layout of ``decode``: [cx, cy, cz (bottom centre), w, l, h, rot, vx, vy] in the LiDAR
frame, as ``LiDARInstance3DBoxes`` (mmdet3d v0.17) receives it from ``get_bboxes``.

BEV footprints for the IoU follow mmdet3d v0.17's LiDAR box corners: extent ``w`` along the
box's local x axis, ``l`` along its local y axis, rotated by ``-rot`` (v0.17's
``rotation_3d_in_axis(..., axis=2)``). The IoU of two boxes does not depend on that sign
convention as long as both boxes use the same one.
"""
from __future__ import annotations

import numpy as np

from .config import CLASS_NAMES, BEVFormerConfig


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def decode(cls_scores, bbox_preds, config: BEVFormerConfig, score_threshold: float | None = None) -> dict:
    """cls_scores (Nq, num_classes) logits, bbox_preds (Nq, 10) denormalized (section 2.8)
    -> dict(labels int64 (N,), scores float32 (N,), bboxes float32 (N, 9)), sorted by score.

    NMSFreeCoder: sigmoid, top-k (max_num) over all query x class scores, label = idx %
    num_classes, query = idx // num_classes, post_center_range filter on the gravity centre,
    no score threshold by default (``score_threshold`` overrides the config's None); then the
    gravity-centre z is moved to the bottom centre (z - h/2)."""
    cls = _np(cls_scores).astype(np.float32)
    bb = _np(bbox_preds).astype(np.float32)
    nc = config.num_classes
    s = _sigmoid(cls).reshape(-1)
    k = min(config.max_num, s.size)
    idx = np.argsort(-s, kind="stable")[:k]
    scores = s[idx]
    labels = (idx % nc).astype(np.int64)
    b = bb[idx // nc]
    rot = np.arctan2(b[:, 6], b[:, 7])
    boxes = np.stack([b[:, 0], b[:, 1], b[:, 4], np.exp(b[:, 2]), np.exp(b[:, 3]), np.exp(b[:, 5]),
                      rot, b[:, 8], b[:, 9]], -1).astype(np.float32)
    pcr = np.asarray(config.post_center_range, dtype=np.float32)
    keep = (boxes[:, :3] >= pcr[:3]).all(1) & (boxes[:, :3] <= pcr[3:]).all(1)
    thr = config.score_threshold if score_threshold is None else score_threshold
    if thr is not None:
        keep &= scores > thr
    boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    boxes[:, 2] = boxes[:, 2] - boxes[:, 5] * 0.5
    return {"labels": labels, "scores": scores.astype(np.float32), "bboxes": boxes}


def format_detections(det: dict, top: int = 10, class_names=CLASS_NAMES) -> str:
    n = len(det["scores"])
    lines = ["", "=" * 60, f"Detections: {n} total", "=" * 60]
    for i in range(min(top, n)):
        b = det["bboxes"][i]
        name = class_names[int(det["labels"][i])]
        lines.append(f"  #{i + 1:3d}  {name:<20s}  score={float(det['scores'][i]):.4f}  "
                     f"pos=({b[0]:.1f}, {b[1]:.1f}, {b[2]:.1f})  "
                     f"size=({b[3]:.1f}, {b[4]:.1f}, {b[5]:.1f})  rot={b[6]:.2f}rad")
    if n > top:
        lines.append(f"  ... and {n - top} more")
    return "\n".join(lines)


def print_detections(det: dict, top: int = 10, class_names=CLASS_NAMES) -> str:
    """Print in the seed notebook's format; also returns the text."""
    text = format_detections(det, top, class_names)
    print(text)
    return text


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
    sd = np.abs(np.asarray(det_a["scores"][:n], np.float64) - np.asarray(det_b["scores"][:n], np.float64))
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


def print_comparison(cmp: dict, name_a: str = "A", name_b: str = "B", top: int = 10) -> str:
    text = "\n".join([
        f"  {name_a:<15s} {cmp['num_a']} detections",
        f"  {name_b:<15s} {cmp['num_b']} detections",
        f"  Top-{top} label match: {cmp['top10_label_match']}/{top}",
        f"  Top-{top} score diff:  max={cmp['score_diff_max']:.6f}  mean={cmp['score_diff_mean']:.6f}",
        f"  Top-{top} BEV IoU match: {cmp['bev_iou_match']}/{top} (mean IoU={cmp['mean_iou']:.3f})"])
    print(text)
    return text
