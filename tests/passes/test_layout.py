"""layout_transform and the to-nhwc pass: convolutional regions in NHWC, transforms only at
region boundaries, exact results (np.array_equal) before and after."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import bevir
from bevir import Builder, DType, Layout, TensorType
from bevir.errors import AttrError, VerifyError
from bevir.ir.types import AffineQuant
from bevir.ops import get_op
from bevir.passes import PassManager, Statistics, VerifyNumerics, make_pass, parse_pipeline
from bevir.passes.layout import (ToNHWC, count_layout_transforms, count_transposes,
                                 find_regions, is_layout_transform, why_not_nhwc)
from bevir.passes.patterns import explain
from bevir.passes.rewrites import limit_rewrites

CONVS = ("conv2d", "qlinear_conv", "conv_integer")


def randn(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def to_nhwc(graph, pipeline="to-nhwc", inputs=None):
    """Run ``pipeline`` on ``graph`` checked bit for bit by VerifyNumerics (to-nhwc has
    tolerance 0); returns the pass statistics of to-nhwc."""
    stats = Statistics()
    PassManager(pipeline, instruments=[VerifyNumerics(inputs), stats]).run(graph)
    return stats.by_pass().get("to-nhwc", {})


def layout_transforms(graph):
    return [n for n in graph.nodes if n.op == "layout_transform"]


def assert_convs_nhwc(graph):
    convs = [n for n in graph.nodes if n.op in CONVS]
    assert convs and all(n.inputs[0].type.layout is Layout.nhwc
                         and n.output.type.layout is Layout.nhwc for n in convs)


# ---- the op ------------------------------------------------------------------------------
def test_layout_transform_moves_data_and_retags():
    b = Builder()
    q = AffineQuant((0.1, 0.2, 0.3), (0, 1, 2), axis=1)
    x = b.input("x", TensorType((2, 3, 4, 5), DType.i8, Layout.nchw, q))
    y = b.layout_transform(x, to="nhwc")
    z = b.layout_transform(y, to="plain")
    b.output("z", z)
    assert y.type == TensorType((2, 4, 5, 3), DType.i8, Layout.nhwc,
                                AffineQuant((0.1, 0.2, 0.3), (0, 1, 2), axis=3))
    assert z.type == x.type.with_(layout=Layout.plain)     # the channel axis is back at 1
    bevir.verify(b.graph)
    a = np.arange(120, dtype=np.int8).reshape(2, 3, 4, 5)
    out = bevir.run(b.graph, {"x": a}, fetch=[y.name])
    assert np.array_equal(out[y.name], a.transpose(0, 2, 3, 1)) and out[y.name].flags.c_contiguous
    assert np.array_equal(out["z"], a)
    assert str(bevir.parse(str(b.graph))) == str(b.graph)
    assert get_op("layout_transform").cost(y.producer)["macs"] == 0


def test_layout_transform_plain_to_nchw_only_retags():
    b = Builder()
    x = b.input("x", TensorType((1, 2, 3, 4)))
    y = b.layout_transform(x, to="nchw")
    b.output("y", y)
    assert y.type == TensorType((1, 2, 3, 4), layout=Layout.nchw)
    assert count_transposes(b.graph) == 0 and count_layout_transforms(b.graph) == 1


@pytest.mark.parametrize("shape, layout, to, error, match", [
    ((2, 3, 4), Layout.plain, "nhwc", VerifyError, "4-D"),
    ((1, 2, 3, 4), Layout.nhwc, "nhwc", VerifyError, "already nhwc"),
    ((1, 2, 3, 4), Layout.plain, "nwhc", AttrError, "not one of"),
])
def test_layout_transform_verifier_rules(shape, layout, to, error, match):
    b = Builder()
    x = b.input("x", TensorType(shape, layout=layout))
    with pytest.raises(error, match=match):
        b.layout_transform(x, to=to)


# ---- counting ----------------------------------------------------------------------------
def test_count_layout_transforms_counts_only_nchw_nhwc_permutations():
    b = Builder()
    x = b.input("x", TensorType((2, 3, 4, 5)))
    b.output("a", b.transpose(x, perm=(0, 2, 3, 1)))      # NCHW -> NHWC: counts
    b.output("b", b.transpose(x, perm=(0, 3, 1, 2)))      # NHWC -> NCHW: counts
    b.output("c", b.transpose(x, perm=(1, 0, 2, 3)))      # moves data, not a layout change
    b.output("d", b.layout_transform(x, to="nhwc"))
    assert count_layout_transforms(b.graph) == 3
    assert count_transposes(b.graph) == 4
    b.output("e", b.transpose(b.input("u", TensorType((1, 1, 3, 4))), perm=(1, 0, 2, 3)))
    assert count_transposes(b.graph) == 4                  # only unit dims move: no data


# ---- small float nets ----------------------------------------------------------------------
def float_net(layout=Layout.nchw):
    """A stem with 3 input channels, batch norm, pools, pad, resize, slice, concat, a
    broadcast [1,C,1,1] bias, a scalar and a global average pool."""
    b = Builder("float_net")
    x = b.input("x", TensorType((2, 3, 16, 16), layout=layout))
    y = b.conv2d(x, b.const(randn(16, 3, 3, 3), "stem.w"), b.const(randn(16), "stem.b"),
                 strides=(2, 2), pads=(1, 1, 1, 1), loc="stem")
    y = b.batch_norm(y, b.const(randn(16) + 2, "bn.s"), b.const(randn(16), "bn.b"),
                     b.const(randn(16), "bn.m"), b.const(np.abs(randn(16)) + 1, "bn.v"))
    y = b.maxpool2d(b.relu(y), kernel=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    z = b.conv2d(b.pad(y, pads=(0, 0, 1, 1, 0, 0, 1, 1)), b.const(randn(16, 16, 3, 3), "c2.w"))
    z = b.add(z, b.const(randn(1, 16, 1, 1), "c2.bias"))
    z = b.avgpool2d(b.resize(z, size=(2, 16, 8, 8), mode="linear"), kernel=(2, 2), strides=(2, 2))
    z = b.slice(z, starts=(0,), ends=(8,), axes=(1,), steps=(1,))
    y = b.concat(b.mul(y, b.const(np.float32(0.5), "half")), z, axis=1)
    b.output("y", y)
    b.output("pool", b.global_avgpool(y))
    return b.graph


def test_float_net_runs_in_nhwc_bit_identically():
    graph = float_net()
    before = count_layout_transforms(graph)
    stats = to_nhwc(graph)
    bevir.verify(graph)
    assert_convs_nhwc(graph)
    assert all(n.output.type.layout is Layout.nhwc for n in graph.nodes
               if n.op not in ("layout_transform",))
    # one transform after the input, one before each of the two outputs
    assert before == 0 and count_layout_transforms(graph) == 3
    assert [n.inputs[0].name for n in layout_transforms(graph)][0] == "x"
    assert {"y", "pool"} == {k for k, v in graph.outputs.items() if v.producer.op == "layout_transform"}
    assert stats["inserted"] == 3 and stats["converted"] == 13 and stats["cancelled"] == 0
    assert graph.outputs["y"].type == TensorType((2, 24, 4, 4), layout=Layout.nchw)
    # attributes and constants follow the channel to the last axis
    ops = {n.op: n for n in graph.nodes}
    assert ops["concat"].attrs["axis"] == 3 and ops["slice"].attrs["axes"] == (3,)
    assert ops["pad"].attrs["pads"] == (0, 1, 1, 0, 0, 1, 1, 0)
    assert ops["resize"].attrs["size"] == (2, 8, 8, 16)
    bias = graph.constants["c2.bias"]
    assert bias.type == TensorType((1, 1, 1, 16), layout=Layout.nhwc)
    assert next(n for n in graph.nodes if n.op == "conv2d").loc == "stem"   # provenance kept


def test_golden_results_equal_before_and_after():
    graph = float_net()
    feed = {"x": randn(2, 3, 16, 16, seed=5)}
    ref = bevir.run(graph, feed)
    bevir.optimize(graph, "to-nhwc")
    got = bevir.run(graph, feed)
    assert all(np.array_equal(ref[k], got[k]) for k in ref)


def test_convert_outputs_leaves_them_in_nhwc():
    graph = float_net()
    feed = {"x": randn(2, 3, 16, 16, seed=5)}
    ref = bevir.run(graph, feed)
    p = make_pass("to-nhwc", convert_outputs=True)
    assert not p.semantics_preserving and make_pass("to-nhwc").semantics_preserving
    PassManager([p]).run(graph)
    assert p.statistics["inserted"] == 1 and count_layout_transforms(graph) == 1
    assert graph.outputs["y"].type == TensorType((2, 4, 4, 24), layout=Layout.nhwc)
    got = bevir.run(graph, feed)
    assert all(np.array_equal(ref[k], got[k].transpose(0, 3, 1, 2)) for k in ref)
    assert str(parse_pipeline("to-nhwc{convert_outputs=true}")[0]) == "to-nhwc{convert_outputs=true}"


def test_pass_is_registered_as_exact():
    p = make_pass("to-nhwc")
    assert isinstance(p, ToNHWC) and ToNHWC.semantics_preserving and ToNHWC.tolerance == 0.0
    assert {r.__name__ for r in ToNHWC.patterns} == {
        "CancelLayoutTransforms", "FoldTransposeLayoutTransform", "AbsorbLayoutTransformIntoReshape"}


def test_graph_without_convolutions_is_left_alone():
    b = Builder()
    x = b.input("x", TensorType((1, 2, 3, 4), layout=Layout.nchw))
    b.output("y", b.relu(b.add(x, x)))
    text = str(b.graph)
    assert find_regions(b.graph) == []
    stats = to_nhwc(b.graph)
    assert str(b.graph) == text and stats["inserted"] == 0


# ---- per-channel quantization ----------------------------------------------------------------
def test_per_channel_axis_moves_from_1_to_3():
    b = Builder("pc")
    x = b.input("x", TensorType((1, 4, 6, 6), layout=Layout.nchw))
    y = b.conv2d(x, b.const(randn(8, 4, 3, 3), "w"), pads=(1, 1, 1, 1))
    scales, zps = [0.01 * (i + 1) for i in range(8)], list(range(-4, 4))
    q = b.quantize(y, dtype="i8", scale=scales, zero_point=zps, axis=1)
    y = b.dequantize(b.relu(q))
    b.output("y", b.maxpool2d(y, kernel=(2, 2), strides=(2, 2)))
    graph = b.graph
    to_nhwc(graph, inputs={"x": randn(1, 4, 6, 6) * 3})
    qn = next(n for n in graph.nodes if n.op == "quantize")
    assert qn.attrs["axis"] == 3
    assert qn.output.type.quant == AffineQuant(tuple(scales), tuple(zps), axis=3)
    assert qn.output.type.layout is Layout.nhwc and count_layout_transforms(graph) == 2


# ---- a QOperator INT8 net from onnxruntime's quantizer ---------------------------------------
@pytest.fixture(scope="module")
def int8_net(tmp_path_factory):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
            self.pool = torch.nn.MaxPool2d(3, 2, 1)
            self.c1 = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.c2 = torch.nn.Conv2d(16, 32, 1)

        def forward(self, x):
            x = self.pool(torch.relu(self.stem(x)))
            x = torch.relu(self.c1(x)) + x
            return torch.nn.functional.adaptive_avg_pool2d(self.c2(x), 1).flatten(1)

    path = tmp_path_factory.mktemp("int8") / "float.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), torch.randn(1, 3, 32, 32), str(path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": randn(1, 3, 32, 32, seed=i)} for i in range(4)])

        def get_next(self):
            return next(self.it, None)

    out = path.with_name("int8.onnx")
    import logging
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(path), str(out), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def test_int8_qoperator_net_runs_in_nhwc_bit_identically(int8_net):
    graph = bevir.from_onnx(int8_net)
    ops = set(graph.op_counts())
    assert {"qlinear_conv", "qlinear_add", "qlinear_global_avgpool", "maxpool2d", "quantize"} <= ops
    feeds = [{"x": randn(1, 3, 32, 32, seed=10 + i) * 1.5} for i in range(3)]
    refs = [bevir.run(graph, f) for f in feeds]
    stats = to_nhwc(graph, "to-nhwc,dce", inputs=feeds[0])
    bevir.verify(graph)
    assert_convs_nhwc(graph)
    for name in ("qlinear_add", "qlinear_global_avgpool", "maxpool2d", "quantize"):
        assert all(n.output.type.layout is Layout.nhwc for n in graph.nodes if n.op == name), name
    # the weights keep their per-output-channel axis 0 (OIHW is not a data layout)
    conv = next(n for n in graph.nodes if n.op == "qlinear_conv")
    assert conv.inputs[1].type.quant.axis == 0 and conv.inputs[1].type.layout is Layout.plain
    # the input transform, and the pooled [1,1,1,32] result back to [1,32,1,1] before the
    # flatten: that one is a retag-like move of unit dimensions, no data moves
    assert stats["inserted"] == 2 and count_transposes(graph) == 1
    for f, ref in zip(feeds, refs):
        got = bevir.run(graph, f)
        assert all(np.array_equal(ref[k], got[k]) and ref[k].dtype == got[k].dtype for k in ref)


def test_qlinear_add_whose_kernel_variant_would_change_stays_nchw():
    q = AffineQuant((0.05,), (3,))
    b = Builder()
    x = b.input("x", TensorType((1, 8, 4, 4), DType.u8, Layout.nchw, q))
    y = b.qlinear_conv(x, b.const(np.ones((8, 8, 1, 1), np.int8), "w",
                                  TensorType((8, 8, 1, 1), DType.i8, quant=AffineQuant((0.02,), (0,)))),
                       out_dtype="u8", out_scale=0.1, out_zero_point=5)
    bias = b.const(np.arange(8, dtype=np.uint8).reshape(1, 8, 1, 1), "bias",
                   TensorType((1, 8, 1, 1), DType.u8, quant=AffineQuant((0.1,), (0,))))
    s = b.qlinear_add(y, bias, out_dtype="u8", out_scale=0.2, out_zero_point=1)
    b.output("s", s)
    assert "kernel variant" in why_not_nhwc(s.producer)
    to_nhwc(b.graph)
    assert s.producer.graph is b.graph and s.type.layout is Layout.nchw
    assert_convs_nhwc(b.graph)


# ---- region boundaries -----------------------------------------------------------------------
def boundary_net():
    """conv -> reshape [N,C,HW] -> matmul over HW -> reshape [N,C,H,W] -> conv."""
    b = Builder("boundary")
    x = b.input("x", TensorType((1, 16, 4, 6), layout=Layout.nchw))
    y = b.conv2d(x, b.const(randn(16, 16, 3, 3), "c1.w"), pads=(1, 1, 1, 1))
    t = b.matmul(b.reshape(y, shape=(1, 16, 24)), b.const(randn(24, 24), "mix"))
    y = b.conv2d(b.reshape(t, shape=(1, 16, 4, 6)), b.const(randn(8, 16, 1, 1), "c2.w"))
    b.output("y", y)
    return b.graph


def test_region_boundary_in_the_middle_gets_exactly_the_needed_transforms():
    graph = boundary_net()
    assert [[n.op for n in r] for r in find_regions(graph)] == [["conv2d"], ["conv2d"]]
    stats = to_nhwc(graph)
    assert_convs_nhwc(graph)
    # The matmul mixes the HW axis of a channel-major [N,C,HW] tensor; in NHWC memory
    # that axis is strided by C, so no reshape can present it: the data must be NCHW
    # there. Needed: the input (declared NCHW) in, NCHW before the first reshape, NHWC
    # after the second, and the output back to its declared type (plain 4-D, as the
    # reshape made it): four, and no more.
    assert [(n.inputs[0].producer.op if n.inputs[0].producer else "input", n.attrs["to"])
            for n in layout_transforms(graph)] == [
        ("input", "nhwc"), ("conv2d", "nchw"), ("reshape", "nhwc"), ("conv2d", "plain")]
    assert stats["inserted"] == 4 and stats["cancelled"] == 0
    text = str(graph)                       # a second run finds nothing left to do
    assert find_regions(graph) == [] and to_nhwc(graph)["inserted"] == 0 and str(graph) == text
    # the reshape reads NCHW order out of NHWC memory: no cheaper form exists
    assert explain(graph, "absorb-layout-transform-into-reshape") == (
        "absorb-layout-transform-into-reshape: best candidate reshape %1: matched, but "
        "declined: the chain is already as cheap as one transpose between reshapes")
    for n in graph.nodes:                                 # any node can be asked
        assert explain(graph, "absorb-layout-transform-into-reshape", n)


def test_unsupported_neighbour_reasons():
    graph = boundary_net()
    mm = next(n for n in graph.nodes if n.op == "matmul")
    assert "no NHWC form" in why_not_nhwc(mm)
    rs = next(n for n in graph.nodes if n.op == "reshape")
    assert "no NHWC form" in why_not_nhwc(rs)


# ---- sinking and cancelling -------------------------------------------------------------------
def pattern_stats(graph):
    stats = to_nhwc(graph, "to-nhwc,dce")
    return {k: v for k, v in stats.items() if "-" in k}


def test_layout_transform_pairs_cancel():
    b = Builder()
    x = b.input("x", TensorType((1, 2, 3, 4), layout=Layout.nchw))
    u = b.input("u", TensorType((1, 2, 3, 4)))
    y = b.layout_transform(b.layout_transform(x, to="nhwc"), to="nchw")
    z = b.layout_transform(b.layout_transform(u, to="nhwc"), to="nchw")   # plain -> nchw
    b.output("y", b.relu(y))
    b.output("z", b.relu(z))
    assert pattern_stats(b.graph) == {"cancel-layout-transforms": 2}
    assert b.graph.outputs["y"].producer.inputs[0].name == "x"
    (retag,) = layout_transforms(b.graph)                  # only the tag changes: no data moves
    assert retag.inputs[0].name == "u" and retag.attrs["to"] == "nchw" and count_transposes(b.graph) == 0


def test_transpose_of_layout_transform_folds():
    b = Builder()
    x = b.input("x", TensorType((2, 3, 4, 5), layout=Layout.nhwc))
    back = b.layout_transform(x, to="plain")                      # [2,5,3,4]
    b.output("same", b.transpose(b.layout_transform(x, to="plain"), perm=(0, 2, 3, 1)))
    b.output("one", b.transpose(back, perm=(1, 0, 2, 3)))        # composes to one transpose
    v = b.input("v", TensorType((1, 1, 4, 5), layout=Layout.nhwc))
    b.output("unit", b.transpose(b.layout_transform(v, to="plain"), perm=(1, 0, 2, 3)))
    w = b.input("w", TensorType((2, 3, 4, 5), layout=Layout.nchw))
    b.output("lt", b.layout_transform(b.transpose(w, perm=(1, 0, 2, 3)), to="nhwc"))
    feed = {"x": randn(2, 3, 4, 5), "v": randn(1, 1, 4, 5), "w": randn(2, 3, 4, 5)}
    ref = bevir.run(b.graph, feed)
    assert pattern_stats(b.graph) == {"fold-transpose-layout-transform": 4}
    got = bevir.run(b.graph, feed)
    assert all(np.array_equal(ref[k], got[k]) for k in ref)
    out = {k: v.producer.op for k, v in b.graph.outputs.items()}
    assert out == {"same": "reshape", "one": "transpose", "unit": "transpose", "lt": "reshape"}
    assert b.graph.outputs["one"].producer.attrs["perm"] == (3, 0, 1, 2)
    assert b.graph.outputs["unit"].producer.inputs[0].name == "v"
    # transpose + layout_transform: one transpose in NHWC memory order, the reshape tags it
    lt = b.graph.outputs["lt"].producer
    assert lt.attrs["layout"] == "nhwc" and lt.inputs[0].producer.op == "transpose"
    assert b.graph.outputs["lt"].type.layout is Layout.nhwc
    assert count_transposes(b.graph) == 3


def test_nchw_to_nhwc_transpose_after_a_conv_disappears():
    b = Builder()
    x = b.input("x", TensorType((1, 16, 4, 4)))
    y = b.conv2d(x, b.const(randn(16, 16, 1, 1), "w"))
    b.output("y", b.transpose(y, perm=(0, 2, 3, 1)))            # the model wants NHWC out
    assert count_layout_transforms(b.graph) == 1
    to_nhwc(b.graph)
    assert [n.op for n in b.graph.nodes] == ["layout_transform", "conv2d", "reshape"]
    assert count_layout_transforms(b.graph) == 1                  # only the input's


@pytest.mark.parametrize("form", ["reshape-transpose", "transpose-reshape", "permute-unsqueeze"])
def test_token_major_bridge_absorbs_the_transform(form):
    """The BEVFormer bridge, small: a [N,C,H,W] feature read as tokens [N,HW,C] is NHWC
    memory in order: one reshape, no transform."""
    b = Builder("bridge")
    x = b.input("x", TensorType((2, 16, 3, 5), layout=Layout.nchw))
    f = b.conv2d(x, b.const(randn(8, 16, 1, 1), "w"))
    if form == "reshape-transpose":
        tokens = b.transpose(b.reshape(f, shape=(2, 8, 15)), perm=(0, 2, 1))
    elif form == "transpose-reshape":
        tokens = b.reshape(b.transpose(f, perm=(0, 2, 3, 1)), shape=(2, 15, 8))
    else:   # torch's f.flatten(2).permute(2, 0, 1)[None]: [1, HW, N, C] tokens
        tokens = b.unsqueeze(b.transpose(b.reshape(f, shape=(2, 8, 15)), perm=(2, 0, 1)), axes=(0,))
    b.output("tokens", b.layer_norm(tokens))
    stats = to_nhwc(b.graph, "to-nhwc,dce")
    assert count_layout_transforms(b.graph) == 1 and layout_transforms(b.graph)[0].inputs[0].name == "x"
    moves = [n.op for n in b.graph.nodes if n.op in ("transpose", "reshape")]
    if form == "permute-unsqueeze":     # tokens [HW, N, C] from [N, HW, C]: one real transpose
        assert moves == ["reshape", "transpose"] and count_transposes(b.graph) == 2
    else:
        assert moves == ["reshape"] and count_transposes(b.graph) == 1
    assert stats["absorb-layout-transform-into-reshape"] == 1 and stats["cancelled"] == 1


def test_shared_back_transforms_are_per_consumer():
    """A region value read by a bridge and by another consumer: the bridge still absorbs
    its own transform."""
    b = Builder()
    x = b.input("x", TensorType((1, 8, 2, 3), layout=Layout.nchw))
    f = b.conv2d(x, b.const(randn(8, 8, 1, 1), "w"))
    b.output("tokens", b.transpose(b.reshape(f, shape=(1, 8, 6)), perm=(0, 2, 1)))
    b.output("grid", b.grid_sample(f, b.const(np.zeros((1, 2, 2, 2), np.float32), "g")))
    to_nhwc(b.graph, "to-nhwc,dce")
    assert b.graph.outputs["tokens"].producer.op == "reshape"
    assert b.graph.outputs["grid"].producer.inputs[0].producer.op == "layout_transform"
    assert count_layout_transforms(b.graph) == 2


# ---- BEVFormer (test config) -------------------------------------------------------------------
def test_bevformer_test_graph_through_to_nhwc(tmp_path):
    from examples.bevformer import e2e
    from examples.bevformer.config import CONFIGS
    from examples.bevformer.inputs import make_inputs
    from examples.bevformer.weights import build_model

    cfg = CONFIGS["test"]
    inputs = make_inputs(cfg, 0, with_prev_bev=True)
    graph = e2e.build_graph(build_model(cfg, seed=0).eval(), inputs, tmp_path)
    feed = e2e.golden_inputs(graph, inputs)
    ref = bevir.run(graph, feed)
    baseline = graph.clone()
    bevir.optimize(baseline, "canonicalize,cse,dce")
    before = (count_layout_transforms(graph), count_transposes(graph), len(graph.nodes))

    # every pass here declares tolerance 0: VerifyNumerics holds each to bit-identity
    stats, numerics = Statistics(), VerifyNumerics(feed)
    PassManager("canonicalize,to-nhwc,cse,dce", instruments=[stats, numerics]).run(graph)
    bevir.verify(graph)
    got = bevir.run(graph, feed)
    after = (count_layout_transforms(graph), count_transposes(graph), len(graph.nodes))
    diff = max(float(np.abs(ref[k] - got[k]).max()) for k in ref)
    print(f"\nBEVFormer test: layout transforms {before[0]} -> {after[0]}, transposes "
          f"{before[1]} -> {after[1]}, nodes {before[2]} -> {after[2]} (canonicalize,cse,dce "
          f"alone: {len(baseline.nodes)}), max |diff| {diff:g}, bit-identical "
          f"{all(np.array_equal(ref[k], got[k]) for k in ref)}\n{stats.report()}")
    assert all(np.array_equal(ref[k], got[k]) for k in ref), diff
    assert [c.pass_text for c in numerics.checks if c.changed] == ["canonicalize", "to-nhwc",
                                                                    "cse", "dce"]
    assert_convs_nhwc(graph)
    # The fewest transforms this graph allows: the image input is declared NCHW
    # [6,3,H,W] and the convolutions run in NHWC, so one transform must follow it; the
    # bridge reads the feature [6,C,h,w] as tokens [6,hw,C], which is NHWC memory in
    # order, so a reshape serves and it needs no transform: one in all.
    (only,) = [n for n in graph.nodes if is_layout_transform(n)]
    assert only.op == "layout_transform" and only.inputs[0].name == "img"
    feats = graph.value("feats")
    assert feats.type.layout is Layout.nhwc and [u.op for u in feats.users] == ["reshape"]
    # the bridge's transpose went away and the input transform came: as many data
    # permutations as before, and as many nodes as canonicalize,cse,dce gives
    assert count_transposes(graph) == count_transposes(baseline)
    assert len(graph.nodes) == len(baseline.nodes)



def test_channel_shuffle_between_convolutions_stays_nhwc():
    """ShuffleNet's shuffle (reshape, transpose, reshape) between two NHWC convolutions
    becomes one transpose in NHWC memory order, bit for bit; no transform back to NCHW."""
    import torch
    from bevir.testing.zoo import channel_shuffle

    class Shuffle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 1)

        def forward(self, x):
            return self.b(channel_shuffle(self.a(x), 2))

    g = bevir.from_torch(Shuffle().eval(), [torch.randn(1, 3, 6, 5)])
    feed = {"x": randn(1, 3, 6, 5)}
    ref = bevir.run(g, feed)
    bevir.optimize(g, "to-nhwc")
    assert np.array_equal(bevir.run(g, feed)["output_0"], ref["output_0"])
    assert count_layout_transforms(g) == 2                        # the input and the output
    (shuffle,) = [n for n in g.nodes if n.op == "transpose"]
    assert shuffle.inputs[0].producer.inputs[0].type.layout is Layout.nhwc
    assert shuffle.output.uses[0][0].attrs["layout"] == "nhwc"


# ---- layout changes move data only: the zoo's shapes where a LayerNorm reads the region ----
def conv_of(b, y, cin: int, cout: int, k: int, seed: int, stride: int = 1, groups: int = 1,
            act: str | None = None):
    """conv2d (conv2d_act with ``act``) of ``y`` with random weights and bias."""
    w, bias = b.const(randn(cout, cin // groups, k, k, seed=seed)), b.const(randn(cout, seed=seed))
    attrs = dict(strides=(stride, stride), pads=(k // 2 if stride == 1 else 0,) * 4,
                 groups=groups)
    return b.conv2d_act(y, w, bias, activation=act, **attrs) if act else b.conv2d(y, w, bias, **attrs)


def norm_of(b, y, c: int, seed: int):
    """LayerNorm over the last axis (``c`` wide) of ``y``."""
    return b.layer_norm(y, b.const(1 + randn(c, seed=seed)), b.const(randn(c, seed=seed + 1)),
                        epsilon=1e-6)


def convnext_downsample(b, x):
    """A residual depthwise block, the LayerNorm of its transpose, and the stride-2
    downsample conv reading the LayerNorm's transpose (ConvNeXt, EdgeNeXt)."""
    y = b.add(conv_of(b, x, 16, 16, 7, 1, groups=16), x)
    y = b.transpose(norm_of(b, b.transpose(y, perm=(0, 2, 3, 1)), 16, 2), perm=(0, 3, 1, 2))
    return conv_of(b, y, 16, 32, 2, 3, stride=2)


