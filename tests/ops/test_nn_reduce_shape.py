"""nn, reduce and shape ops: one-node graphs run by the interpreter against torch / numpy /
onnx references."""
import gc
import sys

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator

import bevir
from bevir import DType, InterpreterError, Layout, TensorType, VerifyError


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def build(op, *args, layout=None, **attrs):
    """A graph of one ``op`` node: array args become graph inputs (the first with ``layout``),
    None an omitted optional operand. Returns (graph, feeds, node)."""
    g, feeds, ins = bevir.Graph(), {}, []
    for i, a in enumerate(args):
        if a is None:
            ins.append(None)
            continue
        lay = layout if i == 0 and layout else Layout.plain
        ins.append(g.add_input(f"x{i}", TensorType.of(np.asarray(a), lay)))
        feeds[f"x{i}"] = a
    node = g.create_node(op, ins, attrs)
    for i, v in enumerate(node.outputs):
        g.set_output(f"y{i}", v)
    return g, feeds, node


def run_op(op, *args, layout=None, **attrs):
    """Run a one-node graph; a single result comes back bare, several as a list."""
    g, feeds, node = build(op, *args, layout=layout, **attrs)
    out = bevir.run(g, feeds)
    ys = [out[f"y{i}"] for i in range(len(node.outputs))]
    return ys[0] if len(ys) == 1 else ys


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def onnx_run(op_type, inputs, inits=(), backend="ort", n_out=1, **attrs):
    """Run one ONNX node with onnxruntime (or the onnx reference evaluator)."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names + [n for n, _ in inits],
                            [f"o{k}" for k in range(n_out)], **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(f"o{k}", helper.np_dtype_to_tensor_dtype(inputs[0].dtype),
                                       None) for k in range(n_out)],
        [onnx.numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    feeds = dict(zip(names, inputs))
    if backend == "ref":
        return ReferenceEvaluator(model).run(None, feeds)[0]
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# ---- pooling -----------------------------------------------------------------------------
POOL_CASES = [  # kernel, stride, pad (symmetric), dilation, ceil_mode, input HxW
    ((3, 3), (2, 2), 1, (1, 1), False, (11, 12)),
    ((3, 3), (2, 2), 1, (1, 1), True, (10, 12)),
    ((2, 3), (2, 3), 0, (1, 1), True, (9, 11)),
    ((3, 2), (1, 2), (1, 0), (1, 1), True, (7, 9)),
    ((3, 3), (2, 2), 1, (2, 1), True, (12, 9)),
    ((1, 1), (3, 3), 0, (1, 1), True, (8, 10)),
    ((2, 2), (2, 2), 1, (1, 1), True, (5, 5)),
]


def conv2d_as_stated(x, w, b, strides, pads, dilations, groups):
    """bevir.ops.linalg.Convolution's sum, term by term in float64 (NCHW x)."""
    n, ch, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (top, left) = strides, dilations, pads[:2]
    oh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow)) + b[:, None, None]
    for oc in range(o):
        g = oc // (o // groups)
        for c, i, j in np.ndindex(cg, kh, kw):
            for p, q in np.ndindex(oh, ow):
                r, s = p * sh + i * dh - top, q * sw + j * dw - left
                if 0 <= r < h and 0 <= s < wd:
                    y[:, oc, p, q] += w[oc, c, i, j] * x[:, g * cg + c, r, s].astype(np.float64)
    return y


@pytest.mark.parametrize("groups, cin, cout", [(1, 4, 6), (1, 20, 6), (2, 8, 6), (8, 8, 16)])
@pytest.mark.parametrize("layout", [Layout.plain, Layout.nhwc])
def test_conv2d_sums_what_its_definition_states(groups, cin, cout, layout, rng):
    """conv2d (its kernel: BLAS GEMMs, native products) computes the sum its definition
    states, up to float32 rounding: grouped, depthwise with a multiplier, strided, dilated,
    asymmetric pads, both layouts."""
    x = randn(rng, 2, cin, 9, 8)
    w, b = randn(rng, cout, cin // groups, 3, 2), randn(rng, cout)
    attrs = dict(strides=(2, 1), pads=(1, 0, 2, 1), dilations=(1, 2), groups=groups)
    y = run_op("conv2d", nhwc(x) if layout is Layout.nhwc else x, w, b, layout=layout, **attrs)
    want = conv2d_as_stated(x, w, b, **attrs)
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2) if layout is Layout.nhwc else y, want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k, s, p, d, ceil, hw", POOL_CASES)
@pytest.mark.parametrize("layout", [Layout.plain, Layout.nhwc])
def test_maxpool2d_matches_torch(k, s, p, d, ceil, hw, layout, rng):
    x = randn(rng, 2, 3, *hw)
    ph, pw = (p, p) if isinstance(p, int) else p
    ref = F.max_pool2d(t(x), k, s, (ph, pw), d, ceil_mode=ceil).numpy()
    arg = nhwc(x) if layout is Layout.nhwc else x
    y = run_op("maxpool2d", arg, layout=layout, kernel=k, strides=s, pads=(ph, pw, ph, pw),
               dilations=d, ceil_mode=ceil)
    np.testing.assert_array_equal(y, nhwc(ref) if layout is Layout.nhwc else ref)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
