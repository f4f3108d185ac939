"""ConvNeXt (Liu et al. 2022, arXiv:2201.03545), our own implementation, NCHW throughout.

Depths/dims as timm `convnext_*`; convnext_tiny has 28,589,128 parameters with 1000 classes.
Every norm is a LayerNorm2d whose implementation is chosen by the `ln_impl` kwarg (a name in the
"ln2d" kernel registry), and the MLP is 1x1 convs (timm's conv_mlp layout): same parameters as
the Linear/NHWC layout, but the ln_impl choice covers every norm in the model.

Default input sizes: 224 train / 288 infer (timm default_cfgs `input_size` / `test_input_size`
for every variant here).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fusebench.models.layers import ConvMlp, DropPath, LayerNorm2d
from fusebench.models.registry import register_model

LN_EPS = 1e-6
LAYER_SCALE_INIT = 1e-6


class ConvNeXtBlock(nn.Module):
    """x + drop_path(gamma * mlp(norm(dwconv7x7(x))))."""

    def __init__(self, dim: int, drop_path: float = 0.0, ln_impl: str = "permute"):
        super().__init__()
        self.conv_dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=True)
        self.norm = LayerNorm2d(dim, LN_EPS, impl=ln_impl)
        self.mlp = ConvMlp(dim, 4 * dim)
        self.gamma = nn.Parameter(torch.full((dim,), LAYER_SCALE_INIT))   # layer scale
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:    # (N, C, H, W)
        y = self.mlp(self.norm(self.conv_dw(x)))
        return x + self.drop_path(y * self.gamma[None, :, None, None])


class ConvNeXtStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, depth: int, drop_paths: list[float],
                 ln_impl: str):
        super().__init__()
        if in_chs != out_chs:   # every stage but the first halves H and W
            self.downsample = nn.Sequential(LayerNorm2d(in_chs, LN_EPS, impl=ln_impl),
                                            nn.Conv2d(in_chs, out_chs, 2, stride=2))
        else:
            self.downsample = nn.Identity()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(out_chs, drop_paths[i], ln_impl)
                                      for i in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class ConvNeXt(nn.Module):
    def __init__(self, depths: tuple[int, ...], dims: tuple[int, ...], *,
                 num_classes: int = 1000, in_chans: int = 3, ln_impl: str = "permute",
                 drop_rate: float = 0.0, drop_path_rate: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_chans, dims[0], 4, stride=4),   # patchify
                                  LayerNorm2d(dims[0], LN_EPS, impl=ln_impl))
        # stochastic depth rate grows linearly over all blocks
        total = sum(depths)
        dpr = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        stages, prev, start = [], dims[0], 0
        for depth, dim in zip(depths, dims):
            stages.append(ConvNeXtStage(prev, dim, depth, dpr[start:start + depth], ln_impl))
            prev, start = dim, start + depth
        self.stages = nn.Sequential(*stages)
        self.num_features = dims[-1]
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head_norm = LayerNorm2d(self.num_features, LN_EPS, impl=ln_impl)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:    # (N, 3, H, W)
        x = self.stages(self.stem(x))                        # (N, C, H/32, W/32)
        x = self.head_norm(self.pool(x)).flatten(1)          # (N, C)
        return self.head(self.head_drop(x))                  # (N, num_classes)


def _convnext(depths, dims, num_classes, ln_impl, drop_rate, drop_path_rate) -> ConvNeXt:
    return ConvNeXt(depths, dims, num_classes=num_classes, ln_impl=ln_impl,
                    drop_rate=drop_rate, drop_path_rate=drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_atto(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-Atto (timm variant): depths 2-2-6-2, dims 40-320, 3.7M params."""
    return _convnext((2, 2, 6, 2), (40, 80, 160, 320), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_femto(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                   drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-Femto (timm variant): depths 2-2-6-2, dims 48-384, 5.2M params."""
    return _convnext((2, 2, 6, 2), (48, 96, 192, 384), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_pico(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-Pico (timm variant): depths 2-2-6-2, dims 64-512, 9.1M params."""
    return _convnext((2, 2, 6, 2), (64, 128, 256, 512), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_nano(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-Nano (timm variant): depths 2-2-8-2, dims 80-640, 15.6M params."""
    return _convnext((2, 2, 8, 2), (80, 160, 320, 640), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_tiny(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-T: depths 3-3-9-3, dims 96-768, 28.6M params."""
    return _convnext((3, 3, 9, 3), (96, 192, 384, 768), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_small(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                   drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-S: depths 3-3-27-3, dims 96-768, 50.2M params."""
    return _convnext((3, 3, 27, 3), (96, 192, 384, 768), num_classes, ln_impl, drop_rate,
                     drop_path_rate)


@register_model(family="convnext", train_size=224, infer_size=288)
def convnext_base(*, num_classes: int = 1000, ln_impl: str = "permute", drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> ConvNeXt:
    """ConvNeXt-B: depths 3-3-27-3, dims 128-1024, 88.6M params."""
    return _convnext((3, 3, 27, 3), (128, 256, 512, 1024), num_classes, ln_impl, drop_rate,
                     drop_path_rate)
