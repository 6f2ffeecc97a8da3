"""Generated kernels of the onnxruntime-exact integer ops and the data-movement ops around
them, against their golden ops on edge inputs, for the llvm and the C build: every code, zero points at the ends of
their range, per-channel weights, both layouts, groups, strides with pads, rounding ties,
NaN and infinities. Each check must find 0 differing elements."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import DType, Layout, TensorType
from bevir.codegen.program import Program
from tests.shared import q

I8, U8 = DType.i8, DType.u8


def check(op, inputs, **attrs):
    """Build a one-``op`` graph of ``inputs`` [(array, type)] and check its kernel."""
    g, feeds, ins = bevir.Graph(), {}, []
    for k, (a, t) in enumerate(inputs):
        if a is None:
            ins.append(None)
            continue
        ins.append(g.add_input(f"x{k}", t))
        feeds[f"x{k}"] = a
    node = g.create_node(op, ins, attrs)
    g.set_output("y", node.output)
    for target in ("llvm", "c"):
        report = Program(g, target).check(feeds)
        assert report.ok and report.checked >= 1, (target, report.mismatch)


def codes(shape, dtype: DType, rng=None) -> np.ndarray:
    """Every code of ``dtype`` in turn (then random ones, with ``rng``), in ``shape``."""
    info = np.iinfo(dtype.np)
    n = int(np.prod(shape))
    v = np.arange(n) % (info.max - info.min + 1) + info.min
    if rng is not None:
        v = rng.permutation(v)
    return v.astype(dtype.np).reshape(shape)


# ---- qlinear_conv ----------------------------------------------------------------------
CONVS = {   # x dtype, w dtype, channels in/out, groups, strides, pads, dilations, kernel
    "u8u8-3x3": (U8, U8, 4, 6, 1, (1, 1), (1, 1, 1, 1), (1, 1), 3),
    "u8i8-stride2-pads": (U8, I8, 3, 4, 1, (2, 2), (1, 0, 2, 1), (1, 1), 3),
    "i8i8-groups-dilated": (I8, I8, 4, 6, 2, (1, 2), (2, 1, 0, 2), (2, 1), 3),
    "i8i8-depthwise": (I8, I8, 5, 5, 5, (2, 1), (1, 1, 1, 1), (1, 1), 3),
    "u8i8-1x1": (U8, I8, 8, 3, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1),
}


def near(zp, shape, dtype: DType, rng) -> np.ndarray:
    """Codes within 1 of the zero point ``zp`` (broadcast along axis 0): small centered
    values, so that a multiplier of 0.5 or 0.25 leaves many results on rounding ties."""
    info = np.iinfo(dtype.np)
    zp = np.reshape(zp, (-1,) + (1,) * (len(shape) - 1))
    return np.clip(zp + rng.integers(-1, 2, shape), info.min, info.max).astype(dtype.np)


@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc])
@pytest.mark.parametrize("data", ["every-code", "ties"])
def test_qlinear_conv(case, layout, data, rng):
    xd, wd, ci, co, groups, strides, pads, dil, k = CONVS[case]
    xinfo, winfo = np.iinfo(xd.np), np.iinfo(wd.np)
    per_channel = case != "u8u8-3x3"
    wscale = [0.25 if o % 2 else 0.5 for o in range(co)] if per_channel else 0.5
    wzp = [winfo.max if o % 2 else winfo.min for o in range(co)] if wd is U8 and per_channel \
        else 0 if per_channel else winfo.max
    shape, wshape = (1, ci, 9, 8), (co, ci // groups, k, k)
    if data == "ties":          # multipliers 0.5 and 0.25 on small accumulators
        x, w = near(xinfo.max, shape, xd, rng), near(wzp, wshape, wd, rng)
        oscale, ozp = 1.0, (xinfo.min + xinfo.max + 1) // 2
    else:                       # every code, the result zero point at the end of its range
        x, w = codes(shape, xd, rng), codes(wshape, wd, rng)
        x.reshape(-1)[:2] = xinfo.min, xinfo.max
        oscale, ozp = 300.0, xinfo.min
    bias = rng.integers(-50, 50, co).astype(np.int32)
    bias[0] = 2 ** 31 - 1                       # the exact sum passes int32
    if layout is Layout.nhwc:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        shape = x.shape
    xt = q(xd, shape, 1.0, xinfo.max, layout)
    wt = q(wd, w.shape, wscale, wzp, axis=0 if per_channel else None)
    out = dict(out_dtype=xd.value, out_scale=oscale, out_zero_point=ozp, groups=groups,
               strides=strides, pads=pads, dilations=dil)
    if case == "i8i8-depthwise":
        out.update(out_min=-100, out_max=90)
    check("qlinear_conv", [(x, xt), (w, wt), (bias, TensorType((co,), DType.i32))], **out)
    check("qlinear_conv", [(x, xt), (w, wt)], **out)


# ---- qlinear_add / qlinear_mul ---------------------------------------------------------
@pytest.mark.parametrize("op", ["qlinear_add", "qlinear_mul"])
@pytest.mark.parametrize("dtype,zps", [(U8, (0, 255, 7)), (I8, (-128, 127, 0))])
@pytest.mark.parametrize("shapes", [((256, 1), (1, 256)), ((256, 256), (256,)),
                                    ((1, 256), (256, 256))], ids=["outer", "b-row", "a-row"])
def test_qlinear_binary_every_code_pair(op, dtype, zps, shapes):
    a = codes(shapes[0], dtype)
    b = codes(shapes[1], dtype)
    if a.shape == (256, 1):
        b = b.reshape(1, 256)
    clamp = dict(out_min=-3 if dtype is I8 else 3, out_max=100) if op == "qlinear_mul" else {}
    check(op, [(a, q(dtype, a.shape, 0.05, zps[0])), (b, q(dtype, b.shape, 0.125, zps[1]))],
          out_dtype=dtype.value, out_scale=0.1, out_zero_point=zps[2], **clamp)


# ---- quantize ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["i8", "u8", "i16"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_ties_nan_and_infinities(dtype, per_channel):
    scale = [0.5, 0.1, 3.0] if per_channel else [0.1]
    info = np.iinfo(DType(dtype).np)
    zp = [info.min, 0 if dtype != "u8" else 1, info.max] if per_channel else [info.max // 2]
    k = np.arange(-300.0, 300.0, 2.5)         # ties: (k + 0.5) * scale, and k itself
    x = np.stack([(k + 0.5) * s for s in (scale * 3)[:3]], 1).astype(np.float32)
    x[:6, :] = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0], np.float32)[:, None]
    x[6:, :] = np.where(np.arange(x.shape[0] - 6)[:, None] % 3 == 0, k[6:, None], x[6:, :])
    check("quantize", [(x, TensorType(x.shape))], dtype=dtype, scale=scale, zero_point=zp,
          axis=1 if per_channel else None)


# ---- maxpool2d -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [I8, U8])
@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc])
@pytest.mark.parametrize("kernel,strides,pads,dil,ceil", [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True),
    ((2, 3), (1, 2), (0, 1, 1, 0), (2, 1), False)])
def test_maxpool2d_padding_never_wins(dtype, layout, kernel, strides, pads, dil, ceil, rng):
    shape = (1, 3, 7, 8) if layout is Layout.nchw else (1, 7, 8, 3)
    x = codes(shape, dtype, rng)
    x[..., 0, :] = np.iinfo(dtype.np).min      # an all-minimum row / channel
    check("maxpool2d", [(x, q(dtype, shape, 0.1, 3, layout))], kernel=kernel, strides=strides,
          pads=pads, dilations=dil, ceil_mode=ceil)


# ---- gather, expand, clip, cast ------------------------------------------------------------
@pytest.mark.parametrize("data", ["i8", "i64"])    # integer data: float or bool data gathers on the host
@pytest.mark.parametrize("axis", [0, -1])
def test_gather_wraps_negative_indices(data, axis, rng):
    x = (rng.standard_normal((5, 6)) * 100).astype(DType(data).np)
    n = x.shape[axis]
    idx = np.array([[0, -1, n - 1], [-n, 2, -3]], np.int64)
    check("gather", [(x, TensorType(x.shape, DType(data))),
                     (idx, TensorType(idx.shape, DType.i64))], axis=axis)


def test_expand():
    x = codes((3, 1, 4), I8)
    check("expand", [(x, TensorType(x.shape, I8))], shape=(2, 3, 5, 4))


@pytest.mark.parametrize("dtype", [I8, U8, DType.i32])
@pytest.mark.parametrize("lo,hi", [(-3.7, 100.9), (None, 5.0), (-1e10, None), (300.0, 1e12)])
def test_clip_integer_bounds(dtype, lo, hi):
    x = codes((4, 128), dtype)
    x.reshape(-1)[-2:] = np.iinfo(dtype.np).min, np.iinfo(dtype.np).max
    check("clip", [(x, TensorType(x.shape, dtype))], min=lo, max=hi)


EDGES = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2 ** 31, -2 ** 31, 2147483520.0, 300.7,
                  -300.7, 128.5, -129.9, 65535.9, 1e5, -1e5, 2 ** 32 + 512, 1e19, -0.9, 0.9,
                  -0.0], np.float32)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")   # the golden's NaN
@pytest.mark.parametrize("to", ["i32", "i8", "u8", "i16", "i64"])
@pytest.mark.parametrize("saturate", [False, True])
def test_cast_float_to_int_as_numpy_on_x86(to, saturate):
    check("cast", [(EDGES, TensorType(EDGES.shape))], to=to, saturate=saturate)


@pytest.mark.parametrize("src,to", [("i32", "i8"), ("u8", "i8"), ("i64", "i16"), ("i8", "i32")])
def test_cast_from_integers(src, to):
    x = np.array([0, 1, -1, 127, -128, 255, 2 ** 24 + 1, -(2 ** 40) - 3]).astype(DType(src).np)
    check("cast", [(x, TensorType(x.shape, DType(src)))], to=to)
