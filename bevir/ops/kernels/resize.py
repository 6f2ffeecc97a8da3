"""ONNX Resize as the runtimes compute it (bevir.ops.nn.Resize states which case is which;
docs/numerics.md has the formulas):

- linear of int8/uint8: onnxruntime's fixed-point bilinear kernel (weights in 1/1024)
- float32 linear over two axes of a 2-D or 4-D tensor: its float bilinear kernel
  (natively where the pixels are channels last)
- explicit ``scales``, or cubic: ONNX's reference, in float64
- otherwise (nearest, linear): separable, with the exact rational coordinates of
  scale = out / in
"""
from __future__ import annotations

import math

import numpy as np

from ...ir.opdef import Ctx
from .. import native
from . import kernel


@kernel("resize")
def resize(c: Ctx, x: np.ndarray) -> np.ndarray:
    """resize: the case's computation (see the module docstring)."""
    if c.mode == "linear" and x.dtype.kind in "iu":
        return resize_linear_int8(c, x)
    axes = bilinear_f32_axes(c, x)
    if axes is not None:
        return resize_bilinear_f32(c, x, axes)
    if c.scales is not None or c.mode == "cubic":
        return resize_reference(c, x)
    return resize_exact(c, x)


def resize_exact(c: Ctx, x: np.ndarray) -> np.ndarray:
    """Nearest or linear, axis by axis, at :func:`resize_coords`' exact coordinates; linear
    interpolates a0 + (a1 - a0) * frac in (at least) float32."""
    dtype = x.dtype
    for axis, (n_in, n_out) in enumerate(zip(x.shape, c.size)):
        if n_in == n_out:
            continue
        lo, frac = resize_coords(c.coordinate_transformation_mode, n_in, n_out)
        if c.mode == "nearest":
            x = np.take(x, np.clip(_nearest(lo, frac, c.nearest_mode), 0, n_in - 1), axis=axis)
            continue
        shape = [1] * x.ndim
        shape[axis] = n_out
        a0, a1 = (np.take(x, np.clip(i, 0, n_in - 1), axis=axis) for i in (lo, lo + 1))
        x = a0 + (a1 - a0) * frac.astype(np.promote_types(dtype, np.float32)).reshape(shape)
    return x.astype(dtype, copy=False)