def channels_norm_after_silu(b, x):
    """conv2d_act with SiLU, the LayerNorm over its channels (a transpose either side),
    another conv2d_act (MobileViT's convolutions around its transformer)."""
    y = conv_of(b, x, 16, 16, 3, 1, act="silu")
    y = b.transpose(norm_of(b, b.transpose(y, perm=(0, 2, 3, 1)), 16, 2), perm=(0, 3, 1, 2))
    return conv_of(b, y, 16, 16, 1, 3, act="silu")


def tokens_after_silu(b, x):
    """conv2d_act with SiLU read as tokens: reshape to [N, C, HW], transpose to [N, HW, C],
    LayerNorm, and back into a conv (absorb-layout-transform-into-reshape)."""
    y = conv_of(b, x, 16, 16, 3, 1, act="silu")
    t = norm_of(b, b.transpose(b.reshape(y, shape=(1, 16, 256)), perm=(0, 2, 1)), 16, 2)
    y = b.reshape(b.transpose(t, perm=(0, 2, 1)), shape=(1, 16, 16, 16))
    return conv_of(b, y, 16, 16, 1, 3, act="silu")


def mobilevit_unfold(b, x):
    """conv2d_act with SiLU, a 1x1 conv, MobileViT's unfolding into 2x2 patches of tokens
    (reshape, transpose, reshape, transpose, reshape) and its transformer's LayerNorm."""
    y = conv_of(b, conv_of(b, x, 16, 16, 3, 1, act="silu"), 16, 16, 1, 2)
    y = b.transpose(b.reshape(y, shape=(128, 2, 8, 2)), perm=(0, 2, 1, 3))
    y = b.transpose(b.reshape(y, shape=(1, 16, 64, 4)), perm=(0, 3, 2, 1))
    return norm_of(b, b.reshape(y, shape=(4, 64, 16)), 16, 3)


