"""bevir: a graph-IR compiler library for camera-only 3D detectors on an INT8 GPNPU.

The top level holds what a compiler engineer reaches for first: the IR (``Graph``,
``Builder``, ``TensorType``..., ``verify``, ``parse`` / ``print_graph``, ``save`` /
``load``, ``compose``, ``limits``: the per-tensor size caps), ``OpDef`` to define ops, the
golden model (``run``, ``Interpreter``), code generation (``compile``: per-core C programs
through TVM; ``to_onnx``: ONNX, quantized ops as QDQ), passes (``Pass``, ``PassManager``,
``optimize``, ``calibrate``, ``quantize``) and the frontends (``from_onnx``, ``from_torch``,
``CustomOp``). End-to-end steps live in ``bevir.flows`` (e.g.
``bevir.flows.quantize_backbone``).
"""
from .errors import (AttrError, BevirError, InterpreterError, ParseError, PassError,  # noqa: F401
                     UnsupportedError, VerifyError)
from .ir import (AffineQuant, Builder, DType, FixedPointQuant, Graph, Layout, Node,  # noqa: F401
                 TensorType, Value, compose, load, parse, print_graph, save, verify)
from .ir.limits import limits  # noqa: F401
from . import ops  # noqa: F401  (registers the ops)
from .ir.opdef import OpDef  # noqa: F401
from .sim import Interpreter, run  # noqa: F401
from .passes import Pass, PassManager, optimize  # noqa: F401
from .passes.calibrate import calibrate  # noqa: F401
from .passes.quantize import quantize  # noqa: F401
from . import flows  # noqa: F401  (end-to-end steps: bevir.flows.quantize_backbone, ...)
from .flows import from_onnx  # noqa: F401

__version__ = "0.1.0"

__all__ = ["AffineQuant", "AttrError", "BevirError", "Builder", "CustomOp", "DType",
           "FixedPointQuant", "Graph", "Interpreter", "InterpreterError", "Layout", "Node",
           "OpDef", "ParseError", "Pass", "PassError", "PassManager", "TensorType",
           "UnsupportedError", "Value", "VerifyError", "calibrate", "compile", "compose",
           "flows", "from_onnx", "from_torch", "limits", "load", "optimize", "parse",
           "print_graph", "quantize", "run", "save", "to_onnx", "verify"]


def __getattr__(name: str):
    # the torch frontend imports torch, code generation tvm: load them on first use
    if name in ("from_torch", "CustomOp"):
        from .frontends import torch as _torch_frontend
        return getattr(_torch_frontend, name)
    if name == "compile":
        from .flows.target import compile_program
        return compile_program
    if name == "to_onnx":
        from .codegen.onnx import to_onnx
        return to_onnx
    raise AttributeError(f"module 'bevir' has no attribute '{name}'")
