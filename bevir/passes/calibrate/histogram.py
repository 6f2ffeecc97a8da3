"""Histograms of a value's elements on a power-of-two grid: counts that do not depend on the
order or the split the values arrive in, and merge exactly."""
from __future__ import annotations

import math

import numpy as np

from .keys import CalibrationError


class Histogram:
    """Counts in ``num_bins`` equal bins spanning ``[-threshold, threshold)``; zero lies on the
    middle edge.

    The bin width is a power of two, the smallest with ``max |x| < threshold = half * width``,
    and a value's bin is ``floor(x / width)`` computed exactly. So the counts of a set of
    values do not depend on the order or the split they arrive in: when larger values widen
    the bins, neighbouring bins (never straddling zero) are summed, which is what counting
    at the wider bins would have given, and two histograms :meth:`merge` exactly (the
    statistics of data sets split over workers add up to those of one pass). While every
    value seen is exactly 0, ``threshold`` is 0 and they count in the bin right of zero.
    """

    def __init__(self, num_bins: int = 2048, counts: np.ndarray | None = None,
                 threshold: float = 0.0):
        if num_bins < 2:
            raise CalibrationError(f"histograms need at least 2 bins, got {num_bins}")
        self.num_bins = num_bins + num_bins % 2
        self.counts = (np.zeros(self.num_bins, np.int64) if counts is None
                       else np.asarray(counts, np.int64).copy())
        self.threshold = float(threshold)
        if self.counts.ndim != 1 or self.counts.size % 2 or self.counts.size < 2:
            raise CalibrationError(f"histogram counts must be an even number of bins, got "
                                   f"shape {list(self.counts.shape)}")

    @property
    def half(self) -> int:
        """Bins on each side of zero."""
        return self.counts.size // 2

    @property
    def width(self) -> float:
        return self.threshold / self.half

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def edges(self) -> np.ndarray:
        return (np.arange(-self.half, self.half + 1)) * self.width

    def folded(self) -> np.ndarray:
        """Counts of ``|x|`` in bins ``[k * width, (k + 1) * width)``, k = 0 .. half-1."""
        h = self.half
        return self.counts[h:] + self.counts[h - 1::-1]

    def add(self, x: np.ndarray, absmax: float | None = None) -> None:
        """Count the (finite) values ``x``; ``absmax`` is ``max |x|`` when known."""
        x = np.asarray(x).reshape(-1)
        if x.size == 0:
            return
        absmax = float(np.abs(x).max()) if absmax is None else absmax
        if absmax >= self.threshold and absmax > 0.0:
            self._widen(self._exponent_for(absmax))
        if self.threshold == 0.0:
            self.counts[self.half] += x.size
            return
        # float64 scaling by a power of two is exact: the bin never depends on rounding
        idx = np.floor(np.ldexp(x.astype(np.float64), -self._exponent)).astype(np.int64)
        idx += self.half
        self.counts += np.bincount(idx, minlength=self.counts.size)

    def merge(self, other: Histogram) -> Histogram:
        """Add ``other``'s counts (the wider of the two bin widths wins); returns self."""
        if other.counts.size != self.counts.size:
            raise CalibrationError(f"cannot merge histograms of {self.counts.size} and "
                                   f"{other.counts.size} bins")
        if other.threshold > self.threshold:
            self._widen(other._exponent)
        theirs = Histogram(self.num_bins, other.counts, other.threshold)
        if theirs.threshold != 0.0 and self.threshold != 0.0:
            theirs._widen(self._exponent)
        self.counts += theirs.counts
        return self

    @property
    def _exponent(self) -> int:
        """``log2(width)``; CalibrationError where the width is not a power of two (a
        histogram saved by an older bevir can be read, not extended)."""
        mantissa, exponent = math.frexp(self.width)
        if mantissa != 0.5 or self.counts.size != self.num_bins:
            raise CalibrationError(f"{self!r} is not on the power-of-two grid (saved by an "
                                   "older bevir?): calibrate again to extend it")
        return exponent - 1

    def _exponent_for(self, absmax: float) -> int:
        """The smallest ``e`` with ``absmax < half * 2**e``."""
        e = math.frexp(absmax / self.half)[1]
        while self.half * math.ldexp(1.0, e - 1) > absmax:
            e -= 1
        while self.half * math.ldexp(1.0, e) <= absmax:
            e += 1
        return e

    def _widen(self, exponent: int) -> None:
        """Re-bin to width ``2**exponent`` (not narrower than now): bin ``k`` (counted from
        zero) becomes ``floor(k / 2**shift)``."""
        if self.threshold == 0.0:           # only zeros so far: they stay in the bin right of 0
            self.threshold = self.half * math.ldexp(1.0, exponent)
            return
        shift = exponent - self._exponent
        if shift <= 0:
            return
        k = np.arange(-self.half, self.half, dtype=np.int64) >> min(shift, 63)
        self.counts = _summed(self.counts, k + self.half)
        self.threshold = self.half * math.ldexp(1.0, exponent)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Histogram) and self.threshold == other.threshold
                and self.num_bins == other.num_bins and np.array_equal(self.counts, other.counts))

    def __repr__(self) -> str:
        return f"Histogram({self.counts.size} bins over ±{self.threshold:g}, {self.total} values)"


def _summed(counts: np.ndarray, into: np.ndarray) -> np.ndarray:
    """``counts[i]`` summed into bins ``into[i]`` (exact integers)."""
    out = np.zeros_like(counts)
    np.add.at(out, into, counts)
    return out
