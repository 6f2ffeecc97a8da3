"""Calibration: activation ranges for INT8 quantization, measured with the golden model.

    import bevir
    ranges = bevir.calibrate(graph, samples, method="mse")   # one input dict, or many
    lo, hi = ranges.range(value)                              # a Value, a name or a ValueKey
    ranges.save("ranges.json")                                # + ranges.safetensors

The pieces, in order below:

- :class:`ValueKey`, :class:`Histogram`, :class:`TensorRange`, :class:`Ranges`: the result.
  A value's key is its name, the provenance (``loc``) of the node producing it and which
  result of that node it is. Lookup in a rewritten graph (see :meth:`Ranges.resolve`):
  by name when the provenance agrees; else by provenance (entries whose name no value of
  the graph holds any more, paired by op, then from the last backwards: the last value a
  module produces is the one that leaves it); else by name alone.
- :class:`RangeMethod`: statistics -> range: ``minmax``, ``percentile``, ``mse``,
  ``entropy``.
- :class:`Selector`, :class:`Calibrator`, :class:`CalibrationObserver`: calibration
  points on chosen values; statistics are streamed node by node while the interpreter
  runs, so activations are never kept.
- Seeding: :meth:`Ranges.from_tranges` (``bevir-tranges`` files) and
  :meth:`Ranges.from_onnxruntime` (onnxruntime's ``TensorsData``).
- Integration: :func:`calibrate`, the :class:`AttachedRanges` analysis and the
  ``calibrate`` pass (:class:`Calibrate`). Ranges attached to a graph
  (:meth:`Ranges.attach`) are what ``am.get(AttachedRanges)`` resolves for later passes.
  They are the graph's meta entry ``"ranges"`` (a registered key): clones, composed graphs
  and saved graphs carry them.
"""
from __future__ import annotations

import abc
import dataclasses
import fnmatch
import hashlib
import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..errors import BevirError, PassError
from ..fsutil import read_json, save_arrays, write_json
from ..ir.graph import Graph, Node, Value
from ..ir.meta import register_meta_key
from ..ir.serialize import check_document
from ..progress import Progress
from ..sim.interpreter import Interpreter
from .analysis import AnalysisManager
from .core import Pass

FORMAT, VERSION = "bevir-ranges", 1
TRANGES_FORMAT, TRANGES_VERSION = "bevir-tranges", 1
METHODS = ("minmax", "percentile", "mse", "entropy")
Axis = Union[str, int, Callable[[Value], Union[int, None]]]


class CalibrationError(BevirError):
    """Calibration was asked something impossible: an unknown method, missing inputs,
    a corrupt ranges file, a value without a range."""


def _where(value: Value) -> dict[str, str | None]:
    """The node/op/loc of a value's producer, for error messages."""
    p = value.producer
    if p is None:
        return dict(node="%" + value.name)
    return dict(node=p.name, op=p.op, loc=p.loc or None)


# ---- keys ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValueKey:
    """A value's stable identity: its name, its producer's provenance and result index.

    Graph inputs have ``loc == ""`` and ``index == 0``; so have entries seeded by name only
    (tranges, onnxruntime) until :meth:`Ranges.rekey` fills them in from a graph.
    """

    name: str
    loc: str = ""
    index: int = 0

    @classmethod
    def of(cls, value: Value) -> ValueKey:
        p = value.producer
        if p is None:
            return cls(value.name)
        return cls(value.name, p.loc, next(i for i, o in enumerate(p.outputs) if o is value))

    def __str__(self) -> str:
        return f"%{self.name}" + (f" from '{self.loc}'#{self.index}" if self.loc else "")


# ---- histograms ---------------------------------------------------------------------------
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


# ---- one value's statistics ---------------------------------------------------------------
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


# ---- statistics -> range ------------------------------------------------------------------
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


# ---- the result ---------------------------------------------------------------------------
_Item = Union[Value, ValueKey, str]


