"""EfficientNet B0-B7 (Tan & Le 2019, arXiv:1905.11946), our own implementation.

Same architecture, hence the same parameter counts, as timm `efficientnet_bN` and torchvision
`efficientnet_bN`: B0 has 5,288,548 parameters with 1000 classes.

Default input sizes: train = timm's default pretrained cfg `input_size`, infer = its
`test_input_size` where it has one (timm/models/efficientnet.py default_cfgs); B5-B7 use the
paper / torchvision resolutions 456/528/600 for both.

Dropout defaults to 0 (as timm's create_model) so a train step is deterministic and modes can be
checked against eager like for like; `--model-kwarg drop_rate=0.2` gives the paper's setting.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from fusebench.models.layers import ConvBNAct, MBConv, make_divisible
from fusebench.models.registry import register_model

# B0 stages: (expand_ratio, kernel, stride, out_chs, repeats); every block has SE ratio 0.25
B0_STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)
STEM_CHS = 32
HEAD_CHS = 1280


class EfficientNet(nn.Module):
    def __init__(self, width_mult: float, depth_mult: float, *, num_classes: int = 1000,
                 in_chans: int = 3, drop_rate: float = 0.0, drop_path_rate: float = 0.0):
        super().__init__()
        stem_chs = make_divisible(STEM_CHS * width_mult)
        self.stem = ConvBNAct(in_chans, stem_chs, 3, stride=2)

        stages = [(e, k, s, make_divisible(c * width_mult), math.ceil(r * depth_mult))
                  for e, k, s, c, r in B0_STAGES]
        total_blocks = sum(st[4] for st in stages)
        blocks, in_chs, idx = [], stem_chs, 0
        for expand, kernel, stride, out_chs, repeats in stages:
            stage = []
            for i in range(repeats):
                # stochastic depth grows linearly with block depth (0 at the first block)
                dpr = drop_path_rate * idx / total_blocks
                stage.append(MBConv(in_chs, out_chs, kernel, stride if i == 0 else 1, expand,
                                    se_ratio=0.25, drop_path=dpr))
                in_chs, idx = out_chs, idx + 1
            blocks.append(nn.Sequential(*stage))
        self.blocks = nn.Sequential(*blocks)

        self.num_features = make_divisible(HEAD_CHS * width_mult)
        self.head = ConvBNAct(in_chs, self.num_features, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(drop_rate)
        self.classifier = nn.Linear(self.num_features, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                bound = 1.0 / math.sqrt(m.out_features)
                nn.init.uniform_(m.weight, -bound, bound)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (N, 3, H, W)
        x = self.head(self.blocks(self.stem(x)))           # (N, F, H/32, W/32)
        x = self.pool(x).flatten(1)                        # (N, F)
        return self.classifier(self.dropout(x))            # (N, num_classes)


def _efficientnet(width: float, depth: float, num_classes: int, drop_rate: float,
                  drop_path_rate: float) -> EfficientNet:
    return EfficientNet(width, depth, num_classes=num_classes, drop_rate=drop_rate,
                        drop_path_rate=drop_path_rate)


@register_model(family="efficientnet", train_size=224, infer_size=224)
def efficientnet_b0(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B0 (width 1.0, depth 1.0), 5.3M params."""
    return _efficientnet(1.0, 1.0, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=240, infer_size=288)
def efficientnet_b1(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B1 (width 1.0, depth 1.1), 7.8M params."""
    return _efficientnet(1.0, 1.1, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=256, infer_size=288)
def efficientnet_b2(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B2 (width 1.1, depth 1.2), 9.1M params."""
    return _efficientnet(1.1, 1.2, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=288, infer_size=320)
def efficientnet_b3(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B3 (width 1.2, depth 1.4), 12.2M params."""
    return _efficientnet(1.2, 1.4, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=320, infer_size=384)
def efficientnet_b4(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B4 (width 1.4, depth 1.8), 19.3M params."""
    return _efficientnet(1.4, 1.8, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=456, infer_size=456)
def efficientnet_b5(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B5 (width 1.6, depth 2.2), 30.4M params."""
    return _efficientnet(1.6, 2.2, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=528, infer_size=528)
def efficientnet_b6(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B6 (width 1.8, depth 2.6), 43.0M params."""
    return _efficientnet(1.8, 2.6, num_classes, drop_rate, drop_path_rate)


@register_model(family="efficientnet", train_size=600, infer_size=600)
def efficientnet_b7(*, num_classes: int = 1000, drop_rate: float = 0.0,
                    drop_path_rate: float = 0.0) -> EfficientNet:
    """EfficientNet-B7 (width 2.0, depth 3.1), 66.3M params."""
    return _efficientnet(2.0, 3.1, num_classes, drop_rate, drop_path_rate)
