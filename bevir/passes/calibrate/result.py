"""The result of calibration: :class:`Ranges`, one :class:`TensorRange` per value by stable
key, resolved against a graph's values, and kept as the graph's meta entry ``"ranges"``.

A value's key is its name, the provenance (``loc``) of the node producing it and which
result of that node it is. Lookup in a rewritten graph (see :meth:`Ranges.resolve`): by
name when the provenance agrees; else by provenance (entries whose name no value of the
graph holds any more, paired by op, then from the last backwards: the last value a module
produces is the one that leaves it); else by name alone.
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from ...ir.graph import Graph, Value
from ...ir.meta import register_meta_key
from .files import (TRANGES_FORMAT, entry_from_json, entry_to_json, onnxruntime_entries,
                    read_document, read_ranges, read_tranges, write_ranges)
from .keys import CalibrationError, ValueKey, calibratable_values, provenance
from .methods import RangeMethod
from .tensor_range import TensorRange

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
            where = provenance(item) if isinstance(item, Value) else dict(node=f"%{_name(item)}")
            raise CalibrationError("no calibrated range", **where)
        return e

    def range(self, item: _Item) -> tuple[float, float]:
        """``(lo, hi)`` of a value; CalibrationError naming it when it has no range."""
        return self[item].range

    def _by_provenance(self, key: ValueKey) -> TensorRange | None:
        same = [e for e in self._entries.values()
                if (e.key.loc, e.key.index) == (key.loc, key.index)]
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
        for v in calibratable_values(graph):
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
            rows.append((e.name, e.op, e.key.loc,
                         *(f"{x:.6g}" for x in (e.min, e.max, e.lo, e.hi))))
        width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip() for r in rows]
        more = len(self) - limit
        return "\n".join(lines + ([f"... and {more} more"] if more > 0 else []))

    # ---- files --------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write JSON to ``path``; per-channel arrays and histograms, if any, to the
        ``.safetensors`` file beside it. Returns the JSON path."""
        return write_ranges(path, self.method, list(self))

    @classmethod
    def load(cls, path: str | Path) -> Ranges:
        """Read a file written by :meth:`save`, or a ``bevir-tranges`` file."""
        path = Path(path)
        doc = read_document(path)
        if doc.get("format") == TRANGES_FORMAT:
            return cls.from_tranges(path)
        method, entries = read_ranges(path, doc)
        return cls(entries, method)

    # ---- seeding ------------------------------------------------------------------------
    @classmethod
    def from_tranges(cls, path: str | Path, graph: Graph | None = None) -> Ranges:
        """Ranges from a tranges file: ``{"format": "bevir-tranges", "version": 1,
        "ranges": {"<onnx tensor name>": [min, max], ...}}`` (re-keyed to ``graph`` if given)."""
        return cls._seeded(read_tranges(path), graph)

    @classmethod
    def from_onnxruntime(cls, data: Any, graph: Graph | None = None) -> Ranges:
        """Ranges from onnxruntime calibration: a ``TensorsData`` (what a calibrator's
        ``compute_data()`` returns) or a mapping of tensor name to ``TensorData`` or
        ``(min, max)``. Per-channel results (arrays, channels on axis 1) keep their arrays."""
        return cls._seeded(onnxruntime_entries(data), graph)

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
    values = [entry_to_json(i, e, arrays) for i, e in enumerate(ranges)]
    return {"method": dataclasses.asdict(ranges.method), "values": values, "arrays": arrays}


def _ranges_from_json(doc: dict) -> Ranges:
    ranges = Ranges(method=RangeMethod(**doc["method"]))
    for i, d in enumerate(doc["values"]):
        ranges.add(entry_from_json(i, d, doc["arrays"]))
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
