"""Flows: the steps users run end to end, built from the frontends and the passes."""
from .backbone import QuantizeError, QuantizedBackbone, quantize_backbone  # noqa: F401
from .onnx import from_onnx  # noqa: F401
from . import target  # noqa: F401  (plan, simulate, compile_program for the GPNPU)