def resize_coords(mode: str, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Resize's input coordinate of each output index along one axis, exactly: as
    (floor, remainder / denominator). With scale = n_out / n_in every mode's coordinate is
    rational, so ties and integers are exact (no float64 ulps deciding a rounding), and
    half_pixel_symmetric equals half_pixel."""
    y = np.arange(n_out, dtype=np.int64)
    if mode == "asymmetric":                                # y / scale
        num, den = y * n_in, n_out
    elif mode == "align_corners":                           # y * (in - 1) / (out - 1)
        num, den = (y * (n_in - 1), n_out - 1) if n_out > 1 else (y * 0, 1)
    elif mode == "pytorch_half_pixel" and n_out == 1:
        num, den = y - 1, 2
    else:                                                   # (y + 0.5) / scale - 0.5
        num, den = (2 * y + 1) * n_in - n_out, 2 * n_out
    lo, rem = np.divmod(num, den)
    return lo, rem / den


def _nearest(lo: np.ndarray, frac: np.ndarray, rounding: str) -> np.ndarray:
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
          "floor": False, "ceil": frac > 0}[rounding]
    return lo + up


def f32_scales(c: Ctx, shape: tuple[int, ...]) -> list[np.float32]:
    """onnxruntime's float32 scale per axis: ONNX's scales, or f32(out) / f32(in)."""
    if c.scales is not None:
        return [np.float32(s) for s in c.scales]
    return [np.float32(o) / np.float32(i) for o, i in zip(c.size, shape)]


def _taps_1024(mode: str, n_in: int, n_out: int, scale: np.float32
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's SetupUpsampleBilinearInteger along one axis: per output index the two
    input taps (lo, hi) and their weights in 1/1024 (summing to 1024). The coordinate is
    upsamplebase.h's, in float32, clamped to [0, n_in - 1]; its 1/1024 units are truncated."""
    src, lo, hi = _f32_taps(mode, n_in, n_out, scale)
    units = (src * np.float32(1024)).astype(np.int64)
    w_hi = np.where(lo == hi, 512, units - lo * 1024)       # a clamped edge: 512 each
    return lo, hi, 1024 - w_hi, w_hi


def _f32_taps(mode: str, n_in: int, n_out: int, scale: np.float32
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's bilinear source coordinate of each output index along one axis
    (upsamplebase.h, float32, clamped to [0, n_in - 1]) and its two input taps."""
    f = np.float32
    y = np.arange(n_out, dtype=f)
    if mode == "asymmetric":
        src = y / scale
    elif mode == "align_corners":
        src = y * f(n_in - 1) / f(n_out - 1) if n_out > 1 else np.zeros(n_out, f)
    elif mode == "pytorch_half_pixel" and n_out == 1:
        src = np.zeros(n_out, f)
    else:                                                   # half_pixel, pytorch_half_pixel
        src = (y + f(0.5)) / scale - f(0.5)
    src = np.clip(src, f(0), f(n_in - 1))
    lo = np.minimum(src.astype(np.int64), n_in - 1)
    return src, lo, np.minimum(lo + 1, n_in - 1)


#: the coordinate modes of onnxruntime's bilinear kernels
BILINEAR_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")


def bilinear_f32_axes(c: Ctx, x: np.ndarray) -> tuple[int, int] | None:
    """The two axes of a float32 linear resize that onnxruntime runs as UpsampleBilinear
    (a 2-D tensor, or a 4-D one resized along two axes only), else None."""
    scales = f32_scales(c, x.shape)
    axes = tuple(a for a, s in enumerate(scales) if s != 1)
    mode = c.coordinate_transformation_mode
    # align_corners with ONNX's scales: onnxruntime maps with the integer output length,
    # ONNX with scale * length; bevir follows ONNX there
    if (c.mode == "linear" and x.dtype == np.float32 and x.ndim in (2, 4) and len(axes) == 2
            and c.roi is None and mode in BILINEAR_MODES
            and not (mode == "align_corners" and c.scales is not None)):
        return axes
    return None


#: the native bilinear resize runs where each pixel holds this many elements (channels last)
NATIVE_RESIZE_INNER = 8


def resize_bilinear_f32(c: Ctx, x: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
    """Float32 linear resize over ``axes`` as onnxruntime's UpsampleBilinear (upsample.cc):
    per output the four taps weighted by products of the axes' distances, summed in its
    order, all in float32; a clamped edge weighs each tap 1/2. Channels last (the two axes
    adjacent, at least NATIVE_RESIZE_INNER elements after them): the same sums in one
    native pass."""
    f = np.float32
    scales = f32_scales(c, x.shape)
    parts = []
    for axis in axes:
        src, lo, hi = _f32_taps(c.coordinate_transformation_mode, x.shape[axis], c.size[axis],
                                scales[axis])
        d1, d2 = np.abs(src - lo.astype(f)), np.abs(src - hi.astype(f))
        d1, d2 = (np.where(lo == hi, f(0.5), d).astype(f) for d in (d1, d2))
        shape = [1] * x.ndim
        shape[axis] = len(src)
        parts.append((lo, hi, d1.reshape(shape), d2.reshape(shape)))
    (yl, yh, dy1, dy2), (xl, xh, dx1, dx2) = parts
    outer, inner = math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[1] + 1:])
    if axes[1] == axes[0] + 1 and inner >= NATIVE_RESIZE_INNER:
        h, w = x.shape[axes[0]], x.shape[axes[1]]
        out = np.empty((outer, len(yl), len(xl), inner), f)
        if native.resize_bilinear(x.reshape(outer, h, w, inner), (yl, yh, xl, xh),
                                  tuple(d.reshape(-1) for d in (dy1, dy2, dx1, dx2)), out):
            return out.reshape(x.shape[:axes[0]] + (len(yl), len(xl)) + x.shape[axes[1] + 1:])

    def tap(yi, xi):
        return np.take(np.take(x, yi, axis=axes[0]), xi, axis=axes[1])
    return (dx2 * dy2 * tap(yl, xl) + dx1 * dy2 * tap(yl, xh)
            + dx2 * dy1 * tap(yh, xl) + dx1 * dy1 * tap(yh, xh))


def resize_linear_int8(c: Ctx, x: np.ndarray) -> np.ndarray:
    """Linear resize of int8/uint8 as onnxruntime's NhwcUpsampleBilinearInteger
    (upsample.h): per resized axis two taps with integer weights in 1/1024 (:func:`_taps_1024`);
    the exact sum of tap * weight products (2**20 for two axes), divided by 2**(10 * axes)
    truncating toward zero (C integer division)."""
    y = x.astype(np.int64)
    shift = 0
    for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, c.size, f32_scales(c, x.shape))):
        if scale == 1:
            continue
        lo, hi, w_lo, w_hi = _taps_1024(c.coordinate_transformation_mode, n_in, n_out, scale)
        shape = [1] * x.ndim
        shape[axis] = n_out
        y = (np.take(y, lo, axis=axis) * w_lo.reshape(shape)
             + np.take(y, hi, axis=axis) * w_hi.reshape(shape))
        shift += 10
    return (np.sign(y) * (np.abs(y) >> shift)).astype(x.dtype)


def gather_tables(c: Ctx, shape: tuple[int, ...]
                  ) -> list[tuple[np.ndarray, ...] | None] | None:
    """What a generated kernel needs to compute :func:`resize` on integer codes, per axis
    (None: not resized): nearest, with no ``scales``: (index,); linear (onnxruntime's
    fixed-point kernel): (lo, hi, w_lo, w_hi) in 1/1024. None for the other cases."""
    mode = c.coordinate_transformation_mode
    if c.mode == "nearest" and c.scales is None and c.roi is None:
        def nearest(n_in: int, n_out: int) -> tuple[np.ndarray, ...]:
            lo, frac = resize_coords(mode, n_in, n_out)
            return (np.clip(_nearest(lo, frac, c.nearest_mode), 0, n_in - 1),)
        return [None if i == o else nearest(i, o) for i, o in zip(shape, c.size)]
    if c.mode == "linear" and mode in BILINEAR_MODES:
        return [None if s == 1 else _taps_1024(mode, i, o, s)
                for i, o, s in zip(shape, c.size, f32_scales(c, shape))]
    return None


def _source_coords(mode: str, n_in: int, n_out: int, scale: float,
                   roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """ONNX Resize's source coordinate of each output index, in float64 as its reference
    computes it (the output length scale * n_in may be fractional)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    if mode == "tf_crop_and_resize":
        span = (roi[1] - roi[0]) * (n_in - 1)
        x = np.full(n_out, span / 2) if width == 1 else y * span / (width - 1)
        return x + roi[0] * (n_in - 1)
    if mode == "align_corners":
        return np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "pytorch_half_pixel" and width == 1:
        return np.full(n_out, -0.5)
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5


def _tap_weights(c, ratio: np.ndarray) -> np.ndarray:
    """Per output position, the weights of its taps (ONNX's coefficient formulas)."""
    if c.mode == "nearest":
        r = ratio
        up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": r >= 1,
              "ceil": r > 0}[c.nearest_mode] | (r == 1)
        return np.stack([~up, up], -1).astype(np.float64)
    if c.mode == "linear":
        return np.stack([1 - ratio, ratio], -1)
    a, r = c.cubic_coeff_a, ratio
    s = 1 - r
    return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * s - (a + 3)) * s * s + 1,
                     ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a], -1)


