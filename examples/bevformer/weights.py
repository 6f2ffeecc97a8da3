"""Deterministic synthetic BEVFormer weights with sane activation ranges, and checkpoint I/O.

The synthetic weights are seeded (``torch.Generator``) and independent of the global RNG.
Scales are chosen so activations stay O(1) through the backbone, the encoder and decoder:
variance-preserving linears, BatchNorm eval statistics from ``backbone.randomize_bn``, small
residual branches in the ResNet, sampling offsets of a few cells around mmcv's radial
"grid init" (so sampling locations stay mostly inside the maps), near-uniform attention
weights, reference points spread over the BEV range, box sizes around real object sizes
and a focal-style classification bias so only a handful of queries score high. Two biases
are set by one deterministic calibration forward on synthetic inputs (``_calibrate``): the
FPN lateral conv is centred on C5's per-channel means, and the class biases are centred on
the mean logits (the weights are still a pure function of (config, seed)).

Checkpoints use the official key names (``img_backbone.*``, ``img_neck.*``,
``pts_bbox_head.*``), including the BatchNorm ``num_batches_tracked`` buffers that the
official ``bevformer_tiny_epoch_24.pth`` holds.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from bevir import BevirError

from . import objectness
from .backbone import randomize_bn
from .config import BEVFormerConfig
from .model import (FFN, BEVFormer, CustomMSDeformableAttention, MSDeformableAttention3D,
                    SpatialCrossAttention, TemporalSelfAttention)

# class logit bias on top of the focal prior log(0.01/0.99): cars most frequent, like nuScenes
_CLS_PRIOR = (1.2, 0.2, -0.6, -0.2, -0.5, 0.5, -0.3, -0.3, 0.8, 0.2)


# mean of ReLU(z), z ~ N(0, 2): the hidden units behind a sqrt(2)-gain linear on unit-rms input
_RELU_MEAN_2 = math.sqrt(2.0) / math.sqrt(2.0 * math.pi)


def _relu_mean(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """E[ReLU(x)] for x ~ N(mu, sigma^2), elementwise."""
    t = mu / sigma
    pdf = torch.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + torch.erf(t / math.sqrt(2.0)))
    return mu * cdf + sigma * pdf


def _normal(shape, std, g):
    return torch.randn(*shape, generator=g) * std


def _linear(lin: nn.Linear, g, gain: float = 1.0, bias_std: float = 0.02):
    fan_in = lin.weight.shape[1]
    lin.weight.data = _normal(lin.weight.shape, gain / math.sqrt(fan_in), g)
    if lin.bias is not None:
        lin.bias.data = _normal(lin.bias.shape, bias_std, g)


def _layernorm(ln: nn.LayerNorm, g):
    ln.weight.data = 1.0 + _normal(ln.weight.shape, 0.05, g)
    ln.bias.data = _normal(ln.bias.shape, 0.02, g)


def _grid_init(num_heads: int, groups: int, num_points: int, step: float) -> torch.Tensor:
    """mmcv's radial offset init: head h points along angle 2*pi*h/heads, point i at radius
    (i+1)*step (square-normalized direction). Shape (heads, groups, points, 2)."""
    thetas = torch.arange(num_heads, dtype=torch.float32) * (2.0 * math.pi / num_heads)
    grid = torch.stack([thetas.cos(), thetas.sin()], -1)
    grid = grid / grid.abs().max(-1, keepdim=True)[0]
    grid = grid.view(num_heads, 1, 1, 2).repeat(1, groups, num_points, 1)
    for i in range(num_points):
        grid[:, :, i, :] *= (i + 1) * step
    return grid


def _deform_attn(m, g, groups: int, radius: float, weight_std: float):
    """Sampling offsets (in cells of the sampled map) ~ radial init with max radius ``radius``
    plus a query-dependent part of std ``weight_std``; near-uniform attention weights."""
    fan_in = m.sampling_offsets.weight.shape[1]
    npts = m.num_points
    m.sampling_offsets.weight.data = _normal(m.sampling_offsets.weight.shape,
                                             weight_std / math.sqrt(fan_in), g)
    grid = _grid_init(m.num_heads, groups, npts, radius / npts)
    if isinstance(m, TemporalSelfAttention):
        # layout [head][queue][level][point][xy]; groups = queue * level
        bias = grid.view(m.num_heads, m.num_bev_queue, m.num_levels, npts, 2)
    else:
        bias = grid.view(m.num_heads, m.num_levels, npts, 2)
    m.sampling_offsets.bias.data = bias.reshape(-1) + _normal(bias.reshape(-1).shape, 0.05, g)
    _linear(m.attention_weights, g, gain=0.5, bias_std=0.1)
    _linear(m.value_proj, g)
    if getattr(m, "output_proj", None) is not None:
        _linear(m.output_proj, g, gain=0.8)


def _round(x: torch.Tensor, step: float) -> torch.Tensor:
    return torch.round(x / step) * step


#: the data-dependent weights are measured on about this many pixels of synthetic scene
SCENE_PIXELS = 6 * 480 * 800


def _scene_images(cfg: BEVFormerConfig, seed: int, max_frames: int = 8) -> torch.Tensor:
    """float64 camera images of the synthetic scenes the data-dependent weights are measured
    on: frames seed + 12345, seed + 12346, ..., enough for about SCENE_PIXELS (at most
    ``max_frames``; one frame of ``tiny``), so a reduced config's statistics are not those
    of one small frame."""
    from .inputs import make_inputs
    frames = min(max_frames, max(1, SCENE_PIXELS // (cfg.num_cams * cfg.img_h * cfg.img_w)))
    return torch.cat([make_inputs(cfg, seed + 12345 + i)["img"] for i in range(frames)]).double()


def _calibrate(model: BEVFormer, seed: int, principal: bool) -> None:
    """Two data-dependent (but deterministic) fixes, on synthetic calibration inputs from
    ``inputs.make_inputs`` (seed + 12345, all cameras, with and without prev_bev):

    1. FPN lateral conv: post-ReLU C5 of a random ResNet is ~90% a per-channel constant;
       uncentred, every image key would carry nearly the same vector and the cross attention
       would see no image content. ``bias = -W @ mean(C5)`` and ``W /= rms`` make the lateral
       output zero-mean with unit rms on the scene images (:func:`_scene_images`, the
       frames the backbone was measured on). With ``principal``, its
       filters first read only C5's principal subspace (as :func:`_read_principal`), and
       then the head's linear layers their inputs' (:func:`_head_from_data`).
    2. cls branches: the decoder output keeps an input-dependent component shared by all
       queries, which would push whole classes above or below 0.5. Each branch's class bias
       is shifted so that the mean logit over queries of class c (averaged with and without
       prev_bev; with ``principal``, over the queries that are not the object queries of
       converge.py, whose class logits are then their biases) is the focal prior
       log(0.01/0.99) + _CLS_PRIOR[c]; with ~1.3 logit std across queries a handful of
       queries score > 0.5 (``plain``).

    With ``principal``, the backbone and the neck carry the objectness first
    (objectness.py), and converge.build makes the head detect the scene's objects.
    """
    from .inputs import make_inputs
    cfg = model.cfg
    inp = make_inputs(cfg, seed + 12345, with_prev_bev=True)
    was_training = model.training
    model.eval()
    images = _scene_images(cfg, seed)
    with torch.no_grad():
        if principal:
            objectness.install_backbone(model.img_backbone, images, cfg.img_mean, cfg.img_std)
        c5 = model.img_backbone(inp["img"])
        conv = model.img_neck.lateral_convs[0].conv
        # statistics from a float64 forward, rounded, so that float noise of the calibration
        # forward (thread count, BLAS) does not reach the weights
        c5d = copy.deepcopy(model.img_backbone).double()(images)
        mu = _round(c5d.mean((0, 2, 3)), 1e-4)
        w = conv.weight[:, :, 0, 0].double()
        if principal:
            w = _round_bits(w @ _principal_projector(_pixels(c5d)))
        y = torch.einsum("oc,nchw->nohw", w, c5d - mu[None, :, None, None])
        rms = float(f"{y.pow(2).mean().sqrt().clamp(min=1e-6).item():.4g}")
        w = (w / rms).float()
        conv.weight.data = w[:, :, None, None].contiguous()
        conv.bias.data = conv.bias.data - _round(w.double() @ mu, 1e-5).float()

        others = slice(None)
        if principal:
            pair = objectness.install_neck(model.img_neck,
                                           objectness.c5_offset(model.img_backbone), c5d)
            neck = copy.deepcopy(model.img_neck).double()
            neck_feats = neck(c5d[:cfg.num_cams])
            _head_from_data(model, neck_feats, inp)
            from . import converge            # it builds on this module's helpers
            converge.build(model, pair, seed)
            others = torch.ones(cfg.num_query, dtype=torch.bool)
            others[converge.slot_queries(model.pts_bbox_head)] = False
        feats = model.img_neck(c5)
        means = []
        for prev in (None, inp["prev_bev"]):
            cls, _, _ = model.pts_bbox_head(feats, inp["lidar2img"], inp["can_bus"], prev,
                                            all_layers=True)
            means.append(cls[:, others].mean(1))                     # (L, classes)
        mean = torch.stack(means).mean(0).double()
        prior = math.log(0.01 / 0.99)
        target = torch.tensor([prior + p for p in _CLS_PRIOR[:cfg.num_classes]]).double()
        for lvl, br in enumerate(model.pts_bbox_head.cls_branches):
            br[6].bias.data -= _round(mean[lvl] - target, 1e-3).float()
    model.train(was_training)


#: the synthetic weight presets. "conditioned" (the default) behaves like a trained model
#: where INT8 quality depends on it: backbone filters and the head's linear layers that read
#: their input's principal subspace, BatchNorm statistics measured on the synthetic scene
#: (every backbone channel carries information, at comparable scales), residual branches
#: that refine (last BatchNorm of each bottleneck and the decoder's residual projections
#: small), softer
#: decoder self-attention, box refinements of a trained decoder's size, and BEV queries
#: and positions that vary smoothly over the ground.
#: "plain": data-independent BatchNorm statistics and larger decoder gains (the earlier
#: preset; its tiny decoder amplifies small errors ~20x).
PRESETS = ("conditioned", "plain")


def _sig(t: torch.Tensor, digits: int = 4) -> torch.Tensor:
    """``t`` rounded to ``digits`` significant digits (float noise stays out of weights)."""
    return torch.tensor([float(f"{v:.{digits}g}") for v in t.double().tolist()],
                        dtype=torch.float32)


#: the fraction of its input's principal directions that each synthetic convolution reads
PRINCIPAL_FRACTION = 1 / 8


def _round_bits(t: torch.Tensor, bits: int = 12) -> torch.Tensor:
    """``t`` rounded to ``bits`` significant bits (float noise stays out of weights)."""
    mantissa, exponent = torch.frexp(t)
    return torch.ldexp(torch.round(mantissa * 2.0 ** bits) / 2.0 ** bits, exponent)


def _principal_projector(samples: torch.Tensor, fraction: float = PRINCIPAL_FRACTION
                         ) -> torch.Tensor:
    """The orthogonal projector onto the top ``fraction`` of the principal directions of
    ``samples`` [n, d], and no more than n/8 of them: fewer samples would tell apart
    directions of the calibration frame only, which other frames leave empty."""
    x = samples - samples.mean(0)
    var, vec = torch.linalg.eigh(x.T @ x / len(x))
    keep = max(1, min(round(fraction * x.shape[1]), len(x) // 8))
    top = vec[:, -keep:]
    return top @ top.T


def _read_principal(conv: nn.Conv2d, x: torch.Tensor) -> None:
    """Project ``conv``'s filters onto the principal subspace of its input ``x`` (NCHW): of
    the channels, or of the image patches for a convolution of few channels (the stem).

    A trained network's features have a low effective rank and its filters read that
    subspace, so the noise INT8 adds evenly in every direction is mostly filtered out. With
    isotropic random filters it passes whole, and the ReLUs (whose mean the next
    BatchNorm removes) amplify it by ~1.7 dB per layer. On ``tiny``, onnxruntime's
    per-tensor INT8 neck goes from 3.9 dB SQNR to 25.7 dB with the projection."""
    w = conv.weight.data
    o, c, kh, kw = w.shape
    if c < 8:                               # an image: its few channels say little
        cols = nn.functional.unfold(x, (kh, kw), conv.dilation, conv.padding, conv.stride)
        proj = _principal_projector(cols.transpose(1, 2).reshape(-1, c * kh * kw))
        w = (w.reshape(o, -1) @ proj).reshape(w.shape)
    else:
        w = torch.einsum("ocij,cd->odij", w, _principal_projector(_pixels(x)))
    conv.weight.data = _round_bits(w).contiguous()


#: the fraction of its input's principal directions that each linear layer of the head reads
HEAD_PRINCIPAL_FRACTION = 1 / 16


def _read_principal_rows(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] reading only the principal subspace of its input ``x`` [..., in]
    (HEAD_PRINCIPAL_FRACTION of it), scaled so that its output keeps its rms on ``x``."""
    x = x.reshape(-1, weight.shape[1])
    projected = weight @ _principal_projector(x, HEAD_PRINCIPAL_FRACTION)
    def rms(w):
        return (x @ w.T).pow(2).mean().sqrt()
    gain = rms(weight) / rms(projected).clamp(min=1e-12)
    return _round_bits(projected * float(f"{gain.item():.4g}"))


