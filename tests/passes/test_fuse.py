"""The fuse pass: each pattern where it matches (op kinds after, golden results before and
after within the pattern's tolerance, bit-identical where the arithmetic is the same) and
where it does not (the reason explain() gives); options, statistics, the fixpoint, and the
BEVFormer test graph."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from torch import nn

import bevir
from bevir import Builder, DType, Layout, PassError, TensorType
from bevir.ir.graph import Graph
from bevir.ir.types import AffineQuant
from bevir.passes import (CostSummary, PassManager, Statistics, VerifyNumerics,
                          count_layout_transforms)
from bevir.passes.fuse import Fuse
from bevir.passes.patterns import (ConvergenceError, RewritePattern, apply_patterns, explain,
                                   get_pattern, op)

RNG_SEED = 0


# ---- helpers ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def torch_seed(request):
    """Each test draws its torch inputs and module weights from its own stream, seeded from
    its name (zlib.crc32: the same in every process), and leaves the global one untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(zlib.crc32(request.node.name.encode()))
        yield


def feed(graph: Graph, seed: int = RNG_SEED) -> dict[str, np.ndarray]:
    """Random inputs: floats normal (scale 2), integers uniform over their dtype."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        if v.type.dtype.is_int:
            info = np.iinfo(v.type.dtype.np)
            out[v.name] = rng.integers(info.min, info.max + 1, v.type.shape).astype(v.type.dtype.np)
        else:
            out[v.name] = (2 * rng.standard_normal(v.type.shape)).astype(v.type.dtype.np)
    return out


def assert_within(before: dict, after: dict, tol: float) -> None:
    """Equal outputs when ``tol`` is 0, else max |diff| <= tol * max |before|."""
    assert before.keys() == after.keys()
    for k in before:
        if tol == 0.0:
            assert np.array_equal(before[k], after[k]), k
        else:
            scale = max(float(np.abs(before[k]).max()), 1e-30)
            assert float(np.abs(after[k] - before[k]).max()) <= tol * scale, k


def rewrite(graph: Graph, pipeline: str = "fuse", tol: float | None = None) -> Fuse:
    """Run ``pipeline`` (verifying) and check the golden outputs; returns the fuse pass.
    ``tol`` defaults to the tolerance of the patterns that fired."""
    inputs = feed(graph)
    before = bevir.run(graph, inputs)
    pm = PassManager(pipeline)
    pm.run(graph)
    bevir.verify(graph)
    fuse = next(p for p in pm.passes if isinstance(p, Fuse))
    if tol is None:
        fired = [n for n, s in fuse.pattern_stats.items() if s.applied]
        tol = max((get_pattern(n).tolerance for n in fired), default=0.0)
    assert_within(before, bevir.run(graph, inputs), tol)
    return fuse


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]


def node_of(graph: Graph, op_name: str, index: int = -1):
    return [n for n in graph.nodes if n.op == op_name][index]


def applied(fuse: Fuse) -> dict[str, int]:
    return {k: s.applied for k, s in fuse.pattern_stats.items() if s.applied}


def f32(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def conv_graph(layout: Layout = Layout.nchw, bias: bool = True, bn: int = 0, act: str | None = None,
               extra_use: bool = False, const_bn: bool = True) -> Graph:
    """x -> conv2d -> bn * ``bn`` -> ``act``; ``extra_use`` also returns the conv result."""
    rng = np.random.default_rng(1)
    b = Builder("conv")
    shape = (1, 8, 8, 3) if layout is Layout.nhwc else (1, 3, 8, 8)
    x = b.input("x", TensorType(shape, layout=layout))
    w = b.const(f32(rng, 4, 3, 3, 3), "w")
    cb = b.const(f32(rng, 4), "b") if bias else None
    y = b.conv2d(x, w, cb, pads=(1, 1, 1, 1), loc="block/conv")
    if extra_use:
        b.output("conv", y)
    for i in range(bn):
        params = [f32(rng, 4), f32(rng, 4), f32(rng, 4), np.abs(f32(rng, 4)) + 0.5]
        if const_bn:
            vals = [b.const(p, f"bn{i}.{k}") for p, k in zip(params, ("scale", "bias", "mean", "var"))]
        else:
            vals = [b.const(params[0]), b.const(params[1]), b.input("mean", TensorType((4,))),
                    b.const(params[3])]
        y = b.batch_norm(y, *vals, epsilon=1e-3, loc=f"block/bn{i}")
    if act == "relu":
        y = b.relu(y, loc="block/relu")
    elif act == "clip":
        y = b.clip(y, min=0.0, max=6.0, loc="block/clip")
    b.output("y", y)
    return b.graph


def matmul_graph(product: str = "matmul", act: str | None = None, const_bias: bool = True,
                 alpha: float = 1.0) -> Graph:
    """x @ w (+ bias add) (-> act), the product a matmul or a gemm(trans_b)."""
    rng = np.random.default_rng(2)
    b = Builder("mm")
    x = b.input("x", TensorType((5, 8)))
    if product == "matmul":
        y = b.matmul(x, b.const(f32(rng, 8, 6), "w"))
    else:
        y = b.gemm(x, b.const(f32(rng, 6, 8), "w"), trans_b=True, alpha=alpha)
    bias = b.const(f32(rng, 6), "bias") if const_bias else b.input("bias", TensorType((6,)))
    y = b.add(y, bias)
    if act is not None:
        y = b.op(act, y)
    b.output("y", y)
    return b.graph


# ---- the pass ----------------------------------------------------------------------------------
def test_fuse_is_registered_with_its_patterns_and_tolerance():
    fuse = bevir.passes.get_pass("fuse")
    assert fuse is Fuse and fuse.semantics_preserving is True
    names = [p.name for p in fuse.patterns]
    assert len(names) == len(set(names)) == 19
    assert fuse.tolerance == max(p.tolerance for p in fuse.patterns) == 1e-5
    for p in fuse.patterns:
        assert get_pattern(p.name) is p and p.roots


# ---- fold-bn-into-conv -----------------------------------------------------------------------
@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc])
@pytest.mark.parametrize("bias", [True, False])
def test_fold_bn_into_conv(layout, bias):
    g = conv_graph(layout, bias=bias, bn=1)
    fuse = rewrite(g)
    assert ops(g) == ["conv2d"] and applied(fuse) == {"fold-bn-into-conv": 1}
    conv = g.nodes[0]
    assert conv.output.type.layout is layout and conv.inputs[2] is not None
    assert conv.loc == "block/conv+block/bn0"
    assert set(g.constants) == {"w.bn_folded", "w.bn_folded_bias"}    # the old ones are gone


def test_fold_bn_declines_a_shared_conv_and_variable_params():
    g = conv_graph(bn=1, extra_use=True)
    bn = node_of(g, "batch_norm")
    assert "used outside the pattern" in explain(g, "fold-bn-into-conv", bn)
    rewrite(g)
    assert ops(g) == ["conv2d", "batch_norm"]
    g = conv_graph(bn=1, const_bn=False)
    reason = explain(g, "fold-bn-into-conv", node_of(g, "batch_norm"))
    assert reason.endswith("no match: operand %mean is not a constant")


def test_fold_bn_declines_a_non_positive_variance():
    g = conv_graph(bn=1)
    bn = node_of(g, "batch_norm")
    var = bn.inputs[4]
    neg = g.add_const(-np.ones(4, np.float32), "neg_var")
    bn.set_input(4, neg)
    g.erase_const(var)
    assert explain(g, "fold-bn-into-conv", bn).endswith(
        "matched, but declined: BN variance + epsilon is not positive")


# ---- fuse-conv-activation --------------------------------------------------------------------
@pytest.mark.parametrize("layout", [Layout.nchw, Layout.nhwc])
@pytest.mark.parametrize("act", ["relu", "clip"])
def test_fuse_conv_activation_is_bit_identical_and_keeps_layout_and_macs(layout, act):
    g = conv_graph(layout, act=act)
    macs, out_type = CostSummary(g).macs, g.outputs["y"].type
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["conv2d_act"] and applied(fuse) == {"fuse-conv-activation": 1}
    node = g.nodes[0]
    assert node.attrs["activation"] == act and node.attrs["pads"] == (1, 1, 1, 1)
    assert (node.attrs["clip_min"], node.attrs["clip_max"]) == ((0.0, 6.0) if act == "clip" else (None, None))
    assert node.output.type == out_type and node.output.type.layout is layout
    assert CostSummary(g).macs == macs > 0
    assert node.loc == f"block/conv+block/{act}"
    assert str(bevir.parse(str(g))) == str(g)


def test_fuse_conv_activation_declines_a_shared_conv():
    g = conv_graph(act="relu", extra_use=True)
    assert "used outside the pattern" in explain(g, "fuse-conv-activation", node_of(g, "relu"))
    rewrite(g)
    assert ops(g) == ["conv2d", "relu"]


# ---- fuse-qlinear-clip -----------------------------------------------------------------------
def qlinear_graph(producer: str, acts: list[tuple], dtype=DType.u8, zp: int = 5) -> Graph:
    """An onnxruntime-exact QLinear op (conv or add) on 8-bit codes, then ``acts``: ("relu",)
    or ("clip", min, max) applied to its codes."""
    rng = np.random.default_rng(2)
    q = lambda s, z: AffineQuant((s,), (z,))  # noqa: E731
    b = Builder()
    x = b.input("x", TensorType((1, 8, 6, 6), dtype, Layout.nchw, q(0.05, zp)))
    if producer == "qlinear_conv":
        w = b.const(rng.integers(-20, 20, (8, 8, 3, 3)).astype(np.int8), "w",
                    TensorType((8, 8, 3, 3), DType.i8, quant=q(0.02, 0)))
        y = b.qlinear_conv(x, w, pads=(1, 1, 1, 1), out_dtype=str(dtype), out_scale=0.07,
                           out_zero_point=zp)
    else:
        other = b.input("z", TensorType((1, 8, 6, 6), dtype, Layout.nchw, q(0.03, zp - 2)))
        y = b.qlinear_add(x, other, out_dtype=str(dtype), out_scale=0.04, out_zero_point=zp)
    for act in acts:
        y = b.relu(y) if act[0] == "relu" else b.clip(y, min=act[1], max=act[2])
    b.output("y", y)
    return b.graph


@pytest.mark.parametrize("producer", ["qlinear_conv", "qlinear_add"])
@pytest.mark.parametrize("dtype", [DType.u8, DType.i8])
@pytest.mark.parametrize("acts", [[("relu",)], [("clip", 7.0, None)], [("clip", -3.5, 60.7)],
                                  [("clip", None, 300.0)], [("relu",), ("clip", 2.0, 40.0)]])
def test_fuse_qlinear_clip_is_bit_identical(producer, dtype, acts):
    g = qlinear_graph(producer, acts, dtype)
    fuse = rewrite(g, tol=0.0)                     # bit-identical on random codes
    assert ops(g) == [producer] and applied(fuse) == {"fuse-qlinear-clip": len(acts)}
    node = g.nodes[0]
    assert node.attrs["out_min"] is not None and node.attrs["out_max"] is not None
    assert str(bevir.parse(str(g))) == str(g)


def test_fuse_qlinear_clip_declines_a_shared_result_and_a_constant_clamp():
    g = qlinear_graph("qlinear_conv", [("relu",)])
    g.outputs["raw"] = g.nodes[0].output
    assert "used outside the pattern" in explain(g, "fuse-qlinear-clip", node_of(g, "relu"))
    g = qlinear_graph("qlinear_conv", [("clip", None, 10.0), ("clip", 20.0, None)], DType.u8)
    rewrite(g, tol=0.0)                            # the first fuses, the second would be constant
    assert ops(g) == ["qlinear_conv", "clip"]
    assert "is constant" in explain(g, "fuse-qlinear-clip", node_of(g, "clip"))


def test_a_clamp_outside_the_result_codes_is_refused():
    g = qlinear_graph("qlinear_conv", [])
    conv = g.nodes[0]
    for lo, hi in ((-1, 10), (10, 5), (0, 256)):
        conv.attrs.update(out_min=lo, out_max=hi)
        with pytest.raises(bevir.BevirError, match="not an interval of u8 codes"):
            bevir.verify(g)


# ---- linear ------------------------------------------------------------------------------------
@pytest.mark.parametrize("product", ["matmul", "gemm"])
def test_fuse_linear_bias(product):
    g = matmul_graph(product)
    macs = CostSummary(g).macs
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["matmul_act"] and applied(fuse) == {"fuse-linear-bias": 1}
    assert g.nodes[0].attrs["trans_b"] is (product == "gemm")
    assert CostSummary(g).macs == macs == 5 * 8 * 6


def test_fuse_linear_bias_declines_a_variable_bias_and_a_scaled_gemm():
    g = matmul_graph(const_bias=False)
    assert explain(g, "fuse-linear-bias", node_of(g, "add")).endswith("operand %bias is not a constant")
    g = matmul_graph("gemm", alpha=2.0)
    assert "declined: gemm %0 scales (alpha=2.0" in explain(g, "fuse-linear-bias", node_of(g, "add"))
    rewrite(g)
    assert ops(g) == ["gemm", "add"]


@pytest.mark.parametrize("product", ["matmul", "gemm"])
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_linear_bias_then_activation(product, act):
    g = matmul_graph(product, act=act)
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["matmul_act"] and g.nodes[0].attrs["activation"] == act
    assert applied(fuse) == {"fuse-linear-bias": 1, "fuse-linear-activation": 1}


def test_fuse_linear_activation_through_torch_linear_reshapes():
    """nn.Linear on 3-D input imports as reshape, gemm, reshape: the activation fuses into
    the gemm and the reshape follows it."""
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))).clamp(-1.0, 1.0)

    g = bevir.from_torch(Mlp(), [torch.randn(2, 5, 8)])
    fuse = rewrite(g, "canonicalize,fuse,cse,dce", tol=0.0)
    assert applied(fuse) == {"fuse-linear-activation": 2}
    assert [n.attrs["activation"] for n in g.nodes if n.op == "matmul_act"] == ["relu", "clip"]
    assert "gemm" not in ops(g) and "relu" not in ops(g) and "clip" not in ops(g)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_fuse_linear_activation_of_a_torch_linear_is_bit_identical(act, bias):
    """reshape -> gemm (trans_b: torch's weight layout) -> reshape -> activation, at the
    sizes of the zoo's transformer MLPs: matmul_act gives gemm's bits (its native product
    runs only where it sums as BLAS sums the transposed weight; it once took the order of
    a C-ordered one, 2.4e-7 off)."""
    rng = np.random.default_rng(zlib.crc32(b"torch-linear"))
    b = Builder("linear")
    x = b.input("x", TensorType((1, 16, 32)))
    w = b.const(rng.standard_normal((64, 32)).astype(np.float32))
    bias_ = [b.const(rng.standard_normal(64).astype(np.float32))] if bias else []
    y = b.gemm(b.reshape(x, shape=(16, 32)), w, *bias_, trans_b=True)
    b.output("y", getattr(b, act)(b.reshape(y, shape=(1, 16, 64))))
    g = b.graph
    fuse = rewrite(g, tol=0.0)
    assert applied(fuse) == {"fuse-linear-activation": 1} and "matmul_act" in ops(g)


def test_fuse_linear_activation_declines_a_second_activation():
    g = matmul_graph(act="relu")
    y = g.outputs["y"]
    g.set_output("y", g.create_node("clip", [y], {"min": 0.0, "max": 1.0}).output)
    rewrite(g)
    assert ops(g) == ["matmul_act", "clip"]
    assert "already applies relu" in explain(g, "fuse-linear-activation", node_of(g, "clip"))


# ---- fuse-add-relu -----------------------------------------------------------------------------
def test_fuse_add_relu():
    b = Builder()
    x, y = b.input("x", TensorType((2, 3, 4, 4), layout=Layout.nchw)), b.input("y", TensorType((3, 1, 1)))
    b.output("z", b.relu(b.add(x, y)))
    g = b.graph
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["add_relu"] and applied(fuse) == {"fuse-add-relu": 1}
    assert g.outputs["z"].type.layout is Layout.nchw


def test_fuse_add_relu_declines_a_shared_add():
    b = Builder()
    x, y = b.input("x", TensorType((4,))), b.input("y", TensorType((4,)))
    s = b.add(x, y)
    b.output("s", s)
    b.output("z", b.relu(s))
    g = b.graph
    assert "used outside the pattern" in explain(g, "fuse-add-relu", node_of(g, "relu"))
    rewrite(g)
    assert ops(g) == ["add", "relu"]


# ---- layer norm --------------------------------------------------------------------------------
class LayerNormTwoSubs(nn.Module):
    """The classic hand-written layer norm: x - u written twice, pow, divide, affine."""

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis
        self.weight, self.bias = nn.Parameter(torch.rand(8) + 0.5), nn.Parameter(torch.rand(8))

    def forward(self, x):
        u = x.mean(self.axis, keepdim=True)
        s = (x - u).pow(2).mean(self.axis, keepdim=True)
        return self.weight * ((x - u) / torch.sqrt(s + 1e-5)) + self.bias


class LayerNormRsqrt(nn.Module):
    """The centered value shared, squared by a multiply, times rsqrt; no affine."""

    def forward(self, x):
        d = x - x.mean(-1, keepdim=True)
        return d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-6)


class LayerNormPow(nn.Module):
    def forward(self, x):
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("module, tol, affine", [(LayerNormTwoSubs, 0.0, True),
                                                 (LayerNormPow, 0.0, False),
                                                 (LayerNormRsqrt, 1e-6, False)],
                         ids=["two-subs-div-affine", "pow-div", "mul-rsqrt"])
def test_recognize_layer_norm(module, tol, affine):
    g = bevir.from_torch(module(), [torch.randn(2, 5, 8)])
    fuse = rewrite(g, tol=tol)
    assert ops(g) == ["layer_norm"]
    ln = g.nodes[0]
    assert ln.attrs["axis"] == -1 and [v is not None for v in ln.inputs] == [True, affine, affine]
    assert math.isclose(ln.attrs["epsilon"], 1e-6 if module is LayerNormRsqrt else 1e-5,
                        rel_tol=1e-6)
    want = {"recognize-layer-norm": 1}
    if affine:
        want |= {"fold-scale-into-layer-norm": 1, "fold-bias-into-layer-norm": 1}
    assert applied(fuse) == want


def test_recognize_layer_norm_declines_a_mean_over_a_leading_axis():
    g = bevir.from_torch(LayerNormTwoSubs(axis=1), [torch.randn(2, 5, 8)])
    div = node_of(g, "div")
    assert "declined: the mean is not over trailing axes with keepdims ((1,))" in \
        explain(g, "recognize-layer-norm", div)
    n = len(g.nodes)
    rewrite(g)
    assert len(g.nodes) == n and "layer_norm" not in ops(g)


def test_fold_affine_into_torch_layer_norm_without_affine():
    class Affine(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8, elementwise_affine=False)
            self.g, self.b = nn.Parameter(torch.rand(8)), nn.Parameter(torch.rand(8))

        def forward(self, x):
            return self.norm(x) * self.g + self.b

    g = bevir.from_torch(Affine(), [torch.randn(3, 8)])
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["layer_norm"]
    assert applied(fuse) == {"fold-scale-into-layer-norm": 1, "fold-bias-into-layer-norm": 1}


def test_fold_bias_declines_a_layer_norm_with_a_bias():
    b = Builder()
    x = b.input("x", TensorType((3, 8)))
    ones = np.ones(8, np.float32)
    y = b.layer_norm(x, b.const(ones), b.const(ones))
    b.output("y", b.add(y, b.const(ones)))
    g = b.graph
    ln = node_of(g, "layer_norm")
    assert explain(g, "fold-bias-into-layer-norm", node_of(g, "add")).endswith(
        f"declined: layer_norm {ln.name} already adds a bias")
    rewrite(g)
    assert ops(g) == ["layer_norm", "add"]


# ---- gelu ----------------------------------------------------------------------------------------
class GeluDiv(nn.Module):
    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class GeluMul(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))


class GeluHalf(nn.Module):
    def forward(self, x):
        return x * (1 + torch.erf(x / math.sqrt(2.0))) / 2


class GeluInner(nn.Module):
    def forward(self, x):
        return x * ((1.0 + torch.erf(x / math.sqrt(2.0))) * 0.5)


@pytest.mark.parametrize("module", [GeluDiv, GeluMul, GeluHalf, GeluInner], ids=lambda m: m.__name__)
def test_recognize_gelu(module):
    g = bevir.from_torch(module(), [torch.randn(4, 16)])
    fuse = rewrite(g)
    assert ops(g) == ["gelu"] and applied(fuse) == {"recognize-gelu": 1}


def test_recognize_gelu_declines_another_erf_scale():
    class NotGelu(nn.Module):
        def forward(self, x):
            return x * 0.5 * (1.0 + torch.erf(x / 2.0))

    g = bevir.from_torch(NotGelu(), [torch.randn(4, 16)])
    reason = explain(g, "recognize-gelu", g.nodes[-1])
    assert "declined: the erf argument's scale is 2.0, not 1.414" in reason
    rewrite(g)
    assert "gelu" not in ops(g)


class GeluTanh(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


class GeluTanhPow(nn.Module):
    def forward(self, x):
        return x * 0.5 * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3))))


@pytest.mark.parametrize("module", [GeluTanh, GeluTanhPow], ids=lambda m: m.__name__)
def test_recognize_gelu_tanh(module):
    g = bevir.from_torch(module(), [torch.randn(4, 16)])
    fuse = rewrite(g)
    assert ops(g) == ["gelu"] and applied(fuse) == {"recognize-gelu-tanh": 1}
    assert g.nodes[0].attrs["approximate"] == "tanh"


def test_recognize_gelu_tanh_in_the_torchscript_export(tmp_path):
    """The TorchScript exporter's form: x*(x*x), constants first."""
    f = tmp_path / "g.onnx"
    torch.onnx.export(nn.GELU("tanh"), (torch.randn(2, 8),), str(f), opset_version=17, dynamo=False)
    g = bevir.from_onnx(f)
    fuse = rewrite(g)
    assert ops(g) == ["gelu"] and applied(fuse) == {"recognize-gelu-tanh": 1}


# ---- swish family --------------------------------------------------------------------------------
class Swish(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x


class HardSwishDecomposed(nn.Module):
    def forward(self, x):
        return x * torch.clamp(x + 3, 0, 6) / 6


class HardSigmoidDecomposed(nn.Module):
    def forward(self, x):
        return torch.clamp(x + 3, 0, 6) / 6


class HardSwishOfOp(nn.Module):
    def forward(self, x):
        return x * nn.functional.hardsigmoid(x)


@pytest.mark.parametrize("module, op_name, pattern", [
    (Swish, "silu", "recognize-silu"),
    (HardSwishDecomposed, "hardswish", "recognize-hardswish"),
    (HardSigmoidDecomposed, "hardsigmoid", "recognize-hardsigmoid"),
    (HardSwishOfOp, "hardswish", "recognize-hardswish"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_recognize_swish_family(module, op_name, pattern):
    g = bevir.from_torch(module(), [4 * torch.randn(4, 16)])
    fuse = rewrite(g)
    assert ops(g) == [op_name] and applied(fuse) == {pattern: 1}


def test_recognize_hardswish_declines_other_bounds():
    class NotHardSwish(nn.Module):
        def forward(self, x):
            return x * torch.clamp(x + 3, 0, 5) / 6

    g = bevir.from_torch(NotHardSwish(), [torch.randn(4, 16)])
    assert "clip bounds are [0.0, 5.0], not [0, 6]" in explain(g, "recognize-hardswish", g.nodes[-1])
    rewrite(g)
    assert "hardswish" not in ops(g)


@pytest.mark.parametrize("act", [nn.Hardswish, nn.SiLU, nn.Hardsigmoid, nn.GELU])
def test_swish_family_fuses_into_conv(act):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), act()).eval()
    g = bevir.from_torch(net, [torch.randn(1, 3, 8, 8)])
    rewrite(g)
    assert ops(g) == ["conv2d_act"]


# ---- pooling -------------------------------------------------------------------------------------
@pytest.mark.parametrize("keepdim", [True, False])
def test_spatial_mean_becomes_global_avgpool(keepdim):
    class Pool(nn.Module):
        def forward(self, x):
            return x.mean((2, 3), keepdim=keepdim) + x.mean(1, keepdim=True).sum()

    g = bevir.from_torch(Pool(), [torch.randn(2, 3, 5, 4)])
    fuse = rewrite(g)
    assert applied(fuse) == {"recognize-global-avgpool": 1}
    assert ops(g).count("global_avgpool") == 1 and ops(g).count("reduce_mean") == 1   # axis 1 stays


# ---- softmax -------------------------------------------------------------------------------------
class SoftmaxShifted(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)


class SoftmaxPlain(nn.Module):
    def forward(self, x):
        return torch.exp(x) / torch.exp(x).sum(dim=1, keepdim=True)


@pytest.mark.parametrize("module, axis, tol", [(SoftmaxShifted, 2, 0.0), (SoftmaxPlain, 1, 1e-6)],
                         ids=["shifted", "plain"])
def test_recognize_softmax(module, axis, tol):
    g = bevir.from_torch(module(), [torch.randn(2, 6, 10)])
    fuse = rewrite(g, tol=tol)
    assert ops(g) == ["softmax"] and g.nodes[0].attrs["axis"] == axis
    assert applied(fuse) == {"recognize-softmax": 1}


def test_recognize_softmax_declines_a_sum_over_two_axes():
    class TwoAxes(nn.Module):
        def forward(self, x):
            e = torch.exp(x)
            return e / e.sum((1, 2), keepdim=True)

    g = bevir.from_torch(TwoAxes(), [torch.randn(2, 6, 10)])
    assert "declined: the sum is not over one axis with keepdims ((1, 2))" in \
        explain(g, "recognize-softmax", node_of(g, "div"))


# ---- fold-requantize-chain -------------------------------------------------------------------
def qdq_graph(q_in: AffineQuant, scale, zero_point, axis=None) -> Graph:
    b = Builder()
    x = b.input("x", TensorType((4, 3), DType.i8, quant=q_in))
    y = b.quantize(b.dequantize(x), dtype="i8", scale=scale, zero_point=zero_point, axis=axis)
    b.output("y", b.relu(y))
    return b.graph


@pytest.mark.parametrize("quant, axis", [(AffineQuant((0.05,), (3,)), None),
                                         (AffineQuant((0.05, 0.1, 0.02), (0, -2, 5), 1), 1)],
                         ids=["per-tensor", "per-channel"])
def test_fold_requantize_chain(quant, axis):
    g = qdq_graph(quant, quant.scale, quant.zero_point, axis)
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["relu"] and g.nodes[0].inputs[0] is g.inputs[0]
    assert applied(fuse) == {"fold-requantize-chain": 1}


def test_fold_requantize_chain_declines_other_params_and_lossy_scales():
    g = qdq_graph(AffineQuant((0.05,), (3,)), (0.1,), (3,))
    assert "a different quantization needs a requantize op" in \
        explain(g, "fold-requantize-chain", node_of(g, "quantize"))
    g = qdq_graph(AffineQuant((1e38,), (0,)), (1e38,), (0,))   # the dequantized codes overflow
    assert explain(g, "fold-requantize-chain", node_of(g, "quantize")).endswith(
        "declined: code -127 comes back as -128 (scale 9.999999680285692e+37, zero point 0)")
    rewrite(g)
    assert ops(g) == ["dequantize", "quantize", "relu"]


# ---- transposes ----------------------------------------------------------------------------------
def transpose_matmul_graph(const_w: bool = True) -> Graph:
    b = Builder()
    x = b.input("x", TensorType((5, 8)))
    w = b.const(f32(np.random.default_rng(3), 6, 8), "w") if const_w else b.input("w", TensorType((6, 8)))
    b.output("y", b.matmul(x, b.transpose(w, perm=(1, 0))))
    return b.graph


def test_fold_transpose_into_matmul():
    g = transpose_matmul_graph()
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["matmul"] and applied(fuse) == {"fold-transpose-into-matmul": 1}
    w = g.nodes[0].inputs[1]
    assert w.is_const and w.type.shape == (8, 6) and w.const.flags.c_contiguous
    # canonicalize folds a transposed constant by itself: fuse has nothing left to do
    g = transpose_matmul_graph()
    fuse = rewrite(g, "canonicalize,fuse", tol=0.0)
    assert ops(g) == ["matmul"] and fuse.pattern_stats["fold-transpose-into-matmul"].matches == 0


def test_fold_transpose_into_matmul_declines_a_variable():
    g = transpose_matmul_graph(const_w=False)
    assert explain(g, "fold-transpose-into-matmul", node_of(g, "matmul")).endswith(
        "no match: operand %w is not a constant")


@pytest.mark.parametrize("side", ["a", "b"])
def test_fold_transpose_into_gemm(side):
    b = Builder()
    a = b.input("a", TensorType((8, 5) if side == "a" else (5, 8)))
    w = b.input("w", TensorType((6, 8) if side == "b" else (8, 6)))
    a2 = b.transpose(a, perm=(1, 0)) if side == "a" else a
    w2 = b.transpose(w, perm=(1, 0)) if side == "b" else w
    b.output("y", b.gemm(a2, w2, b.const(np.ones(6, np.float32))))
    g = b.graph
    fuse = rewrite(g, tol=0.0)
    assert ops(g) == ["gemm"] and applied(fuse) == {"fold-transpose-into-gemm": 1}
    attrs = g.nodes[0].attrs
    assert (attrs["trans_a"], attrs["trans_b"]) == (side == "a", side == "b")


def test_fold_transpose_into_gemm_declines_an_identity_transpose():
    b = Builder()
    a, w = b.input("a", TensorType((5, 8))), b.input("w", TensorType((8, 6)))
    b.output("y", b.gemm(b.transpose(a, perm=(0, 1)), w))
    g = b.graph
    assert explain(g, "fold-transpose-into-gemm", node_of(g, "gemm")).endswith(
        "declined: transpose %0 keeps the axes")


# ---- options, statistics, the driver -----------------------------------------------------------
def test_disable_and_enable_from_a_pipeline():
    g = conv_graph(bn=1, act="relu")
    fuse = rewrite(g, "fuse{disable=fold-bn-into-conv}")
    assert ops(g) == ["conv2d", "batch_norm", "relu"]
    assert "fold-bn-into-conv" not in fuse.pattern_stats and fuse.statistics == {}
    g = conv_graph(bn=1, act="relu")
    stats = Statistics()
    text = 'fuse{disable="fuse-conv-activation,fuse-add-relu"}'
    PassManager(text, instruments=[stats]).run(g)
    assert ops(g) == ["conv2d", "relu"] and stats.by_pass()[text] == {"fold-bn-into-conv": 1}
    with pytest.raises(PassError, match="pass 'fuse' has no pattern 'fold-everything'"):
        PassManager("fuse{enable=fold-everything}").run(conv_graph())


def test_fixpoint_through_a_chain_and_sane_statistics():
    """conv -> bn -> bn -> relu: each rewrite makes the next match."""
    g = conv_graph(bn=2, act="relu")
    fuse = rewrite(g)
    assert ops(g) == ["conv2d_act"]
    assert applied(fuse) == {"fold-bn-into-conv": 2, "fuse-conv-activation": 1}
    assert fuse.statistics == {"fold-bn-into-conv": 2, "fuse-conv-activation": 1}
    for name, s in fuse.pattern_stats.items():
        assert s.tries >= s.matches == s.declined + s.applied, name
    bn = fuse.pattern_stats["fold-bn-into-conv"]
    assert (bn.tries, bn.matches) == (2, 2)
    assert fuse.pattern_stats["fuse-conv-activation"].tries >= 1


class _ReluToClip(RewritePattern):
    name = "test-fuse.relu-to-clip"
    pattern = op("relu", "x")

    def rewrite(self, rw, m):
        rw.replace(m.root, rw.create("clip", [m["x"]], {"min": 0.0}))


class _ClipToRelu(RewritePattern):
    name = "test-fuse.clip-to-relu"
    pattern = op("clip", "x", attrs={"min": 0.0, "max": None})

    def rewrite(self, rw, m):
        rw.replace(m.root, rw.create("relu", [m["x"]]))


def test_patterns_that_undo_each_other_raise_a_convergence_error():
    g = conv_graph(act="relu")
    with pytest.raises(ConvergenceError) as e:
        apply_patterns(g, [_ReluToClip(), _ClipToRelu()])
    assert "test-fuse.relu-to-clip" in e.value.message and "test-fuse.clip-to-relu" in e.value.message
    assert isinstance(e.value, PassError)


# ---- BEVFormer (test config) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def bevformer():
    from examples.bevformer.config import CONFIGS
    from examples.bevformer.inputs import make_inputs
    from examples.bevformer.weights import build_model
    cfg = CONFIGS["test"]
    return build_model(cfg, seed=0).eval(), make_inputs(cfg, 0, with_prev_bev=True)


@pytest.mark.parametrize("decompose", [False, True], ids=["custom-ops", "decomposed"])
def test_bevformer_canonicalize_fuse_to_nhwc_cse_dce(bevformer, tmp_path, decompose):
    from examples.bevformer import e2e
    model, inputs = bevformer
    graph = e2e.build_graph(model, inputs, tmp_path, decompose=decompose)
    feed_ = e2e.golden_inputs(graph, inputs)
    before = bevir.run(graph, feed_)
    n_before = len(graph.nodes)
    canonical = graph.clone()
    bevir.optimize(canonical, "canonicalize,cse,dce")
    # no atol: the exact passes (canonicalize, to-nhwc, cse, dce: tolerance 0) are held to
    # bit-identity, fuse to its declared tolerance times each output's magnitude
    numerics = VerifyNumerics(feed_)
    pm = PassManager("canonicalize,fuse,to-nhwc,cse,dce", instruments=[numerics])
    pm.run(graph)
    assert len(numerics.checks) == 5 and all(c.ok for c in numerics.checks)
    assert all(set(c.diffs.values()) == {0.0} for c in numerics.checks if c.pass_text != "fuse")
    assert count_layout_transforms(graph) == 1      # the image input's; the bridge folds away
    bevir.verify(graph)
    after = bevir.run(graph, feed_)
    fuse = pm.passes[1]
    fired = applied(fuse)
    diff = max(float(np.abs(after[k] - before[k]).max()) for k in before)
    print(f"\nBEVFormer test ({'decomposed' if decompose else 'custom ops'}): nodes {n_before} -> "
          f"{len(canonical.nodes)} (canonicalize,cse,dce) -> {len(graph.nodes)} (with fuse); "
          f"fired {fired}; max diff {diff:g}\n{numerics.report()}")
    assert len(graph.nodes) < len(canonical.nodes) < n_before
    # the whole pipeline within the tolerance the fired patterns declare (the rest is exact)
    assert_within(before, after, max((get_pattern(n).tolerance for n in fired), default=0.0))
    assert fired["fuse-conv-activation"] > 0 and fired["fuse-linear-activation"] > 0
    counts = graph.op_counts()
    assert counts["conv2d_act"] == fired["fuse-conv-activation"]
    assert CostSummary(graph).macs == CostSummary(canonical).macs
