"""Pooling kernels: windows as strided views of a padded input, max pooling (natively in
NHWC, a compare per tap), and onnxruntime's summation order for a global mean."""
from __future__ import annotations

import functools
from itertools import product

import numpy as np

from ...ir.types import Layout
from .. import native
from ..common import pool_dilations, pool_out, spatial_axes
from . import kernel


def pool_padded(x: np.ndarray, axes, c, out, fill, pads=None) -> np.ndarray:
    """``x`` with its two spatial ``axes`` padded with ``fill``, far enough for every
    window (ceil_mode included)."""
    pads = c.pads if pads is None else pads
    width = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        need = (out[i] - 1) * c.strides[i] + pool_dilations(c)[i] * (c.kernel[i] - 1) + 1
        width[a] = (pads[i], max(need - pads[i] - x.shape[a], 0))
    if all(w == (0, 0) for w in width):
        return x
    # the input copied once and only the border slabs filled (np.pad writes everything twice)
    y = np.empty([n + lo + hi for n, (lo, hi) in zip(x.shape, width)], x.dtype)
    y[tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, width))] = native.contiguous(x)
    for a in axes:
        lo, n = width[a][0], x.shape[a]
        for band in (slice(0, lo), slice(lo + n, None)):
            y[(slice(None),) * a + (band,)] = fill
    return y


def window_taps(x: np.ndarray, axes, c, out, fill, pads=None):
    """Pad ``x`` (:func:`pool_padded`) and yield, per kernel tap, the strided view of the
    taps at every output position: KH*KW views of the output's shape."""
    x = pool_padded(x, axes, c, out, fill, pads)
    dilations, strides = pool_dilations(c), c.strides
    for taps in product(*(range(k) for k in c.kernel)):
        idx = [slice(None)] * x.ndim
        for i, (a, t) in enumerate(zip(axes, taps)):
            start = t * dilations[i]
            idx[a] = slice(start, start + strides[i] * (out[i] - 1) + 1, strides[i])
        yield x[tuple(idx)]


@kernel("maxpool2d")
def maxpool2d(c, x: np.ndarray) -> np.ndarray:
    """maxpool2d: the windows padded with the dtype's lowest value, their maximum natively
    in NHWC (vectorized over channels: NCHW's one per pixel gives it nothing), else as
    numpy's maximum over the taps, tap by tap."""
    fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    axes, out = spatial_axes(c.in_types[0]), pool_out(c, c.in_types[0])
    xp = pool_padded(x, axes, c, out, fill)
    if c.in_types[0].layout is Layout.nhwc:
        y = np.empty((xp.shape[0], *out, xp.shape[3]), x.dtype)
        if native.maxpool(xp, y, c.kernel, c.strides, pool_dilations(c)):
            return y
    taps = window_taps(xp, axes, c, out, fill, pads=(0, 0))
    y = next(taps).copy()
    for t in taps:
        np.maximum(y, t, out=y)
    return y


def mlas_global_mean(x: np.ndarray, channels_last: bool = False) -> np.ndarray:
    """Mean over the spatial axis of ``x`` [N, C, S] ([N, S, C] with ``channels_last``),
    summed as onnxruntime's float GlobalAveragePool does (MLAS ``MlasPoolGlobalKernel``):
    four lanes, lane j summing elements j, j + 4, ... in order; the lanes reduced as
    (l0 + l2) + (l1 + l3); the last S % 4 elements added one by one; the sum divided by S.
    In ``x``'s dtype; the result is [N, C].

    numpy's add.reduce adds row after row along any axis but the contiguous one (there it
    sums pairwise), so the lanes are laid out with the spatial steps outermost: a view of
    channels-last data, a byte copy of 4-element units of channels-first data; natively
    (float32) the same adds in the same order."""
    mean = native.global_mean(x, channels_last) if native.enabled() and _native_agrees() \
        else None
    return numpy_global_mean(x, channels_last) if mean is None else mean


@functools.cache
def _native_agrees() -> bool:
    """Whether native.global_mean gives :func:`numpy_global_mean`'s bits on special values
    and on channels of -0 (numpy's reduce starts from +0; another numpy might start from
    the first element): checked once, with the native kernels on."""
    x = np.resize(np.array([0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 1e-40, 3e38, 0.25,
                            2.9], np.float32), (2, 7, 11))
    x[:, :, :3] = x[:, :3] = -0.0
    for channels_last in (True, False):
        got = native.global_mean(x, channels_last)
        with np.errstate(all="ignore"):
            want = numpy_global_mean(x, channels_last)
        nan = np.isnan(want)
        if got is None or not (np.array_equal(np.isnan(got), nan)
                               and got[~nan].tobytes() == want[~nan].tobytes()):
            return False
    return True


def numpy_global_mean(x: np.ndarray, channels_last: bool = False) -> np.ndarray:
    """:func:`mlas_global_mean` by numpy's reductions."""
    if channels_last:
        n, s, ch = x.shape
        body = s - s % 4
        lanes = np.add.reduce(x[:, :body].reshape(n, body // 4, 4, ch), axis=1)    # [N, 4, C]
        lane, element = (lambda j: lanes[:, j]), (lambda i: x[:, i])
    else:
        n, ch, s = x.shape
        body = s - s % 4
        rows = x.reshape(-1, s)
        unit = np.dtype((np.void, 4 * x.dtype.itemsize))
        steps = np.ascontiguousarray(rows[:, :body].view(unit).T).view(x.dtype)
        lanes = np.add.reduce(steps, axis=0).reshape(-1, 4)                      # [N*C, 4]
        lane, element = (lambda j: lanes[:, j]), (lambda i: rows[:, i])
    total = (lane(0) + lane(2)) + (lane(1) + lane(3))
    for i in range(body, s):
        total += element(i)
    return (total / x.dtype.type(s)).reshape(n, ch)


@kernel("global_avgpool")
def global_avgpool(c, x: np.ndarray) -> np.ndarray:
    """global_avgpool: :func:`mlas_global_mean` over the flattened spatial axes, in (at
    least) float32; its order is onnxruntime's in either layout, so the result depends
    neither on the layout nor on how x lies in memory."""
    nhwc = c.in_types[0].layout is Layout.nhwc
    flat = np.ascontiguousarray(x, np.promote_types(x.dtype, np.float32))
    flat = flat.reshape(x.shape[0], -1, x.shape[3]) if nhwc else flat.reshape(x.shape[:2] + (-1,))
    mean = mlas_global_mean(flat, channels_last=nhwc)
    return mean.astype(x.dtype, copy=False).reshape(c.out_types[0].shape)
