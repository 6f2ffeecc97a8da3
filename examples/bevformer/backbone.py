"""ResNet-50 (C5 only, BN in eval mode) and the one-level FPN of BEVFormer-tiny.

Parameter names follow torchvision's ResNet (without ``fc``) and mmdet's FPN, so the
official checkpoint's ``img_backbone.*`` and ``img_neck.*`` keys load directly.
"""
from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here, 'pytorch' style) -> 1x1, with a projection shortcut."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """The ResNet-50 trunk up to layer4 (C5: stride 32, 2048 channels)."""

    def __init__(self, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for i, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
            layer = []
            for j in range(n):
                layer.append(Bottleneck(inplanes, planes, 2 if (j == 0 and i > 0) else 1))
                inplanes = planes * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


class ConvModule(nn.Module):
    """mmcv's ConvModule without norm or activation: keys ``conv.weight`` / ``conv.bias``."""

    def __init__(self, cin: int, cout: int, k: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class FPN(nn.Module):
    """One-level FPN: conv3x3(conv1x1(C5)); no extra levels (num_outs=1)."""

    def __init__(self, cin: int = 2048, cout: int = 256):
        super().__init__()
        self.lateral_convs = nn.ModuleList([ConvModule(cin, cout, 1)])
        self.fpn_convs = nn.ModuleList([ConvModule(cout, cout, 3)])

    def forward(self, c5: torch.Tensor) -> torch.Tensor:
        return self.fpn_convs[0](self.lateral_convs[0](c5))


class ResNetFPN(nn.Module):
    """img -> feats: ResNet-50 and the FPN as one module, under the detector's key names
    (``img_backbone.*``, ``img_neck.*``) and module paths. ``blocks``: bottlenecks per stage."""

    def __init__(self, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.img_backbone = ResNet50(blocks)
        self.img_neck = FPN()

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.img_neck(self.img_backbone(img))


def randomize_bn(module: nn.Module, generator: torch.Generator) -> None:
    """Give every BatchNorm non-trivial eval statistics (synthetic but sane weights)."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.weight.data = 0.5 + 0.5 * torch.rand(c, generator=generator)
            m.bias.data = 0.1 * torch.randn(c, generator=generator)
            m.running_mean.data = 0.1 * torch.randn(c, generator=generator)
            m.running_var.data = 0.5 + torch.rand(c, generator=generator)
