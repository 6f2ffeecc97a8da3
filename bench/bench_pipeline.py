"""The optimization pipeline on the whole BEVFormer graph: compile time per pass, node and
layout-transform counts before and after, and the numeric check of every pass against the
golden model on the real inputs.

    python bench/bench_pipeline.py [--config tiny|test] [--pipeline canonicalize,fuse,...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bevir.passes import PassManager, Statistics, Timing, VerifyNumerics  # noqa: E402
from bevir.passes.layout import count_layout_transforms  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.inputs import make_inputs  # noqa: E402
from examples.bevformer.weights import build_model  # noqa: E402

PIPELINE = "canonicalize,fuse,to-nhwc,cse,dce"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--pipeline", default=PIPELINE)
    ap.add_argument("--atol", type=float, default=1e-4, help="numeric check on the outputs")
    args = ap.parse_args(argv)
    config = CONFIGS[args.config]
    inputs = make_inputs(config, 0, with_prev_bev=True)
    with tempfile.TemporaryDirectory() as tmp:
        graph = e2e.build_graph(build_model(config, 0).eval(), inputs, Path(tmp))
    feed = e2e.golden_inputs(graph, inputs)
    nodes, transforms = len(graph.nodes), count_layout_transforms(graph)
    timing, stats, numerics = Timing(), Statistics(), VerifyNumerics(feed, atol=args.atol)
    checked = graph.clone()
    t0 = time.perf_counter()
    PassManager(args.pipeline, instruments=[timing, stats]).run(graph)
    compile_s = time.perf_counter() - t0
    PassManager(args.pipeline, instruments=[numerics]).run(checked)
    print(f"config {args.config}: pipeline {args.pipeline}")
    print(f"nodes {nodes} -> {len(graph.nodes)}; layout transforms {transforms} -> "
          f"{count_layout_transforms(graph)}")
    print(f"compile time (verify after each pass): {compile_s:.2f} s")
    print(timing.report())
    print(stats.report())
    print(numerics.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
