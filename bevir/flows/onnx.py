"""``from_onnx``: the ONNX importer, then what an ONNX model needs to mean what onnxruntime
computes (a QDQ model's groups folded into integer ops by the fold-qdq pass)."""
from __future__ import annotations

import os

import onnx

from ..frontends.onnx import import_onnx, is_qdq, load_model
from ..ir.graph import Graph
from ..passes.analysis import AnalysisManager
from ..passes.fold_qdq import FoldQDQ


def from_onnx(model: str | os.PathLike | onnx.ModelProto, fold_qdq: bool = True) -> Graph:
    """Import an ONNX model (a path or a ModelProto) as a bevir Graph.

    In a model with QuantizeLinear/DequantizeLinear nodes (QDQ format) dequantized
    constants stay ``dequantize`` nodes, and the ``fold-qdq`` pass folds the groups into
    integer ops as onnxruntime does (``fold_qdq=False``: leave them as imported, e.g. to run
    ``fold-qdq{int8_allowed=true}`` instead).

    Raises OnnxLoadError for a file that cannot be read and UnsupportedError for an op,
    attribute, dtype, dynamic shape or opset bevir does not support.
    """
    m = load_model(model)
    graph = import_onnx(m)
    if fold_qdq and is_qdq(m):
        FoldQDQ().run(graph, AnalysisManager(graph))   # its errors name the ONNX node
    return graph
