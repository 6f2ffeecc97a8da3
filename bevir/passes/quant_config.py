"""The typed quantization config: which scheme each weighted op of a graph gets.

A :class:`QuantConfig` is an ordered list of :class:`Rule` s; the first rule that selects a
node (by op kind and by a glob on its provenance, the ONNX node name or torch module path)
decides its scheme, else ``default`` does. The preset ``default`` names no model
(per-channel weights, 8-bit activations); a model's own presets are registered with
:func:`register_preset`::

    cfg = QuantConfig.preset("default")
    plan = cfg.plan(graph)                   # node -> rule, for every weighted op
    print(plan.table())
    cfg = cfg.override("default", activations="fixed16")

Configs are pydantic models: they validate on creation (unknown fields, bad choices,
empty groups and values of the wrong JSON type, such as ``"yes"`` for a boolean, are
:class:`ConfigError` naming the field) and load from / save to JSON.
"""
from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from ..errors import BevirError
from ..fsutil import read_json, write_atomic
from ..ir.graph import Graph, Node

#: the ops whose weights a rule quantizes (a constant operand 1), in the float graph
WEIGHTED_OPS = ("conv2d", "conv2d_act", "gemm", "matmul_act", "matmul")


class ConfigError(BevirError):
    """A quantization config that does not validate, or a rule group that does not exist."""


class Rule(BaseModel):
    """How the ops a rule selects are quantized.

    ``name``: the group's name (reports, :meth:`QuantConfig.override`). ``ops``: op kinds
    (empty: every weighted op). ``where``: provenance globs (``fnmatch``; any matches).
    ``weights``: ``per_tensor`` or ``per_channel`` int8, symmetric. ``activations``:
    ``fixed`` (power-of-two frac bits, symmetric int8), ``fixed16`` (the same in int16,
    by int8 weights, for the ops that take 16-bit activations: products, relu, add, sub,
    mul, the lookup tables and layer norm; the group's other ops stay 8-bit) or ``affine``
    (the scale as given, e.g. by onnxruntime). ``exclude``: keep the ops in float.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    ops: tuple[str, ...] = ()
    where: tuple[str, ...] = ("*",)
    weights: Literal["per_tensor", "per_channel"] = "per_tensor"
    activations: Literal["fixed", "fixed16", "affine"] = "fixed"
    exclude: StrictBool = False

    def selects(self, node: Node) -> bool:
        """Whether this rule selects ``node`` (its op kind and provenance)."""
        if self.ops and node.op not in self.ops:
            return False
        loc = node.loc or ""
        return any(fnmatch.fnmatchcase(loc, pattern) for pattern in self.where)


class QuantConfig(BaseModel):
    """An ordered rule list (first match wins) and the default for unselected ops.

    ``sources``: the graph inputs whose computations are quantized (the image, the previous
    BEV); ops that do not depend on any of them (camera geometry from ``lidar2img`` and
    ``can_bus``, constant subgraphs) stay float and are quantized where they join. Empty,
    or naming no input of the graph: every op.

    ``widen_to``: where the flow has frames to measure on (``bevir quantize --inputs``,
    :func:`bevir.passes.precision.widen`), the layers with the worst local error move to
    16-bit activations until the outputs' SQNR against float reaches this many dB (None:
    as the rules say)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[Rule, ...] = ()
    default: Rule = Rule(name="default")
    sources: tuple[str, ...] = ()
    calibration: Literal["minmax", "percentile", "mse", "entropy"] = "minmax"
    percentile: float = Field(99.99, gt=0, le=100, strict=True)
    widen_to: float | None = Field(None, gt=0, le=200, strict=True)

    @classmethod
    def build(cls, data: dict) -> QuantConfig:
        """Validate ``data`` (a parsed JSON object) into a config."""
        try:
            cfg = cls.model_validate(data)
        except pydantic.ValidationError as e:
            raise ConfigError(_describe(e)) from None
        names = [r.name for r in cfg.rules] + [cfg.default.name]
        dup = [n for n, k in Counter(names).items() if k > 1]
        if dup:
            raise ConfigError(f"rule names must be unique; repeated: {', '.join(dup)}")
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> QuantConfig:
        """Read a JSON config file."""
        return cls.build(read_json(path, ConfigError))

    def save(self, path: str | Path) -> Path:
        """Write the config as JSON (what :meth:`load` reads), whole or not at all."""
        return write_atomic(path, self.model_dump_json(indent=1) + "\n")

    @classmethod
    def preset(cls, name: str) -> QuantConfig:
        """A shipped or registered config (:data:`PRESETS`)."""
        if name not in PRESETS:
            raise ConfigError(f"no preset '{name}'; presets: {', '.join(PRESETS)}")
        return cls.build(PRESETS[name])

    def rule_for(self, node: Node) -> Rule:
        """The rule deciding ``node``'s scheme: the first that selects it, else default."""
        return next((r for r in self.rules if r.selects(node)), self.default)

    def group(self, name: str) -> Rule:
        """The rule called ``name``."""
        for r in (*self.rules, self.default):
            if r.name == name:
                return r
        raise ConfigError(f"no rule group '{name}'; groups: "
                          f"{', '.join(r.name for r in (*self.rules, self.default))}")

    def override(self, name: str, **changes) -> QuantConfig:
        """A copy with rule group ``name`` changed (``weights=``, ``activations=``,
        ``exclude=``...), e.g. to re-run with the worst layers per channel or in float."""
        old = self.group(name)
        data = self.model_dump()
        new = {**old.model_dump(), **changes}
        if old.name == self.default.name:
            data["default"] = new
        else:
            data["rules"] = [new if r["name"] == name else r for r in data["rules"]]
        return QuantConfig.build(data)

    def plan(self, graph: Graph) -> QuantPlan:
        """The rule of every weighted op of ``graph`` (a constant weight operand)."""
        return QuantPlan([(n, self.rule_for(n)) for n in graph.nodes
                          if n.op in WEIGHTED_OPS and len(n.inputs) > 1
                          and n.inputs[1] is not None and n.inputs[1].is_const])


