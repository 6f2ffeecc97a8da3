"""Where the cameras show objects, carried from the pixels to the neck's output by a few
channels of the synthetic backbone, as a trained backbone carries what it learned objects
look like.

- The synthetic scenes' objects are warm-coloured (red minus blue above WARM) or dark
  (darkness above DARK), with a dark strip at their foot; nothing in the background is
  either (inputs.py).
- Stem: two channels of ``conv1`` sum the darkness and the warmth of 2x2 pixels (at its
  stride of 2), less their levels; ReLU keeps what lies above (max-pooled after).
- Each bottleneck with a projection shortcut carries the objectness through its residual
  path: ``conv1`` sums the stage's input copies into BOTTLENECK_COPIES equal channels,
  ``conv2`` sums each over 3x3 (at the block's stride), ``conv3`` sums them into COPIES
  equal output channels (the stage's last), whose shortcut stays 0. The
  other bottlenecks' residual paths write 0 into them, and their shortcuts pass them on.
  Every BatchNorm on the path is an identity.
- ``layer4``'s first block saturates it: SATURATION_COPIES of its middle channels keep
  the 3x3 sum ``s``, as many take ``relu(s - full)`` (``full`` the SATURATION quantile:
  a near object counts no more than a far one), and ``conv3`` writes their difference,
  ``min(s, full)``, into C5_COPIES channels (the SATURATION_COPIES are its gain). The
  neck's lateral convolution writes it into 1/16 of its channels, which its 3x3
  convolution sums over 3x3 into a pair of channels, ``a`` and ``b`` (``b`` from as many
  channels of 0): the objectness is the neck output along ``(e_a - e_b)/sqrt(2)`` (a
  pair, so that a per-camera or per-level embedding added to both cancels).

No weight of the path is larger than WEIGHT_SHARE of the largest other weight of its layer
(BatchNorm folded in), and no stage's channels larger than PEAK_SHARE of the others, so that
neither sets the per-tensor INT8 grid of a layer's weights or outputs; the copies make up
the gain that small weights give away. The other filters still read the designated channels
with their random weights.

Where the objectness is saturated, it must stay many INT8 steps high through the stages
after: a saturated level a few steps high (as a quantile of C5 itself was) leaves a far
object's objectness to the rounding, which then loses it in INT8. So the saturation is
done in layer4's middle channels, where the objectness is still strong, and the copies of
the saturating channels and of C5's are offset by a dither spread over one INT8 step of
their tensor (measured on the scene images): equal copies would all round alike, offset
ones round in as many ways, and their sum keeps the value to a fraction of a step. The
neck takes the offsets back.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .backbone import FPN, ResNet50

#: the levels a pixel's darkness (the mean of its normalized, negated R, G, B) and its warmth
#: (red minus blue, 0-255) must pass to count as an object's
DARK, WARM = 1.2, 80.0
#: the channels that carry the objectness out of each stage (out of C5: twice C5_COPIES), and
#: through each bottleneck
COPIES, C5_COPIES, BOTTLENECK_COPIES = 16, 64, 8
#: the middle channels of layer4's first block that keep the objectness, and as many that
#: take its excess over the saturation level: their sum is C5's gain on the saturated
#: objectness, which the weights' cap would otherwise keep a few INT8 steps high
SATURATION_COPIES = 64
#: a path weight's size, as a fraction of the largest other weight of its layer; its
#: channels' 99.9th percentile, as a fraction of the other channels' (at most)
WEIGHT_SHARE, PEAK_SHARE = 0.9, 0.5
#: the objectness at which a C5 cell counts as full: this quantile of C5's positive values
#: on the scene images (where a far pedestrian's cell lies; a near car's is ten times more)
SATURATION = 0.75
#: the positive levels of an INT8 activation grid (symmetric, per tensor)
INT8_LEVELS = 127


def _cap(weight: torch.Tensor, bn: nn.BatchNorm2d | None, rows: list[int]) -> float:
    """WEIGHT_SHARE of the largest |weight| (BatchNorm folded in) outside ``rows``."""
    w = weight if bn is None else weight * (bn.weight / (bn.running_var + bn.eps).sqrt()
                                            ).view(-1, *[1] * (weight.dim() - 1))
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[rows] = False
    return float(f"{WEIGHT_SHARE * w[keep].abs().max().item():.4g}")


def _identity_bn(bn: nn.BatchNorm2d, channels: list[int], mean: float = 0.0) -> None:
    """BatchNorm ``channels`` pass their input less ``mean``."""
    bn.running_mean[channels], bn.running_var[channels] = mean, 1.0 - bn.eps
    bn.weight[channels], bn.bias[channels] = 1.0, 0.0


def _last(n: int, count: int) -> list[int]:
    return list(range(n - count, n))


def _stem(backbone: ResNet50, mean: tuple, std: tuple) -> list[int]:
    """conv1's last two channels: darkness and warmth of 2x2 pixels above their levels."""
    conv, bn = backbone.conv1, backbone.bn1
    dark, warm = _last(conv.out_channels, 2)
    cap = _cap(conv.weight, bn, [dark, warm])
    taps = (slice(3, 5), slice(3, 5))                 # the 2x2 block at each output's pixel
    conv.weight[[dark, warm]] = 0
    conv.weight[(dark, slice(None)) + taps] = -cap    # 3 * cap * the 4 pixels' darkness
    _identity_bn(bn, [dark], 4 * 3 * cap * DARK)
    conv.weight[(warm, 0) + taps] = cap               # cap / std_r * the 4 pixels' r - b
    conv.weight[(warm, 2) + taps] = -cap * std[2] / std[0]
    _identity_bn(bn, [warm], 4 * cap * (WARM - (mean[0] - mean[2])) / std[0])
    return [dark, warm]


