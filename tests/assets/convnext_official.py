"""A ConvNeXt laid out the way the reference implementation (facebookresearch/ConvNeXt,
models/convnext.py) lays it out, written here from scratch and shrunk for tests: its own
LayerNorm class that takes `data_format` ("channels_last": F.layer_norm over the last dim;
"channels_first": the mean / variance / sqrt written out over dim 1), blocks of a 7x7
depthwise conv, a permute to NHWC, LayerNorm, Linear -> GELU -> Linear, a layer-scale `gamma`,
a permute back and the residual; stem and downsampling layers with channels-first norms; a
global average pool, a final nn.LayerNorm and a Linear head. Input (N, 3, H, W) float."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    """LayerNorm over C for NHWC ("channels_last") or NCHW ("channels_first") input."""

    def __init__(self, channels: int, eps: float = 1e-6, data_format: str = "channels_last"):
        super().__init__()
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(f"data_format {data_format!r}")
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps, self.data_format, self.shape = eps, data_format, (channels,)

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)
        mu = x.mean(1, keepdim=True)
        var = (x - mu).pow(2).mean(1, keepdim=True)
        x = (x - mu) / torch.sqrt(var + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim)) if layer_scale > 0 else None

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)          # (N, H, W, C)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        if self.gamma is not None:
            x = self.gamma * x
        return shortcut + x.permute(0, 3, 1, 2)         # back to (N, C, H, W)


class ConvNeXt(nn.Module):
    def __init__(self, in_chans=3, num_classes=10, depths=(1, 1, 2, 1), dims=(8, 16, 24, 32),
                 layer_scale: float = 1e-6):
        super().__init__()
        self.downsample_layers = nn.ModuleList([nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            LayerNorm(dims[0], eps=1e-6, data_format="channels_first"))])
        for i in range(3):
            self.downsample_layers.append(nn.Sequential(
                LayerNorm(dims[i], eps=1e-6, data_format="channels_first"),
                nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2)))
        self.stages = nn.ModuleList([nn.Sequential(*[Block(dims[i], layer_scale)
                                                     for _ in range(depths[i])])
                                     for i in range(4)])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean([-2, -1])))   # global average pool, norm, head


def make(**kw):
    return ConvNeXt(**kw)
