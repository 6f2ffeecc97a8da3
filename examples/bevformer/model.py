"""BEVFormer-tiny inference (batch 1, test mode) as PyTorch modules.

Follows /work/shared/docs/bevformer_tiny.md (sections 2.x) and keeps the official state_dict
key names of section 3, so ``bevformer_tiny_epoch_24.pth`` loads with ``strict=True``.

Export notes: every shape is static (spatial shapes are Python ints taken from the config),
the attention modules have no data-dependent Python control flow, and the spatial cross
attention uses the dense form of section 2.5 (every camera attends for every BEV query; the
result is masked by "any anchor visible" and divided by the per-query camera count), which
gives the same per-query values as the original gather/scatter form. Dropout is omitted
(identity at inference; it owns no parameters, so the keys are unchanged).

The attention pieces are separate modules so that a compiler frontend can treat them as
custom-op boundaries: ``MSDeformableAttnCore`` (the pure ``multi_scale_deformable_attn``),
``TemporalSelfAttention``, ``MSDeformableAttention3D``, ``SpatialCrossAttention``,
``CustomMSDeformableAttention`` and ``DecoderSelfAttention``.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .backbone import FPN, ResNet50
from .config import BEVFormerConfig

SpatialShapes = Sequence[tuple[int, int]]


# ---------------------------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------------------------

def multi_scale_deformable_attn(value: torch.Tensor, spatial_shapes: SpatialShapes,
                                sampling_locations: torch.Tensor,
                                attention_weights: torch.Tensor) -> torch.Tensor:
    """mmcv ``multi_scale_deformable_attn_pytorch``, exactly.

    value (bs, sum(H*W), heads, d); spatial_shapes [(H, W), ...] as Python ints;
    sampling_locations (bs, Nq, heads, L, P, 2) in [0, 1], last dim (x, y);
    attention_weights (bs, Nq, heads, L, P). Returns (bs, Nq, heads*d), channel = head*d + i.
    """
    bs, _, num_heads, embed_dims = value.shape
    _, num_queries, _, num_levels, num_points, _ = sampling_locations.shape
    value_list = value.split([int(h) * int(w) for h, w in spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for level, (h, w) in enumerate(spatial_shapes):
        value_l = value_list[level].flatten(2).transpose(1, 2).reshape(bs * num_heads, embed_dims,
                                                                       int(h), int(w))
        grid_l = sampling_grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampling_value_list.append(F.grid_sample(value_l, grid_l, mode="bilinear",
                                                 padding_mode="zeros", align_corners=False))
    attention_weights = attention_weights.transpose(1, 2).reshape(
        bs * num_heads, 1, num_queries, num_levels * num_points)
    output = (torch.stack(sampling_value_list, dim=-2).flatten(-2) * attention_weights).sum(-1)
    output = output.view(bs, num_heads * embed_dims, num_queries)
    return output.transpose(1, 2).contiguous()


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    x = x.clamp(min=0, max=1)
    x1 = x.clamp(min=eps)
    x2 = (1 - x).clamp(min=eps)
    return torch.log(x1 / x2)


def rotate_bev(img: torch.Tensor, angle_deg: torch.Tensor, center: tuple[float, float]
               ) -> torch.Tensor:
    """torchvision 0.10 ``functional.rotate(img, angle, center=center)`` for a (C, H, W) tensor.

    NEAREST interpolation, zero fill, expand=False. ``angle_deg`` is a 0-d tensor (degrees,
    counter-clockwise as in torchvision). Output pixel (i, j) reads source pixel
    (round(ys + H/2 - 0.5), round(xs + W/2 - 0.5)) with x = j + 0.5 - W/2, y = i + 0.5 - H/2,
    c = centre - size/2, xs = cos(x-cx) - sin(y-cy) + cx, ys = sin(x-cx) + cos(y-cy) + cy.
    """
    c, h, w = img.shape
    cx = float(center[0]) - w * 0.5
    cy = float(center[1]) - h * 0.5
    rot = angle_deg.to(torch.float32) * (math.pi / 180.0)
    cos, sin = torch.cos(rot), torch.sin(rot)
    # _get_inverse_affine_matrix(center_f, -angle): [cos, -sin, tx, sin, cos, ty]
    tx = cos * (-cx) + (-sin) * (-cy) + cx
    ty = sin * (-cx) + cos * (-cy) + cy
    theta = torch.stack([torch.stack([cos, -sin, tx]), torch.stack([sin, cos, ty])])   # (2, 3)
    # _gen_affine_grid
    xg = torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w, dtype=torch.float32)
    yg = torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h, dtype=torch.float32)
    base = torch.stack([xg[None, :].expand(h, w), yg[:, None].expand(h, w),
                        torch.ones(h, w, dtype=torch.float32)], -1)                  # (h, w, 3)
    rescaled = theta.transpose(0, 1) / torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32)
    grid = (base.view(1, h * w, 3) @ rescaled).view(1, h, w, 2)
    out = F.grid_sample(img[None], grid.to(img.dtype), mode="nearest", padding_mode="zeros",
                        align_corners=False)
    return out[0]


# ---------------------------------------------------------------------------------------------
# attention modules
# ---------------------------------------------------------------------------------------------

class MSDeformableAttnCore(nn.Module):
    """Parameter-free custom-op boundary around ``multi_scale_deformable_attn``."""

    def __init__(self, spatial_shapes: SpatialShapes):
        super().__init__()
        self.spatial_shapes = tuple((int(h), int(w)) for h, w in spatial_shapes)

    def forward(self, value, sampling_locations, attention_weights):
        return multi_scale_deformable_attn(value, self.spatial_shapes, sampling_locations,
                                           attention_weights)

    def extra_repr(self) -> str:
        return f"spatial_shapes={self.spatial_shapes}"


def _offset_normalizer(spatial_shapes: SpatialShapes) -> torch.Tensor:
    return torch.tensor([[float(w), float(h)] for h, w in spatial_shapes], dtype=torch.float32)


class TemporalSelfAttention(nn.Module):
    """Section 2.4. Query (1, Q, C); value (2, Q, C) = [rotated prev_bev, layer-0 query] or
    None (then [query, query] of this layer's input); reference points (2, Q, L, 2)."""

    def __init__(self, embed_dims: int, num_heads: int, num_levels: int, num_points: int,
                 num_bev_queue: int, bev_hw: tuple[int, int]):
        super().__init__()
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points, self.num_bev_queue = num_levels, num_points, num_bev_queue
        self.spatial_shapes = (tuple(bev_hw),)
        q_in = embed_dims * num_bev_queue
        self.sampling_offsets = nn.Linear(q_in,
                                          num_bev_queue * num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(q_in,
                                           num_bev_queue * num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.core = MSDeformableAttnCore(self.spatial_shapes)

    def forward(self, query, value, query_pos, reference_points):
        nq_ = self.num_bev_queue
        if value is None:
            bs, len_bev, c = query.shape
            value = torch.stack([query, query], 1).reshape(bs * nq_, len_bev, c)
        identity = query
        query = query + query_pos
        bs, num_query, embed_dims = query.shape
        _, num_value, _ = value.shape
        query = torch.cat([value[:bs], query], -1)
        value = self.value_proj(value).reshape(bs * nq_, num_value, self.num_heads, -1)
        h, l, p = self.num_heads, self.num_levels, self.num_points
        off = self.sampling_offsets(query).view(bs, num_query, h, nq_, l, p, 2)
        aw = self.attention_weights(query).view(bs, num_query, h, nq_, l * p).softmax(-1)
        aw = aw.view(bs, num_query, h, nq_, l, p).permute(0, 3, 1, 2, 4, 5) \
               .reshape(bs * nq_, num_query, h, l, p)
        off = off.permute(0, 3, 1, 2, 4, 5, 6).reshape(bs * nq_, num_query, h, l, p, 2)
        norm = _offset_normalizer(self.spatial_shapes)
        loc = reference_points[:, :, None, :, None, :] + off / norm[None, None, None, :, None, :]
        out = self.core(value, loc, aw)                              # (bs*2, Q, C)
        out = out.permute(1, 2, 0).view(num_query, embed_dims, bs, nq_).mean(-1).permute(2, 0, 1)
        return self.output_proj(out) + identity


class MSDeformableAttention3D(nn.Module):
    """Section 2.5 inner attention: no output projection, no residual. Batch = cameras.
    query (N, Q, C), value (N, V, C), reference_points (N, Q, D, 2) -> (N, Q, C)."""

    def __init__(self, embed_dims: int, num_heads: int, num_levels: int, num_points: int,
                 feat_hw: tuple[int, int]):
        super().__init__()
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points = num_levels, num_points
        self.spatial_shapes = (tuple(feat_hw),)
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.core = MSDeformableAttnCore(self.spatial_shapes)

    def forward(self, query, value, reference_points):
        bs, num_query, _ = query.shape
        _, num_value, _ = value.shape
        h, l, p = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(value).view(bs, num_value, h, -1)
        off = self.sampling_offsets(query).view(bs, num_query, h, l, p, 2)
        aw = self.attention_weights(query).view(bs, num_query, h, l * p).softmax(-1) \
                 .view(bs, num_query, h, l, p)
        d = reference_points.shape[2]                                # Z anchors
        norm = _offset_normalizer(self.spatial_shapes)
        off = (off / norm[None, None, None, :, None, :]).view(bs, num_query, h, l, p // d, d, 2)
        loc = (reference_points[:, :, None, None, None, :, :] + off).view(bs, num_query, h, l, p, 2)
        return self.core(value, loc, aw)


class SpatialCrossAttention(nn.Module):
    """Section 2.5, dense form. query (1, Q, C); value (N_cam, V, C) (already with cams/level
    embeddings); reference_points_cam (N_cam, Q, D, 2); bev_mask (N_cam, Q, D) bool."""

    def __init__(self, embed_dims: int, num_cams: int,
                 deformable_attention: MSDeformableAttention3D):
        super().__init__()
        self.embed_dims, self.num_cams = embed_dims, num_cams
        self.deformable_attention = deformable_attention
        self.output_proj = nn.Linear(embed_dims, embed_dims)

    def forward(self, query, value, reference_points_cam, bev_mask):
        inp_residual = query
        n = self.num_cams
        q = query.expand(n, -1, -1)                                  # (N, Q, C), no pos
        out = self.deformable_attention(q, value, reference_points_cam)   # (N, Q, C)
        visible = bev_mask.any(-1).to(query.dtype)                   # (N, Q)
        slots = torch.zeros_like(query[0])
        for i in range(n):                                           # same summation order as the
            slots = slots + out[i] * visible[i][:, None]             # original scatter-add
        count = visible.sum(0).clamp(min=1.0)                        # (Q,)
        slots = (slots / count[:, None])[None]
        return self.output_proj(slots) + inp_residual


class CustomMSDeformableAttention(nn.Module):
    """Decoder cross attention (section 2.7). query/query_pos (1, Nq, C); value (1, V, C);
    reference_points (1, Nq, L, 2). Includes output_proj and the residual."""

    def __init__(self, embed_dims: int, num_heads: int, num_levels: int, num_points: int,
                 bev_hw: tuple[int, int]):
        super().__init__()
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points = num_levels, num_points
        self.spatial_shapes = (tuple(bev_hw),)
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.core = MSDeformableAttnCore(self.spatial_shapes)

    def forward(self, query, value, query_pos, reference_points):
        identity = query
        query = query + query_pos
        bs, num_query, _ = query.shape
        _, num_value, _ = value.shape
        h, l, p = self.num_heads, self.num_levels, self.num_points
        value = self.value_proj(value).view(bs, num_value, h, -1)
        off = self.sampling_offsets(query).view(bs, num_query, h, l, p, 2)
        aw = self.attention_weights(query).view(bs, num_query, h, l * p).softmax(-1) \
                 .view(bs, num_query, h, l, p)
        norm = _offset_normalizer(self.spatial_shapes)
        loc = reference_points[:, :, None, :, None, :] + off / norm[None, None, None, :, None, :]
        out = self.core(value, loc, aw)
        return self.output_proj(out) + identity


class DecoderSelfAttention(nn.Module):
    """mmcv ``MultiheadAttention`` wrapper: q = k = query + pos, v = query; adds the residual.
    Tensors are (Nq, 1, C) (batch_first=False, as in the original)."""

    def __init__(self, embed_dims: int, num_heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dims, num_heads, dropout=0.0)

    def forward(self, query, query_pos):
        qk = query + query_pos
        # need_weights=True keeps the explicit bmm/softmax/bmm path (as torch 1.9 used); the
        # averaged weights are unused.
        out = self.attn(query=qk, key=qk, value=query, need_weights=True)[0]
        return query + out


class FFN(nn.Module):
    """mmcv FFN with num_fcs=2: keys layers.0.0 (C->F) and layers.1 (F->C); identity added."""

    def __init__(self, embed_dims: int, ffn_dims: int):
        super().__init__()
        self.layers = nn.Sequential(nn.Sequential(nn.Linear(embed_dims, ffn_dims), nn.ReLU()),
                                    nn.Linear(ffn_dims, embed_dims))

    def forward(self, x):
        return x + self.layers(x)


# ---------------------------------------------------------------------------------------------
# layers, encoder, decoder
# ---------------------------------------------------------------------------------------------

class BEVFormerLayer(nn.Module):
    """Post-norm ('self_attn', 'norm', 'cross_attn', 'norm', 'ffn', 'norm')."""

    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        c = cfg.embed_dims
        tsa = TemporalSelfAttention(c, cfg.num_heads, cfg.num_levels, cfg.tsa_points,
                                    cfg.num_bev_queue, (cfg.bev_h, cfg.bev_w))
        msda3d = MSDeformableAttention3D(c, cfg.num_heads, cfg.num_levels, cfg.sca_points,
                                         (cfg.feat_h, cfg.feat_w))
        sca = SpatialCrossAttention(c, cfg.num_cams, msda3d)
        self.attentions = nn.ModuleList([tsa, sca])
        self.ffns = nn.ModuleList([FFN(c, cfg.ffn_dims)])
        self.norms = nn.ModuleList([nn.LayerNorm(c, eps=cfg.ln_eps) for _ in range(3)])

    def forward(self, query, bev_pos, ref_2d, prev_bev, feat, reference_points_cam, bev_mask):
        q = self.attentions[0](query, prev_bev, bev_pos, ref_2d)
        q = self.norms[0](q)
        q = self.attentions[1](q, feat, reference_points_cam, bev_mask)
        q = self.norms[1](q)
        q = self.ffns[0](q)
        return self.norms[2](q)


class BEVFormerEncoder(nn.Module):
    """Section 2.2."""

    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([BEVFormerLayer(cfg) for _ in range(cfg.encoder_layers)])

    def get_reference_points_3d(self) -> torch.Tensor:
        """(D, H*W, 3) normalized (x, y, z); token index y*W + x."""
        cfg = self.cfg
        h, w, d = cfg.bev_h, cfg.bev_w, cfg.pillar_points
        z = cfg.pc_range[5] - cfg.pc_range[2]
        zs = torch.linspace(0.5, z - 0.5, d, dtype=torch.float32).view(-1, 1, 1).expand(d, h, w) / z
        xs = torch.linspace(0.5, w - 0.5, w, dtype=torch.float32).view(1, 1, w).expand(d, h, w) / w
        ys = torch.linspace(0.5, h - 0.5, h, dtype=torch.float32).view(1, h, 1).expand(d, h, w) / h
        ref_3d = torch.stack((xs, ys, zs), -1)
        return ref_3d.permute(0, 3, 1, 2).flatten(2).permute(0, 2, 1)

    def get_reference_points_2d(self) -> torch.Tensor:
        """(1, H*W, 1, 2) normalized (x, y)."""
        h, w = self.cfg.bev_h, self.cfg.bev_w
        ref_y, ref_x = torch.meshgrid(torch.linspace(0.5, h - 0.5, h, dtype=torch.float32),
                                      torch.linspace(0.5, w - 0.5, w, dtype=torch.float32),
                                      indexing="ij")
        ref_2d = torch.stack((ref_x.reshape(-1) / w, ref_y.reshape(-1) / h), -1)
        return ref_2d[None, :, None, :]

    def point_sampling(self, lidar2img: torch.Tensor):
        """lidar2img (N, 4, 4) -> reference_points_cam (N, Q, D, 2), bev_mask (N, Q, D) bool."""
        cfg = self.cfg
        pc = cfg.pc_range
        ref = self.get_reference_points_3d()                          # (D, Q, 3)
        scale = torch.tensor([pc[3] - pc[0], pc[4] - pc[1], pc[5] - pc[2]], dtype=torch.float32)
        offset = torch.tensor([pc[0], pc[1], pc[2]], dtype=torch.float32)
        ref = ref * scale + offset
        ref = torch.cat([ref, torch.ones_like(ref[..., :1])], -1)     # (D, Q, 4)
        cam = torch.matmul(lidar2img.to(torch.float32)[None, :, None, :, :],
                           ref[:, None, :, :, None]).squeeze(-1)      # (D, N, Q, 4)
        eps = 1e-5
        mask = cam[..., 2:3] > eps
        uv = cam[..., 0:2] / torch.maximum(cam[..., 2:3], torch.ones_like(cam[..., 2:3]) * eps)
        uv = uv / torch.tensor([float(cfg.img_w), float(cfg.img_h)], dtype=torch.float32)
        mask = (mask & (uv[..., 1:2] > 0.0) & (uv[..., 1:2] < 1.0)
                & (uv[..., 0:1] < 1.0) & (uv[..., 0:1] > 0.0))
        reference_points_cam = uv.permute(1, 2, 0, 3)                # (N, Q, D, 2)
        bev_mask = mask.permute(1, 2, 0, 3)[..., 0]                  # (N, Q, D)
        return reference_points_cam, bev_mask

    def forward(self, bev_query, feat, bev_pos, shift, lidar2img, prev_bev=None):
        """bev_query/bev_pos (1, Q, C); feat (N, V, C); shift (1, 2); prev_bev (1, Q, C)|None."""
        reference_points_cam, bev_mask = self.point_sampling(lidar2img)
        ref_2d = self.get_reference_points_2d()                      # (1, Q, 1, 2)
        shift_ref_2d = ref_2d + shift[:, None, None, :]
        if self.cfg.shift_inplace_bug:
            ref_2d = shift_ref_2d                       # `shift_ref_2d = ref_2d; += shift`
        bs, len_bev, num_bev_level, _ = ref_2d.shape
        if prev_bev is not None:
            prev = torch.stack([prev_bev, bev_query], 1).reshape(bs * 2, len_bev, -1)
            hybrid_ref_2d = torch.stack([shift_ref_2d, ref_2d], 1).reshape(bs * 2, len_bev,
                                                                           num_bev_level, 2)
        else:
            prev = None
            hybrid_ref_2d = torch.stack([ref_2d, ref_2d], 1).reshape(bs * 2, len_bev,
                                                                     num_bev_level, 2)
        for layer in self.layers:
            bev_query = layer(bev_query, bev_pos, hybrid_ref_2d, prev, feat,
                              reference_points_cam, bev_mask)
        return bev_query


class DecoderLayer(nn.Module):
    """DetrTransformerDecoderLayer, post-norm. State (1, Nq, C)."""

    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        c = cfg.embed_dims
        self.attentions = nn.ModuleList([
            DecoderSelfAttention(c, cfg.num_heads),
            CustomMSDeformableAttention(c, cfg.num_heads, cfg.num_levels, cfg.decoder_points,
                                        (cfg.bev_h, cfg.bev_w))])
        self.ffns = nn.ModuleList([FFN(c, cfg.ffn_dims)])
        self.norms = nn.ModuleList([nn.LayerNorm(c, eps=cfg.ln_eps) for _ in range(3)])

    def forward(self, query, query_pos, value, reference_points):
        q = self.attentions[0](query.transpose(0, 1), query_pos.transpose(0, 1)).transpose(0, 1)
        q = self.norms[0](q)
        q = self.attentions[1](q, value, query_pos, reference_points)
        q = self.norms[1](q)
        q = self.ffns[0](q)
        return self.norms[2](q)


class DetectionTransformerDecoder(nn.Module):
    """Section 2.7 with box refinement. Returns per layer the output query and the reference
    points that layer consumed (refs[0] = init reference). The refinement after the last layer
    is not computed (the head recomputes the same box from refs[-1])."""

    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        self.eps = cfg.inverse_sigmoid_eps
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.decoder_layers)])

    def forward(self, query, query_pos, value, reference_points, reg_branches):
        hs, refs = [], []
        output = query
        for lid, layer in enumerate(self.layers):
            refs.append(reference_points)
            output = layer(output, query_pos, value, reference_points[..., :2].unsqueeze(2))
            hs.append(output)
            if lid + 1 < len(self.layers):
                tmp = reg_branches[lid](output)
                new = torch.cat(
                    [tmp[..., 0:2] + inverse_sigmoid(reference_points[..., :2], self.eps),
                     tmp[..., 4:5] + inverse_sigmoid(reference_points[..., 2:3], self.eps)], -1)
                reference_points = new.sigmoid().detach()
        return hs, refs


class PerceptionTransformer(nn.Module):
    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.embed_dims
        self.level_embeds = nn.Parameter(torch.empty(cfg.num_feature_levels, c))
        self.cams_embeds = nn.Parameter(torch.empty(cfg.num_cams, c))
        self.reference_points = nn.Linear(c, 3)
        self.can_bus_mlp = nn.Sequential(
            nn.Linear(cfg.can_bus_dims, cfg.can_bus_hidden), nn.ReLU(inplace=False),
            nn.Linear(cfg.can_bus_hidden, c), nn.ReLU(inplace=False))
        self.can_bus_mlp.add_module("norm", nn.LayerNorm(c, eps=cfg.ln_eps))
        self.encoder = BEVFormerEncoder(cfg)
        self.decoder = DetectionTransformerDecoder(cfg)

    def compute_shift(self, can_bus: torch.Tensor) -> torch.Tensor:
        """(1, 2) BEV-normalized (x, y) ego shift from can_bus (section 2)."""
        cfg = self.cfg
        gy, gx = cfg.grid_length
        dx, dy = can_bus[0], can_bus[1]
        ego_angle = can_bus[-2] / math.pi * 180
        trans_len = torch.sqrt(dx ** 2 + dy ** 2)
        trans_angle = torch.atan2(dy, dx) / math.pi * 180
        bev_angle = ego_angle - trans_angle
        shift_y = trans_len * torch.cos(bev_angle / 180 * math.pi) / gy / cfg.bev_h
        shift_x = trans_len * torch.sin(bev_angle / 180 * math.pi) / gx / cfg.bev_w
        shift = torch.stack([shift_x, shift_y])[None]
        return shift * float(cfg.use_shift)

    def get_bev_features(self, feats, bev_queries, bev_pos, lidar2img, can_bus, prev_bev=None):
        """feats (N, C, h, w); bev_queries (Q, C); bev_pos (Q, C); prev_bev (Q, C) | None.
        Returns bev_embed (1, Q, C)."""
        cfg = self.cfg
        shift = self.compute_shift(can_bus)
        if prev_bev is not None:
            t = prev_bev.reshape(cfg.bev_h, cfg.bev_w, -1).permute(2, 0, 1)
            t = rotate_bev(t, can_bus[-1], cfg.rotate_center)
            prev_bev = t.permute(1, 2, 0).reshape(cfg.num_bev, -1)[None]      # (1, Q, C)
        cb = self.can_bus_mlp(can_bus[None].to(bev_queries.dtype))           # (1, C)
        bev_query = (bev_queries + cb * float(cfg.use_can_bus))[None]         # (1, Q, C)
        feat = feats.flatten(2).permute(0, 2, 1)                              # (N, h*w, C)
        if cfg.use_cams_embeds:
            feat = feat + self.cams_embeds[:, None, :].to(feat.dtype)
        feat = feat + self.level_embeds[None, 0:1, :].to(feat.dtype)
        return self.encoder(bev_query, feat, bev_pos[None], shift, lidar2img, prev_bev)

    def forward(self, feats, bev_queries, object_query_embed, bev_pos, lidar2img, can_bus,
                prev_bev, reg_branches):
        bev_embed = self.get_bev_features(feats, bev_queries, bev_pos, lidar2img, can_bus, prev_bev)
        c = self.cfg.embed_dims
        query_pos, query = torch.split(object_query_embed, c, dim=1)
        query_pos, query = query_pos[None], query[None]                      # (1, Nq, C)
        init_reference = self.reference_points(query_pos).sigmoid()          # (1, Nq, 3)
        hs, refs = self.decoder(query, query_pos, bev_embed, init_reference, reg_branches)
        return bev_embed, hs, refs


# ---------------------------------------------------------------------------------------------
# head and detector
# ---------------------------------------------------------------------------------------------

class LearnedPositionalEncoding(nn.Module):
    def __init__(self, num_feats: int, row_num_embed: int, col_num_embed: int):
        super().__init__()
        self.row_embed = nn.Embedding(row_num_embed, num_feats)
        self.col_embed = nn.Embedding(col_num_embed, num_feats)

    def forward(self) -> torch.Tensor:
        """(H*W, 2*num_feats); token y*W + x = cat(col_embed[x], row_embed[y])."""
        h, w = self.row_embed.num_embeddings, self.col_embed.num_embeddings
        x_embed = self.col_embed.weight
        y_embed = self.row_embed.weight
        pos = torch.cat((x_embed[None].expand(h, w, -1), y_embed[:, None].expand(h, w, -1)), -1)
        return pos.reshape(h * w, -1)


def _cls_branch(c: int, n: int, eps: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c, c), nn.LayerNorm(c, eps=eps), nn.ReLU(),
                         nn.Linear(c, c), nn.LayerNorm(c, eps=eps), nn.ReLU(), nn.Linear(c, n))


