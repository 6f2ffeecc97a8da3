"""Automatic precision search: from a QuantConfig, give the rule groups with the worst
local (teacher-forced) error more precision until a target metric holds.

    target = Target.parse("cls_sqnr>=30")
    steps = search(QuantConfig.preset("default"), evaluate, target)
    best(steps, target).config.save("quant_config.json")     # reproduces that step

For any graph, :func:`sqnr_evaluator` (graph, inputs) is such an ``evaluate``: SQNR of
each output against the float run, their minimum ``sqnr``, and the modelled ``cycles``
(``bevir quantize MODEL --inputs FILE --target "sqnr>=30"`` runs it from the command line).

``evaluate(config)`` quantizes and runs the model with ``config`` and returns an
:class:`Evaluation`: the metrics the target may name, and the rule groups ranked worst
first (e.g. by :func:`worst_groups` of a :func:`~bevir.sim.compare.compare_graphs` report).
Each move gives the worst group that can still take more precision one notch: per-tensor
weights to per-channel, then 16-bit activations (i16 codes by int8 weights, where the
group's ops take them), then out of INT8 (float). The search

1. tries the moves from the current config, worst group first, and keeps the first that
   brings the metric closer to the target (on a tie, closer on the ``tiebreak`` metrics);
2. where none does, escalates: it keeps the move that came closest and goes on from
   there, until the target holds or no move is left (a metric such as ``top10_iou`` moves
   in whole steps, so precision often has to be added before it shows);
3. once the target holds, gives back what was not needed: each kept move is undone in
   turn, newest first, and stays undone where the target still holds.

Configs already evaluated are not evaluated again (nor given back to).
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ..ir.types import DType
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

    def better(self, a: Mapping[str, float], b: Mapping[str, float],
               tiebreak: Sequence[str] = ()) -> bool:
        """Whether metrics ``a`` are closer to the target than ``b``; on a tie, whether
        they are higher on the first ``tiebreak`` metric that differs."""
        if a[self.metric] != b[self.metric]:
            return a[self.metric] > b[self.metric] if self.op in (">=", ">") \
                else a[self.metric] < b[self.metric]
        return next((a[k] > b[k] for k in tiebreak if a[k] != b[k]), False)


@dataclass
class Evaluation:
    """What one quantized run gave: ``metrics`` by name, the rule groups worst first."""
    metrics: dict[str, float]
    worst: list[str] = field(default_factory=list)



@dataclass
class Step:
    """One configuration tried: what changed, what it measured, whether the target held,
    whether the search kept it (the path goes on from the last kept step)."""
    config: QuantConfig
    change: str
    metrics: dict[str, float]
    met: bool
    kept: bool = True
    group: str | None = None        # the rule group the step changed (None: the start)

    def line(self, target: Target) -> str:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(self.metrics.items()))
        verdict = "met" if self.met else "not met"
        return (f"{self.change:<44} {shown}  [{verdict}: {target}]"
                + ("" if self.kept else "  (undone)"))


def notches(rule) -> list[tuple[dict, str]]:
    """The moves that give ``rule`` more precision, in order: per-channel weights, 16-bit
    activations (a ``fixed`` rule: its products, relu, adds, muls, tables and norms take i16
    codes by i8 weights), out of INT8 (float)."""
    if rule.exclude:
        return []
    moves = [({"weights": "per_channel"}, "weights per channel")] \
        if rule.weights == "per_tensor" else []
    if rule.activations == "fixed":
        moves.append(({"activations": "fixed16"}, "activations 16-bit"))
    return moves + [({"exclude": True}, "out of INT8 (float)")]


def next_move(config: QuantConfig, worst: list[str], tried: set = frozenset()
              ) -> tuple[str, dict, str] | None:
    """(group, override, description) of the next move: the worst group that can still
    get more precision (its first :func:`notches` not in ``tried``); None when there is
    none."""
    for name in worst:
        for changes, what in notches(config.group(name)):
            if (name, what) not in tried:
                return name, changes, f"{name}: {what}"
    return None


#: the most configurations :func:`search` evaluates unless told otherwise
MAX_STEPS = 24


def search(config: QuantConfig, evaluate: Callable[[QuantConfig], Evaluation], target: Target,
           max_steps: int = MAX_STEPS, tiebreak: Sequence[str] = (),
           log: Callable[[str], None] | None = print) -> list[Step]:
    """The configurations tried from ``config``, in order (see the module docstring for the
    policy), until ``target`` holds and nothing can be given back, no move is left or
    ``max_steps`` evaluations have run. The result is :func:`best` of the steps."""
    steps: list[Step] = []
    seen: dict[str, Evaluation] = {}

    def run(cfg: QuantConfig, change: str, group: str | None) -> tuple[Step, Evaluation]:
        ev = evaluation(cfg)
        steps.append(Step(cfg, change, ev.metrics, target.met(ev.metrics), False, group))
        return steps[-1], ev

    def evaluation(cfg: QuantConfig) -> Evaluation:
        key = cfg.model_dump_json()
        if key not in seen:
            seen[key] = evaluate(cfg)
        return seen[key]

    def show(step: Step) -> None:
        if log:
            log(step.line(target))

    current, current_eval = run(config, "start", None)
    current.kept = True
    show(current)
    tried: set = set()
    trials: list[Step] = []                       # from the current config, none closer
    while not current.met and len(seen) < max_steps:
        move = next_move(current.config, current_eval.worst, tried)
        if move is None:                           # escalate: the closest trial, kept
            if not trials:
                break
            step = _closest(trials, target, tiebreak)
            current_eval = evaluation(step.config)
            current = Step(step.config, f"escalate: {step.change}", step.metrics, step.met,
                           True, step.group)
            steps.append(current)
            show(current)
            tried, trials = set(), []
            continue
        name, changes, what = move
        tried.add((name, what.split(": ", 1)[1]))
        step, ev = run(current.config.override(name, **changes), what, name)
        if target.better(step.metrics, current.metrics, tiebreak):
            step.kept = True
            current, current_eval, tried, trials = step, ev, set(), []
        else:
            trials.append(step)
        show(step)
    if current.met:                                # give back what the target did not need
        for name in dict.fromkeys(s.group for s in reversed(steps) if s.kept and s.group):
            if len(seen) >= max_steps:
                break
            if current.config.group(name) == config.group(name):
                continue
            back = config.group(name).model_dump(exclude={"name", "ops", "where"})
            trial = current.config.override(name, **back)
            if trial.model_dump_json() in seen:    # tried on the way: it did not hold
                continue
            step, _ = run(trial, f"{name}: back as at start", name)
            if step.met:
                step.kept, current = True, step
            show(step)
    return steps


def _closest(steps: list[Step], target: Target, tiebreak: Sequence[str]) -> Step:
    """The step of ``steps`` closest to ``target`` (the first of equals)."""
    closest = steps[0]
    for s in steps[1:]:
        if target.better(s.metrics, closest.metrics, tiebreak):
            closest = s
    return closest


def best(steps: list[Step], target: Target | None = None) -> Step:
    """The search's result: its last kept step where that meets ``target`` (or no target
    is given), else the kept step that came closest."""
    kept = [s for s in steps if s.kept]
    if target is None or kept[-1].met:
        return kept[-1]
    return _closest(kept, target, ())


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


def sqnr_evaluator(graph, inputs: Mapping, hw=None, cleanup: str = "cse,dce"
                   ) -> Callable[[QuantConfig], Evaluation]:
    """An ``evaluate`` for :func:`search` on any float ``graph`` with calibrated ranges
    attached (:func:`bevir.calibrate`): each config quantizes a clone, runs it on
    ``inputs`` and measures, against the float run, ``<output>_sqnr`` for each float
    output and ``sqnr`` (the lowest of them), in dB, and ``cycles`` (the GPNPU cycle
    model on ``hw``, default :class:`~bevir.target.HWConfig`, of the graph planned as
    ``bevir compile`` plans it); the groups are ranked by their worst local error
    (:func:`worst_groups`)."""
    from ..errors import PassError
    from ..sim.compare import compare_graphs
    from ..target.cycles import model as cycle_model
    from ..target.hw import HWConfig
    from .calibrate import ranges_of
    from .manager import optimize
    from .quantize import quantize
    from .target import plan_for_target
    if ranges_of(graph) is None:
        raise PassError("the precision search needs calibrated ranges: run "
                        "bevir.calibrate(graph, inputs) first")
    hw = hw or HWConfig()
    outputs = {k: v.name for k, v in graph.outputs.items() if v.type.dtype.is_float}
    producers = {v.name: v.producer for v in graph.values()}

    def evaluate(config: QuantConfig) -> Evaluation:
        q = graph.clone()
        quantize(q, config)
        optimize(q, cleanup)
        report = compare_graphs(graph, q, inputs)     # one run of each; outputs included
        metrics = {f"{k}_sqnr": report[name].sqnr_db for k, name in outputs.items()}
        metrics["sqnr"] = min(metrics.values(), default=float("inf"))
        metrics["cycles"] = float(cycle_model(plan_for_target(q, hw), hw).makespan)
        return Evaluation(metrics, worst_groups(report, config, producers.get))
    return evaluate


#: the ops whose error is their operand's format's (not ranked by widen)
_CONVERSIONS = ("fx_quantize", "fx_dequantize", "fx_requantize")


def widen(graph, inputs: Mapping, config: QuantConfig, target: float, share: float = 0.25,
          max_steps: int = 8) -> tuple[QuantConfig, float, int]:
    """16-bit activations where local error calls for them: from ``config``, the layers
    (provenances) whose 8-bit ops have the worst local (teacher-forced) SQNR on ``inputs``
    move to 16-bit activations, ``share`` of the 8-bit layers a step (at least one), until
    the lowest SQNR of the float outputs against ``graph`` (float, calibrated) reaches
    ``target`` dB or ``max_steps`` steps are taken. The layers are a rule ``widened``
    (first, the config's default weights); returns (the config, with no ``widen_to``: it
    reproduces the result, its SQNR, the number of layers widened)."""
    import glob

    from ..sim.compare import compare_graphs
    from .manager import optimize
    from .quant_config import Rule
    from .quantize import quantize
    outputs = [v.name for v in graph.outputs.values() if v.type.dtype.is_float]
    wide: list[str] = []
    cfg, sqnr = config, float("inf")
    for step in range(max_steps + 1):
        q = graph.clone()
        quantize(q, cfg)
        optimize(q, "cse,dce")
        report = compare_graphs(graph, q, inputs)
        sqnr = min((report[n].sqnr_db for n in outputs), default=float("inf"))
        if sqnr >= target or step == max_steps:
            break
        codes = {v.name: v.type.dtype for v in q.values()}
        ranked: list[str] = []
        for e in report.worst(len(report), skip_ops=_CONVERSIONS):
            if (e.local_sqnr_db is not None and e.layer and e.layer not in wide
                    and e.layer not in ranked and codes.get(e.value) is DType.i8):
                ranked.append(e.layer)
        if not ranked:
            break
        wide += ranked[:max(1, round(share * len(ranked)))]
        rule = Rule(name="widened", where=tuple(glob.escape(w) for w in wide),
                    weights=config.default.weights, activations="fixed16")
        cfg = QuantConfig.build({**config.model_dump(), "rules": [
            rule.model_dump(), *(r.model_dump() for r in config.rules)]})
    return QuantConfig.build({**cfg.model_dump(), "widen_to": None}), sqnr, len(wide)
