"""Native FMA products standing in for the BLAS ones (bevir.ops.native.GatherGemm): float32
convolutions read straight from the padded input (no im2col copy) and linear layers,
with the bias and an activation in the same call.

They give the BLAS path's bits only where BLAS sums a shape the same way (one run of
fused multiply-adds per result in k order, or such runs over BLAS's blocks of k):
``native.agrees`` finds that out once per shape by comparing both on random operands
(bevir.ops.kernels.products decides which runs; docs/numerics.md)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ...ir.types import Layout, TensorType
from .. import native
from ..common import ArrayCache, conv_out_size, nchw_dims, read_only
from .conv import channel_major, from_nhwc, pad_nchw, pad_nhwc, to_nhwc

def fma_eligible(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, groups: int) -> bool:
    """Whether :func:`conv2d_fma` may stand in for conv2d_float (bevir.ops.kernels.conv; where
    native.agrees finds the same bits): a float32 convolution (of any size: the native
    product runs on as many threads as BLAS, native.parallel)."""
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    if not (x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
            and native.enabled()):
        return False
    # its result written channel by channel costs more than it saves
    return not (channel_major(w, groups) and k < 64 and o >= 64)


def conv2d_fma(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides,
               pads, dilations, groups: int,
               activation: tuple[int, int | None] = native.NO_ACTIVATION,
               blocked: bool = False) -> np.ndarray | None:
    """The float32 convolution as native FMA products over the padded input
    (:class:`native.GatherGemm`, no im2col copy), each group's reduction in
    conv2d_float's order, (c, kh, kw) for an ungrouped one of few channels, else
    (kh, kw, c), in BLAS's blocks where ``blocked``, the bias added after, then
    ``activation`` (a native.activation_code); None where the kernel cannot run. Where BLAS
    sums the same way (native.agrees finds out), the bits are conv2d_float's."""
    run = fma_runner(x.shape, w, b, layout, strides, pads, dilations, groups, activation,
                     blocked)
    return None if run is None else run(x)


def conv_geometry(shape, layout: Layout, kernel, strides, pads, dilations
                  ) -> tuple[int, int, int, int, int, int]:
    """(N, C, H, W) of a convolution's 4-D input of ``shape`` in ``layout`` once padded,
    then its output's height and width."""
    n, ch, h, wd = nchw_dims(TensorType(tuple(shape), layout=layout))
    top, left, bottom, right = pads
    hp, wp = h + top + bottom, wd + left + right
    return (n, ch, hp, wp, conv_out_size(hp, kernel[0], strides[0], 0, dilations[0]),
            conv_out_size(wp, kernel[1], strides[1], 0, dilations[1]))


def fma_runner(shape, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides, pads,
               dilations, groups: int, activation: tuple[int, int | None],
               blocked: bool = False) -> Callable[[np.ndarray], np.ndarray] | None:
    """:func:`conv2d_fma` for inputs of ``shape`` with its weights, bias and activation
    prepared once: a function of the input; None where the kernel cannot run. ``blocked``:
    the reduction in BLAS's blocks (native.blas_blocks). Taps that read only padding, for
    every output pixel (a dilated convolution on a small map), are left out: their products
    are exact zeros, which leave each sum as it is (with finite weights). In NHWC the
    function also takes an ``addend`` (C-contiguous float32 of the result's shape), added
    in the product's pass after the bias, ``addend + y`` where ``first`` (an add that
    reads the result, in its operand order), before the activation."""
    o, cg, kh, kw = w.shape
    nhwc = layout is Layout.nhwc
    n, ch, hp, wp, oh, ow = conv_geometry(shape, layout, (kh, kw), strides, pads, dilations)
    by_channel = channel_major(w, groups)
    weights = fma_weights(w, groups, by_channel)
    live = live_taps(shape, layout, (oh, ow), (kh, kw), strides, pads, dilations, cg,
                     by_channel)
    if live is not None and not np.isfinite(np.delete(weights, live, axis=1)).all():
        live = None                               # 0 * inf is a NaN: every tap counts
    # the result lies in memory in its layout's order, so that no reader copies it (each
    # op reads C-ordered operands, OpDef.run: the memory order never changes a bit): an
    # NHWC one as the kernel writes it; an NCHW one of a channel-major product written
    # channel by channel (in one block of the reduction) or, up to 32 channels, faster,
    # transposed after; the others' as a transposed view, which the next convolution
    # reads as it is
    bounds = native.blas_blocks(cg * kh * kw) if blocked else None
    transposed = by_channel and not nhwc and o > 32 and (bounds is None or len(bounds) == 2)
    plan = _window_plan((n, hp, wp, ch) if nhwc else (n, ch, hp, wp), nhwc, o, (oh, ow),
                        (kh, kw), tuple(strides), tuple(dilations), groups, by_channel,
                        None if live is None else tuple(live), blocked, transposed)
    if plan is None:
        return None
    product = plan.bind(weights if live is None else np.ascontiguousarray(weights[:, live]),
                        b, activation)
    pad = pad_nhwc if nhwc else pad_nchw
    padded = any(pads)
    out_shape = (n, o, oh, ow) if transposed else (n, oh, ow, o)

    def run(x: np.ndarray, addend: np.ndarray | None = None, first: bool = False
            ) -> np.ndarray:
        out = np.empty(out_shape, np.float32)
        product(native.contiguous(pad(x, pads) if padded else x), out.reshape(-1, o),
                None if addend is None else addend.reshape(-1, o), first)
        if transposed or nhwc:
            return out
        return native.contiguous(out.transpose(0, 3, 1, 2)) if by_channel else \
            from_nhwc(out, layout)
    return run


