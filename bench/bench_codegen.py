"""BEVFormer's INT8 frame through code generation, against the golden model and the
anchors (onnxruntime's INT8 backbone + PyTorch's float head), in one run:

- ``bevir compile`` for the QC-U 4-core preset (partition, memory plan, per-core C
  programs built with gcc): time cold (empty kernel cache) and warm (goal at tiny:
  <= 60 s cold, <= 5 s warm); distinct kernels and lines of generated C; the program
  run with one thread per core;
- the host build (TVM's llvm target, scheduled, with the VNNI micro-kernels where the
  processor has them): build cold and warm, frame time against the anchors (goal <= 0.5x)
  and the golden model; the three slowest kernels with GMAC/s;
- every output of both against the single-core golden run: 0 differing elements required.

    python bench/bench_codegen.py [--config tiny|test] [--hw "QC-U 8MB 16MAC x4"]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from anchors import anchor_seconds  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402
from examples.bevformer.inputs import make_inputs  # noqa: E402
from examples.bevformer.weights import build_model  # noqa: E402


def frame(run, feed: dict, reference: dict, warm_up: bool) -> tuple[float, int]:
    """(seconds, differing elements against ``reference``) of one frame of ``run``."""
    if warm_up:
        run(feed)
    out, seconds = timed(lambda: run(feed))
    return seconds, sum(int(np.count_nonzero(out[k] != reference[k])) for k in reference)


def slowest_kernels(program, feed: dict, n: int = 3) -> list[tuple[str, float, float]]:
    """(kernel, seconds, GMAC/s) of the ``n`` kernels that take longest over one frame."""
    from bevir.sim.interpreter import Interpreter
    seconds, macs = defaultdict(float), defaultdict(int)
    nodes = {node.name: node for node in program.graph.nodes}

    def timed_kernel(node, args):
        t0 = time.perf_counter()
        out = program._kernel(node, args)
        name = program.kernels[program.node_kernel[node.name]].kd.name
        seconds[name] += time.perf_counter() - t0
        macs[name] += node.opdef.cost(nodes[node.name])["macs"]
        return out
    Interpreter(program.graph, node_kernels={k: timed_kernel for k in program.node_kernel}
                ).run(feed)
    top = sorted(seconds, key=seconds.get, reverse=True)[:n]
    return [(k, seconds[k], macs[k] / seconds[k] / 1e9) for k in top]


def _new_process_compile(model: Path, out: Path, hw: str) -> dict:
    """tools/compile_counted.py in a new process (another hash seed) on this cache."""
    import json
    import subprocess
    tool = Path(__file__).resolve().parents[1] / "tools" / "compile_counted.py"
    done = subprocess.run([sys.executable, str(tool), str(model), str(out), hw],
                          env=dict(os.environ, PYTHONHASHSEED="7"), capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--hw", default="QC-U 8MB 16MAC x4")
    args = ap.parse_args()
    from bevir.codegen import Program
    from bevir.flows.target import compile_program
    config = CONFIGS[args.config]
    model = build_model(config, 0).eval()
    inputs = make_inputs(config, 0, with_prev_bev=True)
    feed = {k: inputs[k].numpy() for k in ("img", "lidar2img", "can_bus", "prev_bev")}
    with tempfile.TemporaryDirectory() as d:
        (q, _, qb), t_int8 = timed(lambda: e2e.int8_graph(model, inputs, feed, Path(d)))
        t_ort, t_head = anchor_seconds(model, inputs, qb.int8_onnx)
    anchor = t_ort + t_head
    bevir.run(q, feed)
    reference, t_golden = timed(lambda: bevir.run(q, feed))
    print(f"{args.config}: INT8 graph {len(q.nodes)} nodes ({t_int8:.1f}s); golden "
          f"{t_golden:.3f}s; anchors: onnxruntime INT8 backbone {t_ort:.3f}s + PyTorch float "
          f"head {t_head:.3f}s = {anchor:.3f}s")
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        os.environ["BEVIR_CACHE"] = str(Path(work) / "cache")      # cold, then warm
        prog, t_cold = timed(lambda: compile_program(q, Path(work) / "a", hw=args.hw))
        _, t_warm = timed(lambda: compile_program(q, Path(work) / "b", hw=args.hw))
        bevir.save(q, Path(work) / "q.bevir")
        second = _new_process_compile(Path(work) / "q.bevir", Path(work) / "c", args.hw)
        c_lines = sum(len(p.read_text().splitlines()) for p in (Path(work) / "a").rglob("*.c"))
        m = prog.manifest
        t_run, diff = frame(prog.run, feed, reference, warm_up=False)    # libraries loaded
        failed += diff != 0
        print(f"compile for {args.hw}: {len(m['kernels'])} distinct kernels, "
              f"{sum(len(p['steps']) for p in m['programs'])} program steps, {c_lines:,} lines "
              f"of generated C; cold {t_cold:.1f}s, warm {t_warm:.1f}s (goal <= 60 s / <= 5 s: "
              f"{'met' if t_cold <= 60 and t_warm <= 5 else 'NOT met'}); in a second "
              f"process {second['seconds']:.1f}s, built {second['built'] or 'nothing'}")
        failed += bool(second["built"])
        print(f"per-core programs ({m['cores']} threads): frame {t_run:.3f}s; ratio to golden "
              f"{t_run / t_golden:.2f}; {diff} differing elements of "
              f"{sum(v.size for v in reference.values()):,}")
        host, t_hcold = timed(lambda: Program(prog.graph, "llvm"))
        _, t_hwarm = timed(lambda: Program(prog.graph, "llvm"))
        t_host, diff = frame(host.run, feed, reference, warm_up=True)
        failed += diff != 0
        print(f"host build (llvm): build cold {t_hcold:.1f}s, warm {t_hwarm:.1f}s; frame "
              f"{t_host:.3f}s; ratio to anchors {t_host / anchor:.2f} (goal <= 0.5: "
              f"{'met' if t_host <= 0.5 * anchor else 'NOT met'}); ratio to golden "
              f"{t_host / t_golden:.2f}; {diff} differing elements")
        micro = sum("bevir_vnni_conv" in k.kd.func.script() for k in host.kernels.values())
        print(f"  micro-kernels {'on' if host.micro else 'off'}: {micro} of "
              f"{len(host.kernels)} host kernels call the VNNI accumulator")
        for name, secs, gmacs in slowest_kernels(host, feed):
            print(f"  slow kernel {name}: {secs * 1e3:.1f} ms, {gmacs:.1f} GMAC/s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
