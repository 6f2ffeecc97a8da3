"""Small helpers shared by op definitions and their kernels (bevir.ops.kernels): type
checks that raise VerifyError, the geometry of sliding windows, work kept per constant,
the "rows" split of an op whose result ranges each read one operand range."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import VerifyError
from ..ir.opdef import Piece, read_only  # noqa: F401 (read_only: the ops' helper)
from ..ir.types import DType, Layout, TensorType


def require(cond: bool, message: str | Callable[[], str]) -> None:
    """VerifyError(message) unless ``cond``; a callable message is formatted only then
    (for messages that print large types)."""
    if not cond:
        raise VerifyError(message() if callable(message) else message)


def same_dtype(*types: TensorType) -> DType:
    dtypes = {t.dtype for t in types if t is not None}
    require(len(dtypes) == 1, f"operand dtypes differ: {sorted(str(d) for d in dtypes)}")
    return dtypes.pop()


def float_operands(*types: TensorType) -> DType:
    d = same_dtype(*types)
    require(d.is_float, f"expects float operands, got {d}")
    return d


def norm_axis(axis: int, rank: int) -> int:
    require(-rank <= axis < max(rank, 1), f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_types(*types: TensorType, dtype: DType | None = None) -> TensorType:
    """The numpy-broadcast result type; keeps the layout of the highest-rank operand."""
    try:
        shape = np.broadcast_shapes(*(t.shape for t in types))
    except ValueError:
        raise VerifyError("shapes do not broadcast: " +
                          ", ".join(str(list(t.shape)) for t in types)) from None
    layout = max(types, key=lambda t: t.rank).layout
    return TensorType(shape, dtype or same_dtype(*types),
                      layout if len(shape) == 4 else Layout.plain)


# ---- sliding windows (convolutions, pooling): shared by type rules and kernels -------------
def conv_out_size(size: int, k: int, stride: int, pad: int, dilation: int) -> int:
    """Windows along one axis: ``k`` taps ``dilation`` apart, ``stride`` apart, over
    ``size`` elements padded by ``pad`` in all."""
    return (size + pad - dilation * (k - 1) - 1) // stride + 1


def nchw_dims(t: TensorType) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a 4-D type in either layout."""
    n, a, b, d = t.shape
    return (n, d, a, b) if t.layout is Layout.nhwc else (n, a, b, d)


def spatial_axes(t: TensorType) -> tuple[int, int]:
    """The (H, W) axes of a 4-D type: (1, 2) in NHWC, else (2, 3)."""
    return (1, 2) if t.layout is Layout.nhwc else (2, 3)


def channel_axis(t: TensorType) -> int:
    """The channel axis of an [N, C, ...] type: 3 in NHWC, else 1."""
    return 3 if t.layout is Layout.nhwc else 1


def pool_out_size(size: int, k: int, stride: int, pad_begin: int, pad_end: int,
                  dilation: int, ceil_mode: bool) -> int:
    """Windows along one axis (ONNX/torch): with ceil_mode the last window must start
    inside the input or the begin padding."""
    span = size + pad_begin + pad_end - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad_begin:
        out -= 1
    return out


def pool_dilations(c) -> tuple[int, int]:
    """A pooling node's dilations (ops without the attribute: none)."""
    return getattr(c, "dilations", (1, 1))


def pool_out(c, x: TensorType) -> tuple[int, int]:
    """A pooling node's (OH, OW) over ``x`` (``c.kernel``, strides, pads, dilations,
    ceil_mode)."""
    (k0, k1), (s0, s1), (d0, d1) = c.kernel, c.strides, pool_dilations(c)
    top, left, bottom, right = c.pads
    ax = spatial_axes(x)
    return (pool_out_size(x.shape[ax[0]], k0, s0, top, bottom, d0, c.ceil_mode),
            pool_out_size(x.shape[ax[1]], k1, s1, left, right, d1, c.ceil_mode))


def check_windows(in_hw, out_hw, kernel, strides, dilations) -> None:
    """ValueError unless ``out_hw`` windows of ``kernel`` taps (``strides`` and
    ``dilations`` apart) lie inside an input of ``in_hw`` along both spatial axes: the
    kernels that read windows through raw strides and pointers ask before they read."""
    for size, out, k, s, d in zip(in_hw, out_hw, kernel, strides, dilations):
        if min(k, s, d) < 1 or (out and (out - 1) * s + (k - 1) * d >= size):
            raise ValueError(f"{tuple(kernel)} windows (strides {tuple(strides)}, dilations "
                             f"{tuple(dilations)}) of {tuple(in_hw)} do not make "
                             f"{tuple(out_hw)}")


class ArrayCache:
    """Values derived from arrays, each kept while its array lives (keyed by the array's id,
    confirmed by a weak reference): work done once per graph constant."""

    def __init__(self):
        self._entries: dict[int, tuple[weakref.ref, Any]] = {}

    def __contains__(self, key: int) -> bool:
        """Whether an entry is kept for the array whose id is ``key``."""
        return key in self._entries

    def get(self, a: np.ndarray) -> Any | None:
        hit = self._entries.get(id(a))
        return hit[1] if hit is not None and hit[0]() is a else None

    def put(self, a: np.ndarray, value: Any) -> Any:
        key = id(a)
        self._entries[key] = (weakref.ref(a, lambda _: self._entries.pop(key, None)), value)
        return value


def window_rows(c, axis: int, kh: int, start: int, stop: int) -> tuple[tuple, tuple]:
    """The input rows (axis, lo, hi) that output rows [start, stop) of a sliding window
    (a convolution, a pooling; ``c.strides``, ``c.pads``, ``c.dilations``, kernel height
    ``kh``) read, and the piece's pads: it pads only where its window passes the border."""
    h = c.in_types[0].shape[axis]
    top, left, bottom, right = c.pads
    dilation = getattr(c, "dilations", (1, 1))[0]
    lo = start * c.strides[0] - top
    hi = (stop - 1) * c.strides[0] - top + (kh - 1) * dilation + 1
    return (axis, max(lo, 0), min(hi, h)), (max(-lo, 0), left, max(hi - h, 0), right)


def level_shapes(shapes) -> list[tuple[int, int]]:
    """The (H, W) of each level of a multi-scale value, from its flat ``spatial_shapes``
    (H0, W0, H1, W1, ...)."""
    return [(int(shapes[i]), int(shapes[i + 1])) for i in range(0, len(shapes), 2)]


class RangeMap:
    """Mixin of an op with one operand whose result ranges along its :meth:`row_axes`
    each read one range of that operand (the "rows" split: a reshape, a transpose, a
    reduction): :meth:`operand_axis` says which axis (default: the same), :meth:`changed`
    which attributes a piece changes."""

    splits = ("rows",)

    def region(self, c, axis: int, start: int, stop: int) -> Piece | None:
        if axis not in self.row_axes(c):
            return None
        return Piece(((self.operand_axis(c, axis), start, stop),),
                     self.changed(c, axis, stop - start))

    def split_piece(self, c, kind: str, start: int, stop: int) -> Piece:
        return self.region(c, self.split_axis(c, kind), start, stop)

    def region_axes(self, c) -> dict[int, str]:
        return {a: "rows" for a in self.row_axes(c)}

    def operand_axis(self, c, axis: int) -> int:
        return axis

    def changed(self, c, axis: int, size: int) -> dict:
        return {}
