"""The models users bring from timm and Hugging Face transformers, with random weights and
small configs built from the libraries' own classes and config objects (nothing is
downloaded: ``HF_HUB_OFFLINE`` is set before transformers is imported).

Each entry is the library's real architecture (its modules, its attention implementation,
its exporter-facing code paths) at reduced widths and depths, so that the exporters and
``torch.export`` see what they see on the published models::

    from bevir.testing.hub_zoo import MODELS, build

    model, inputs = build("timm/convnext_atto")
    graph = bevir.from_torch(model, list(inputs))

``build`` returns the model in eval mode, wrapped so that it returns one tensor (the last
hidden state, the logits), and its example inputs (an image, token ids or audio features).
timm and transformers are the ``test`` extra's; :func:`available` says whether they import.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from ..extras import require

torch = require("torch")
nn = torch.nn

__all__ = ["CNNS", "MODELS", "Entry", "available", "build"]


def _import_torchvision() -> None:
    """Import torchvision (timm needs it) where its compiled ops cannot load: a torchvision
    wheel built against another torch variant (CUDA) fails in its own import, registering
    a fake kernel for ``torchvision::nms`` that its missing library would have defined.
    Declaring the two schemas it registers fakes for lets its Python parts import (timm
    uses its pure-Python layers only); calling nms then fails, as it would anyway."""
    try:
        require("torchvision")
    except RuntimeError:
        for name in [k for k in sys.modules if k.startswith("torchvision")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _import_torchvision.lib = lib          # the definitions live as long as the library
        require("torchvision")


def available() -> str | None:
    """None when timm and transformers import, else why not."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        _import_torchvision()
        require("timm")
        require("transformers")
    except Exception as e:   # noqa: BLE001  (missing, or a broken install)
        return f"{type(e).__name__}: {e}"
    return None


class FirstOutput(nn.Module):
    """A model returning its first output (a tuple's first element, or the output itself),
    called with ``kwargs`` (e.g. ``return_dict=False``)."""

    def __init__(self, model: nn.Module, **kwargs):
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, *inputs):
        out = self.model(*inputs, **self.kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


@dataclass(frozen=True)
class Entry:
    """A zoo model: its family, the input it takes and how it is built."""

    family: str
    inputs: str                     # "image", "tokens" or "audio"
    make: Callable[[], nn.Module]


def _image(size: int = 64) -> Callable[[torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda gen: (torch.randn(1, 3, size, size, generator=gen),)


INPUTS: dict[str, Callable[[torch.Generator], tuple[torch.Tensor, ...]]] = {
    "image": _image(64),
    "tokens": lambda gen: (torch.randint(0, 100, (1, 16), generator=gen),),
    "audio": lambda gen: (torch.randn(1, 16, 32, generator=gen),),
    "waveform": lambda gen: (torch.randn(1, 800, generator=gen),),
}


# ---- timm ------------------------------------------------------------------------------------

def _timm(name: str, **kwargs) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        timm = require("timm")
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    return make


def _timm_class(module: str, cls: str, **kwargs) -> Callable[[], nn.Module]:
    """A timm model class built with its arguments (for the variants whose registered
    builders fix the widths a small config changes)."""
    def make() -> nn.Module:
        return getattr(require(f"timm.models.{module}"), cls)(
            num_classes=10, **kwargs)
    return make


def _byobnet(variant: str, widths: tuple[int, ...], depths: tuple[int, ...]
             ) -> Callable[[], nn.Module]:
    """A timm ByobNet (RepVGG, MobileOne) of ``variant``'s blocks at other widths/depths."""
    def make() -> nn.Module:
        from dataclasses import replace
        byobnet = require("timm.models.byobnet")
        ByobNet, cfg = byobnet.ByobNet, byobnet.model_cfgs[variant]

        def stage(b, w: int, d: int, before: int):
            if not isinstance(b, (list, tuple)):
                return replace(b, c=w, d=d)
            # MobileOne: pairs of a depthwise block (keeping its input's width) and a 1x1 one
            return [replace(b[0], c=before), replace(b[1], c=w)]
        blocks = tuple(stage(b, w, d, before) for b, w, d, before in
                       zip(cfg.blocks, widths, depths, (widths[0], *widths)))
        return ByobNet(replace(cfg, blocks=blocks, stem_chs=widths[0]), num_classes=10)
    return make


def _metaformer_pool() -> nn.Module:
    mf = require("timm.models.metaformer")
    return mf.MetaFormer(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), token_mixers=mf.Pooling,
                         norm_layers=mf.GroupNorm1, use_mlp_head=False, num_classes=10)


# ---- transformers ----------------------------------------------------------------------------

_TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def _hf(model: str, config: str, get: str | None = None, **cfg) -> Callable[[], nn.Module]:
    """transformers' ``model`` class on ``config(**cfg)`` (random weights), its first output
    (``get``: the sub-module taken, e.g. ``get_encoder``)."""
    def make() -> nn.Module:
        transformers = require("transformers")
        m = getattr(transformers, model)(getattr(transformers, config)(**cfg))
        if get:
            m = getattr(m, get)()
        return FirstOutput(m.eval(), return_dict=False)
    return make


def _detr() -> nn.Module:
    T = require("transformers")
    backbone = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64],
                              depths=[1, 1, 1, 1], out_features=["stage4"])
    cfg = T.DetrConfig(use_timm_backbone=False, backbone_config=backbone, d_model=32,
                       encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                       num_queries=10, num_labels=5, use_pretrained_backbone=False)
    return FirstOutput(T.DetrForObjectDetection(cfg).eval(), return_dict=False)


