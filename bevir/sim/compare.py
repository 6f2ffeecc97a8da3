"""Per-layer error between two runs: a reference graph (float) and a candidate (quantized,
fused, ...), matched by value name, reported by source layer (the producing node's loc).

    report = compare_graphs(float_graph, int8_graph, inputs)
    print(report.table(top=10))          # worst layers first (by local error)
    report.save_json("errors.json"); report.plot("errors.png")

Two errors per value: the accumulated one (the candidate run against the reference run:
everything upstream included) and the local one (teacher-forced: the candidate node fed
the reference run's values of its operands, quantized to its operand types, so its error
is its own). A broken layer stands out in the local column, where the accumulated one
carries it on to every layer after it.

Quantized candidate values are dequantized with their type's quantization (affine or
fixed point, per tensor or per channel) before they are compared. The candidate runs
first and keeps only the values the reference also has; the reference run then scores
each value as it is produced and drops it, so memory stays near one copy of the compared
activations (stored in their own, usually 8-bit, dtype).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..extras import pyplot
from ..fsutil import save_figure, write_json
from ..ir.graph import Graph, Node, Value
from ..ir.types import AffineQuant, FixedPointQuant, TensorType
from ..ir.opdef import get_op
from .interpreter import Interpreter


@dataclass(frozen=True)
class LayerError:
    """The error of one value: its name, the layer (loc) and op that produce it, SQNR in dB
    (inf when equal), max abs error, cosine similarity and size; ``local_sqnr_db`` the SQNR
    of the producing node alone (teacher-forced; None where its operands have no reference
    counterpart)."""
    value: str
    layer: str
    op: str
    sqnr_db: float
    max_abs: float
    cosine: float
    numel: int
    local_sqnr_db: float | None = None

    @property
    def ranking(self) -> tuple[int, float]:
        """What ranks the worst layers: the local SQNR; values without one come after all
        that have one (their accumulated error may be anyone's), by accumulated SQNR."""
        return (0, self.local_sqnr_db) if self.local_sqnr_db is not None else (1, self.sqnr_db)


def dequantize(array: np.ndarray, type: TensorType) -> np.ndarray:
    """Real values of ``array`` under ``type``'s quantization (float64); float arrays as is."""
    q = type.quant
    a = np.asarray(array, np.float64)
    if q is None:
        return a
    shape = [1] * a.ndim
    if q.axis is not None:
        shape[q.axis] = -1
    if isinstance(q, AffineQuant):
        return (a - np.reshape(q.zero_point, shape)) * np.reshape(q.scale, shape)
    if isinstance(q, FixedPointQuant):
        return a * np.exp2(-np.reshape(np.asarray(q.frac_bits, np.float64), shape))
    raise TypeError(f"unknown quantization {q!r}")


def quantize_like(real: np.ndarray, type: TensorType) -> np.ndarray:
    """``real`` values as codes of ``type`` (rounded half to even, saturated); a type
    without quantization just takes its dtype."""
    q, dt = type.quant, type.dtype.np
    if q is None:
        return np.asarray(real).astype(dt)
    a = np.asarray(real, np.float64)
    shape = [1] * a.ndim
    if q.axis is not None:
        shape[q.axis] = -1
    if isinstance(q, AffineQuant):
        codes = np.rint(a / np.reshape(q.scale, shape)) + np.reshape(q.zero_point, shape)
    else:
        codes = np.rint(a * np.exp2(np.reshape(np.asarray(q.frac_bits, np.float64), shape)))
    info = np.iinfo(dt)
    return np.clip(codes, info.min, info.max).astype(dt)


def layer_error(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    """(SQNR dB, max abs error, cosine similarity) of ``got`` against ``ref``."""
    r, g = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    err = r - g
    noise, signal = float(err @ err), float(r @ r)
    sqnr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal else -math.inf)
    denom = math.sqrt(signal * float(g @ g))
    cosine = float(r @ g) / denom if denom else float(noise == 0)
    return sqnr, float(np.abs(err).max(initial=0.0)), cosine


class ErrorReport:
    """Per-layer errors, in the candidate graph's order."""

    def __init__(self, layers: list[LayerError]):
        self.layers = layers

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, value: str) -> LayerError:
        for e in self.layers:
            if e.value == value:
                return e
        raise KeyError(value)

    def first_divergence(self, tolerance: float = 0.0) -> LayerError | None:
        """The first value, in the candidate's graph order, whose max abs error exceeds
        ``tolerance`` (0: the first that is not exactly equal); None when none does."""
        return next((e for e in self.layers if not e.max_abs <= tolerance), None)

    def worst(self, n: int = 10, by: str = "local", skip_ops: Iterable[str] = ()
              ) -> list[LayerError]:
        """The ``n`` values with the lowest SQNR: local (values without a local figure
        last) or ``by="accumulated"``; values of the ``skip_ops`` (e.g. format
        conversions, whose error is their operand's format's) are not ranked."""
        key = (lambda e: e.ranking) if by == "local" else (lambda e: e.sqnr_db)
        skip = set(skip_ops)
        return sorted((e for e in self.layers if e.op not in skip), key=key)[:n]

    def table(self, top: int | None = None) -> str:
        """A text table, worst first by local error (``top``: only that many rows)."""
        rows = self.worst(top or len(self.layers))
        out = [f"{'layer':56} {'op':18} {'local dB':>8} {'SQNR dB':>8} {'max abs':>10} "
               f"{'cosine':>8}"]
        for e in rows:
            layer = e.layer if len(e.layer) <= 56 else "..." + e.layer[-53:]
            local = "-" if e.local_sqnr_db is None else f"{e.local_sqnr_db:.2f}"
            out.append(f"{layer:56} {e.op:18} {local:>8} {e.sqnr_db:8.2f} {e.max_abs:10.3g} "
                       f"{e.cosine:8.5f}")
        return "\n".join(out)

    def to_json(self) -> dict:
        def clean(d):
            return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in d.items()}
        return {"format": "bevir-layer-errors", "version": 2,
                "layers": [clean(asdict(e)) for e in self.layers]}

    def save_json(self, path: str | Path) -> None:
        write_json(path, self.to_json())

    def plot(self, path: str | Path, title: str = "per-layer SQNR", label_worst: int = 5,
             skip_ops: Iterable[str] = ()) -> None:
        """SQNR per value in graph order, the worst few (``worst(label_worst, skip_ops=)``)
        labelled by layer and op; the values of ``skip_ops`` drawn apart, in grey (PNG or
        PDF)."""
        plt = pyplot()
        def finite(x):
            return x if x is not None and math.isfinite(x) else np.nan
        skip = set(skip_ops)
        fig, ax = plt.subplots(figsize=(12, 4))
        ax.plot(range(len(self.layers)), [finite(e.sqnr_db) for e in self.layers], ".-", lw=0.8,
                label="accumulated")
        ax.plot(range(len(self.layers)), [finite(e.local_sqnr_db) for e in self.layers], "x",
                ms=4, label="local (teacher-forced)")
        apart = [(i, finite(e.sqnr_db)) for i, e in enumerate(self.layers) if e.op in skip]
        if apart:
            ax.plot(*zip(*apart), "o", ms=5, color="0.6",
                    label=f"{'/'.join(sorted(skip))} (not ranked)" if len(skip) < 3 else
                    "format conversions (not ranked)")
        for e in self.worst(label_worst, skip_ops=skip):
            i = self.layers.index(e)
            ax.annotate(f"{e.layer.split('/')[-1][-36:]} ({e.op})", (i, finite(e.ranking[1])),
                        fontsize=7, rotation=20)
        ax.legend(fontsize=8)
        ax.set(xlabel="value (graph order)", ylabel="SQNR (dB)", title=title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        save_figure(fig, path, dpi=120)
        plt.close(fig)


_ORT_SUFFIX = "_quantized"


class _Recorder:
    """An ``on_node_end`` hook for the candidate run: keeps the results whose names are
    wanted."""

    def __init__(self, counterpart: Callable[[Value], str | None]):
        self.counterpart, self.kept = counterpart, {}

    def __call__(self, node: Node, args, results) -> None:
        for v, r in zip(node.outputs, results):
            name = self.counterpart(v)
            if name is not None and name not in self.kept:
                self.kept[name] = (r, v.type, node)


class _Scorer:
    """An ``on_node_end`` hook for the reference run: scores each kept candidate value as
    it is produced."""

    def __init__(self, kept: dict):
        self.kept, self.scores = kept, {}

    def __call__(self, node: Node, args, results) -> None:
        for v, r in zip(node.outputs, results):
            if v.name in self.kept:
                got, type, cnode = self.kept.pop(v.name)
                if np.shape(got) == np.shape(r):
                    sqnr, mx, cos = layer_error(r, dequantize(got, type))
                    self.scores[v.name] = LayerError(v.name, cnode.loc or node.loc, cnode.op,
                                                     sqnr, mx, cos, int(np.size(r)))


class _LocalScorer:
    """An ``on_node_end`` hook for the reference run: as soon as the reference has made a
    value that a candidate node also makes, that node runs on teacher-forced operands and
    its result is scored against the reference's (the node's own error). An operand the
    reference has by name is its reference value quantized to the operand's type; an
    operand it has not (a conversion the candidate inserted) is recomputed from its
    producer's teacher-forced operands."""

    def __init__(self, candidate: Graph, name_of: Callable[[Value], str | None],
                 chosen: Callable[[Value], bool]):
        self.name_of = name_of
        self.by_result: dict[str, list[tuple[Node, int]]] = {}
        self.wanted: dict[str, set] = {}          # reference name -> candidate types of it
        for v in candidate.values():
            r = name_of(v)
            if r is None:
                continue
            self.wanted.setdefault(r, set()).add(v.type)
            if v.producer is not None and chosen(v):
                self.by_result.setdefault(r, []).append((v.producer, v.producer.outputs.index(v)))
        self.codes: dict[tuple[str, TensorType], np.ndarray] = {}
        self.made: set[str] = set()               # reference values made so far
        self.scores: dict[str, float] = {}

    def __call__(self, node: Node, args, results) -> None:
        for v, r in zip(node.outputs, results):
            self.seed(v.name, r)
            for cnode, i in self.by_result.get(v.name, ()):
                got = self._run(cnode, {})
                if got is not None and np.shape(got[i]) == np.shape(r):
                    self.scores[v.name] = layer_error(
                        r, dequantize(got[i], cnode.outputs[i].type))[0]

    def seed(self, name: str, array: np.ndarray) -> None:
        """A reference value (a node's result, or a graph input) in its candidate types (of
        its shape: a candidate value of another shape under the same name is recomputed)."""
        self.made.add(name)
        for t in self.wanted.get(name, ()):
            if t.shape == np.shape(array):
                self.codes[(name, t)] = quantize_like(array, t)

    def _forced(self, v: Value | None, memo: dict) -> np.ndarray | None:
        if v is None:
            return None
        if v.is_const:
            return v.const
        r = self.name_of(v)
        if r is not None and (r, v.type) in self.codes:
            return self.codes[(r, v.type)]
        if r is not None and v.producer is not None and r not in self.made:
            return None                          # the reference has not made it yet
        if v.producer is None:
            return None
        if id(v) not in memo:
            results = self._run(v.producer, memo)
            memo[id(v)] = None if results is None else results[v.producer.outputs.index(v)]
        return memo[id(v)]

    def _run(self, node: Node, memo: dict) -> list[np.ndarray] | None:
        """``node`` on teacher-forced operands; None when one is not there (yet)."""
        args = [self._forced(v, memo) for v in node.inputs]
        if any(a is None and v is not None for a, v in zip(args, node.inputs)):
            return None
        return get_op(node.op).run(node, args)


def compare_graphs(reference: Graph, candidate: Graph, inputs: Mapping[str, np.ndarray], *,
                   candidate_inputs: Mapping[str, np.ndarray] | None = None,
                   select: Iterable[str] | None = None, local: bool = True) -> ErrorReport:
    """Run both graphs and score every candidate value that the reference also has (same
    name, same shape): its accumulated error and (``local``) its own, teacher-forced one.
    ``select``: glob patterns on the layer (loc) or value name to restrict the
    comparison; ``candidate_inputs``: when the candidate takes other inputs."""
    ref_names = {v.name for v in reference.values()}
    patterns = list(select or [])

    def name_of(v: Value) -> str | None:
        """The reference value ``v`` stands for: the same name, or, for onnxruntime's
        quantized tensors (``<name>_quantized``), the float tensor's name."""
        if v.is_const:
            return None
        name = v.name if v.name in ref_names else v.name.removesuffix(_ORT_SUFFIX)
        return name if name in ref_names else None

    def chosen(v: Value) -> bool:
        loc = v.producer.loc if v.producer else ""
        return not patterns or any(fnmatch.fnmatch(loc, p) or fnmatch.fnmatch(v.name, p)
                                   for p in patterns)

    def counterpart(v: Value) -> str | None:
        return name_of(v) if chosen(v) else None
    rec = _Recorder(counterpart)
    Interpreter(candidate, on_node_end=rec).run(
        candidate_inputs if candidate_inputs is not None else inputs)
    order = list(rec.kept)
    hooks = [_Scorer(rec.kept)] + ([_LocalScorer(candidate, name_of, chosen)] if local else [])

    def on_node_end(node, args, results):
        for hook in hooks:
            hook(node, args, results)
    if local:
        for name, array in inputs.items():
            hooks[-1].seed(name, np.asarray(array))
    Interpreter(reference, on_node_end=on_node_end).run(inputs)
    scores, local_scores = hooks[0].scores, hooks[-1].scores if local else {}
    layers = [dataclasses.replace(scores[k], local_sqnr_db=local_scores.get(k))
              for k in order if k in scores]
    return ErrorReport(layers)
