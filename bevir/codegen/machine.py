"""This machine, as the builds see it: where built kernels are cached and TVM's llvm target
for its processor."""
from __future__ import annotations

from ..extras import require
from ..ops.native import cache_dir

__all__ = ["cache_dir", "host_target"]


def host_target():
    """TVM's llvm target for this machine's processor (its vector width and instructions)."""
    tvm = require("tvm")
    cpu = tvm.get_global_func("target.llvm_get_system_cpu", True)
    return tvm.target.Target({"kind": "llvm", **({"mcpu": cpu()} if cpu else {})})