def _reg_branch(c: int, n: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c, c), nn.ReLU(), nn.Linear(c, c), nn.ReLU(), nn.Linear(c, n))


class BEVFormerHead(nn.Module):
    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.embed_dims
        self.bev_embedding = nn.Embedding(cfg.num_bev, c)
        self.query_embedding = nn.Embedding(cfg.num_query, 2 * c)
        self.positional_encoding = LearnedPositionalEncoding(cfg.pos_dims, cfg.bev_h, cfg.bev_w)
        self.code_weights = nn.Parameter(torch.tensor(cfg.code_weights, dtype=torch.float32),
                                         requires_grad=False)
        n = cfg.decoder_layers
        self.cls_branches = nn.ModuleList([_cls_branch(c, cfg.num_classes, cfg.ln_eps)
                                           for _ in range(n)])
        self.reg_branches = nn.ModuleList([_reg_branch(c, cfg.code_size) for _ in range(n)])
        self.transformer = PerceptionTransformer(cfg)

    def branch_outputs(self, lvl: int, hs: torch.Tensor, reference: torch.Tensor):
        """Section 2.8 for one decoder layer: (cls (Nq, 10), bbox (Nq, 10) denormalized)."""
        pc = self.cfg.pc_range
        r = inverse_sigmoid(reference, self.cfg.inverse_sigmoid_eps)
        cls = self.cls_branches[lvl](hs)
        t = self.reg_branches[lvl](hs)
        xy = (t[..., 0:2] + r[..., 0:2]).sigmoid()
        z = (t[..., 4:5] + r[..., 2:3]).sigmoid()
        x = xy[..., 0:1] * (pc[3] - pc[0]) + pc[0]
        y = xy[..., 1:2] * (pc[4] - pc[1]) + pc[1]
        z = z * (pc[5] - pc[2]) + pc[2]
        bbox = torch.cat([x, y, t[..., 2:4], z, t[..., 5:]], -1)
        return cls[0], bbox[0]

    def forward(self, feats, lidar2img, can_bus, prev_bev=None, all_layers: bool = False):
        """feats (N, C, h, w). Returns (cls_scores, bbox_preds, bev_embed (Q, C)); with
        all_layers the first two are stacked over decoder layers (L, Nq, 10)."""
        bev_queries = self.bev_embedding.weight
        object_query_embed = self.query_embedding.weight
        bev_pos = self.positional_encoding().to(bev_queries.dtype)
        bev_embed, hs, refs = self.transformer(feats, bev_queries, object_query_embed, bev_pos,
                                               lidar2img, can_bus, prev_bev, self.reg_branches)
        if all_layers:
            outs = [self.branch_outputs(i, hs[i], refs[i]) for i in range(len(hs))]
            cls = torch.stack([o[0] for o in outs])
            bbox = torch.stack([o[1] for o in outs])
        else:
            cls, bbox = self.branch_outputs(len(hs) - 1, hs[-1], refs[-1])
        return cls, bbox, bev_embed[0]


