"""Model dimensions of BEVFormer-tiny, and a reduced test preset on the same code path.

See /work/shared/docs/bevformer_tiny.md, section 1. ``CONFIGS["tiny"]`` is the real model
(6x3x480x800 input, 50x50 BEV, 256 dims, 900 queries, ResNet-50). ``CONFIGS["test"]`` keeps
every structural feature (6 cameras on the real calibration, padded input rows, one feature
level of 4 embedded levels, 2-slot temporal queue with shift and rotation, 4 pillar anchors,
8 SCA points, 6 attention modules per type...) at sizes that run in a fraction of a second.

Input geometry (``RandomScaleImageMultiViewImage`` + ``PadMultiViewImage(size_divisor=32)``):
the raw 1600x900 image is resized by ``img_scale`` to ``int(1600*s) x int(900*s)`` (both axes
by the same factor), then zero-padded at the bottom to a multiple of 32. ``lidar2img`` is
``diag(s, s, 1, 1) @ lidar2img_raw``; image-plane coordinates are normalized by the padded
size ``(img_w, img_h)``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

CLASS_NAMES = ("car", "truck", "construction_vehicle", "bus", "trailer", "barrier",
               "motorcycle", "bicycle", "pedestrian", "traffic_cone")

CAMERA_ORDER = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK",
                "CAM_BACK_LEFT", "CAM_BACK_RIGHT")


@dataclass(frozen=True)
class BEVFormerConfig:
    name: str
    # ---- image input ----
    img_scale: float                      # raw -> resized scale (0.5 for tiny)
    img_h: int                            # padded height (multiple of 32)
    img_w: int                            # width (= int(raw_w * img_scale), multiple of 32)
    raw_h: int = 900
    raw_w: int = 1600
    num_cams: int = 6
    img_mean: tuple[float, float, float] = (123.675, 116.28, 103.53)   # RGB order
    img_std: tuple[float, float, float] = (58.395, 57.12, 57.375)
    # ---- backbone / neck ----
    resnet_blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    c5_channels: int = 2048               # fixed by backbone.ResNet50 (widths not configurable)
    backbone_stride: int = 32
    # ---- transformer ----
    embed_dims: int = 256
    ffn_dims: int = 512
    num_heads: int = 8
    bev_h: int = 50
    bev_w: int = 50
    num_query: int = 900
    num_classes: int = 10
    code_size: int = 10
    encoder_layers: int = 3
    decoder_layers: int = 6
    num_levels: int = 1                   # feature levels actually used
    num_feature_levels: int = 4           # rows of transformer.level_embeds (only row 0 used)
    num_bev_queue: int = 2
    tsa_points: int = 4
    sca_points: int = 8
    pillar_points: int = 4                # num_points_in_pillar (Z anchors)
    decoder_points: int = 4
    ln_eps: float = 1e-5
    inverse_sigmoid_eps: float = 1e-5
    rotate_center: tuple[float, float] = (100.0, 100.0)
    use_shift: bool = True
    use_can_bus: bool = True
    use_cams_embeds: bool = True
    # The paper / checkpoint code adds the shift in place, so both TSA queue slots use
    # ref_2d + shift (PITFALL A). False gives the "V2"/TRT-engine [ref + shift, ref].
    shift_inplace_bug: bool = True
    can_bus_dims: int = 18
    # ---- geometry / decode ----
    pc_range: tuple[float, ...] = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0)
    voxel_size: tuple[float, float, float] = (0.2, 0.2, 8.0)
    post_center_range: tuple[float, ...] = (-61.2, -61.2, -10.0, 61.2, 61.2, 10.0)
    max_num: int = 300
    score_threshold: float | None = None
    code_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2)
    class_names: tuple[str, ...] = field(default=CLASS_NAMES)

    def __post_init__(self):
        assert self.img_w == int(self.raw_w * self.img_scale), (self.img_w, self.img_scale)
        assert self.img_h % 32 == 0 and self.img_w % 32 == 0
        assert 0 < self.resized_h <= self.img_h < self.resized_h + 32
        assert self.embed_dims % self.num_heads == 0 and self.embed_dims % 2 == 0
        assert self.sca_points % self.pillar_points == 0
        assert len(self.code_weights) == self.code_size == 10
        assert len(self.class_names) == self.num_classes

    # ---- derived ----
    @property
    def resized_h(self) -> int:
        """Image rows that hold content; rows resized_h..img_h-1 are the zero pad."""
        return int(self.raw_h * self.img_scale)

    @property
    def feat_h(self) -> int:
        return math.ceil(self.img_h / self.backbone_stride)

    @property
    def feat_w(self) -> int:
        return math.ceil(self.img_w / self.backbone_stride)

    @property
    def fpn_channels(self) -> int:        # FPN out_channels = embed_dims
        return self.embed_dims

    @property
    def pos_dims(self) -> int:            # _pos_dim_ = num_feats of LearnedPositionalEncoding
        return self.embed_dims // 2

    @property
    def can_bus_hidden(self) -> int:
        return self.embed_dims // 2

    @property
    def head_dims(self) -> int:
        return self.embed_dims // self.num_heads

    @property
    def num_bev(self) -> int:
        return self.bev_h * self.bev_w

    @property
    def real_w(self) -> float:
        return self.pc_range[3] - self.pc_range[0]

    @property
    def real_h(self) -> float:
        return self.pc_range[4] - self.pc_range[1]

    @property
    def grid_length(self) -> tuple[float, float]:   # (y, x) as in the head
        return (self.real_h / self.bev_h, self.real_w / self.bev_w)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d["derived"] = {"resized_h": self.resized_h, "feat_h": self.feat_h, "feat_w": self.feat_w,
                        "fpn_channels": self.fpn_channels, "can_bus_hidden": self.can_bus_hidden,
                        "pos_dims": self.pos_dims, "head_dims": self.head_dims,
                        "num_bev": self.num_bev, "grid_length": list(self.grid_length),
                        "lidar2img_scale": [self.img_scale, self.img_scale]}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BEVFormerConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
        return cls(**kw)


CONFIGS: dict[str, BEVFormerConfig] = {
    # The real model: raw 1600x900 -> 800x450 -> padded 800x480; C5 15x25.
    "tiny": BEVFormerConfig(name="tiny", img_scale=0.5, img_h=480, img_w=800),
    # Reduced: 1600x900 -> 96x54 -> padded 96x64 (10 zero rows); C5 2x3; BEV 10x10 with the
    # same 102.4 m range (10.24 m cells); rotate centre scaled with the map (2x map size, so it
    # stays outside the grid as in tiny's [100,100] on 50x50).
    "test": BEVFormerConfig(
        name="test", img_scale=0.06, img_h=64, img_w=96,
        resnet_blocks=(1, 1, 1, 1),
        embed_dims=32, ffn_dims=64, num_heads=4,
        bev_h=10, bev_w=10, num_query=40,
        encoder_layers=2, decoder_layers=2,
        rotate_center=(20.0, 20.0),
    ),
}