class Ranges:
    """Calibration results: one :class:`TensorRange` per value, by stable key.

    ``get(item)`` / ``ranges[item]`` / ``range(item)`` accept a :class:`Value` (resolved
    against its graph, see :meth:`resolve`), a :class:`ValueKey` or a value name.
    ``method`` is the :class:`RangeMethod` the ranges were chosen with.
    """

    def __init__(self, entries: Iterable[TensorRange] = (), method: RangeMethod | None = None):
        self.method = method or RangeMethod()
        self._entries: dict[str, TensorRange] = {}
        self._cache: tuple[Any, ...] | None = None
        for e in entries:
            self.add(e)

    # ---- contents -----------------------------------------------------------------------
    def add(self, entry: TensorRange) -> None:
        """Add an entry, replacing one of the same name."""
        self._entries[entry.key.name] = entry
        self._cache = None

    def copy(self) -> Ranges:
        """An independent copy (every entry copied)."""
        return Ranges((e.copy() for e in self), self.method)

    def update(self, other: Ranges) -> Ranges:
        """Add every entry of ``other`` (its entries win); returns self."""
        for e in other:
            self.add(e)
        return self

    def __iter__(self) -> Iterator[TensorRange]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: _Item) -> bool:
        return self.get(item) is not None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Ranges) and self.method == other.method
                and list(self._entries.items()) == list(other._entries.items()))

    def __repr__(self) -> str:
        return f"Ranges({len(self)} values, method={self.method.name})"

    # ---- lookup -------------------------------------------------------------------------
    def get(self, item: _Item) -> TensorRange | None:
        """The entry for a value, key or name; None if there is none."""
        if isinstance(item, str):
            return self._entries.get(item)
        if isinstance(item, ValueKey):
            e = self._entries.get(item.name)
            return e if e is not None else self._by_provenance(item)
        graph = item.producer.graph if item.producer is not None else None
        if graph is None:
            e = self._entries.get(item.name)
            return e if e is not None and _loc_agrees(e.key, item) else None
        return self._resolved(graph).get(item)

    def __getitem__(self, item: _Item) -> TensorRange:
        e = self.get(item)
        if e is None:
            where = _where(item) if isinstance(item, Value) else dict(node=f"%{_name(item)}")
            raise CalibrationError("no calibrated range", **where)
        return e

    def range(self, item: _Item) -> tuple[float, float]:
        """``(lo, hi)`` of a value; CalibrationError naming it when it has no range."""
        return self[item].range

    def _by_provenance(self, key: ValueKey) -> TensorRange | None:
        same = [e for e in self._entries.values() if (e.key.loc, e.key.index) == (key.loc, key.index)]
        return same[-1] if key.loc and same else None

    def _resolved(self, graph: Graph) -> dict[Value, TensorRange]:
        c = self._cache
        if c is None or c[0]() is not graph or c[1] != graph.version:
            self._cache = c = (weakref.ref(graph), graph.version, self.resolve(graph))
        return c[2]

    def resolve(self, graph: Graph) -> dict[Value, TensorRange]:
        """Match the entries to the values of ``graph`` (inputs and node results).

        1. by name, when the entry's provenance is unknown or equals the producer's;
        2. by provenance (loc, result index): among the entries whose names no value of
           the graph holds, values are paired with entries of their producer's op, the
           rest from the last backwards;
        3. by name alone.
        """
        names = {v.name for v in graph.values()}
        found: dict[Value, TensorRange] = {}
        late: list[Value] = []
        for v in _results(graph):
            e = self._entries.get(v.name)
            if e is not None and _loc_agrees(e.key, v):
                found[v] = e
            else:
                late.append(v)
        taken = {e.key.name for e in found.values()}
        self._pair_by_provenance(late, names | taken, found)
        for v in late:
            e = self._entries.get(v.name)
            if v not in found and e is not None and e.key.name not in taken:
                found[v] = e
                taken.add(e.key.name)
        return found

    def _pair_by_provenance(self, values: list[Value], held: set[str],
                            found: dict[Value, TensorRange]) -> None:
        groups: dict[tuple[str, int], list[Value]] = {}
        for v in values:
            key = ValueKey.of(v)
            if key.loc:
                groups.setdefault((key.loc, key.index), []).append(v)
        free: dict[tuple[str, int], list[TensorRange]] = {}
        for e in self._entries.values():
            if e.key.loc and e.key.name not in held:
                free.setdefault((e.key.loc, e.key.index), []).append(e)
        for prov, vs in groups.items():
            _pair(vs, free.get(prov, []), found)

    def unresolved(self, graph: Graph) -> list[TensorRange]:
        """Entries no value of ``graph`` resolves to."""
        used = {id(e) for e in self.resolve(graph).values()}
        return [e for e in self if id(e) not in used]

    def rekey(self, graph: Graph) -> int:
        """Re-key the entries to the values of ``graph`` they resolve to (name, loc, index,
        op); an unresolved entry holding a name that now belongs to another is dropped.
        Returns how many keys changed."""
        found = {id(e): v for v, e in self.resolve(graph).items()}
        taken = {v.name for v in found.values()}
        entries: dict[str, TensorRange] = {}
        changed = 0
        for e in self._entries.values():                # in order; stale name holders drop
            v = found.get(id(e))
            if v is None:
                if e.key.name not in taken:
                    entries[e.key.name] = e
                continue
            key = ValueKey.of(v)
            changed += e.key != key
            e.key, e.op = key, v.producer.op if v.producer is not None else "input"
            entries[key.name] = e
        self._entries, self._cache = entries, None
        return changed

    def attach(self, graph: Graph) -> Ranges:
        """Re-key to ``graph`` and make these the graph's calibration (what the
        :class:`AttachedRanges` analysis and later passes read): its meta entry ``"ranges"``;
        returns self."""
        self.rekey(graph)
        graph.meta[META_KEY] = self
        return self

    # ---- ranges -------------------------------------------------------------------------
    def apply(self, method: RangeMethod | str = "minmax", **options) -> Ranges:
        """Re-choose the range of every measured entry with ``method`` (a name plus
        ``percentile``/``symmetric``/``bits``, or a RangeMethod); returns self."""
        m = method if isinstance(method, RangeMethod) else RangeMethod(method, **options)
        for e in self:
            if e.source == "calibration":
                e.lo, e.hi = m.choose(e)
        self.method = m
        return self

    def report(self, limit: int = 20) -> str:
        """A table of the first ``limit`` entries: name, op, loc, min, max, range."""
        rows = [("value", "op", "loc", "min", "max", "lo", "hi")]
        for e in list(self)[:limit]:
            rows.append((e.name, e.op, e.key.loc, *(f"{x:.6g}" for x in (e.min, e.max, e.lo, e.hi))))
        width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in rows]
        more = len(self) - limit
        return "\n".join(lines + ([f"... and {more} more"] if more > 0 else []))

    # ---- files --------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write JSON to ``path``; per-channel arrays and histograms, if any, to the
        ``.safetensors`` file beside it. Returns the JSON path."""
        path = Path(path)
        arrays: dict[str, np.ndarray] = {}
        values = [_entry_json(i, e, arrays) for i, e in enumerate(self)]
        companion = path.with_suffix(".safetensors")
        if companion == path:
            raise CalibrationError(f"{path}: ranges are JSON; use another suffix than .safetensors")
        doc = {"format": FORMAT, "version": VERSION, "method": dataclasses.asdict(self.method),
               "arrays": companion.name if arrays else None, "values": values}
        if arrays:                      # first: the JSON, written last, names its sha256
            doc["arrays_sha256"] = save_arrays(arrays, companion)
        write_json(path, doc)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Ranges:
        """Read a file written by :meth:`save`, or a ``bevir-tranges`` file."""
        path = Path(path)
        doc = _read_json(path)
        if doc.get("format") == TRANGES_FORMAT:
            return cls.from_tranges(path)
        if doc.get("format") != FORMAT:
            raise CalibrationError(f"{path}: not a bevir ranges file (format "
                                   f"{doc.get('format')!r}, expected '{FORMAT}' or '{TRANGES_FORMAT}')")
        check_document(doc, path, FORMAT, VERSION, CalibrationError)
        with _reading(path):
            arrays = _read_arrays(path.with_name(doc["arrays"]), sha256=doc.get("arrays_sha256")) \
                if doc["arrays"] else {}
            ranges = cls(method=RangeMethod(**doc["method"]))
            for i, d in enumerate(doc["values"]):
                ranges.add(_entry_from_json(i, d, arrays))
        return ranges

    # ---- seeding ------------------------------------------------------------------------
    @classmethod
    def from_tranges(cls, path: str | Path, graph: Graph | None = None) -> Ranges:
        """Ranges from a tranges file: ``{"format": "bevir-tranges", "version": 1,
        "ranges": {"<onnx tensor name>": [min, max], ...}}`` (re-keyed to ``graph`` if given)."""
        path = Path(path)
        doc = _read_json(path)
        if doc.get("format") != TRANGES_FORMAT or doc.get("version") != TRANGES_VERSION:
            raise CalibrationError(f"{path}: not a {TRANGES_FORMAT} version {TRANGES_VERSION} file "
                                   f"(format {doc.get('format')!r}, version {doc.get('version')!r})")
        table = doc.get("ranges")
        if not isinstance(table, dict) or set(doc) != {"format", "version", "ranges"}:
            raise CalibrationError(f"{path}: expected exactly the keys format, version and "
                                   "ranges (an object of name: [min, max])")
        entries = [TensorRange.given(name, *_pair_of_numbers(path, name, mm), "tranges")
                   for name, mm in table.items()]
        return cls._seeded(entries, graph)

    @classmethod
    def from_onnxruntime(cls, data: Any, graph: Graph | None = None) -> Ranges:
        """Ranges from onnxruntime calibration: a ``TensorsData`` (what a calibrator's
        ``compute_data()`` returns) or a mapping of tensor name to ``TensorData`` or
        ``(min, max)``. Per-channel results (arrays, channels on axis 1) keep their arrays."""
        items = data.items() if hasattr(data, "items") else None
        if items is None:
            raise CalibrationError(f"expected onnxruntime TensorsData or a mapping, got "
                                   f"{type(data).__name__}")
        return cls._seeded([_ort_entry(name, d) for name, d in items], graph)

    @classmethod
    def _seeded(cls, entries: list[TensorRange], graph: Graph | None) -> Ranges:
        ranges = cls(entries)
        if graph is not None:
            ranges.rekey(graph)
        return ranges


def _name(item: _Item) -> str:
    return item if isinstance(item, str) else item.name


def _loc_agrees(key: ValueKey, v: Value) -> bool:
    loc = v.producer.loc if v.producer is not None else ""
    return not key.loc or not loc or key.loc == loc


def _results(graph: Graph) -> Iterator[Value]:
    """The values calibration can know: graph inputs and node results."""
    yield from graph.inputs
    for n in graph.nodes:
        yield from n.outputs


def _pair(values: list[Value], entries: list[TensorRange], found: dict[Value, TensorRange]) -> None:
    """Pair values with entries of the same provenance: by op first, then from the end."""
    entries = list(entries)
    rest = []
    for v in values:
        same_op = [e for e in entries if e.op == v.producer.op]
        if len(same_op) == 1:
            found[v] = same_op[0]
            entries.remove(same_op[0])
        else:
            rest.append(v)
    for v, e in zip(reversed(rest), reversed(entries)):
        found[v] = e


def ranges_of(graph: Graph) -> Ranges | None:
    """The ranges attached to ``graph`` (by :meth:`Ranges.attach`, :func:`calibrate` or
    the ``calibrate`` pass), or None: ``graph.meta["ranges"]``, which clones, composed
    graphs and saved-and-loaded graphs carry."""
    return graph.meta.get(META_KEY)


# ---- ranges as graph meta -----------------------------------------------------------------
META_KEY = "ranges"


def _ranges_to_json(ranges: Ranges) -> dict:
    arrays: dict[str, np.ndarray] = {}
    values = [_entry_json(i, e, arrays) for i, e in enumerate(ranges)]
    return {"method": dataclasses.asdict(ranges.method), "values": values, "arrays": arrays}


def _ranges_from_json(doc: dict) -> Ranges:
    ranges = Ranges(method=RangeMethod(**doc["method"]))
    for i, d in enumerate(doc["values"]):
        ranges.add(_entry_from_json(i, d, doc["arrays"]))
    return ranges


def _merge_ranges(first: Ranges | None, second: Ranges, names: Mapping[str, str]) -> Ranges:
    """Composed graphs: first's entries, then second's under their composed names (a
    value joined to one of first's keeps first's range)."""
    out = first.copy() if first is not None else Ranges(method=second.method)
    for e in second:
        name = names.get(e.key.name, e.key.name)
        if out.get(name) is None:
            c = e.copy()
            c.key = dataclasses.replace(c.key, name=name)
            out.add(c)
    return out


register_meta_key(META_KEY, Ranges, _ranges_to_json, _ranges_from_json, copy=Ranges.copy,
                  merge=_merge_ranges, doc="the calibrated activation ranges (graph meta)")


# ---- file helpers -------------------------------------------------------------------------
class _reading:
    """Turns malformed-content errors while reading ``path`` into CalibrationError."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is not None and isinstance(exc, (KeyError, TypeError, ValueError, AttributeError,
                                                OverflowError)):
            raise CalibrationError(f"{self.path}: malformed ranges file: {typ.__name__}: {exc}") from exc
        return False


