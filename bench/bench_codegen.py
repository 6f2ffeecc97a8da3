"""BEVFormer's INT8 frame on generated kernels: the graph partitioned for the QC-U 4-core
preset, every integer node lowered through TVM and built for the llvm target (the host
build) and the C target (gcc, libc only); each kernel checked against the golden op on
the same operands, the outputs compared with the single-core golden run (0 differing
elements required), and the times printed: build cold and warm (kernel cache), a frame on
the host build against the golden model, distinct kernels and lines of generated C.

    python bench/bench_codegen.py [--config test|tiny] [--targets llvm,c]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from bevir.passes import make_pass  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="test", choices=sorted(CONFIGS))
    ap.add_argument("--targets", default="llvm,c")
    ap.add_argument("--hw", default="QC-U 8MB 16MAC x4")
    args = ap.parse_args()
    from bevir.codegen import Program
    config = CONFIGS[args.config]
    (q, feed), t_int8 = timed(lambda: e2e.int8_frame(config))
    reference, t_golden = timed(lambda: bevir.run(q, feed))
    g = q.clone()
    bevir.optimize(g, [make_pass("partition", hw=args.hw)])
    print(f"{args.config}: INT8 graph {len(q.nodes)} nodes ({t_int8:.1f}s), partitioned for "
          f"{args.hw}: {len(g.nodes)} nodes; single-core golden run {t_golden:.2f}s")
    failed = 0
    for target in args.targets.split(","):
        with tempfile.TemporaryDirectory() as cache:
            os.environ["BEVIR_CACHE"] = cache
            cold, t_cold = timed(lambda: Program(g, target))
            _, t_warm = timed(lambda: Program(g, target))
            c_lines = sum(len(p.read_text().splitlines()) for p in Path(cache).rglob("*.c"))
        kernels = len(cold.kernels)
        report, t_check = timed(lambda: cold.check(feed))
        out, t_run = timed(lambda: cold.run(feed))
        diff = sum(int(np.count_nonzero(out[k] != reference[k])) for k in reference)
        failed += diff != 0 or not report.ok
        print(f"{target}: {kernels} distinct kernels for {len(cold.node_kernel)} nodes; build "
              f"cold {t_cold:.1f}s, warm {t_warm:.1f}s (goal <= 60 s / <= 5 s at tiny)"
              + (f"; {c_lines:,} lines of generated C" if target == "c" else ""))
        print(f"{target}: per-kernel check of {report.checked} nodes: "
              f"{'0 differing' if report.ok else report.mismatch} ({t_check:.1f}s)")
        print(f"{target}: frame {t_run:.2f}s vs golden {t_golden:.2f}s (ratio "
              f"{t_run / t_golden:.2f}); outputs vs single-core golden: {diff} differing "
              f"elements of {sum(v.size for v in reference.values()):,}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
