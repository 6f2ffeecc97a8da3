"""The IR: types, values, nodes, graphs, text format, verifier, save/load."""
from .graph import Graph, Node, Value  # noqa: F401
from .types import AffineQuant, DType, FixedPointQuant, Layout, Quant, TensorType  # noqa: F401