#: name -> entry; the name says where the architecture comes from
MODELS: dict[str, Entry] = {
    # timm CNNs
    "timm/resnet26d": Entry("ResNet-D", "image", _timm(
        "resnet26d", layers=(1, 1, 1, 1), channels=(16, 32, 48, 64), stem_width=16)),
    "timm/tinynet_e": Entry("EfficientNet", "image", _timm("tinynet_e")),
    "timm/mobilenetv3_small_050": Entry("MobileNetV3", "image", _timm("mobilenetv3_small_050")),
    "timm/regnety_002": Entry("RegNet", "image", _timm("regnety_002")),
    "timm/ghostnet_050": Entry("GhostNet", "image", _timm("ghostnet_050")),
    "timm/repvgg_a0": Entry("RepVGG", "image", _byobnet("repvgg_a0", (16, 32, 48, 64),
                                                        (1, 1, 1, 1))),
    "timm/mobileone_s0": Entry("MobileOne", "image", _byobnet("mobileone_s0", (16, 32, 48, 64),
                                                              (1, 1, 1, 1))),
    "timm/convnext_atto": Entry("ConvNeXt", "image", _timm(
        "convnext_atto", depths=(1, 1, 1, 1), dims=(16, 32, 48, 64))),
    "timm/lcnet_050": Entry("PP-LCNet", "image", _timm("lcnet_050")),
    "timm/densenet": Entry("DenseNet", "image", _timm_class(
        "densenet", "DenseNet", growth_rate=8, block_config=(2, 2, 2, 2))),
    # timm hybrids and transformers
    "timm/fastvit_t8": Entry("FastViT", "image", _timm(
        "fastvit_t8", layers=(1, 1, 1, 1), embed_dims=(48, 96, 192, 384))),
    "timm/vit_tiny": Entry("ViT", "image", _timm(
        "vit_tiny_patch16_224", img_size=64, depth=2, embed_dim=64, num_heads=2)),
    "timm/deit_tiny_distilled": Entry("DeiT", "image", _timm(
        "deit_tiny_distilled_patch16_224", img_size=64, depth=2, embed_dim=64, num_heads=2)),
    "timm/swin_tiny": Entry("Swin", "image", _timm(
        "swin_tiny_patch4_window7_224", img_size=64, window_size=4, depths=(1, 1, 1),
        embed_dim=16, num_heads=(1, 2, 4))),
    "timm/levit_128s": Entry("LeViT", "image", _timm(
        "levit_128s", img_size=64, embed_dim=(32, 48, 64), num_heads=(2, 3, 4),
        depth=(1, 1, 1))),
    "timm/mobilevit_xxs": Entry("MobileViT", "image", _timm("mobilevit_xxs")),
    "timm/edgenext_xx_small": Entry("EdgeNeXt", "image", _timm(
        "edgenext_xx_small", depths=(1, 1, 1, 1))),
    "timm/poolformer": Entry("PoolFormer", "image", _metaformer_pool),
    "timm/mixer": Entry("MLP-Mixer", "image", _timm_class(
        "mlp_mixer", "MlpMixer", img_size=64, patch_size=16, num_blocks=2, embed_dim=64)),
    "timm/efficientformerv2_s0": Entry("EfficientFormerV2", "image", _timm(
        "efficientformerv2_s0", img_size=64)),
    # transformers: text and audio encoders
    "hf/bert": Entry("BERT", "tokens", _hf("BertModel", "BertConfig", vocab_size=100,
                                            max_position_embeddings=32, **_TEXT)),
    "hf/distilbert": Entry("DistilBERT", "tokens", _hf(
        "DistilBertModel", "DistilBertConfig", vocab_size=100, dim=32, n_layers=2, n_heads=2,
        hidden_dim=64, max_position_embeddings=32)),
    "hf/roberta": Entry("RoBERTa", "tokens", _hf("RobertaModel", "RobertaConfig", vocab_size=100,
                                                  max_position_embeddings=40, **_TEXT)),
    "hf/albert": Entry("ALBERT", "tokens", _hf("AlbertModel", "AlbertConfig", vocab_size=100,
                                                embedding_size=16, max_position_embeddings=32,
                                                **_TEXT)),
    "hf/gpt2": Entry("GPT-2", "tokens", _hf("GPT2Model", "GPT2Config", vocab_size=100,
                                             n_embd=32, n_layer=2, n_head=2, n_positions=32,
                                             bos_token_id=0, eos_token_id=0)),
    "hf/t5_encoder": Entry("T5", "tokens", _hf("T5EncoderModel", "T5Config", vocab_size=100,
                                                d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                                num_heads=2)),
    "hf/whisper_encoder": Entry("Whisper", "audio", _hf(
        "WhisperModel", "WhisperConfig", get="get_encoder", d_model=32, encoder_layers=2,
        encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=16,
        max_source_positions=16, decoder_layers=1, decoder_attention_heads=2,
        decoder_ffn_dim=64)),
    # transformers: vision
    "hf/vit": Entry("ViT", "image", _hf("ViTModel", "ViTConfig", image_size=64, patch_size=16,
                                        **_TEXT)),
    "hf/deit": Entry("DeiT", "image", _hf("DeiTModel", "DeiTConfig", image_size=64,
                                          patch_size=16, **_TEXT)),
    "hf/beit": Entry("BEiT", "image", _hf("BeitModel", "BeitConfig", image_size=64,
                                          patch_size=16, use_relative_position_bias=True,
                                          **_TEXT)),
    "hf/swin": Entry("Swin", "image", _hf("SwinModel", "SwinConfig", image_size=64,
                                          patch_size=4, embed_dim=16, depths=[1, 1, 1],
                                          num_heads=[1, 2, 4], window_size=4)),
    "hf/convnext": Entry("ConvNeXt", "image", _hf("ConvNextModel", "ConvNextConfig",
                                                  hidden_sizes=[8, 16, 24, 32],
                                                  depths=[1, 1, 1, 1])),
    "hf/mobilevit": Entry("MobileViT", "image", _hf(
        "MobileViTModel", "MobileViTConfig", image_size=64, hidden_sizes=[32, 48, 64],
        neck_hidden_sizes=[8, 16, 24, 24, 32, 40, 64])),
    "hf/segformer": Entry("SegFormer", "image", _hf(
        "SegformerForSemanticSegmentation", "SegformerConfig", hidden_sizes=[8, 16, 24, 32],
        depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 1, 1], decoder_hidden_size=32,
        num_labels=4)),
    "hf/detr": Entry("DETR", "image", _detr),
}


