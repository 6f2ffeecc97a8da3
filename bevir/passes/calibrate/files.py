"""The files calibration reads and writes: ranges (JSON, with per-channel arrays and
histograms in a ``.safetensors`` file beside it), ``bevir-tranges`` files, onnxruntime's
calibration results (``TensorsData``) and calibration inputs (safetensors)."""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...fsutil import read_json, save_arrays, write_json
from ...ir.graph import Graph, Value
from ...ir.serialize import check_document
from .histogram import Histogram
from .keys import CalibrationError, ValueKey
from .methods import RangeMethod
from .tensor_range import TensorRange

FORMAT, VERSION = "bevir-ranges", 1
TRANGES_FORMAT, TRANGES_VERSION = "bevir-tranges", 1


# ---- ranges -------------------------------------------------------------------------------
def write_ranges(path: str | Path, method: RangeMethod, entries: list[TensorRange]) -> Path:
    """Write ranges (``method``, ``entries``) as JSON to ``path``; per-channel arrays and
    histograms, if any, to the ``.safetensors`` file beside it. Returns the JSON path."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    values = [entry_to_json(i, e, arrays) for i, e in enumerate(entries)]
    companion = path.with_suffix(".safetensors")
    if companion == path:
        raise CalibrationError(f"{path}: ranges are JSON; use another suffix than .safetensors")
    doc = {"format": FORMAT, "version": VERSION, "method": dataclasses.asdict(method),
           "arrays": companion.name if arrays else None, "values": values}
    if arrays:                      # first: the JSON, written last, names its sha256
        doc["arrays_sha256"] = save_arrays(arrays, companion)
    write_json(path, doc)
    return path


def read_ranges(path: Path, doc: dict) -> tuple[RangeMethod, list[TensorRange]]:
    """The method and entries of ``doc``, the JSON of ranges file ``path``."""
    if doc.get("format") != FORMAT:
        raise CalibrationError(f"{path}: not a bevir ranges file (format "
                               f"{doc.get('format')!r}, expected '{FORMAT}' or '{TRANGES_FORMAT}')")
    check_document(doc, path, FORMAT, VERSION, CalibrationError)
    with _reading(path):
        arrays = _read_arrays(path.with_name(doc["arrays"]), sha256=doc.get("arrays_sha256")) \
            if doc["arrays"] else {}
        method = RangeMethod(**doc["method"])
        entries = [entry_from_json(i, d, arrays) for i, d in enumerate(doc["values"])]
    return method, entries


def read_document(path: Path) -> dict:
    """The JSON document of ``path``; CalibrationError where it cannot be read."""
    return read_json(path, CalibrationError)


class _reading:
    """Turns malformed-content errors while reading ``path`` into CalibrationError."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ, exc, tb) -> bool:
        if exc is not None and isinstance(exc, (KeyError, TypeError, ValueError, AttributeError,
                                                OverflowError)):
            raise CalibrationError(
                f"{self.path}: malformed ranges file: {typ.__name__}: {exc}") from exc
        return False


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


def entry_to_json(i: int, e: TensorRange, arrays: dict[str, np.ndarray]) -> dict:
    """Entry ``i`` as JSON; its arrays go into ``arrays`` (under ``"<i>.<what>"``)."""
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


def entry_from_json(i: int, d: dict, arrays: Mapping[str, np.ndarray]) -> TensorRange:
    """Entry ``i`` from its JSON ``d`` and the ``arrays`` (see :func:`entry_to_json`)."""
    hist = d.get("histogram")
    lo, hi = (float(x) for x in d["range"])
    if not lo <= hi:                        # also a NaN
        raise ValueError(f"range [{lo!r}, {hi!r}] of value '{d['name']}': low above high")
    e = TensorRange(ValueKey(str(d["name"]), str(d["loc"]), int(d["index"])),
                    float(d["min"]), float(d["max"]), float(lo), float(hi), str(d["op"]),
                    str(d["source"]),
                    None if d["shape"] is None else tuple(int(s) for s in d["shape"]),
                    int(d["count"]), int(d["nonfinite"]), int(d["samples"]),
                    None if d["axis"] is None else int(d["axis"]))
    if f"{i}.channel_min" in arrays:
        e.channel_min, e.channel_max = arrays[f"{i}.channel_min"], arrays[f"{i}.channel_max"]
    if hist is not None:
        e.histogram = Histogram(int(hist["num_bins"]), arrays[f"{i}.histogram"],
                                float(hist["threshold"]))
    return e


# ---- seeding: tranges, onnxruntime --------------------------------------------------------
def read_tranges(path: str | Path) -> list[TensorRange]:
    """The entries of a tranges file: ``{"format": "bevir-tranges", "version": 1,
    "ranges": {"<onnx tensor name>": [min, max], ...}}``."""
    path = Path(path)
    doc = read_document(path)
    if doc.get("format") != TRANGES_FORMAT or doc.get("version") != TRANGES_VERSION:
        raise CalibrationError(f"{path}: not a {TRANGES_FORMAT} version {TRANGES_VERSION} file "
                               f"(format {doc.get('format')!r}, version {doc.get('version')!r})")
    table = doc.get("ranges")
    if not isinstance(table, dict) or set(doc) != {"format", "version", "ranges"}:
        raise CalibrationError(f"{path}: expected exactly the keys format, version and "
                               "ranges (an object of name: [min, max])")
    return [TensorRange.given(name, *_pair_of_numbers(path, name, mm), "tranges")
            for name, mm in table.items()]


def _pair_of_numbers(path: Path, name: str, mm: Any) -> tuple[float, float]:
    ok = (isinstance(mm, list) and len(mm) == 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in mm))
    if not ok:
        raise CalibrationError(f"{path}: range of '{name}' must be [min, max], got {mm!r}")
    return float(mm[0]), float(mm[1])


def onnxruntime_entries(data: Any) -> list[TensorRange]:
    """The entries of onnxruntime calibration results: a ``TensorsData`` or a mapping of
    tensor name to ``TensorData`` or ``(min, max)``."""
    items = data.items() if hasattr(data, "items") else None
    if items is None:
        raise CalibrationError(f"expected onnxruntime TensorsData or a mapping, got "
                               f"{type(data).__name__}")
    return [_ort_entry(name, d) for name, d in items]


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


# ---- calibration inputs -------------------------------------------------------------------
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