def _head_from_data(model: BEVFormer, feats: torch.Tensor, inp: dict) -> None:
    """The head's linear layers (encoder, decoder, branches, in order of execution) read the
    principal subspace of their inputs on the calibration frame, as the backbone's filters
    do (:func:`_read_principal`), each scaled to keep its output's rms; not the one that
    places the queries' reference points (it reads their positional embedding, which has
    no data, and the object queries are placed through it, converge.py).

    A trained transformer's tokens have a low effective rank and its projections read that
    subspace; with isotropic random projections, the noise INT8 adds evenly in every
    direction of each 256-wide token passes whole into the next layer, and along the six
    decoder layers it takes the class scores to ~23 dB on ``tiny``. ``feats``: the float64
    neck output of the frame ``inp`` (with prev_bev)."""
    work = copy.deepcopy(model.pts_bbox_head).double().eval()
    original = dict(model.pts_bbox_head.named_modules())
    done: set[str] = set()

    def linear(name):
        def hook(mod, args):
            if name not in done:        # a module used again (the branches) keeps its first
                done.add(name)
                mod.weight.data = _read_principal_rows(mod.weight.data, args[0])
                original[name].weight.data = mod.weight.data.float()
        return hook

    def attention(name):                # in_proj rows: q and k read query + pos, v the query
        def hook(mod, args, kwargs):
            if name not in done:
                done.add(name)
                w, c = mod.in_proj_weight.data.clone(), mod.embed_dim
                w[:2 * c] = _read_principal_rows(w[:2 * c], kwargs["query"])
                w[2 * c:] = _read_principal_rows(w[2 * c:], kwargs["value"])
                mod.in_proj_weight.data = w
                original[name].in_proj_weight.data = w.float()
        return hook
    hooks = []
    for name, m in work.named_modules():
        if isinstance(m, nn.Linear) and name != "transformer.reference_points":
            hooks.append(m.register_forward_pre_hook(linear(name)))
        elif isinstance(m, nn.MultiheadAttention):
            hooks.append(m.register_forward_pre_hook(attention(name), with_kwargs=True))
    _run_hooked(work, feats, inp, hooks)