def test_maxpool2d_integers_padding_never_wins(dtype, rng):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, min(info.max, 1000), (1, 2, 7, 7)).astype(dtype)
    x[0, 0] = info.min       # an all-minimum channel: padding must still not show through
    y = run_op("maxpool2d", x, kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=True)
    ref = F.max_pool2d(t(x.astype(np.float64)), 3, 2, 1, ceil_mode=True).numpy()
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, ref.astype(dtype))


def test_maxpool_keeps_layout_and_quant():
    q = bevir.AffineQuant([0.1], [3])
    g = bevir.Graph()
    x = g.add_input("x", TensorType((1, 4, 8, 8), DType.i8, Layout.nchw, q))
    out = g.create_node("maxpool2d", [x], dict(kernel=(2, 2), strides=(2, 2))).output
    assert out.type == TensorType((1, 4, 4, 4), DType.i8, Layout.nchw, q)


@pytest.mark.parametrize("k, s, p, d, ceil, hw", [c for c in POOL_CASES if c[3] == (1, 1)])
@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("layout", [Layout.plain, Layout.nhwc])
def test_avgpool2d_matches_torch(k, s, p, d, ceil, hw, include, layout, rng):
    x = randn(rng, 2, 3, *hw)
    ph, pw = (p, p) if isinstance(p, int) else p
    ref = F.avg_pool2d(t(x), k, s, (ph, pw), ceil_mode=ceil, count_include_pad=include).numpy()
    arg = nhwc(x) if layout is Layout.nhwc else x
    y = run_op("avgpool2d", arg, layout=layout, kernel=k, strides=s, pads=(ph, pw, ph, pw),
               ceil_mode=ceil, count_include_pad=include)
    np.testing.assert_allclose(y, nhwc(ref) if layout is Layout.nhwc else ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, onnx_op, extra", [
    ("maxpool2d", "MaxPool", {}), ("avgpool2d", "AveragePool", {"count_include_pad": 0}),
    ("avgpool2d", "AveragePool", {"count_include_pad": 1})])
@pytest.mark.parametrize("ceil", [0, 1])
def test_pools_asymmetric_pads_match_onnxruntime(op, onnx_op, extra, ceil, rng):
    x = randn(rng, 1, 2, 9, 10)
    pads = (0, 2, 1, 0)   # top, left, bottom, right; ONNX: [t, l, b, r] too
    ref = onnx_run(onnx_op, [x], kernel_shape=[3, 3], strides=[2, 3], pads=list(pads),
                   ceil_mode=ceil, **extra)
    y = run_op(op, x, kernel=(3, 3), strides=(2, 3), pads=pads, ceil_mode=bool(ceil),
               **{k: bool(v) for k, v in extra.items()})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def assert_mean_close(y, x, axes):
    """y is the float32 mean of x over axes within the float32 summation bound: k terms,
    |error| <= k * eps * mean|x| (summation error plus the final rounding)."""
    k = int(np.prod([x.shape[a] for a in axes]))
    exact = x.astype(np.float64).mean(axis=axes, keepdims=True)
    bound = k * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).mean(axis=axes, keepdims=True)
    assert y.dtype == x.dtype and np.all(np.abs(y - exact) <= bound), np.abs(y - exact).max()


