"""Generated kernels of the fx ops with multi-stage lowerings (softmax, reductions, division,
layer norm, deformable attention, average pooling) against the golden model, llvm and C builds: 0 differing elements
on one-op graphs, whole and partitioned for 2 and 4 cores, with inputs at the edges (every
code, ties, saturation, i16 softmax inputs, another axis, locations outside the map), and
the ops that take 16-bit activations (products by i8 weights, relu, tables, requantize)."""
from __future__ import annotations

import numpy as np
import pytest

import bevir
from bevir import DType, Layout, TensorType
from bevir.codegen.program import Program
from bevir.ops.numerics import rsqrt_fixed
from tests.shared import GRAPHS, all_codes, fx, ints, partitioned

I8, I16, I32 = DType.i8, DType.i16, DType.i32


def one_op(op: str, inputs: dict, **attrs):
    """(graph, inputs) of one ``op`` node on ``inputs`` (name -> (array, type))."""
    b = bevir.Builder(op)
    xs = [b.input(k, t) for k, (_, t) in inputs.items()]
    b.output("y", getattr(b, op)(*xs, **attrs))
    return b.graph, {k: a for k, (a, _) in inputs.items()}


def softmax_ties(rng):
    """Every i8 code; rows of equal codes (ties at the max); a row of the minimum and one
    maximum (the table's far end)."""
    x = all_codes((6, 9, 40))
    x[0] = 5
    x[1, :, 1:] = -128
    x[1, :, 0] = 127
    return one_op("fx_softmax", {"x": (x, fx(x.shape, 4))}, axis=-1, out_frac_bits=7)


def softmax_i16_axis(rng):
    """i16 input past the table's end, the softmax on a middle axis, i16 result."""
    x = ints(rng, (4, 33, 5), np.int16)
    x[0, :3] = [[32767] * 5, [-32768] * 5, [0] * 5]
    return one_op("fx_softmax", {"x": (x, fx(x.shape, 8, I16))}, axis=1, out_frac_bits=15,
                  out_dtype="i16")


def reduce_case(op, axes, keepdims, frac_out):
    def make(rng):
        x = all_codes((5, 6, 7))
        return one_op(op, {"x": (x, fx(x.shape, 3))}, axes=axes, keepdims=keepdims,
                      out_frac_bits=frac_out)
    make.__name__ = f"{op[3:]}_{'_'.join(map(str, axes))}_{keepdims}_{frac_out}"
    return make


def div_case(frac_in, frac_out, dtype, count_shape):
    def make(rng):
        x = all_codes((6, 50), dtype.np)
        x[0, :4] = [np.iinfo(dtype.np).min, np.iinfo(dtype.np).max, 0, -1]
        cnt = rng.integers(0, 256, count_shape).astype(np.int32)   # 0: divides by 1
        return one_op("fx_div", {"x": (x, fx(x.shape, frac_in, dtype)),
                                 "count": (cnt, TensorType(cnt.shape, I32))},
                      out_frac_bits=frac_out)
    make.__name__ = f"div_{frac_in}_{frac_out}_{dtype}_{'x'.join(map(str, count_shape))}"
    return make


def norm_case(shape, frac, scale_frac=None, bias=None, epsilon=1e-5, dtype=I8):
    """Layer norm over rows of all codes, equal codes (the variance is epsilon alone) and
    extremes; optional i8/i16 scale and i8/i16/i32 bias; i16 x gives an i16 result."""
    def make(rng):
        b = bevir.Builder("norm")
        x = all_codes(shape, dtype.np)
        rows = x.reshape(-1, shape[-1])
        m = min(3, len(rows) - 1)               # keep one row of all codes
        info = np.iinfo(dtype.np)
        rows[:m] = np.array([[7], [info.min], [info.max]], dtype.np)[:m]
        ch = shape[-1:]
        g = None if scale_frac is None else b.const(ints(rng, ch, np.int16), "g",
                                                     fx(ch, scale_frac, I16))
        beta = None if bias is None else b.const(ints(rng, ch, bias[0].np), "beta",
                                                  fx(ch, bias[1], bias[0]))
        b.output("y", b.fx_layer_norm(b.input("x", fx(shape, frac, dtype)), g, beta,
                                      epsilon=epsilon, out_frac_bits=4 if dtype is I8 else 12,
                                      out_dtype=dtype.value))
        return b.graph, {"x": x}
    make.__name__ = (f"norm_{'x'.join(map(str, shape))}_{scale_frac}_{bias and bias[0]}_{epsilon}"
                     + ("" if dtype is I8 else f"_{dtype}"))
    return make


