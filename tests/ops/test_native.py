"""The golden model's native kernels (bevir/ops/native): the same numbers, bit for bit, as
the numpy code they stand in for, special values included; and the numpy code, after one
warning, wherever they cannot build, load or pass their self-check."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import bevir
from bevir import Builder, Interpreter, TensorType
from bevir.ir.opdef import Ctx, get_op
from bevir.ir.types import Layout
from bevir.ops import native
from bevir.ops.common import conv_out_size
from bevir.ops.kernels import conv, fma
from bevir.ops.kernels.conv import conv2d_nhwc
from bevir.ops.kernels.products import linear_runner
from tests.e2e_digests import platform_key

# (channels, channel multiplier, kernel, strides, dilations, pads): channel counts below,
# between and above the kernels' vector widths (4 float64 / 8 float32 lanes, 4 vectors);
# kernels, strides and dilations that differ between the axes
CASES = [
    (3, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (37, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (72, 1, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),
    (20, 1, (2, 3), (1, 2), (2, 1), (2, 2, 2, 2)),
    (16, 2, (3, 1), (2, 1), (1, 3), (0, 1, 1, 0)),
    (9, 1, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
    (40, 1, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
]


@pytest.fixture
def native_runs(monkeypatch):
    """The native kernels that ran, by name."""
    assert native.library() is not None, "the native kernels build on the test machines"
    names = []
    real = native._call
    monkeypatch.setattr(native, "_call",
                        lambda dll, name, *a: names.append(name) or real(dll, name, *a))
    return names


def depthwise(x, w, case, native_on: bool, monkeypatch):
    ch, _, _, strides, dilations, pads = case
    monkeypatch.setenv("BEVIR_NATIVE", "1" if native_on else "0")
    return conv2d_nhwc(x, w, strides, pads, dilations, groups=ch)


def operands(case, dtype, rng, special: bool = False):
    ch, mult, (kh, kw), *_ = case
    x = rng.standard_normal((2, 11, 13, ch)).astype(dtype)
    w = rng.standard_normal((ch * mult, 1, kh, kw)).astype(dtype)
    if special:     # IEEE corner values: infinities, signed zeros, tiny and huge products
        flat = x.reshape(-1)
        flat[::7], flat[3::11], flat[5::13] = np.inf, -0.0, 1e-30
        flat[1::17] = -np.inf
        w.reshape(-1)[::5] = -0.0
        w.reshape(-1)[2::9] = np.finfo(dtype).max / 4
    return x, w


def same_numbers(fast: np.ndarray, slow: np.ndarray) -> None:
    """Equal bits everywhere but at NaNs, which must sit in the same places (where two NaNs
    meet in an add, the compiler's operand order picks the sign that survives)."""
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    nan = np.isnan(slow)
    assert np.array_equal(np.isnan(fast), nan)
    bits = f"u{fast.itemsize}"
    differ = fast.view(bits) != slow.view(bits)
    assert not (differ & ~nan).any(), f"{int((differ & ~nan).sum())} elements differ"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_native_depthwise_bits_are_numpys(case, dtype, monkeypatch, native_runs, rng):
    for special in (False, True):
        x, w = operands(case, dtype, rng, special)
        with np.errstate(invalid="ignore", over="ignore"):
            fast = depthwise(x, w, case, True, monkeypatch)
            slow = depthwise(x, w, case, False, monkeypatch)
        same_numbers(fast, slow)
        if special:
            assert np.isnan(slow).any()
    assert native_runs and all(n.startswith("bevir_depthwise_") for n in native_runs)


@pytest.mark.parametrize("xdtype, native_runs_too", [(np.float16, True), (np.int16, True),
                                                     (np.int32, False)])
def test_native_only_where_numpy_multiplies_in_the_out_dtype(xdtype, native_runs_too,
                                                            monkeypatch, native_runs):
    """numpy multiplies int32 by float32 in float64 and rounds once more into a float32
    out: the numpy path keeps that case; float16 and int16 convert to float32 exactly."""
    xp = np.arange(2 * 6 * 6 * 3).reshape(2, 6, 6, 3).astype(xdtype)
    w = np.linspace(-1, 1, 27, dtype=np.float32).reshape(3, 1, 3, 3)
    out = np.empty((2, 4, 4, 3), np.float32)
    conv.depthwise_conv_nhwc(xp, w, (1, 1), (1, 1), out)
    assert bool(native_runs) == native_runs_too
    monkeypatch.setenv("BEVIR_NATIVE", "0")
    want = np.empty_like(out)
    conv.depthwise_conv_nhwc(xp, w, (1, 1), (1, 1), want)
    assert out.tobytes() == want.tobytes()


def test_windows_outside_the_input_are_refused():
    """The kernels read through raw pointers: sizes that would read past the input raise."""
    xp, wt = np.zeros((1, 4, 4, 8), np.float32), np.zeros((9, 8), np.float32)
    with pytest.raises(ValueError, match="do not make"):
        native.depthwise(xp, wt, np.empty((1, 3, 3, 8), np.float32), (3, 3), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="do not make"):
        conv.im2col_nhwc(xp, 3, 3, 2, 3, (1, 1), (1, 1))


# (kernel, strides, pads, dilations, ceil_mode)
POOLS = [((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
         ((2, 3), (1, 2), (0, 1, 1, 0), (2, 1), True),
         ((3, 3), (3, 3), (0, 0, 0, 0), (1, 1), True),
         ((1, 1), (2, 2), (0, 0, 0, 0), (1, 1), False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32])
@pytest.mark.parametrize("pool", POOLS, ids=str)
@pytest.mark.parametrize("channels", [37, 125])
def test_native_maxpool_bits_are_numpys(pool, dtype, channels, monkeypatch, native_runs, rng):
    """NHWC (NCHW stays numpy's); a NaN wins its windows, -0 meets +0 as in numpy's maximum.
    125 channels take every dtype through 64-byte, 32-byte and single-element steps."""
    kernel, strides, pads, dilations, ceil = pool
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal((2, 9, 11, channels)).astype(dtype)
        flat = x.reshape(-1)
        flat[::13], flat[5::17], flat[7::19], flat[3::23] = -0.0, 0.0, np.nan, -np.inf
        flat[11::29] = -np.nan
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (2, 9, 11, channels), endpoint=True).astype(dtype)
    b = Builder("pool")
    y = b.maxpool2d(b.input("x", TensorType.of(x, Layout.nhwc)), kernel=kernel,
                    strides=strides, pads=pads, dilations=dilations, ceil_mode=ceil)
    b.output("y", y)
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    assert native_runs == [f"bevir_maxpool_{native._SUFFIX[np.dtype(dtype)]}"]
    assert runs["1"].dtype == runs["0"].dtype and runs["1"].tobytes() == runs["0"].tobytes()


def numpy_after_one_warning(monkeypatch, match: str) -> None:
    """With the library rebuilt under the patched settings: one warning matching ``match``,
    and a convolution and a pooling that give the numpy path's results."""
    rng = np.random.default_rng(6)
    x, w = operands(CASES[2], np.float32, rng)
    want = depthwise(x, w, CASES[2], False, monkeypatch)
    monkeypatch.setenv("BEVIR_NATIVE", "1")
    native.library.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not native.enabled() and not native.enabled()
            got = depthwise(x, w, CASES[2], True, monkeypatch)
        messages = [str(c.message) for c in caught]
        assert len(messages) == 1 and "native kernels are off" in messages[0]
        assert match in messages[0]
    finally:
        native.library.cache_clear()
    assert got.tobytes() == want.tobytes()


def test_no_compiler_runs_numpy(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-compiler-bevir")
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path))
    numpy_after_one_warning(monkeypatch, "no-such-compiler-bevir")


def test_unusable_cache_runs_numpy(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path / "file"))
    numpy_after_one_warning(monkeypatch, "file")


