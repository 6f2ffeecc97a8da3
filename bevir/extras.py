"""Optional packages: ``pip install bevir`` brings only numpy, onnx, safetensors, networkx
and pydantic; each extra adds what some features need. Every import of an optional package
goes through :func:`require`, so a missing one is one line naming the extra to install.

    tvm = require("tvm")            # MissingExtraError: ... pip install 'bevir[codegen]'
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .errors import BevirError

#: top-level module -> (the extra that installs it, what needs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "the PyTorch frontend and model zoo"),
    "tvm": ("codegen", "code generation (TVM)"),
    "tvm_ffi": ("codegen", "code generation (TVM)"),
    "onnxruntime": ("ort", "the INT8 backbone flow (onnxruntime)"),
    "matplotlib": ("plots", "plots (matplotlib)"),
    "ray": ("scale", "running on Ray"),
    "pandas": ("scale", "running on Ray"),
    "pyarrow": ("scale", "running on Ray"),
    "timm": ("hub", "the timm and transformers model zoo (bevir.testing.hub_zoo)"),
    "transformers": ("hub", "the timm and transformers model zoo (bevir.testing.hub_zoo)"),
    "torchvision": ("hub", "the timm and transformers model zoo (bevir.testing.hub_zoo)"),
}


class MissingExtraError(BevirError):
    """An optional package is not installed; the message names the extra that brings it."""


def require(module: str) -> ModuleType:
    """``module`` imported (a module of one of the EXTRAS' packages, e.g. ``"tvm.te"``), or a
    MissingExtraError naming the extra to install when its package is missing."""
    top = module.partition(".")[0]
    extra, purpose = EXTRAS[top]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != top:
            raise                   # the package is there, something it needs is not
        raise MissingExtraError(f"{purpose} needs {top}, which is not installed: "
                                f"pip install 'bevir[{extra}]'") from None


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    require("matplotlib").use("Agg")
    return require("matplotlib.pyplot")
