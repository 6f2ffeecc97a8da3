"""Calibration over a frame set, in this process or on Ray.

    ranges = bevir.scale.calibrate(graph, Frames("frames/"), workers=Workers(ray="local"),
                                   method="entropy")

Each chunk of frames is measured by a worker with a twin of the driver's
:class:`~bevir.passes.calibrate.Calibrator` (same points, same options); the statistics
come back and merge exactly (min/max, counts, histograms on a common power-of-two grid),
so the ranges are bit for bit those of ``bevir.calibrate(graph, list(frames))`` whatever
the split. A frame that raises is left out, reported with its index (see
:class:`FrameFailure`), and the rest complete.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.graph import Graph
from ..passes.calibrate import Calibrator, Feed, Ranges, TensorRange
from ..passes.calibrate import calibrate as calibrate_inputs
from ..progress import Progress
from .frames import Frames
from .runner import GraphRef, ScaleError, Workers, describe


@dataclass(frozen=True)
class FrameFailure:
    """A frame whose run raised: its index and the error, in one line."""

    frame: int
    error: str

    def __str__(self) -> str:
        return f"frame {self.frame}: {self.error}"


class FrameFeed(Feed):
    """The frames ``indices`` (default all) of a frame set, measured by ``workers``.
    After feeding, ``failures`` lists the frames that raised."""

    def __init__(self, frames: Frames, workers: Workers | None = None,
                 indices: Sequence[int] | None = None, progress: bool | None = None):
        self.frames, self.workers = frames, workers or Workers()
        self.indices = list(range(len(frames))) if indices is None else \
            [frames.index_of(i) for i in indices]
        self.progress = progress
        self.failures: list[FrameFailure] = []

    def feed(self, calibrator: Calibrator) -> int:
        if not self.indices:
            raise ScaleError(f"no frames to calibrate on ({self.frames.path})")
        shared = (GraphRef(calibrator.graph), calibrator.spec(), self.frames)
        parts: dict[int, tuple[list[TensorRange], int, list[FrameFailure]]] = {}
        chunks = self.workers.chunks(self.indices)
        with Progress(len(self.indices), "calibrate", self.progress, unit="frames") as bar:
            for k, part in self.workers.map(_measure, shared, chunks):
                parts[k] = part
                bar.update(part[1] + len(part[2]))
        fed = 0
        for k in sorted(parts):                 # merging is exact in any order; keep one
            stats, count, failures = parts[k]
            if count:
                calibrator.merge(stats, count)
            fed += count
            self.failures += failures
        if fed == 0:
            raise ScaleError(f"every frame failed; the first: {self.failures[0]}")
        return fed


def _measure(shared: tuple[GraphRef, dict[str, Any], Frames], indices: list[int]
             ) -> tuple[list[TensorRange], int, list[FrameFailure]]:
    """The statistics of the frames ``indices`` (frames that raise left out)."""
    ref, spec, frames = shared
    graph = ref.graph
    total = Calibrator(graph, **spec)
    count, failures = 0, []
    for i in indices:
        one = Calibrator(graph, **spec, progress=False)
        try:
            one.feed([frames[i]])
        except Exception as e:                  # reported by index; the rest go on
            failures.append(FrameFailure(i, describe(e)))
            continue
        total.merge(one.statistics(), 1)
        count += 1
    return total.statistics(), count, failures


def calibrate(graph: Graph, frames: Frames | str, *, workers: Workers | None = None,
              indices: Sequence[int] | None = None, progress: bool | None = None,
              **options: Any) -> tuple[Ranges, list[FrameFailure]]:
    """:func:`bevir.calibrate` over the frames of a frame set (a :class:`Frames` or its
    folder), measured by ``workers`` (default: this process); ``options`` are
    ``bevir.calibrate``'s. Returns the ranges and the frames that failed (left out)."""
    frames = Frames(frames) if isinstance(frames, str) else frames
    feed = FrameFeed(frames, workers, indices, progress)
    ranges = calibrate_inputs(graph, feed, progress=False, **options)
    return ranges, feed.failures