def deform_case(coordinates, frac, dtype, weight_bits):
    """Locations over and well beyond the map (corners outside read zero), negative ones
    (floor shifts), attention weights of both signs and the extremes."""
    def make(rng):
        bs, nq, heads, shapes, points, d = 2, 7, 2, (4, 5, 1, 1, 3, 2), 3, 3
        levels, nv = len(shapes) // 2, 4 * 5 + 1 + 3 * 2
        span = 1 if coordinates == "normalized" else 6
        lo = rng.uniform(-0.5, 1.5, (bs, nq, heads, levels, points, 2)) * span
        locs = np.floor(lo * 2.0 ** frac).astype(dtype.np)
        locs[0, 0, 0, 0] = [[np.iinfo(dtype.np).min] * 2, [np.iinfo(dtype.np).max] * 2, [0, 0]]
        aw = ints(rng, (bs, nq, heads, levels, points))
        aw[0, 0, 0, 0] = [-128, 127, 0]
        b = bevir.Builder("deform")
        args = [b.input("value", fx((bs, nv, heads, d), 6)),
                b.input("loc", fx(locs.shape, frac, dtype)), b.input("aw", fx(aw.shape, 7))]
        b.output("y", b.fx_ms_deform_attn(*args, spatial_shapes=shapes, out_frac_bits=4,
                                          weight_bits=weight_bits, coordinates=coordinates))
        return b.graph, {"value": all_codes((bs, nv, heads, d)), "loc": locs, "aw": aw}
    make.__name__ = f"deform_{coordinates}_{frac}_{dtype}_{weight_bits}"
    return make


def wide_case(op, frac_in, frac_out, out_dtype, x_dtype=I16, **attrs):
    """A 16-bit activation op (every i16 code in x; products by random i8 weights with a
    bias) to an i8 or i16 result."""
    def make(rng):
        weighted = op in ("fx_linear", "fx_conv2d")
        shape = {"fx_linear": (2, 300, 40), "fx_conv2d": (1, 9, 11, 6)}.get(op, (4, 128, 128))
        x = all_codes(shape, x_dtype.np)
        ins = {"x": (x, fx(x.shape, frac_in, x_dtype,
                           Layout.nhwc if op == "fx_conv2d" else Layout.plain))}
        if weighted:
            w = ints(rng, (5, 40) if op == "fx_linear" else (4, 3, 3, 3))
            bias = rng.integers(-2**24, 2**24, w.shape[0]).astype(np.int32)
            ins |= {"w": (w, fx(w.shape, 7)), "b": (bias, TensorType(bias.shape, I32))}
        return one_op(op, ins, out_frac_bits=frac_out, out_dtype=out_dtype, **attrs)
    make.__name__ = f"wide_{op[3:]}_{frac_in}_{frac_out}_{x_dtype}_{out_dtype}"
    return make


def avgpool_case(layout, frac_in, frac_out, **attrs):
    """Average pooling of every i8 code (NCHW or NHWC): window sums, counts at the borders,
    ceil_mode's overhang."""
    def make(rng):
        shape = (2, 6, 9, 11) if layout is Layout.nchw else (2, 9, 11, 6)
        x = all_codes(shape)
        return one_op("fx_avgpool2d", {"x": (x, fx(shape, frac_in, I8, layout))},
                      out_frac_bits=frac_out, **attrs)
    make.__name__ = f"avgpool_{layout.value}_{frac_in}_{frac_out}"
    return make


def movement_case(op, **attrs):
    """An op that moves or selects codes (reduce_max/min, squeeze, unsqueeze, flatten) on
    every i8 code, its frac bits kept."""
    def make(rng):
        x = all_codes((4, 1, 8, 32))
        return one_op(op, {"x": (x, fx(x.shape, 5))}, **attrs)
    make.__name__ = f"{op}_{'_'.join(f'{k}{v}' for k, v in attrs.items())}"
    return make


def bridge_i16(rng):
    """onnxruntime's u8 codes handed to a 16-bit head, transposed."""
    x = all_codes((2, 8, 4, 8), np.uint8)
    t = TensorType(x.shape, DType.u8, quant=bevir.AffineQuant((0.037,), (3,)))
    return one_op("fx_bridge", {"x": (x, t)}, out_frac_bits=12, out_dtype="i16",
                  perm=[0, 2, 3, 1])


