"""bevir.from_onnx on torch-exported models (checked against onnxruntime), on small
hand-built models for the corners the node tests do not reach, and on bad input."""
from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bevir
from bevir.frontends.onnx import NonConstantInputError, OnnxLoadError

nn = torch.nn


def _export(model, args, path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), dynamo=False, opset_version=17, **kw)
    return path


def _ort(path_or_model, feeds):
    src = path_or_model if isinstance(path_or_model, (str, bytes)) else \
        (path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto)
         else str(path_or_model))
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def _check_against_ort(model, feeds, rtol=1e-4, atol=1e-5):
    graph = bevir.from_onnx(model)
    bevir.verify(graph)
    got = bevir.run(graph, feeds)
    want = _ort(model, feeds)
    assert set(want) <= set(got)
    for k, ref in want.items():
        assert got[k].dtype == ref.dtype and got[k].shape == ref.shape, k
        np.testing.assert_allclose(got[k], ref, rtol=rtol, atol=atol, err_msg=k)
    return graph


# ---- torch models ---------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class _ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(3)     # not after a conv: stays a BatchNormalization
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layer1 = _Block(8, 8, 1)
        self.layer2 = _Block(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(self.norm(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class _TransformerBlock(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2, self.act = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.GELU()

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def _randomize_bn(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


@pytest.fixture(scope="module")
def resnet_path(tmp_path_factory):
    torch.manual_seed(0)
    model = _randomize_bn(_ResNet())
    path = tmp_path_factory.mktemp("onnx") / "resnet.onnx"
    return _export(model, (torch.randn(2, 3, 32, 32),), path, input_names=["image"],
                   output_names=["logits"])


@pytest.fixture(scope="module")
def transformer_path(tmp_path_factory):
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("onnx") / "block.onnx"
    # dynamic axes make torch emit the Shape -> Gather -> Concat -> Reshape chains
    return _export(_TransformerBlock(), (torch.randn(2, 6, 32),), path,
                   input_names=["tokens"], output_names=["out"],
                   dynamic_axes={"tokens": {0: "batch", 1: "seq"}})


def _make_static(model: onnx.ModelProto, name: str, shape) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    vi = next(i for i in m.graph.input if i.name == name)
    for d, n in zip(vi.type.tensor_type.shape.dim, shape):
        d.Clear()
        d.dim_value = n
    return m


def test_resnet_matches_onnxruntime(resnet_path):
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    graph = _check_against_ort(str(resnet_path), {"image": x})
    ops = graph.op_counts()
    for op in ("conv2d", "batch_norm", "maxpool2d", "global_avgpool", "add", "relu", "gemm"):
        assert op in ops, ops
    assert [v.name for v in graph.inputs] == ["image"]
    assert list(graph.outputs) == ["logits"]
    assert graph.outputs["logits"].type.shape == (2, 10)


def test_transformer_matches_onnxruntime(transformer_path):
    m = onnx.load(str(transformer_path))
    assert {"Shape", "Gather", "Concat", "Reshape"} <= {n.op_type for n in m.graph.node}
    with pytest.raises(bevir.UnsupportedError, match="symbolic"):
        bevir.from_onnx(m)
    x = np.random.default_rng(1).standard_normal((2, 6, 32), dtype=np.float32)
    graph = bevir.from_onnx(_make_static(m, "tokens", x.shape))
    got = bevir.run(graph, {"tokens": x})["out"]
    np.testing.assert_allclose(got, _ort(transformer_path, {"tokens": x})["out"],
                               rtol=1e-4, atol=1e-5)
    ops = graph.op_counts()
    for op in ("layer_norm", "matmul", "softmax", "reshape", "transpose", "erf", "split"):
        assert op in ops, ops
    # the shape arithmetic folded away entirely
    assert not {"gather", "concat", "cast", "unsqueeze"} & set(ops), ops


def test_provenance_and_names(resnet_path):
    m = onnx.load(str(resnet_path))
    onnx_names = {n.name for n in m.graph.node}
    graph = bevir.from_onnx(resnet_path)     # a PathLike works too
    assert all(n.loc in onnx_names for n in graph.nodes)
    locs = {n.loc for n in graph.nodes}
    assert {"/stem/stem.0/Conv", "/layer1/Add", "/fc/Gemm", "/norm/BatchNormalization"} <= locs
    # node results keep the ONNX value names; initializers keep theirs
    produced = {o for n in m.graph.node for o in n.output}
    conv = next(n for n in graph.nodes if n.loc == "/stem/stem.0/Conv")
    onnx_conv = next(n for n in m.graph.node if n.name == "/stem/stem.0/Conv")
    assert conv.outputs[0].name == onnx_conv.output[0] in produced
    assert conv.inputs[1].is_const and conv.inputs[1].name == onnx_conv.input[1]


def test_decomposition_keeps_provenance():
    # opset 11 Softmax on axis 1 of a 3-D tensor: reshape -> softmax -> reshape, all from
    # the one ONNX node
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1, name="sm")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 11)])
    a = np.random.default_rng(2).standard_normal((2, 3, 4), dtype=np.float32)
    graph = _check_against_ort(model, {"x": a})
    assert [n.op for n in graph.nodes] == ["reshape", "softmax", "reshape"]
    assert {n.loc for n in graph.nodes} == {"sm"}
    assert graph.outputs["y"].name == "y"


# ---- hand-built corners, against onnxruntime -------------------------------------------------

def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_and_pool_auto_pad(auto_pad):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 2), dtype=np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad=auto_pad, strides=[2, 2],
                              name="conv"),
             helper.make_node("MaxPool", ["c"], ["y"], auto_pad=auto_pad, kernel_shape=[2, 3],
                              strides=[2, 1], name="pool")]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 3, 9, 8])],
                   [_vi("y", TensorProto.FLOAT, None)], [_const("w", w)])
    _check_against_ort(model, {"x": rng.standard_normal((1, 3, 9, 8), dtype=np.float32)})


