"""Each attention op against its PyTorch module (examples/bevformer/model.py) and against an
independent per-sample loop for the sampling core."""

import numpy as np
import pytest
import torch

import bevir
from bevir.ops.kernels.sample import ms_deform_attn_np

from examples.bevformer.model import (FFN, CustomMSDeformableAttention,
                                      DecoderSelfAttention, MSDeformableAttention3D,
                                      SpatialCrossAttention, TemporalSelfAttention,
                                      multi_scale_deformable_attn)

C, H, L = 16, 4, 1


def randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = 0.3 * torch.randn(p.shape, generator=g)
    return module.eval()


def run_op(op, operands, attrs):
    g = bevir.Graph()
    vals = [None if a is None else g.add_input(f"in{i}", bevir.TensorType.of(a))
            for i, a in enumerate(operands)]
    g.set_output("y", g.create_node(op, vals, attrs).outputs[0])
    bevir.verify(g)
    return bevir.run(g, {f"in{i}": a for i, a in enumerate(operands) if a is not None})["y"]


def params(module):
    return [p.detach().numpy() for _, p in module.named_parameters()]


def check(module, op, args, attrs, atol=1e-5):
    with torch.no_grad():
        ref = module(*args).numpy()
    out = run_op(op, [None if a is None else a.numpy() for a in args] + params(module), attrs)
    assert np.abs(out - ref).max() <= atol
    return out


def naive_msda(value, shapes, loc, aw):
    """Per sample, per corner, as the CUDA kernel: h_im = loc_y*H - 0.5, w_im = loc_x*W - 0.5."""
    bs, _, heads, d = value.shape
    _, nq, _, levels, points, _ = loc.shape
    out = np.zeros((bs, nq, heads, d))
    starts = np.cumsum([0] + [h * w for h, w in shapes])
    for b, q, hd, lv, p in np.ndindex(bs, nq, heads, levels, points):
        h, w = shapes[lv]
        y, x = loc[b, q, hd, lv, p, 1] * h - 0.5, loc[b, q, hd, lv, p, 0] * w - 0.5
        if not (y > -1 and x > -1 and y < h and x < w):
            continue
        y0, x0 = int(np.floor(y)), int(np.floor(x))
        for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
            if 0 <= yy < h and 0 <= xx < w:
                wt = (1 - abs(y - yy)) * (1 - abs(x - xx))
                out[b, q, hd] += aw[b, q, hd, lv, p] * wt * value[b, starts[lv] + yy * w + xx, hd]
    return out.reshape(bs, nq, heads * d)


def test_ms_deform_attn_two_levels_against_torch_and_loop():
    r = np.random.default_rng(0)
    shapes = [(3, 5), (2, 2)]
    value = r.standard_normal((2, 19, 2, 3)).astype(np.float32)
    loc = r.uniform(-0.2, 1.2, (2, 6, 2, 2, 3, 2)).astype(np.float32)   # some out of range
    aw = r.uniform(0, 1, (2, 6, 2, 2, 3)).astype(np.float32)
    out = run_op("ms_deform_attn", [value, loc, aw], {"spatial_shapes": (3, 5, 2, 2)})
    ref = multi_scale_deformable_attn(*map(torch.from_numpy, (value,)), shapes,
                                      torch.from_numpy(loc), torch.from_numpy(aw)).numpy()
    assert np.abs(out - ref).max() <= 1e-5
    assert np.abs(ms_deform_attn_np(value, (3, 5, 2, 2), loc, aw) - naive_msda(value, shapes, loc, aw)).max() <= 1e-5


@pytest.mark.parametrize("with_value", [True, False])
def test_temporal_self_attention(with_value):
    m = randomize(TemporalSelfAttention(C, H, L, 4, 2, (4, 5)), 1)
    g = torch.Generator().manual_seed(2)
    q, pos = torch.randn(1, 20, C, generator=g), torch.randn(1, 20, C, generator=g)
    value = torch.randn(2, 20, C, generator=g) if with_value else None
    ref2d = torch.rand(2, 20, L, 2, generator=g)
    check(m, "temporal_self_attention", (q, value, pos, ref2d),
          dict(num_heads=H, num_levels=L, num_points=4, num_bev_queue=2, spatial_shapes=(4, 5)))


def test_spatial_cross_attention_mask_and_count():
    inner = MSDeformableAttention3D(C, H, L, 8, (3, 4))
    m = randomize(SpatialCrossAttention(C, 3, inner), 3)
    g = torch.Generator().manual_seed(4)
    q, value = torch.randn(1, 10, C, generator=g), torch.randn(3, 12, C, generator=g)
    ref = torch.rand(3, 10, 4, 2, generator=g)
    mask = torch.rand(3, 10, 4, generator=g) > 0.6
    mask[2] = False                      # a camera that sees nothing
    mask[:, 0] = False                   # a query no camera sees: output_proj(0) + query
    out = check(m, "spatial_cross_attention", (q, value, ref, mask),
                dict(num_heads=H, num_levels=L, num_points=8, num_cams=3, spatial_shapes=(3, 4)))
    bias = m.output_proj.bias.detach().numpy()
    np.testing.assert_allclose(out[0, 0], q[0, 0].numpy() + bias, atol=1e-6)


def test_decoder_cross_attention():
    m = randomize(CustomMSDeformableAttention(C, H, L, 4, (4, 4)), 5)
    g = torch.Generator().manual_seed(6)
    q, pos = torch.randn(1, 7, C, generator=g), torch.randn(1, 7, C, generator=g)
    check(m, "deformable_cross_attention", (q, torch.randn(1, 16, C, generator=g), pos,
                                            torch.rand(1, 7, L, 2, generator=g)),
          dict(num_heads=H, num_levels=L, num_points=4, spatial_shapes=(4, 4)))


def test_multihead_attention_and_ffn():
    g = torch.Generator().manual_seed(7)
    m = randomize(DecoderSelfAttention(C, H), 8)
    check(m, "multihead_attention", (torch.randn(9, 1, C, generator=g), torch.randn(9, 1, C, generator=g)),
          dict(num_heads=H))
    check(randomize(FFN(C, 24), 9), "ffn", (torch.randn(1, 5, C, generator=g),), {})


def test_shape_errors_are_verify_errors():
    r = np.zeros
    with pytest.raises(bevir.VerifyError, match="tokens"):
        run_op("deformable_cross_attention",
               [r((1, 7, C), np.float32), r((1, 15, C), np.float32), r((1, 7, C), np.float32),
                r((1, 7, 1, 2), np.float32)] + [r(s, np.float32) for s in
                                                 [(32, C), (32,), (16, C), (16,), (C, C), (C,), (C, C), (C,)]],
               dict(num_heads=H, num_points=4, spatial_shapes=(4, 4)))
