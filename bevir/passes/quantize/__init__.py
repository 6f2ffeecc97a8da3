"""quantize: lower calibrated float ops to bevir's fixed-point integer ops, by a QuantConfig.

Each float op whose definition names a fixed-point lowering (its ``fixed_point``
interface), whose inputs and result have calibrated ranges (:func:`bevir.calibrate`, or a
seeded tranges file) and whose config rule does not exclude it, becomes ``fx_*`` ops:

- activations: i8 with power-of-two frac bits ``f = floor(log2(127 / max|range|))``
  (symmetric), chosen per value from its calibrated range; i16 (``32767`` for ``127``)
  for the ops of a rule with ``activations="fixed16"`` whose fx op takes 16-bit operands
  (its ``x_dtypes``). Where an operand's codes have the other width, they are
  requantized (``fx_requantize``), never passed through float;
- weights: symmetric int8, per tensor or per output channel as the rule says, scale
  ``max|w| / 127`` (float32), codes ``round_half_even(w / scale)``; biases: int32 in the
  accumulator's units (``round(b / (scale * 2**-f_x))``).

Values cross between the float and the integer parts through ``fx_quantize`` and
``fx_dequantize``, so a graph is quantized as far as the lowerings reach and stays
runnable; ``fx_quantize(fx_dequantize(q))`` of the same frac bits is ``q``.

The lowerings are registered functions, one per op family (:mod:`.products`,
:mod:`.elementwise`, :mod:`.normalize`, :mod:`.movement`, :mod:`.attention`), over the
small :class:`~.context.Context`; a model's own pattern (a chain of float ops one table
computes) is registered with :func:`lowering_pattern`.

Statistics: ``lowered-<op>`` per op, ``float-left`` (ops with a lowering left in float:
excluded, uncalibrated, or not of a form the lowering takes; ``Context.left`` says which
and why), ``affine-left`` (ops of rules with ``activations="affine"``: their quantization
is onnxruntime's, imported from the INT8 ONNX model, not made here), ``activations-i16``
(ops lowered with 16-bit activations), ``exact-i16`` (sums, and concats of them, kept
exact in 16 bits for the tables that read them; tables read only by such sums, giving 16
bits).
"""
from __future__ import annotations

import warnings
from pathlib import Path

from ...ir.graph import Graph
from ..accumulators import accumulator_bounds
from .. import fuse
from ..analysis import AnalysisManager
from ..core import Pass
from ..quant_config import QuantConfig
from . import attention, elementwise, movement, normalize, products  # noqa: F401  (register)
from .attention import LOC_BOUND, LOC_TERM_BOUND
from .context import (LOWERINGS, PATTERNS, Context, fixed_const, frac_bits_for, lower_graph,
                      lowering_pattern, lowers, quantize_weight)
from .report import FloatOps, float_ops_between

__all__ = ["quantize", "LowerToFixedPoint", "load_config", "Context", "lowers",
           "lowering_pattern", "LOWERINGS", "PATTERNS", "FloatOps", "float_ops_between",
           "frac_bits_for", "quantize_weight", "fixed_const", "LOC_BOUND", "LOC_TERM_BOUND",
           "DEFAULT_CONFIG"]

#: the layers recognized in their decomposed forms before lowering
RECOGNIZED = (fuse.RecognizeGelu, fuse.RecognizeGeluTanh, fuse.RecognizeSilu,
              fuse.RecognizeHardSigmoid, fuse.RecognizeHardSwish, fuse.RecognizeSoftmax,
              fuse.RecognizeLayerNorm, fuse.FoldScaleIntoLayerNorm, fuse.FoldBiasIntoLayerNorm)

#: the config quantize uses unless given one (a preset that names no model)
DEFAULT_CONFIG = "default"


def load_config(config: QuantConfig | str) -> QuantConfig:
    """A QuantConfig as given, or a preset name, or a ``.json`` config file."""
    if isinstance(config, QuantConfig):
        return config
    if Path(config).suffix == ".json":
        return QuantConfig.load(config)
    return QuantConfig.preset(config)


def lower(graph: Graph, config: QuantConfig | str, stat) -> Context:
    """Lower ``graph`` in place by ``config``, counting with ``stat(counter)``; the context
    (``left``: the ops left in float and why). Float ops on constants only (an attention
    mask built from constants, a position table) are folded first: no lowering needs to
    take them, and left in float they would run on the host; and the layers a chain of
    ops computes (GELU and its tanh form, SiLU, hard sigmoid and swish, softmax, layer
    norm) are recognized as one op (:mod:`bevir.passes.fuse`), which one table or one
    integer op computes."""
    from ..canonicalize import FoldConstants
    from ..patterns import apply_patterns
    apply_patterns(graph, [FoldConstants(), *(p() for p in RECOGNIZED)])
    cx = Context(graph, load_config(config), stat)
    lower_graph(cx)
    for bound in accumulator_bounds(graph):
        if not bound.safe:              # saturates at run time: say which op, and how far
            warnings.warn(f"quantize: {bound}", stacklevel=3)
            stat("accumulator-overflow-risk")
    return cx


def quantize(graph: Graph, config: QuantConfig | str = DEFAULT_CONFIG) -> dict[str, int]:
    """Lower ``graph``'s calibrated float ops by ``config`` (a QuantConfig, a preset name or
    a JSON file); returns the statistics."""
    stats: dict[str, int] = {}

    def stat(counter: str) -> None:
        stats[counter] = stats.get(counter, 0) + 1
    lower(graph, config, stat)
    return stats


class LowerToFixedPoint(Pass):
    """Lower calibrated float ops to fixed-point integer ops by a quantization config
    (:func:`quantize` in one call; the pass is not named ``quantize``, which is the ONNX
    QuantizeLinear op). Option ``config``: a preset name (default ``default``) or a JSON
    config file."""

    name = "lower-to-fixed-point"
    description = "lower calibrated float ops to fx_* integer ops (QuantConfig rules)"
    semantics_preserving = False

    config: str = DEFAULT_CONFIG

    def run(self, graph: Graph, am: AnalysisManager) -> None:
        lower(graph, self.config, self.stat)