def _carry(block, inputs: list[int], outputs: int, mids: int = BOTTLENECK_COPIES) -> list[int]:
    """A bottleneck with a projection shortcut: its residual path writes the 3x3 sum of the
    sum of ``inputs`` into its last ``outputs`` channels (through its last ``mids`` middle
    channels); their shortcut is 0. Returns them."""
    middle = _last(block.conv1.out_channels, mids)
    outs = _last(block.conv3.out_channels, outputs)
    for conv, bn, rows, reads, taps in ((block.conv1, block.bn1, middle, inputs, None),
                                        (block.conv2, block.bn2, middle, None, 9),
                                        (block.conv3, block.bn3, outs, middle, None)):
        cap = _cap(conv.weight, bn, rows)
        conv.weight[rows] = 0
        if taps:                                      # each channel its own 3x3 sum
            for m in rows:
                conv.weight[m, m] = cap
        else:
            conv.weight[[[r] for r in rows], reads] = cap
        _identity_bn(bn, rows)
    block.downsample[0].weight[outs] = 0
    _identity_bn(block.downsample[1], outs)
    return outs


def _saturate(block, x: torch.Tensor, outs: list[int]) -> None:
    """``layer4``'s first block (built by _carry with 2 * SATURATION_COPIES middle channels):
    the first half of its middle channels keep the 3x3 sum ``s``, the second half take
    ``relu(s - full)`` (``full`` the SATURATION quantile of ``s`` on the block's input ``x``),
    each pair offset by the dither of the middle tensor's INT8 grid; ``conv3`` writes their
    difference, ``min(s, full)``, into ``outs``."""
    middle = _last(block.conv1.out_channels, 2 * SATURATION_COPIES)
    keep, less = middle[:SATURATION_COPIES], middle[SATURATION_COPIES:]
    cap = float(block.conv3.weight[outs[0], keep[0]])
    block.conv3.weight[[[r] for r in outs], less] = -cap
    mid = block.relu(block.bn2(block.conv2(block.relu(block.bn1(block.conv1(x))))))
    s = mid[:, keep[0]]
    full = _quantile(s[s > 0], SATURATION)
    dither = _dither(SATURATION_COPIES, _quantile(mid.abs(), 1.0) / INT8_LEVELS)
    block.bn2.running_mean[keep] = -dither
    block.bn2.running_mean[less] = full - dither
    block.bn3.running_mean[outs] = float(f"{cap * dither.sum().item():.6g}")


def _bound(block, out: torch.Tensor, chans: list[int]) -> None:
    """Scale ``block``'s path down where its output ``out`` (on the scene images) would go
    beyond PEAK_SHARE of the other channels' 99.9th percentile: the output's per-tensor INT8
    grid stays the other channels'."""
    keep = torch.ones(out.shape[1], dtype=torch.bool)
    keep[chans] = False
    limit = PEAK_SHARE * _quantile(out[:, keep], 0.999)
    peak = _quantile(out[:, chans[0]], 0.999)
    if peak > limit:
        f = float(f"{limit / peak:.4g}")
        block.conv3.weight[chans] *= f
        block.bn3.running_mean[chans] *= f


def _pass(block, chans: list[int]) -> None:
    """A bottleneck with an identity shortcut: its residual path writes 0 into ``chans``."""
    block.conv3.weight[chans] = 0
    _identity_bn(block.bn3, chans)


