"""A small end-to-end job: export a CNN from torch to ONNX, import it into bevir, optimize it,
run it with the golden interpreter, and compare with onnxruntime.

    python examples/demo.py [--out DIR]
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

import bevir
from bevir.passes import PassManager, Timing
from bevformer.backbone import randomize_bn


class TinyNet(nn.Module):
    """Conv-BN-ReLU stem, one residual block, pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, 1, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(y + self.block(y))
        y = y.flatten(2).mean(-1)                      # global pooling as reshape + mean
        return self.head(y)


def timed(fn):
    """(seconds, fn())."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)   # torch's legacy exporter
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = TinyNet().eval()
    randomize_bn(model, torch.Generator().manual_seed(0))
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    onnx_path = args.out / "tinynet.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(onnx_path), input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      do_constant_folding=False)     # leave the folding to bevir

    graph = bevir.from_onnx(onnx_path)
    bevir.verify(graph)
    before = len(graph.nodes)
    timing = Timing()
    PassManager("canonicalize,cse,dce", instruments=[timing]).run(graph)
    ops = ", ".join(f"{op} {n}" for op, n in graph.op_counts().items())
    print(f"nodes: {before} imported -> {len(graph.nodes)} after canonicalize,cse,dce ({ops})")
    print(timing.report())

    first, out = timed(lambda: bevir.run(graph, {"image": x})["logits"])
    t_run, out = timed(lambda: bevir.run(graph, {"image": x})["logits"])
    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(
        None, {"image": x})[0]
    print("logits[0]:", np.array2string(out[0], precision=4, suppress_small=True))
    print(f"max |bevir - onnxruntime| = {np.abs(out - ref).max():.2e}   (bevir.run "
          f"{t_run * 1e3:.1f} ms; the first run in this process {first * 1e3:.0f} ms: it builds "
          "the golden model's C kernels, once per machine (cached in $BEVIR_CACHE or "
          "~/.cache/bevir), or loads them)")
    path = bevir.save(graph, args.out / "tinynet.bevir")
    print(f"saved {path} and {bevir.ir.serialize.constants_path(path)} (the IR: bevir show {path})")
    if not np.allclose(out, ref, rtol=1e-4, atol=1e-5):
        raise SystemExit("bevir and onnxruntime disagree")


if __name__ == "__main__":
    main()
