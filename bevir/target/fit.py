"""Fit the per-op-class efficiency factors of a HWConfig to a measured profile.

    fit = fit_efficiency(graph, base, load_measured(["profile_core0.json", ...]))
    fit.hw            # base with the fitted HWConfig.efficiency

A measured profile is the vendor's shape: a list of records, each with ``data.TotalCycles``
and the op's identity (``name``, else ``loc``; bevir's own profile_core{i}.json qualifies).
Each is matched to the modelled record of the same name (or loc). Per record the model says

    own = launch + max(compute, ocm, ddr) + exposed,   compute = (mac + alu) x 1 / eff[class]

so where the measured own cycles (``data.OwnCycles``, else TotalCycles less the modelled
wait) minus launch and exposed exceed the record's memory terms max(ocm, ddr), compute is
what bounds it and ``y = work x k`` with ``k = 1 / eff``. Per class, least squares gives
``k = sum(work y) / sum(work^2)``, the factor ``min(1, 1 / k)``. Records whose measured time
is within their memory terms (OCM- or DDR-bound) say nothing about compute and are left
out (counted in ``memory_bound``); a class with no compute-bound record keeps its factor.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BevirError
from .hw import HWConfig
from ..ir.graph import Graph
from .cycles import OpRecord, model


class FitError(BevirError):
    """A measured profile cannot be read or matched to the graph."""


def load_measured(paths: Sequence[str | Path]) -> list[dict]:
    """The records of measured profile files (a directory: its profile_core*.json)."""
    records: list[dict] = []
    for path in map(Path, paths):
        files = sorted(path.glob("profile_core*.json")) if path.is_dir() else [path]
        if not files:
            raise FitError(f"no profile_core*.json in {path}")
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError) as e:
                raise FitError(f"cannot read measured profile {f}: {e}") from None
            if not isinstance(data, list):
                raise FitError(f"measured profile {f}: expected a list of records")
            records += data
    return records


def key_of(record: dict, source: str = "measured profile") -> str:
    key = record.get("name") or record.get("loc")
    cycles = (record.get("data") or {}).get("TotalCycles")
    if not isinstance(key, str) or not isinstance(cycles, (int, float)):
        raise FitError(f"{source}: a record needs a name (or loc) and data.TotalCycles, "
                       f"got {str(record)[:120]}")
    return key


def measured_own(records: Iterable[dict]) -> dict[str, tuple[float, float | None]]:
    """name -> (summed TotalCycles, summed OwnCycles or None when a record lacks it)."""
    total: dict[str, float] = defaultdict(float)
    own: dict[str, float | None] = defaultdict(float)
    for r in records:
        k, data = key_of(r), r["data"]
        total[k] += data["TotalCycles"]
        o = data.get("OwnCycles")
        own[k] = None if o is None or own[k] is None else own[k] + o
    return {k: (total[k], own[k]) for k in total}


@dataclass
class ClassFit:
    op_class: str
    efficiency: float
    before: float
    used: int
    memory_bound: int


@dataclass
class Fit:
    hw: HWConfig
    classes: list[ClassFit]
    matched: int
    unmatched: list[str]
    error_before: float
    error_after: float

    def to_json(self) -> dict:
        return {"hw": self.hw.model_dump(), "hw_hash": self.hw.hash, "matched": self.matched,
                "unmatched": self.unmatched, "error_before": self.error_before,
                "error_after": self.error_after,
                "classes": [vars(c) for c in self.classes]}


def error(records: Sequence[OpRecord], measured: dict[str, tuple[float, float | None]]) -> float:
    """sum |modelled - measured| TotalCycles over matched ops / sum measured."""
    mine = {r.name or r.loc: r.total_cycles for r in records}
    keys = [k for k in measured if k in mine]
    den = sum(measured[k][0] for k in keys)
    return sum(abs(mine[k] - measured[k][0]) for k in keys) / den if den else 0.0


Sums = dict[str, list[float]]      # op class -> [sum work y, sum work^2, used, memory-bound]


def class_sums(records: Sequence[OpRecord], measured: dict[str, tuple[float, float | None]]
               ) -> Sums:
    """Per op class, the least-squares sums over its compute-bound measured records."""
    sums: Sums = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for r in records:
        work = r.terms.get("mac", 0) + r.terms.get("alu", 0)
        if not work or (r.name or r.loc) not in measured:
            continue
        total, own = measured[r.name or r.loc]
        y = (total - r.wait_cycles if own is None else own) - r.terms["launch"] \
            - r.terms["exposed"]
        s = sums[r.op_class]
        memory = max(r.terms["ocm"], r.terms["broadcast"], r.terms["ddr"] + r.terms["ddr_shared"])
        if y > memory:                                  # compute bounds it
            s[0], s[1], s[2] = s[0] + work * y, s[1] + work * work, s[2] + 1
        else:
            s[3] += 1
    return sums


def fit_efficiency(graph: Graph, base: HWConfig, measured_records: Sequence[dict],
                   rounds: int = 5) -> Fit:
    """``base`` with each op class's efficiency least-squares fitted (module docstring).
    Refitted with the fitted config's own mappings until the factors settle (an op's best
    PE mapping can change with its efficiency); a class left with no compute-bound record
    keeps its last factor."""
    measured = measured_own(measured_records)
    profile = first = model(graph, base)
    known = {r.name or r.loc for r in first.records}
    unmatched = sorted(k for k in measured if k not in known)
    if len(unmatched) == len(measured):
        raise FitError(f"no measured record matches an op of @{graph.name} by name or loc "
                       f"(first: {unmatched[:3]})")
    hw = base
    for _ in range(rounds):
        efficiency = dict(hw.efficiency)
        for c, (wy, ww, used, _mem) in class_sums(profile.records, measured).items():
            if used:
                efficiency[c] = min(1.0, ww / wy)                # 1 / k, k = wy / ww
        if efficiency == hw.efficiency:
            break
        hw = HWConfig(**{**base.model_dump(), "efficiency": efficiency,
                         "name": f"{base.name} (fitted)"})
        profile = model(graph, hw)
    classes = [ClassFit(c, hw.efficiency_of(c), base.efficiency_of(c), used, mem)
               for c, (_wy, _ww, used, mem) in sorted(class_sums(profile.records,
                                                                  measured).items())]
    return Fit(hw, classes, len(measured) - len(unmatched), unmatched,
               error(first.records, measured), error(profile.records, measured))


def format_fit(fit: Fit) -> str:
    lines = [f"fitted {fit.matched} ops ({len(fit.unmatched)} unmatched): error "
             f"{fit.error_before:.2%} -> {fit.error_after:.2%}"]
    for c in fit.classes:
        lines.append(f"  {c.op_class:<12} efficiency {c.before:.3f} -> {c.efficiency:.3f}  "
                     f"({c.used} compute-bound ops fitted, {c.memory_bound} memory-bound "
                     f"left out)")
    return "\n".join(lines)
