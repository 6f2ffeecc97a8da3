"""Everyday vision architectures with random weights, for testing frontends and passes on
the models users bring.

Each family is written here in a few lines, following the published architecture and the
shapes the well-known model zoos give it (so the exporters see the same operators: grouped
and depthwise convolutions, squeeze-excitation, hardswish/hardsigmoid/SiLU/GELU, channel
shuffles, shifted windows, relative position biases, atrous pyramids). Nothing is
downloaded. ``size="small"`` gives a reduced config that runs in the test suite in a
fraction of a second; ``size="full"`` the published widths and depths at 224x224::

    from bevir.testing.zoo import MODELS, build

    model, example = build("mobilenet_v3_small", size="small", seed=0)
    graph = bevir.from_torch(model, [example])
"""
from __future__ import annotations

from typing import Callable

from ..extras import require

torch = require("torch")
nn, F = torch.nn, torch.nn.functional

__all__ = ["MODELS", "build", "input_shape"]

Act = Callable[[], nn.Module]


def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
            act: Act | None = nn.ReLU, dilation: int = 1) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, dilation * (k - 1) // 2, dilation, groups, bias=False),
        nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int, act: Act = nn.ReLU, gate: Act = nn.Hardsigmoid):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNet-V3's and EfficientNet's block: expand, depthwise, squeeze-excite, project."""

    def __init__(self, cin: int, expand: int, cout: int, k: int, stride: int, se: int,
                 act: Act, gate: Act = nn.Hardsigmoid, se_act: Act = nn.ReLU, dilation: int = 1):
        super().__init__()
        layers: list[nn.Module] = [conv_bn(cin, expand, 1, act=act)] if expand != cin else []
        layers.append(conv_bn(expand, expand, k, stride, expand, act, dilation))
        if se:
            layers.append(SqueezeExcite(expand, se, se_act, gate))
        layers.append(conv_bn(expand, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


def _classifier(c: int, hidden: int, classes: int, act: Act) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c, hidden), act(), nn.Dropout(0.2), nn.Linear(hidden, classes))


class Pooled(nn.Module):
    """A trunk, global average pooling, flatten, a classifier."""

    def __init__(self, features: nn.Module, head: nn.Module):
        super().__init__()
        self.features, self.head = features, head

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ---- ResNet ----------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.conv2 = conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, act=None)
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x):
        return F.relu(self.conv2(self.conv1(x)) + (self.down(x) if self.down else x))


def resnet18(full: bool) -> nn.Module:
    widths, depth = ([64, 128, 256, 512], 2) if full else ([8, 16, 24, 32], 1)
    layers: list[nn.Module] = [conv_bn(3, widths[0], 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = widths[0]
    for i, w in enumerate(widths):
        for j in range(depth):
            layers.append(BasicBlock(cin, w, 2 if i and not j else 1))
            cin = w
    return Pooled(nn.Sequential(*layers), nn.Linear(cin, 1000 if full else 10))


# ---- MobileNet-V3-Small, EfficientNet-B0 -----------------------------------------------------

def _se(c: int) -> int:
    return max(8, (c // 4 + 4) // 8 * 8)


#: (kernel, expanded, out, squeeze-excite, hardswish, stride) per block
_MOBILENET_V3_SMALL = [(3, 16, 16, 1, 0, 2), (3, 72, 24, 0, 0, 2), (3, 88, 24, 0, 0, 1),
                       (5, 96, 40, 1, 1, 2), (5, 240, 40, 1, 1, 1), (5, 240, 40, 1, 1, 1),
                       (5, 120, 48, 1, 1, 1), (5, 144, 48, 1, 1, 1), (5, 288, 96, 1, 1, 2),
                       (5, 576, 96, 1, 1, 1), (5, 576, 96, 1, 1, 1)]


def mobilenet_v3_trunk(settings, dilate_last: bool = False) -> tuple[list[nn.Module], int]:
    layers: list[nn.Module] = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
    cin = 16
    for i, (k, exp, out, se, hs, s) in enumerate(settings):
        last_stage = dilate_last and i >= len(settings) - 3
        layers.append(InvertedResidual(cin, exp, out, k, 1 if last_stage else s,
                                       _se(exp) if se else 0, nn.Hardswish if hs else nn.ReLU,
                                       dilation=2 if last_stage else 1))
        cin = out
    layers.append(conv_bn(cin, 6 * cin, 1, act=nn.Hardswish))
    return layers, 6 * cin


def mobilenet_v3_small(full: bool) -> nn.Module:
    settings = _MOBILENET_V3_SMALL if full else _MOBILENET_V3_SMALL[:1] + _MOBILENET_V3_SMALL[3:5]
    layers, c = mobilenet_v3_trunk(settings)
    return Pooled(nn.Sequential(*layers),
                  _classifier(c, 1024 if full else 32, 1000 if full else 10, nn.Hardswish))


#: (expand ratio, kernel, stride, out, repeats) per stage
_EFFICIENTNET_B0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]


def efficientnet_b0(full: bool) -> nn.Module:
    stages = _EFFICIENTNET_B0 if full else [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 32, 1)]
    layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.SiLU)]
    cin = 32
    for ratio, k, s, out, n in stages:
        for j in range(n):
            layers.append(InvertedResidual(cin, cin * ratio, out, k, s if j == 0 else 1,
                                           max(1, cin // 4), nn.SiLU, nn.Sigmoid, nn.SiLU))
            cin = out
    head = 1280 if full else 64
    layers.append(conv_bn(cin, head, 1, act=nn.SiLU))
    return Pooled(nn.Sequential(*layers),
                  nn.Sequential(nn.Dropout(0.2), nn.Linear(head, 1000 if full else 10)))


# ---- SqueezeNet ------------------------------------------------------------------------------

class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.e1, self.e3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        s = F.relu(self.squeeze(x))
        return torch.cat([F.relu(self.e1(s)), F.relu(self.e3(s))], 1)


class SqueezeNet(nn.Module):
    def __init__(self, full: bool):
        super().__init__()
        fires = [(64, 16, 64), (128, 16, 64), "pool", (128, 32, 128), (256, 32, 128), "pool",
                 (256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256)]
        if not full:
            fires = [(64, 8, 16), (32, 8, 16), "pool", (32, 16, 32)]
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 3, 2), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, ceil_mode=True)]
        for f in fires:
            layers.append(nn.MaxPool2d(3, 2, ceil_mode=True) if f == "pool" else Fire(*f))
        self.features = nn.Sequential(*layers)
        classes = 1000 if full else 10
        self.classifier = nn.Conv2d(2 * fires[-1][2], classes, 1)

    def forward(self, x):
        y = F.relu(self.classifier(F.dropout(self.features(x), 0.5, self.training)))
        return torch.flatten(F.adaptive_avg_pool2d(y, 1), 1)


# ---- ShuffleNet-V2 ---------------------------------------------------------------------------

def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.left = nn.Sequential(conv_bn(cin, cin, 3, stride, cin, None),
                                      conv_bn(cin, half, 1))
        src = cin if stride > 1 else half
        self.right = nn.Sequential(conv_bn(src, half, 1),
                                   conv_bn(half, half, 3, stride, half, None),
                                   conv_bn(half, half, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            y = torch.cat([a, self.right(b)], 1)
        else:
            y = torch.cat([self.left(x), self.right(x)], 1)
        return channel_shuffle(y, 2)


def shufflenet_v2(full: bool) -> nn.Module:
    widths, repeats = ([48, 96, 192], [4, 8, 4]) if full else ([16, 32, 64], [2, 2, 1])
    layers: list[nn.Module] = [conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
    cin = 24
    for w, n in zip(widths, repeats):
        for j in range(n):
            layers.append(ShuffleBlock(cin, w, 2 if j == 0 else 1))
            cin = w
    last = 1024 if full else 64
    layers.append(conv_bn(cin, last, 1))
    return Pooled(nn.Sequential(*layers), nn.Linear(last, 1000 if full else 10))


# ---- RegNet-Y --------------------------------------------------------------------------------

class RegNetYBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, group_width: int):
        super().__init__()
        self.block = nn.Sequential(
            conv_bn(cin, cout, 1), conv_bn(cout, cout, 3, stride, cout // group_width),
            SqueezeExcite(cout, max(1, cin // 4), gate=nn.Sigmoid),
            conv_bn(cout, cout, 1, act=None))
        self.down = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None

    def forward(self, x):
        return F.relu(self.block(x) + (self.down(x) if self.down else x))


def regnet_y_400mf(full: bool) -> nn.Module:
    stages = [(48, 1), (104, 3), (208, 6), (440, 6)] if full else [(16, 1), (32, 1), (48, 1)]
    group_width = 8
    layers: list[nn.Module] = [conv_bn(3, 32, 3, 2)]
    cin = 32
    for w, n in stages:
        for j in range(n):
            layers.append(RegNetYBlock(cin, w, 2 if j == 0 else 1, group_width))
            cin = w
    return Pooled(nn.Sequential(*layers), nn.Linear(cin, 1000 if full else 10))


# ---- ConvNeXt --------------------------------------------------------------------------------

class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor, through a permute either side."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))
        self.scale = nn.Parameter(torch.full((c, 1, 1), 0.1))

    def forward(self, x):
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return x + self.scale * y


def convnext_tiny(full: bool) -> nn.Module:
    widths, depths = ([96, 192, 384, 768], [3, 3, 9, 3]) if full else ([16, 32], [1, 1])
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 4, 4), LayerNorm2d(widths[0], eps=1e-6)]
    for i, (w, d) in enumerate(zip(widths, depths)):
        if i:
            layers += [LayerNorm2d(widths[i - 1], eps=1e-6), nn.Conv2d(widths[i - 1], w, 2, 2)]
        layers += [ConvNeXtBlock(w) for _ in range(d)]
    c = widths[-1]
    return Pooled(nn.Sequential(*layers),
                  nn.Sequential(nn.LayerNorm(c, eps=1e-6), nn.Linear(c, 1000 if full else 10)))


# ---- ViT -------------------------------------------------------------------------------------

class EncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, full: bool):
        super().__init__()
        image, patch, dim, depth, heads, mlp = ((224, 16, 768, 12, 12, 3072) if full
                                                else (32, 8, 32, 2, 4, 64))
        self.patch = patch
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[EncoderBlock(dim, heads, mlp) for _ in range(depth)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 1000 if full else 10)

    def forward(self, x):
        n = x.shape[0]
        x = self.embed(x).reshape(n, self.embed.out_channels, -1).permute(0, 2, 1)
        x = torch.cat([self.cls.expand(n, -1, -1), x], 1) + self.pos
        return self.head(self.ln(self.blocks(x))[:, 0])


# ---- Swin ------------------------------------------------------------------------------------

def relative_index(h: int, w: int) -> torch.Tensor:
    """For each pair of positions in an h x w window, the index of their offset in a
    (2h-1)(2w-1) table of biases."""
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([ys.flatten(), xs.flatten()])
    d = coords[:, :, None] - coords[:, None, :]
    return ((d[0] + h - 1) * (2 * w - 1) + d[1] + w - 1).flatten()


class WindowAttention(nn.Module):
    """Multi-head self-attention inside windows of an NHWC map, with a learned relative
    position bias; shifted windows roll the map and mask pairs from different regions."""

    def __init__(self, dim: int, heads: int, window: int, shift: int):
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        self.register_buffer("index", relative_index(window, window), persistent=False)

    def forward(self, x):
        n, h, w, c = x.shape
        ws = self.window
        pad_b, pad_r = (ws - h % ws) % ws, (ws - w % ws) % ws
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        ph, pw = x.shape[1], x.shape[2]
        shift = self.shift if ws < min(ph, pw) else 0
        if shift:
            x = torch.roll(x, (-shift, -shift), (1, 2))
        nw = (ph // ws) * (pw // ws)
        x = (x.view(n, ph // ws, ws, pw // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
             .reshape(n * nw, ws * ws, c))
        q, k, v = (self.qkv(x).reshape(n * nw, ws * ws, 3, self.heads, c // self.heads)
                   .permute(2, 0, 3, 1, 4))
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        bias = self.bias_table[self.index].view(ws * ws, ws * ws, self.heads).permute(2, 0, 1)
        attn = attn + bias.unsqueeze(0)
        if shift:
            attn = (attn.view(n, nw, self.heads, ws * ws, ws * ws)
                    + self.mask(ph, pw, x).unsqueeze(1).unsqueeze(0))
            attn = attn.view(n * nw, self.heads, ws * ws, ws * ws)
        y = (attn.softmax(-1) @ v).transpose(1, 2).reshape(n * nw, ws * ws, c)
        y = (self.proj(y).view(n, ph // ws, pw // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
             .reshape(n, ph, pw, c))
        if shift:
            y = torch.roll(y, (shift, shift), (1, 2))
        return y[:, :h, :w, :].contiguous()

    def mask(self, ph: int, pw: int, like: torch.Tensor) -> torch.Tensor:
        ws, s = self.window, self.shift
        region = like.new_zeros((ph, pw))
        bounds = ((0, -ws), (-ws, -s), (-s, None))
        for i, (y0, y1) in enumerate(bounds):
            for j, (x0, x1) in enumerate(bounds):
                region[y0:y1, x0:x1] = 3 * i + j
        r = region.view(ph // ws, ws, pw // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws)
        diff = r.unsqueeze(1) - r.unsqueeze(2)
        return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


class SwinBlock(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, shift: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window, shift)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.reduce = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        h, w = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        parts = [x[:, i::2, j::2, :] for j in (0, 1) for i in (0, 1)]
        return self.reduce(self.norm(torch.cat(parts, -1)))


class Swin(nn.Module):
    def __init__(self, full: bool):
        super().__init__()
        dim, depths, heads, window = ((96, [2, 2, 6, 2], [3, 6, 12, 24], 7) if full
                                      else (16, [2, 2], [2, 4], 4))
        self.embed = nn.Conv2d(3, dim, 4, 4)
        layers: list[nn.Module] = [nn.LayerNorm(dim)]
        for i, (d, nh) in enumerate(zip(depths, heads)):
            if i:
                layers.append(PatchMerging(dim))
                dim *= 2
            layers += [SwinBlock(dim, nh, window, window // 2 if j % 2 else 0) for j in range(d)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1000 if full else 10)

    def forward(self, x):
        y = self.norm(self.features(self.embed(x).permute(0, 2, 3, 1)))
        return self.head(y.mean((1, 2)))


# ---- DeepLabV3 on MobileNet-V3 ---------------------------------------------------------------

class ASPP(nn.Module):
    def __init__(self, cin: int, c: int, rates: tuple[int, ...]):
        super().__init__()
        self.branches = nn.ModuleList([conv_bn(cin, c, 1)] +
                                      [conv_bn(cin, c, 3, dilation=r) for r in rates])
        self.pool = conv_bn(cin, c, 1)
        self.project = conv_bn(c * (len(rates) + 2), c, 1)

    def forward(self, x):
        pooled = self.pool(F.adaptive_avg_pool2d(x, 1))
        ys = [b(x) for b in self.branches]
        ys.append(F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.project(torch.cat(ys, 1))


class DeepLabV3(nn.Module):
    def __init__(self, full: bool):
        super().__init__()
        settings = (_MOBILENET_V3_SMALL if full
                    else _MOBILENET_V3_SMALL[:1] + _MOBILENET_V3_SMALL[3:6])
        layers, c = mobilenet_v3_trunk(settings, dilate_last=True)
        self.backbone = nn.Sequential(*layers)
        width = 256 if full else 32
        self.head = nn.Sequential(ASPP(c, width, (12, 24, 36)), conv_bn(width, width),
                                  nn.Conv2d(width, 21, 1))

    def forward(self, x):
        y = self.head(self.backbone(x))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


# ---- MaxViT ----------------------------------------------------------------------------------

class RelativeAttention(nn.Module):
    """Multi-head attention over the tokens of each partition, with a relative position
    bias, written with einsum as MaxViT's reference does."""

    def __init__(self, dim: int, head_dim: int, size: int):
        super().__init__()
        self.heads, self.head_dim = dim // head_dim, head_dim
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn((2 * size - 1) ** 2, self.heads) * 0.02)
        self.register_buffer("index", relative_index(size, size), persistent=False)

    def forward(self, x):                     # x: [B, G, P, C]
        b, g, p, c = x.shape
        q, k, v = (self.qkv(x).reshape(b, g, p, 3, self.heads, self.head_dim)
                   .permute(3, 0, 1, 4, 2, 5))
        attn = torch.einsum("bghid,bghjd->bghij", q, k) * self.head_dim ** -0.5
        bias = self.bias_table[self.index].view(p, p, self.heads).permute(2, 0, 1)
        attn = (attn + bias).softmax(-1)
        y = torch.einsum("bghij,bghjd->bghid", attn, v)
        return self.proj(y.permute(0, 1, 3, 2, 4).reshape(b, g, p, c))


