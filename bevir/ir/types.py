"""Tensor types: shape, dtype, layout and quantization.

Types are immutable values; two types are equal when every field is equal. The verifier
checks declared types against the op registry's inference after every pass.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from math import prod

import numpy as np


class DType(enum.Enum):
    """Element types. The value is the name used in the text format."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    bool = "bool"

    # the facts below are attributes of each member, set once after the class (planning
    # and the interpreter's result checks ask for them millions of times)
    @property
    def np(self) -> np.dtype:
        return self._np

    @property
    def is_float(self) -> bool:
        return self._is_float

    @property
    def is_int(self) -> bool:
        return self._is_int

    @property
    def itemsize(self) -> int:
        return self._itemsize

    @staticmethod
    def from_numpy(dtype) -> DType:
        dtype = np.dtype(dtype)
        for d, np_dtype in _NUMPY.items():
            if np_dtype == dtype:
                return d
        raise TypeError(f"no bevir dtype for numpy dtype {dtype}")

    def __str__(self) -> str:
        return self.value


#: numpy's dtype of each element type, made once (``DType.np`` is on the interpreter's
#: per-node result check)
_NUMPY = {d: np.dtype(name) for d, name in (
    (DType.f64, "float64"), (DType.f32, "float32"), (DType.f16, "float16"),
    (DType.i64, "int64"), (DType.i32, "int32"), (DType.i16, "int16"), (DType.i8, "int8"),
    (DType.u8, "uint8"), (DType.bool, "bool"))}
for _d, _np_dtype in _NUMPY.items():
    _d._np, _d._itemsize = _np_dtype, _np_dtype.itemsize
    _d._is_float = _d in (DType.f64, DType.f32, DType.f16)
    _d._is_int = _d in (DType.i64, DType.i32, DType.i16, DType.i8, DType.u8)


class Layout(enum.Enum):
    """How a tensor's axes map to meaning. ``plain`` is an N-d tensor with no convention."""

    plain = "plain"
    nchw = "nchw"
    nhwc = "nhwc"

    @property
    def channel_axis(self) -> int | None:
        return {Layout.nchw: 1, Layout.nhwc: 3}.get(self)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class AffineQuant:
    """real = scale * (q - zero_point); per tensor (axis None) or per channel along ``axis``."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "scale", tuple(float(np.float32(s)) for s in self.scale))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in self.zero_point))

    @property
    def channels(self) -> int:
        return len(self.scale)

    def __str__(self) -> str:
        ax = "" if self.axis is None else f", axis={self.axis}"
        return f"affine<scale={_flist(self.scale)}, zp={_ilist(self.zero_point)}{ax}>"


@dataclass(frozen=True)
class FixedPointQuant:
    """real = q * 2**-frac_bits; per tensor (axis None) or per channel along ``axis``."""

    frac_bits: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "frac_bits", tuple(int(f) for f in self.frac_bits))

    @property
    def channels(self) -> int:
        return len(self.frac_bits)

    def __str__(self) -> str:
        ax = "" if self.axis is None else f", axis={self.axis}"
        return f"fixed<frac_bits={_ilist(self.frac_bits)}{ax}>"


Quant = AffineQuant | FixedPointQuant


def _flist(xs) -> str:
    return repr(xs[0]) if len(xs) == 1 else "[" + ", ".join(repr(x) for x in xs) + "]"


def _ilist(xs) -> str:
    return str(xs[0]) if len(xs) == 1 else "[" + ", ".join(str(x) for x in xs) + "]"


@dataclass(frozen=True)
class TensorType:
    """A ranked, statically shaped tensor type.

    Text form: ``tensor<1x3x224x224xf32, nchw>``; a scalar is ``tensor<f32>``; quantization
    follows the layout: ``tensor<1x64xi8, affine<scale=0.05, zp=0>>``.
    """

    shape: tuple[int, ...]
    dtype: DType = DType.f32
    layout: Layout = Layout.plain
    quant: Quant | None = field(default=None)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", DType(self.dtype))
        if isinstance(self.layout, str):
            object.__setattr__(self, "layout", Layout(self.layout))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def with_(self, **changes) -> TensorType:
        """A copy with some fields replaced, e.g. ``t.with_(dtype=DType.i8)``."""
        fields = dict(shape=self.shape, dtype=self.dtype, layout=self.layout, quant=self.quant)
        fields.update(changes)
        return TensorType(**fields)

    @staticmethod
    def of(array: np.ndarray, layout: Layout = Layout.plain) -> TensorType:
        """The type of a numpy array."""
        return TensorType(array.shape, DType.from_numpy(array.dtype), layout)

    def matches(self, array: np.ndarray) -> bool:
        return tuple(array.shape) == self.shape and array.dtype == self.dtype.np

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        extra = "" if self.layout is Layout.plain else f", {self.layout}"
        if self.quant is not None:
            extra += f", {self.quant}"
        return f"tensor<{dims}{self.dtype}{extra}>"