def test_split_uneven_num_outputs_and_slice():
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
             helper.make_node("Slice", ["a", "st", "en", "ax", "sp"], ["s"])]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 7, 5])],
                   [_vi(n, TensorProto.FLOAT, None) for n in "bcs"],
                   [_const("st", np.array([-1, 4], np.int64)),
                    _const("en", np.array([-2**63, -100], np.int64)),
                    _const("ax", np.array([2, -2], np.int64)),
                    _const("sp", np.array([-2, -1], np.int64))], opset=18)
    _check_against_ort(model, {"x": np.arange(70, dtype=np.float32).reshape(2, 7, 5)})


def test_reshape_zero_and_minus_one_and_int_clip():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Clip", ["r", "lo", "hi"], ["y"])]
    model = _model(nodes, [_vi("x", TensorProto.INT64, [2, 3, 4])],
                   [_vi("y", TensorProto.INT64, None)],
                   [_const("shape", np.array([0, -1], np.int64)),
                    _const("lo", np.array(-3, np.int64)), _const("hi", np.array(5, np.int64))])
    graph = _check_against_ort(model, {"x": np.arange(-12, 12, dtype=np.int64).reshape(2, 3, 4)})
    assert graph.outputs["y"].type.shape == (2, 12)


def test_resize_scales_and_reduce_axes_input():
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="linear"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], keepdims=0)]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 2, 3, 4])],
                   [_vi("y", TensorProto.FLOAT, None)],
                   [_const("scales", np.array([1, 1, 2, 1.5], np.float32)),
                    _const("axes", np.array([-1], np.int64))], opset=18)
    x = np.random.default_rng(4).standard_normal((1, 2, 3, 4), dtype=np.float32)
    graph = _check_against_ort(model, {"x": x})
    assert graph.outputs["y"].type.shape == (1, 2, 6)


