"""This machine, as the builds see it: where built kernels are cached and TVM's llvm target
for its processor."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where built kernels are kept: $BEVIR_CACHE, else ~/.cache/bevir/kernels."""
    root = os.environ.get("BEVIR_CACHE") or Path.home() / ".cache" / "bevir"
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_target():
    """TVM's llvm target for this machine's processor (its vector width and instructions)."""
    import tvm
    cpu = tvm.get_global_func("target.llvm_get_system_cpu", True)
    return tvm.target.Target({"kind": "llvm", **({"mcpu": cpu()} if cpu else {})})
