"""The zoos on the GPNPU (issue 48, item 4): for each model of bevir.testing.zoo and
bevir.testing.hub_zoo, what ``bevir quantize`` (default config), ``bevir compile --hw
"QC-U 8MB 16MAC x4"`` and ``bevir exec --check`` do, through the library
(bevir.testing.device_zoo): stages on the device and the host, elements differing from
the golden model, INT8 vs float SQNR (dB; on the example input and a held-out one), the
first failure. Ends with the counts: one device stage and 0 differing, SQNR >= 30 dB.

    python bench/bench_zoo_device.py [--models tv/resnet18 timm/vit_tiny ...] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bevir.testing.device_zoo import HEADER, device_row, names  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", help="a subset (default: both zoos)")
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    print(HEADER, flush=True)
    for name in args.models or names():
        row = device_row(name)
        rows.append(row)
        print(row.line(), flush=True)
    ok = sum(r.one_device_stage and r.differing == 0 for r in rows)
    good = sum(r.sqnr is not None and r.sqnr >= 30 for r in rows)
    print(f"\none device stage, 0 differing: {ok}/{len(rows)}; SQNR >= 30 dB: {good}/{len(rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