@pytest.mark.parametrize("layout", [Layout.plain, Layout.nchw, Layout.nhwc])
def test_global_avgpool(layout, rng):
    x = randn(rng, 2, 5, 6, 7)
    y = run_op("global_avgpool", x, layout=layout)
    axes = (1, 2) if layout is Layout.nhwc else (2, 3)
    assert_mean_close(y, x, axes)
    _, _, node = build("global_avgpool", x, layout=layout)
    assert node.output.type.layout is layout
    x3 = randn(rng, 2, 5, 9)    # rank 3: every axis after C is spatial
    assert_mean_close(run_op("global_avgpool", x3), x3, (2,))


def test_pool_infer_errors(rng):
    with pytest.raises(VerifyError, match="does not fit"):
        build("maxpool2d", randn(rng, 1, 1, 2, 2), kernel=(3, 3))
    with pytest.raises(VerifyError, match="4-D"):
        build("avgpool2d", randn(rng, 1, 2, 2), kernel=(1, 1))
    with pytest.raises(VerifyError, match="float"):
        build("avgpool2d", np.zeros((1, 1, 4, 4), np.int8), kernel=(2, 2))
    with pytest.raises(bevir.AttrError, match="kernel"):
        build("maxpool2d", randn(rng, 1, 1, 4, 4))


# ---- normalization, softmax ----------------------------------------------------------------
@pytest.mark.parametrize("shape, layout", [
    ((4, 6), Layout.plain), ((2, 6, 5), Layout.plain), ((2, 6, 4, 5), Layout.nchw),
    ((2, 4, 5, 6), Layout.nhwc)])
def test_batch_norm_matches_torch(shape, layout, rng):
    x = randn(rng, *shape)
    c = 6
    scale, bias, mean = randn(rng, c), randn(rng, c), randn(rng, c)
    var = rng.uniform(0.1, 2, c).astype(np.float32)
    y = run_op("batch_norm", x, scale, bias, mean, var, layout=layout, epsilon=1e-3)
    xt = t(x).permute(0, 3, 1, 2) if layout is Layout.nhwc else t(x)
    ref = F.batch_norm(xt, t(mean), t(var), t(scale), t(bias), training=False, eps=1e-3)
    ref = (ref.permute(0, 2, 3, 1) if layout is Layout.nhwc else ref).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(VerifyError, match="parameters"):
        build("batch_norm", x, scale[:5], bias, mean, var, layout=layout)


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_matches_torch(axis, affine, rng):
    x = randn(rng, 3, 5, 16) * 10 + 100     # a large mean: the variance must not cancel
    norm = x.shape[axis % 3:]
    scale, bias = (randn(rng, *norm), randn(rng, *norm)) if affine else (None, None)
    y = run_op("layer_norm", x, scale, bias, axis=axis, epsilon=1e-5)
    ref = F.layer_norm(t(x).double(), norm, None if scale is None else t(scale).double(),
                       None if bias is None else t(bias).double(), eps=1e-5).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    assert y.dtype == np.float32


