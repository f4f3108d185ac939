"""An EfficientNet laid out like torchvision's (torchvision/models/efficientnet.py and
ops/misc.py), written here from scratch and shrunk for tests: Conv2dNormActivation is an
nn.Sequential subclass (conv, BatchNorm2d, activation or none), SqueezeExcitation keeps
avgpool / fc1 / activation / fc2 / scale_activation and returns `scale * input`, MBConv is
expand -> depthwise -> SE -> project (no activation) with a residual when shapes allow.
`se_spelling="linear"` swaps the SE for one written with x.mean and nn.Linear layers, and
`act=nn.ReLU` / `nn.GELU` the activations, so the same layout exercises other spellings.
`make_v2` is EfficientNetV2's layout: its first stages FusedMBConv blocks (a full 3x3 conv ->
BN -> SiLU, then a 1x1 conv -> BN without an activation; one 3x3 conv -> BN -> SiLU where the
expand ratio is 1) with a residual where shapes allow, the later ones MBConv with an SE
squeezed to a quarter of the block's input channels."""
from functools import partial

import torch
import torch.nn as nn


class Conv2dNormActivation(nn.Sequential):
    def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1,
                 activation_layer=nn.SiLU):
        layers = [nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2,
                            groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True) if activation_layer is not nn.GELU
                          else activation_layer())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze, activation=nn.ReLU, scale_activation=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _scale(self, x):
        return self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))

    def forward(self, x):
        return self._scale(x) * x


class LinearSqueezeExcitation(nn.Module):
    """The same gate written with a spatial mean and Linear layers."""

    def __init__(self, channels, squeeze, activation=nn.ReLU):
        super().__init__()
        self.reduce, self.expand = nn.Linear(channels, squeeze), nn.Linear(squeeze, channels)
        self.activation = activation()

    def forward(self, x):
        s = self.expand(self.activation(self.reduce(x.mean((2, 3)))))
        return x * torch.sigmoid(s)[:, :, None, None]


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand_ratio, kernel, stride, act, se_cls):
        super().__init__()
        hidden = cin * expand_ratio
        layers = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(cin, hidden, 1, activation_layer=act))
        layers += [Conv2dNormActivation(hidden, hidden, kernel, stride, groups=hidden,
                                        activation_layer=act),
                   se_cls(hidden, max(1, cin // 4), activation=act),
                   Conv2dNormActivation(hidden, cout, 1, activation_layer=None)]
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res_connect else y


class FusedMBConv(nn.Module):
    def __init__(self, cin, cout, expand_ratio, kernel, stride, act, se_cls=None):
        super().__init__()
        hidden = cin * expand_ratio
        if expand_ratio != 1:
            layers = [Conv2dNormActivation(cin, hidden, kernel, stride, activation_layer=act),
                      Conv2dNormActivation(hidden, cout, 1, activation_layer=None)]
        else:
            layers = [Conv2dNormActivation(cin, cout, kernel, stride, activation_layer=act)]
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res_connect else y


# (expand ratio, kernel, stride, in, out, layers), a shrunk B0 table
STAGES = ((1, 3, 1, 8, 8, 1), (4, 3, 2, 8, 12, 2), (4, 5, 2, 12, 16, 1))
# B0's own table (torchvision's efficientnet_b0): for benchmarks at a real width
B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
             (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
             (6, 3, 1, 192, 320, 1))


# EfficientNetV2's: (block, expand ratio, kernel, stride, in, out, layers), shrunk; V2-S's own
V2_STAGES = ((FusedMBConv, 1, 3, 1, 8, 8, 1), (FusedMBConv, 4, 3, 2, 8, 12, 2),
             (MBConv, 4, 3, 2, 12, 16, 2))
V2_S_STAGES = ((FusedMBConv, 1, 3, 1, 24, 24, 2), (FusedMBConv, 4, 3, 2, 24, 48, 4),
               (FusedMBConv, 4, 3, 2, 48, 64, 4), (MBConv, 4, 3, 2, 64, 128, 6),
               (MBConv, 6, 3, 1, 128, 160, 9), (MBConv, 6, 3, 2, 160, 256, 15))


class EfficientNet(nn.Module):
    def __init__(self, num_classes=10, act=nn.SiLU, se_spelling="conv", stages=STAGES,
                 head=64):
        super().__init__()
        se_cls = SqueezeExcitation if se_spelling == "conv" else LinearSqueezeExcitation
        stages = [st if isinstance(st[0], type) else (MBConv, *st) for st in stages]
        layers = [Conv2dNormActivation(3, stages[0][4], 3, 2, activation_layer=act)]
        for block, e, k, s, cin, cout, n in stages:
            layers.append(nn.Sequential(*[block(cin if i == 0 else cout, cout, e, k,
                                                s if i == 0 else 1, act, se_cls)
                                          for i in range(n)]))
        layers.append(Conv2dNormActivation(stages[-1][5], head, 1, activation_layer=act))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.0), nn.Linear(head, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def make(**kw):
    return EfficientNet(**kw)


make_relu_linear_se = partial(make, act=nn.ReLU, se_spelling="linear")


def make_b0(**kw):
    """The same layout at B0's widths and depths, 1000 classes (benchmarks/fusion_ab.py)."""
    return EfficientNet(**{"num_classes": 1000, "stages": B0_STAGES, "head": 1280, **kw})


def make_v2(size: str = "tiny", **kw):
    """EfficientNetV2's layout: shrunk ("tiny"), or V2-S's stages and head, 1000 classes."""
    if size == "s":
        kw = {"num_classes": 1000, "stages": V2_S_STAGES, "head": 1280, **kw}
    return EfficientNet(**{"stages": V2_STAGES, **kw})
