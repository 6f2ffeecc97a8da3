"""Calibration points and running samples through the golden interpreter: :class:`Selector`
chooses the values, :class:`Calibrator` holds a :class:`TensorRange` per value and feeds it
node by node while the interpreter runs (activations are never kept), :class:`Feed` is a
set of samples that measures itself elsewhere."""
from __future__ import annotations

import abc
import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ...ir.graph import Graph, Node, Value
from ...progress import Progress
from ...sim.interpreter import Interpreter
from .histogram import Histogram
from .keys import CalibrationError, ValueKey, calibratable_values
from .methods import RangeMethod
from .result import Ranges
from .tensor_range import TensorRange

Axis = Union[str, int, Callable[[Value], Union[int, None]]]


# ---- choosing values ----------------------------------------------------------------------
@dataclass(frozen=True)
class Selector:
    """Which values get calibration points: float values that are not constants, whose
    producer's op is in ``ops`` (if given), whose producer's ``loc`` matches the glob
    ``loc`` (if given) and whose name is in ``names`` (if given). Graph inputs have no op
    or loc: they are chosen unless ``ops`` or ``loc`` is given."""

    ops: tuple[str, ...] = ()
    loc: str | None = None
    names: tuple[str, ...] = ()

    def __post_init__(self):
        from ...ops import all_ops
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "_names", frozenset(self.names))    # fast membership
        unknown = sorted(set(self.ops) - set(all_ops()))
        if unknown:
            raise CalibrationError(f"selector: unknown op(s) {unknown}")

    def chooses(self, v: Value) -> bool:
        if not v.type.dtype.is_float or v.is_const or (self.names and v.name not in self._names):
            return False
        p = v.producer
        if p is None:
            return not self.ops and self.loc is None
        return ((not self.ops or p.op in self.ops)
                and (self.loc is None or fnmatch.fnmatchcase(p.loc, self.loc)))

    def values(self, graph: Graph) -> list[Value]:
        """The chosen values in graph order; CalibrationError if there are none."""
        missing = sorted(set(self.names) - {v.name for v in graph.values()})
        if missing:
            raise CalibrationError(f"selector: no value(s) {missing} in graph @{graph.name}")
        chosen = [v for v in calibratable_values(graph) if self.chooses(v)]
        if not chosen:
            raise CalibrationError(f"selector {self} chooses no float value of graph @{graph.name}")
        return chosen


def channel_axis(value: Value, axis: Axis = "auto") -> int | None:
    """The per-channel axis of ``value``: ``"auto"`` is the layout's channel axis, else 1
    for rank-4 tensors (the 2-D ops read plain rank-4 tensors as NCHW), else the last axis
    (token-major ``[..., tokens, channels]``); ``"last"``; an int (None where out of
    range); or a callable ``value -> axis | None``."""
    rank = value.type.rank
    if callable(axis):
        return axis(value)
    if rank == 0:
        return None
    if axis == "auto":
        ch = value.type.layout.channel_axis
        return ch if ch is not None else (1 if rank == 4 else rank - 1)
    if axis == "last":
        return rank - 1
    if isinstance(axis, int) and not isinstance(axis, bool):
        return axis % rank if -rank <= axis < rank else None
    raise CalibrationError(f"axis must be 'auto', 'last', an int or a callable, got {axis!r}")


# ---- running ------------------------------------------------------------------------------
class CalibrationObserver:
    """Calibration points as an interpreter hook: passed as ``on_node_end``, it folds the
    chosen results into their :class:`TensorRange` after each node; :meth:`observe_inputs`
    folds in a run's graph inputs."""

    def __init__(self, points: Mapping[int, TensorRange], progress: Progress | None = None):
        self.points, self.progress = points, progress

    def __call__(self, node: Node, args: list[np.ndarray | None], results: list[np.ndarray]
                 ) -> None:
        for v, r in zip(node.outputs, results):
            point = self.points.get(id(v))
            if point is not None:
                point.observe(r)
        if self.progress is not None:
            self.progress.update()

    def observe_inputs(self, graph: Graph, inputs: Mapping[str, np.ndarray]) -> None:
        for v in graph.inputs:
            point = self.points.get(id(v))
            if point is not None:
                point.observe(np.asarray(inputs[v.name]).astype(v.type.dtype.np, copy=False))