@pytest.mark.parametrize("make", [convnext_downsample, channels_norm_after_silu,
                                  tokens_after_silu, mobilevit_unfold],
                         ids=lambda f: f.__name__)
def test_layout_changes_keep_the_bits_of_what_reads_the_region(make):
    """The standard pipeline keeps every claim (VerifyNumerics: each rewrite against its
    own pattern's), and every prefix of to-nhwc's rewrites gives the golden bits: the
    LayerNorm reading a region's value (its transpose, a reshape of it) once summed in
    the order the value happened to lie in memory, and a layout change moved that
    (5.4e-7 on ConvNeXt's downsample, 3.7e-6 after MobileViT's SiLU convolutions)."""
    b = Builder(make.__name__)
    x = b.input("x", TensorType((1, 16, 16, 16)))
    b.output("y", make(b, x))
    graph = b.graph
    feed = {"x": randn(1, 16, 16, 16, seed=9)}
    PassManager("canonicalize,fuse,to-nhwc,canonicalize,cse,dce",
                instruments=[VerifyNumerics(feed)]).run(graph.clone())
    bevir.optimize(graph, "canonicalize,fuse")
    want = bevir.run(graph, feed)["y"]
    with limit_rewrites(None) as log:
        bevir.optimize(graph.clone(), "to-nhwc")
    assert log.count >= 2
    for k in range(1, log.count + 1):
        g = graph.clone()
        with limit_rewrites(k):
            bevir.optimize(g, "to-nhwc")
        got = bevir.run(g, feed)["y"]
        assert int((got != want).sum()) == 0, f"{log.entries[k - 1]}: results changed"
