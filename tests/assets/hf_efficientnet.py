"""An EfficientNet laid out like HF transformers' (transformers/models/efficientnet/
modeling_efficientnet.py), written here from scratch and shrunk for tests. What sets it apart
from torchvision's and timm's layouts: every 1x1 conv says `padding="same"`; the depthwise
conv is an nn.Conv2d subclass that only sets defaults (groups = channels), with "same"
padding at stride 1 and, at stride 2, "valid" padding after an asymmetric nn.ZeroPad2d; the
stem pads (0, 1, 0, 1) the same way; the SE multiplies with `torch.mul(inputs, gate)`; the
norms take HF's `momentum=0.99` as given (PyTorch reads it as the new batch's weight); the
residual comes after the projection's BN through a dropout (p = 0 here)."""
import torch
import torch.nn as nn


class DepthwiseConv2d(nn.Conv2d):
    def __init__(self, channels, kernel_size, stride, padding):
        super().__init__(channels, channels, kernel_size, stride, padding, groups=channels,
                         bias=False)


def _bn(c):
    return nn.BatchNorm2d(c, eps=1e-3, momentum=0.99)


class SqueezeExcite(nn.Module):
    def __init__(self, dim, dim_se):
        super().__init__()
        self.squeeze = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(dim, dim_se, 1, padding="same")
        self.expand = nn.Conv2d(dim_se, dim, 1, padding="same")
        self.act_reduce, self.act_expand = nn.SiLU(), nn.Sigmoid()

    def forward(self, hidden):
        inputs = hidden
        hidden = self.act_reduce(self.reduce(self.squeeze(hidden)))
        return torch.mul(inputs, self.act_expand(self.expand(hidden)))


class Block(nn.Module):
    def __init__(self, cin, cout, kernel, stride, expand_ratio):
        super().__init__()
        mid = cin * expand_ratio
        self.expand = expand_ratio != 1
        if self.expand:
            self.expand_conv = nn.Conv2d(cin, mid, 1, padding="same", bias=False)
            self.expand_bn, self.expand_act = _bn(mid), nn.SiLU()
        self.stride = stride
        lo = kernel // 2 - (1 if stride == 2 else 0)
        self.depthwise_conv_pad = nn.ZeroPad2d((lo, kernel // 2, lo, kernel // 2))
        self.depthwise_conv = DepthwiseConv2d(mid, kernel, stride,
                                              "valid" if stride == 2 else "same")
        self.depthwise_norm, self.depthwise_act = _bn(mid), nn.SiLU()
        self.squeeze_excite = SqueezeExcite(mid, max(1, int(cin * 0.25)))
        self.project_conv = nn.Conv2d(mid, cout, 1, padding="same", bias=False)
        self.project_bn = _bn(cout)
        self.dropout = nn.Dropout(0.0)
        self.skip = stride == 1 and cin == cout

    def forward(self, x):
        hidden = x
        if self.expand:
            hidden = self.expand_act(self.expand_bn(self.expand_conv(hidden)))
        if self.stride == 2:
            hidden = self.depthwise_conv_pad(hidden)
        hidden = self.depthwise_act(self.depthwise_norm(self.depthwise_conv(hidden)))
        hidden = self.project_bn(self.project_conv(self.squeeze_excite(hidden)))
        return self.dropout(hidden) + x if self.skip else hidden


# (expand ratio, kernel, stride, in, out, repeats) per stage
STAGES = ((1, 3, 1, 8, 8, 1), (4, 3, 2, 8, 12, 2), (4, 5, 2, 12, 16, 1))
B0_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
             (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
             (6, 3, 1, 192, 320, 1))
# size -> (stages, head channels, classes)
SIZES = {"tiny": (STAGES, 32, 10), "b0": (B0_STAGES, 1280, 1000)}


class EfficientNet(nn.Module):
    def __init__(self, size="tiny"):
        super().__init__()
        stages, head, num_classes = SIZES[size]
        stem = stages[0][3]
        self.padding = nn.ZeroPad2d((0, 1, 0, 1))
        self.convolution = nn.Conv2d(3, stem, 3, 2, padding="valid", bias=False)
        self.batchnorm, self.activation = _bn(stem), nn.SiLU()
        blocks = []
        for e, k, s, cin, cout, n in stages:
            for j in range(n):
                blocks.append(Block(cin if j == 0 else cout, cout, k, s if j == 0 else 1, e))
        self.blocks = nn.ModuleList(blocks)
        cin = stages[-1][4]
        self.top_conv = nn.Conv2d(cin, head, 1, padding="same", bias=False)
        self.top_bn, self.top_act = _bn(head), nn.SiLU()
        self.classifier = nn.Linear(head, num_classes)

    def forward(self, pixel_values):
        x = self.activation(self.batchnorm(self.convolution(self.padding(pixel_values))))
        for block in self.blocks:
            x = block(x)
        x = self.top_act(self.top_bn(self.top_conv(x)))
        return self.classifier(x.mean((2, 3)))


def make(**kw):
    return EfficientNet(**kw)