def test_layer_norm_broadcast_scale_and_errors(rng):
    x = randn(rng, 2, 4, 8)
    scale = randn(rng, 1, 8)           # broadcasts over the normalized [4, 8]
    y = run_op("layer_norm", x, scale, None, axis=1)
    ref = F.layer_norm(t(x), (4, 8), t(np.broadcast_to(scale, (4, 8))), None).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(VerifyError, match="normalized shape"):
        build("layer_norm", x, randn(rng, 4), None, axis=-1)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_matches_torch(axis, rng):
    x = randn(rng, 3, 4, 5) * 30      # large logits: the max must be subtracted
    np.testing.assert_allclose(run_op("softmax", x, axis=axis),
                               torch.softmax(t(x), axis).numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(VerifyError, match="axis"):
        build("softmax", x, axis=3)


# ---- resize ---------------------------------------------------------------------------------
COORD_MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric"]


def onnx_resize(x, size, **attrs):
    return onnx_run("Resize", [x], [("roi", np.zeros(0, np.float32)),
                                    ("scales", np.zeros(0, np.float32)),
                                    ("sizes", np.array(size, np.int64))], backend="ref", **attrs)


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("nearest", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_matches_onnx_reference(coord, nearest, rng):
    x = randn(rng, 2, 3, 5, 7)
    for size in [(2, 3, 10, 14), (2, 3, 3, 12), (2, 3, 1, 4), (2, 1, 5, 7), (2, 3, 9, 3)]:
        y = run_op("resize", x, size=size, mode="nearest", coordinate_transformation_mode=coord,
                   nearest_mode=nearest)
        ref = onnx_resize(x, size, mode="nearest", coordinate_transformation_mode=coord,
                          nearest_mode=nearest)
        np.testing.assert_array_equal(y, ref, err_msg=str(size))


def test_resize_coordinates_are_exact():
    """7 -> 17 half_pixel: output 8 maps to (8.5) * 7/17 - 0.5 = 3 exactly. In float64 it is
    3.0000000000000004, which the onnx reference evaluator sends to 2 (and ceil to 4);
    onnxruntime, like bevir, gives 3."""
    x = np.arange(7, dtype=np.float32).reshape(1, 7)
    for nearest in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]:
        y = run_op("resize", x, size=(1, 17), nearest_mode=nearest)
        assert y[0, 8] == 3
        ref = onnx_run("Resize", [x], [("roi", np.zeros(0, np.float32)),
                                       ("scales", np.zeros(0, np.float32)),
                                       ("sizes", np.array((1, 17), np.int64))],
                       mode="nearest", nearest_mode=nearest)
        np.testing.assert_array_equal(y, ref, err_msg=nearest)


@pytest.mark.parametrize("coord", COORD_MODES)
def test_resize_linear_matches_onnx_reference(coord, rng):
    for x, size in [(randn(rng, 2, 3, 5, 7), (2, 3, 10, 14)), (randn(rng, 2, 3, 6, 9), (2, 3, 4, 13)),
                    (randn(rng, 1, 2, 4), (1, 2, 9)), (randn(rng, 3, 4, 2, 3, 4), (3, 4, 5, 2, 7)),
                    (randn(rng, 1, 1, 3, 5), (1, 1, 1, 2))]:
        y = run_op("resize", x, size=size, mode="linear", coordinate_transformation_mode=coord)
        ref = onnx_resize(x, size, mode="linear", coordinate_transformation_mode=coord)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6, err_msg=str(size))


