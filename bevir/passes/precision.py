"""Automatic precision search: from a QuantConfig, give the rule groups with the worst
local (teacher-forced) error more precision until a target metric holds.

    target = Target.parse("cls_sqnr>=30")
    steps = search(QuantConfig.preset("reference-flow"), evaluate, target)
    steps[-1].config.save("quant_config.json")       # reproduces the last step

``evaluate(config)`` quantizes and runs the model with ``config`` and returns an
:class:`Evaluation`: the metrics the target may name, and the rule groups ranked worst
first (e.g. by :func:`worst_groups` of a :func:`~bevir.sim.compare.compare_graphs` report).
Each step moves the worst group that can still move one notch: per-tensor weights to
per-channel, then out of INT8 (float). 16-bit activations are not a notch yet: the op
registry has no i16-activation x i8-weight products.
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .quant_config import ConfigError, QuantConfig

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Target:
    """``metric op value``, e.g. ``top10_iou>=9`` or ``cls_sqnr>=30``."""
    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*(>=|<=|>|<)\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)\s*",
                         text)
        if m is None:
            raise ConfigError(f"target {text!r}: expected METRIC>=VALUE (or <=, >, <), "
                              "e.g. 'cls_sqnr>=30'")
        return cls(m[1], m[2], float(m[3]))

    def met(self, metrics: Mapping[str, float]) -> bool:
        if self.metric not in metrics:
            raise ConfigError(f"target metric '{self.metric}' is not measured; metrics: "
                              f"{', '.join(sorted(metrics))}")
        return bool(_OPS[self.op](metrics[self.metric], self.value))

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass
class Evaluation:
    """What one quantized run gave: ``metrics`` by name, the rule groups worst first."""
    metrics: dict[str, float]
    worst: list[str] = field(default_factory=list)


@dataclass
class Step:
    """One configuration tried: what changed, what it measured, whether the target held."""
    config: QuantConfig
    change: str
    metrics: dict[str, float]
    met: bool

    def line(self, target: Target) -> str:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(self.metrics.items()))
        return f"{self.change:<44} {shown}  [{'met' if self.met else 'not met'}: {target}]"


def next_move(config: QuantConfig, worst: list[str]) -> tuple[str, dict, str] | None:
    """(group, override, description) of the one-notch move of the worst group that can
    still move; None when every ranked group is already out of INT8."""
    for name in worst:
        rule = config.group(name)
        if rule.exclude:
            continue
        if rule.weights == "per_tensor":
            return name, {"weights": "per_channel"}, f"{name}: weights per channel"
        return name, {"exclude": True}, f"{name}: out of INT8 (float)"
    return None


def search(config: QuantConfig, evaluate: Callable[[QuantConfig], Evaluation], target: Target,
           max_steps: int = 12, log: Callable[[str], None] | None = print) -> list[Step]:
    """The configurations tried, from ``config``: each step moves the worst movable group
    one notch (:func:`next_move`), until ``target`` holds, nothing can move or
    ``max_steps`` evaluations have run. The last step's config is the result."""
    evaluation = evaluate(config)
    steps = [Step(config, "start", evaluation.metrics, target.met(evaluation.metrics))]
    if log:
        log(steps[-1].line(target))
    while not steps[-1].met and len(steps) < max_steps:
        move = next_move(config, evaluation.worst)
        if move is None:
            break
        name, changes, what = move
        config = config.override(name, **changes)
        evaluation = evaluate(config)
        steps.append(Step(config, what, evaluation.metrics, target.met(evaluation.metrics)))
        if log:
            log(steps[-1].line(target))
    return steps


def worst_groups(report, config: QuantConfig, node_of: Callable[[str], object]) -> list[str]:
    """Rule groups ranked by the worst local error of their layers in ``report`` (an
    :class:`~bevir.sim.compare.ErrorReport`); ``node_of(value name)`` gives the reference
    node that computes a value (its rule is the group)."""
    order: list[str] = []
    for e in report.worst(len(report)):
        node = node_of(e.value)
        if node is None:
            continue
        name = config.rule_for(node).name
        if name not in order:
            order.append(name)
    return order
