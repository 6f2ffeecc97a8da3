"""BEVFormer's INT8 frame partitioned across 1 to 4 cores: the partitioned golden run is
bit-identical to the single-core one (0 differing elements, checked), with the ops split
per kind and the times to partition and to run.

    python bench/bench_partition.py [--config tiny|test] [--hw "QC-U 8MB 16MAC x4"]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bevir  # noqa: E402
from bevir.passes import make_pass  # noqa: E402
from bevir.passes.partition import plan_of  # noqa: E402
from bevir.target import HWConfig  # noqa: E402
from examples.bevformer import e2e  # noqa: E402
from examples.bevformer.e2e import timed  # noqa: E402
from examples.bevformer.config import CONFIGS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--hw", default="QC-U 8MB 16MAC x4", help="the config whose cycle model "
                    "costs the splits")
    args = ap.parse_args()
    config = CONFIGS[args.config]
    (q, feed), t_int8 = timed(lambda: e2e.int8_frame(config))
    reference, t_ref = timed(lambda: bevir.run(q, feed))
    print(f"{args.config}: INT8 graph of {len(q.nodes)} nodes in {t_int8:.1f}s; "
          f"single-core golden run {t_ref:.2f}s")
    failed = False
    for cores in (1, 2, 3, 4):
        g = q.clone()
        hw = HWConfig.parse(args.hw).with_cores(cores)
        _, t_part = timed(lambda: bevir.optimize(g, [make_pass("partition", hw=hw)]))
        out, t_run = timed(lambda: bevir.run(g, feed))
        diff = sum(int(np.count_nonzero(out[k] != reference[k])) for k in reference)
        kinds = Counter(f"{e['op']}:{e['choice']}" for e in plan_of(g)["ops"]
                        if e["choice"] != "none")
        print(f"  {cores} cores: {sum(kinds.values())} ops split "
              f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'}); "
              f"{len(g.nodes)} nodes; partition {t_part:.2f}s, run {t_run:.2f}s; "
              f"differing elements {diff}")
        failed |= diff != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
