"""An EfficientNet laid out like timm's (timm/models/_efficientnet_blocks.py, layers/norm_act.py,
layers/squeeze_excite.py), written here from scratch and shrunk for tests. What sets it apart
from torchvision's layout: the norm and its activation are one module, BatchNormAct2d, an
nn.BatchNorm2d subclass whose forward calls F.batch_norm itself (after counting the batch, as
nn.BatchNorm2d does) and then `drop` (an nn.Identity) and `act`; the SE is conv_reduce / act1
/ conv_expand / gate on `x.mean((2, 3), keepdim=True)`; the stem's block is a depthwise-
separable conv (depthwise, SE, pointwise, no expansion); the residual goes through
`drop_path` (an nn.Identity at rate 0). `momentum=None` gives every norm a cumulative average
(1 / batches seen), which the norm computes from its own counter."""
import torch.nn as nn
import torch.nn.functional as F


class BatchNormAct2d(nn.BatchNorm2d):
    def __init__(self, channels, apply_act=True, act_layer=nn.SiLU, momentum=0.1):
        super().__init__(channels, momentum=momentum)
        self.drop = nn.Identity()
        self.act = act_layer(inplace=True) if apply_act else nn.Identity()

    def forward(self, x):
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        x = F.batch_norm(x, self.running_mean if keep else None,
                         self.running_var if keep else None, self.weight, self.bias,
                         use_batch, factor, self.eps)
        return self.act(self.drop(x))


class SqueezeExcite(nn.Module):
    def __init__(self, channels, reduced, act_layer=nn.SiLU):
        super().__init__()
        self.conv_reduce = nn.Conv2d(channels, reduced, 1, bias=True)
        self.act1 = act_layer(inplace=True)
        self.conv_expand = nn.Conv2d(reduced, channels, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x):
        s = x.mean((2, 3), keepdim=True)
        s = self.conv_expand(self.act1(self.conv_reduce(s)))
        return x * self.gate(s)


class DepthwiseSeparableConv(nn.Module):
    def __init__(self, cin, cout, kernel, stride, norm):
        super().__init__()
        self.conv_dw = nn.Conv2d(cin, cin, kernel, stride, kernel // 2, groups=cin, bias=False)
        self.bn1 = norm(cin)
        self.se = SqueezeExcite(cin, max(1, cin // 4))
        self.conv_pw = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = norm(cout, apply_act=False)
        self.has_skip = stride == 1 and cin == cout
        self.drop_path = nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.bn2(self.conv_pw(self.se(self.bn1(self.conv_dw(x)))))
        return self.drop_path(x) + shortcut if self.has_skip else x


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, kernel, stride, expand, norm):
        super().__init__()
        mid = cin * expand
        self.conv_pw = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = norm(mid)
        self.conv_dw = nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False)
        self.bn2 = norm(mid)
        self.se = SqueezeExcite(mid, max(1, cin // 4))
        self.conv_pwl = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = norm(cout, apply_act=False)
        self.has_skip = stride == 1 and cin == cout
        self.drop_path = nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.bn1(self.conv_pw(x))
        x = self.bn2(self.conv_dw(x))
        x = self.bn3(self.conv_pwl(self.se(x)))
        return self.drop_path(x) + shortcut if self.has_skip else x


# (kernel, stride, expand, out, repeats) per stage; the first is depthwise-separable
STAGES = ((3, 1, 1, 8, 1), (3, 2, 4, 12, 2), (5, 2, 4, 16, 1))
# B0's own table (timm's efficientnet_b0 arch_def): for benchmarks at a real width
B0_STAGES = ((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
             (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1))
# size -> (stages, stem channels, head channels, classes)
SIZES = {"tiny": (STAGES, 8, 32, 10), "b0": (B0_STAGES, 32, 1280, 1000)}


class EfficientNet(nn.Module):
    def __init__(self, size="tiny", momentum=0.1):
        super().__init__()
        stages_table, stem, head, num_classes = SIZES[size]
        norm = lambda c, **kw: BatchNormAct2d(c, momentum=momentum, **kw)  # noqa: E731
        self.conv_stem = nn.Conv2d(3, stem, 3, 2, 1, bias=False)
        self.bn1 = norm(stem)
        stages, cin = [], stem
        for i, (k, s, e, cout, n) in enumerate(stages_table):
            blocks = []
            for j in range(n):
                stride = s if j == 0 else 1
                blocks.append(DepthwiseSeparableConv(cin, cout, k, stride, norm) if i == 0
                              else InvertedResidual(cin, cout, k, stride, e, norm))
                cin = cout
            stages.append(nn.Sequential(*blocks))
        self.blocks = nn.Sequential(*stages)
        self.conv_head = nn.Conv2d(cin, head, 1, bias=False)
        self.bn2 = norm(head)
        self.classifier = nn.Linear(head, num_classes)

    def forward(self, x):
        x = self.bn1(self.conv_stem(x))
        x = self.bn2(self.conv_head(self.blocks(x)))
        return self.classifier(x.mean((2, 3)))


def make(**kw):
    return EfficientNet(**kw)


def make_cumulative(**kw):
    return EfficientNet(momentum=None, **kw)
