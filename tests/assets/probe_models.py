"""Probe models for measurement tests: they report what the worker really gave them."""
import os

import torch
import torch.nn as nn


class ThreadsProbe(nn.Module):
    """Writes torch.get_num_threads() seen inside forward to $FUSEBENCH_TEST_THREADS_FILE."""
    input_size = (3, 8, 8)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        with open(os.environ["FUSEBENCH_TEST_THREADS_FILE"], "a") as f:
            f.write(f"{torch.get_num_threads()}\n")
        return self.fc(x.mean((2, 3)))


def threads_probe():
    return ThreadsProbe()


class WideMLP(nn.Module):
    """A step whose working set (tens of MB at batch 64) dwarfs RSS noise, for peak-memory
    tests: a big activation per layer, few parameters."""
    input_size = (64, 16, 16)

    def __init__(self, width: int = 1024):
        super().__init__()
        self.up = nn.Linear(256, width)
        self.act = nn.GELU()
        self.down = nn.Linear(width, 10)

    def forward(self, x):                           # (B, 64, 16, 16)
        h = self.act(self.up(x.flatten(2)))         # (B, 64, width)
        return self.down(h).mean(1)                 # (B, 10)


def wide_mlp():
    return WideMLP()


class AutocastProbe(nn.Module):
    """Writes the dtype its linear layer computes in (autocast's choice) to
    $FUSEBENCH_TEST_AUTOCAST_FILE."""
    input_size = (3, 8, 8)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        out = self.fc(x.mean((2, 3)))
        with open(os.environ["FUSEBENCH_TEST_AUTOCAST_FILE"], "a") as f:
            f.write(f"{str(out.dtype).replace('torch.', '')}\n")
        return out


def autocast_probe():
    return AutocastProbe()


class Distill(nn.Module):
    """A student trained against a teacher run under no_grad (knowledge distillation): the
    teacher's Parameters are trainable but get no gradient, in eager as in any mode."""

    def __init__(self):
        super().__init__()
        self.student = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))
        self.teacher = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))

    def forward(self, x):
        with torch.no_grad():
            soft = self.teacher(x).softmax(-1)
        return self.student(x) + soft

    def example_inputs(self, batch, device, dtype):
        return (torch.randn(batch, 16, device=device, dtype=dtype),)


def distill():
    return Distill()


class FixedSize(nn.Module):
    """A patch embedding that asserts the size it was built for (timm's ViT / Swin do):
    declares it with `fixed_input_size`, timm's name for it."""
    input_size = (3, 32, 32)
    fixed_input_size = True

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 8, stride=8)
        self.head = nn.Linear(8 * 16, 10)

    def forward(self, x):
        if x.shape[-2:] != (32, 32):
            raise ValueError(f"input {tuple(x.shape[-2:])} is not the model's 32x32")
        return self.head(self.patch(x).flatten(1))


def fixed_size():
    return FixedSize()


class ScalesInPlace(nn.Module):
    """Scales its input in place before its first layer (`x /= 255` in data-loading code
    moved into a model)."""
    input_size = (3, 8, 8)

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        x.mul_(0.5)
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).mean((1, 2))


def scales_in_place():
    return ScalesInPlace()


class LiveDropout(nn.Module):
    """A transformer-style MLP that trains with dropout on (HF BERT and GPT-2 default to 0.1),
    and a random op of its own in the forward (noise injection): the correctness check sees the
    same masks in eager and a mode only when both draw from aten's generator in one order."""
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 10)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.drop(torch.nn.functional.gelu(self.fc1(x)))
        if self.training:
            h = h + 1e-2 * torch.randn_like(h)
        return self.fc2(h)

    def example_inputs(self, batch, device, dtype):
        return (torch.randn(batch, 16, device=device, dtype=dtype),)


def live_dropout():
    return LiveDropout()
