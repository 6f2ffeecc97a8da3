"""Convolutions through BLAS: the float sums that define conv2d's bits, and the integer
convolutions' exact products.

A float convolution sums as BLAS sums an im2col GEMM: per group, the (kh, kw, c) window
rows of an NHWC input times the weights (:func:`conv2d_nhwc`), or, ungrouped with fewer
than :data:`NCHW_CHANNEL_LIMIT` input channels (a stem), the weights times the
(c, kh, kw) columns of an NCHW input (:func:`conv2d_nchw`); a depthwise convolution as
one multiply-add per tap, in tap order (:func:`depthwise_conv_nhwc`). Either layout gives
the same sums. Integer-valued operands are reduced exactly (``chunk``: float32 GEMMs whose
partial sums stay below 2^24, bevir.ops.kernels.gemm.exact_chunk)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...ir.types import Layout
from .. import native
from ..common import ArrayCache, check_windows, conv_out_size, read_only
from .gemm import exact_matmul, int_acc_dtype


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


def pad_nchw(x: np.ndarray, pads) -> np.ndarray:
    """NCHW ``x`` padded with zeros by ``pads`` = (top, left, bottom, right)."""
    top, left, bottom, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right))) if any(pads) else x


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


def conv2d_float_runner(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layout: Layout,
                        strides, pads, dilations, groups: int
                        ) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`conv2d_float` for inputs like ``x``, what it finds once made once: for a
    pointwise convolution (ungrouped 1x1, stride 1, no padding, not channel-major: a
    squeeze-excitation's on a 1x1 map) its GEMM per image and the bias added, the steps
    :func:`conv2d_nhwc` takes, without finding them again; for the others conv2d_float."""
    o, cg, kh, kw = w.shape
    if (groups != 1 or (kh, kw) != (1, 1) or tuple(strides) != (1, 1) or any(pads)
            or channel_major(w, groups) or x.dtype.kind != "f"):
        return lambda x: conv2d_float(x, w, b, layout, strides, pads, dilations, groups)
    wm = gemm_weights(w, 1, x.dtype)[0]
    n, h, wd, _ = to_nhwc(x, layout).shape
    p = h * wd

    def run(x: np.ndarray) -> np.ndarray:
        xn = to_nhwc(x, layout)
        out = np.empty((n, h, wd, o), x.dtype)
        for i in range(n):                  # as grouped_gemm_nhwc: image by image
            np.matmul(xn[i:i + 1].reshape(p, cg), wm, out=out[i].reshape(p, o))
        if b is not None:
            out += b
        return from_nhwc(out, layout)
    return run


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