def test_resize_matches_torch_interpolate(rng):
    x = randn(rng, 2, 3, 6, 8)
    size = (2, 3, 13, 5)
    cases = [(dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor"), dict(mode="nearest")),
             (dict(mode="nearest", coordinate_transformation_mode="half_pixel",
                   nearest_mode="round_prefer_ceil"), dict(mode="nearest-exact")),
             (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
              dict(mode="bilinear", align_corners=False)),
             (dict(mode="linear", coordinate_transformation_mode="align_corners"),
              dict(mode="bilinear", align_corners=True))]
    for ours, theirs in cases:
        ref = F.interpolate(t(x), size=size[2:], **theirs).numpy()
        np.testing.assert_allclose(run_op("resize", x, size=size, **ours), ref,
                                   rtol=1e-5, atol=1e-5, err_msg=str(theirs))


def test_resize_nearest_any_dtype_and_rank(rng):
    x = rng.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    y = run_op("resize", x, size=(4, 3, 8), coordinate_transformation_mode="asymmetric",
               nearest_mode="floor")
    np.testing.assert_array_equal(y, x.repeat(2, 0).repeat(2, 2))
    _, _, node = build("resize", randn(rng, 1, 2, 3, 4), layout=Layout.nhwc, size=(1, 4, 6, 4))
    assert node.output.type.layout is Layout.nhwc
    with pytest.raises(VerifyError, match="float"):     # 8-bit linear: tests/flows/test_int8_cnn.py
        build("resize", x.astype(np.int32), size=(4, 3, 8), mode="linear")
    with pytest.raises(VerifyError, match="size"):
        build("resize", x, size=(4, 3))


# ---- grid_sample ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_matches_torch(mode, padding, align, rng):
    for n, ch, h, w, ho, wo in [(2, 5, 7, 9, 6, 11), (3, 4, 1, 6, 3, 5)]:
        x = randn(rng, n, ch, h, w)
        grid = rng.uniform(-1.4, 1.4, (n, ho, wo, 2)).astype(np.float32)
        grid[0, 0, :5] = [[-1, -1], [1, 1], [-1, 1], [0, 0], [3.5, -2.5]]   # corners, far out
        y = run_op("grid_sample", x, grid, mode=mode, padding_mode=padding, align_corners=align)
        ref = F.grid_sample(t(x), t(grid), mode=mode, padding_mode=padding,
                            align_corners=align).numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def _calls(fn, *args):
    """``fn(*args)`` and how many Python and C functions it called: a count that a loop over
    elements, samples or channels makes grow with the sizes, and that no machine's speed
    changes. The garbage collector is off meanwhile: a collection's callbacks (hypothesis
    installs one) would count too, wherever the session's earlier tests make it fall."""
    n = 0

    def count(frame, event, arg):
        nonlocal n
        n += event in ("call", "c_call")

    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(count)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return result, n


def test_grid_sample_bevformer_sizes_are_vectorized(rng):
    """Whole-array numpy work: the BEVFormer-sized sampling (16 x 32 x 50 x 50 maps,
    2500 x 4 points) makes exactly as many calls as a tiny one, and matches torch."""
    small = randn(rng, 1, 2, 3, 5), rng.uniform(-1.1, 1.1, (1, 3, 2, 2)).astype(np.float32)
    x = randn(rng, 16, 32, 50, 50)
    grid = rng.uniform(-1.1, 1.1, (16, 2500, 4, 2)).astype(np.float32)
    run_op("grid_sample", *small)       # first use in the process (lazy set-up) not counted
    y, calls = _calls(run_op, "grid_sample", x, grid)
    assert calls == _calls(run_op, "grid_sample", *small)[1]
    np.testing.assert_allclose(y, F.grid_sample(t(x), t(grid), align_corners=False).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_grid_sample_infer_errors(rng):
    with pytest.raises(VerifyError, match="grid"):
        build("grid_sample", randn(rng, 2, 3, 4, 4), randn(rng, 2, 5, 5, 3))
    with pytest.raises(VerifyError, match=r"\[N,C,H,W\]"):
        build("grid_sample", randn(rng, 2, 4, 4, 3), randn(rng, 2, 5, 5, 2), layout=Layout.nhwc)


# ---- reductions -----------------------------------------------------------------------------
NP_REDUCE = {"reduce_mean": np.mean, "reduce_sum": np.sum, "reduce_max": np.max,
             "reduce_min": np.min}


@pytest.mark.parametrize("op", list(NP_REDUCE))
@pytest.mark.parametrize("axes", [None, (1,), (-1, 0), ()])
@pytest.mark.parametrize("keepdims", [True, False])
def test_reductions_match_numpy(op, axes, keepdims, rng):
    x = randn(rng, 3, 40, 5)
    y = run_op(op, x, axes=axes, keepdims=keepdims)
    ax = None if axes is None else tuple(a % 3 for a in axes)
    ref = NP_REDUCE[op](x, axis=ax, keepdims=keepdims)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ref)   # pairwise float32, exactly as numpy


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_min"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integer_reductions(op, dtype, rng):
    x = rng.integers(-5, 5, (4, 6)).astype(dtype)
    y = run_op(op, x, axes=(1,), keepdims=False)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, NP_REDUCE[op](x, axis=1).astype(dtype))


def test_reduction_types_and_errors(rng):
    _, _, node = build("reduce_mean", randn(rng, 1, 8, 4, 4), layout=Layout.nchw, axes=(2, 3))
    assert node.output.type == TensorType((1, 8, 1, 1), layout=Layout.nchw)
    _, _, node = build("reduce_sum", randn(rng, 1, 8, 4, 4), layout=Layout.nchw, keepdims=False)
    assert node.output.type == TensorType(())
    assert run_op("reduce_max", randn(rng, 2, 0), axes=(1,)).tolist() == [[-np.inf]] * 2
    with pytest.raises(VerifyError, match="float"):
        build("reduce_mean", np.zeros((2, 2), np.int32))
    with pytest.raises(VerifyError, match="duplicate"):
        build("reduce_sum", randn(rng, 2, 2), axes=(1, -1))
    with pytest.raises(VerifyError, match="out of range"):
        build("reduce_sum", randn(rng, 2, 2), axes=(2,))


