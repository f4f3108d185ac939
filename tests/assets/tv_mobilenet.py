"""MobileNetV2 and MobileNetV3 laid out like torchvision's (torchvision/models/mobilenetv2.py,
mobilenetv3.py, ops/misc.py), written here from scratch and shrunk for tests. What sets them
apart from the EfficientNets: every conv-norm-activation is an nn.Sequential of Conv2d,
BatchNorm2d and an in-place ReLU6 (V2) or Hardswish / ReLU (V3); V2 has no SE; V3's SE is
torchvision's SqueezeExcitation with a Hardsigmoid gate and a ReLU in between, and its norms
take eps=0.001, momentum=0.01; the classifier is Linear -> Hardswish -> Dropout -> Linear (V3)
or Dropout -> Linear (V2), at p = 0 here (a live dropout draws different masks in the fused
and eager copies). `size="full"`: the published widths (V2 1.0, V3-Small)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_norm_act(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU6, eps=1e-5, momentum=0.1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups,
                                   bias=False),
                         nn.BatchNorm2d(cout, eps=eps, momentum=momentum), act(inplace=True))


class InvertedResidual(nn.Module):        # V2: expand (1x1) -> depthwise -> linear project
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        mid = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = [conv_norm_act(cin, mid, 1)] if expand != 1 else []
        layers += [conv_norm_act(mid, mid, 3, stride, mid),
                   nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


# (expand t, channels c, repeats n, first stride s)
V2_TINY = ((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 1, 2))
V2_FULL = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1))
V2_SIZES = {"tiny": (V2_TINY, 8, 32, 10), "full": (V2_FULL, 32, 1280, 1000)}


class MobileNetV2(nn.Module):
    def __init__(self, size="tiny", dropout=0.0):
        super().__init__()
        table, stem, last, classes = V2_SIZES[size]
        layers, cin = [conv_norm_act(3, stem, stride=2)], stem
        for t, c, n, s in table:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_norm_act(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, classes))

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return self.scale_activation(scale) * x


def _squeeze(c):                          # a quarter, rounded to a multiple of 8
    return max(8, int(c / 4 + 4) // 8 * 8)


class V3Block(nn.Module):
    def __init__(self, cin, k, mid, cout, se, act, stride):
        super().__init__()
        def cna(i, o, kk, s=1, g=1):
            return conv_norm_act(i, o, kk, s, g, act, 1e-3, 0.01)
        layers = [cna(cin, mid, 1)] if mid != cin else []
        layers.append(cna(mid, mid, k, stride, mid))
        if se:
            layers.append(SqueezeExcitation(mid, _squeeze(mid)))
        layers += [nn.Conv2d(mid, cout, 1, bias=False),
                   nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)]
        self.block = nn.Sequential(*layers)
        self.use_res_connect = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res_connect else y


RE, HS = nn.ReLU, nn.Hardswish
# (kernel, expanded, out, SE, activation, stride)
V3_TINY = ((3, 8, 8, True, RE, 2), (3, 32, 12, False, RE, 2), (5, 48, 12, True, HS, 1))
V3_SMALL = ((3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
            (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
            (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
            (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1))
V3_SIZES = {"tiny": (V3_TINY, 8, 48, 32, 10), "full": (V3_SMALL, 16, 576, 1024, 1000)}


class MobileNetV3(nn.Module):
    def __init__(self, size="tiny", dropout=0.0):
        super().__init__()
        table, stem, last, hidden, classes = V3_SIZES[size]
        layers = [conv_norm_act(3, stem, 3, 2, act=HS, eps=1e-3, momentum=0.01)]
        cin = stem
        for k, mid, cout, se, act, s in table:
            layers.append(V3Block(cin, k, mid, cout, se, act, s))
            cin = cout
        layers.append(conv_norm_act(cin, last, 1, act=HS, eps=1e-3, momentum=0.01))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(last, hidden), nn.Hardswish(inplace=True),
                                        nn.Dropout(dropout), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def make_v2(**kw):
    return MobileNetV2(**kw)


def make_v3(**kw):
    return MobileNetV3(**kw)


# MobileNetV3 as code from before torch had nn.Hardswish writes it (and many copies since):
# the activations as small modules with their own forward, the SE on Linear layers.
class HSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU6(inplace=True)

    def forward(self, x):
        return self.relu(x + 3) / 6


class HSwish(nn.Module):
    def __init__(self):
        super().__init__()
        self.sigmoid = HSigmoid()

    def forward(self, x):
        return x * self.sigmoid(x)


class LinearSE(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Linear(channels, squeeze), nn.ReLU(inplace=True),
                                nn.Linear(squeeze, channels), HSigmoid())

    def forward(self, x):
        b, c, _, _ = x.size()
        y = self.fc(self.avg_pool(x).view(b, c)).view(b, c, 1, 1)
        return x * y


class WrittenOutBlock(nn.Module):
    def __init__(self, cin, mid, cout, k=3):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), HSwish(),
            nn.Conv2d(mid, mid, k, 1, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid),
            LinearSE(mid, _squeeze(mid)), HSwish(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.conv(x)


class WrittenOutV3(nn.Module):
    """Stem, two blocks, head: HSwish after every BN but the projections'."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  HSwish())
        self.blocks = nn.Sequential(WrittenOutBlock(16, 48, 16), WrittenOutBlock(16, 64, 16, 5))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def make_written_out(**kw):
    return WrittenOutV3(**kw)
