"""One value's statistics: :class:`TensorRange`, what calibration knows about a value."""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .histogram import Histogram
from .keys import CalibrationError, ValueKey


@dataclass(eq=False)
class TensorRange:
    """What calibration knows about one value.

    ``min``/``max``: over every finite element seen (``nonfinite`` counts the others);
    ``lo``/``hi``: the range chosen by the method (see :class:`RangeMethod`); per-channel
    ``channel_min``/``channel_max`` along ``axis`` of the value as measured (``shape``);
    ``histogram`` when a method needs one. ``source``: ``calibration``, ``tranges``,
    ``onnxruntime`` or ``given``; only measured entries can be re-ranged.
    """

    key: ValueKey
    min: float = math.inf
    max: float = -math.inf
    lo: float = 0.0
    hi: float = 0.0
    op: str = ""
    source: str = "calibration"
    shape: tuple[int, ...] | None = None
    count: int = 0
    nonfinite: int = 0
    samples: int = 0
    axis: int | None = None
    channel_min: np.ndarray | None = None
    channel_max: np.ndarray | None = None
    histogram: Histogram | None = None

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def range(self) -> tuple[float, float]:
        return self.lo, self.hi

    @classmethod
    def given(cls, name: str, lo: float, hi: float, source: str = "given", *,
              channel_min: np.ndarray | None = None, channel_max: np.ndarray | None = None,
              axis: int | None = None) -> TensorRange:
        """A range known from elsewhere (a file, another tool): its min/max are its range."""
        lo, hi = float(lo), float(hi)
        if not lo <= hi:
            raise CalibrationError(f"range of %{name} has min {lo!r} > max {hi!r}")
        return cls(ValueKey(name), lo, hi, lo, hi, source=source, axis=axis,
                   channel_min=channel_min, channel_max=channel_max)

    def observe(self, x: np.ndarray) -> None:
        """Fold one array of the value into the statistics."""
        x = np.asarray(x)
        self.samples += 1
        if x.size == 0:
            return
        lo, hi = x.min(), x.max()
        if not (np.isfinite(lo) and np.isfinite(hi)):
            finite = np.isfinite(x)
            self.nonfinite += int(x.size - finite.sum())
            self._observe_channels(np.where(finite, x, np.nan))
            x = x[finite]
            if x.size == 0:
                return
            lo, hi = x.min(), x.max()
        else:
            self._observe_channels(x)
        self.count += x.size
        self.min, self.max = min(self.min, float(lo)), max(self.max, float(hi))
        if self.histogram is not None:
            self.histogram.add(x, max(-float(lo), float(hi)))

    def _observe_channels(self, x: np.ndarray) -> None:
        if self.axis is None:
            return
        others = tuple(i for i in range(x.ndim) if i != self.axis)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # an all-non-finite channel
            cmin = np.nanmin(x, axis=others).astype(np.float64)
            cmax = np.nanmax(x, axis=others).astype(np.float64)
        if self.channel_min is None:
            self.channel_min, self.channel_max = cmin, cmax
        else:
            self.channel_min = np.fmin(self.channel_min, cmin)
            self.channel_max = np.fmax(self.channel_max, cmax)

    def merge(self, other: TensorRange) -> TensorRange:
        """Fold in the statistics of the same value measured on other samples (another
        worker's share of a data set); returns self. Exact: the result does not depend on
        how the samples were split or in which order the parts merge."""
        if (other.key.name, other.shape, other.axis) != (self.key.name, self.shape, self.axis):
            raise CalibrationError(f"cannot merge statistics of %{other.key.name} "
                                   f"{other.shape} axis {other.axis} into %{self.key.name} "
                                   f"{self.shape} axis {self.axis}")
        if (self.histogram is None) != (other.histogram is None):
            raise CalibrationError(f"cannot merge statistics of %{self.name} with and "
                                   "without a histogram")
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.count += other.count
        self.nonfinite += other.nonfinite
        self.samples += other.samples
        if other.channel_min is not None:
            if self.channel_min is None:
                self.channel_min, self.channel_max = (other.channel_min.copy(),
                                                      other.channel_max.copy())
            else:
                self.channel_min = np.fmin(self.channel_min, other.channel_min)
                self.channel_max = np.fmax(self.channel_max, other.channel_max)
        if other.histogram is not None:
            self.histogram.merge(other.histogram)
        return self

    def copy(self) -> TensorRange:
        """A snapshot: later observations of this entry (or changes to its arrays) do not
        change it."""
        hist = self.histogram
        arrays = {f: getattr(self, f).copy() for f in ("channel_min", "channel_max")
                  if getattr(self, f) is not None}
        return dataclasses.replace(self, histogram=None if hist is None else
                                   Histogram(hist.num_bins, hist.counts, hist.threshold),
                                   **arrays)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorRange):
            return NotImplemented
        arrays = ("channel_min", "channel_max")
        return all(_same(getattr(self, f.name), getattr(other, f.name), f.name in arrays)
                   for f in dataclasses.fields(self))


def _same(a: Any, b: Any, array: bool) -> bool:
    if array:
        return (a is None) == (b is None) and (a is None or np.array_equal(a, b, equal_nan=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
