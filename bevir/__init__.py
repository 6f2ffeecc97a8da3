"""bevir: a graph-IR compiler library for camera-only 3D detectors on an INT8 GPNPU."""
from .errors import (AttrError, BevirError, InterpreterError, ParseError, PassError,  # noqa: F401
                     UnsupportedError, VerifyError)
from .ir import (AffineQuant, Builder, DType, FixedPointQuant, Graph, Layout, Node,  # noqa: F401
                 TensorType, Value, compose, load, parse, print_graph, save, verify)
from . import ops  # noqa: F401  (registers the ops)
from .sim import Interpreter, run  # noqa: F401
from .passes import optimize  # noqa: F401
from .passes.calibrate import calibrate  # noqa: F401
from .passes.quantize import float_ops_between, quantize  # noqa: F401
from .flows import QuantizeError, QuantizedBackbone, from_onnx, quantize_backbone  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name: str):
    # the torch frontend imports torch: load it on first use, not with bevir
    if name in ("from_torch", "CustomOp"):
        from .frontends import torch as _torch_frontend
        return getattr(_torch_frontend, name)
    raise AttributeError(f"module 'bevir' has no attribute '{name}'")