# ---- shape ops ------------------------------------------------------------------------------
def test_concat_and_split(rng):
    a, b, c = randn(rng, 2, 3, 4, 4), randn(rng, 2, 1, 4, 4), randn(rng, 2, 5, 4, 4)
    g = bevir.Graph()
    vs = [g.add_input(n, TensorType.of(v, Layout.nchw)) for n, v in zip("abc", (a, b, c))]
    cat = g.create_node("concat", vs, dict(axis=-3)).output
    assert cat.type == TensorType((2, 9, 4, 4), layout=Layout.nchw)
    parts = g.create_node("split", [cat], dict(axis=1, sizes=(4, 0, 5))).outputs
    assert [p.type for p in parts] == [TensorType((2, s, 4, 4), layout=Layout.nchw)
                                       for s in (4, 0, 5)]
    g.set_output("cat", cat)
    for i, p in enumerate(parts):
        g.set_output(f"p{i}", p)
    out = bevir.run(g, dict(a=a, b=b, c=c))
    ref = np.concatenate([a, b, c], 1)
    np.testing.assert_array_equal(out["cat"], ref)
    for k, r in zip(("p0", "p1", "p2"), np.split(ref, [4, 4], axis=1)):
        np.testing.assert_array_equal(out[k], r)
    with pytest.raises(VerifyError, match="differ"):
        build("concat", a, randn(rng, 2, 3, 5, 4), axis=1)
    with pytest.raises(VerifyError, match="do not split"):
        build("split", a, axis=1, sizes=(1, 1))
    x = randn(rng, 6, 2)
    ys = run_op("split", x, axis=-2, sizes=(1, 5))
    np.testing.assert_array_equal(ys[1], x[1:])


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((1,), (3,), (0,), (1,)),
    ((-1, 0), (-100, 100), (1, 0), (-1, 2)),        # negative step to the front, clamped end
    ((10, -3), (-10, -1), (2, -2), (-2, 1)),
    ((0, 5), (0, 1), (0, 1), (1, -2)),                # empty along axis 0
    ((2**62,), (-2**62,), (1,), (-3,)),             # INT64-ish bounds as ONNX writes them
    ((-8,), (8,), (2,), (3,)),
])
def test_slice_is_python_slicing(starts, ends, axes, steps, rng):
    x = randn(rng, 4, 6, 7)
    y = run_op("slice", x, starts=starts, ends=ends, axes=axes, steps=steps)
    idx = [slice(None)] * 3
    for b, e, a, s in zip(starts, ends, axes, steps):
        idx[a] = slice(b, e, s)
    np.testing.assert_array_equal(y, x[tuple(idx)])


def test_slice_matches_onnxruntime_and_errors(rng):
    x = randn(rng, 5, 8)
    ref = onnx_run("Slice", [x], [("s", np.array([-1, 7], np.int64)),
                                  ("e", np.array([-2**63, 1], np.int64)),
                                  ("a", np.array([0, 1], np.int64)),
                                  ("p", np.array([-2, -3], np.int64))])
    y = run_op("slice", x, starts=(-1, 7), ends=(-2**63, 1), axes=(0, 1), steps=(-2, -3))
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(VerifyError, match="step 0"):
        build("slice", x, starts=(0,), ends=(1,), axes=(0,), steps=(0,))
    with pytest.raises(VerifyError, match="length"):
        build("slice", x, starts=(0,), ends=(1,), axes=(0, 1), steps=(1,))
    _, _, node = build("slice", randn(rng, 1, 4, 4, 4), layout=Layout.nhwc,
                       starts=(1,), ends=(3,), axes=(3,), steps=(1,))
    assert node.output.type.layout is Layout.nhwc


def test_reshape_flatten_transpose(rng):
    x = randn(rng, 2, 3, 4, 5)
    np.testing.assert_array_equal(run_op("reshape", x, shape=(6, 20)), x.reshape(6, 20))
    with pytest.raises(VerifyError, match="cannot reshape"):
        build("reshape", x, shape=(7, 20))
    with pytest.raises(VerifyError, match="static"):
        build("reshape", x, shape=(-1, 20))
    for axis, shape in [(0, (1, 120)), (1, (2, 60)), (4, (120, 1)), (-1, (24, 5)), (-4, (1, 120))]:
        np.testing.assert_array_equal(run_op("flatten", x, axis=axis), x.reshape(shape))
    with pytest.raises(VerifyError, match="out of range"):
        build("flatten", x, axis=5)
    _, _, node = build("transpose", x, layout=Layout.nchw, perm=(0, 2, 3, 1))
    assert node.output.type == TensorType((2, 4, 5, 3))          # plain
    np.testing.assert_array_equal(run_op("transpose", x, perm=(3, 1, 0, 2)),
                                  x.transpose(3, 1, 0, 2))
    with pytest.raises(VerifyError, match="permutation"):
        build("transpose", x, perm=(0, 1, 1, 2))