def live_taps(shape, layout: Layout, out_hw, kernel, strides, pads, dilations, cg: int,
              channel_major: bool) -> np.ndarray | None:
    """The reduction indices of a convolution's taps that read the input (not only its
    padding) for some output pixel, in the reduction's order; None where all of them do."""
    _, _, h, wd = nchw_dims(TensorType(tuple(shape), layout=layout))

    def reads(size, n_out, k, stride, pad, dilation):
        first = np.arange(k) * dilation - pad           # each tap's position at output 0
        last = first + (n_out - 1) * stride
        return (last >= 0) & (first < size)           # some position within [0, size)
    rows = reads(h, out_hw[0], kernel[0], strides[0], pads[0], dilations[0])
    cols = reads(wd, out_hw[1], kernel[1], strides[1], pads[1], dilations[1])
    taps = rows[:, None] & cols
    if taps.all():
        return None
    live = np.broadcast_to(taps, (cg,) + taps.shape) if channel_major else \
        np.broadcast_to(taps[..., None], taps.shape + (cg,))
    return np.flatnonzero(live)


def depthwise_runner(shape, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides,
                     pads, dilations, activation: tuple[int, int | None]
                     ) -> Callable[[np.ndarray], np.ndarray] | None:
    """A float32 depthwise conv2d (one channel a group, no multiplier) of inputs of
    ``shape``, its bias and ``activation`` in one native call (native.bind_depthwise:
    conv2d_float's operations), prepared once: a function of the input; None where the
    native kernel cannot run."""
    o, _, kh, kw = w.shape
    n, ch, hp, wp, oh, ow = conv_geometry(shape, layout, (kh, kw), strides, pads, dilations)
    if ch != o or w.dtype != np.float32 or (b is not None and b.dtype != np.float32):
        return None
    shape = (n, hp - pads[0] - pads[2], wp - pads[1] - pads[3], ch)      # unpadded
    product = native.bind_depthwise(shape, tap_weights(w), b, (n, oh, ow, o), (kh, kw),
                                    tuple(strides), tuple(pads), tuple(dilations), activation)
    if product is None:
        return None

    def run(x: np.ndarray, addend: np.ndarray | None = None, first: bool = False
            ) -> np.ndarray:
        out = np.empty((n, oh, ow, o), np.float32)
        # the padding read in place; an addend (NHWC) added as fma_runner's
        product(native.contiguous(to_nhwc(x, layout)), out, addend, first)
        return from_nhwc(out, layout)
    return run


#: the tap-major operands of read-only depthwise weights while they live
_TAP_WEIGHTS = ArrayCache()


def tap_weights(w: np.ndarray) -> np.ndarray:
    """Depthwise weights [O, 1, KH, KW] as the C-contiguous [KH*KW, O] rows of the native
    kernel, made once for a weight nothing can change (a graph constant)."""
    hit = _TAP_WEIGHTS.get(w)
    if hit is not None:
        return hit
    m = np.ascontiguousarray(w.reshape(w.shape[0], -1).T, np.float32)
    if read_only(w):
        m.setflags(write=False)
        _TAP_WEIGHTS.put(w, m)
    return m


