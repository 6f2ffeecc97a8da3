"""A full BEVFormer INT8 frame: bevir's integer golden model of the whole quantized program
(INT8 ResNet-50 + FPN from onnxruntime's quantizer, bridge, fixed-point encoder, decoder
and heads) against the anchors that run the same frame today: onnxruntime running the INT8
backbone plus PyTorch running the float head. Same machine, one warm-up then one timed
run each; prints the times and the ratio (target <= 1.0).

    python bench/bench_bevformer_int8.py [--config tiny|test]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.inputs import make_inputs  # noqa: E402
from examples.bevformer.weights import build_model  # noqa: E402
from anchors import anchor_seconds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    args = ap.parse_args()
    config = CONFIGS[args.config]
    model = build_model(config, 0).eval()
    inputs = make_inputs(config, 0, with_prev_bev=True)
    with tempfile.TemporaryDirectory() as d:
        workdir = Path(d)
        float_graph = e2e.build_graph(model, inputs, workdir)
        feed = e2e.golden_inputs(float_graph, inputs)
        (q, stats, qb), t_flow = timed(lambda: e2e.int8_graph(model, inputs, feed, workdir,
                                                               progress=True))
        t_ort, t_head = anchor_seconds(model, inputs, qb.int8_onnx)
        bevir.run(q, feed)
        _, t_bevir = timed(lambda: bevir.run(q, feed))
    counts = q.op_counts()
    anchor = t_ort + t_head
    print(f"BEVFormer {config.name} INT8 frame, {torch.get_num_threads()} threads; "
          f"{len(q.nodes)} bevir nodes ({sum(v for k, v in counts.items() if k.startswith('fx_'))} "
          f"fixed-point, {counts.get('qlinear_conv', 0)} qlinear_conv); quantization flow "
          f"{t_flow:.1f} s")
    print(f"  onnxruntime INT8 backbone  {t_ort:8.3f} s")
    print(f"  PyTorch float head         {t_head:8.3f} s")
    print(f"  anchors together           {anchor:8.3f} s")
    print(f"  bevir.run (whole program)  {t_bevir:8.3f} s")
    print(f"  ratio bevir / (onnxruntime + PyTorch) = {t_bevir / anchor:.2f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
