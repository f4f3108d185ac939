"""ResNets laid out like torchvision's (torchvision/models/resnet.py), written here from scratch
and shrunk for tests. What sets them apart: every residual block ends `bn -> out += identity ->
ReLU(inplace=True)`, the identity being the block input or a `downsample` Sequential of a
strided 1x1 conv and a BatchNorm2d; BasicBlock (two 3x3 convs) and Bottleneck (1x1 -> 3x3 ->
1x1, expansion 4, the stride on the 3x3 as in ResNet v1.5); a 7x7 stem with max pooling.
`spelling="functional"` writes the block end as `F.relu(torch.add(identity, out))` with the
norms' ReLUs as `F.relu` too (the spelling of many research repos). `depth`: 18, 50 or
"tiny" (Bottleneck blocks at small widths, for tests)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, planes, stride=1, downsample=None, functional=False):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, planes, stride), nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = conv3x3(planes, planes), nn.BatchNorm2d(planes)
        self.downsample, self.functional = downsample, functional

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        if self.functional:
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(torch.add(identity, self.bn2(self.conv2(out))))
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, planes, stride=1, downsample=None, functional=False):
        super().__init__()
        self.conv1, self.bn1 = conv1x1(cin, planes), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = conv3x3(planes, planes, stride), nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample, self.functional = downsample, functional

    def forward(self, x):
        identity = x
        if self.functional:
            out = F.relu(self.bn1(self.conv1(x)))
            out = F.relu(self.bn2(self.conv2(out)))
            if self.downsample is not None:
                identity = self.downsample(x)
            return F.relu(torch.add(identity, self.bn3(self.conv3(out))))
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, layers, widths=(64, 128, 256, 512), stem=64, num_classes=1000,
                 zero_init_residual=False, functional=False):
        super().__init__()
        self.inplanes, self.functional = stem, functional
        self.conv1 = nn.Conv2d(3, stem, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(stem), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], 2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], 2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # random norm parameters, not ones/zeros: a transposed broadcast must not hide
        g = torch.Generator().manual_seed(0)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.weight.copy_(1 + 0.3 * torch.randn(m.num_features, generator=g))
                    m.bias.copy_(0.3 * torch.randn(m.num_features, generator=g))
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (Bottleneck, BasicBlock)):
                    nn.init.zeros_((m.bn3 if isinstance(m, Bottleneck) else m.bn2).weight)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, self.functional)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, functional=self.functional)
                   for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# depth -> (block, blocks per stage, stage widths, stem width, classes)
DEPTHS = {18: (BasicBlock, (2, 2, 2, 2), (64, 128, 256, 512), 64, 1000),
          50: (Bottleneck, (3, 4, 6, 3), (64, 128, 256, 512), 64, 1000),
          "tiny": (Bottleneck, (2, 1, 1, 1), (4, 8, 8, 16), 8, 10),
          "tiny_basic": (BasicBlock, (2, 1, 1, 1), (8, 8, 16, 16), 8, 10)}


def make(depth="tiny", spelling="torchvision", zero_init_residual=False):
    block, layers, widths, stem, classes = DEPTHS[int(depth) if str(depth).isdigit() else depth]
    return ResNet(block, layers, widths, stem, classes, zero_init_residual,
                  functional=spelling == "functional")


make.input_size = (3, 64, 64)
