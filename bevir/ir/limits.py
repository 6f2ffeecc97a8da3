"""How large one tensor may be: the caps bevir checks before it allocates.

- ``tensor_bytes``: the most bytes one tensor may need: a declared type (IR text, an
  ONNX input or initializer), a constant, a result the golden interpreter computes.
  Default: 4 GiB, or a quarter of this machine's memory where that is less.
- ``fold_bytes``: the largest constant that constant folding makes (an ONNX node whose
  inputs are all constants, the canonicalize pass); a result above it stays a node.
  Default: 64 MiB.

Both are read when checked: ``$BEVIR_MAX_TENSOR_BYTES`` and ``$BEVIR_MAX_FOLD_BYTES``
(a number of bytes), or for a block of code::

    with bevir.limits(tensor_bytes=16 << 30, fold_bytes=1 << 30):
        graph = bevir.from_onnx("big.onnx")
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence

from ..errors import BevirError

#: the defaults (the tensor cap is also at most a quarter of the machine's memory)
TENSOR_BYTES, FOLD_BYTES = 4 << 30, 64 << 20
_ENV = {"tensor_bytes": "BEVIR_MAX_TENSOR_BYTES", "fold_bytes": "BEVIR_MAX_FOLD_BYTES"}
_set: dict[str, int] = {}


def memory_bytes() -> int:
    """This machine's physical memory (1 TiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _read(name: str, default: int) -> int:
    if name in _set:
        return _set[name]
    text = os.environ.get(_ENV[name])
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise BevirError(f"${_ENV[name]} must be a number of bytes, got {text!r}")
    return value


def tensor_bytes() -> int:
    """The most bytes one tensor may need (see the module docstring)."""
    return _read("tensor_bytes", min(TENSOR_BYTES, memory_bytes() // 4))


def fold_bytes() -> int:
    """The largest constant folding makes (see the module docstring)."""
    return _read("fold_bytes", FOLD_BYTES)


@contextlib.contextmanager
def limits(*, tensor_bytes: int | None = None, fold_bytes: int | None = None) -> Iterator[None]:
    """Other caps for the block (None: keep the current one)."""
    old = dict(_set)
    for name, value in (("tensor_bytes", tensor_bytes), ("fold_bytes", fold_bytes)):
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BevirError(f"limits: {name} must be a number of bytes, got {value!r}")
            _set[name] = value
    try:
        yield
    finally:
        _set.clear()
        _set.update(old)


def nbytes(shape: Sequence[int], itemsize: int) -> int:
    return math.prod(int(d) for d in shape) * itemsize


def tensor_too_big(shape: Sequence[int], itemsize: int) -> str | None:
    """Why a tensor of ``shape`` with ``itemsize``-byte elements may not be allocated
    (None when it may)."""
    need, cap = nbytes(shape, itemsize), tensor_bytes()
    if need > cap:
        return (f"shape {list(shape)} needs {need:,} bytes, more than the per-tensor limit "
                f"({cap:,} bytes; ${_ENV['tensor_bytes']} or bevir.limits raise it)")
    return None