@functools.lru_cache(maxsize=512)
def _window_plan(shape, nhwc: bool, o: int, out_hw, kernel, strides, dilations, groups: int,
                 channel_major: bool, live: tuple[int, ...] | None = None,
                 blocked: bool = False, transposed: bool = False) -> native.GatherGemm | None:
    """The native product of a convolution over a padded C-contiguous input of ``shape``:
    a row per output pixel (its window's first element), an offset per tap of a group, in
    (c, kh, kw) order where ``channel_major``, else (kh, kw, c); only the ``live`` ones of
    those where given; in BLAS's blocks of the whole reduction where ``blocked``; the result
    written channel by channel (NCHW) where ``transposed``."""
    if nhwc:
        n, h, wd, ch = shape
        sn, sh_, sw_, sc = h * wd * ch, wd * ch, ch, 1
    else:
        n, ch, h, wd = shape
        sn, sc, sh_, sw_ = ch * h * wd, h * wd, wd, 1
    (oh, ow), (kh, kw), (sy, sx), (dy, dx) = out_hw, kernel, strides, dilations
    cg = ch // groups
    rows = (np.arange(n)[:, None, None] * sn + np.arange(oh)[:, None] * (sy * sh_)
            + np.arange(ow) * (sx * sw_)).reshape(-1)
    c, i, j = np.arange(cg) * sc, np.arange(kh) * (dy * sh_), np.arange(kw) * (dx * sw_)
    offs = (c[:, None, None] + i[:, None] + j if channel_major
            else i[:, None, None] + j[:, None] + c).reshape(-1)
    k = offs.size
    kept = np.arange(k) if live is None else np.asarray(live, np.int64)
    bounds = native.blas_blocks(k) if blocked else [0, k]
    if bounds is None:
        return None
    blocks = np.searchsorted(kept, bounds)            # each boundary among the kept taps
    return native.GatherGemm.of(rows, offs[kept], math.prod(shape), o // groups, groups,
                                cg * sc, blocks, oh * ow if transposed else 0)


#: the [G, K, O/G] operands of read-only weights for conv2d_fma while they live
_FMA_WEIGHTS = ArrayCache()


def fma_weights(w: np.ndarray, groups: int, channel_major: bool) -> np.ndarray:
    """``w`` [O, C/G, KH, KW] as the C-contiguous float32 [G, K, O/G] operand of conv2d_fma,
    rows in (c, kh, kw) order where ``channel_major``, else (kh, kw, c); made once for a
    weight nothing can change (a graph constant)."""
    hit = _FMA_WEIGHTS.get(w)
    if hit is not None and hit[0] == (groups, channel_major):
        return hit[1]
    o, cg, kh, kw = w.shape
    m = w.reshape(groups, o // groups, cg, kh, kw)
    m = m.transpose(0, 2, 3, 4, 1) if channel_major else m.transpose(0, 3, 4, 2, 1)
    m = np.ascontiguousarray(m, np.float32).reshape(groups, cg * kh * kw, o // groups)
    if read_only(w):
        m.setflags(write=False)
        _FMA_WEIGHTS.put(w, ((groups, channel_major), m))
    return m


def linear_fma(shape, w: np.ndarray, bias: np.ndarray | None,
               activation: tuple[int, int | None], blocked: bool
               ) -> Callable[[np.ndarray], np.ndarray] | None:
    """``a @ w`` (+ ``bias``, then ``activation``) for float32 inputs of ``shape`` [..., K]
    as one native FMA product, in BLAS's blocks of the reduction where ``blocked``; None
    where the kernel cannot run."""
    k, n = w.shape
    m = math.prod(shape[:-1])
    bounds = native.blas_blocks(k) if blocked else [0, k]
    plan = None if bounds is None else native.GatherGemm.of(
        np.arange(m) * k, np.arange(k), m * k, n, blocks=np.array(bounds))
    if plan is None:
        return None
    product = plan.bind(np.ascontiguousarray(w, np.float32)[None], bias, activation)

    def run(a: np.ndarray) -> np.ndarray:
        out = np.empty(tuple(shape[:-1]) + (n,), np.float32)
        product(native.contiguous(a), out.reshape(m, n))
        return out
    return run
