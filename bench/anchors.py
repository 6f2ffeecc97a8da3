"""The anchors BEVFormer's INT8 frame is measured against, shared by the benchmarks: the
onnxruntime INT8 backbone plus the PyTorch float head, on the same frame and machine."""
from __future__ import annotations

import sys
from pathlib import Path

import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.bevformer.e2e import timed  # noqa: E402
from examples.bevformer.model import split_model  # noqa: E402


def anchor_seconds(model, inputs: dict, int8_onnx: Path) -> tuple[float, float]:
    """(onnxruntime INT8 backbone, PyTorch float head) seconds for one frame, each after a
    warm-up run."""
    _, head = split_model(model, with_prev_bev=True)
    sess = ort.InferenceSession(str(int8_onnx), providers=["CPUExecutionProvider"])
    img = inputs["img"].numpy()
    rest = (inputs["lidar2img"], inputs["can_bus"], inputs["prev_bev"])
    sess.run(None, {"img": img})
    (feats,), t_ort = timed(lambda: sess.run(None, {"img": img}))
    with torch.no_grad():
        head(torch.from_numpy(feats), *rest)
        _, t_head = timed(lambda: head(torch.from_numpy(feats), *rest))
    return t_ort, t_head
