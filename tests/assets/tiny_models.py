"""Tiny user models for tests: `tests/assets/tiny_models.py:tiny_cnn` style specs."""
import warnings

import torch
import torch.nn as nn


class TinyCNN(nn.Module):
    input_size = (3, 16, 16)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):                       # (N, 3, H, W)
        x = torch.relu(self.bn(self.conv(x)))   # (N, 8, H, W)
        return self.fc(x.mean((2, 3)))          # (N, classes)


class GraphBreakCNN(TinyCNN):
    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        torch._dynamo.graph_break()             # deliberate: compile must report it
        return self.fc(x.mean((2, 3)))


class WarningCNN(TinyCNN):
    def forward(self, x):
        warnings.warn("tiny model warns every call", UserWarning)
        return super().forward(x)


def tiny_cnn(num_classes: int = 10):
    return TinyCNN(num_classes)


def graph_break_cnn():
    return GraphBreakCNN()


def warning_cnn():
    return WarningCNN()


def raising_factory():
    raise RuntimeError("factory exploded on purpose")


def not_a_module():
    return 42