def test_kernel_that_fails_its_self_check_runs_numpy(monkeypatch, tmp_path):
    """A max pooling that lets the first operand win ties (as numpy's scalar loop does on
    other processors) differs at maximum(-0, +0): the self-check turns the kernels off."""
    source = native.SOURCE.read_text()
    assert "(m > v) | (m != m)" in source
    mutant = tmp_path / "kernels.c"
    mutant.write_text(source.replace("(m > v) | (m != m)", "(m >= v) | (m != m)"))
    monkeypatch.setattr(native, "SOURCE", mutant)
    monkeypatch.setenv("BEVIR_CACHE", str(tmp_path))
    numpy_after_one_warning(monkeypatch, "maxpool (float32) differs from numpy")


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_gather_mac_wraps_as_numpy_int32(dtype, native_runs, rng):
    """fx_ms_deform_attn's sampling: the native gather and multiply-accumulate gives
    numpy's int32 results, wrap-around included (weights near 2**31)."""
    info = np.iinfo(dtype)
    v = rng.integers(info.min, info.max, (50, 11), endpoint=True).astype(dtype)
    idx = rng.integers(0, 50, (3, 7, 4))
    cw = rng.integers(-2**31, 2**31, (3, 7, 4)).astype(np.int32)
    acc = rng.integers(-2**31, 2**31, (3, 7, 11)).astype(np.int32)
    want = acc.copy()
    with np.errstate(over="ignore"):
        for p in range(4):
            want += v[idx[..., p]].astype(np.int32) * cw[..., p, None]
    assert native.gather_mac(v, idx, cw, acc)          # True: the native kernel ran
    assert acc.tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="do not fit"):
        native.gather_mac(v, idx + 50, cw, acc)
    frozen = acc.copy()
    frozen.setflags(write=False)
    assert not native.gather_mac(v, idx, cw, frozen)                  # numpy's path raises there
    assert not native.gather_mac(v, idx.astype(np.float64), cw, acc)  # and for float indices


needs_vnni = pytest.mark.skipif(not native.has_vnni(),
                                reason="no AVX512-VNNI here")


@needs_vnni
@pytest.mark.parametrize("codes, zero_point", [(np.uint8, 0), (np.uint8, 131), (np.int8, 0),
                                               (np.int8, -7)])
@pytest.mark.parametrize("m, k, n", [(1, 2, 1), (5, 9, 17), (4, 64, 32), (37, 300, 40),
                                     (9, 2304, 70)])
def test_u8s8_gemm_is_the_exact_integer_product(codes, zero_point, m, k, n, rng):
    """Ragged rows (4 per tile), reductions (4 per lane) and columns (16 per vector), and
    every code and weight extreme: (codes - zero_point) @ w, exactly."""
    info = np.iinfo(codes)
    x = rng.integers(info.min, info.max, (m, k), endpoint=True).astype(codes)
    w = rng.integers(-128, 127, (k, n), endpoint=True).astype(np.float32)
    x.reshape(-1)[:2], w.reshape(-1)[:2] = (info.min, info.max), (-128, 127)
    gemm = native.U8S8Gemm.of(w, x.dtype, zero_point)
    want = (x.astype(np.int64) - zero_point) @ w.astype(np.int64)
    assert gemm is not None and np.array_equal(gemm(x), want)


def test_u8s8_gemm_declines_what_it_cannot_take(monkeypatch):
    w = np.ones((8, 3), np.float32)
    assert native.U8S8Gemm.of(w * 128, np.uint8, 0) is None          # weight out of s8
    assert native.U8S8Gemm.of(w * 0.5, np.uint8, 0) is None          # not integers
    assert native.U8S8Gemm.of(w, np.int16, 0) is None                 # 16-bit codes
    assert native.U8S8Gemm.of(w, np.uint8, np.array([1, 2, 3])) is None   # zero point per column
    assert native.U8S8Gemm.of(w, np.uint8, 256) is None               # codes - zp past 255
    assert native.U8S8Gemm.of(w, np.int8, -129) is None
    gemm = native.U8S8Gemm.of(w, np.uint8, np.array([3]))              # one zero point, any shape
    if gemm is not None:
        with pytest.raises(ValueError, match="columns"):
            gemm(np.ones((2, 1), np.uint8))
    monkeypatch.setenv("BEVIR_NATIVE", "0")
    assert native.U8S8Gemm.of(w, np.uint8, 0) is None


# ---- FMA products: conv2d through native.GatherGemm where BLAS sums by FMA steps too ----
# (layout, NCHW dims, out channels, kernel, strides, dilations, pads, groups)
FMA_CASES = [
    (Layout.nhwc, (1, 3, 40, 36), 24, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),   # a stem
    (Layout.plain, (2, 3, 33, 30), 16, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3), 1),
    (Layout.nhwc, (1, 20, 12, 14), 40, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),
    (Layout.nhwc, (1, 48, 14, 14), 48, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1),
    (Layout.plain, (1, 24, 9, 11), 33, (2, 3), (1, 2), (2, 1), (0, 1, 2, 0), 1),
    (Layout.nhwc, (1, 32, 10, 10), 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 2),
    (Layout.nhwc, (1, 48, 10, 10), 48, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 6),
    # a reduction of 576 (BLAS sums it in blocks), and a dilated one whose outer taps read
    # only padding (left out)
    (Layout.nhwc, (1, 64, 10, 10), 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1),
    (Layout.nhwc, (1, 96, 6, 6), 64, (3, 3), (1, 1), (7, 7), (7, 7, 7, 7), 1),
]