def _run_hooked(work: nn.Module, feats: torch.Tensor, inp: dict, hooks: list) -> None:
    """Run ``work`` (a float64 copy of the head) on the calibration frame ``inp`` with the
    neck output ``feats``, for what its ``hooks`` measure and set; then remove them."""
    try:
        with torch.no_grad():
            work(feats, inp["lidar2img"].double(), inp["can_bus"].double(),
                 inp["prev_bev"].double(), all_layers=True)
    finally:
        for h in hooks:
            h.remove()


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """NCHW ``x`` as [N*H*W, C] samples of its channels."""
    return x.transpose(0, 1).reshape(x.shape[1], -1).T


def _bn_from_data(model: BEVFormer, seed: int) -> None:
    """Layer-sequential unit-variance scaling (LSUV) of the backbone on the synthetic scene
    (:func:`_scene_images`), in one forward pass: each convolution's filters are first
    projected onto its input's principal subspace (:func:`_read_principal`), then its output
    channels are scaled to unit variance on the scene and its BatchNorm's running mean
    measured there (running variance 1). Each channel then leaves its BatchNorm as N(bias,
    weight^2), and the weights folded into the convolution are as even across channels
    as a trained network's (per-tensor INT8 keeps every channel)."""
    img = _scene_images(model.cfg, seed)
    # in float64, so that no thread count's float noise reaches the rounded statistics
    work = copy.deepcopy(model.img_backbone).double().eval()
    original = dict(model.img_backbone.named_modules())
    modules = dict(work.named_modules())
    conv_of = {}
    for name, m in modules.items():
        if isinstance(m, nn.BatchNorm2d):
            prefix, last = name.rpartition(".")[0], name.rpartition(".")[2]
            conv = (f"{prefix}.0" if last == "1" and prefix.endswith("downsample")
                    else f"{prefix + '.' if prefix else ''}conv{last[2:]}")
            conv_of[m] = (modules[conv], original[conv], original[name])

    def measure(bn, args):
        x = args[0]
        std = _sig(x.std((0, 2, 3)).clamp(min=1e-6)).double()
        conv, conv_out, bn_out = conv_of[bn]
        conv.weight.data /= std[:, None, None, None]
        conv_out.weight.data = conv.weight.data.float()
        x = x / std[None, :, None, None]
        bn_out.running_mean.data = _sig(x.mean((0, 2, 3)))
        bn_out.running_var.data = torch.ones_like(bn_out.running_var)
        bn.running_mean.data = bn_out.running_mean.data.double()
        bn.running_var.data = bn_out.running_var.data.double()
        return (x,)
    hooks = [m.register_forward_pre_hook(measure) for m in conv_of]
    hooks += [conv.register_forward_pre_hook(lambda conv, args: _read_principal(conv, args[0]))
              for conv, _, _ in conv_of.values()]
    try:
        with torch.no_grad():
            work(img)
    finally:
        for h in hooks:
            h.remove()


