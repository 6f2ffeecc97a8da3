"""Draw the measured trace of the `test` BEVFormer frame on QC-U x4 for docs/target.md
(docs/images/trace_test_x4.png): python tools/trace_picture.py"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bevir.flows.target import compile_program  # noqa: E402
from bevir.target.plots import trace_plot  # noqa: E402
from examples.bevformer import e2e  # noqa: E402


def main() -> None:
    q, feed = e2e.int8_frame("test")
    program = compile_program(q, Path(tempfile.mkdtemp()) / "program", hw="QC-U 8MB 16MAC x4")
    program.run(feed)
    out = trace_plot(program.trace().to_json(), ROOT / "docs/images/trace_test_x4.png",
                     "BEVFormer test frame, QC-U 8MB 16MAC x4: the programs' run measured "
                     "on the host", unit=("ms", 1e-3))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
