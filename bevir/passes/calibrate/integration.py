"""Calibration in a program and in a pipeline: :func:`calibrate`, the :class:`Calibration`
analysis (the graph's attached ranges, resolved) and the ``calibrate`` pass."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ...errors import PassError
from ...ir.graph import Graph, Value
from ..analysis import AnalysisManager
from ..core import Pass
from .calibrator import Axis, Calibrator, Feed, Selector
from .files import load_inputs
from .keys import CalibrationError, calibratable_values, provenance
from .methods import RangeMethod
from .result import Ranges, ranges_of
from .tensor_range import TensorRange


def calibrate(graph: Graph,
              inputs: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]] | Feed,
              *, method: str = "minmax", percentile: float = 99.99, symmetric: bool = False,
              bits: int = 8, num_bins: int = 2048, histogram: bool | None = None,
              per_channel: bool = False, axis: Axis = "auto", ops: Sequence[str] = (),
              loc: str | None = None, names: Sequence[str] = (),
              seed: Ranges | str | Path | None = None, progress: bool | None = None,
              attach: bool = True) -> Ranges:
    """Measure activation ranges of ``graph`` on ``inputs`` (one dict, an iterable of
    dicts, or a :class:`Feed` such as ``bevir.scale.Frames``) with the golden interpreter.

    ``method``/``percentile``/``symmetric``/``bits``: see :class:`RangeMethod`;
    ``histogram`` (default: when the method needs one) and ``num_bins``: the histograms;
    ``per_channel``/``axis``: per-channel min/max (see :func:`channel_axis`);
    ``ops``/``loc``/``names``: see :class:`Selector`; ``seed``: known ranges (a Ranges or
    a ranges/tranges file) kept as they are, their values not measured again;
    ``progress``: a progress bar on stderr (None: when stderr is a terminal);
    ``attach``: make the result the graph's calibration (see :meth:`Ranges.attach`).
    """
    m = RangeMethod(method, percentile, symmetric, bits)
    seeded = (seed if isinstance(seed, Ranges)
              else Ranges.load(seed) if seed is not None else Ranges())
    seeded.rekey(graph)
    cal = Calibrator(graph, select=Selector(tuple(ops), loc, tuple(names)), per_channel=per_channel,
                     axis=axis, histogram=m.needs_histogram if histogram is None else histogram,
                     num_bins=num_bins, progress=progress, skip=seeded)
    cal.feed(inputs)
    result = Ranges(seeded, m).update(cal.ranges(m))
    return result.attach(graph) if attach else result


class AttachedRanges:
    """The graph's attached ranges, resolved against its current values: an analysis,
    ``am.get(AttachedRanges)``. Recomputed after a rewrite, it re-keys the ranges to the new
    graph, so passes after it keep finding them. CalibrationError if nothing is attached."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.refresh()

    def refresh(self) -> None:
        """Re-read and re-resolve the attached ranges (after they were replaced)."""
        ranges = ranges_of(self.graph)
        if ranges is None:
            raise CalibrationError(f"graph @{self.graph.name} has no calibration: run the "
                                   "'calibrate' pass (inputs=FILE or ranges=FILE) or "
                                   "bevir.calibrate(graph, inputs) first")
        ranges.rekey(self.graph)
        self.ranges = ranges
        self._found = ranges.resolve(self.graph)

    def get(self, value: Value) -> TensorRange | None:
        return self._found.get(value)

    def range(self, value: Value) -> tuple[float, float]:
        """``(lo, hi)``; CalibrationError naming the node, op and loc when there is none."""
        e = self._found.get(value)
        if e is None:
            raise CalibrationError("no calibrated range", **provenance(value))
        return e.range

    @property
    def missing(self) -> list[Value]:
        """Float values (inputs and results) without a range, in graph order."""
        return [v for v in calibratable_values(self.graph)
                if v.type.dtype.is_float and v not in self._found]

    def __len__(self) -> int:
        return len(self._found)


class Calibrate(Pass):
    """Measure activation ranges with the golden interpreter and attach them to the graph
    for later passes (``am.get(AttachedRanges)``). Needs ``inputs`` (a safetensors file, see
    :func:`load_inputs`) or ``ranges`` (seed ranges: a ranges or tranges file) or both;
    seeded values are not measured. ``ops`` is comma-separated, ``loc`` a glob;
    ``output`` writes the ranges; ``progress=false`` hides the progress bar (shown when
    stderr is a terminal)."""

    name = "calibrate"
    description = "measure activation ranges with the golden interpreter"
    preserves = (AttachedRanges,)

    inputs: str = ""
    ranges: str = ""
    output: str = ""
    method: str = "minmax"
    percentile: float = 99.99
    symmetric: bool = False
    num_bins: int = 2048
    per_channel: bool = False
    axis: str = "auto"
    ops: str = ""
    loc: str = ""
    progress: bool = True

    def __post_init__(self):
        super().__post_init__()
        try:
            RangeMethod(self.method, self.percentile, self.symmetric)
            if self.axis not in ("auto", "last") and not _is_int(self.axis):
                raise CalibrationError(f"axis must be 'auto', 'last' or an int, got '{self.axis}'")
        except CalibrationError as e:
            raise PassError(f"pass '{self.name}': {e.message}") from None

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        if not self.inputs and not self.ranges:
            raise CalibrationError("needs inputs=FILE (graph inputs, .safetensors) or "
                                   "ranges=FILE (seed ranges)")
        seed = Ranges.load(self.ranges) if self.ranges else Ranges()
        self.stat("seeded", len(seed))
        if self.inputs:
            samples = load_inputs(self.inputs, graph)
            axis = int(self.axis) if _is_int(self.axis) else self.axis
            ops = tuple(o.strip() for o in self.ops.replace(" ", ",").split(",") if o.strip())
            result = calibrate(graph, samples, method=self.method, percentile=self.percentile,
                               symmetric=self.symmetric, num_bins=self.num_bins,
                               per_channel=self.per_channel, axis=axis, ops=ops,
                               loc=self.loc or None, seed=seed,
                               progress=None if self.progress else False)
            self.stat("samples", len(samples))
            self.stat("measured", len(result) - len(seed))
        else:
            result = seed.attach(graph)
        cached = am.cached(AttachedRanges)
        if cached is not None:
            cached.refresh()
        if self.output:
            result.save(self.output)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