#: the distance (m, a Gaussian's sigma) over which the conditioned preset's BEV queries and
#: positional embeddings change: trained ones encode the ground, which is smooth on the
#: scale of a 2 m cell of ``tiny``, and deformable sampling between cells then interpolates
#: (with white-noise queries, rounding a reference point to 1/128 of the range costs ~19 dB)
BEV_SMOOTHNESS_M = 3.0


def _smooth(field: torch.Tensor, sigma: float, dim: int) -> torch.Tensor:
    """``field`` blurred along ``dim`` by a Gaussian of ``sigma`` (in samples; the borders
    replicated), its deviations from their mean then scaled back to their former spread."""
    radius = math.ceil(3 * sigma)
    if radius == 0:
        return field
    taps = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float64) / sigma) ** 2)
    x = field.double().movedim(dim, -1)
    rows = x.reshape(-1, 1, x.shape[-1])
    rows = nn.functional.pad(rows, (radius, radius), mode="replicate")
    blurred = nn.functional.conv1d(rows, (taps / taps.sum()).view(1, 1, -1)).view(x.shape)
    mean = x.mean()
    blurred = mean + (blurred - mean) * ((x - mean).std() / (blurred - mean).std())
    return blurred.movedim(-1, dim).to(field.dtype).contiguous()