def test_squeeze_unsqueeze(rng):
    x = randn(rng, 1, 3, 1, 4)
    np.testing.assert_array_equal(run_op("squeeze", x, axes=(0, -2)), x.reshape(3, 4))
    with pytest.raises(VerifyError, match="squeeze"):
        build("squeeze", x, axes=(1,))
    y = randn(rng, 3, 4)
    for axes in [(0,), (-1,), (0, 3), (1, -1), (-4, 2)]:
        got = run_op("unsqueeze", y, axes=axes)
        ref = np.expand_dims(y, tuple(a % (y.ndim + len(axes)) for a in axes))
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(VerifyError, match="out of range"):
        build("unsqueeze", y, axes=(3,))


def test_gather(rng):
    x = randn(rng, 5, 4, 3)
    for axis in [0, 1, -1]:
        idx = np.array([[0, -1], [2, 1]], np.int64)
        np.testing.assert_array_equal(run_op("gather", x, idx, axis=axis),
                                      np.take(x, idx, axis=axis))
    np.testing.assert_array_equal(run_op("gather", x, np.array(-2, np.int32)), x[-2])
    with pytest.raises(InterpreterError, match="out of range"):
        run_op("gather", x, np.array([5], np.int64))
    with pytest.raises(VerifyError, match="indices"):
        build("gather", x, np.array([0.0], np.float32))


def test_expand(rng):
    x = randn(rng, 3, 1)
    for shape in [(2, 3, 4), (1, 1), (3, 5), (4, 1, 1, 7)]:
        got = run_op("expand", x, shape=shape)
        np.testing.assert_array_equal(got, x * np.ones(shape, np.float32))
    with pytest.raises(VerifyError):
        build("expand", x, shape=(2, 4))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_matches_onnxruntime(mode, rng):
    x = randn(rng, 4, 5, 6)
    for pads in [(1, 0, 2, 0, 3, 1), (-1, 2, 0, 2, -2, 1), (0, 0, 0, 0, 0, 0)]:
        y = run_op("pad", x, pads=pads, mode=mode, value=1.5)
        extra = [("v", np.array(1.5, np.float32))] if mode == "constant" else []
        ref = onnx_run("Pad", [x], [("p", np.array(pads, np.int64))] + extra, mode=mode)
        np.testing.assert_array_equal(y, ref, err_msg=str(pads))
    xi = np.arange(6, dtype=np.int8).reshape(2, 3)
    np.testing.assert_array_equal(run_op("pad", xi, pads=(0, 1, 0, 1), value=7.0),
                                  np.pad(xi, ((0, 0), (1, 1)), constant_values=7))
    with pytest.raises(VerifyError, match="crop"):
        build("pad", x, pads=(-5, 0, 0, 0, 0, 0))
    with pytest.raises(VerifyError, match="pads takes"):
        build("pad", x, pads=(1, 1))


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
def test_topk(largest, axis, rng):
    x = rng.integers(0, 4, (6, 7)).astype(np.float32)     # many ties
    k = 3
    vals, idx = run_op("topk", x, k=k, axis=axis, largest=largest)
    assert idx.dtype == np.int64
    ref_v = torch.topk(t(x), k, dim=axis, largest=largest).values.numpy()
    np.testing.assert_array_equal(vals, ref_v)
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    np.testing.assert_array_equal(idx, np.take(order, np.arange(k), axis=axis))
    xu = rng.integers(0, 255, (3, 9)).astype(np.uint8)     # negation would wrap: not used
    vu, iu = run_op("topk", xu, k=4, largest=largest)
    np.testing.assert_array_equal(vu, np.take_along_axis(xu, iu, -1))
    ou = np.argsort(-xu.astype(int) if largest else xu, axis=-1, kind="stable")[:, :4]
    np.testing.assert_array_equal(iu, ou)
    with pytest.raises(VerifyError, match="k="):
        build("topk", x, k=8)


def test_constant():
    v = np.arange(6, dtype=np.int32).reshape(2, 3)
    g = bevir.Graph()
    out = g.create_node("constant", [], dict(value=v)).output
    assert out.type == TensorType((2, 3), DType.i32)
    g.set_output("c", out)
    np.testing.assert_array_equal(bevir.run(g, {})["c"], v)
    with pytest.raises(bevir.AttrError):
        g.create_node("constant", [], dict(value=[1, 2]))