class BEVFormer(nn.Module):
    """forward(img (6,3,H,W), lidar2img (6,4,4), can_bus (18,), prev_bev (Q, C) | None)
    -> (cls_scores (num_query, 10) logits, bbox_preds (num_query, 10) denormalized) of the last
    decoder layer. ``forward(..., return_bev=True)`` also returns bev_embed (the next frame's
    prev_bev)."""

    def __init__(self, cfg: BEVFormerConfig):
        super().__init__()
        self.cfg = cfg
        self.img_backbone = ResNet50(cfg.resnet_blocks)
        self.img_neck = FPN(cfg.c5_channels, cfg.fpn_channels)
        self.pts_bbox_head = BEVFormerHead(cfg)

    def backbone(self, img: torch.Tensor) -> torch.Tensor:
        """img (N, 3, H, W) normalized -> feats (N, C, H/32, W/32)."""
        return self.img_neck(self.img_backbone(img))

    def head(self, feats, lidar2img, can_bus, prev_bev=None, return_bev: bool = False):
        cls, bbox, bev = self.pts_bbox_head(feats, lidar2img, can_bus, prev_bev)
        return (cls, bbox, bev) if return_bev else (cls, bbox)

    def forward(self, img, lidar2img, can_bus, prev_bev=None, return_bev: bool = False):
        return self.head(self.backbone(img), lidar2img, can_bus, prev_bev, return_bev)


