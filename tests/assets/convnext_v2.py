"""A ConvNeXt V2 laid out the way its reference implementation (facebookresearch/ConvNeXt-V2,
models/convnextv2.py) lays it out, written here from scratch and shrunk for tests. Against V1
(convnext_official.py) a block has no layer-scale gamma and puts a Global Response
Normalization between the MLP's GELU and its second Linear: per image and channel the L2 norm
over H and W, divided by that norm's mean over the channels, and `gamma * (x * n) + beta + x`
with gamma / beta stored as (1, 1, 1, C) parameters that start at zero. The block's norm is an
nn.LayerNorm on the NHWC view; the stem's and downsampling layers' norms are spelled as timm
spells its LayerNorm2d (an nn.LayerNorm subclass: permute to NHWC, F.layer_norm, permute
back). `grn=` picks the GRN's spelling: "official", "timm" (1-D weight / bias viewed over
the last dim, Tensor.norm, addcmul) or "hf" (torch.linalg.vector_norm, terms reordered).
Input (N, 3, H, W) float."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over C of an NCHW tensor."""

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class GRN(nn.Module):
    """Global Response Normalization over an NHWC tensor, as the reference writes it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.eps = eps

    def forward(self, x):
        g = torch.norm(x, p=2, dim=(1, 2), keepdim=True)       # (N, 1, 1, C)
        n = g / (g.mean(dim=-1, keepdim=True) + self.eps)
        return self.gamma * (x * n) + self.beta + x


class TimmGRN(nn.Module):
    """timm's spelling: 1-D weight / bias viewed over the last dim, Tensor.norm, addcmul."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps, self.spatial, self.shape = eps, (1, 2), (1, 1, 1, -1)

    def forward(self, x):
        g = x.norm(p=2, dim=self.spatial, keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + self.eps)
        return x + torch.addcmul(self.bias.view(self.shape), self.weight.view(self.shape), x * n)


class HfGRN(nn.Module):
    """HF transformers' spelling: torch.linalg.vector_norm, the terms in another order."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.bias = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, hidden):
        norms = torch.linalg.vector_norm(hidden, ord=2, dim=(1, 2), keepdim=True)
        scaled = norms / (norms.mean(dim=-1, keepdim=True) + 1e-6)
        return hidden + self.bias + self.weight * (hidden * scaled)


SPELLINGS = {"official": GRN, "timm": TimmGRN, "hf": HfGRN}


class Block(nn.Module):
    def __init__(self, dim: int, grn: str = "official"):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.grn = SPELLINGS[grn](4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)          # (N, H, W, C)
        x = self.pwconv2(self.grn(self.act(self.pwconv1(self.norm(x)))))
        return shortcut + x.permute(0, 3, 1, 2)


class ConvNeXtV2(nn.Module):
    input_size = (3, 32, 32)            # fusebench's default for a file model; --img-size wins

    def __init__(self, in_chans=3, num_classes=10, depths=(1, 1, 2, 1), dims=(8, 16, 24, 32),
                 grn: str = "official"):
        super().__init__()
        self.downsample_layers = nn.ModuleList([nn.Sequential(
            nn.Conv2d(in_chans, dims[0], kernel_size=4, stride=4),
            LayerNorm2d(dims[0], eps=1e-6))])
        for i in range(3):
            self.downsample_layers.append(nn.Sequential(
                LayerNorm2d(dims[i], eps=1e-6),
                nn.Conv2d(dims[i], dims[i + 1], kernel_size=2, stride=2)))
        self.stages = nn.ModuleList([nn.Sequential(*[Block(dims[i], grn) for _ in range(depths[i])])
                                     for i in range(4)])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        for down, stage in zip(self.downsample_layers, self.stages):
            x = stage(down(x))
        return self.head(self.norm(x.mean([-2, -1])))


def make(**kw):
    return ConvNeXtV2(**kw)


def make_trained(**kw):
    """GRN's gamma / beta away from their zero start, so that the GRN term is live."""
    model = make(**kw)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, tuple(SPELLINGS.values())):
                for p in m.parameters():
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model
