"""Convolution and matrix products: the ops that carry the MACs, all through BLAS."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..ir.types import Layout, TensorType
from ..ir.opdef import Bool, FixedLowering, Float, Int, Ints, OpDef, Piece, aligned_range
from . import native
from .common import (ArrayCache, check_windows, conv_out_size, float_operands, nchw_dims,
                     read_only, require, window_rows)
from .cost import REQUANTIZE_OPS, PEMapping, Work
from .layout_rules import NATIVE
from .onnx_export import onnx_as


def im2col_nhwc(x: np.ndarray, kh: int, kw: int, oh: int, ow: int, strides, dilations,
                groups: int = 1) -> np.ndarray:
    """Gather the (G, N, OH, OW, KH, KW, C/G) windows of a padded NHWC array, group-major so
    that each group's GEMM operand comes out contiguous: one copy of a strided view (numpy
    merges the dimensions that stay contiguous, a window row's KW*C values when G is 1),
    natively where G > 1 (numpy would copy runs of only C/G values, slowly)."""
    n, h, wd, ch = x.shape
    (sh, sw), (dh, dw) = strides, dilations
    check_windows((h, wd), (oh, ow), (kh, kw), strides, dilations)
    if groups > 1:
        cols = native.im2col(x, (kh, kw), (oh, ow), strides, dilations, groups)
        if cols is not None:
            return cols
    s0, s1, s2, s3 = x.strides
    cg = ch // groups
    windows = as_strided(x, (groups, n, oh, ow, kh, kw, cg),
                         (cg * s3, s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3), writeable=False)
    return np.ascontiguousarray(windows)


#: float32 represents every integer of magnitude up to this exactly
F32_EXACT = 1 << 24


def exact_chunk(max_abs_product: float) -> int:
    """The longest reduction of integer products of at most ``max_abs_product`` whose
    every partial sum, in any order, stays exact in float32."""
    return max(1, int(F32_EXACT // max(max_abs_product, 1)))


def exact_matmul(a: np.ndarray, b: np.ndarray, chunk: int | None, out: np.ndarray) -> None:
    """``out[...] = a @ b``. With ``chunk`` (integer-valued float32 operands), the
    reduction is split so each float32 GEMM sums at most ``chunk`` products (exact, by
    :func:`exact_chunk`); the chunks add up in ``out``, float64 when there are several."""
    k = a.shape[-1]
    if chunk is None or k <= chunk:
        np.matmul(a, b, out=out)
        return
    for k0 in range(0, k, chunk):
        part = np.matmul(a[..., k0:k0 + chunk], b[..., k0:k0 + chunk, :])
        if k0:
            out += part
        else:
            out[...] = part


def int_acc_dtype(k: int, chunk: int | None, acc_dtype) -> np.dtype:
    """The accumulator dtype of a reduction of length ``k``: float64 when it is split."""
    return np.dtype(np.float64 if chunk is not None and k > chunk else acc_dtype)


def exact_int_matmul(a: np.ndarray, b: np.ndarray, chunk: int) -> np.ndarray:
    """``a @ b`` (numpy matmul rules) of integer-valued float32 operands, exactly: float32,
    or float64 when the reduction is split (:func:`exact_matmul`)."""
    if a.ndim == 1 or b.ndim == 1:          # numpy's 1-D promotion: one float64 product
        return np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                   int_acc_dtype(a.shape[-1], chunk, np.float32))
    exact_matmul(a, b, chunk, out)
    return out


def stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)``. A stack of matrices times one matrix runs as one GEMM of all
    their rows: numpy would call BLAS once per matrix and read ``b`` each time."""
    if a.ndim > 2 and b.ndim == 2:
        rows = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])     # not -1: K may be 0
        return np.matmul(rows, b).reshape(a.shape[:-1] + b.shape[1:])
    return np.matmul(a, b)


def pad_nhwc(x: np.ndarray, pads, value=0) -> np.ndarray:
    """NHWC ``x`` padded by ``pads`` = (top, left, bottom, right) with ``value`` (x itself
    without padding): one allocation and one copy, cheaper than np.pad on small maps."""
    top, left, bottom, right = pads
    if not any(pads):
        return x
    n, h, wd, ch = x.shape
    xp = np.full((n, top + h + bottom, left + wd + right, ch), value, x.dtype)
    xp[:, top:top + h, left:left + wd] = native.contiguous(x)   # a fast copy, then another
    return xp


#: output elements per band of a depthwise convolution: its sum and product stay in cache
DEPTHWISE_BAND = 1 << 15


