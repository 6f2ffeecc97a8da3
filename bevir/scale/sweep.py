"""The design-space sweep (:mod:`bevir.flows.sweep`) with one task per hardware config.

    points = bevir.scale.sweep(graph, HWConfig.preset("qc-u"), cores=[1, 2, 4, 8],
                               macs=[8, 16], workers=Workers(ray="local"))

The points are those of the local sweep, in the same (grid) order: each task plans and
models the graph exactly as the local sweep does (planning is deterministic).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..flows.sweep import SweepPoint, grid, model_point
from ..ir.graph import Graph
from ..target.hw import HWConfig
from .runner import GraphRef, Workers


def _model(ref: GraphRef, hw: HWConfig) -> SweepPoint:
    return model_point(ref.graph, hw)


def sweep(graph: Graph, base: HWConfig, cores: Sequence[int] = (), macs: Sequence[int] = (),
          ocm: Sequence[int] = (), *, workers: Workers | None = None,
          progress: Callable[[int, int, SweepPoint], None] | None = None) -> list[SweepPoint]:
    """:func:`bevir.flows.sweep.sweep` on ``workers`` (default: this process), one task
    per config; ``progress(i, total, point)`` as each finishes."""
    workers = workers or Workers()
    configs = grid(base, cores, macs, ocm)
    if not workers.distributed:
        from ..flows.sweep import sweep as local_sweep
        return local_sweep(graph, base, cores, macs, ocm, progress)
    points: list[SweepPoint | None] = [None] * len(configs)
    for i, (k, point) in enumerate(workers.map(_model, GraphRef(graph), configs), 1):
        points[k] = point
        if progress:
            progress(i, len(configs), point)
    return points
