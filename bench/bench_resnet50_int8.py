"""INT8 ResNet-50 + FPN backbone at 6x3x480x800, quantized by onnxruntime's quantize_static
(QOperator, per-tensor symmetric int8) through bevir.flows.quantize_backbone: bevir's golden
interpreter against onnxruntime, one run each, same machine. Prints times, the ratio and
the number of differing output elements (0: bit for bit). Each runs once to warm up, then
once timed.

    python bench/bench_resnet50_int8.py [--size 480 800] [--batch 6] [--format qoperator]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from examples.bevformer.backbone import ResNetFPN, randomize_bn  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, nargs=2, default=(480, 800))
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--format", choices=("qoperator", "qdq"), default="qoperator")
    ap.add_argument("--per-channel", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(0)
    model = ResNetFPN().eval()
    randomize_bn(model, torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    shape = (args.batch, 3, *args.size)
    calib = rng.standard_normal(shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    with tempfile.TemporaryDirectory() as d:
        qb, t_flow = timed(lambda: bevir.flows.quantize_backbone(
            model, [calib], d, format=args.format, per_channel=args.per_channel))
        print(qb.summary())
        sess = ort.InferenceSession(str(qb.int8_onnx), providers=["CPUExecutionProvider"])
        # one warm-up run each (onnxruntime packs its weights, both allocate), then one timed
        sess.run(None, {"img": x})
        (ref,), t_ort = timed(lambda: sess.run(None, {"img": x}))
        bevir.run(qb.graph, {"img": calib})
        out, t_bevir = timed(lambda: bevir.run(qb.graph, {"img": x})["feats"])

    differ = int(np.count_nonzero(out != ref))
    print(f"INT8 ResNet-50 + FPN ({args.format}, "
          f"{'per-channel' if args.per_channel else 'per-tensor'}), input "
          f"{'x'.join(map(str, shape))}, {len(qb.graph.nodes)} bevir nodes, "
          f"{torch.get_num_threads()} threads; flow (export, quantize, tranges, import) "
          f"{t_flow:.1f} s")
    print(f"  onnxruntime   {t_ort:8.3f} s")
    print(f"  bevir.run     {t_bevir:8.3f} s")
    print(f"  ratio bevir / onnxruntime = {t_bevir / t_ort:.2f}  (target <= 1.0)")
    print(f"  differing output elements: {differ} of {ref.size}")


if __name__ == "__main__":
    main()