def depthwise_conv_nhwc(xp: np.ndarray, w: np.ndarray, strides, dilations,
                        out: np.ndarray) -> None:
    """``out`` [N, OH, OW, O] = the depthwise convolution of padded NHWC ``xp`` with ``w``
    [O, 1, KH, KW] (O a multiple of xp's channels), as one broadcast multiply-add per tap:
    a batched matrix-vector product per channel would leave BLAS with nothing to do.

    The products are in ``out``'s dtype and summed tap by tap, so integer-valued operands
    stay exact while KH*KW products fit :func:`exact_chunk` (or ``out`` is float64). The
    native kernel (:func:`bevir.ops.native.depthwise`) runs the same sums in one pass."""
    n, oh, ow, o = out.shape
    kh, kw = w.shape[2:]
    (sh, sw), (dh, dw) = strides, dilations
    if o != xp.shape[3]:                    # a channel multiplier: repeat each input channel
        xp = np.repeat(xp, o // xp.shape[3], axis=3)
    wk = w.reshape(o, kh * kw).T
    # numpy multiplies in out's dtype where xp converts to it exactly: so does the C kernel
    if np.result_type(xp.dtype, out.dtype) == out.dtype and native.depthwise(
            xp.astype(out.dtype, copy=False), wk, out, (kh, kw), strides, dilations):
        return
    taps = [(i * dh, j * dw) for i in range(kh) for j in range(kw)]
    # strided windows read from contiguous phase planes, so each tap's rows are contiguous
    phases = {(a % sh, b % sw): np.ascontiguousarray(xp[:, a % sh::sh, b % sw::sw])
              for a, b in taps}
    # a tap's weights repeated along a row: the multiply runs over whole rows
    wt = np.tile(wk.astype(out.dtype, copy=False), (1, ow))
    acc = out.reshape(n, oh, ow * o)
    rows = max(1, DEPTHWISE_BAND // max(1, n * ow * o))
    tmp = np.empty((n, min(rows, oh), ow * o), out.dtype)
    for y0 in range(0, oh, rows):
        band, prod = acc[:, y0:y0 + rows], tmp[:, :min(rows, oh - y0)]
        for t, (a, b) in enumerate(taps):
            r, col = a // sh + y0, b // sw
            win = phases[a % sh, b % sw][:, r:r + band.shape[1], col:col + ow]
            np.multiply(win.reshape(band.shape), wt[t], out=prod if t else band)
            if t:
                band += prod


#: the GEMM operands of read-only weights (graph constants) while they live
_GEMM_WEIGHTS = ArrayCache()


def gemm_weights(w: np.ndarray, groups: int, dtype) -> np.ndarray:
    """``w`` [O, C/groups, KH, KW] as the (G, KH*KW*Cg, Og) GEMM operand, rows in window
    order (kh, kw, c): a transposed view of 1x1 kernels, a copy of larger ones. A copy of
    a weight nothing can change (a graph constant) is made once and kept while it lives.
    (A contiguous 1x1 operand would run faster in BLAS, but change the float sums.)"""
    hit = _GEMM_WEIGHTS.get(w)
    if hit is not None and hit.dtype == dtype and len(hit) == groups:
        return hit
    o, cg, kh, kw = w.shape
    m = np.ascontiguousarray(w, dtype).reshape(groups, o // groups, cg, kh, kw)
    m = m.transpose(0, 3, 4, 2, 1).reshape(groups, kh * kw * cg, -1)
    if read_only(w) and not np.may_share_memory(m, w):
        m.setflags(write=False)
        _GEMM_WEIGHTS.put(w, m)
    return m


def grouped_gemm_nhwc(xp: np.ndarray, w: np.ndarray, strides, dilations, groups: int,
                      chunk: int | None, out: np.ndarray) -> None:
    """``out`` [N, OH, OW, O] = the convolution of padded NHWC ``xp`` with ``w`` [O, C/groups,
    KH, KW] as im2col + one GEMM per group (:func:`exact_matmul`), image by image."""
    n, oh, ow, o = out.shape
    _, cg, kh, kw = w.shape
    og, k, p = o // groups, kh * kw * cg, oh * ow
    wm = gemm_weights(w, groups, xp.dtype)
    pointwise = kh == kw == 1 and tuple(strides) == (1, 1)
    for b in range(n):                      # one image at a time bounds the im2col buffer
        xb = xp[b:b + 1]
        ob = out[b].reshape(p, o)
        if groups == 1:
            cols = xb if pointwise else im2col_nhwc(xb, kh, kw, oh, ow, strides, dilations)
            exact_matmul(cols.reshape(p, k), wm[0], chunk, ob)
            continue
        cols = im2col_nhwc(xb, kh, kw, oh, ow, strides, dilations, groups)
        # each group's product written in place (BLAS takes the row stride: same sums)
        exact_matmul(cols.reshape(groups, p, k), wm, chunk,
                     ob.reshape(p, groups, og).transpose(1, 0, 2))


def conv2d_nhwc(x: np.ndarray, w: np.ndarray, strides, pads, dilations, groups: int,
                acc_dtype=None, chunk: int | None = None) -> np.ndarray:
    """Grouped 2-D convolution of NHWC ``x`` with OIHW ``w``: depthwise convolutions by
    :func:`depthwise_conv_nhwc`, the others by :func:`grouped_gemm_nhwc`.

    ``acc_dtype`` is the dtype of the products (the operands are converted to it); the
    result is in that dtype, without bias. ``chunk``: integer operands, reduced exactly
    by :func:`exact_matmul` (the result is float64 when the reduction is split).
    """
    acc = np.dtype(acc_dtype or x.dtype)
    n, h, wd, ch = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = pads
    oh = conv_out_size(h, kh, strides[0], top + bottom, dilations[0])
    ow = conv_out_size(wd, kw, strides[1], left + right, dilations[1])
    dtype = int_acc_dtype(kh * kw * cg, chunk, acc)
    xp = pad_nhwc(x.astype(acc, copy=False), pads)
    if cg == 1 and groups > 1:
        # float16 rounded at every tap would drift: sum in float32, as numpy's matmul does
        out = np.empty((n, oh, ow, o), np.promote_types(dtype, np.float32))
        depthwise_conv_nhwc(xp, w, strides, dilations, out)
        return out.astype(dtype, copy=False)
    out = np.empty((n, oh, ow, o), dtype)
    grouped_gemm_nhwc(xp, w, strides, dilations, groups, chunk, out)
    return out


#: an integer convolution runs in tiles of output rows whose im2col block holds about
#: this many elements, so the block, its accumulator and the epilogue stay in cache
TILE_ELEMS = 1 << 18


def int_conv2d_nhwc(x: np.ndarray, zero_point, wm: np.ndarray, kernel: tuple[int, int],
                    strides, pads, dilations, chunk: int, epilogue, out: np.ndarray) -> None:
    """Ungrouped convolution of NHWC integer codes ``x`` with the centered weight matrix
    ``wm`` [KH*KW*C, O] (float32, rows in (kh, kw, c) order), exactly, in tiles of output
    rows: each tile's windows are gathered from the codes (padding reads the zero point),
    centered to float32, multiplied by :func:`exact_matmul`, and handed to
    ``epilogue(acc, out_rows)``, which writes the tile's [rows, O] results."""
    n, _, _, ch = x.shape
    kh, kw = kernel
    (sh, _), (dh, _) = strides, dilations
    _, oh, ow, o = out.shape
    k = wm.shape[0]
    rows = max(1, TILE_ELEMS // (ow * max(k, o)))
    pointwise = kh == kw == 1 and tuple(strides) == (1, 1) and not any(pads)
    zp = np.asarray(zero_point, np.float32)
    vnni = native.U8S8Gemm.of(wm, x.dtype, zero_point)   # the same integers, 3-4x faster
    for b in range(n):
        xb = pad_nhwc(x[b:b + 1], pads, np.asarray(zero_point).astype(x.dtype))
        for y0 in range(0, oh, rows):
            y1 = min(oh, y0 + rows)
            if pointwise:
                cols = xb[:, y0:y1].reshape(-1, ch)
            else:
                band = xb[:, y0 * sh: (y1 - 1) * sh + (kh - 1) * dh + 1]
                cols = im2col_nhwc(band, kh, kw, y1 - y0, ow, strides, dilations)
                cols = cols.reshape(-1, k)
            dtype = int_acc_dtype(k, chunk, np.float32)
            if vnni is not None:
                acc = vnni(cols).astype(dtype)
            else:
                acc = np.empty((cols.shape[0], o), dtype)
                exact_matmul(np.subtract(cols, zp, dtype=np.float32), wm, chunk, acc)
            epilogue(acc, out[b, y0:y1].reshape(-1, o))


def conv2d_nchw(x: np.ndarray, w: np.ndarray, strides, pads, dilations,
                acc_dtype=None, chunk: int | None = None) -> np.ndarray:
    """Ungrouped convolution of NCHW ``x`` as W @ im2col: for few input channels (the
    stem), where NHWC windows would copy runs of only C elements. ``chunk``: as for
    :func:`conv2d_nhwc`."""
    acc = np.dtype(acc_dtype or x.dtype)
    n, ch, h, wd = x.shape
    o, _, kh, kw = w.shape
    top, left, bottom, right = pads
    (sh, sw), (dh, dw) = strides, dilations
    oh = conv_out_size(h, kh, sh, top + bottom, dh)
    ow = conv_out_size(wd, kw, sw, left + right, dw)
    wm = w.astype(acc).reshape(o, ch * kh * kw)
    out = np.empty((n, o, oh * ow), int_acc_dtype(ch * kh * kw, chunk, acc))
    cols = np.empty((ch, kh, kw, oh, ow), acc)
    for b in range(n):
        xb = x[b].astype(acc, copy=False)
        if any(pads):                       # np.pad costs ~15 us even when it pads nothing
            xb = np.pad(xb, ((0, 0), (top, bottom), (left, right)))
        for i in range(kh):
            for j in range(kw):
                cols[:, i, j] = xb[:, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                                   j * dw: j * dw + sw * (ow - 1) + 1: sw]
        exact_matmul(wm, cols.reshape(ch * kh * kw, oh * ow), chunk, out[b])
    return out.reshape(n, o, oh, ow)


#: below this many input channels an NCHW convolution uses conv2d_nchw
NCHW_CHANNEL_LIMIT = 16


def to_nhwc(x: np.ndarray, layout: Layout) -> np.ndarray:
    return x if layout is Layout.nhwc else np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def from_nhwc(y: np.ndarray, layout: Layout) -> np.ndarray:
    # a transposed view: the next conv's to_nhwc is then free
    return y if layout is Layout.nhwc else y.transpose(0, 3, 1, 2)


def channel_major(w: np.ndarray, groups: int) -> bool:
    """Whether a convolution sums in (c, kh, kw) order, as W @ im2col (:func:`conv2d_nchw`:
    an ungrouped one of few input channels, the stem), not in (kh, kw, c) order."""
    return groups == 1 and w.shape[1] < NCHW_CHANNEL_LIMIT


def conv2d_float(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides,
                 pads, dilations, groups: int) -> np.ndarray:
    """conv2d's float semantics: few input channels (the stem) by :func:`conv2d_nchw`, the
    others by :func:`conv2d_nhwc`, each the same algorithm (and float sums) in either
    layout, so results never depend on it; then the bias."""
    if channel_major(w, groups):
        nhwc = layout is Layout.nhwc
        y = conv2d_nchw(x.transpose(0, 3, 1, 2) if nhwc else x, w, strides, pads, dilations)
        y = y if b is None else y + b[:, None, None]
        return y.transpose(0, 2, 3, 1) if nhwc else y
    y = conv2d_nhwc(to_nhwc(x, layout), w, strides, pads, dilations, groups)
    if b is not None:
        y += b
    return from_nhwc(y, layout)


#: the largest product (MACs) that runs natively where BLAS has threads (the native kernel
#: has one), unless the products left out (taps in the padding) leave at most this
#: fraction of BLAS's
FMA_MACS, FMA_FRACTION = 1 << 23, 1 / 4


def fma_eligible(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides,
                 pads, dilations, groups: int) -> bool:
    """Whether :func:`conv2d_fma` may stand in for :func:`conv2d_float` (where
    native.agrees finds the same bits): a float32 convolution, of any size where BLAS runs
    on one thread, else not too large (:data:`FMA_MACS`)."""
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    if not (x.dtype == w.dtype == np.float32 and (b is None or b.dtype == np.float32)
            and native.enabled()):
        return False
    if channel_major(w, groups) and k < 64 and o >= 64:
        return False      # its result written channel by channel costs more than it saves
    if native.threads() == 1:
        return True
    n, _, _, _, oh, ow = conv_geometry(x.shape, layout, (kh, kw), strides, pads, dilations)
    live = live_taps(x.shape, layout, (oh, ow), (kh, kw), strides, pads, dilations, cg, False)
    kept = k if live is None else live.size
    return n * oh * ow * o * kept <= FMA_MACS or kept <= FMA_FRACTION * k


def conv2d_fma(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: Layout, strides,
               pads, dilations, groups: int,
               activation: tuple[int, int | None] = native.NO_ACTIVATION,
               blocked: bool = False) -> np.ndarray | None:
    """The float32 convolution as native FMA products over the padded input
    (:class:`native.GatherGemm`, no im2col copy), each group's reduction in
    :func:`conv2d_float`'s order, (c, kh, kw) for an ungrouped one of few channels, else
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
    are exact zeros, which leave each sum as it is (with finite weights)."""
    o, cg, kh, kw = w.shape
    nhwc = layout is Layout.nhwc
    n, ch, hp, wp, oh, ow = conv_geometry(shape, layout, (kh, kw), strides, pads, dilations)
    by_channel = channel_major(w, groups)
    weights = fma_weights(w, groups, by_channel)
    live = live_taps(shape, layout, (oh, ow), (kh, kw), strides, pads, dilations, cg,
                     by_channel)
    if live is not None and not np.isfinite(np.delete(weights, live, axis=1)).all():
        live = None                               # 0 * inf is a NaN: every tap counts
    # conv2d_nchw's result lies in memory channel by channel, and a later reduction sums in
    # the order of memory: so does this one's, written so (in one block of the reduction),
    # or up to 32 channels, faster, transposed after
    bounds = native.blas_blocks(cg * kh * kw) if blocked else None
    transposed = by_channel and o > 32 and (bounds is None or len(bounds) == 2)
    plan = _window_plan((n, hp, wp, ch) if nhwc else (n, ch, hp, wp), nhwc, o, (oh, ow),
                        (kh, kw), tuple(strides), tuple(dilations), groups, by_channel,
                        None if live is None else tuple(live), blocked, transposed)
    if plan is None:
        return None
    product = plan.bind(weights if live is None else np.ascontiguousarray(weights[:, live]),
                        b, activation)
    pad = pad_nhwc if nhwc else pad_nchw

    def run(x: np.ndarray) -> np.ndarray:
        out = np.empty((n, o, oh, ow) if transposed else (n, oh, ow, o), np.float32)
        product(native.contiguous(pad(x, pads)), out.reshape(-1, o))
        if transposed:
            return out.transpose(0, 2, 3, 1) if nhwc else out
        if by_channel:                                     # in channels, then as above
            y = native.contiguous(out.transpose(0, 3, 1, 2))
            return y.transpose(0, 2, 3, 1) if nhwc else y
        return from_nhwc(out, layout)
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
    product = native.bind_depthwise((n, hp, wp, ch), tap_weights(w), b, (n, oh, ow, o),
                                    (kh, kw), tuple(strides), tuple(dilations), activation)
    if product is None:
        return None

    def run(x: np.ndarray) -> np.ndarray:
        out = np.empty((n, oh, ow, o), np.float32)
        product(native.contiguous(pad_nhwc(to_nhwc(x, layout), pads)), out)
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


def pad_nchw(x: np.ndarray, pads) -> np.ndarray:
    """NCHW ``x`` padded with zeros by ``pads`` = (top, left, bottom, right)."""
    top, left, bottom, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right))) if any(pads) else x


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


# ---- the product families: one shape rule and one MAC count each --------------------------
class Contraction(OpDef):
    """Ops whose results are sums of products: MACs = result elements x reduction length.
    ``reduction`` is the number of products summed per result element; ``weight_axes``
    the axes of the second operand (the weight) those products run over."""

    def reduction(self, c, x: TensorType, w: TensorType) -> int:
        return x.shape[-1]

    def weight_axes(self, c, w: TensorType) -> tuple[int, ...]:
        raise NotImplementedError(f"op '{self.name}' does not say which weight axes it reduces")

    def macs(self, c):
        return c.out_types[0].numel * self.reduction(c, *c.in_types[:2])

    #: cycle model: the class of its efficiency factor
    op_class = "matmul"

    def epilogue_ops(self, c) -> int:
        """ALU operations per result after the sum: a requantizing epilogue where the
        result is narrower than the int32 accumulator (the INT8 and 16-bit products,
        QLinear and fixed point alike), else the bias add."""
        out = c.out_types[0].dtype
        return REQUANTIZE_OPS if out.is_int and out.np.itemsize < 4 else 1

    def gemm_dims(self, c) -> tuple[int, int, int, int]:
        """(batch, M, N, K): results as batch x [M, N], each a K-long sum of products.
        Rows share the weight, so all leading axes fold into M."""
        out = c.out_types[0]
        n = out.shape[-1] if out.rank else 1
        return 1, out.numel // n, n, self.reduction(c, *c.in_types[:2])

    def pe_mappings(self, c) -> tuple[PEMapping, ...]:
        """Output stationary: M over PE rows and N over columns (K across the lanes), or
        M over every PE with the N columns in sequence (for small N)."""
        b, m, n, k = self.gemm_dims(c)
        return (PEMapping("MxN", ((m, "rows"), (n, "cols"), (k, "lanes")), 1, b, (1,)),
                PEMapping("M/pes", ((m, "pes"), (k, "lanes")), n, b))

    def tile_weight_bytes(self, c) -> int:
        """The weight bytes one tile of the array reads: all of them."""
        return c.in_types[1].nbytes

    def cycle_cost(self, c) -> Work:
        return Work(self.op_class, self.pe_mappings(c),
                    alu_ops=self.epilogue_ops(c) * c.out_types[0].numel,
                    tile_weight_bytes=self.tile_weight_bytes(c),
                    weight_bytes=c.in_types[1].nbytes)


CONV_ATTRS = {"strides": Ints((1, 1)), "pads": Ints((0, 0, 0, 0)), "dilations": Ints((1, 1)),
              "groups": Int(1)}


class Convolution(Contraction):
    """The 2-D convolutions (conv2d, conv2d_act, qlinear_conv, conv_integer, fx_conv2d):
    x [N,C,H,W] (plain or nchw) or [N,H,W,C] (nhwc), w [O, C/groups, KH, KW], ``pads`` =
    [top, left, bottom, right]; results in x's layout."""

    attrs = CONV_ATTRS

    def conv_shape(self, c, x: TensorType, w: TensorType) -> tuple[int, ...]:
        """The result shape, in x's layout (VerifyError for operands that do not fit)."""
        require(x.rank == 4 and w.rank == 4, f"expects 4-D input and weight, got {x} and {w}")
        require(len(c.strides) == 2 and len(c.dilations) == 2 and len(c.pads) == 4,
                "strides and dilations take 2 values, pads 4")
        n, ch, h, wd = nchw_dims(x)
        o, cg, kh, kw = w.shape
        require(c.groups >= 1 and ch % c.groups == 0 and o % c.groups == 0
                and cg == ch // c.groups,
                f"weight {list(w.shape)} does not fit {ch} input channels in {c.groups} groups")
        oh = conv_out_size(h, kh, c.strides[0], c.pads[0] + c.pads[2], c.dilations[0])
        ow = conv_out_size(wd, kw, c.strides[1], c.pads[1] + c.pads[3], c.dilations[1])
        require(oh > 0 and ow > 0, "output would be empty")
        return (n, oh, ow, o) if x.layout is Layout.nhwc else (n, o, oh, ow)

    def reduction(self, c, x, w):
        return w.shape[1] * w.shape[2] * w.shape[3]

    def weight_axes(self, c, w):
        return (1, 2, 3)

    op_class = "conv"
    #: by images, by output rows (each piece reads a halo of input rows), by output channels
    splits = ("batch", "rows", "channels")

    def split_axis(self, c, kind):
        nhwc = c.in_types[0].layout is Layout.nhwc
        axes = {"batch": 0, "rows": 1 if nhwc else 2, "channels": 3 if nhwc else 1}
        if kind not in axes:
            return super().split_axis(c, kind)
        return None if kind == "channels" and c.groups != 1 else axes[kind]

    def split_piece(self, c, kind, start, stop):
        ranges: list = [None] * len(c.in_types)
        if kind == "batch":
            ranges[0] = (0, start, stop)
            return Piece(tuple(ranges))
        if kind == "channels":       # the weights' and the bias's rows of those channels
            ranges[1] = (0, start, stop)
            if len(ranges) > 2 and c.in_types[2] is not None:
                ranges[2] = (0, start, stop)
            return Piece(tuple(ranges))
        kh = c.in_types[1].shape[2]
        ranges[0], pads = window_rows(c, self.split_axis(c, "rows"), kh, start, stop)
        return Piece(tuple(ranges), {"pads": pads})

    def pe_mappings(self, c):
        """Output stationary: one output pixel per PE (OH over rows, OW over columns),
        the MAC lanes across the input channels of a group, or across its output
        channels (depthwise convolutions, few input channels); or the pixels over the
        rows and the output channels over the columns."""
        n, o, oh, ow = nchw_dims(c.out_types[0])
        _, cg, kh, kw = c.in_types[1].shape
        og = o // c.groups
        # the images share the weights: their rows stack down the PE rows (a batch as an
        # outer loop would leave rows idle where an image is shorter than the array)
        pixels = ((n * oh, "rows"), (ow, "cols"))
        return (PEMapping("pixels/in-channels", pixels + ((cg, "lanes"),), o * kh * kw),
                PEMapping("pixels/out-channels", pixels + ((og, "lanes"),),
                          c.groups * cg * kh * kw, 1, (2,)),
                # small images: pixels down the rows, a group's output channels across
                PEMapping("pixels x out-channels", ((n * oh * ow, "rows"), (og, "cols"),
                                                    (cg, "lanes")), c.groups * kh * kw, 1,
                          (1,)))


def matmul_shape(a: TensorType, b: TensorType) -> tuple[int, ...]:
    """numpy.matmul's result shape: batched, broadcasting, 1-D operands promoted."""
    require(a.rank >= 1 and b.rank >= 1, "matmul operands must have rank >= 1")
    sa = a.shape if a.rank > 1 else (1,) + a.shape
    sb = b.shape if b.rank > 1 else b.shape + (1,)
    require(sa[-1] == sb[-2], f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    batch = np.broadcast_shapes(sa[:-2], sb[:-2])
    return batch + (sa[-2],) * (a.rank > 1) + (sb[-1],) * (b.rank > 1)


class MatrixProduct(Contraction):
    """The numpy-matmul products (matmul, qlinear_matmul, matmul_integer, fx_matmul): b's
    columns are the output channels, its rows the reduction."""

    def weight_axes(self, c, w):
        return (w.rank - 2,) if w.rank >= 2 else (0,)

    #: by batch (attention heads), by rows of a, by columns of b
    splits = ("batch", "rows", "columns")

    def split_axis(self, c, kind):
        a, b = c.in_types[:2]
        shape = c.out_types[0].shape
        if kind not in self.splits:
            return super().split_axis(c, kind)
        if a.rank < 2 or b.rank < 2:
            return None
        if kind == "batch":
            axes = [i for i in range(len(shape) - 2) if shape[i] > 1]
            return max(axes, key=lambda i: (shape[i], -i)) if axes else None
        return len(shape) - (2 if kind == "rows" else 1)

    def split_piece(self, c, kind, start, stop):
        a, b = c.in_types[:2]
        out = c.out_types[0]
        ranges: list = [None] * len(c.in_types)
        if kind == "batch":
            axis = self.split_axis(c, kind)
            ranges[0] = aligned_range(a, out, axis, start, stop)
            ranges[1] = aligned_range(b, out, axis, start, stop)
        elif kind == "rows":
            ranges[0] = (a.rank - 2, start, stop)
        else:                         # columns: of b, and of the bias where there is one
            ranges[1] = (b.rank - 1, start, stop)
            if len(ranges) > 2 and c.in_types[2] is not None:
                ranges[2] = (0, start, stop)
        return Piece(tuple(ranges))

    def gemm_dims(self, c):
        """A batched b (attention scores) differs per batch; a 2-D one is shared."""
        _, m, n, k = super().gemm_dims(c)
        b = c.in_types[1]
        batch = int(np.prod(c.out_types[0].shape[:-2])) if b.rank > 2 else 1
        return batch, m // batch, n, k

    def tile_weight_bytes(self, c):
        """A batched b: one batch's matrix per tile."""
        b = c.in_types[1]
        return b.nbytes // int(np.prod(b.shape[:-2])) if b.rank > 2 else b.nbytes

    @staticmethod
    def column_axis(b: TensorType) -> int | None:
        """The axis along which b may be quantized per channel: its columns (N)."""
        return b.rank - 1 if b.rank >= 2 else None


class Conv2d(Convolution):
    """2-D convolution (see :class:`Convolution`); b: [O]."""

    name = "conv2d"
    onnx_export = onnx_as("Conv", {"strides": "strides", "pads": "pads", "dilations": "dilations", "groups": "group"})
    fixed_point = FixedLowering("product")
    nhwc = NATIVE
    operands = ("x", "w", "b?")

    def infer(self, c, x, w, b=None):
        float_operands(x, w, *([b] if b else []))
        shape = self.conv_shape(c, x, w)
        require(b is None or b.shape == (w.shape[0],), f"bias must be [{w.shape[0]}], got {b}")
        return TensorType(shape, x.dtype, x.layout)
    def compute(self, c, x, w, b=None):
        return prepared_product(c, x, w, b, lambda: conv2d_runner(c, x, w, b)[0])


def conv_args(c) -> tuple:
    """(layout, strides, pads, dilations, groups) of a convolution's context."""
    return (c.in_types[0].layout, tuple(c.strides), tuple(c.pads), tuple(c.dilations),
            c.groups)


#: prepared products (convolutions, linear layers) by weight (a graph constant): (key, bias,
#: run)
_PREPARED = ArrayCache()


def prepared_product(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                     build: Callable[[], Callable[[np.ndarray], np.ndarray]]) -> np.ndarray:
    """``build()``, a function of the input that computes the node, applied to ``x``: built
    once per weight that nothing can change (a graph constant) while the node's attributes,
    the input's shape and type, the bias and whether native kernels run stay the same."""
    key = (x.shape, x.dtype, c.in_types[0].layout, c.attrs, native.enabled())
    hit = _PREPARED.get(w)
    if hit is not None and hit[1] is b and hit[0] == key:
        return hit[2](x)
    run = build()
    if read_only(w) and (b is None or read_only(b)):
        _PREPARED.put(w, (key[:3] + (dict(c.attrs), key[4]), b, run))
    return run(x)


def conv2d_runner(c, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                  activation: tuple[int, int | None] = native.NO_ACTIVATION
                  ) -> tuple[Callable[[np.ndarray], np.ndarray], bool]:
    """A function computing conv2d (then ``activation``, a native.activation_code) for
    inputs like ``x``, and whether it runs natively (and applies the activation): with
    native kernels where they give conv2d_float's bits (a depthwise one by the same
    operations, :func:`depthwise_runner`; the others as FMA products, :func:`fma_runner`,
    where BLAS sums so too: native.agrees finds out once per shape), else conv2d_float."""
    args = conv_args(c)
    run = None
    if w.shape[1] == 1 and c.groups > 1:
        if x.dtype == np.float32 and native.enabled():
            run = depthwise_runner(x.shape, w, b, args[0], *args[1:4], activation)
    elif fma_eligible(x, w, b, *args):
        blocked = native.agreeing_blocking(
            ("conv2d", x.shape, w.shape, b is None) + args, w[0].size,
            lambda blocked, *xwb: conv2d_fma(*xwb, *args, blocked=blocked),
            lambda *xwb: conv2d_float(*xwb, *args), (x, w, b))
        if blocked is not None:
            run = fma_runner(x.shape, w, b, *args, activation, blocked)
    if run is not None:
        return run, True
    return (lambda x: conv2d_float(x, w, b, *args)), False


def linear_runner(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                  activation: tuple[int, int | None] = native.NO_ACTIVATION
                  ) -> Callable[[np.ndarray], np.ndarray] | None:
    """``a @ w`` (+ ``bias`` [N], then ``activation``, a native.activation_code) for float32
    inputs like ``a`` [..., K] and a 2-D weight ``w`` [K, N] (a view, maybe transposed) as
    native FMA products where they give the bits of numpy's matmul and add (native.agrees
    finds out once per shape, in BLAS's blocks of a long reduction or whole), else None."""
    k, n = w.shape
    m = math.prod(a.shape[:-1])
    if not (a.dtype == w.dtype == np.float32 and a.ndim >= 2 and m > 1 and native.enabled()
            and (bias is None or bias.dtype == np.float32 and bias.shape == (n,))
            and (native.threads() == 1 or m * k * n <= FMA_MACS)):
        return None

    def numpy_path(a, w, bias):
        y = stacked_matmul(a, w)
        return y if bias is None else y + bias

    def native_path(blocked, a, w, bias):
        run = _linear_fma(a.shape, w, bias, native.NO_ACTIVATION, blocked)
        return None if run is None else run(a)
    blocked = native.agreeing_blocking(
        ("linear", a.shape, w.shape, w.strides[0] < w.strides[1], bias is None), k,
        native_path, numpy_path, (a, w, bias))
    return None if blocked is None else _linear_fma(a.shape, w, bias, activation, blocked)


def _linear_fma(shape, w: np.ndarray, bias: np.ndarray | None,
                activation: tuple[int, int | None], blocked: bool
                ) -> Callable[[np.ndarray], np.ndarray] | None:
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


class MatMul(MatrixProduct):
    """numpy.matmul: batched, broadcasting, 1-D operands promoted as numpy does."""

    name = "matmul"
    onnx_export = onnx_as("MatMul")
    fixed_point = FixedLowering("product")
    operands = ("a", "b")

    def infer(self, c, a, b):
        float_operands(a, b)
        return TensorType(matmul_shape(a, b), a.dtype)

    def compute(self, c, a, b):
        return stacked_matmul(a, b)


class Gemm(Contraction):
    """alpha * op(a) @ op(b) + beta * c, op = optional transpose; a and b are 2-D.
    With trans_b it is a linear layer (torch's weight layout)."""

    name = "gemm"
    onnx_export = onnx_as("Gemm", {"alpha": "alpha", "beta": "beta", "trans_a": "transA", "trans_b": "transB"})
    fixed_point = FixedLowering("product")
    operands = ("a", "b", "c?")
    attrs = {"alpha": Float(1.0), "beta": Float(1.0), "trans_a": Bool(False),
             "trans_b": Bool(False)}

    def infer(self, c, a, b, bias=None):
        float_operands(a, b, *([bias] if bias else []))
        require(a.rank == 2 and b.rank == 2, f"gemm takes 2-D operands, got {a} and {b}")
        m, k = a.shape[::-1] if c.trans_a else a.shape
        k2, n = b.shape[::-1] if c.trans_b else b.shape
        require(k == k2, f"inner dimensions differ: {k} and {k2}")
        if bias is not None:
            np.broadcast_shapes(bias.shape, (m, n))
        return TensorType((m, n), a.dtype)

    def compute(self, c, a, b, bias=None):
        a = a.T if c.trans_a else a
        b = b.T if c.trans_b else b
        y = np.matmul(a, b)
        if c.alpha != 1.0:
            y = y * a.dtype.type(c.alpha)
        if bias is not None:
            y = y + (bias if c.beta == 1.0 else bias * a.dtype.type(c.beta))
        return y.astype(a.dtype, copy=False)

    def reduction(self, c, a, b):
        return a.shape[0] if c.trans_a else a.shape[1]

    def weight_axes(self, c, w):
        return (1,) if c.trans_b else (0,)


# ---- lowerings shared by the integer product ops (their tvm_lowering) ------------------
def batch_index(t: TensorType, batch: tuple, i) -> tuple:
    """The batch index of matrix operand ``t`` for result index ``i`` (broadcast batches)."""
    lead = len(batch) - (t.rank - 2)
    return tuple(0 if t.shape[a] == 1 and batch[a + lead] != 1 else i[a + lead]
                 for a in range(t.rank - 2))


def conv_accumulator(c, L, x, w, dtype: str, x_zero: int = 0, w_zero: np.ndarray | None = None):
    """The exact accumulator of a convolution (NCHW or NHWC x, w [O, C/groups, KH, KW]) of
    the centered codes x - x_zero and w - w_zero (w_zero: None, or one zero point per
    output channel or one for all): a function from result index to its element. Padding
    reads as a centered 0. Where the build has a micro-kernel for it (an int32 sum of
    8-bit codes, weights centered at 0), that; else, ungrouped: x is packed into a padded
    NHWC buffer and w into [KH, KW, C, O], so the inner loop runs over output channels
    along contiguous memory (the ``conv_acc`` block the schedule vectorizes); grouped: one
    guarded load per product."""
    w_zero = None if w_zero is None or not np.any(w_zero) else w_zero
    if dtype == "int32" and w_zero is None:
        acc = L.micro_conv(c, x, w, int(x_zero))
        if acc is not None:
            return lambda i: acc[i]
    t, out = c.in_types[0], c.out_types[0]
    nhwc = t.layout is Layout.nhwc
    n, ch, hh, ww = (t.shape[0], t.shape[3], t.shape[1], t.shape[2]) if nhwc else t.shape
    o, cg, kh, kw = c.in_types[1].shape
    (sy, sx), (dy, dx) = c.strides, c.dilations
    top, left = c.pads[0], c.pads[1]
    nchw_of = (lambda i: (i[0], i[3], i[1], i[2])) if nhwc else (lambda i: tuple(i))

    def xv(b, cin, y, xx):
        load = x[(b, y, xx, cin) if nhwc else (b, cin, y, xx)]
        return L.cast(load, dtype) - L.const_or_cast(x_zero, dtype) if x_zero else L.cast(load, dtype)

    wz = None if w_zero is None else L.const(np.asarray(w_zero, np.int32).reshape(-1), "wzp")

    def wv(oc, rc, ry, rx):
        v = L.cast(w[oc, rc, ry, rx], dtype)
        if wz is None:
            return v
        return v - L.cast(wz[oc if int(wz.shape[0]) > 1 else 0], dtype)

    if c.groups > 1:
        og = o // c.groups
        rc, ry, rx = L.reduce_axis(cg, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")

        def element(*i):
            b, oc, oy, ox = nchw_of(i)
            y, xx = oy * sy - top + ry * dy, ox * sx - left + rx * dx
            inside = L.tirx.all(y >= 0, y < hh, xx >= 0, xx < ww)
            v = L.tirx.if_then_else(inside, xv(b, (oc // og) * cg + rc, y, xx),
                                    L.tirx.const(0, dtype))
            return L.sum(v * wv(oc, rc, ry, rx), axis=[rc, ry, rx])
        acc = L.te.compute(out.shape, element, name="acc")
        return lambda i: acc[i]
    b_, oc_, oh, ow = nchw_of(out.shape)
    hp = max((oh - 1) * sy + (kh - 1) * dy + 1, top + hh)
    wp = max((ow - 1) * sx + (kw - 1) * dx + 1, left + ww)
    xp = L.te.compute((n, hp, wp, ch), lambda b, y, xx, cin: L.tirx.if_then_else(
        L.tirx.all(y >= top, y < top + hh, xx >= left, xx < left + ww),
        xv(b, cin, y - top, xx - left), L.tirx.const(0, dtype)), name="x_packed")
    wk = L.te.compute((kh, kw, cg, o), lambda ry, rx, rc, oc: wv(oc, rc, ry, rx), name="w_packed")
    rc, ry, rx = L.reduce_axis(cg, "rc"), L.reduce_axis(kh, "ry"), L.reduce_axis(kw, "rx")
    acc = L.te.compute((n, oh, ow, o), lambda b, oy, ox, oc: L.sum(
        xp[b, oy * sy + ry * dy, ox * sx + rx * dx, rc] * wk[ry, rx, rc, oc],
        axis=[ry, rx, rc]), name="conv_acc")
    return lambda i: acc[(lambda b, oc, oy, ox: (b, oy, ox, oc))(*nchw_of(i))]
