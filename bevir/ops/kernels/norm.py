"""Layer normalization: the two-pass statistics of layer_norm and layer_norm_stats, and the
``layer_norm`` kernel (natively over the last axis of C-contiguous float32 rows, the same
operations: numpy's pairwise sums, in float32)."""
from __future__ import annotations

import numpy as np

from .. import native
from ..common import norm_axis
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