class Feed(abc.ABC):
    """Calibration samples that measure themselves: :meth:`feed` computes the statistics of
    ``calibrator``'s points on its samples (anywhere: other processes, other machines) and
    merges them in (:meth:`Calibrator.merge`); returns how many samples it fed."""

    @abc.abstractmethod
    def feed(self, calibrator: Calibrator) -> int:
        ...


class Calibrator:
    """Calibration points on the values ``select`` chooses (all float activations by
    default, minus those ``skip`` already has); :meth:`feed` runs samples through the
    golden interpreter, :meth:`ranges` turns the statistics into ranges."""

    def __init__(self, graph: Graph, *, select: Selector | None = None, per_channel: bool = False,
                 axis: Axis = "auto", histogram: bool = False, num_bins: int = 2048,
                 progress: bool | None = None, skip: Ranges | None = None):
        self.graph, self.progress, self.samples = graph, progress, 0
        chosen = (select or Selector()).values(graph)
        if skip is not None:
            chosen = [v for v in chosen if skip.get(v) is None]
        self.options = dict(per_channel=per_channel, axis=axis, histogram=histogram,
                            num_bins=num_bins)
        self.points: dict[int, TensorRange] = {
            id(v): self._point(v, **self.options) for v in chosen}

    @staticmethod
    def _point(v: Value, per_channel: bool, axis: Axis, histogram: bool, num_bins: int
               ) -> TensorRange:
        return TensorRange(ValueKey.of(v), op=v.producer.op if v.producer else "input",
                           shape=v.type.shape, axis=channel_axis(v, axis) if per_channel else None,
                           histogram=Histogram(num_bins) if histogram else None)

    def spec(self) -> dict[str, Any]:
        """Keyword arguments that make an empty Calibrator with the same points on a copy of
        the graph (another process's): ``Calibrator(copy, **cal.spec())``."""
        names = tuple(p.key.name for p in self.points.values())
        return dict(select=Selector(names=names), **self.options)

    def statistics(self) -> list[TensorRange]:
        """A snapshot of every point's statistics, in graph order."""
        return [p.copy() for p in self.points.values()]

    def merge(self, statistics: Iterable[TensorRange], samples: int) -> None:
        """Fold in statistics another Calibrator (``spec()``'s twin) measured on ``samples``
        other samples: the result is the same as feeding those samples here."""
        by_name = {p.key.name: p for p in self.points.values()}
        for s in statistics:
            point = by_name.get(s.key.name)
            if point is None:
                raise CalibrationError(f"cannot merge statistics of %{s.key.name}: not a "
                                       "calibration point here")
            point.merge(s)
        self.samples += samples

    def feed(self, inputs: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]] | Feed
             ) -> int:
        """Run one input dict, or each of an iterable of them; returns how many ran. A
        :class:`Feed` (samples measured elsewhere, e.g. ``bevir.scale``'s frames on Ray)
        folds its statistics in itself."""
        if isinstance(inputs, Feed):
            return inputs.feed(self)
        if not isinstance(inputs, Iterable):
            raise CalibrationError(f"calibration inputs must be a mapping of input name to array "
                                   f"or an iterable of them, got {type(inputs).__name__}")
        samples = [inputs] if isinstance(inputs, Mapping) else inputs
        total = len(samples) if hasattr(samples, "__len__") else None
        if total == 0:
            raise CalibrationError("no calibration inputs (an empty list)")
        if not self.points:
            return 0
        work = None if total is None else total * len(self.graph.nodes)
        bar = Progress(work, "calibrate", self.progress)
        observer = CalibrationObserver(self.points, bar)
        interp = Interpreter(self.graph, on_node_end=observer)
        count = 0
        try:
            for sample in samples:
                if not isinstance(sample, Mapping):
                    raise CalibrationError(
                        f"calibration sample {count} is a {type(sample).__name__}, "
                        "not a mapping of input name to array")
                interp.run(sample)
                observer.observe_inputs(self.graph, sample)
                count += 1
        finally:
            bar.close()
        if count == 0:
            raise CalibrationError("no calibration inputs (the iterable was empty)")
        self.samples += count
        return count

    def ranges(self, method: RangeMethod | str = "minmax", **options) -> Ranges:
        """The measured ranges by ``method`` (see :class:`RangeMethod`)."""
        if self.samples == 0 and self.points:
            raise CalibrationError("nothing measured yet: feed() the calibrator inputs first")
        return Ranges(p.copy() for p in self.points.values()).apply(method, **options)