def resize_reference(c, x: np.ndarray) -> np.ndarray:
    """Resize axis by axis in float64 as ONNX's reference does: source coordinates from
    the scales, the taps nearest each (ties to the smaller index), edge values beyond
    the input (or, with exclude_outside, no weight there)."""
    scales = c.scales or tuple(o / i for o, i in zip(c.size, x.shape))
    y = x.astype(np.float64)
    for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, c.size, scales)):
        if n_in == n_out and scale == 1.0:
            continue
        roi = (0.0, 1.0) if c.roi is None else (c.roi[axis], c.roi[x.ndim + axis])
        src = _source_coords(c.coordinate_transformation_mode, n_in, n_out, scale, roi)
        lo = np.floor(src)
        ratio = np.where(src == lo, 1.0, src - lo)
        weights = _tap_weights(c, ratio)
        n = weights.shape[1]
        start = lo.astype(np.int64) + np.where(src == lo, -(n // 2), -(n // 2) + 1)
        taps = start[:, None] + np.arange(n)
        if c.exclude_outside:
            weights = np.where((taps < 0) | (taps >= n_in), 0.0, weights)
            total = weights.sum(-1, keepdims=True)
            weights = weights / np.where(total == 0, 1.0, total)
        picked = np.take(y, np.clip(taps, 0, n_in - 1), axis=axis)      # [..., n_out, n, ...]
        shape = [1] * y.ndim + [1]
        shape[axis], shape[axis + 1] = n_out, n
        y = (picked * weights.reshape(shape)).sum(axis + 1)
        if c.roi is not None:           # outside the input: the extrapolation value
            where = [1] * y.ndim
            where[axis] = n_out
            outside = ((src < 0) | (src > n_in - 1)).reshape(where)
            y = np.where(outside, c.extrapolation_value, y)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return y.astype(x.dtype)
