"""The reference backbone flow: FP32 ONNX -> onnxruntime INT8 ONNX -> tranges -> bevir graph.

    qb = bevir.flows.quantize_backbone(module_or_onnx, images, "out/", scales="scales.json")
    qb.int8_onnx, qb.tranges, qb.graph, qb.ranges

The steps, as the vendor notebook quantizes the ResNet-50 + FPN backbone:

1. **FP32 ONNX**: a torch module is exported (``torch.onnx.export``, the TorchScript
   exporter, opset 17, eval mode: BatchNorm folds into the convolutions); an ONNX file is
   taken as it is.
2. **INT8 ONNX**: ``onnxruntime.quantization.quantize_static`` over the calibration inputs
   (MinMax), QOperator format by default (or QDQ), INT8 activations and weights, both
   symmetric, per-tensor weights unless ``per_channel``. Forced scales (a checkpoint's
   ``x_scale``/``w_scale``) go in as ``TensorQuantOverrides``; afterwards every forced
   scale is checked to be the one the INT8 model holds. The model is prepared for the
   quantizer first (:func:`prepare_for_quantizer`: initializers shared through Identity
   nodes or by several nodes get one copy per reader, shapes are inferred).
3. **tranges**: the INT8 model runs in onnxruntime on the test vectors with every tensor
   fetched; min/max of each (integer tensors in real units, through their scale and zero
   point) is recorded. The tranges file holds the activations the quantization parameters
   describe: each input of a QuantizeLinear and each output of a DequantizeLinear that is
   not a constant. A tensor the run gave no finite value for gets the range its scale and
   zero point span (reported as "from scales").
4. **bevir**: the INT8 model imported with :func:`bevir.from_onnx`, the tranges attached as
   its calibration (:meth:`Ranges.attach`).

Errors in the inputs (files, scales, a scale onnxruntime did not honour) and any exception
inside onnxruntime's quantizer raise :class:`QuantizeError`, a :class:`bevir.BevirError`, with
a one-line message.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import BevirError
from ..extras import require
from ..fsutil import write_json
from ..frontends.onnx import load_model
from ..ir.graph import Graph
from ..passes.calibrate import (TRANGES_FORMAT, TRANGES_VERSION, Progress, Ranges, TensorRange,
                                ValueKey)
from .onnx import from_onnx

FORMATS = ("qoperator", "qdq")
QUANT_TYPES = ("int8", "uint8")
# checkpoint key suffixes: '<conv module>.<suffix>' -> the conv's input 0 (x) or 1 (weight)
SCALE_SUFFIXES = {"x_scale": 0, "input_scale": 0, "act_scale": 0,
                  "w_scale": 1, "weight_scale": 1}
CAPTURE_BYTES = 1 << 30          # fetch at most about this much per onnxruntime run

Array = Any                      # a numpy array or a torch tensor
Sample = Union[Array, Mapping[str, Array]]
Samples = Union[str, Path, Sample, Iterable[Sample]]
Scales = Union[str, Path, Mapping[str, Union[float, Sequence[float]]]]


# float ops that compute (not data movement): in an INT8 backbone, what stayed unfolded
FLOAT_COMPUTE = ("conv2d", "matmul", "gemm", "add", "mul", "global_avgpool", "sigmoid")


def _count(counts: Mapping[str, int]) -> int:
    return sum(counts.values())


def _describe_float(counts: Mapping[str, int]) -> str:
    return f" ({', '.join(f'{k} x{v}' for k, v in sorted(counts.items()))})" if counts else ""


class QuantizeError(BevirError):
    """The backbone flow cannot go on: a bad model, inputs or scales file, a scale that
    names nothing in the model, or an INT8 model whose scales are not the forced ones."""


# ---- the result ---------------------------------------------------------------------------
@dataclass
class QuantizedBackbone:
    """What :func:`quantize_backbone` made.

    ``fp32_onnx``, ``int8_onnx``, ``tranges``: the files. ``graph``: the INT8 model in
    bevir, with ``ranges`` (the tranges) attached. ``overrides``: ONNX tensor name -> the
    forced scale(s). ``captured``: every tensor of the INT8 run -> (min, max) in real
    units. ``from_data``/``from_scales``: how the tranges entries were found.
    """

    fp32_onnx: Path
    int8_onnx: Path
    tranges: Path
    graph: Graph
    ranges: Ranges
    format: str = "qoperator"
    per_channel: bool = False
    overrides: dict[str, tuple[float, ...]] = field(default_factory=dict)
    captured: dict[str, tuple[float, float]] = field(default_factory=dict)
    from_data: int = 0
    from_scales: int = 0

    def summary(self) -> str:
        """A few lines: the files, the INT8 ops, forced scales and tranges counts."""
        ops = sorted({n.op_type for n in onnx.load(str(self.int8_onnx),
                                                   load_external_data=False).graph.node})
        mode = "per-channel" if self.per_channel else "per-tensor"
        return "\n".join([
            f"fp32:    {self.fp32_onnx}",
            f"int8:    {self.int8_onnx}  ({self.format}, {mode} weights) ops={ops}",
            f"scales:  {len(self.overrides)} forced, all found in the INT8 model",
            f"tranges: {self.tranges}  ({len(self.ranges)} entries: {self.from_data} from "
            f"data, {self.from_scales} from scales; {len(self.captured)} tensors captured)",
            f"graph:   {len(self.graph.nodes)} bevir nodes, {_count(self.float_ops())} float "
            f"ops{_describe_float(self.float_ops())}"])

    def float_ops(self) -> dict[str, int]:
        """Compute ops of the imported graph that run in float (op -> count): the groups
        onnxruntime did not fold into integer kernels (see ``fold-qdq``). Their float
        arithmetic rounds differently from onnxruntime's float kernels."""
        counts: dict[str, int] = {}
        for n in self.graph.nodes:
            if n.op in FLOAT_COMPUTE:
                counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def mismatches(self, inputs: Sample) -> dict[str, int]:
        """bevir's golden model against onnxruntime on one sample: per graph output, the
        number of elements that differ (0 everywhere: bit for bit)."""
        return compare_with_onnxruntime(self.graph, self.int8_onnx, inputs)


