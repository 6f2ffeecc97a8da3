"""Float ResNet-50 trunk at 6x3x480x800: bevir's golden interpreter against onnxruntime and
torch eager, measured in one run on this machine. Prints times and ratios.

    python bench/bench_resnet50.py [--size 480 800] [--repeat 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from examples.bevformer.backbone import ResNet50, randomize_bn  # noqa: E402


def best_time(fn, repeat: int) -> tuple[float, object]:
    out = fn()                       # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, nargs=2, default=(480, 800))
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = ResNet50().eval()
    randomize_bn(model, torch.Generator().manual_seed(0))
    x = np.random.default_rng(0).standard_normal((args.batch, 3, *args.size)).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "resnet50.onnx"
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), input_names=["img"],
                          output_names=["c5"], opset_version=17, dynamo=False)
        graph = bevir.optimize(bevir.from_onnx(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    with torch.inference_mode():
        t_torch, ref = best_time(lambda: model(torch.from_numpy(x)).numpy(), args.repeat)
    t_ort, out_ort = best_time(lambda: sess.run(None, {"img": x})[0], args.repeat)
    t_bevir, out = best_time(lambda: bevir.run(graph, {"img": x})["c5"], args.repeat)

    err = np.abs(out - out_ort).max() / max(np.abs(out_ort).max(), 1e-30)
    print(f"ResNet-50 trunk, input {args.batch}x3x{args.size[0]}x{args.size[1]} float32, "
          f"{len(graph.nodes)} bevir nodes, {torch.get_num_threads()} threads")
    print(f"  torch eager   {t_torch:8.3f} s")
    print(f"  onnxruntime   {t_ort:8.3f} s")
    print(f"  bevir.run     {t_bevir:8.3f} s")
    print(f"  ratio bevir / torch eager  = {t_bevir / t_torch:.2f}  (target <= 2.0)")
    print(f"  ratio bevir / onnxruntime  = {t_bevir / t_ort:.2f}")
    print(f"  max |bevir - onnxruntime| / max|ort| = {err:.2e}")


if __name__ == "__main__":
    main()
