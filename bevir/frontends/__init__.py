"""Frontends: the ONNX and PyTorch importers. An importer builds a graph op for op; flows
(bevir/flows) decide which passes run on it."""
from . import onnx, onnx_quant  # noqa: F401  (onnx_quant registers the quantized-op converters)
