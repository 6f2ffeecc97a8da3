"""PyTorch import: ``from_torch(module, example_inputs, custom_ops=...) -> Graph``.

The module is captured with ``torch.export``. Instances of the module classes named in
``custom_ops`` become single IR ops: during export their ``forward`` is routed through one
opaque torch custom op, so the exported program holds one call per instance, whose
operands are the forward's tensor arguments followed by the module's parameters. The
importer turns that call into the registered IR op, with the parameters as constants
(named by their state_dict keys) and the module's configuration as attributes; no weight
plumbing by hand. Everything else decomposes into registry ops through one small converter
per ATen op. Every node carries the module path it came from as its ``loc``.

The package: ``importer`` (capture, the converter registry, the importer), and one module
of ATen converters per family: ``elementwise`` (arithmetic, reductions, activations,
products and attention), ``nn`` (convolution, normalization, pooling, resampling) and
``shape`` (shapes, data movement, indexing).
"""
from . import elementwise, nn, shape  # noqa: F401  (they register converters)
from .importer import CustomOp, aten_converter, aten_table, from_torch, supported_aten_ops

__all__ = ["CustomOp", "from_torch", "aten_converter", "supported_aten_ops", "aten_table"]
