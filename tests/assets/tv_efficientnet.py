"""An EfficientNet laid out like torchvision's (torchvision/models/efficientnet.py and
ops/misc.py), written here from scratch and shrunk for tests: Conv2dNormActivation is an
nn.Sequential subclass (conv, BatchNorm2d, activation or none), SqueezeExcitation keeps
avgpool / fc1 / activation / fc2 / scale_activation and returns `scale * input`, MBConv is
expand -> depthwise -> SE -> project (no activation) with a residual when shapes allow.
`se_spelling="linear"` swaps the SE for one written with x.mean and nn.Linear layers, and
`act=nn.ReLU` / `nn.GELU` the activations, so the same layout exercises other spellings."""
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


# (expand ratio, kernel, stride, in, out, layers), a shrunk B0 table
STAGES = ((1, 3, 1, 8, 8, 1), (4, 3, 2, 8, 12, 2), (4, 5, 2, 12, 16, 1))
# B0's own table (torchvision's efficientnet_b0): for benchmarks at a real width
B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
             (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
             (6, 3, 1, 192, 320, 1))


class EfficientNet(nn.Module):
    def __init__(self, num_classes=10, act=nn.SiLU, se_spelling="conv", stages=STAGES,
                 head=64):
        super().__init__()
        se_cls = SqueezeExcitation if se_spelling == "conv" else LinearSqueezeExcitation
        layers = [Conv2dNormActivation(3, stages[0][3], 3, 2, activation_layer=act)]
        for e, k, s, cin, cout, n in stages:
            layers.append(nn.Sequential(*[MBConv(cin if i == 0 else cout, cout, e, k,
                                                 s if i == 0 else 1, act, se_cls)
                                          for i in range(n)]))
        layers.append(Conv2dNormActivation(stages[-1][4], head, 1, activation_layer=act))
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
