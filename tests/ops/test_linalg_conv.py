"""The NHWC convolution kernels behind conv2d, qlinear_conv and fx_conv2d
(bevir/ops/kernels/conv.py): depthwise (a multiply-add per tap) and grouped GEMM, against a
direct sum over windows: float within rounding, integer codes exactly (also where the
reduction is split), float16 summed in float32, and the cached GEMM operands of
read-only KxK weights."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from bevir.ir.types import Layout
from bevir.ops.kernels import conv
from bevir.ops.kernels.conv import conv2d_nhwc
from bevir.ops.kernels.gemm import exact_chunk

# (channels, out channels, groups, kernel, stride, dilation, pads)
CASES = {
    "depthwise-3x3": (12, 12, 12, 3, 1, 1, (1, 1, 1, 1)),
    "depthwise-5x5-s2": (8, 8, 8, 5, 2, 1, (2, 2, 2, 2)),
    "depthwise-3x3-s2-asym": (8, 8, 8, 3, 2, 1, (0, 1, 1, 0)),
    "depthwise-dilated": (6, 6, 6, 3, 1, 2, (2, 2, 2, 2)),
    "depthwise-multiplier": (4, 8, 4, 3, 2, 1, (1, 1, 1, 1)),
    "depthwise-1x1": (6, 6, 6, 1, 2, 1, (0, 0, 0, 0)),
    "grouped-3x3": (16, 8, 4, 3, 1, 1, (1, 1, 1, 1)),
    "grouped-3x3-s2": (12, 12, 3, 3, 2, 1, (1, 0, 1, 1)),
    "grouped-1x1-padded": (8, 8, 2, 1, 1, 1, (1, 0, 0, 1)),
    "dense-3x3": (5, 7, 1, 3, 2, 2, (1, 2, 1, 0)),
}


def direct(x: np.ndarray, w: np.ndarray, stride: int, dilation: int, pads, groups: int):
    """The convolution of NHWC ``x`` with OIHW ``w``, summed window by window in x's dtype
    (int64 codes: exactly)."""
    n, h, wd, ch = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = pads
    xp = np.zeros((n, h + top + bottom, wd + left + right, ch), x.dtype)
    xp[:, top:top + h, left:left + wd] = x
    oh = (h + top + bottom - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + left + right - dilation * (kw - 1) - 1) // stride + 1
    og = o // groups
    out = np.zeros((n, oh, ow, o), x.dtype)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i * dilation: i * dilation + stride * (oh - 1) + 1: stride,
                     j * dilation: j * dilation + stride * (ow - 1) + 1: stride]
            for oc in range(o):
                g = oc // og
                out[..., oc] += win[..., g * cg:(g + 1) * cg] @ w[oc, :, i, j]
    return out


def operands(case: str, rng, make):
    ch, o, groups, k, _, _, _ = CASES[case]
    return make((2, 9, 8, ch)), make((o, ch // groups, k, k))


def run(case: str, x, w, **kw):
    _, _, groups, _, stride, dilation, pads = CASES[case]
    return conv2d_nhwc(x, w, (stride, stride), pads, (dilation, dilation), groups, **kw)


def reference(case: str, x, w):
    _, _, groups, _, stride, dilation, pads = CASES[case]
    return direct(x, w, stride, dilation, pads, groups)


@pytest.mark.parametrize("case", CASES)
def test_float_within_rounding(case):
    rng = np.random.default_rng(0)
    x, w = operands(case, rng, lambda s: rng.standard_normal(s).astype(np.float32))
    y = run(case, x, w)
    ref = reference(case, x.astype(np.float64), w.astype(np.float64))
    assert y.dtype == np.float32 and y.shape == ref.shape
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("acc,chunk", [(np.float32, exact_chunk(128 * 128)),
                                       (np.float32, 2), (np.float64, None)],
                         ids=["f32", "f32-split", "f64"])
def test_integer_codes_exact(case, acc, chunk):
    """int8 codes: float32 sums of at most ``chunk`` products, float64 when the reduction
    is split (chunk 2), or float64 throughout (fx_conv2d): every result exact."""
    rng = np.random.default_rng(1)
    x, w = operands(case, rng, lambda s: rng.integers(-128, 128, s).astype(np.float32))
    y = run(case, x, w, acc_dtype=acc, chunk=chunk)
    k = w[0].size
    assert y.dtype == (np.float64 if acc is np.float64 or k > chunk else np.float32)
    assert np.array_equal(y, reference(case, x.astype(np.int64), w.astype(np.int64)))


@pytest.mark.parametrize("case", ["depthwise-3x3", "depthwise-5x5-s2"])
def test_float16_depthwise_sums_in_float32(case):
    """Rounded once at the end, as numpy's float16 matmul does, not at every tap."""
    rng = np.random.default_rng(2)
    x, w = operands(case, rng, lambda s: rng.standard_normal(s).astype(np.float16))
    y = run(case, x, w)
    assert y.dtype == np.float16
    wide = run(case, x.astype(np.float32), w.astype(np.float32))
    assert np.array_equal(y, wide.astype(np.float16))


@pytest.mark.parametrize("case", ["grouped-3x3", "dense-3x3"])
def test_read_only_weights_cache_their_gemm_operand(case):
    """A read-only KxK weight (a graph constant) keeps its reordered GEMM matrix while it
    lives; the results are those of a writable copy, in either accumulator dtype."""
    rng = np.random.default_rng(3)
    x, w = operands(case, rng, lambda s: rng.integers(-128, 128, s).astype(np.float32))
    frozen = w.copy()
    frozen.setflags(write=False)
    for acc in (np.float32, np.float64, np.float32):
        assert np.array_equal(run(case, x, frozen, acc_dtype=acc), run(case, x, w, acc_dtype=acc))
    assert id(frozen) in conv._GEMM_WEIGHTS and id(w) not in conv._GEMM_WEIGHTS
    key = id(frozen)
    del frozen
    gc.collect()
    assert key not in conv._GEMM_WEIGHTS


@pytest.mark.parametrize("layout", [Layout.nhwc, Layout.plain])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, hw, bias", [(1, 1, True), (2, 3, False), (2, 1, True)])
def test_prepared_pointwise_float_conv_gives_conv2d_floats_bits(layout, dtype, n, hw, bias,
                                                               monkeypatch):
    """A pointwise convolution prepared once (a squeeze-excitation's on a 1x1 map) runs its
    GEMM per image and bias add without conv2d_float, with its bits, on a C-ordered input
    and on a view in the other layout's memory order."""
    rng = np.random.default_rng(3)
    shape = (n, hw, hw, 24) if layout is Layout.nhwc else (n, 24, hw, hw)
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal((40, 24, 1, 1)).astype(dtype)
    b = rng.standard_normal(40).astype(dtype) if bias else None
    args = (layout, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    run = conv.conv2d_float_runner(x, w, b, *args)
    view = np.ascontiguousarray(x.transpose(0, 3, 1, 2) if layout is Layout.nhwc
                                else x.transpose(0, 2, 3, 1))
    view = view.transpose(0, 2, 3, 1) if layout is Layout.nhwc else view.transpose(0, 3, 1, 2)
    want = [conv.conv2d_float(a, w, b, *args) for a in (x, view)]
    monkeypatch.setattr(conv, "conv2d_float", None)          # the prepared path only
    for a, expected in zip((x, view), want):
        got = run(a)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
