"""BEVFormer's detection post-processing: the NMS-free decode (spec section 2.9) with the
config's parameters, detection printing in the seed notebook's format, and the comparison
printout. The model-independent parts (decode, rotated BEV IoU, comparison) live in
:mod:`bevir.sim.detections`, whose docstring gives the box layout; they are re-exported here.
It also counts the synthetic scene's objects a model found (:func:`found_objects`).
"""
from __future__ import annotations

import numpy as np

from bevir.sim.detections import (DetectionHead, bev_corners, bev_iou, compare_both_ways,
                                  compare_detections)

from .config import CLASS_NAMES, BEVFormerConfig

# the re-exports keep e2e.py, visualize.py and the tests importing from here
__all__ = ["DetectionHead", "bev_corners", "bev_iou", "compare_both_ways", "compare_detections",
           "decode", "detection_head", "format_detections", "found_objects", "print_comparison",
           "print_detections"]


def detection_head(config: BEVFormerConfig) -> DetectionHead:
    """The config's NMSFreeCoder parameters (graph outputs cls_scores, bbox_preds)."""
    return DetectionHead(num_classes=config.num_classes, max_num=config.max_num,
                         post_center_range=tuple(config.post_center_range),
                         score_threshold=config.score_threshold)


def decode(cls_scores, bbox_preds, config: BEVFormerConfig,
           score_threshold: float | None = None) -> dict:
    """:meth:`DetectionHead.decode` with ``config``'s parameters: cls_scores (Nq, num_classes)
    logits, bbox_preds (Nq, 10) denormalized (section 2.8) -> dict(labels, scores, bboxes),
    sorted by score; ``score_threshold`` overrides the config's (None: no threshold)."""
    return detection_head(config).decode(cls_scores, bbox_preds, score_threshold)


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


def print_comparison(cmp: dict, name_a: str = "A", name_b: str = "B", top: int = 10) -> str:
    text = "\n".join([
        f"  {name_a:<15s} {cmp['num_a']} detections",
        f"  {name_b:<15s} {cmp['num_b']} detections",
        f"  Top-{top} label match: {cmp['top10_label_match']}/{top}",
        f"  Top-{top} score diff:  max={cmp['score_diff_max']:.6f}  "
        f"mean={cmp['score_diff_mean']:.6f}",
        f"  Top-{top} BEV IoU match: {cmp['bev_iou_match']}/{top} "
        f"(mean IoU={cmp['mean_iou']:.3f})"])
    print(text)
    return text


#: a scene object counts as found when a detection of its class above the threshold has its
#: centre this close (nuScenes' detection metric matches centres within 0.5, 1, 2 and 4 m)
FOUND_WITHIN_M = 2.0


def found_objects(det: dict, scene: dict, threshold: float,
                  within: float = FOUND_WITHIN_M) -> dict:
    """Which of ``scene``'s objects (boxes in decode's layout) ``det`` found: by a detection
    of score at least ``threshold``, of the object's class, its BEV centre within
    ``within`` m; each detection finds one object (greedily, best score first). Returns
    {"objects": how many, "found": how many, "missed": [object index], "extra": how many
    detections above the threshold found none, "scores": those that found one,
    "best_other": the best score of the detections that found none (0 without)}."""
    truth = np.asarray(scene["bboxes"], np.float64).reshape(-1, 9)
    scores = np.asarray(det["scores"], np.float64)
    left, found_by = list(range(len(truth))), []
    for k in np.flatnonzero(scores >= threshold):
        box, label = np.asarray(det["bboxes"][k], np.float64), int(det["labels"][k])
        near = [i for i in left if int(scene["labels"][i]) == label
                and np.hypot(*(truth[i, :2] - box[:2])) <= within]
        if near:
            left.remove(min(near, key=lambda i: np.hypot(*(truth[i, :2] - box[:2]))))
            found_by.append(int(k))
    others = np.delete(scores, found_by)
    return {"objects": len(truth), "found": len(truth) - len(left), "missed": left,
            "extra": int((others >= threshold).sum()),
            "scores": [float(scores[k]) for k in found_by],
            "best_other": float(others.max()) if others.size else 0.0}