@dataclass
class QuantPlan:
    """(node, rule) for each weighted op, in graph order."""

    entries: list[tuple[Node, Rule]]

    def __iter__(self) -> Iterator[tuple[Node, Rule]]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def counts(self) -> dict[str, int]:
        """Ops per rule group."""
        return dict(Counter(r.name for _, r in self.entries))

    def table(self) -> str:
        """One line per rule group: ops, scheme and an example provenance."""
        rows = [("group", "ops", "weights", "activations", "example")]
        first: dict[str, Node] = {}
        rules: dict[str, Rule] = {}
        for n, r in self.entries:
            first.setdefault(r.name, n)
            rules[r.name] = r
        for name, count in self.counts().items():
            r = rules[name]
            rows.append((name, str(count), "float" if r.exclude else r.weights,
                         "float" if r.exclude else r.activations, first[name].loc or ""))
        width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, width)).rstrip()
                         for row in rows)


def _describe(e: pydantic.ValidationError) -> str:
    """One line per problem: the field path and what is wrong."""
    parts = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        parts.append(f"{where}: {err['msg']}")
    return "invalid quantization config: " + "; ".join(parts)


#: the shipped configs, as JSON-like data (what a user's file would hold); a model's own
#: presets are added with :func:`register_preset`
PRESETS: dict[str, dict] = {
    # names no model: every weighted op per output channel, every activation 8-bit fixed
    # point (per tensor), the whole graph from its inputs; 16-bit activations where local
    # error calls for them, until the outputs are within 30 dB of float
    "default": {"default": {"name": "default", "weights": "per_channel"}, "widen_to": 30.0},
}


def register_preset(name: str, data: dict) -> None:
    """Add the preset ``name`` (JSON-like ``data``, validated now) for
    :meth:`QuantConfig.preset`, ``bevir.quantize(graph, name)`` and ``--config name``."""
    QuantConfig.build(data)
    PRESETS[name] = data