CASES = {f.__name__: f for f in (
    softmax_ties, softmax_i16_axis, GRAPHS["softmax"],
    reduce_case("fx_reduce_sum", (1,), True, 1), reduce_case("fx_reduce_sum", (0, 2), False, 5),
    reduce_case("fx_reduce_mean", (-1,), True, 3), reduce_case("fx_reduce_mean", (0, 2), False, 0),
    reduce_case("fx_reduce_mean", (1,), False, 7),
    div_case(4, 4, I8, (6, 1)), div_case(2, 7, I8, (6, 50)), div_case(20, 12, I32, (50,)),
    div_case(6, 6, I16, (1, 50)),
    GRAPHS["layer_norm"], norm_case((3, 5, 64), 5), norm_case((300,), 0, 12, (I32, 14)),
    norm_case((4, 2, 4096), 7, 14, (I8, 3), 1.0), norm_case((2, 7, 1), 2, None, (I16, 10)),
    norm_case((6, 33), 4, 9, None, 1e-9), norm_case((3, 2, 512), 12, 12, (I32, 20), dtype=I16),
    GRAPHS["deform_attn"], deform_case("normalized", 12, I16, 8),
    deform_case("pixel", 4, I16, 8), deform_case("pixel", 14, I32, 12),
    deform_case("normalized", 1, I32, 1),
    wide_case("fx_linear", 12, 9, "i16"), wide_case("fx_linear", 14, 2, "i8"),
    wide_case("fx_conv2d", 10, 8, "i16", strides=(2, 1), pads=(1, 1, 1, 1), groups=2),
    wide_case("fx_relu", 12, 10, "i16"), wide_case("fx_relu", 9, 3, "i8"),
    wide_case("fx_sigmoid", 12, 15, "i16"), wide_case("fx_inverse_sigmoid", 15, 4, "i8"),
    wide_case("fx_requantize", 5, 12, "i16", I8), wide_case("fx_requantize", 12, 4, "i8"),
    bridge_i16,
    avgpool_case(Layout.nchw, 4, 4, kernel=(3, 3), pads=(1, 1, 1, 1)),
    avgpool_case(Layout.nhwc, 6, 2, kernel=(3, 2), strides=(2, 2), pads=(1, 0, 0, 1),
                 ceil_mode=True, count_include_pad=True),
    avgpool_case(Layout.nchw, 1, 7, kernel=(2, 2), strides=(2, 2), ceil_mode=True),
    wide_case("fx_silu", 12, 10, "i16"), wide_case("fx_hardswish", 9, 4, "i8", I8),
    wide_case("fx_tanh", 11, 7, "i8"), wide_case("fx_gelu", 10, 12, "i16"),
    movement_case("reduce_max", axes=(2, 3), keepdims=True), movement_case("reduce_min", axes=(-1,),
                                                                           keepdims=False),
    movement_case("reduce_max", axes=None, keepdims=False), movement_case("squeeze", axes=(1,)),
    movement_case("unsqueeze", axes=(0, 3)), movement_case("flatten", axis=2),
)}


#: one case per op family (reductions do not split), partitioned for 2 and 4 cores
PARTITIONED = ("softmax", "div_2_7_i8_6x50", "layer_norm", "deform_attn",
               "deform_pixel_4_i16_8", "wide_linear_12_9_i16_i16", "wide_sigmoid_12_15_i16_i16")


def check(graph, inputs) -> None:
    for target in ("llvm", "c"):
        report = Program(graph, target).check(inputs)
        assert report.ok, (target, report.mismatch)
        assert report.checked >= 1


@pytest.mark.parametrize("name", CASES)
def test_lowering_is_bit_exact(rng, name):
    check(*CASES[name](rng))


@pytest.mark.parametrize("cores", [2, 4])
@pytest.mark.parametrize("name", PARTITIONED)
def test_partitioned_lowering_is_bit_exact(rng, name, cores):
    graph, inputs = CASES[name](rng)
    g = partitioned(graph, cores)
    assert g.op_counts().get("core_gather", 0) >= 1, "nothing was split"
    check(g, inputs)


def test_rsqrt_matches_numerics():
    """The layer norm's (R, k) stages against numerics.rsqrt_fixed: random n of every bit
    length, powers of two and their neighbours, perfect squares and their neighbours."""
    from bevir.codegen.lower import Lowering
    from bevir.ops.fixed_norms import _rsqrt_estimate, _rsqrt_root, _rsqrt_shift
    import tvm
    rng = np.random.default_rng(0)
    n = np.maximum(rng.integers(1, 1 << 62, 4000, dtype=np.int64) >> rng.integers(0, 62, 4000), 1)
    m = rng.integers(2, 1 << 31, 1000, dtype=np.int64)
    edges = [(1 << j) + e for j in range(62) for e in (-1, 0, 1)] + [(1 << 62) - 1]
    n = np.concatenate([n, m * m - 1, m * m, m * m + 1, np.array(edges[1:], np.int64)])
    corrected = 0
    for c in (1, 3, 16, 4095, 4096):
        L = Lowering()
        p = L.te.placeholder(n.shape, "int64", name="n")
        k = L.te.compute(n.shape, lambda i: _rsqrt_shift(L, p[i], c), name="k")
        r0 = L.te.compute(n.shape, lambda i: _rsqrt_estimate(L, p[i], k[i], c), name="r0")
        r = L.te.compute(n.shape, lambda i: _rsqrt_root(L, p[i], k[i], r0[i], c), name="r")
        f = tvm.compile(tvm.IRModule({"f": L.te.create_prim_func([p, k, r0, r]).with_attr(
            "global_symbol", "f")}), target="llvm")["f"]
        got_k, got_r0, got_r = (tvm.runtime.tensor(np.zeros(n.shape, np.int64)) for _ in range(3))
        f(tvm.runtime.tensor(n), got_k, got_r0, got_r)
        want_r, want_k = rsqrt_fixed(n, c)
        assert np.array_equal(got_k.numpy(), want_k) and np.array_equal(got_r.numpy(), want_r)
        corrected += int(np.count_nonzero(got_r0.numpy() != want_r))
    assert corrected > 0, "no estimate needed its exact correction: the test misses it"
