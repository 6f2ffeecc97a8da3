"""Normalization: the two-pass statistics of layer_norm and layer_norm_stats, the
``layer_norm`` kernel (natively over the last axis of C-contiguous float32 rows, the same
operations: numpy's pairwise sums, in float32) and the ``batch_norm`` kernel (natively in
one pass over float32, the same operations)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import native
from ..common import channel_axis, norm_axis
from . import kernel


def moments(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, x - mean, variance) over axes axis..rank-1, kept as size-1 dims: layer_norm's
    two-pass statistics in (at least) float32, shared with layer_norm_stats."""
    acc = np.promote_types(x.dtype, np.float32)
    axes = tuple(range(norm_axis(axis, x.ndim), x.ndim))
    mean = x.mean(axis=axes, keepdims=True, dtype=acc)
    d = x.astype(acc, copy=False) - mean
    return mean, d, np.mean(np.square(d), axis=axes, keepdims=True)


@kernel("layer_norm")
def layer_norm(c, x: np.ndarray, scale: np.ndarray | None = None,
               bias: np.ndarray | None = None) -> np.ndarray:
    """layer_norm: (x - mean) / sqrt(variance + epsilon) (:func:`moments`), * scale,
    + bias; natively (native.layer_norm) over the last axis of C-contiguous float32 x,
    whose rows numpy sums pairwise (another memory order sums otherwise: numpy's code)."""
    if norm_axis(c.axis, x.ndim) == x.ndim - 1:
        y = native.layer_norm(x, scale, bias, c.epsilon)
        if y is not None:
            return y
    _, d, var = moments(x, c.axis)
    y = d / np.sqrt(var + var.dtype.type(c.epsilon))
    if scale is not None:
        y *= scale
    if bias is not None:
        y += bias
    return y.astype(x.dtype, copy=False)


def batch_norm_runner(c, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
                      var: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """batch_norm for inputs like ``x``: (x - mean) / sqrt(var + epsilon) * scale + bias per
    channel (axis 1, or 3 in NHWC), in (at least) float32; natively (native.batch_norm) in
    one pass over float32 x, numpy's four passes otherwise; the parameters made once."""
    axis = channel_axis(c.in_types[0])
    acc = np.promote_types(x.dtype, np.float32)
    scale, bias, mean, var = (p.astype(acc, copy=False) for p in (scale, bias, mean, var))
    s = np.sqrt(var + acc.type(c.epsilon))
    params = np.stack([mean, s, scale, bias])
    shape = [1] * x.ndim
    shape[axis] = -1
    mean, s, scale, bias = (p.reshape(shape) for p in (mean, s, scale, bias))

    def run(x: np.ndarray) -> np.ndarray:
        y = native.batch_norm(x, axis, params)
        if y is not None:
            return y
        return ((x.astype(acc, copy=False) - mean) / s * scale + bias).astype(x.dtype, copy=False)
    return run


@kernel("batch_norm", prepare=batch_norm_runner)
def batch_norm(c, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
               var: np.ndarray) -> np.ndarray:
    """batch_norm: :func:`batch_norm_runner`'s function of ``x``."""
    return batch_norm_runner(c, x, scale, bias, mean, var)(x)