def init_synthetic(model: BEVFormer, seed: int = 0, preset: str = "conditioned") -> BEVFormer:
    """Fill every parameter and buffer of ``model`` (may hold uninitialized memory) with the
    synthetic weights of ``preset`` (see PRESETS)."""
    if preset not in PRESETS:
        raise CheckpointError(f"unknown weight preset {preset!r}: one of {', '.join(PRESETS)}")
    conditioned = preset == "conditioned"
    cfg: BEVFormerConfig = model.cfg
    g = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def mark(*ts):
        for t in ts:
            done.add(id(t))

    # ---- backbone: He-normal convs, small last conv of each residual branch ----
    for name, m in model.img_backbone.named_modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.weight[0].numel()
            gain = math.sqrt(2.0)
            if name.endswith("conv3"):
                gain *= 0.4
            m.weight.data = _normal(m.weight.shape, gain / math.sqrt(fan_in), g)
            mark(m.weight)
    randomize_bn(model.img_backbone, g)
    if conditioned:       # residual branches refine: the last BatchNorm of each block small
        for name, m in model.img_backbone.named_modules():
            if name.endswith("bn3"):
                m.weight.data *= 0.4
    for m in model.img_backbone.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.num_batches_tracked.data = torch.zeros((), dtype=torch.long)
            mark(m.weight, m.bias, m.running_mean, m.running_var, m.num_batches_tracked)
    # ---- neck ----
    for m in model.img_neck.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.weight[0].numel()
            m.weight.data = _normal(m.weight.shape, 1.0 / math.sqrt(fan_in), g)
            m.bias.data = _normal(m.bias.shape, 0.02, g)
            mark(m.weight, m.bias)

    head = model.pts_bbox_head
    tr = head.transformer
    c = cfg.embed_dims
    # ---- embeddings ----
    head.bev_embedding.weight.data = _normal(head.bev_embedding.weight.shape, 1.0, g)
    head.query_embedding.weight.data = _normal(head.query_embedding.weight.shape, 1.0, g)
    pe = head.positional_encoding
    pe.row_embed.weight.data = torch.rand(pe.row_embed.weight.shape, generator=g)
    pe.col_embed.weight.data = torch.rand(pe.col_embed.weight.shape, generator=g)
    if conditioned:       # trained BEV queries and positions vary smoothly over the ground
        sigma_y, sigma_x = (BEV_SMOOTHNESS_M / cell for cell in cfg.grid_length)
        bev = head.bev_embedding.weight.data.view(cfg.bev_h, cfg.bev_w, c)
        bev[...] = _smooth(_smooth(bev, sigma_y, 0), sigma_x, 1)
        pe.row_embed.weight.data = _smooth(pe.row_embed.weight.data, sigma_y, 0)
        pe.col_embed.weight.data = _smooth(pe.col_embed.weight.data, sigma_x, 0)
    head.code_weights.data = torch.tensor(cfg.code_weights, dtype=torch.float32)
    # small camera / level embeddings: they are shared by all keys of a camera, so large ones
    # would swamp the image content in the values
    tr.level_embeds.data = _normal(tr.level_embeds.shape, 0.2, g)
    tr.cams_embeds.data = _normal(tr.cams_embeds.shape, 0.2, g)
    mark(head.bev_embedding.weight, head.query_embedding.weight, pe.row_embed.weight,
         pe.col_embed.weight, head.code_weights, tr.level_embeds, tr.cams_embeds)
    # reference points: logits ~ N(0, 1.3^2) -> spread over the BEV range
    _linear(tr.reference_points, g, gain=1.3, bias_std=0.1)
    tr.reference_points.weight.data[2] *= 0.3      # z: stay near the middle of [-5, 3]
    mark(tr.reference_points.weight, tr.reference_points.bias)
    # can-bus MLP: inputs are O(1..10) (accel ~9.8 m/s^2), so damp the first layer
    _linear(tr.can_bus_mlp[0], g, gain=0.3)
    _linear(tr.can_bus_mlp[2], g, gain=math.sqrt(2.0))
    _layernorm(tr.can_bus_mlp.norm, g)
    tr.can_bus_mlp.norm.weight.data *= 0.25     # the can-bus vector is added to every BEV query
    for m in (tr.can_bus_mlp[0], tr.can_bus_mlp[2], tr.can_bus_mlp.norm):
        mark(m.weight, m.bias)

    # ---- encoder / decoder ----
    decoder = set(map(id, tr.decoder.modules()))
    qk_gain = 1.0 if conditioned else 2.0            # decoder self-attention sharpness
    residual = 0.5 if conditioned else 1.0            # decoder residual projections
    for mod in list(tr.encoder.modules()) + list(tr.decoder.modules()):
        if isinstance(mod, TemporalSelfAttention):
            _deform_attn(mod, g, mod.num_bev_queue * mod.num_levels, radius=2.0, weight_std=0.5)
        elif isinstance(mod, MSDeformableAttention3D):
            fh, fw = mod.spatial_shapes[0]
            # 8 points = 2 per Z anchor; radius in feature pixels, smaller on tiny maps
            _deform_attn(mod, g, mod.num_levels, radius=min(2.0, 0.5 * min(fh, fw)),
                         weight_std=0.25)
        elif isinstance(mod, CustomMSDeformableAttention):
            _deform_attn(mod, g, mod.num_levels, radius=2.0, weight_std=0.5)
            mod.output_proj.weight.data *= residual
        elif isinstance(mod, SpatialCrossAttention):
            _linear(mod.output_proj, g, gain=0.8)
            mark(mod.output_proj.weight, mod.output_proj.bias)
            continue
        elif isinstance(mod, nn.MultiheadAttention):
            # q, k with gain 2: attention logits std ~4, so each query attends to a few others
            # instead of averaging all of them into one shared vector
            mod.in_proj_weight.data = _normal(mod.in_proj_weight.shape, 1.0 / math.sqrt(c), g)
            mod.in_proj_weight.data[: 2 * c] *= qk_gain
            mod.in_proj_bias.data = _normal(mod.in_proj_bias.shape, 0.02, g)
            _linear(mod.out_proj, g, gain=0.7 * residual)
            mark(mod.in_proj_weight, mod.in_proj_bias, mod.out_proj.weight, mod.out_proj.bias)
            continue
        elif isinstance(mod, nn.LayerNorm):
            _layernorm(mod, g)
        else:
            continue
        mark(*mod.parameters())
    for mod in list(tr.encoder.modules()) + list(tr.decoder.modules()):
        if isinstance(mod, FFN):
            _linear(mod.layers[0][0], g, gain=math.sqrt(2.0))
            _linear(mod.layers[1], g, gain=0.7 * (residual if id(mod) in decoder else 1.0))
            # centre the output: ReLU(N(0, 2)) has mean 2/sqrt(2*pi) ~ 0.56 for unit-rms inputs
            # (post-norm), which W2 would otherwise turn into one vector shared by all tokens
            mod.layers[1].bias.data -= mod.layers[1].weight.data.sum(1) * _RELU_MEAN_2
            mark(*mod.parameters())

    # ---- branches ----
    prior = math.log(0.01 / 0.99)
    for br in head.cls_branches:
        _linear(br[0], g, gain=math.sqrt(2.0))
        _layernorm(br[1], g)
        _linear(br[3], g, gain=math.sqrt(2.0))
        _layernorm(br[4], g)
        # input = ReLU(LN(.)) with E[x^2] ~ 0.5 -> logit std ~ 2.2 (~1.3 across queries)
        # around the prior: a handful of the num_query x 10 scores end up above 0.5
        br[6].weight.data = _normal(br[6].weight.shape, 2.2 / math.sqrt(0.5 * c), g)
        br[6].bias.data = torch.tensor([prior + p for p in _CLS_PRIOR[:cfg.num_classes]],
                                       dtype=torch.float32)
        # centre: E[ReLU(N(beta, gamma^2))] per input, so the prior sets the typical logit
        br[6].bias.data -= br[6].weight.data @ _relu_mean(br[4].bias.data, br[4].weight.data.abs())
        mark(*br.parameters())
    # box code [dx, dy, log w, log l, dz, log h, sin, cos, vx, vy]: per-output scales; the
    # position deltas refine the reference points layer by layer (a trained decoder's are
    # small, or the refinement loop amplifies any error; the conditioned preset's object
    # queries keep to their slots, converge.py), and the conditioned preset's headings and
    # velocities are those of a trained head on a still scene along a road (sin and cos of
    # one angle near 0, a few tenths of a m/s), so that they alone do not set the per-tensor
    # INT8 grid of the box code
    move, turn, speed, cos = (0.05, 0.1, 0.3, 1.0) if conditioned else (1.0, 1.0, 1.0, 0.3)
    out_std = torch.tensor([0.3 * move, 0.3 * move, 0.25, 0.25, 0.3 * move, 0.15, turn, turn,
                            speed, speed])
    out_bias = torch.tensor([0.0, 0.0, math.log(1.9), math.log(4.4), 0.0, math.log(1.6),
                             0.0, cos, 0.0, 0.0])
    for br in head.reg_branches:
        _linear(br[0], g, gain=math.sqrt(2.0))
        _linear(br[2], g, gain=math.sqrt(2.0))
        br[2].bias.data -= br[2].weight.data.sum(1) * _RELU_MEAN_2
        # input = ReLU(.) of ~unit pre-activations: E[x^2] ~ 1 -> output std ~ out_std
        br[4].weight.data = _normal(br[4].weight.shape, 1.0, g) * (out_std[:, None] / math.sqrt(c))
        br[4].bias.data = out_bias - br[4].weight.data.sum(1) * _RELU_MEAN_2
        mark(*br.parameters())

    if conditioned:
        _bn_from_data(model, seed)
    _calibrate(model, seed, principal=conditioned)
    missing = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if id(t) not in done]
    assert not missing, f"synthetic init missed {missing[:5]}"
    return model