def _read_json(path: Path) -> dict:
    return read_json(path, CalibrationError)


def _read_arrays(path: Path, what: str = "the ranges' array file",
                 sha256: str | None = None) -> dict[str, np.ndarray]:
    """The arrays of safetensors file ``path`` (``sha256``: the digest it must have)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load
    if not path.exists():
        raise CalibrationError(f"{path}: {what} is missing")
    try:
        data = path.read_bytes()
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise CalibrationError(f"{path}: {what} is not the one the ranges were saved with "
                                   "(its sha256 differs; a save was interrupted, or a file "
                                   "was replaced)")
        return load(data)
    except (SafetensorError, OSError, ValueError) as e:
        raise CalibrationError(f"{path}: cannot read arrays: {e}") from None


def _pair_of_numbers(path: Path, name: str, mm: Any) -> tuple[float, float]:
    ok = (isinstance(mm, list) and len(mm) == 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in mm))
    if not ok:
        raise CalibrationError(f"{path}: range of '{name}' must be [min, max], got {mm!r}")
    return float(mm[0]), float(mm[1])


def _entry_json(i: int, e: TensorRange, arrays: dict[str, np.ndarray]) -> dict:
    d = {"name": e.key.name, "loc": e.key.loc, "index": e.key.index, "op": e.op,
         "source": e.source, "shape": None if e.shape is None else list(e.shape),
         "min": e.min, "max": e.max, "range": [e.lo, e.hi], "count": e.count,
         "nonfinite": e.nonfinite, "samples": e.samples, "axis": e.axis}
    if e.channel_min is not None:
        arrays[f"{i}.channel_min"], arrays[f"{i}.channel_max"] = e.channel_min, e.channel_max
    if e.histogram is not None:
        arrays[f"{i}.histogram"] = e.histogram.counts
        d["histogram"] = {"threshold": e.histogram.threshold, "num_bins": e.histogram.num_bins}
    return d


def _entry_from_json(i: int, d: dict, arrays: Mapping[str, np.ndarray]) -> TensorRange:
    hist = d.get("histogram")
    lo, hi = (float(x) for x in d["range"])
    if not lo <= hi:                        # also a NaN
        raise ValueError(f"range [{lo!r}, {hi!r}] of value '{d['name']}': low above high")
    e = TensorRange(ValueKey(str(d["name"]), str(d["loc"]), int(d["index"])),
                    float(d["min"]), float(d["max"]), float(lo), float(hi), str(d["op"]),
                    str(d["source"]), None if d["shape"] is None else tuple(int(s) for s in d["shape"]),
                    int(d["count"]), int(d["nonfinite"]), int(d["samples"]),
                    None if d["axis"] is None else int(d["axis"]))
    if f"{i}.channel_min" in arrays:
        e.channel_min, e.channel_max = arrays[f"{i}.channel_min"], arrays[f"{i}.channel_max"]
    if hist is not None:
        e.histogram = Histogram(int(hist["num_bins"]), arrays[f"{i}.histogram"],
                                float(hist["threshold"]))
    return e


def _ort_entry(name: str, d: Any) -> TensorRange:
    lo, hi = d.range_value if hasattr(d, "range_value") else d[:2]
    lo, hi = np.asarray(lo, np.float64).reshape(-1), np.asarray(hi, np.float64).reshape(-1)
    if lo.size != hi.size or lo.size == 0:
        raise CalibrationError(f"onnxruntime range of '{name}' has {lo.size} minima and "
                               f"{hi.size} maxima")
    if lo.size == 1:
        return TensorRange.given(name, lo[0], hi[0], "onnxruntime")
    return TensorRange.given(name, lo.min(), hi.max(), "onnxruntime",
                             channel_min=lo, channel_max=hi, axis=1)


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
        from ..ops import all_ops
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
        chosen = [v for v in _results(graph) if self.chooses(v)]
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
                    raise CalibrationError(f"calibration sample {count} is a {type(sample).__name__}, "
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


# ---- the function, the analysis and the pass ----------------------------------------------
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
    seeded = seed if isinstance(seed, Ranges) else Ranges.load(seed) if seed is not None else Ranges()
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
            raise CalibrationError("no calibrated range", **_where(value))
        return e.range

    @property
    def missing(self) -> list[Value]:
        """Float values (inputs and results) without a range, in graph order."""
        return [v for v in _results(self.graph) if v.type.dtype.is_float and v not in self._found]

    def __len__(self) -> int:
        return len(self._found)


def load_inputs(path: str | Path, graph: Graph) -> list[dict[str, np.ndarray]]:
    """Samples from a safetensors file keyed by graph input name: each tensor has the
    input's shape (one sample) or a leading sample axis (that many samples)."""
    path = Path(path)
    arrays = _read_arrays(path, "the calibration inputs file")
    missing = [v.name for v in graph.inputs if v.name not in arrays]
    if missing:
        raise CalibrationError(f"{path}: no tensor for graph input(s) {missing}")
    counts = {v.name: _sample_count(path, v, arrays[v.name]) for v in graph.inputs}
    n = set(counts.values()) - {None}
    if len(n) > 1:
        raise CalibrationError(f"{path}: inputs hold different numbers of samples: {counts}")
    total = n.pop() if n else None
    if total is None:
        return [{v.name: arrays[v.name].reshape(v.type.shape) for v in graph.inputs}]
    return [{v.name: arrays[v.name][i] if counts[v.name] else arrays[v.name].reshape(v.type.shape)
             for v in graph.inputs} for i in range(total)]


def _sample_count(path: Path, v: Value, a: np.ndarray) -> int | None:
    """None: one sample shaped like the input; k: k samples on a leading axis."""
    shape = v.type.shape
    if a.shape == shape or (shape == () and a.shape == (1,)):
        return None
    if a.ndim == len(shape) + 1 and a.shape[1:] == shape and a.shape[0] > 0:
        return a.shape[0]
    raise CalibrationError(f"{path}: tensor '{v.name}' has shape {list(a.shape)}; input "
                           f"%{v.name} takes {list(shape)} (or [samples, ...] of it)")


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
