"""A PointNet classifier laid out as the common PyTorch ports of Qi et al. write it (our own
code, not copied): a T-Net predicting a 3x3 input transform and a 64x64 feature transform,
shared per-point MLPs as 1x1 Conv1d -> BatchNorm1d -> ReLU over (N, C, points), a max over the
points, and a head of Linear -> BatchNorm1d -> ReLU (-> Dropout) -> Linear.

`size="bench"` is the size benchmarks/pointnet.py times (1024 points, the paper's widths),
"tiny" the tests'."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"tiny": dict(points=24, widths=(8, 8, 16, 32), head=(16, 8), classes=5),
         "bench": dict(points=1024, widths=(64, 64, 128, 1024), head=(512, 256), classes=40)}


class TNet(nn.Module):
    """k x k transform from the points: per-point MLP, max, MLP, + identity."""

    def __init__(self, k, widths, head):
        super().__init__()
        self.k = k
        w1, w2, _, w4 = widths
        self.conv1, self.bn1 = nn.Conv1d(k, w1, 1), nn.BatchNorm1d(w1)
        self.conv2, self.bn2 = nn.Conv1d(w1, w2 * 2, 1), nn.BatchNorm1d(w2 * 2)
        self.conv3, self.bn3 = nn.Conv1d(w2 * 2, w4, 1), nn.BatchNorm1d(w4)
        self.fc1, self.bn4 = nn.Linear(w4, head[0]), nn.BatchNorm1d(head[0])
        self.fc2, self.bn5 = nn.Linear(head[0], head[1]), nn.BatchNorm1d(head[1])
        self.fc3 = nn.Linear(head[1], k * k)

    def forward(self, x):                          # (B, k, P)
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2, keepdim=True)[0].view(-1, self.conv3.out_channels)
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        eye = torch.eye(self.k, device=x.device, dtype=x.dtype).flatten()
        return (self.fc3(x) + eye).view(-1, self.k, self.k)


class PointNet(nn.Module):
    def __init__(self, points, widths, head, classes, dropout=0.3):
        super().__init__()
        self.points = points
        w1, w2, w3, w4 = widths
        self.stn = TNet(3, widths, head)
        self.conv1, self.bn1 = nn.Conv1d(3, w1, 1), nn.BatchNorm1d(w1)
        self.fstn = TNet(w1, widths, head)
        self.conv2, self.bn2 = nn.Conv1d(w1, w3, 1), nn.BatchNorm1d(w3)
        self.conv3, self.bn3 = nn.Conv1d(w3, w4, 1), nn.BatchNorm1d(w4)
        self.fc1, self.bn4 = nn.Linear(w4, head[0]), nn.BatchNorm1d(head[0])
        self.fc2, self.bn5 = nn.Linear(head[0], head[1]), nn.BatchNorm1d(head[1])
        self.dropout = nn.Dropout(dropout)
        self.fc3 = nn.Linear(head[1], classes)

    def forward(self, x):                          # (B, 3, P)
        x = torch.bmm(self.stn(x), x)              # the input transform, (B, 3, 3) @ (B, 3, P)
        x = F.relu(self.bn1(self.conv1(x)))
        x = torch.bmm(self.fstn(x), x)             # the feature transform
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        x = torch.max(x, 2)[0]
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.dropout(self.fc2(x))))
        return self.fc3(x)

    def example_inputs(self, batch_size: int, device, dtype):
        return (clouds(batch_size, self.points, device=device, dtype=dtype),)


def clouds(batch: int, points: int, device="cpu", dtype=torch.float32, seed=1):
    """A seeded batch of point clouds, (B, 3, points)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, points, generator=gen).to(device, dtype)


def make(size: str | None = None, **kw):
    return PointNet(**{**SIZES[size or "bench"], **kw})
