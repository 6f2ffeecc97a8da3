"""bevir: a graph-IR compiler library for camera-only 3D detectors on an INT8 GPNPU."""
from .errors import (AttrError, BevirError, InterpreterError, ParseError, PassError,  # noqa: F401
                     UnsupportedError, VerifyError)
from .ir import (AffineQuant, Builder, DType, FixedPointQuant, Graph, Layout, Node,  # noqa: F401
                 TensorType, Value, load, parse, print_graph, save, verify)
from . import ops  # noqa: F401  (registers the ops)
from .sim import Interpreter, run  # noqa: F401
from .passes import optimize  # noqa: F401
from .frontends.onnx import from_onnx  # noqa: F401

__version__ = "0.1.0"
