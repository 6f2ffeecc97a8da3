"""BEVFormer's attention modules as bevir custom ops: one IR op per module instance.

Each entry names the registry op (``bevir/ops/attention.py`` defines their semantics) and
reads its attributes from the module's configuration; the module's parameters become the
op's constant operands, named by their state_dict keys.
"""
from __future__ import annotations

from bevir import CustomOp

from .model import (CustomMSDeformableAttention, DecoderSelfAttention, FFN,
                    MSDeformableAttnCore, SpatialCrossAttention, TemporalSelfAttention)


def _shapes(m) -> tuple[int, ...]:
    return tuple(d for hw in m.spatial_shapes for d in hw)


def _deform(m) -> dict:
    return dict(num_heads=m.num_heads, num_levels=m.num_levels, num_points=m.num_points,
                spatial_shapes=_shapes(m))


CUSTOM_OPS = {
    TemporalSelfAttention: CustomOp(
        "temporal_self_attention",
        attrs=lambda m: {**_deform(m), "num_bev_queue": m.num_bev_queue}),
    SpatialCrossAttention: CustomOp(
        "spatial_cross_attention",
        attrs=lambda m: {**_deform(m.deformable_attention), "num_cams": m.num_cams}),
    CustomMSDeformableAttention: CustomOp("deformable_cross_attention", attrs=_deform),
    DecoderSelfAttention: CustomOp("multihead_attention",
                                   attrs=lambda m: {"num_heads": m.attn.num_heads}),
    FFN: CustomOp("ffn"),
    # inside the modules above the outer boundary wins; alone it stands for the sampling core
    MSDeformableAttnCore: CustomOp("ms_deform_attn",
                                   attrs=lambda m: {"spatial_shapes": _shapes(m)}),
}