# ---- the flow -----------------------------------------------------------------------------
def quantize_backbone(model: Any, calibration_inputs: Samples, out_dir: str | Path, *,
                      input_name: str | None = None, scales: Scales | None = None,
                      per_channel: bool = False, format: str = "qoperator",
                      activation_type: str = "int8", weight_type: str = "int8",
                      symmetric: bool = True, test_inputs: Samples | None = None,
                      name: str = "backbone", progress: bool | None = True
                      ) -> QuantizedBackbone:
    """Quantize a backbone to INT8 ONNX with onnxruntime as the reference flow does, write
    its tranges and import it into bevir (see the module docstring for the steps).

    ``model``: a ``torch.nn.Module`` (exported to ``<out_dir>/<name>_fp32.onnx``) or the
    path of an FP32 ONNX model. ``calibration_inputs``: one sample (an array for the input,
    or a dict of input name -> array), a list of them, or a safetensors file (a tensor of
    the input's shape is one sample, one with a leading axis holds that many).
    ``input_name``: the input's name (default ``img`` for an export, else the model's only
    input). ``scales``: forced scales, a mapping or a ``.json``/``.safetensors`` file of
    ``{key: scale}``; a key is an ONNX tensor name or ``<conv module>.x_scale`` /
    ``.w_scale`` (the module path of the Conv node, ``img_backbone.layer1.0.conv1``); a
    weight scale may be a list (one per output channel, with ``per_channel``). Keys of a
    ``.safetensors`` checkpoint that name no convolution of the model are skipped; those
    of a mapping or JSON file are errors. Forced scales are symmetric: zero point 0 (128
    for uint8). ``format``: ``qoperator`` or ``qdq``. ``activation_type``/``weight_type``:
    ``int8`` or ``uint8``; ``symmetric``: symmetric activations (weights always are).
    ``test_inputs``: the samples the tranges are measured on (default: the calibration
    inputs). ``progress``: step lines and progress bars on stderr (None: only when stderr
    is a terminal). Writes ``<name>_int8.onnx`` and ``<name>_int8.tranges`` in ``out_dir``.
    """
    _check_choice("format", format, FORMATS)
    _check_choice("activation_type", activation_type, QUANT_TYPES)
    _check_choice("weight_type", weight_type, QUANT_TYPES)
    log = _Log(progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fp32, proto, input_name = _fp32_model(model, calibration_inputs, out, name, input_name, log)
    calib = _samples(calibration_inputs, proto, input_name)
    tests = calib if test_inputs is None else _samples(test_inputs, proto, input_name)
    proto = prepare_for_quantizer(proto, str(fp32))
    overrides, keys = resolve_scales(proto, scales, per_channel)
    int8 = out / f"{name}_int8.onnx"
    log.step(f"[2] quantizing to INT8 ONNX ({format}, "
             f"{'per-channel' if per_channel else 'per-tensor'} weights): {int8}")
    if overrides:
        log.step(f"  overrides: {_describe_overrides(proto, overrides)} from {keys}")
    _quantize(proto, fp32, int8, calib, overrides, format, per_channel, activation_type,
              weight_type, symmetric, log)
    check_scales(int8, overrides)
    graph = from_onnx(int8)
    tranges = out / f"{name}_int8.tranges"
    log.step(f"[3] writing tranges from the INT8 model run on {len(tests)} test vector(s)")
    captured = capture_ranges(int8, tests, log)
    table, from_data = tranges_table(int8, captured)
    write_tranges(tranges, table)
    log.step(f"  captured {len(captured)} tensors -> {tranges.name} ({len(table)} entries: "
             f"{from_data} from data, {len(table) - from_data} from scales)")
    ranges = Ranges.from_tranges(tranges, graph).attach(graph)
    return QuantizedBackbone(fp32, int8, tranges, graph, ranges, format, per_channel,
                             overrides, captured, from_data, len(table) - from_data)


def _check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise QuantizeError(f"{what} must be one of {', '.join(choices)}, got {value!r}")


class _Log:
    """Step lines and progress bars on stderr, or nothing."""

    def __init__(self, progress: bool | None):
        self.enabled = sys.stderr.isatty() if progress is None else bool(progress)

    def step(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def bar(self, total: int, desc: str) -> Progress:
        return Progress(total, desc, enabled=self.enabled)


# ---- step 1: the FP32 model ---------------------------------------------------------------
def _fp32_model(model: Any, inputs: Samples, out: Path, name: str, input_name: str | None,
                log: _Log) -> tuple[Path, onnx.ModelProto, str]:
    """(path, proto, input name) of the FP32 model, exporting a torch module first."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        log.step(f"[1] FP32 ONNX: {path}")
    else:
        path = out / f"{name}_fp32.onnx"
        input_name = input_name or "img"
        sample = _samples(inputs, None, input_name)
        if not sample:
            raise QuantizeError("no calibration inputs to export the model with")
        log.step(f"[1] exporting FP32 ONNX (input {list(sample[0][input_name].shape)}): {path}")
        export_onnx(model, sample[0][input_name], path, input_name)
    proto = load_model(path)
    names = [i.name for i in proto.graph.input]
    if input_name is None:
        if len(names) != 1:
            raise QuantizeError(f"{path}: the model has inputs {names}; say which is the image "
                                "(input_name)")
        input_name = names[0]
    elif input_name not in names:
        raise QuantizeError(f"{path}: no input '{input_name}' (the model has {names})")
    return path, proto, input_name


def export_onnx(module: Any, sample: Array, path: str | Path, input_name: str = "img",
                output_name: str = "feats") -> Path:
    """Export a torch module taking one image tensor to FP32 ONNX as the reference flow does
    (TorchScript exporter, opset 17, eval mode, constants folded)."""
    torch = require("torch")
    x = torch.from_numpy(np.ascontiguousarray(_array(sample)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # torch's legacy-exporter notice
        torch.onnx.export(module, (x,), str(path), input_names=[input_name],
                          output_names=[output_name], opset_version=17, dynamo=False)
    return Path(path)


# ---- inputs -------------------------------------------------------------------------------
def _array(x: Array) -> np.ndarray:
    if hasattr(x, "detach"):                             # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _samples(inputs: Samples, proto: onnx.ModelProto | None, input_name: str
             ) -> list[dict[str, np.ndarray]]:
    """The samples as input dicts. A file's tensors are split on a leading sample axis
    when ``proto`` says the input has one dimension less (else each is one sample)."""
    if isinstance(inputs, (str, Path)):
        return _samples_from_file(Path(inputs), proto, input_name)
    if isinstance(inputs, Mapping) or hasattr(inputs, "shape"):
        inputs = [inputs]
    out = []
    for s in inputs:
        d = dict(s) if isinstance(s, Mapping) else {input_name: s}
        out.append({k: np.ascontiguousarray(_array(v)) for k, v in d.items()})
    return out


def _samples_from_file(path: Path, proto: onnx.ModelProto | None, input_name: str
                       ) -> list[dict[str, np.ndarray]]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    if not path.is_file():
        raise QuantizeError(f"calibration inputs {path}: no such file")
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise QuantizeError(f"cannot read calibration inputs {path}: {e}") from None
    if input_name not in arrays:
        raise QuantizeError(f"{path}: no tensor '{input_name}' (it holds {sorted(arrays)})")
    a = arrays[input_name]
    rank = _input_rank(proto, input_name)
    if rank is not None and a.ndim == rank + 1:
        return [{input_name: np.ascontiguousarray(a[i])} for i in range(a.shape[0])]
    if rank is not None and a.ndim != rank:
        raise QuantizeError(f"{path}: tensor '{input_name}' has shape {list(a.shape)}; the "
                            f"model's input has rank {rank} (or [samples, ...] of it)")
    return [{input_name: a}]


def _input_rank(proto: onnx.ModelProto | None, name: str) -> int | None:
    if proto is None:
        return None
    inp = next(i for i in proto.graph.input if i.name == name)
    return len(inp.type.tensor_type.shape.dim)


# ---- scales -------------------------------------------------------------------------------
def resolve_scales(proto: onnx.ModelProto, scales: Scales | None, per_channel: bool = False
                   ) -> tuple[dict[str, tuple[float, ...]], str]:
    """Forced scales as ONNX tensor name -> scale(s), and where they came from.

    A key is a tensor name of the model, or ``<conv module>.x_scale`` / ``.w_scale`` (also
    ``input_scale``, ``act_scale``, ``weight_scale``) for the input / weight of the Conv
    node of that module path. Two keys forcing one tensor differently are an error.
    """
    if scales is None:
        return {}, ""
    table, lenient, where = _read_scales(scales)
    convs = _conv_index(proto)
    inits = {t.name: t for t in proto.graph.initializer}
    tensors = set(inits) | {i.name for i in proto.graph.input} | {
        o for n in proto.graph.node for o in n.output}
    resolved: dict[str, tuple[float, ...]] = {}
    source: dict[str, str] = {}
    for key, raw in table.items():
        tensor = _scale_target(key, tensors, convs, lenient, where)
        if tensor is None:
            continue
        vals = _scale_values(key, raw, tensor, inits, per_channel, where)
        if tensor in resolved and resolved[tensor] != vals:
            raise QuantizeError(f"{where}: '{source[tensor]}' and '{key}' force tensor "
                                f"'{tensor}' to different scales {list(resolved[tensor])} "
                                f"and {list(vals)}")
        resolved[tensor], source[tensor] = vals, key
    if lenient and not resolved and table:
        raise QuantizeError(f"{where}: none of its {len(table)} scales names a convolution "
                            "or tensor of the model")
    return resolved, where


def _read_scales(scales: Scales) -> tuple[dict[str, Any], bool, str]:
    """(key -> scale(s), lenient, description); lenient: a checkpoint (unknown keys skip)."""
    if isinstance(scales, Mapping):
        return dict(scales), False, "the given scales"
    path = Path(scales)
    if not path.is_file():
        raise QuantizeError(f"scales {path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        try:
            arrays = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise QuantizeError(f"cannot read scales {path}: {e}") from None
        keep = {k: v for k, v in arrays.items() if k.rsplit(".", 1)[-1] in SCALE_SUFFIXES}
        return {k: v.reshape(-1).tolist() for k, v in keep.items()}, True, str(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QuantizeError(f"scales {path}: not a JSON file: {e}") from None
    if not isinstance(doc, dict):
        raise QuantizeError(f"scales {path}: expected a JSON object of name: scale, got "
                            f"{type(doc).__name__}")
    return doc, False, str(path)


def module_path(node_name: str) -> str:
    """The torch module path of a node the TorchScript exporter named:
    ``/img_backbone/layer1/layer1.0/conv1/Conv`` -> ``img_backbone.layer1.0.conv1``."""
    parts = [p for p in node_name.split("/") if p][:-1]
    keep = [p for i, p in enumerate(parts)
            if not (i + 1 < len(parts) and parts[i + 1].startswith(p + "."))]
    return ".".join(keep)


def _conv_index(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """module path -> the inputs of its Conv node (modules with one Conv only)."""
    index: dict[str, list[str]] = {}
    seen: set[str] = set()
    for n in proto.graph.node:
        if n.op_type == "Conv" and n.name:
            path = module_path(n.name)
            index.pop(path, None) if path in seen else index.setdefault(path, list(n.input))
            seen.add(path)
    return index


def _scale_target(key: str, tensors: set[str], convs: dict[str, list[str]], lenient: bool,
                  where: str) -> str | None:
    if key in tensors:
        return key
    module, _, suffix = key.rpartition(".")
    if suffix in SCALE_SUFFIXES and module in convs:
        return convs[module][SCALE_SUFFIXES[suffix]]
    if lenient:
        return None
    raise QuantizeError(f"{where}: scale '{key}' names no tensor and no convolution of the "
                        "model (expected an ONNX tensor name or '<conv module>.x_scale' / "
                        "'<conv module>.w_scale')")


def _scale_values(key: str, raw: Any, tensor: str, inits: Mapping[str, onnx.TensorProto],
                  per_channel: bool, where: str) -> tuple[float, ...]:
    vals = raw if isinstance(raw, (list, tuple)) else [raw]
    ok = bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                            and math.isfinite(v) and v > 0 for v in vals)
    if not ok:
        raise QuantizeError(f"{where}: scale '{key}' must be a positive number (or a list of "
                            f"them for a weight), got {raw!r}")
    vals = tuple(float(np.float32(v)) for v in vals)
    if len(vals) == 1:
        return vals
    if tensor not in inits or not per_channel:
        what = "an activation" if tensor not in inits else "a weight without per_channel"
        raise QuantizeError(f"{where}: scale '{key}' has {len(vals)} values, but '{tensor}' "
                            f"is {what}: it takes one scale")
    channels = inits[tensor].dims[0]
    if len(vals) != channels:
        raise QuantizeError(f"{where}: scale '{key}' has {len(vals)} values; weight "
                            f"'{tensor}' has {channels} output channels")
    return vals


def _describe_overrides(proto: onnx.ModelProto, overrides: Mapping[str, Any]) -> str:
    inits = {t.name for t in proto.graph.initializer}
    w = sum(t in inits for t in overrides)
    return f"{len(overrides) - w} activation scales + {w} weight scales"


def _ort_overrides(overrides: Mapping[str, tuple[float, ...]], weights: set[str],
                   activation_type: str, weight_type: str, per_channel: bool
                   ) -> dict[str, list[dict[str, Any]]]:
    """The TensorQuantOverrides of onnxruntime's quantize_static for the forced scales."""
    zp = {"int8": np.array(0, np.int8), "uint8": np.array(128, np.uint8)}
    out = {}
    for tensor, vals in overrides.items():
        is_w = tensor in weights
        z = zp[weight_type if is_w else activation_type]
        items = [{"scale": np.array(v, np.float32), "zero_point": z} for v in vals]
        if is_w and per_channel:
            items[0]["axis"] = 0
        out[tensor] = items
    return out


def check_scales(int8_onnx: str | Path, overrides: Mapping[str, tuple[float, ...]]) -> None:
    """Raise QuantizeError unless each forced scale is the INT8 model's ``<tensor>_scale``
    (float32, every channel)."""
    if not overrides:
        return
    inits = {t.name: t for t in onnx.load(str(int8_onnx)).graph.initializer}
    for tensor, want in overrides.items():
        t = inits.get(f"{tensor}_scale")
        if t is None:
            raise QuantizeError(f"{int8_onnx}: no scale for '{tensor}' (forced to "
                                f"{list(want)}); onnxruntime did not quantize it as asked")
        got = numpy_helper.to_array(t).reshape(-1)
        expect = np.asarray(want, np.float32)
        if got.dtype != np.float32 or not (got.size == expect.size or expect.size == 1) \
                or not np.array_equal(got, np.broadcast_to(expect, got.shape)):
            raise QuantizeError(f"{int8_onnx}: scale of '{tensor}' is {got.tolist()[:4]}, "
                                f"not the forced {list(want)[:4]}")


# ---- step 2: onnxruntime ------------------------------------------------------------------
def prepare_for_quantizer(proto: onnx.ModelProto, where: str = "the model") -> onnx.ModelProto:
    """A copy of an FP32 model that onnxruntime's quantizer takes safely (what its
    ``quant_pre_process`` is for, without graph optimizations: node and tensor names, which
    forced scales refer to, stay):

    - an Identity of an initializer (also a chain of them) becomes an initializer of its
      own, named as the Identity's output: the TorchScript exporter shares identical
      initializers, such as the zero biases of untrained batch norms folded into
      convolutions, through Identity nodes, and the quantizer cannot read a bias there;
    - an initializer read by several node inputs gets a copy for each further one, so that
      each convolution or Gemm quantizes a weight and a bias of its own;
    - ONNX shape inference records every tensor's type and shape.

    ``where`` names the model in errors (QuantizeError).
    """
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    names = set(inits) | {i.name for i in g.input} | {o for n in g.node for o in n.output}
    added: list[onnx.TensorProto] = []
    uses: dict[str, int] = {}
    dropped = []

    def copy(src: str, name: str) -> str:
        t = onnx.TensorProto()
        t.CopyFrom(inits[src])
        t.name = name
        inits[name] = t
        names.add(name)
        added.append(t)
        return name

    for index, n in enumerate(g.node):                  # in topological order
        if n.op_type == "Identity" and n.domain in ("", "ai.onnx") and n.input[0] in inits:
            copy(n.input[0], n.output[0])
            dropped.append(index)
            continue
        for k, i in enumerate(n.input):
            if i in inits:
                uses[i] = uses.get(i, 0) + 1
                if uses[i] > 1:
                    n.input[k] = copy(i, _fresh(f"{i}_{uses[i] - 1}", names))
    for index in reversed(dropped):
        del g.node[index]
    g.initializer.extend(added)
    try:
        return onnx.shape_inference.infer_shapes(m)
    except Exception as e:          # onnx's InferenceError, ValueError, ...
        raise QuantizeError(f"preparing {where} for onnxruntime's quantizer: ONNX shape "
                            f"inference failed: {type(e).__name__}: {_one_line(e)}") from None


def _fresh(name: str, taken: set[str]) -> str:
    k, out = 0, name
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    return out


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _failed_in(e: BaseException) -> str:
    """Where an exception was raised: 'function (file.py:line)' of its innermost frame."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    code = tb.tb_frame.f_code
    return f" in {code.co_name} ({Path(code.co_filename).name}:{tb.tb_lineno})"


class _Reader:
    """A CalibrationDataReader over a list of samples, with a progress bar."""

    def __init__(self, samples: list[dict[str, np.ndarray]], bar: Progress):
        self._it: Iterator[dict[str, np.ndarray]] = iter(samples)
        self._bar = bar

    def get_next(self) -> dict[str, np.ndarray] | None:
        item = next(self._it, None)
        if item is not None:
            self._bar.update()
        return item


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantizer warns on the root logger (QInt8 with QOperator...)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def _quantize(proto: onnx.ModelProto, fp32: Path, int8: Path,
              calib: list[dict[str, np.ndarray]], overrides: Mapping[str, tuple[float, ...]],
              format: str, per_channel: bool, activation_type: str, weight_type: str,
              symmetric: bool, log: _Log) -> None:
    """quantize_static on the prepared model ``proto`` (from ``fp32``) into ``int8``; any
    exception inside onnxruntime becomes a one-line QuantizeError."""
    ortq = require("onnxruntime.quantization")
    QuantFormat, QuantType = ortq.QuantFormat, ortq.QuantType
    if not calib:
        raise QuantizeError("no calibration inputs")
    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    weights = {t.name for t in proto.graph.initializer}
    # (no CalibMaxIntermediateOutputs: onnxruntime clears the batches it flushes uncomputed)
    extra = {"ActivationSymmetric": symmetric, "WeightSymmetric": True,
             "TensorQuantOverrides": _ort_overrides(overrides, weights, activation_type,
                                                    weight_type, per_channel)}
    bar = log.bar(len(calib), "  calibrating")
    try:
        with _quiet_root_logger():
            ortq.quantize_static(proto, str(int8), _Reader(calib, bar),
                                 quant_format=QuantFormat.QDQ if format == "qdq"
                                 else QuantFormat.QOperator,
                                 per_channel=per_channel,
                                 activation_type=qtype[activation_type],
                                 weight_type=qtype[weight_type], extra_options=extra)
    except Exception as e:          # whatever fails inside onnxruntime: one line
        mode = "per-channel" if per_channel else "per-tensor"
        raise QuantizeError(f"quantizing {fp32} to INT8 ({format}, {mode} weights): "
                            f"onnxruntime's quantize_static failed{_failed_in(e)}: "
                            f"{type(e).__name__}: {_one_line(e)}") from None
    finally:
        bar.close()


# ---- step 3: tranges ----------------------------------------------------------------------
def _session(model: str | Path | bytes):
    return require("onnxruntime").InferenceSession(
        model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"])


def capture_ranges(int8_onnx: str | Path, samples: list[dict[str, np.ndarray]],
                   log: _Log | None = None, budget: int = CAPTURE_BYTES
                   ) -> dict[str, tuple[float, float]]:
    """Run the INT8 model in onnxruntime on each sample, fetching every node output, and
    return each tensor's (min, max) over the finite values (the inputs' from the samples),
    integer tensors dequantized with their scale and zero point. Tensors are fetched in groups of
    about ``budget`` bytes (one run per group and sample)."""
    log = log or _Log(False)
    proto = onnx.load(str(int8_onnx))
    shapes = _tensor_types(int8_onnx)
    inputs = [i.name for i in proto.graph.input]
    outputs = [o for n in proto.graph.node for o in n.output if o]
    names = inputs + outputs
    stats = {n: TensorRange(ValueKey(n)) for n in names}
    for s in samples:                       # inputs are fed, not fetched
        for n in inputs:
            if n in s:
                stats[n].observe(s[n])
    groups = _groups(outputs, shapes, budget)
    bar = log.bar(len(groups) * len(samples), "  capturing")
    for group in groups:
        sess = _session(_with_outputs(proto, group).SerializeToString())
        for s in samples:
            for n, a in zip(group, sess.run(group, s)):
                stats[n].observe(a)
            bar.update()
    bar.close()
    return {n: _real_range(stats[n], shapes.get(n)) for n in names if stats[n].count}


def _tensor_types(int8_onnx: str | Path) -> dict[str, Any]:
    """ONNX tensor name -> bevir TensorType, from the model as imported (no folding)."""
    g = from_onnx(int8_onnx, fold_qdq=False)
    types = {v.name: v.type for v in g.inputs}
    types.update({v.name: v.type for n in g.nodes for v in n.outputs})
    return types


def _groups(names: list[str], types: Mapping[str, Any], budget: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for n in names:
        t = types.get(n)
        # a tensor the import folded away (shape arithmetic) is small: no run of its own
        nbytes = int(np.prod(t.shape)) * t.dtype.np.itemsize if t is not None else 0
        if groups[-1] and size + nbytes > budget:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += nbytes
    return groups


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    have = {o.name for o in m.graph.output}
    inputs = {i.name for i in m.graph.input}
    for n in names:
        if n not in have and n not in inputs:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    return m


def _real_range(r: TensorRange, t: Any) -> tuple[float, float]:
    """(min, max) of a captured tensor in real units."""
    q = getattr(t, "quant", None) if t is not None else None
    if q is None or not hasattr(q, "zero_point"):
        return r.min, r.max
    scale = np.asarray(q.scale, np.float32)
    zp = np.asarray(q.zero_point, np.float32)
    ends = np.concatenate([(np.float32(r.min) - zp) * scale, (np.float32(r.max) - zp) * scale])
    return float(ends.min()), float(ends.max())


def tranges_table(int8_onnx: str | Path, captured: Mapping[str, tuple[float, float]]
                  ) -> tuple[dict[str, tuple[float, float]], int]:
    """The tranges entries (each non-constant QuantizeLinear input and DequantizeLinear
    output, in graph order) and how many came from data; the others span their scale."""
    proto = onnx.load(str(int8_onnx))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    table: dict[str, tuple[float, float]] = {}
    from_data = 0
    for n in proto.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.input[0] in inits:
            continue
        name = n.input[0] if n.op_type == "QuantizeLinear" else n.output[0]
        if name in table:
            continue
        if name in captured:
            table[name] = captured[name]
            from_data += 1
        else:
            table[name] = _scale_span(n, inits)
    return table, from_data


def _scale_span(node: onnx.NodeProto, inits: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """The real range a Quantize/DequantizeLinear's scale and zero point can represent."""
    scale = inits[node.input[1]].astype(np.float32).reshape(-1)
    zp_arr = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    info = np.iinfo(zp_arr.dtype if zp_arr is not None else np.uint8)
    zp = (zp_arr if zp_arr is not None else np.zeros(1)).astype(np.float32).reshape(-1)
    lo, hi = (np.float32(info.min) - zp) * scale, (np.float32(info.max) - zp) * scale
    return float(lo.min()), float(hi.max())


def write_tranges(path: str | Path, table: Mapping[str, tuple[float, float]]) -> Path:
    """Write a ``bevir-tranges`` file (see :meth:`Ranges.from_tranges`)."""
    doc = {"format": TRANGES_FORMAT, "version": TRANGES_VERSION,
           "ranges": {k: [float(lo), float(hi)] for k, (lo, hi) in table.items()}}
    return write_json(path, doc)


# ---- checking -----------------------------------------------------------------------------
def compare_with_onnxruntime(graph: Graph, int8_onnx: str | Path, inputs: Sample
                             ) -> dict[str, int]:
    """Run ``graph`` in bevir's golden model and ``int8_onnx`` in onnxruntime on one sample;
    per output, the number of differing elements (a shape or dtype mismatch counts all)."""
    from ..sim import run
    feed = _samples(inputs, None, graph.inputs[0].name)[0]
    sess = _session(int8_onnx)
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feed)))
    got = run(graph, feed)
    return {n: _differing(np.asarray(got[n]), r) for n, r in ref.items()}


def _differing(a: np.ndarray, b: np.ndarray) -> int:
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.size, b.size)
    return int(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b))))
               if a.dtype.kind == "f" else np.count_nonzero(a != b))