class PartitionAttention(nn.Module):
    """MaxViT's block (local windows) or grid (dilated, global) attention with its MLP."""

    def __init__(self, dim: int, head_dim: int, size: int, grid: bool):
        super().__init__()
        self.size, self.grid = size, grid
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = RelativeAttention(dim, head_dim, size)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def partition(self, x):
        b, c, h, w = x.shape
        p = self.size
        if self.grid:       # the p x p grid of positions h/p apart: one partition per offset
            x = x.view(b, c, p, h // p, p, w // p).permute(0, 3, 5, 2, 4, 1)
        else:
            x = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, (h // p) * (w // p), p * p, c)

    def unpartition(self, x, h: int, w: int):
        b, _, _, c = x.shape
        p = self.size
        x = x.view(b, h // p, w // p, p, p, c)
        perm = (0, 5, 3, 1, 4, 2) if self.grid else (0, 5, 1, 3, 2, 4)
        return x.permute(*perm).reshape(b, c, h, w)

    def forward(self, x):
        h, w = x.shape[-2:]
        y = self.partition(x)
        y = y + self.attn(self.ln1(y))
        y = y + self.mlp(self.ln2(y))
        return self.unpartition(y, h, w)


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        mid = 4 * cout
        self.block = nn.Sequential(
            nn.BatchNorm2d(cin), conv_bn(cin, mid, 1, act=nn.GELU),
            conv_bn(mid, mid, 3, stride, mid, nn.GELU),
            SqueezeExcite(mid, cout // 4, nn.SiLU, nn.Sigmoid), nn.Conv2d(mid, cout, 1))
        self.down = (nn.Sequential(nn.AvgPool2d(3, stride, 1), nn.Conv2d(cin, cout, 1))
                     if stride != 1 or cin != cout else None)

    def forward(self, x):
        return (self.down(x) if self.down else x) + self.block(x)


class MaxViT(nn.Module):
    def __init__(self, full: bool):
        super().__init__()
        stem, widths, depths, size, head_dim = ((64, [64, 128, 256, 512], [2, 2, 5, 2], 7, 32)
                                                if full else (16, [16, 32], [1, 1], 4, 8))
        layers: list[nn.Module] = [conv_bn(3, stem, 3, 2, act=nn.GELU),
                                   nn.Conv2d(stem, stem, 3, 1, 1)]
        cin = stem
        for w, d in zip(widths, depths):
            for j in range(d):
                layers += [MBConv(cin, w, 2 if j == 0 else 1),
                           PartitionAttention(w, head_dim, size, grid=False),
                           PartitionAttention(w, head_dim, size, grid=True)]
                cin = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.LayerNorm(cin), nn.Linear(cin, cin), nn.Tanh(),
                                  nn.Linear(cin, 1000 if full else 10, bias=False))

    def forward(self, x):
        y = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.head(y)


# ---- the registry ----------------------------------------------------------------------------

#: family -> (builder(full) -> module, small input size)
MODELS: dict[str, tuple[Callable[[bool], nn.Module], int]] = {
    "resnet18": (resnet18, 64),
    "mobilenet_v3_small": (mobilenet_v3_small, 64),
    "efficientnet_b0": (efficientnet_b0, 64),
    "squeezenet1_1": (SqueezeNet, 64),
    "shufflenet_v2": (shufflenet_v2, 64),
    "regnet_y_400mf": (regnet_y_400mf, 64),
    "convnext_tiny": (convnext_tiny, 64),
    "vit_b_16": (ViT, 32),
    "swin_t": (Swin, 64),
    "deeplabv3_mobilenet_v3": (DeepLabV3, 64),
    "maxvit_t": (MaxViT, 64),
}


def input_shape(name: str, size: str = "small") -> tuple[int, int, int, int]:
    s = 224 if size == "full" else MODELS[name][1]
    return (1, 3, s, s)


def _randomize_norms(model: nn.Module, gen: torch.Generator) -> None:
    """Untrained BatchNorm is an identity; give it statistics and affine parameters like a
    trained one so the tests see per-channel scales and shifts that matter."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)


def build(name: str, size: str = "small", seed: int = 0, untrained_norms: bool = False
          ) -> tuple[nn.Module, torch.Tensor]:
    """The model ``name`` (a key of :data:`MODELS`) in eval mode with random weights (a
    pure function of ``seed``), and an example input. BatchNorm gets random statistics
    like a trained one's, unless ``untrained_norms`` (then it is the identity, as in a
    freshly constructed model: its folded biases are all zero)."""
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    if size not in ("small", "full"):
        raise ValueError(f"size must be 'small' or 'full', not {size!r}")
    torch.manual_seed(seed)
    model = MODELS[name][0](size == "full").eval()
    gen = torch.Generator().manual_seed(seed)
    if not untrained_norms:
        _randomize_norms(model, gen)
    example = torch.randn(input_shape(name, size), generator=gen)
    return model, example
