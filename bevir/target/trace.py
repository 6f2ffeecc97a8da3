"""Traces in the Trace Event format, which Perfetto (ui.perfetto.dev) and chrome://tracing
open: one process per core with a compute lane (each step as a slice named after its node,
with its op, source layer and figures, its category what bounds it in the model or
``kernel`` / ``barrier`` when measured; waits as ``wait`` slices) and DMA lanes (the
transfers of the ops themselves, and the loads the core's DMA engine runs ahead of them,
which overlap), and a host process for the stages the host runs.

    bevir sim model_int8.bevir --hw "QC-U 8MB 16MAC x4" --out sim/ --trace sim/trace.json
    bevir exec out/ --inputs in.safetensors --trace exec.json     # measured on this host

:func:`model_trace` traces the cycle model's run (times are cycles at the config's clock);
``CompiledProgram.trace`` the last run of a compiled program (times measured on the host).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..fsutil import write_atomic

if TYPE_CHECKING:
    from .cycles import Profile

#: the lanes of a core's process: its steps, their own transfers, its DMA engine's loads
COMPUTE, DMA, ENGINE = 0, 1, 2
HOST_PID = 0


class Trace:
    """Trace events being collected; times are given in ``unit`` microseconds each."""

    def __init__(self, unit_us: float, metadata: dict | None = None):
        self.unit_us = unit_us
        self.events: list[dict] = []
        self.metadata = dict(metadata or {})

    def process(self, pid: int, name: str, lanes: dict[int, str]) -> None:
        """Name process ``pid`` and its lanes (thread id -> name), sorted as numbered."""
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": name}})
        self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                            "args": {"sort_index": pid}})
        for tid, lane in lanes.items():
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                "args": {"name": lane}})

    def slice(self, pid: int, tid: int, name: str, start: float, end: float,
              cat: str, args: dict | None = None) -> None:
        """A complete event from ``start`` to ``end`` (in units)."""
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid,
                            "ts": start * self.unit_us,
                            "dur": max(end - start, 0) * self.unit_us, "args": args or {}})

    def to_json(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ns",
                "otherData": self.metadata}

    def write(self, path: str | Path) -> Path:
        """Write the trace as JSON (whole or not at all); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps(self.to_json()))


def model_trace(profile: Profile) -> Trace:
    """The modelled run of ``profile`` as a trace: per core its steps (named after their
    nodes, with op, source layer, PE mapping, bound, MACs, DDR bytes and cycle terms), the
    waits before them and its DMA transfers; host stages as marks on the host process."""
    hw = profile.hw
    trace = Trace(1 / (hw.clock_ghz * 1e3), {"source": "bevir cycle model",
                                             "hw": hw.option_text(), "unit": "cycles",
                                             "makespan_cycles": profile.makespan})
    trace.process(HOST_PID, "host", {0: "host"})
    for core in range(hw.cores):
        trace.process(core + 1, f"core {core}", {COMPUTE: "compute", DMA: "DMA",
                                                 ENGINE: "DMA engine"})
    for r in profile.records:
        pid = r.core + 1
        if r.wait_cycles:
            trace.slice(pid, COMPUTE, "wait", r.start - r.wait_cycles, r.start, "wait",
                        {"before": r.name})
        trace.slice(pid, COMPUTE, r.name, r.start, r.end, r.bound,
                    {"op": r.op, "loc": r.loc, "class": r.op_class, "mapping": r.mapping,
                     "cycles": r.own_cycles, "macs": r.macs, "ddr_bytes": r.ddr_bytes,
                     "terms": r.terms})
        if r.dma is not None:
            lane = ENGINE if r.bound in ("prefetch", "spill") else DMA
            trace.slice(pid, lane, "dma", r.dma[0], r.dma[1], "dma",
                        {"node": r.name, "loc": r.loc, "bytes": r.ddr_bytes,
                         "transfers": r.transfers})
    for k, st in enumerate(profile.stages):
        if not st["device"]:
            trace.slice(HOST_PID, 0, f"host stage {k}", st["start"], st["end"], "host",
                        {"nodes": st["nodes"], "note": "host time is not modelled"})
    return trace
