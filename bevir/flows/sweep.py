"""The design-space sweep: one graph, partitioned and modelled on a grid of HWConfigs.

    points = sweep(graph, HWConfig.preset("qc-u"), cores=[1, 2, 4, 8], macs=[8, 16],
                   ocm=[4 * MB, 8 * MB, 16 * MB])
    print(format_table(points)); write(points, "sweep/")    # sweep.json, sweep.png

Each grid point is the base config with ``cores``, ``macs_per_pe`` and ``ocm_bytes``
replaced; the graph is planned for it exactly as ``bevir compile`` plans it
(bevir/flows/target.py: partition, memory plan) and modelled by bevir/target/cycles.py,
so a point's figures are what ``bevir sim`` reports for that config.
"""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..extras import pyplot
from ..fsutil import save_figure, write_atomic
from ..ir.graph import Graph
from ..target.hw import HWConfig, format_size
from .target import simulate


@dataclass(frozen=True)
class SweepPoint:
    """One modelled config: its makespan, per-core cycles and utilisation."""

    hw: HWConfig
    makespan: int
    cycles_per_core: list[int]
    utilisation: float
    ddr_bytes: int
    seconds: float

    @property
    def label(self) -> str:
        return self.hw.describe()

    def to_json(self) -> dict:
        return {"config": self.label, "cores": self.hw.cores, "macs_per_pe": self.hw.macs_per_pe,
                "ocm_bytes": self.hw.ocm_bytes, "makespan_cycles": self.makespan,
                "cycles_per_core": self.cycles_per_core, "utilisation": self.utilisation,
                "ddr_bytes": self.ddr_bytes,
                "model_seconds": self.seconds, "hw": self.hw.model_dump(),
                "hw_hash": self.hw.hash}


def grid(base: HWConfig, cores: Sequence[int] = (), macs: Sequence[int] = (),
         ocm: Sequence[int] = ()) -> list[HWConfig]:
    """Every (cores, MACs per PE, OCM bytes) of the grid as a config, cores slowest; an
    empty axis keeps the base's value."""
    configs = []
    for n, m, o in itertools.product(cores or [base.cores], macs or [base.macs_per_pe],
                                     ocm or [base.ocm_bytes]):
        hw = base.model_copy(update={"cores": n, "macs_per_pe": m, "ocm_bytes": o,
                                     "name": f"{base.name} {format_size(o)} {m}MAC x{n}"})
        configs.append(HWConfig(**hw.model_dump()))    # validate the updated fields
    return configs


def model_point(graph: Graph, hw: HWConfig) -> SweepPoint:
    """``graph`` planned for ``hw`` as ``bevir compile`` plans it, and modelled."""
    t = time.perf_counter()
    profile = simulate(graph, hw)
    return SweepPoint(hw, profile.makespan, profile.cycles_per_core, profile.utilisation,
                      profile.ddr_bytes, time.perf_counter() - t)


def sweep(graph: Graph, base: HWConfig, cores: Sequence[int] = (), macs: Sequence[int] = (),
          ocm: Sequence[int] = (),
          progress: Callable[[int, int, SweepPoint], None] | None = None) -> list[SweepPoint]:
    """Model ``graph`` on every config of :func:`grid`. ``progress(i, total, point)``
    after each point."""
    configs = grid(base, cores, macs, ocm)
    points = []
    for i, hw in enumerate(configs, 1):
        points.append(model_point(graph, hw))
        if progress:
            progress(i, len(configs), points[-1])
    return points


def format_table(points: Sequence[SweepPoint]) -> str:
    """config, makespan, utilisation and core-0 cycles, one line per point; the best
    makespan is marked with '*'."""
    best = min((p.makespan for p in points), default=0)
    width = max([len(p.label) for p in points] + [6])
    lines = [f"  {'config':<{width}}  {'makespan':>14}  {'util':>7}  {'core 0':>14}"]
    for p in points:
        mark = "*" if p.makespan == best else " "
        lines.append(f"{mark} {p.label:<{width}}  {p.makespan:>14,}  {p.utilisation:>7.1%}  "
                     f"{p.cycles_per_core[0]:>14,}")
    return "\n".join(lines)


def write(points: Sequence[SweepPoint], out_dir: str | Path, plot: bool = True) -> list[Path]:
    """sweep.json (every point, its config and hash) and (``plot``) sweep.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.json"
    write_atomic(path, json.dumps({"points": [p.to_json() for p in points]}, indent=1))
    return [path] + ([sweep_plot(points, out / "sweep.png")] if plot else [])


def sweep_plot(points: Sequence[SweepPoint], path: Path) -> Path:
    """Makespan (bars) and utilisation (line) per config."""
    plt = pyplot()
    xs = range(len(points))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(points) + 2), 4.5))
    ax.bar(xs, [p.makespan for p in points], color="tab:blue")
    ax.set_ylabel("makespan (cycles)", color="tab:blue")
    ax.set_xticks(list(xs), [p.label for p in points], rotation=60, ha="right", fontsize=7)
    ax2 = ax.twinx()
    ax2.plot(xs, [100 * p.utilisation for p in points], "o-", color="tab:red")
    ax2.set_ylabel("utilisation (%)", color="tab:red")
    ax2.set_ylim(0, max([100 * p.utilisation for p in points] + [1]) * 1.15)
    ax.set_title("design-space sweep")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
    return path
