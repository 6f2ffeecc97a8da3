"""Per-layer error between two runs: a reference graph (float) and a candidate (quantized,
fused, ...), matched by value name, reported by source layer (the producing node's loc).

    report = compare_graphs(float_graph, int8_graph, inputs)
    print(report.table(top=10))          # worst layers first
    report.save_json("errors.json"); report.plot("errors.png")

Quantized candidate values are dequantized with their type's quantization (affine or
fixed point, per tensor or per channel) before they are compared. The candidate runs
first and keeps only the values the reference also has; the reference run then scores
each value as it is produced and drops it, so memory stays near one copy of the compared
activations (stored in their own, usually 8-bit, dtype).
"""
from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..ir.graph import Graph, Node, Value
from ..ir.types import AffineQuant, FixedPointQuant, TensorType
from .interpreter import Interpreter


@dataclass(frozen=True)
class LayerError:
    """The error of one value: its name, the layer (loc) and op that produce it, SQNR in dB
    (inf when equal), max abs error, cosine similarity and size."""
    value: str
    layer: str
    op: str
    sqnr_db: float
    max_abs: float
    cosine: float
    numel: int


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

    def worst(self, n: int = 10) -> list[LayerError]:
        """The ``n`` values with the lowest SQNR."""
        return sorted(self.layers, key=lambda e: e.sqnr_db)[:n]

    def table(self, top: int | None = None) -> str:
        """A text table, worst first (``top``: only that many rows)."""
        rows = self.worst(top or len(self.layers))
        out = [f"{'layer':56} {'op':18} {'SQNR dB':>8} {'max abs':>10} {'cosine':>8}"]
        for e in rows:
            layer = e.layer if len(e.layer) <= 56 else "..." + e.layer[-53:]
            out.append(f"{layer:56} {e.op:18} {e.sqnr_db:8.2f} {e.max_abs:10.3g} {e.cosine:8.5f}")
        return "\n".join(out)

    def to_json(self) -> dict:
        def clean(d):
            return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in d.items()}
        return {"format": "bevir-layer-errors", "version": 1,
                "layers": [clean(asdict(e)) for e in self.layers]}

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    def plot(self, path: str | Path, title: str = "per-layer SQNR", label_worst: int = 5) -> None:
        """SQNR per value in graph order, the worst few labelled by layer (PNG or PDF)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        finite = [e.sqnr_db if math.isfinite(e.sqnr_db) else np.nan for e in self.layers]
        fig, ax = plt.subplots(figsize=(12, 4))
        ax.plot(range(len(finite)), finite, ".-", lw=0.8)
        for e in self.worst(label_worst):
            i = self.layers.index(e)
            ax.annotate(e.layer.split("/")[-1][-40:], (i, e.sqnr_db), fontsize=7, rotation=20)
        ax.set(xlabel="value (graph order)", ylabel="SQNR (dB)", title=title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
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


def compare_graphs(reference: Graph, candidate: Graph, inputs: Mapping[str, np.ndarray], *,
                   candidate_inputs: Mapping[str, np.ndarray] | None = None,
                   select: Iterable[str] | None = None) -> ErrorReport:
    """Run both graphs and score every candidate value that the reference also has (same
    name, same shape). ``select``: glob patterns on the layer (loc) or value name to
    restrict the comparison; ``candidate_inputs``: when the candidate takes other inputs."""
    ref_names = {v.name for v in reference.values()}
    patterns = list(select or [])

    def counterpart(v: Value) -> str | None:
        """The reference value ``v`` stands for: the same name, or, for onnxruntime's
        quantized tensors (``<name>_quantized``), the float tensor's name."""
        if v.is_const:
            return None
        name = v.name if v.name in ref_names else v.name.removesuffix(_ORT_SUFFIX)
        if name not in ref_names:
            return None
        loc = v.producer.loc if v.producer else ""
        chosen = not patterns or any(fnmatch.fnmatch(loc, p) or fnmatch.fnmatch(v.name, p)
                                     for p in patterns)
        return name if chosen else None
    rec = _Recorder(counterpart)
    Interpreter(candidate, on_node_end=rec).run(
        candidate_inputs if candidate_inputs is not None else inputs)
    order = list(rec.kept)
    scorer = _Scorer(rec.kept)
    Interpreter(reference, on_node_end=scorer).run(inputs)
    return ErrorReport([scorer.scores[k] for k in order if k in scorer.scores])