def install_backbone(backbone: ResNet50, images: torch.Tensor, mean: tuple, std: tuple) -> None:
    """Build the objectness channels into ``backbone`` (in place); the saturation level and
    the INT8 grids the dither spreads over are measured on ``images`` (float64, normalized
    with ``mean`` and ``std``)."""
    work = copy.deepcopy(backbone).double().eval()
    with torch.no_grad():
        chans = _stem(work, mean, std)
        x = work.maxpool(work.relu(work.bn1(work.conv1(images))))
        for i, layer in enumerate([work.layer1, work.layer2, work.layer3, work.layer4]):
            for block in layer:
                if block.downsample is not None and i == 3:
                    chans = _carry(block, chans, C5_COPIES, 2 * SATURATION_COPIES)
                    _saturate(block, x, chans)
                    _bound(block, block(x), chans)
                elif block.downsample is not None:
                    chans = _carry(block, chans, COPIES)
                    _bound(block, block(x), chans)
                else:
                    _pass(block, chans)
                x = block(x)
        # the C5 copies, offset by the dither of C5's INT8 grid (the neck takes it back)
        work.layer4[0].bn3.running_mean[chans] -= _dither(C5_COPIES, _quantile(x.abs(), 1.0)
                                                          / INT8_LEVELS).double()
        for p, q in zip(work.state_dict().values(), backbone.state_dict().values()):
            q.copy_(p.to(q.dtype))


def _dither(n: int, step: float) -> torch.Tensor:
    """``n`` offsets spread evenly over one ``step``: copies of a value offset by them round
    to a per-tensor INT8 grid of that step in ``n`` different ways, and their mean (less the
    offsets) keeps the value to about step / n, where equal copies would all round alike."""
    return torch.tensor([float(f"{(j + 0.5) * step / n:.4g}") for j in range(n)],
                        dtype=torch.float64)


def c5_offset(backbone: ResNet50) -> float:
    """The sum of the dither offsets of C5's objectness channels (install_backbone), which
    the neck takes back."""
    block = backbone.layer4[0]
    chans = _last(block.conv3.out_channels, C5_COPIES)
    middle = _last(block.conv1.out_channels, 2 * SATURATION_COPIES)[:SATURATION_COPIES]
    path = block.conv3.weight[chans[0], middle[0]].double() * \
        -block.bn2.running_mean[middle].double().sum()              # the middle dither's
    return float((path - block.bn3.running_mean[chans].double()).sum())


def _bound_rows(conv: nn.Conv2d, rows: list[int], x: torch.Tensor) -> None:
    """Scale ``rows`` of ``conv`` (their weights and biases) down where their outputs on
    ``x`` would go beyond PEAK_SHARE of the other rows' 99.9th percentile (in magnitude)."""
    out = conv(x)
    keep = torch.ones(out.shape[1], dtype=torch.bool)
    keep[rows] = False
    limit = PEAK_SHARE * _quantile(out[:, keep].abs(), 0.999)
    peak = _quantile(out[:, rows].abs(), 0.999)
    if peak > limit:
        f = float(f"{limit / peak:.4g}")
        conv.weight[rows] *= f
        conv.bias[rows] *= f


def install_neck(neck: FPN, offset: float, c5: torch.Tensor) -> tuple[int, int]:
    """The neck passes the backbone's objectness (C5's last C5_COPIES channels, less their
    dither ``offset``) on along its channel pair (a, b), its last two: the lateral
    convolution writes it into 1/16 of its channels (the ones before a and b; 0 into the
    1/16 before those), the 3x3 convolution sums them over 3x3 into a (and the channels of
    0 into b, with a's bias, so that the bias cancels). Each stays within PEAK_SHARE of its
    layer's other channels on ``c5`` (the backbone's output on the scene images, float64).
    Returns (a, b)."""
    lateral = neck.lateral_convs[0].conv
    c5_chans = _last(lateral.in_channels, C5_COPIES)
    a, b = lateral.out_channels - 1, lateral.out_channels - 2
    n = max(1, lateral.out_channels // 16)
    carry = _last(lateral.out_channels - 2, 2 * n)
    objects, biases = carry[n:], carry[:n]
    rows = objects + biases + [a, b]
    work = copy.deepcopy(neck).double()
    lat, top = work.lateral_convs[0].conv, work.fpn_convs[0].conv
    with torch.no_grad():
        cap = _cap(lat.weight, None, rows)
        lat.weight[rows] = 0
        lat.weight[[[r] for r in objects], c5_chans] = cap
        lat.bias[objects] = -cap * offset             # 0 where C5 shows no object
        lat.bias[biases] = 0
        _bound_rows(lat, objects, c5)
        cap = _cap(top.weight, None, rows)
        top.weight[rows] = 0
        top.weight[a, objects] = top.weight[b, biases] = cap
        top.bias[b] = top.bias[a]
        _bound_rows(top, [a, b], lat(c5))
        for p, q in zip(work.state_dict().values(), neck.state_dict().values()):
            q.copy_(p.to(q.dtype))
    return a, b


def _quantile(x: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of ``x`` (1 if it is empty), rounded."""
    if x.numel() == 0:
        return 1.0
    k = max(1, int(q * x.numel()))
    return float(f"{x.flatten().kthvalue(k).values.item():.4g}")
