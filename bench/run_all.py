"""Run every benchmark in bench/, each in its own process, and end with one table.

A benchmark that fails (non-zero exit, crash, timeout) is reported and the others still
run. Each benchmark prints its ratios against targets in lines naming a target, goal,
ratio or speedup; the final table repeats every such line
of every benchmark, with the benchmark's name and status. The exit status is non-zero
when any benchmark failed.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

#: a ratio line: one naming a target, goal, ratio or speedup
_TARGET = re.compile(r"target|ratio|goal|speedup", re.IGNORECASE)
TIMEOUT_S = 3600


def run_one(script: Path) -> tuple[int | str, list[str], float]:
    """(exit status or 'timeout', the lines naming a target, seconds) of one benchmark,
    its output streamed through as it runs."""
    t0 = time.perf_counter()
    lines: list[str] = []
    try:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=script.parent.parent)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if _TARGET.search(line):
                lines.append(line.strip())
        status: int | str = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        status = "timeout"
    return status, lines, time.perf_counter() - t0


def main() -> int:
    scripts = sorted(Path(__file__).parent.glob("bench_*.py"))
    results = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        results.append((script.name, *run_one(script)))
    print("\n== summary: every ratio against its target")
    failed = 0
    for name, status, lines, secs in results:
        ok = status == 0
        failed += not ok
        print(f"{name:28s} {'ok' if ok else f'FAILED ({status})':14s} {secs:8.1f} s")
        for line in lines or ["(no ratio against a target printed)"]:
            print(f"    {line}")
    print(f"{len(results) - failed} of {len(results)} benchmarks ran, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
