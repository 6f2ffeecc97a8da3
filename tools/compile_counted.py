"""Compile a saved graph in this (new) process and print, as one JSON line, how long it
took and how often it planned, lowered and built (nothing, when the cache serves it):

    python tools/compile_counted.py MODEL.bevir OUT_DIR HW

``{"seconds": 0.02, "built": {}}``; the keys of ``built`` are the functions that plan
(bevir.flows.target's plan_for_target), write (write_program), lower (_kernel_source) and
compile (_object, build_shared).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's bevir
import bevir  # noqa: E402
import bevir.codegen.cprogram as cp  # noqa: E402
import bevir.flows.target as flow  # noqa: E402

COUNTED = {flow: ("plan_for_target",),
           cp: ("write_program", "_kernel_source", "_object", "build_shared")}


def main(argv: list[str]) -> int:
    model, out, hw = argv[1:4]
    built: dict[str, int] = {}

    def counted(module, name):
        f = getattr(module, name)

        def wrapper(*a, **k):
            built[name] = built.get(name, 0) + 1
            return f(*a, **k)
        setattr(module, name, wrapper)
    for module, names in COUNTED.items():
        for name in names:
            counted(module, name)
    t0 = time.perf_counter()
    flow.compile_program(bevir.load(model), out, hw=hw)
    print(json.dumps({"seconds": time.perf_counter() - t0, "built": built}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