def both_ways(monkeypatch, graph, feed: dict, out: str = "y") -> dict[str, np.ndarray]:
    """``graph``'s result ``out`` with the native kernels ("1") and with numpy's code ("0")."""
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        with np.errstate(invalid="ignore", over="ignore"):
            runs[on] = bevir.run(graph, feed)[out]
    return runs


def count_calls(monkeypatch, *kernels: str) -> list[str]:
    """The names of the native library's ``kernels`` as they are called."""
    calls, dll = [], native.library()
    for name in kernels:
        real = getattr(dll, name)
        monkeypatch.setattr(dll, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    return calls


@pytest.fixture
def fma_runs(monkeypatch):
    """The native FMA products that ran."""
    return count_calls(monkeypatch, "bevir_gather_gemm_f32")


def conv_graph(case, rng, special: bool = False):
    layout, (n, c, h, w), o, kernel, strides, dilations, pads, groups = case
    x = rng.standard_normal((n, h, w, c) if layout is Layout.nhwc else (n, c, h, w))
    wt = rng.standard_normal((o, c // groups, *kernel))
    if special:
        x.reshape(-1)[::7], x.reshape(-1)[3::11], wt.reshape(-1)[::5] = np.inf, -0.0, -0.0
        wt.reshape(-1)[2::9] = 1e30
    x, wt = x.astype(np.float32), wt.astype(np.float32)
    b = Builder("conv")
    y = b.conv2d(b.input("x", TensorType.of(x, layout)), b.const(wt),
                 b.const(rng.standard_normal(o).astype(np.float32)), strides=strides,
                 pads=pads, dilations=dilations, groups=groups)
    b.output("y", y)
    return b.graph, x


@pytest.mark.parametrize("special", [False, True], ids=["normal", "special"])
@pytest.mark.parametrize("case", FMA_CASES, ids=str)
def test_fma_conv_bits_are_numpys(case, special, monkeypatch, fma_runs, rng):
    """Native or not, the same bits (a NaN by its place): the native product runs only
    where native.agrees found BLAS to sum the same way (OpenBLAS does for the stems; not in
    the tail columns of some widths, nor with 8 channels a group, here)."""
    graph, x = conv_graph(case, rng, special)
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        bevir.run(graph, {"x": x})              # the first run of a shape checks the kernel
        fma_runs.clear()
        runs[on] = bevir.run(graph, {"x": x})["y"]
        if (on == "1" and case in FMA_CASES[:2] + FMA_CASES[-2:]
                and "openblas SkylakeX" in platform_key()):
            assert fma_runs, "the stems, the blocked and the dilated products run natively"
    nan = np.isnan(runs["0"])
    assert np.array_equal(np.isnan(runs["1"]), nan)
    assert runs["1"][~nan].tobytes() == runs["0"][~nan].tobytes()


def test_agrees_tells_another_summation_order_apart(rng):
    """A product summed in reverse order is found out in one trial, and the verdict kept."""
    a, b = rng.standard_normal((30, 40)).astype(np.float32), rng.standard_normal((40, 20))
    b = b.astype(np.float32)
    calls = []

    def reversed_sum(a, b):
        calls.append(1)
        return np.matmul(a[:, ::-1].copy(), b[::-1].copy())

    key = ("reversed", a.shape, b.shape)
    assert not native.agrees(key, reversed_sum, np.matmul, (a, b))
    assert not native.agrees(key, reversed_sum, np.matmul, (a, b)) and len(calls) == 1
    assert native.agrees(("same", a.shape, b.shape), np.matmul, np.matmul, (a, b))
    assert not native.agrees(("cannot", a.shape), lambda *_: None, np.matmul, (a, b))


def test_agrees_tries_operands_laid_out_as_given(rng):
    """BLAS sums a transposed matrix in another order than a C-ordered one: the trial
    operands keep the strides of ``like`` (a transposed weight stays transposed), so a
    native product that sums as BLAS does on C-ordered operands is not taken for one that
    sums as BLAS does on the transposed view (a linear layer's weight, trans_b)."""
    a = rng.standard_normal((16, 32)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    like = native.random_like(w.T, np.random.default_rng(0))
    assert like.strides == w.T.strides and like.shape == w.T.shape
    assert np.matmul(a, w.T).tobytes() != np.matmul(a, np.ascontiguousarray(w.T)).tobytes()
    key = ("contiguous-order", a.shape, w.T.shape, "transposed")
    assert not native.agrees(key, lambda a, w: np.matmul(a, np.ascontiguousarray(w)),
                             np.matmul, (a, w.T))


def test_a_linear_layer_on_a_transposed_weight_has_gemms_bits(rng):
    """matmul_act with trans_b (what fuse-linear-activation makes of gemm + relu) gives
    gemm's bits, natively or not."""
    a = rng.standard_normal((16, 32)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    w.flags.writeable = False
    run = linear_runner(a, w.T, None)
    want = np.matmul(a, w.T)
    assert run is None or run(a).tobytes() == want.tobytes()


def test_agrees_tells_orders_apart_on_a_product_of_two_results():
    """A product of 2 results (a squeeze-excitation's 1x1 convolution on a 1x1 map) whose
    reduction is summed in halves: one trial's 2 results round alike by chance for about
    one reduction length in 15; as many trials as it takes to compare 256 results find out
    every one."""
    def halves(a, b):
        k = a.shape[1] // 2
        return a[:, :k] @ b[:k] + a[:, k:] @ b[k:]
    for k in range(8, 129):
        like = [np.zeros((1, k), np.float32), np.zeros((k, 2), np.float32)]
        assert not native.agrees(("halves", k), halves, np.matmul, like), k


def test_gather_gemm_refuses_offsets_outside_its_operand():
    with pytest.raises(ValueError, match="outside the 12 elements"):
        native.GatherGemm(np.array([0, 8]), np.array([0, 1, 4]), 12, 3)
    with pytest.raises(ValueError, match="outside"):
        native.GatherGemm(np.array([0, 2]), np.array([0, 1]), 12, 3, groups=3, group_stride=5)
    gemm = native.GatherGemm(np.array([0, 3]), np.array([0, 1, 2]), 6, 2)
    with pytest.raises(ValueError, match="operands"):
        gemm(np.zeros(7, np.float32), np.zeros((1, 3, 2), np.float32), None,
             np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("shape, size, mode", [
    ((1, 14, 14, 21), (1, 56, 60, 21), "half_pixel"),
    ((1, 1, 1, 256), (1, 5, 5, 256), "pytorch_half_pixel"),
    ((2, 5, 7, 9), (2, 11, 3, 9), "align_corners"),
    ((1, 9, 9, 16), (1, 20, 20, 16), "asymmetric"),
])
def test_native_bilinear_resize_bits_are_numpys(shape, size, mode, monkeypatch, rng):
    """Channels last: one native pass, the same products and sums (NaNs and infinities
    in their places)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::13], x.reshape(-1)[5::17], x.reshape(-1)[7::19] = np.nan, np.inf, -0.0
    b = Builder("resize")
    b.output("y", b.resize(b.input("x", TensorType.of(x, Layout.nhwc)), size=size,
                           mode="linear", coordinate_transformation_mode=mode))
    calls = []
    real = native.resize_bilinear
    monkeypatch.setattr(native, "resize_bilinear", lambda *a: calls.append(real(*a)) or calls[-1])
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    assert calls == [True, False] and runs["1"].shape == runs["0"].shape == size
    nan = np.isnan(runs["0"])
    assert np.array_equal(np.isnan(runs["1"]), nan)
    assert runs["1"][~nan].tobytes() == runs["0"][~nan].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16])
@pytest.mark.parametrize("shape, to", [((2, 3, 40, 36), "nhwc"), ((1, 21, 30, 40), "nhwc"),
                                       ((2, 40, 36, 3), "plain"), ((1, 30, 40, 21), "nchw")])
def test_native_layout_transform_moves_the_same_bits(shape, to, dtype, monkeypatch, rng):
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    layout = Layout.nhwc if to != "nhwc" else Layout.plain
    b = Builder("move")
    b.output("y", b.layout_transform(b.input("x", TensorType.of(x, layout)), to=to))
    calls = []
    real = native.swap_last_axes
    monkeypatch.setattr(native, "swap_last_axes", lambda a: calls.append(real(a)) or calls[-1])
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    assert calls[0] is not None and calls[1] is None
    perm = (0, 2, 3, 1) if to == "nhwc" else (0, 3, 1, 2)
    assert runs["1"].tobytes() == runs["0"].tobytes() == x.transpose(perm).tobytes()


@pytest.mark.parametrize("act", [{"activation": "relu"},
                                 {"activation": "clip", "clip_min": 0.0, "clip_max": 6.0},
                                 {"activation": "hardsigmoid", "alpha": 0.2, "beta": 0.5},
                                 {"activation": "hardswish"}], ids=lambda a: a["activation"])
def test_native_fused_activation_bits_are_numpys(act, monkeypatch, rng):
    """A linear layer's activation natively, with its product or in one pass in place: the
    same bits (-0, NaN and infinities in the products included)."""
    a = rng.standard_normal((37, 24)).astype(np.float32) * 4
    a.reshape(-1)[::11], a.reshape(-1)[3::13], a.reshape(-1)[5::17] = np.nan, -0.0, np.inf
    w = rng.standard_normal((24, 40)).astype(np.float32)
    w[:, ::9] = 0.0                         # whole columns of zero products: -0 and +0
    b = Builder("act")
    b.output("y", b.matmul_act(b.input("a", TensorType.of(a)), b.const(w), **act))
    ran = count_calls(monkeypatch, "bevir_gather_gemm_f32", "bevir_activation_f32")
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        with np.errstate(invalid="ignore"):
            bevir.run(b.graph, {"a": a})          # the first run of a shape checks the kernel
            ran.clear()
            runs[on] = bevir.run(b.graph, {"a": a})["y"]
        # natively: the activation in the product's call (or in its own where BLAS sums the
        # product otherwise); else none of them
        assert ran in ([["bevir_gather_gemm_f32"], ["bevir_activation_f32"]] if on == "1"
                       else [[]])
    nan = np.isnan(runs["0"])
    assert np.array_equal(np.isnan(runs["1"]), nan)
    assert runs["1"][~nan].tobytes() == runs["0"][~nan].tobytes()


@pytest.mark.parametrize("op, attrs", [("relu", {}), ("hardswish", {}),
                                       ("clip", {"min": 0.0, "max": 6.0})], ids=str)
def test_native_activation_of_a_transposed_view_runs_in_memory_order(op, attrs, rng):
    """An NHWC view of NCHW memory (neither C- nor F-contiguous) activated in place, in
    its memory's order: the bits of the op's numpy code on the view."""
    y = (rng.standard_normal((2, 5, 7, 19)) * 4).astype(np.float32)
    y.reshape(-1)[::11], y.reshape(-1)[3::13] = np.nan, -0.0
    view = y.transpose(0, 2, 3, 1)
    with np.errstate(invalid="ignore"):
        want = get_op(op).compute(Ctx(attrs), view.copy())
        assert native.activation(op, attrs, view)
    assert view.tobytes() == np.ascontiguousarray(want).tobytes()
    assert not native.activation(op, attrs, y[:, :, ::2])       # not one block: refused


# (layout, NCHW dims, out channels, kernel, strides, dilations, pads, groups): depthwise
# ones (one pass with the bias and the activation), a stem and a pointwise FMA product
ACT_CASES = [
    (Layout.nhwc, (2, 37, 11, 13), 37, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 37),
    (Layout.plain, (1, 24, 9, 12), 24, (5, 5), (1, 1), (2, 1), (4, 2, 4, 2), 24),
    (Layout.nhwc, (1, 3, 40, 36), 24, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1),
    (Layout.nhwc, (1, 48, 14, 14), 48, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1),
    # a stem of many output channels: numpy's channel-major result, an NHWC view
    (Layout.nhwc, (1, 3, 23, 21), 64, (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), 1),
]


@pytest.mark.parametrize("act", [{"activation": "none"}, {"activation": "relu"},
                                 {"activation": "clip", "clip_min": 0.0, "clip_max": 6.0},
                                 {"activation": "hardswish"}], ids=lambda a: a["activation"])
@pytest.mark.parametrize("case", ACT_CASES, ids=str)
def test_native_conv_with_activation_bits_are_numpys(case, act, monkeypatch, rng):
    """conv2d_act: the product, its bias and its activation natively (in one call where the
    kernels take all three), the same bits as the numpy path."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")         # one call, not bands
    ran = count_calls(monkeypatch, "bevir_depthwise_conv_f32", "bevir_activation_f32")
    runs = conv_act_runs(case, act, monkeypatch, rng, ran)
    if case[-1] > 1:
        assert ran == ["bevir_depthwise_conv_f32"]       # bias and activation with it
    same_numbers(runs["1"], runs["0"])


@pytest.mark.parametrize("act", [{"activation": "none"}, {"activation": "relu"}],
                         ids=lambda a: a["activation"])
@pytest.mark.parametrize("case", ACT_CASES + FMA_CASES, ids=str)
def test_native_products_in_bands_on_threads_bits_are_numpys(case, act, monkeypatch, rng):
    """With threads, the native products and depthwise convolutions run in bands of output
    rows, one a thread (a stem's result written channel by channel, its activation after):
    the same bits as the numpy path."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    monkeypatch.setattr(native, "PARALLEL_WORK", 1)
    ran = count_calls(monkeypatch, "bevir_depthwise_conv_f32", "bevir_gather_gemm_f32")
    runs = conv_act_runs(case, act, monkeypatch, rng, ran)
    assert len(ran) != 1, "in bands (of 6 rows and more), or numpy's path"
    same_numbers(runs["1"], runs["0"])


# (H, W, channels, kernel, strides, dilations, pads): depthwise convolutions whose windows
# leave the input: asymmetric pads, pads wider than the map, a dilated kernel larger than
# it, channels past a vector and a partial one, a 1x1 map, output columns of no interior
PADDED_DEPTHWISE = [
    (9, 11, 37, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (8, 7, 21, (5, 5), (2, 2), (1, 1), (2, 1, 3, 0)),
    (6, 5, 16, (3, 3), (2, 1), (3, 2), (4, 4, 4, 4)),
    (1, 1, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (4, 12, 3, (1, 7), (1, 3), (1, 1), (0, 3, 0, 3)),
    (5, 2, 24, (3, 5), (1, 1), (2, 1), (3, 2, 1, 2)),
    # few channels: a half vector (4 lanes), alone or after whole ones, then single lanes
    (9, 10, 4, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (9, 10, 6, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (7, 9, 12, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (7, 9, 30, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
]


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("case", PADDED_DEPTHWISE, ids=str)
def test_native_depthwise_reads_the_padding_in_place_with_numpys_bits(case, threads,
                                                                      monkeypatch, rng):
    """A depthwise conv2d natively reads its padding's zeros without a padded copy: each
    padding tap's product 0 * w computed as the copy's (-0, and a NaN with an infinite
    weight), the same bits as the numpy path on the padded copy, on one thread or in
    bands of rows on three."""
    h, w, c, kernel, strides, dilations, pads = case
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    monkeypatch.setattr(native, "PARALLEL_WORK", 1)
    x = (rng.standard_normal((2, h, w, c)) * 4).astype(np.float32)
    x.reshape(-1)[::13], x.reshape(-1)[5::17], x.reshape(-1)[7::19] = np.nan, -np.inf, -0.0
    wt = rng.standard_normal((c, 1, *kernel)).astype(np.float32)
    wt.reshape(-1)[3::29], wt.reshape(-1)[4::31] = np.inf, -0.0
    b = Builder("depthwise")
    b.output("y", b.conv2d(b.input("x", TensorType.of(x, Layout.nhwc)), b.const(wt),
                           b.const(rng.standard_normal(c).astype(np.float32)),
                           strides=strides, pads=pads, dilations=dilations, groups=c))
    ran = count_calls(monkeypatch, "bevir_depthwise_conv_f32")
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    same_numbers(runs["1"], runs["0"])
    assert ran, "the native kernel ran"


def conv_act_runs(case, act, monkeypatch, rng, ran: list[str]) -> dict[str, np.ndarray]:
    """The results of a conv2d_act of ``case`` with activation ``act`` on special values,
    native kernels on ("1") and off ("0"), each the second run of its graph (the first
    checks the kernels; ``ran`` is cleared before the second)."""
    layout, (n, c, h, w), o, kernel, strides, dilations, pads, groups = case
    x = rng.standard_normal((n, h, w, c) if layout is Layout.nhwc else (n, c, h, w))
    x = (x * 4).astype(np.float32)
    x.reshape(-1)[::13], x.reshape(-1)[5::17] = np.nan, -np.inf
    b = Builder("conv_act")
    b.output("y", b.conv2d_act(
        b.input("x", TensorType.of(x, layout)),
        b.const(rng.standard_normal((o, c // groups, *kernel)).astype(np.float32)),
        b.const(rng.standard_normal(o).astype(np.float32)), strides=strides, pads=pads,
        dilations=dilations, groups=groups, **act))
    runs = {}
    for on in ("0", "1"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        with np.errstate(invalid="ignore"):
            bevir.run(b.graph, {"x": x})
            ran.clear()
            runs[on] = bevir.run(b.graph, {"x": x})["y"]
    return runs


def test_taps_in_the_padding_are_left_out_only_with_finite_weights(monkeypatch, rng):
    """A dilation of 7 on a 6x6 map: only the centre tap reads the input. Its product
    alone gives the same bits; an infinite weight on an outer tap (0 * inf is a NaN)
    keeps every tap."""
    x = rng.standard_normal((1, 6, 6, 96)).astype(np.float32)
    w = rng.standard_normal((64, 96, 3, 3)).astype(np.float32)
    args = (Layout.nhwc, (1, 1), (7, 7, 7, 7), (7, 7), 1)
    live = fma.live_taps(x.shape, Layout.nhwc, (6, 6), (3, 3), (1, 1), (7, 7, 7, 7),
                            (7, 7), 96, False)
    assert live.tolist() == list(range(4 * 96, 5 * 96))       # tap (1, 1), its 96 channels
    for weights in (w, np.where(np.arange(9).reshape(3, 3) == 0, np.inf, w)):
        weights = weights.astype(np.float32)
        want = conv.conv2d_float(x, weights, None, *args)
        with np.errstate(invalid="ignore"):
            got = fma.conv2d_fma(x, weights, None, *args, blocked=True)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert got[~np.isnan(got)].tobytes() == want[~np.isnan(want)].tobytes()
    assert np.isnan(got).all()


@pytest.mark.parametrize("threads", ["1", "3"])
def test_native_gelu_bits_are_numpys(threads, monkeypatch, rng):
    """GELU's float64 arithmetic natively around numpy's exp: the same float32 bits, over
    more than a block, infinities, NaNs, -0 and subnormals included; on one thread or the
    blocks shared among three."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    x = (rng.standard_normal(3 * native.GELU_BLOCK + 5) * 3).astype(np.float32)
    x[::97], x[5::101], x[7::103], x[11::107], x[13::109] = np.nan, np.inf, -np.inf, -0.0, 1e-40
    b = Builder("gelu")
    b.output("y", b.gelu(b.input("x", TensorType.of(x))))
    ran = count_calls(monkeypatch, "bevir_gelu_erf_b_f32")
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    assert len(ran) == 4                       # one per block, with native kernels only
    nan = np.isnan(runs["0"])
    assert np.array_equal(np.isnan(runs["1"]), nan)
    assert runs["1"][~nan].tobytes() == runs["0"][~nan].tobytes()


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("op", ["sigmoid", "silu"])
def test_native_sigmoid_bits_are_numpys(op, threads, monkeypatch, rng):
    """Sigmoid and SiLU natively around numpy's exp: the same float32 bits, on one thread
    or the blocks shared among three."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    x = (rng.standard_normal(2 * native.GELU_BLOCK + 3) * 8).astype(np.float32)
    x[::97], x[5::101], x[7::103], x[11::107], x[13::109] = np.nan, np.inf, -np.inf, -0.0, 1e-40
    x[17::113], x[19::127] = 0.0, -100.0
    b = Builder(op)
    b.output("y", getattr(b, op)(b.input("x", TensorType.of(x))))
    ran = count_calls(monkeypatch, "bevir_sigmoid_b_f32")
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    assert len(ran) == 3                       # blocks of 2^16, or of a third of x
    nan = np.isnan(runs["0"])
    assert np.array_equal(np.isnan(runs["1"]), nan)
    assert runs["1"][~nan].tobytes() == runs["0"][~nan].tobytes()


@pytest.mark.parametrize("channels", [24, 40])
@pytest.mark.parametrize("layout", [Layout.plain, Layout.nhwc])
def test_native_results_lie_in_memory_as_numpys(layout, channels, monkeypatch, fma_runs, rng):
    """A reduction sums in the order of memory, so a native result must lie in memory as
    the numpy code's does: a 3-channel stem (numpy's result lies channel by channel: the
    native one transposed after, or written so) whose channels a layer norm then reduces,
    a GELU of a transposed view and its channel norm."""
    x = rng.standard_normal((1, 3, 64, 64) if layout is Layout.plain else (1, 64, 64, 3))
    x = x.astype(np.float32)
    b = Builder("stem_norm")
    y = b.conv2d(b.input("x", TensorType.of(x, layout)),
                 b.const(rng.standard_normal((channels, 3, 7, 7)).astype(np.float32)),
                 b.const(rng.standard_normal(channels).astype(np.float32)), strides=(4, 4),
                 pads=(3, 3, 3, 3))
    if layout is Layout.plain:
        y = b.transpose(y, perm=(0, 2, 3, 1))
    else:
        y = b.reshape(y, shape=(1, 16, 16, channels))
    y = b.layer_norm(b.gelu(b.transpose(b.layer_norm(y, axis=3), perm=(0, 3, 1, 2))), axis=1)
    b.output("y", y)
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        runs[on] = bevir.run(b.graph, {"x": x})["y"]
        if on == "1" and "openblas SkylakeX" in platform_key():
            assert fma_runs, "the stem runs natively"
    assert runs["1"].tobytes() == runs["0"].tobytes()


@pytest.mark.parametrize("m, k, n, trans_b", [((2, 49), 96, 384, False), ((50,), 768, 64, True),
                                              ((30,), 1000, 48, False), ((7,), 5, 3, True)])
def test_native_linear_bits_are_numpys(m, k, n, trans_b, monkeypatch, fma_runs, rng):
    """A linear layer with a weight (matmul_act): native FMA products (in BLAS's blocks of a
    long reduction) where they give numpy's bits, which they do here for all but the
    smallest."""
    a = rng.standard_normal(m + (k,)).astype(np.float32)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    b = Builder("linear")
    b.output("y", b.matmul_act(b.input("a", TensorType.of(a)), b.const(w),
                               b.const(rng.standard_normal(n).astype(np.float32)),
                               trans_b=trans_b, activation="relu"))
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        bevir.run(b.graph, {"a": a})
        fma_runs.clear()
        runs[on] = bevir.run(b.graph, {"a": a})["y"]
        if on == "1" and k > 5 and "openblas SkylakeX" in platform_key():
            assert fma_runs
    assert runs["1"].tobytes() == runs["0"].tobytes()


def test_contiguous_copies_a_transposed_layout_natively(rng):
    x = rng.standard_normal((2, 5, 40, 36)).astype(np.float32)
    for view in (x.transpose(0, 2, 3, 1), x.transpose(0, 3, 1, 2), x[:, :, ::2],
                 x.transpose(0, 2, 3, 1).transpose(0, 3, 1, 2)):
        got = native.contiguous(view)
        assert got.flags.c_contiguous and got.tobytes() == np.ascontiguousarray(view).tobytes()


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64])
def test_native_transposition_moves_the_same_bits_for_any_row_count(dtype, rng):
    """Up to 8 rows (each count its own case), more in tiles, few columns row by row; and
    compact (a channel shuffle's copy) through it."""
    from bevir.ops.shape import compact
    for shape in [(3, a, 1500) for a in range(1, 10)] + [(2, 40, 130), (1, 1500, 5),
                                                          (300, 2, 24)]:
        x = (rng.standard_normal(shape) * 50).astype(dtype)
        want = np.ascontiguousarray(x.swapaxes(1, 2)).tobytes()
        assert native.swap_last_axes(x).tobytes() == want
        assert compact(x.swapaxes(1, 2)).tobytes() == want


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("groups", [2, 3])
def test_native_grouped_im2col_copies_numpys_windows(case, groups, dtype, rng):
    """Group-major windows (a grouped convolution's GEMM operands) copied natively: the bits
    of numpy's copy of the strided view, for group widths below, at and above a vector."""
    from numpy.lib.stride_tricks import as_strided
    ch, _, kernel, strides, dilations, pads = case
    x = (rng.standard_normal((2, 9, 11, ch * groups)) * 50).astype(dtype)
    xp = conv.pad_nhwc(x, pads)
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    oh = conv_out_size(xp.shape[1], kh, sh, 0, dh)
    ow = conv_out_size(xp.shape[2], kw, sw, 0, dw)
    s0, s1, s2, s3 = xp.strides
    view = as_strided(xp, (groups, 2, oh, ow, kh, kw, ch),
                      (ch * s3, s0, s1 * sh, s2 * sw, s1 * dh, s2 * dw, s3))
    got = native.im2col(xp, kernel, (oh, ow), strides, dilations, groups)
    assert got.shape == view.shape and got.tobytes() == np.ascontiguousarray(view).tobytes()
    assert conv.im2col_nhwc(xp, kh, kw, oh, ow, strides, dilations, groups).tobytes() == \
        got.tobytes()


def test_without_avx512_the_products_stay_numpys(monkeypatch, fma_runs, rng):
    """A processor without AVX-512 (the FMA product's build returns -1 there): no native
    product runs, not even to probe BLAS's blocks, and the results are numpy's."""
    monkeypatch.setattr(native.library(), "avx512", False)
    # a shape of its own: a plan made before (with AVX-512) is kept per shape
    graph, x = conv_graph((Layout.nhwc, (1, 3, 22, 26), 16, (3, 3), (2, 2), (1, 1),
                           (1, 1, 1, 1), 1), rng)
    got = bevir.run(graph, {"x": x})["y"]
    monkeypatch.setenv("BEVIR_NATIVE", "0")
    assert not fma_runs and got.tobytes() == bevir.run(graph, {"x": x})["y"].tobytes()


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("shape", [(4, 1), (3, 7), (2, 8), (5, 9), (6, 40), (2, 3, 128),
                                   (1, 2, 3, 129), (7, 200), (3, 384), (2, 1000), (2, 3000)],
                         ids=str)
def test_native_layer_norm_bits_are_numpys(shape, threads, monkeypatch, rng):
    """layer_norm over the last axis natively (numpy's pairwise sums, below 8 elements, up to
    128 and above): the same bits as numpy's code, with and without scale and bias, with
    infinities, NaNs, -0 and subnormals, on one thread or in bands of rows on three."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    monkeypatch.setattr(native, "PARALLEL_WORK", 1)
    x = (rng.standard_normal(shape) * 5 + 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97], flat[5::101], flat[11::107], flat[13::109] = np.nan, np.inf, -0.0, 1e-40
    c = shape[-1]
    params = [rng.standard_normal(c).astype(np.float32) for _ in range(2)]
    ran = count_calls(monkeypatch, "bevir_layer_norm_f32")
    for scale, bias in [(None, None), tuple(params)]:
        b = Builder("layer_norm")
        b.output("y", b.layer_norm(b.input("x", TensorType.of(x)),
                                   *(b.const(p) for p in (scale, bias) if p is not None)))
        runs = both_ways(monkeypatch, b.graph, {"x": x})
        same_numbers(runs["1"], runs["0"])
    assert ran, "the native kernel ran"


@pytest.mark.parametrize("layout", [Layout.nhwc, Layout.plain], ids=str)
@pytest.mark.parametrize("hw", [(1, 3), (2, 2), (3, 3), (80, 80), (5, 5)], ids=str)
def test_native_global_mean_bits_are_numpys(hw, layout, monkeypatch, rng):
    """global_avgpool natively (onnxruntime's four lanes, from +0 as numpy's reduce, the
    S % 4 tail): the same bits as numpy's code in either layout, fewer than four elements
    too, with infinities, NaNs, -0, subnormals, and all -0 channels (+0 means)."""
    c = 21
    x = (rng.standard_normal((2, *hw, c) if layout is Layout.nhwc else (2, c, *hw)) * 5
         ).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97], flat[5::101], flat[11::107], flat[13::109] = np.nan, np.inf, -0.0, 1e-40
    x[(..., slice(2)) if layout is Layout.nhwc else (slice(None), slice(2))] = -0.0
    ran = count_calls(monkeypatch, "bevir_global_mean_f32")
    b = Builder("pool")
    b.output("y", b.global_avgpool(b.input("x", TensorType.of(x, layout))))
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    same_numbers(runs["1"], runs["0"])
    assert ran, "the native kernel ran"


@pytest.mark.parametrize("case", [(Layout.nhwc, (2, 5, 7, 19)), (Layout.plain, (2, 19, 5, 7)),
                                  (Layout.plain, (3, 19)), (Layout.plain, (2, 19, 9))], ids=str)
def test_native_batch_norm_bits_are_numpys(case, monkeypatch, rng):
    """batch_norm natively in one pass: the same bits as numpy's four, channels last or
    not, with infinities, NaNs, -0, subnormals, a zero variance and float64 parameters."""
    layout, shape = case
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97], flat[5::101], flat[11::107], flat[13::109] = np.nan, np.inf, -0.0, 1e-40
    params = [rng.standard_normal(19) for _ in range(4)]
    params[3] = np.abs(params[3])
    params[3][2] = 0.0
    b = Builder("batch_norm")
    b.output("y", b.batch_norm(b.input("x", TensorType.of(x, layout)),
                               *(b.const(p.astype(np.float64 if i == 1 else np.float32))
                                 for i, p in enumerate(params)), epsilon=1e-3))
    ran = count_calls(monkeypatch, "bevir_batch_norm_f32")
    runs = both_ways(monkeypatch, b.graph, {"x": x})
    same_numbers(runs["1"], runs["0"])
    assert ran, "the native kernel ran"


def test_address_is_the_data_pointer_of_any_array():
    """native.address: the data pointer of a C-contiguous, a transposed, a sliced, a
    read-only and an empty array alike."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    frozen = a.copy()
    frozen.setflags(write=False)
    for v in (a, a.T, a[1:, 2:], frozen, np.zeros(0, np.float32), a[2]):
        assert native.address(v) == v.ctypes.data


@pytest.mark.parametrize("view", ["nhwc_of_nchw", "strided"])
@pytest.mark.parametrize("op", ["sigmoid", "silu"])
def test_native_sigmoid_of_a_view_lies_in_memory_as_numpys(op, view, monkeypatch, rng):
    """Sigmoid and SiLU of a view (a transposed convolution result, a strided slice): the
    same bits, in the same memory order (C order: numpy's x * sigmoid(x) takes the order of
    its C-ordered operand), as the numpy code's."""
    m = (rng.standard_normal((1, 40, 30, 36)) * 4).astype(np.float32)
    x = m.transpose(0, 2, 3, 1) if view == "nhwc_of_nchw" else m[:, ::2, 1:, ::3]
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("BEVIR_NATIVE", on)
        runs[on] = get_op(op).compute(Ctx({}), x)
    assert runs["1"].strides == runs["0"].strides
    same_numbers(runs["1"], runs["0"])


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float64, np.int16])
@pytest.mark.parametrize("axis, shapes", [
    (3, [(1, 5, 7, 4), (1, 5, 7, 4)]), (3, [(2, 3, 5, 12), (2, 3, 5, 1), (2, 3, 5, 7)]),
    (1, [(2, 3, 2, 2), (2, 4, 2, 2)]), (-1, [(6, 3), (6, 0), (6, 9)]),
    (0, [(2, 3), (4, 3)])])
def test_native_join_moves_numpys_bits(axis, shapes, dtype, monkeypatch, rng):
    """concat natively where the rows are short (runs of 1 byte to a few vectors, an
    empty operand among them), else numpy's: the bits of np.concatenate either way."""
    xs = [(rng.standard_normal(s) * 50).astype(dtype) for s in shapes]
    want = np.concatenate(xs, axis=axis)
    got = native.join(xs, axis)
    if axis == 0:
        assert got is None                       # one row: numpy's copy is as fast
        return
    assert got is not None and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    b = Builder("join")
    b.output("y", b.concat(*[b.input(f"x{i}", TensorType.of(x)) for i, x in enumerate(xs)],
                           axis=axis))
    runs = both_ways(monkeypatch, b.graph, {f"x{i}": x for i, x in enumerate(xs)})
    assert runs["1"].tobytes() == runs["0"].tobytes() == want.tobytes()


@pytest.mark.parametrize("threads", ["1", "3"])
@pytest.mark.parametrize("conv", [(37, 37, (3, 3), 37), (16, 40, (3, 3), 1), (24, 20, (1, 1), 1)],
                         ids=["depthwise", "3x3", "1x1"])
@pytest.mark.parametrize("reader", ["add_first", "add_second", "add_relu"])
def test_native_product_adds_its_reader_operand_in_its_pass_with_numpys_bits(
        conv, reader, threads, monkeypatch, rng):
    """A convolution whose result only an add reads takes the add's other operand into its
    kernel's pass (after the bias, before add_relu's relu), in bands on threads too: the
    bits of the two nodes run one after the other (a hook keeps them apart), special
    values included."""
    c, o, kernel, groups = conv
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
    monkeypatch.setattr(native, "PARALLEL_WORK", 1)
    h = 9 if threads == "1" else 8          # native.agrees decides once per shape
    x = (rng.standard_normal((2, h, 7, c)) * 4).astype(np.float32)
    other = (rng.standard_normal((2, h, 7, o)) * 4).astype(np.float32)
    for a in (x, other):
        a.reshape(-1)[::13], a.reshape(-1)[5::17], a.reshape(-1)[7::19] = np.nan, -np.inf, -0.0
    b = Builder("sum")
    xv, ov = (b.input(n, TensorType.of(a, Layout.nhwc)) for n, a in (("x", x), ("o", other)))
    y = b.conv2d(xv, b.const(rng.standard_normal((o, c // groups, *kernel)).astype(np.float32)),
                 b.const(rng.standard_normal(o).astype(np.float32)), groups=groups,
                 pads=(1, 1, 1, 1) if kernel == (3, 3) else (0, 0, 0, 0))
    b.output("y", b.add(ov, y) if reader == "add_first" else
             b.add(y, ov) if reader == "add_second" else b.add_relu(y, ov))
    from bevir.ops import linalg
    summed, real = [], linalg.conv2d_sum_runner
    monkeypatch.setattr(linalg, "conv2d_sum_runner",
                        lambda *a: summed.append(real(*a)) or summed[-1])
    with np.errstate(invalid="ignore"):
        joined = bevir.run(b.graph, {"x": x, "o": other})["y"]
        # native on one thread (a 3x3 product where BLAS sums as the FMA kernel does)
        assert summed[0] is not None or threads != "1" or kernel == (3, 3)
        apart = Interpreter(b.graph, on_node_start=lambda node, args: None).run(
            {"x": x, "o": other})["y"]
    same_numbers(joined, apart)
    assert np.isnan(joined).any()


def test_a_golden_run_that_splits_native_calls_holds_blas_to_one_thread(monkeypatch, rng):
    """BLAS's idle workers spin on the cores the native kernels' threads need: once a
    graph's run split a native call over threads, its later runs hold BLAS to the calling
    thread (not a graph whose runs split nothing, not on one thread, not with the native
    kernels off); runs at once share one hold; BLAS gets its threads back after the last
    one, a failed run's too."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    def graph(op: str):
        b = Builder(op)
        b.output("y", getattr(b, op)(b.input("x", TensorType.of(x["x"]))))
        return b.graph

    monkeypatch.setattr(native, "PARALLEL_WORK", 1)
    x = {"x": rng.standard_normal(2 * native.GELU_BLOCK).astype(np.float32)}
    seen: list[set[int]] = []
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas() == {2}
        for op, threads, switch, held in [("sigmoid", "2", "1", [{2}, {1}, {1}]),
                                          ("relu", "2", "1", [{2}] * 3),
                                          ("sigmoid", "1", "1", [{2}] * 3),
                                          ("sigmoid", "2", "0", [{2}] * 3)]:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", threads)
            monkeypatch.setenv("BEVIR_NATIVE", switch)
            watched = Interpreter(graph(op), on_node_start=lambda node, args: seen.append(blas()))
            seen.clear()
            for _ in range(3):
                watched.run(x)
                assert blas() == {2}
            assert seen == held, (op, threads, switch)
        monkeypatch.setenv("BEVIR_NATIVE", "1")
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
        with native.serial_blas():
            with native.serial_blas():
                assert blas() == {1}
            assert blas() == {1}
        assert blas() == {2}
        split = graph("sigmoid")
        bevir.run(split, x)

        def failing(node, args):
            seen.append(blas())
            raise KeyError(node.name)
        seen.clear()
        with pytest.raises(bevir.BevirError, match="KeyError"):
            Interpreter(split, on_node_start=failing).run(x)
        assert seen == [{1}] and blas() == {2}


def test_parallel_runs_each_call_on_its_own_thread_and_ends_them_all_before_it_raises():
    """native.parallel: each call on a thread of its own (this one runs the first); a
    failing call's error is raised once every call has ended, and the workers serve the
    next calls; while another caller holds the workers, the calls run in turn here."""
    import threading
    import time
    threads: list[int] = []

    def record(delay: float = 0.0, fail: bool = False):
        def call():
            time.sleep(delay)
            threads.append(threading.get_ident())
            if fail:
                raise ValueError("call failed")
        return call

    native.parallel([record(), record(), record()])
    assert len(set(threads)) == 3 and threads.count(threading.get_ident()) == 1
    threads.clear()
    with pytest.raises(ValueError, match="call failed"):
        native.parallel([record(fail=True), record(0.05), record(0.1)])
    assert len(threads) == 3                                    # the slow ones ended first
    threads.clear()
    native.parallel([record(), record()])
    assert len(set(threads)) == 2
    threads.clear()
    with native._WORKERS_HELD[0]:                               # another caller's
        native.parallel([record(), record(), record()])
    assert set(threads) == {threading.get_ident()} and len(threads) == 3