def test_constant_folding_of_shape_arithmetic():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape, plus ConstantOfShape and Range
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
             helper.make_node("Unsqueeze", ["d0", "ax0"], ["d0u"]),
             helper.make_node("Concat", ["d0u", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["flat", "nf"], ["scaled"]),
             helper.make_node("Range", ["r0", "r1", "r2"], ["rng"]),
             helper.make_node("Cast", ["rng"], ["rngf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["scaled", "rngf"], ["y"])]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [3, 2, 2])],
                   [_vi("y", TensorProto.FLOAT, None)],
                   [_const("i0", np.array(0, np.int64)), _const("ax0", np.array([0], np.int64)),
                    _const("m1", np.array([-1], np.int64)), _const("r0", np.array(0, np.int64)),
                    _const("r1", np.array(8, np.int64)), _const("r2", np.array(2, np.int64))])
    x = np.random.default_rng(5).standard_normal((3, 2, 2), dtype=np.float32)
    graph = _check_against_ort(model, {"x": x})
    assert [n.op for n in graph.nodes] == ["reshape", "div", "add"]
    assert graph.nodes[0].attrs["shape"] == (3, 4)
    assert {n.loc for n in graph.nodes} == {"Reshape_4", "Div_7", "Add_10"}


# ---- errors ---------------------------------------------------------------------------------

def test_unknown_op_names_op_and_node():
    model = _model([helper.make_node("FancyOp", ["x"], ["y"], name="fancy_1")],
                   [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])])
    with pytest.raises(bevir.UnsupportedError) as e:
        bevir.from_onnx(model)
    assert e.value.op == "FancyOp" and e.value.node == "fancy_1"
    assert "FancyOp" in str(e.value) and "fancy_1" in str(e.value) and "17" in str(e.value)


@pytest.mark.parametrize("opset", [5, 29])
def test_wrong_opset(opset):
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])],
                   opset=opset)
    with pytest.raises(bevir.UnsupportedError, match=f"opset {opset}"):
        bevir.from_onnx(model)


def test_truncated_file_raises_bevir_error(resnet_path, tmp_path):
    data = resnet_path.read_bytes()
    for cut in (len(data) // 2, len(data) - 7, 100, 3):
        bad = tmp_path / f"cut{cut}.onnx"
        bad.write_bytes(data[:cut])
        with pytest.raises(bevir.BevirError):
            bevir.from_onnx(bad)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(OnnxLoadError):
        bevir.from_onnx(str(garbage))


def test_non_constant_reshape_shape():
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                   [_vi("x", TensorProto.FLOAT, [2, 3]), _vi("shape", TensorProto.INT64, [2])],
                   [_vi("y", TensorProto.FLOAT, None)])
    with pytest.raises(bevir.UnsupportedError) as e:
        bevir.from_onnx(model)
    assert isinstance(e.value, NonConstantInputError) and e.value.value_name == "shape"
    assert e.value.op == "Reshape" and e.value.node == "rs" and "opset 17" in str(e.value)


def test_symbolic_input_dim():
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, ["batch", 3])], [_vi("y", TensorProto.FLOAT, None)])
    with pytest.raises(bevir.UnsupportedError, match="batch"):
        bevir.from_onnx(model)