#: the timm CNNs (convolutions, norms and activations only): what bench/bench_zoo.py times
CNNS: tuple[str, ...] = ("timm/resnet26d", "timm/tinynet_e", "timm/mobilenetv3_small_050",
                         "timm/regnety_002", "timm/ghostnet_050", "timm/repvgg_a0",
                         "timm/mobileone_s0", "timm/convnext_atto", "timm/lcnet_050",
                         "timm/densenet")


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``name`` (a key of :data:`MODELS`) in eval mode with random weights (a
    pure function of ``seed``), and its example inputs."""
    if name not in MODELS:
        raise KeyError(f"unknown hub zoo model {name!r}; known: {', '.join(MODELS)}")
    why = available()
    if why is not None:
        raise ImportError(f"the hub zoo needs timm and transformers: {why}")
    entry = MODELS[name]
    torch.manual_seed(seed)
    model = entry.make().eval()
    gen = torch.Generator().manual_seed(seed)
    _randomize_norms(model, gen)
    return model, INPUTS[entry.inputs](gen)


def _randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """Untrained BatchNorm is an identity; give it statistics like a trained one's. Weights
    a library initializes to zero (a classifier head, a last projection) or to a tiny layer
    scale (1e-6) would hide the layers they gate: they get values like trained ones'."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) / p[0].numel() ** 0.5)
            elif p.ndim == 1 and 0 < float(p.abs().max()) < 1e-3:
                p.copy_(torch.rand(p.shape, generator=gen) * 0.5 + 0.5)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            if m.affine:
                m.weight.data.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
                m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)
