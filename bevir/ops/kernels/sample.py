"""Bilinear sampling as gathers: ``grid_sample`` (torch's) and ``ms_deform_attn`` (mmcv's
multi-scale deformable attention), each tap a row gathered from channels-last values
by a flat index, weighted and summed tap by tap."""
from __future__ import annotations

import numpy as np

from ..common import level_shapes
from . import kernel


def grid_coord(g: np.ndarray, size: int, padding: str, align: bool) -> np.ndarray:
    """torch grid_sample: a normalized grid coordinate to a pixel coordinate (in g's dtype)."""
    f = g.dtype.type
    x = (g + 1) * f((size - 1) / 2) if align else ((g + 1) * f(size) - 1) / 2
    if padding == "reflection":
        low, span = (f(0), f(size - 1)) if align else (f(-0.5), f(size))
        if span == 0:
            return np.zeros_like(x)
        a = np.abs(x - low)
        extra = np.fmod(a, span)
        x = np.where(np.floor(a / span) % 2 == 0, extra + low, span - extra + low)
    if padding != "zeros":
        x = np.clip(x, 0, size - 1)
    return x


@kernel("grid_sample")
def grid_sample(c, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """grid_sample: each output's taps (one nearest, or the four bilinear corners with
    torch's weight formulas, in (at least) float32) gathered from x channels last; a tap
    outside the input weighs 0 (zeros padding)."""
    n, ch, h, w = x.shape
    g = grid.astype(np.promote_types(grid.dtype, np.float32), copy=False).reshape(n, -1, 2)
    ix = grid_coord(g[..., 0], w, c.padding_mode, c.align_corners)
    iy = grid_coord(g[..., 1], h, c.padding_mode, c.align_corners)
    src = np.ascontiguousarray(x.reshape(n, ch, h * w).transpose(0, 2, 1)).reshape(-1, ch)
    base = (np.arange(n) * (h * w))[:, None]
    if c.mode == "nearest":
        taps = [(np.rint(ix), np.rint(iy), None)]
    else:
        x0, y0 = np.floor(ix), np.floor(iy)
        x1, y1 = x0 + 1, y0 + 1     # torch's weight formulas, for bitwise-close results
        taps = [(x0, y0, (x1 - ix) * (y1 - iy)), (x1, y0, (ix - x0) * (y1 - iy)),
                (x0, y1, (x1 - ix) * (iy - y0)), (x1, y1, (ix - x0) * (iy - y0))]
    y = np.zeros((n, g.shape[1], ch), np.promote_types(x.dtype, np.float32))
    for px, py, wt in taps:
        inside = (px >= 0) & (px <= w - 1) & (py >= 0) & (py <= h - 1)
        idx = base + np.where(inside, py * w + px, 0).astype(np.intp)
        wt = inside if wt is None else np.where(inside, wt, 0)
        y += src[idx] * wt[..., None].astype(y.dtype, copy=False)
    y = y.reshape(n, *grid.shape[1:3], ch).transpose(0, 3, 1, 2)
    return y.astype(x.dtype, copy=False)


def ms_deform_attn_np(value: np.ndarray, shapes, loc: np.ndarray, aw: np.ndarray) -> np.ndarray:
    """mmcv's multi_scale_deformable_attn_pytorch as a gather: value (bs, V, H, d),
    loc (bs, Nq, H, L, P, 2) in [0, 1] as (x, y), aw (bs, Nq, H, L, P) -> (bs, Nq, H*d).

    Bilinear sampling with zero padding and align_corners=False: pixel coordinates are
    ((2*loc - 1) + 1) * size - 1) / 2, written as grid_sample computes them.
    """
    bs, _, heads, d = value.shape
    nq = loc.shape[1]
    out = np.zeros((bs, nq, heads, d), value.dtype)
    start = 0
    bh = (np.arange(bs)[:, None, None, None] * heads + np.arange(heads)[None, None, :, None])
    for lvl, (h, w) in enumerate(level_shapes(shapes)):
        v = value[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(bs * heads * h * w, d)
        start += h * w
        grid = 2 * loc[:, :, :, lvl] - 1                              # (bs, Nq, H, P, 2)
        x = ((grid[..., 0] + 1) * w - 1) / 2
        y = ((grid[..., 1] + 1) * h - 1) / 2
        x0, y0 = np.floor(x), np.floor(y)
        fx, fy = x - x0, y - y0
        weight = aw[:, :, :, lvl]
        for dx, dy, wc in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)),
                           (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
            xi, yi = x0 + dx, y0 + dy
            ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            idx = np.where(ok, yi * w + xi, 0).astype(np.int64) + bh * (h * w)
            coef = (wc * weight * ok).astype(value.dtype)             # (bs, Nq, H, P)
            out += np.einsum("bqhpd,bqhp->bqhd", v[idx], coef)
    return out.reshape(bs, nq, heads * d)


@kernel("ms_deform_attn")
def ms_deform_attn(c, value: np.ndarray, loc: np.ndarray, aw: np.ndarray) -> np.ndarray:
    """ms_deform_attn (and the sampling of the attention modules built on it, whose
    nodes carry the same ``spatial_shapes``): :func:`ms_deform_attn_np`."""
    return ms_deform_attn_np(value, c.spatial_shapes, loc, aw)
