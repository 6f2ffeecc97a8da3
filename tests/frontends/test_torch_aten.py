"""One case per ATen converter of the torch frontend: a small function or module that
exports to the op (checked), imported with from_torch and run by the golden model against
torch. The supported-op table in docs/frontends.md is generated from the registry."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bevir
from bevir.frontends.torch import aten_table, from_torch

pytestmark = pytest.mark.usefixtures("torch_seed")


class Fn(nn.Module):
    def __init__(self, fn, *params: torch.Tensor):
        super().__init__()
        self.fn = fn
        self.params = nn.ParameterList([nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, *xs):
        return self.fn(*xs, *self.params)


def x4(*shape):
    return torch.randn(*(shape or (2, 4, 9, 10)))


#: name -> (module, inputs, the ATen op the export must hold)
CASES = {
    "conv2d": (nn.Conv2d(4, 6, 3, 2, 1), [x4()], "aten.conv2d"),
    "conv2d_same_dilated": (nn.Conv2d(4, 6, 4, padding="same", dilation=2), [x4()], "aten.conv2d"),
    "conv2d_grouped": (nn.Conv2d(4, 8, 3, groups=2, bias=False), [x4()], "aten.conv2d"),
    "conv2d_depthwise": (nn.Conv2d(4, 4, 5, padding=2, groups=4), [x4()], "aten.conv2d"),
    "conv1d": (nn.Conv1d(4, 6, 3, stride=2, padding=1), [torch.randn(2, 4, 11)], "aten.conv1d"),
    "batch_norm": (nn.BatchNorm2d(4), [x4()], "aten.batch_norm"),
    "group_norm": (nn.GroupNorm(2, 4), [x4()], "aten.group_norm"),
    "max_pool2d_ceil": (nn.MaxPool2d(3, 2, 1, ceil_mode=True), [x4()], "aten.max_pool2d"),
    "avg_pool2d": (nn.AvgPool2d(3, 2, 1), [x4()], "aten.avg_pool2d"),
    "avg_pool2d_no_pad_count": (nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                                [x4()], "aten.avg_pool2d"),
    "adaptive_avg_pool2d_1": (nn.AdaptiveAvgPool2d(1), [x4()], "aten.adaptive_avg_pool2d"),
    "adaptive_avg_pool2d_3x5": (nn.AdaptiveAvgPool2d((3, 5)), [x4()], "aten.adaptive_avg_pool2d"),
    "upsample_bilinear_size": (Fn(lambda x: F.interpolate(x, size=(5, 17), mode="bilinear")),
                               [x4()], "aten.upsample_bilinear2d"),
    "upsample_bilinear_align": (Fn(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear",
                                                           align_corners=True)),
                                [x4()], "aten.upsample_bilinear2d"),
    "upsample_nearest_scale": (Fn(lambda x: F.interpolate(x, scale_factor=1.5)), [x4()],
                               "aten.upsample_nearest2d"),
    "upsample_nearest_exact": (Fn(lambda x: F.interpolate(x, size=(4, 15), mode="nearest-exact")),
                               [x4()], "aten._upsample_nearest_exact2d"),
    "hardswish": (nn.Hardswish(), [x4() * 4], "aten.hardswish"),
    "hardsigmoid": (nn.Hardsigmoid(), [x4() * 4], "aten.hardsigmoid"),
    "silu": (nn.SiLU(), [x4() * 4], "aten.silu"),
    "relu6": (nn.ReLU6(), [x4() * 4], "aten.hardtanh"),
    "hardtanh": (nn.Hardtanh(-2, 0.5), [x4()], "aten.hardtanh"),
    "leaky_relu": (nn.LeakyReLU(0.2), [x4()], "aten.leaky_relu"),
    "elu": (nn.ELU(0.7), [x4()], "aten.elu"),
    "softplus": (nn.Softplus(2.0, 3.0), [x4() * 4], "aten.softplus"),
    "log_softmax": (nn.LogSoftmax(1), [x4()], "aten.log_softmax"),
    "gelu_tanh": (nn.GELU("tanh"), [x4()], "aten.gelu"),
    "ne_masked_fill": (Fn(lambda x, y: x.masked_fill((x > 0) != (y > 0), -1.5)),
                       [x4(), x4()], "aten.masked_fill"),
    "var_std": (Fn(lambda x: x.var(1, keepdim=True) + x.std((2, 3), correction=0).mean()),
                [x4()], "aten.var"),
    "addmm": (nn.Linear(10, 3), [torch.randn(5, 10)], "aten.linear"),
    "addmm_explicit": (Fn(lambda x, b, w: torch.addmm(b, x, w), torch.randn(3), torch.randn(10, 3)),
                       [torch.randn(5, 10)], "aten.addmm"),
    "einsum": (Fn(lambda a, b: torch.einsum("bhid,bhjd->bhij", a, b)),
               [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)], "aten.einsum"),
    "sdpa": (Fn(F.scaled_dot_product_attention), [torch.randn(2, 3, 4, 8)] * 3,
             "aten.scaled_dot_product_attention"),
    "sdpa_causal_scaled": (Fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                             scale=0.3)),
                           [torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)],
                           "aten.scaled_dot_product_attention"),
    "sdpa_bool_mask": (Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                          torch.rand(4, 6) > 0.3),
                       [torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)],
                       "aten.scaled_dot_product_attention"),
    "multihead_attention": (nn.MultiheadAttention(8, 2, batch_first=True),
                            [torch.randn(2, 5, 8)] * 3, "aten.bmm"),
    "unflatten": (Fn(lambda x: x.unflatten(1, (2, -1)).sum(2)), [torch.randn(3, 8, 5)],
                  "aten.unflatten"),
    "unbind": (Fn(lambda x: sum(x.unbind(1))), [torch.randn(3, 4, 5)], "aten.unbind"),
    "pad_constant": (Fn(lambda x: F.pad(x, (1, 2, 0, 3), value=0.5)), [x4()], "aten.pad"),
    "pad_reflect": (Fn(lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect")), [x4()], "aten.pad"),
    "pad_replicate": (Fn(lambda x: F.pad(x, (2, 1, 1, 2), mode="replicate")), [x4()], "aten.pad"),
    "pad_circular": (Fn(lambda x: F.pad(x, (2, 1, 1, 2), mode="circular")), [x4()], "aten.pad"),
    "roll": (Fn(lambda x: torch.roll(x, (3, -2), (1, 3))), [x4()], "aten.roll"),
    "roll_flat": (Fn(lambda x: torch.roll(x, 7)), [torch.randn(3, 5)], "aten.roll"),
    "index_tensor": (Fn(lambda x, t: x[:, t.long()], torch.tensor([3.0, 0, 2, 2])),
                     [torch.randn(2, 5, 3)], "aten.index.Tensor"),
    "inplace_slice_assign": (Fn(lambda x: _assign(x)), [torch.randn(4, 6)], "aten.fill_"),
    "embedding": (nn.Embedding(11, 6), [torch.tensor([[3, 0, 10], [5, 5, 1]])], "aten.embedding"),
    "reshape_as": (Fn(lambda x, y: x.reshape_as(y) * y), [torch.randn(2, 6), torch.randn(3, 4)],
                   "aten.reshape_as"),
    "expand_as": (Fn(lambda x, y: x.expand_as(y) + y), [torch.randn(3, 1), torch.randn(3, 4)],
                  "aten.expand_as"),
    "swapaxes": (Fn(lambda x: x.swapaxes(1, 3)), [x4()], "aten.swapaxes"),
    "vector_norm": (Fn(lambda x: F.normalize(x, dim=-1) + torch.linalg.vector_norm(x, 1, 1, True)
                       + torch.linalg.vector_norm(x, float("inf"), -2, True)), [x4()],
                    "aten.linalg_vector_norm"),
    "cumsum": (Fn(lambda x: x.cumsum(2)), [x4()], "aten.cumsum"),
    "cumsum_of_mask": (Fn(lambda t: (t != 1).int().cumsum(1) * (t != 1)),
                       [torch.tensor([[1, 4, 1, 2, 2, 1]])], "aten.cumsum"),
    "adaptive_avg_pool1d": (nn.AdaptiveAvgPool1d(1), [torch.randn(2, 5, 12)],
                            "aten.adaptive_avg_pool1d"),
    "adaptive_avg_pool1d_3": (nn.AdaptiveAvgPool1d(3), [torch.randn(2, 5, 12)],
                              "aten.adaptive_avg_pool1d"),
    "gather": (Fn(lambda x, i: torch.gather(x, 1, i), torch.tensor([[2, 0], [1, 1], [0, 2]])),
               [torch.randn(3, 3)], "aten.gather"),
    "isnan_guard": (Fn(lambda x: torch.where(torch.isnan(x.softmax(-1)), 0.0, x.softmax(-1))),
                    [x4()], "aten.isnan"),
}


def _assign(x):
    y = x * 2
    y[:, 1:3] = 0.25          # an in-place write, functionalized before import
    return y + 1


@pytest.mark.parametrize("name", list(CASES))
def test_aten_converter_matches_torch(name):
    module, inputs, aten = CASES[name]
    module.eval()
    ep = torch.export.export(module, tuple(inputs))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(t.startswith(aten) for t in targets), f"{name}: export holds no {aten}: {targets}"
    g = from_torch(module, inputs)
    bevir.verify(g)
    feed = {v.name: x.numpy() for v, x in zip(g.inputs, inputs)}
    out = next(iter(bevir.run(g, feed).values()))          # the first output
    with torch.no_grad():
        ref = module(*inputs)
    ref = (ref[0] if isinstance(ref, tuple) else ref).numpy()
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("module, inputs, message", [
    (nn.ConvTranspose2d(4, 2, 2), [x4()], "aten.conv_transpose2d"),
    (nn.AdaptiveAvgPool2d((4, 4)), [x4()], "windows of unequal size"),
    (Fn(lambda x: x[x > 0].sum()), [x4()], "aten.index"),
])
def test_aten_converter_refusals_name_the_op(module, inputs, message):
    with pytest.raises(bevir.UnsupportedError, match=re.escape(message)):
        from_torch(module.eval(), inputs)


def test_supported_aten_table_in_the_docs_is_current():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "frontends.md").read_text()
    start, end = "<!-- aten-table -->\n", "<!-- /aten-table -->"
    assert start in doc and end in doc
    table = doc[doc.index(start) + len(start):doc.index(end)]
    assert table == aten_table(), ("docs/frontends.md's ATen table is stale: run "
                                   "python tools/update_aten_table.py")