def build_model(config: BEVFormerConfig, seed: int | None = 0, checkpoint: str | Path | None = None,
                preset: str = "conditioned") -> BEVFormer:
    """BEVFormer in eval mode with synthetic weights (seed, ``preset``) or a checkpoint file."""
    with torch.device("meta"):
        model = BEVFormer(config)
    model = model.to_empty(device="cpu")
    if checkpoint is not None:
        sd = load_checkpoint(checkpoint)
        check_checkpoint(model, sd, checkpoint, config)
        model.load_state_dict(sd, strict=True)
    else:
        init_synthetic(model, 0 if seed is None else seed, preset)
    return model.eval()


class CheckpointError(BevirError):
    """A checkpoint cannot be read, or does not fit the model of the chosen config."""


def check_checkpoint(model: BEVFormer, sd: dict[str, torch.Tensor], path: str | Path,
                     config: BEVFormerConfig) -> None:
    """Raise one CheckpointError naming the missing, unexpected and misshapen keys."""
    want = model.state_dict()
    problems = []
    for what, keys in (("missing", [k for k in want if k not in sd]),
                       ("unexpected", [k for k in sd if k not in want]),
                       ("shape mismatch",
                        [f"{k} {tuple(sd[k].shape)} vs {tuple(want[k].shape)}"
                         for k in want if k in sd and sd[k].shape != want[k].shape])):
        if keys:
            problems.append(f"{len(keys)} {what} (first: {keys[0]})")
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit config '{config.name}': "
                              + "; ".join(problems))


