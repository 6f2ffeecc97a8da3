"""The torch frontend: ATen decomposition, custom-op boundaries, errors."""
import numpy as np
import pytest
import torch
from torch import nn

import bevir
from bevir import TensorType
from bevir.frontends.torch import CustomOp, from_torch
from bevir.ops import OpDef
from bevir.ops import Float

pytestmark = pytest.mark.usefixtures("torch_seed")


def run_both(module, args, **kw):
    g = from_torch(module, args, **kw)
    bevir.verify(g)
    feed = {v.name: a.numpy() for v, a in zip(g.inputs, [a for a in args if a is not None])}
    out = bevir.run(g, feed)
    with torch.no_grad():
        ref = module(*args)
    ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    return g, [out[k] for k in g.outputs], [r.numpy() for r in ref]


class Block(nn.Module):
    """A transformer-ish block touching many ATen ops."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x, mask):
        h = self.norm(x)
        a = torch.softmax(h @ h.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        h = a @ h
        h = self.fc2(torch.relu(self.fc1(h))).clamp(min=-3.0, max=3.0)
        q, k = h.chunk(2, dim=-1)
        y = torch.cat([q.sigmoid(), torch.atan2(k, q + 2)], -1).flatten(1)
        y = torch.where(mask.any(-1, keepdim=True), y, torch.zeros_like(y))
        return y.mean(-1), y.permute(1, 0)[2:5:2].unsqueeze(0).sum(dim=(0, 1))


def test_aten_decomposition_matches_torch():
    x = torch.randn(2, 4, 8)
    mask = torch.rand(2, 3) > 0.5
    g, out, ref = run_both(Block().eval(), (x, mask), output_names=["mean", "picked"])
    assert [v.name for v in g.inputs] == ["x", "mask"]
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
    # parameters become constants named by their state_dict keys; provenance is the module path
    assert {"norm.weight", "fc1.weight", "fc2.bias"} <= set(g.constants)
    assert {n.loc for n in g.nodes if n.op == "layer_norm"} == {"norm"}
    assert {n.loc for n in g.nodes if n.op == "gemm"} == {"fc1", "fc2"}


# ---- a user-defined module as a custom op --------------------------------------------------
class ScaledLinear(OpDef):
    """y = scale * (x @ w.T + b): the IR op for the user's module below."""

    name = "test_torch.scaled_linear"
    operands = ("x", "w", "b")
    attrs = {"scale": Float()}

    def infer(self, c, x, w, b):
        return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)

    def compute(self, c, x, w, b):
        return (np.float32(c.scale) * (x @ w.T + b)).astype(np.float32)

    def macs(self, c):
        return c.out_types[0].numel * c.in_types[1].shape[1]


class UserScaledLinear(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return self.scale * self.lin(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = UserScaledLinear(0.5)
        self.b = nn.Sequential(UserScaledLinear(2.0))

    def forward(self, x):
        return self.b(torch.cat([self.a(x), self.a(x)], -1)).relu()


def test_custom_op_boundary_becomes_one_node_with_weights_and_config():
    net = Net().eval()
    net.b[0].lin = nn.Linear(6, 3)
    spec = {UserScaledLinear: CustomOp("test_torch.scaled_linear",
                                       attrs=lambda m: {"scale": m.scale})}
    g, (out,), (ref,) = run_both(net, (torch.randn(4, 6),), custom_ops=spec)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    custom = [n for n in g.nodes if n.op == "test_torch.scaled_linear"]
    assert [(n.loc, n.attrs["scale"]) for n in custom] == [("a", 0.5), ("a", 0.5), ("b.0", 2.0)]
    assert [v.name for v in custom[2].inputs[1:]] == ["b.0.lin.weight", "b.0.lin.bias"]
    assert not any(n.op == "gemm" for n in g.nodes)      # no decomposition inside a boundary
    # the module's forward is restored after the import
    assert "forward" not in vars(net.a)


def test_custom_op_rejects_non_tensor_arguments():
    class Takes(nn.Module):
        def forward(self, x, k):
            return x * k

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.t = Takes()

        def forward(self, x):
            return self.t(x, 3)

    with pytest.raises(bevir.UnsupportedError, match="argument 'k' is a int") as e:
        from_torch(Outer(), (torch.randn(2),), custom_ops={Takes: CustomOp("relu")})
    assert e.value.loc == "t"


def test_unsupported_op_names_module_path():
    class Inner(nn.Module):
        def forward(self, x):
            return torch.cummax(x, 0).values

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) + 1

    with pytest.raises(bevir.UnsupportedError, match="cummax") as e:
        from_torch(Outer(), (torch.randn(3),))
    assert e.value.loc == "inner"


def test_constant_subgraphs_fold_at_import():
    class Grid(nn.Module):
        def forward(self, x):
            ys, xs = torch.meshgrid(torch.linspace(0, 1, 3), torch.arange(4.0), indexing="ij")
            return x + torch.stack([ys, xs], -1).sum(-1)

    g, (out,), (ref,) = run_both(Grid(), (torch.randn(3, 4),))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert [n.op for n in g.nodes] == ["add"]


def test_compose_links_graphs():
    b1 = bevir.Builder("first")
    x = b1.input("x", TensorType((2, 3)))
    b1.output("feat", b1.relu(x, loc="backbone"))
    b1.output("aux", b1.neg(x))
    b2 = bevir.Builder("second")
    f = b2.input("f", TensorType((2, 3)))
    s = b2.input("scale", TensorType((2, 3)))
    b2.output("y", b2.mul(f, s, loc="head"))
    g = bevir.compose(b1.graph, b2.graph, {"f": "feat"}, keep_outputs=True, name="both")
    bevir.verify(g)
    assert [v.name for v in g.inputs] == ["x", "scale"] and list(g.outputs) == ["feat", "aux", "y"]
    xs = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    out = bevir.run(g, {"x": xs, "scale": np.full((2, 3), 2, np.float32)})
    np.testing.assert_array_equal(out["y"], 2 * np.maximum(xs, 0))
    assert {n.loc for n in g.nodes} >= {"backbone", "head"}
    with pytest.raises(bevir.VerifyError, match="no output 'nope'"):
        bevir.compose(b1.graph, b2.graph, {"f": "nope"})
    b3 = bevir.Builder()
    b3.output("y", b3.neg(b3.input("f", TensorType((3, 2)))))
    with pytest.raises(bevir.VerifyError, match="expects tensor<3x2xf32>"):
        bevir.compose(b1.graph, b3.graph, {"f": "feat"})
