"""The IR: types, values, nodes, graphs, text format, verifier, save/load."""
from .builder import Builder  # noqa: F401
from .compose import compose  # noqa: F401
from .graph import Graph, Node, Value  # noqa: F401
from .meta import Meta, MetaError, register_meta_key  # noqa: F401
from .parser import parse  # noqa: F401
from .printer import print_graph  # noqa: F401
from .serialize import load, save  # noqa: F401
from .types import AffineQuant, DType, FixedPointQuant, Layout, Quant, TensorType  # noqa: F401
from .verifier import verify  # noqa: F401