def make_checkpoint(config: BEVFormerConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Synthetic state_dict with the official key names (incl. num_batches_tracked)."""
    model = build_model(config, seed)
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def save_checkpoint(path: str | Path, state_dict: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> None:
    """Write a state_dict as .safetensors (or, for a .pth/.pt path,
    torch.save({'state_dict': sd}))."""
    path = Path(path)
    sd = {k: v.detach().contiguous().clone() for k, v in state_dict.items()}
    if path.suffix == ".safetensors":
        from bevir.fsutil import save_arrays
        save_arrays({k: v.numpy() for k, v in sd.items()}, path, metadata)
    else:
        torch.save({"state_dict": sd, "meta": dict(metadata or {})}, str(path))


def _fix_num_batches_tracked(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add missing BatchNorm ``num_batches_tracked`` (some exports drop them) as int64 zeros,
    and make present ones int64 scalars; everything else float32."""
    out = {}
    for k, v in sd.items():
        if k.endswith("num_batches_tracked"):
            out[k] = v.reshape(()).to(torch.long)
        else:
            out[k] = v.to(torch.float32) if v.is_floating_point() else v
    for k in sd:
        if k.endswith(".running_mean"):
            nbt = k[: -len("running_mean")] + "num_batches_tracked"
            out.setdefault(nbt, torch.zeros((), dtype=torch.long))
    return out


def load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Read ``.safetensors``, or an official-style ``.pth`` (``torch.load(weights_only=True)``,
    taking its ``state_dict`` entry if present; a ``module.`` prefix is stripped). The result
    loads with ``model.load_state_dict(sd, strict=True)``."""
    import pickle
    from safetensors import SafetensorError
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            sd = load_file(str(path), device="cpu")
        else:   # weights_only: the unpickler builds tensors and containers, calls nothing else
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
            sd = obj["state_dict"] if isinstance(obj, dict) and "state_dict" in obj else obj
    except (pickle.UnpicklingError, SafetensorError, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot load checkpoint {path}: {first}") from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"checkpoint {path} is not a state_dict of tensors")
    if all(k.startswith("module.") for k in sd):          # saved from a DataParallel wrapper
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return _fix_num_batches_tracked(dict(sd))
