"""Automatic precision search: from a QuantConfig, give the rule groups with the worst
local (teacher-forced) error more precision until a target metric holds.

    target = Target.parse("cls_sqnr>=30")
    steps = search(QuantConfig.preset("reference-flow"), evaluate, target)
    steps[-1].config.save("quant_config.json")       # reproduces the last step

``evaluate(config)`` quantizes and runs the model with ``config`` and returns an
:class:`Evaluation`: the metrics the target may name, and the rule groups ranked worst
first (e.g. by :func:`worst_groups` of a :func:`~bevir.sim.compare.compare_graphs` report).
Each step gives the worst group that can still move more precision: per-tensor weights
to per-channel, or out of INT8 (float). A step that does not improve the target's metric
is undone (the next candidate is tried from the best config so far). 16-bit activations
are not a notch yet: the op registry has no i16-activation x i8-weight products.
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

    def better(self, a: Mapping[str, float], b: Mapping[str, float]) -> bool:
        """Whether metrics ``a`` are closer to the target than ``b``."""
        return a[self.metric] > b[self.metric] if self.op in (">=", ">") \
            else a[self.metric] < b[self.metric]


@dataclass
class Evaluation:
    """What one quantized run gave: ``metrics`` by name, the rule groups worst first."""
    metrics: dict[str, float]
    worst: list[str] = field(default_factory=list)



@dataclass
class Step:
    """One configuration tried: what changed, what it measured, whether the target held,
    whether it was kept (it improved on the best so far)."""
    config: QuantConfig
    change: str
    metrics: dict[str, float]
    met: bool
    kept: bool = True

    def line(self, target: Target) -> str:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(self.metrics.items()))
        verdict = "met" if self.met else "not met"
        return (f"{self.change:<44} {shown}  [{verdict}: {target}]"
                + ("" if self.kept else "  (no better: undone)"))


def next_move(config: QuantConfig, worst: list[str], tried: set = frozenset()
              ) -> tuple[str, dict, str] | None:
    """(group, override, description) of the next move: the worst group that can still
    get more precision (per-channel weights, else float), skipping ``tried`` moves; None
    when there is none."""
    for name in worst:
        rule = config.group(name)
        options = [] if rule.exclude else \
            ([({"weights": "per_channel"}, "weights per channel")] if rule.weights == "per_tensor"
             else []) + [({"exclude": True}, "out of INT8 (float)")]
        for changes, what in options:
            if (name, what) not in tried:
                return name, changes, f"{name}: {what}"
    return None


def search(config: QuantConfig, evaluate: Callable[[QuantConfig], Evaluation], target: Target,
           max_steps: int = 12, log: Callable[[str], None] | None = print) -> list[Step]:
    """The configurations tried, from ``config``: each step applies the next move
    (:func:`next_move`) to the best config so far and keeps it if it improves the target's
    metric, until ``target`` holds, no move is left or ``max_steps`` evaluations have
    run. The result is :func:`best` of the steps."""
    evaluation = evaluate(config)
    steps = [Step(config, "start", evaluation.metrics, target.met(evaluation.metrics))]
    best, best_eval, tried = steps[0], evaluation, set()
    if log:
        log(steps[-1].line(target))
    while not best.met and len(steps) < max_steps:
        move = next_move(best.config, best_eval.worst, tried)
        if move is None:
            break
        name, changes, what = move
        tried.add((name, what.split(": ", 1)[1]))
        trial = best.config.override(name, **changes)
        evaluation = evaluate(trial)
        kept = target.better(evaluation.metrics, best.metrics)
        steps.append(Step(trial, what, evaluation.metrics, target.met(evaluation.metrics), kept))
        if kept:
            best, best_eval = steps[-1], evaluation
        if log:
            log(steps[-1].line(target))
    return steps


def best(steps: list[Step]) -> Step:
    """The search's result: its last kept step."""
    return [s for s in steps if s.kept][-1]


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