class BEVFormerBackbone(nn.Module):
    """Export wrapper: img -> feats. State-dict keys img_backbone.*, img_neck.*."""

    def __init__(self, model: BEVFormer):
        super().__init__()
        self.img_backbone = model.img_backbone
        self.img_neck = model.img_neck

    def forward(self, img):
        return self.img_neck(self.img_backbone(img))


class BEVFormerHeadOnly(nn.Module):
    """Export wrapper: (feats, lidar2img, can_bus[, prev_bev]) -> (cls_scores, bbox_preds[, bev]).
    State-dict keys pts_bbox_head.*. ``with_prev_bev`` fixes the graph variant statically."""

    def __init__(self, model: BEVFormer, with_prev_bev: bool, return_bev: bool = False):
        super().__init__()
        self.pts_bbox_head = model.pts_bbox_head
        self.with_prev_bev = with_prev_bev
        self.return_bev = return_bev

    def forward(self, feats, lidar2img, can_bus, prev_bev=None):
        cls, bbox, bev = self.pts_bbox_head(feats, lidar2img, can_bus,
                                            prev_bev if self.with_prev_bev else None)
        return (cls, bbox, bev) if self.return_bev else (cls, bbox)


def split_model(model: BEVFormer, with_prev_bev: bool = True, return_bev: bool = False):
    """(backbone module, head module) sharing the model's parameters, in the model's mode
    (an exporter that restores the wrapper's mode must not switch the model to training)."""
    return (BEVFormerBackbone(model).train(model.training),
            BEVFormerHeadOnly(model, with_prev_bev, return_bev).train(model.training))
