"""The golden model's native kernels (bevir/ops/native): the same bits as the numpy code
they stand in for, special values included, and the numpy code where they cannot build."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import Builder, TensorType
from bevir.ir.types import Layout
from bevir.ops import linalg, native
from bevir.ops.linalg import conv2d_nhwc

# (channels, channel multiplier, kernel, stride, dilation, pads): channel counts below,
# between and above the kernel's vector widths (4 float64 / 8 float32 lanes, 4 vectors)
CASES = [
    (3, 1, 3, 1, 1, (1, 1, 1, 1)),
    (37, 1, 3, 2, 1, (1, 1, 1, 1)),
    (72, 1, 5, 2, 1, (2, 2, 2, 2)),
    (20, 1, 3, 1, 2, (2, 2, 2, 2)),
    (16, 2, 3, 2, 1, (0, 1, 1, 0)),
    (9, 1, 1, 2, 1, (0, 0, 0, 0)),
    (40, 1, 7, 1, 1, (3, 3, 3, 3)),
]


def depthwise(x, w, case, native_on: bool, monkeypatch):
    ch, mult, k, s, d, pads = case
    monkeypatch.setenv("BEVIR_NATIVE", "1" if native_on else "0")
    return conv2d_nhwc(x, w, (s, s), pads, (d, d), groups=ch)


def operands(case, dtype, rng, special: bool = False):
    ch, mult, k, *_ = case
    x = rng.standard_normal((2, 11, 13, ch)).astype(dtype)
    w = rng.standard_normal((ch * mult, 1, k, k)).astype(dtype)
    if special:     # IEEE corner values: infinities, signed zeros, tiny and huge products
        flat = x.reshape(-1)
        flat[::7], flat[3::11], flat[5::13] = np.inf, -0.0, 1e-30
        flat[1::17] = -np.inf
        w.reshape(-1)[::5] = -0.0
        w.reshape(-1)[2::9] = np.finfo(dtype).max / 4
    return x, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_native_depthwise_bits_are_numpys(case, dtype, monkeypatch):
    assert native.library() is not None, "the native kernels build on the test machines"
    rng = np.random.default_rng(len(case[5]) + case[0])
    for special in (False, True):
        x, w = operands(case, dtype, rng, special)
        with np.errstate(invalid="ignore", over="ignore"):
            fast = depthwise(x, w, case, True, monkeypatch)
            slow = depthwise(x, w, case, False, monkeypatch)
        assert fast.dtype == slow.dtype and fast.shape == slow.shape
        # NaNs (inf * 0, inf - inf) compare by position; every other value by its bits
        nan = np.isnan(slow)
        assert np.array_equal(np.isnan(fast), nan)
        bits = fast.view(f"u{fast.itemsize}") != slow.view(f"u{slow.itemsize}")
        assert not (bits & ~nan).any(), f"{int((bits & ~nan).sum())} elements differ"
        assert special == nan.any() or not special


@pytest.mark.parametrize("xdtype, native_runs", [(np.float16, True), (np.int16, True),
                                                  (np.int32, False)])
def test_native_only_where_numpy_multiplies_in_the_out_dtype(xdtype, native_runs, monkeypatch):
    """numpy multiplies int32 by float32 in float64 and rounds once more into a float32
    out: the numpy path keeps that case; float16 and int16 convert to float32 exactly."""
    calls = []
    real = native.depthwise
    monkeypatch.setattr(native, "depthwise", lambda *a: calls.append(a) or real(*a))
    xp = np.arange(2 * 6 * 6 * 3).reshape(2, 6, 6, 3).astype(xdtype)
    w = np.linspace(-1, 1, 27, dtype=np.float32).reshape(3, 1, 3, 3)
    out = np.empty((2, 4, 4, 3), np.float32)
    linalg.depthwise_conv_nhwc(xp, w, (1, 1), (1, 1), out)
    assert bool(calls) == native_runs
    monkeypatch.setenv("BEVIR_NATIVE", "0")
    want = np.empty_like(out)
    linalg.depthwise_conv_nhwc(xp, w, (1, 1), (1, 1), want)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


def test_no_compiler_runs_numpy_with_one_warning(monkeypatch, tmp_path):
    rng = np.random.default_rng(6)
    x, w = operands(CASES[2], np.float32, rng)
    want = depthwise(x, w, CASES[2], False, monkeypatch)
    monkeypatch.setenv("BEVIR_NATIVE", "1")
    monkeypatch.setenv("CC", "no-such-compiler-bevir")
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path))
    native.library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="native kernels did not build"):
            assert not native.enabled()
        got = depthwise(x, w, CASES[2], True, monkeypatch)
    finally:
        native.library.cache_clear()
    assert np.array_equal(got, want)


# (kernel, strides, pads, dilations, ceil_mode)
POOLS = [((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False), ((2, 3), (1, 2), (0, 1, 1, 0), (2, 1), True),
         ((3, 3), (3, 3), (0, 0, 0, 0), (1, 1), True), ((1, 1), (2, 2), (0, 0, 0, 0), (1, 1), False)]


@pytest.mark.parametrize("layout", [Layout.nhwc, Layout.nchw])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32])
@pytest.mark.parametrize("pool", POOLS, ids=str)
def test_native_maxpool_bits_are_numpys(pool, dtype, layout, monkeypatch):
    """Special values included: a NaN wins its windows, -0 against +0 as numpy's maximum."""
    kernel, strides, pads, dilations, ceil = pool
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal((2, 9, 11, 37)).astype(dtype)
        flat = x.reshape(-1)
        flat[::13], flat[5::17], flat[7::19], flat[3::23] = -0.0, 0.0, np.nan, -np.inf
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (2, 9, 11, 37), endpoint=True).astype(dtype)
    if layout is Layout.nchw:
        x = x.transpose(0, 3, 1, 2).copy()
    b = Builder("pool")
    y = b.maxpool2d(b.input("x", TensorType.of(x, layout)), kernel=kernel, strides=strides,
                    pads=pads, dilations=dilations, ceil_mode=ceil)
    b.output("y", y)
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        runs[on] = bevir.run(b.graph, {"x": x})["y"]
    assert runs["1"].dtype == runs["0"].dtype and runs["1"].shape == runs["0"].shape
    assert runs["1"].tobytes() == runs["0"].tobytes()