def _conv_relu(declared) -> onnx.ModelProto:
    """[1, 3, 8, 8] -> Conv (pads 1) -> Relu -> y [1, 4, 8, 8], y declared as ``declared``."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [_vi("y", TensorProto.FLOAT, declared)],
                  [_const("w", np.ones((4, 3, 3, 3), np.float32))])


@pytest.mark.parametrize("declared", [[1, 4, 8, 8], ["batch", 4, "h", "w"], [None] * 4, None],
                         ids=["exact", "symbolic", "unknown-dims", "no-shape"])
def test_declared_output_shape_that_agrees_is_accepted(declared):
    g = bevir.from_onnx(_conv_relu(declared))
    assert g.outputs["y"].type.shape == (1, 4, 8, 8)


@pytest.mark.parametrize("declared, text", [
    ([1, 4, 8, 9], "[1, 4, 8, 9]"),
    (["batch", 5, 8, 8], "['batch', 5, 8, 8]"),
    ([1, 4, 64], "[1, 4, 64]"),
    ([1, 4, 8, 8, 1], "[1, 4, 8, 8, 1]"),
    ([], "[]"),
])
def test_declared_output_shape_that_contradicts_inference_is_refused(declared, text):
    with pytest.raises(bevir.VerifyError) as e:
        bevir.from_onnx(_conv_relu(declared))
    assert e.value.message == f"graph output 'y' declares shape {text}, its nodes compute " \
                              "[1, 4, 8, 8]"
    assert (e.value.op, e.value.loc) == ("relu", "relu")


@pytest.mark.parametrize("node, what", [
    (helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="BOGUS"), "auto_pad"),
    (helper.make_node("Resize", ["x", "", "s"], ["y"], antialias=1, mode="linear"), "antialias"),
    (helper.make_node("Relu", ["x"], ["y"], some_attr=3), "some_attr"),
])
def test_unsupported_attributes(node, what):
    inits = [_const("w", np.ones((2, 3, 1, 1), np.float32)),
             _const("s", np.array([1, 1, 0.5, 0.5], np.float32))]
    model = _model([node], [_vi("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                   [_vi(o, TensorProto.FLOAT, None) for o in node.output], inits)
    with pytest.raises(bevir.UnsupportedError, match=what):
        bevir.from_onnx(model)


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 0], "strides": [2], "dilations": [2]},
                                   {"auto_pad": "SAME_UPPER"}])
def test_conv1d_and_pool1d_run_as_2d_over_rows(rng, attrs):
    """1-D Conv / MaxPool / AveragePool: 2-D ops over rows of height 1, as onnxruntime runs them."""
    import onnxruntime as ort
    w = rng.standard_normal((4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], **attrs),
             helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2], **attrs),
             helper.make_node("AveragePool", ["c"], ["a"], kernel_shape=[3],       # opset 17:
                              **{k: v for k, v in attrs.items() if k != "dilations"})]  # none
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [2, 3, 17])],
                   [_vi("m", TensorProto.FLOAT, None), _vi("a", TensorProto.FLOAT, None)],
                   [_const("w", w)])
    g = bevir.from_onnx(model)
    assert g.op_counts()["conv2d"] == 1 and g.outputs["m"].type.rank == 3
    x = rng.standard_normal((2, 3, 17)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString()).run(["m", "a"], {"x": x})
    got = bevir.run(g, {"x": x})
    for name, r in zip(("m", "a"), ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_match_onnxruntime(rng, storage_order):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 2], strides=[2, 1],
                            pads=[1, 0, 1, 1], storage_order=storage_order)
    model = _model([node], [_vi("x", TensorProto.FLOAT, [2, 3, 7, 6])],
                   [_vi("y", TensorProto.FLOAT, None), _vi("i", TensorProto.INT64, None)])
    x = np.round(rng.standard_normal((2, 3, 7, 6)), 1).astype(np.float32)     # with ties
    g = bevir.from_onnx(model)
    got = bevir.run(g, {"x": x})
    ref = ort.InferenceSession(model.SerializeToString()).run(["y", "i"], {"x": x})
    np.testing.assert_array_equal(got["y"], ref[0])
    np.testing.assert_array_equal(got["i"], ref[1])


def test_conv3d_unsupported():
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"])],
                   [_vi("x", TensorProto.FLOAT, [1, 3, 4, 4, 4])], [_vi("y", TensorProto.FLOAT, None)],
                   [_const("w", np.ones((2, 3, 3, 3, 3), np.float32))])
    with pytest.raises(bevir.UnsupportedError, match="3-D convolution"):
        bevir.from_onnx(model)


def _opset11_cases():
    empty = np.zeros(0, np.float32)
    return {
        "squeeze_unsqueeze_attr": (
            [helper.make_node("Squeeze", ["x"], ["s"], axes=[-3]),
             helper.make_node("Unsqueeze", ["s"], ["y"], axes=[0, -1])], [1, 1, 3, 4], []),
        "squeeze_all_ones": ([helper.make_node("Squeeze", ["x"], ["y"])], [1, 3, 1, 4], []),
        "reduce_attr_axes": (
            [helper.make_node("ReduceSum", ["x"], ["a"], axes=[1, -1], keepdims=0),
             helper.make_node("ReduceMax", ["x"], ["y"], axes=[2])], [2, 3, 4, 5], []),
        "split_attr": ([helper.make_node("Split", ["x"], ["y", "z"], axis=-1, split=[1, 4])],
                       [2, 3, 5], []),
        "split_even": ([helper.make_node("Split", ["x"], ["y", "z"], axis=1)], [2, 4, 5], []),
        "log_softmax_coerced": ([helper.make_node("LogSoftmax", ["x"], ["y"])], [2, 3, 4], []),
        "softmax_axis0": ([helper.make_node("Softmax", ["x"], ["y"], axis=0)], [2, 3], []),
        "clip_max_only": ([helper.make_node("Clip", ["x", "", "hi"], ["y"])], [3, 4],
                          [_const("hi", np.array(0.3, np.float32))]),
        "pad_value_reflect": (
            [helper.make_node("Pad", ["x", "p", "v"], ["a"]),
             helper.make_node("Pad", ["a", "p"], ["y"], mode="reflect")], [1, 2, 3, 4],
            [_const("p", np.array([0, 0, 1, 2, 0, 1, 2, 1], np.int64)),
             _const("v", np.array(1.5, np.float32))]),
        "resize_sizes_roi": (
            [helper.make_node("Resize", ["x", "roi", "sc", "sz"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
            [1, 2, 3, 4], [_const("roi", empty), _const("sc", empty),
                           _const("sz", np.array([1, 2, 7, 5], np.int64))]),
        "gemm_trans_leaky": (
            [helper.make_node("Gemm", ["x", "w", "b"], ["g"], alpha=0.5, beta=2.0, transB=1),
             helper.make_node("LeakyRelu", ["g"], ["y"], alpha=0.2)], [3, 4],
            [_const("w", np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)),
             _const("b", np.linspace(-1, 1, 5, dtype=np.float32))]),
        "tile_expand_where": (
            [helper.make_node("Tile", ["x", "r"], ["t"]),
             helper.make_node("Expand", ["t", "e"], ["u"]),
             helper.make_node("Greater", ["u", "zero"], ["m"]),
             helper.make_node("Where", ["m", "u", "zero"], ["y"])], [2, 3],
            [_const("r", np.array([2, 1], np.int64)), _const("e", np.array([2, 1, 1], np.int64)),
             _const("zero", np.array(0, np.float32))]),
    }


@pytest.mark.parametrize("name", sorted(_opset11_cases()))
def test_opset11_forms_match_onnxruntime(name):
    """Attribute-era forms (Squeeze/Unsqueeze/Reduce axes, Split split), opset-11 Softmax
    coercion, optional inputs and a few decompositions, against onnxruntime."""
    f = TensorProto.FLOAT
    nodes, shape, inits = _opset11_cases()[name]
    produced = {o for n in nodes for o in n.output}
    consumed = {i for n in nodes for i in n.input}
    outs = sorted(produced - consumed) or [nodes[-1].output[0]]
    model = _model(nodes, [_vi("x", f, shape)], [_vi(o, f, None) for o in outs], inits,
                   opset=11)
    x = np.random.default_rng(6).standard_normal(shape, dtype=np.float32)
    _check_against_ort(model, {"x": x})


def test_unsorted_nodes_are_sorted():
    nodes = [helper.make_node("Relu", ["t"], ["y"]), helper.make_node("Neg", ["x"], ["t"])]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [3])], [_vi("y", TensorProto.FLOAT, None)])
    graph = bevir.from_onnx(model)
    assert [(n.op, n.loc) for n in graph.nodes] == [("neg", "Neg_1"), ("relu", "Relu_0")]
    x = np.array([-1, 0, 2], np.float32)
    np.testing.assert_array_equal(bevir.run(graph, {"x": x})["y"], np.maximum(-x, 0))
