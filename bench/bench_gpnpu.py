"""BEVFormer's INT8 frame on the GPNPU: partitioned with the cycle model's costs, its OCM
planned and its cycles modelled for the QC-U 4-core preset, against the seed's ISS run.

Prints the wall time of partition + plan-memory + cycle model beside the seed's ~3600 s
instruction-set simulation (goal <= 10 s); core 0's total cycles beside the seed's
62,502,966 (a ratio, reported, never tuned); the 1 -> 4 core modelled speedup and
utilisation; the three costliest ops and what bounds them; the memory plan's peak over its
lower bound; and the differing elements of the partitioned, planned graphs' golden runs
for 1 to 4 cores against the single-core one (must be 0).

    python bench/bench_gpnpu.py [--config tiny|test] [--hw qc-u-4c]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from bevir.hw import HWConfig  # noqa: E402
from bevir.passes import make_pass  # noqa: E402
from bevir.passes.memory_plan import memory_plan  # noqa: E402
from bevir.passes.partition import plan_of  # noqa: E402
from bevir.sim.cycles import Profile, model  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402

SEED_ISS_SECONDS = 3600          # the seed's instruction-set simulation of one tiny frame
SEED_CORE0_CYCLES = 62_502_966   # its profile_core0.json, sum of data.TotalCycles


def compiled(q: bevir.Graph, hw: HWConfig) -> tuple[bevir.Graph, Profile, dict[str, float]]:
    """``q`` partitioned for ``hw``'s cores by its cycle model, OCM-planned, and modelled;
    the seconds of each step."""
    g = q.clone()
    text = hw.describe()             # parses back to hw (label aside)
    _, t_part = timed(lambda: bevir.optimize(g, [make_pass("partition", hw=text)]))
    _, t_plan = timed(lambda: bevir.optimize(g, [make_pass("plan-memory", hw=text)]))
    profile, t_model = timed(lambda: model(g, hw))
    return g, profile, {"partition": t_part, "plan-memory": t_plan, "model": t_model}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--hw", default="qc-u-4c", help="a preset or e.g. 'QC-U 8MB 16MAC x4'")
    args = ap.parse_args()
    hw = HWConfig.parse(args.hw)
    one = HWConfig.parse(f"{hw.describe().rsplit(' x', 1)[0]} x1")      # the same, one core
    config = CONFIGS[args.config]
    (q, feed), t_int8 = timed(lambda: e2e.int8_frame(config))
    reference, t_ref = timed(lambda: bevir.run(q, feed))
    print(f"{args.config}: INT8 graph of {len(q.nodes)} nodes in {t_int8:.1f}s; single-core "
          f"golden run {t_ref:.2f}s")
    print(f"hw: {hw.name} = {hw.describe()} (hash {hw.hash[:12]})")

    g4, p4, times = compiled(q, hw)
    _, p1, _ = compiled(q, one)
    wall = sum(times.values())
    split = sum(e["choice"] != "none" for e in plan_of(g4)["ops"])
    print(f"partition + plan-memory + cycle model, {hw.cores} cores: {wall:.2f}s wall "
          f"({SEED_ISS_SECONDS / wall:,.0f}x faster than the seed's ~{SEED_ISS_SECONDS} s ISS "
          f"run; goal <= 10 s: {'met' if wall <= 10 else 'NOT met'}); "
          + ", ".join(f"{k} {t:.2f}s" for k, t in times.items()) + f"; {split} ops split")
    core0 = p4.cycles_per_core[0]
    print(f"core 0 total cycles: {core0:,} vs the seed's {SEED_CORE0_CYCLES:,} "
          f"(ratio {core0 / SEED_CORE0_CYCLES:.3f}; reported, not tuned)")
    print(f"cycles per core: {', '.join(f'{c:,}' for c in p4.cycles_per_core)}; makespan "
          f"{p4.makespan:,} ({p4.makespan / (hw.clock_ghz * 1e6):.2f} ms at {hw.clock_ghz} GHz)")
    print(f"1 -> {hw.cores} cores: makespan {p1.makespan:,} -> {p4.makespan:,} = "
          f"{p1.makespan / p4.makespan:.2f}x modelled speedup; utilisation "
          f"{100 * p1.utilisation:.1f}% -> {100 * p4.utilisation:.1f}%")
    print("three ops with the most cycles:")
    for r in p4.top(3):
        print(f"  {r.op} {r.name} ({r.loc or '-'}) core {r.core}: {r.own_cycles:,} cycles, "
              f"{r.bound}-bound ({', '.join(f'{k} {v:,}' for k, v in r.terms.items() if v)}), "
              f"{r.macs:,} MACs, utilisation {100 * r.utilisation:.1f}%")
    mp = memory_plan(g4)
    print(f"memory plan: peak / lower bound {mp.ratio():.3f} (worst core; goal <= 1.05); "
          f"{len(mp.ddr_values)} values in DDR, {mp.dma_ops} dma_copy ops")
    diff = 0
    print("golden runs of the partitioned, planned graphs against the single-core one:")
    for cores in range(1, hw.cores + 1):
        g = g4 if cores == hw.cores else compiled(q, hw.model_copy(update={"cores": cores}))[0]
        out, t_run = timed(lambda: bevir.run(g, feed))
        n = sum(int(np.count_nonzero(out[k] != reference[k])) for k in reference)
        diff += n
        print(f"  {cores} core(s): {t_run:.2f}s, differing elements {n} of "
              f"{sum(v.size for v in reference.values()):,}")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
