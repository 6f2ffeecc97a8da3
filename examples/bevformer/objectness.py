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
- ``layer4``'s first block writes C5_COPIES channels of ``relu(x)`` and C5_COPIES of
  ``relu(x - full)``, whose difference (``min(x, full)``, ``full`` the SATURATION quantile:
  a near object counts no more than a far one) the neck's lateral convolution writes into
  1/16 of its channels, which its 3x3 convolution sums over 3x3 into a pair of channels,
  ``a`` and ``b`` (``b`` from as many copies of their bias): the objectness is the
  neck output along ``(e_a - e_b)/sqrt(2)`` (a pair, so that a per-camera or per-level
  embedding added to both cancels).

No weight of the path is larger than WEIGHT_SHARE of the largest other weight of its layer
(BatchNorm folded in), and no stage's channels larger than PEAK_SHARE of the others, so that
neither sets the per-tensor INT8 grid of a layer's weights or outputs; the copies make up
the gain that small weights give away. The other filters still read the designated channels
with their random weights.
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
#: a path weight's size, as a fraction of the largest other weight of its layer; its
#: channels' 99.9th percentile, as a fraction of the other channels' (at most)
WEIGHT_SHARE, PEAK_SHARE = 0.9, 0.5
#: the objectness at which a C5 cell counts as full: this quantile of C5's positive values
#: on the scene images (where a far pedestrian's cell lies; a near car's is ten times more)
SATURATION = 0.75


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


def _carry(block, inputs: list[int], outputs: int) -> list[int]:
    """A bottleneck with a projection shortcut: its residual path writes the 3x3 sum of the
    sum of ``inputs`` into its last ``outputs`` channels; their shortcut is 0. Returns them."""
    mids = _last(block.conv1.out_channels, BOTTLENECK_COPIES)
    outs = _last(block.conv3.out_channels, outputs)
    for conv, bn, rows, reads, taps in ((block.conv1, block.bn1, mids, inputs, None),
                                        (block.conv2, block.bn2, mids, None, 9),
                                        (block.conv3, block.bn3, outs, mids, None)):
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


def _bound(block, out: torch.Tensor, chans: list[int]) -> None:
    """Scale ``block``'s path down where its output ``out`` (on the scene images) would go
    beyond PEAK_SHARE of the other channels' 99.9th percentile: the output's per-tensor INT8
    grid stays the other channels'."""
    keep = torch.ones(out.shape[1], dtype=torch.bool)
    keep[chans] = False
    limit = PEAK_SHARE * _quantile(out[:, keep], 0.999)
    peak = _quantile(out[:, chans[0]], 0.999)
    if peak > limit:
        block.conv3.weight[chans] *= float(f"{limit / peak:.4g}")


def _pass(block, chans: list[int]) -> None:
    """A bottleneck with an identity shortcut: its residual path writes 0 into ``chans``."""
    block.conv3.weight[chans] = 0
    _identity_bn(block.bn3, chans)


def install_backbone(backbone: ResNet50, images: torch.Tensor, mean: tuple, std: tuple) -> None:
    """Build the objectness channels into ``backbone`` (in place); the saturation level is
    measured on ``images`` (float64, normalized with ``mean`` and ``std``)."""
    work = copy.deepcopy(backbone).double().eval()
    with torch.no_grad():
        chans = _stem(work, mean, std)
        x = work.maxpool(work.relu(work.bn1(work.conv1(images))))
        for i, layer in enumerate([work.layer1, work.layer2, work.layer3, work.layer4]):
            for block in layer:
                if block.downsample is not None:
                    chans = _carry(block, chans, 2 * C5_COPIES if i == 3 else COPIES)
                    _bound(block, block(x), chans)
                else:
                    _pass(block, chans)
                x = block(x)
        for p, q in zip(work.state_dict().values(), backbone.state_dict().values()):
            q.copy_(p.to(q.dtype))
        c5 = x[:, chans[0]]
        backbone.layer4[0].bn3.running_mean[chans[C5_COPIES:]] = _quantile(c5[c5 > 0],
                                                                           SATURATION)


def install_neck(neck: FPN) -> tuple[int, int]:
    """The neck passes min(x, full) of the backbone's objectness (C5's last 2 * C5_COPIES
    channels: relu(x), then relu(x - full)) on along its channel pair (a, b), its last two:
    the lateral convolution writes it into 1/16 of its channels (the ones before a and b;
    copies of their bias into the 1/16 before those), the 3x3 convolution sums them over
    3x3 into a (and the bias copies into b, so that the bias cancels). Returns (a, b)."""
    lateral, fpn = neck.lateral_convs[0].conv, neck.fpn_convs[0].conv
    c5 = _last(lateral.in_channels, 2 * C5_COPIES)
    a, b = lateral.out_channels - 1, lateral.out_channels - 2
    n = max(1, lateral.out_channels // 16)
    carry = _last(lateral.out_channels - 2, 2 * n)
    objects, biases = carry[n:], carry[:n]
    rows = objects + biases + [a, b]
    with torch.no_grad():
        cap = _cap(lateral.weight, None, rows)
        lateral.weight[rows] = 0
        lateral.weight[[[r] for r in objects], c5[:C5_COPIES]] = cap
        lateral.weight[[[r] for r in objects], c5[C5_COPIES:]] = -cap
        lateral.bias[objects + biases] = lateral.bias[objects].mean()
        cap = _cap(fpn.weight, None, rows)
        fpn.weight[rows] = 0
        fpn.weight[a, objects] = fpn.weight[b, biases] = cap
        fpn.bias[b] = fpn.bias[a]
    return a, b


def _quantile(x: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of ``x`` (1 if it is empty), rounded."""
    if x.numel() == 0:
        return 1.0
    k = max(1, int(q * x.numel()))
    return float(f"{x.flatten().kthvalue(k).values.item():.4g}")
