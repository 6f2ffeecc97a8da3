"""ONNX import: ``from_onnx(model) -> Graph`` for models of opsets 10..28.

Each ONNX op type has one small converter, registered with :func:`converts`, that maps a
node onto bevir ops (decomposing where bevir has no direct equivalent). A converter gets a
:class:`NodeCtx`: the node, its inputs as bevir values, helpers to read attributes, to
require an input to be a constant and to emit bevir nodes.

Shapes in bevir are static, so every operand that determines a shape (a Reshape shape,
Slice starts, Pad pads, Resize sizes...) must be a constant at import time; other operands
(Clip bounds, quantization scales and zero points...) may be graph inputs. Nodes whose
inputs are all constants are evaluated right away with the registry's reference semantics
(constant folding), which makes the Shape -> Gather -> Concat -> Reshape chains of exported
models collapse into constants; an all-constant node of an op bevir has no converter for
(Mod, ScatterND, ...) is evaluated with onnx's reference evaluator, so only data-path ops
need converters.
Every node created carries the ONNX node name as its ``loc``.

Each op's versions: a converter sees the model's opset (``c.opset``) and the op's version
there (``c.version``, the schema's since_version). :data:`VERSION_NOTES` lists, per op, the
versions in the supported opsets whose inputs, outputs or attributes changed and what the
converter does about them; the other versions only added types or reworded the text.

The package: ``registry`` (the converter registry, :class:`NodeCtx`, the opsets and
version notes, helpers converters share), ``importer`` (the driver), and one module of
converters per family: ``elementwise``, ``nn`` (products, convolution, pooling,
normalization, reductions), ``shape`` (data movement), ``constants`` (constants and shape
computations, folded at import).
"""
from . import constants, elementwise, nn, shape  # noqa: F401  (they register converters)
from .importer import import_onnx, is_qdq, load_model
from .registry import (CONVERTERS, MAX_OPSET, MIN_OPSET, VERSION_NOTES, NodeCtx,
                       NonConstantInputError, OnnxLoadError, converts, norm_axis, op_version,
                       spatial_params, supported_ops)

__all__ = ["import_onnx", "load_model", "is_qdq", "converts", "supported_ops", "NodeCtx",
           "OnnxLoadError", "NonConstantInputError", "VERSION_NOTES", "op_version",
           "MIN_OPSET", "MAX_OPSET", "CONVERTERS", "norm_axis", "spatial_params"]
