"""Statistics -> range: :class:`RangeMethod` (``minmax``, ``percentile``, ``mse``,
``entropy``) and the thresholds of the histogram methods."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .histogram import Histogram
from .keys import CalibrationError
from .tensor_range import TensorRange

METHODS = ("minmax", "percentile", "mse", "entropy")

#: RangeMethod's fields: (name, the types it takes, how an error says it)
_METHOD_FIELDS = (("name", (str,), "a string"), ("symmetric", (bool, np.bool_), "a boolean"),
                  ("bits", (int, np.integer), "an integer"),
                  ("percentile", (int, float, np.integer, np.floating), "a number"))


@dataclass(frozen=True)
class RangeMethod:
    """How a measured value's range is chosen from its statistics.

    - ``minmax``: the observed min and max.
    - ``percentile``: cut ``(100 - percentile) / 2`` percent off each tail (with
      ``symmetric``: the ``percentile`` of ``|x|``, cut on both sides).
    - ``mse``: the threshold ``t`` minimizing the mean squared error of symmetric
      ``bits``-bit quantization (scale ``t / (2**(bits-1) - 1)``, values clipped to ±t)
      over candidate thresholds on the histogram's bin edges.
    - ``entropy``: the threshold minimizing the KL divergence between the ``|x|``
      histogram and its ``2**(bits-1)``-level quantization (TensorRT's method).

    Thresholds become ``(max(min, -t), min(max, t))``: never wider than what was seen.
    Per-channel statistics stay min/max. Histogram methods need a histogram.
    """

    name: str = "minmax"
    percentile: float = 99.99
    symmetric: bool = False
    bits: int = 8

    def __post_init__(self):
        for field, kinds, what in _METHOD_FIELDS:     # strictly: "yes" is no boolean
            v = getattr(self, field)
            if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
                raise CalibrationError(f"range method: {field} must be {what}, got {v!r}")
        if self.name not in METHODS:
            raise CalibrationError(f"unknown calibration method '{self.name}'; methods: "
                                   f"{', '.join(METHODS)}")
        if not 0.0 < self.percentile <= 100.0:
            raise CalibrationError(f"percentile must be in (0, 100], got {self.percentile!r}")
        if not 2 <= self.bits <= 16:
            raise CalibrationError(f"bits must be in 2..16, got {self.bits!r}")

    @property
    def needs_histogram(self) -> bool:
        return self.name != "minmax"

    def choose(self, r: TensorRange) -> tuple[float, float]:
        """The range of ``r`` by this method."""
        if r.count == 0:
            return 0.0, 0.0
        if self.name == "minmax":
            return r.min, r.max
        if r.histogram is None:
            raise CalibrationError(f"method '{self.name}' needs a histogram of {r.key}; "
                                   "calibrate with histogram=True or with that method")
        if r.histogram.threshold == 0.0:
            return r.min, r.max
        if self.name == "percentile":
            return self._percentile(r)
        t = (mse_threshold if self.name == "mse" else entropy_threshold)(r.histogram, self.bits)
        return max(r.min, -t), min(r.max, t)

    def _percentile(self, r: TensorRange) -> tuple[float, float]:
        h = r.histogram
        if self.symmetric:
            cdf = np.cumsum(h.folded()) / h.total
            t = (np.searchsorted(cdf, self.percentile / 100.0) + 1) * h.width
            return max(r.min, -t), min(r.max, t)
        tail = (100.0 - self.percentile) / 200.0
        cdf = np.cumsum(h.counts) / h.total
        edges = h.edges
        lo = edges[np.searchsorted(cdf, tail, side="right")]
        hi = edges[min(np.searchsorted(cdf, 1.0 - tail) + 1, edges.size - 1)]
        return max(r.min, float(lo)), min(r.max, float(hi))


def _candidates(first: int, last: int, at_most: int) -> np.ndarray:
    """At most ``at_most`` bin counts evenly spread over ``first .. last``."""
    return np.unique(np.linspace(first, last, min(last - first + 1, at_most)).round()
                     .astype(np.int64))


def mse_threshold(h: Histogram, bits: int = 8, candidates: int = 512) -> float:
    """The threshold minimizing symmetric ``bits``-bit quantization error over ``h``."""
    counts = h.folded().astype(np.float64)
    centers = (np.arange(counts.size) + 0.5) * h.width
    qmax = 2 ** (bits - 1) - 1
    thresholds = _candidates(1, counts.size, candidates) * h.width
    errors = np.empty(thresholds.size)
    for start in range(0, thresholds.size, 64):     # 64 candidates x all bins at a time
        scale = thresholds[start:start + 64, None] / qmax
        q = np.minimum(np.round(centers / scale), qmax) * scale
        errors[start:start + 64] = ((centers - q) ** 2 * counts).sum(axis=1)
    return float(thresholds[int(np.argmin(errors))])


def _kl(counts: np.ndarray, i: int, levels: int, eps: float = 1e-8) -> float:
    """KL divergence of ``counts[:i]`` (outliers added to the last bin) from its
    quantization into ``levels`` levels (empty bins of the quantized one count as ``eps``)."""
    p = counts[:i].copy()
    p[-1] += counts[i:].sum()
    group = np.arange(i) * levels // i
    merged = np.bincount(group, weights=counts[:i], minlength=levels)
    used = np.bincount(group, weights=(p != 0), minlength=levels)
    q = np.where(p != 0, merged[group] / np.maximum(used[group], 1), 0.0)
    if q.sum() == 0:
        return math.inf
    nz = p != 0
    p, q = p[nz] / p.sum(), np.maximum(q[nz] / q.sum(), eps)
    return float((p * np.log(p / q)).sum())


def entropy_threshold(h: Histogram, bits: int = 8, candidates: int = 256) -> float:
    """The threshold minimizing the KL divergence of the quantized ``|x|`` histogram."""
    counts = h.folded().astype(np.float64)
    levels = 2 ** (bits - 1)
    bins = _candidates(min(levels, counts.size), counts.size, candidates)
    divergence = [_kl(counts, int(i), min(levels, int(i))) for i in bins]
    return float(bins[int(np.argmin(divergence))] * h.width)
