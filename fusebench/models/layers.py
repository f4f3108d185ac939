"""Reusable building blocks of the zoo models.

Each block is its own small nn.Module class with named children, because the fuser finds and
rewrites blocks by type (ConvBNAct, SqueezeExcite, ConvMlp, LayerNorm2d). Activations are
modules (nn.SiLU, nn.GELU), never bare functional calls, for the same reason.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fusebench.kernels import get_impl


def make_divisible(v: float, divisor: int = 8, round_limit: float = 0.9) -> int:
    """Round channels to a multiple of `divisor`, never going below round_limit * v."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:  # rounding down removed more than 10%: go one step up
        new_v += divisor
    return new_v


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel dim of an NCHW tensor, computed by a registered ln2d impl.

    `impl` names an implementation in the kernel registry (fusebench.kernels, family "ln2d");
    an unknown name is a UsageError listing the valid ones.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6, impl: str = "permute"):
        super().__init__()
        self.num_channels = num_channels
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.set_impl(impl)

    def set_impl(self, impl: str) -> None:
        self._fn = get_impl("ln2d", impl).fn    # resolved once; raises UsageError if unknown
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) -> (N, C, H, W)
        return self._fn(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, impl={self.impl}"


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample while training."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep  # rescale so the expectation is unchanged

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class ConvBNAct(nn.Module):
    """conv (no bias) -> BatchNorm -> SiLU (or Identity when act=False)."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, stride: int = 1,
                 groups: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride, padding=kernel_size // 2,
                              groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(out_chs)
        self.act = nn.SiLU() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class SqueezeExcite(nn.Module):
    """x * sigmoid(expand(silu(reduce(mean_hw(x))))) — channel gating."""

    def __init__(self, chs: int, rd_chs: int):
        super().__init__()
        self.conv_reduce = nn.Conv2d(chs, rd_chs, 1, bias=True)
        self.act = nn.SiLU()
        self.conv_expand = nn.Conv2d(rd_chs, chs, 1, bias=True)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)                      # (N, C, 1, 1)
        s = self.conv_expand(self.act(self.conv_reduce(s)))
        return x * self.gate(s)


class MBConv(nn.Module):
    """Inverted residual: [expand 1x1] -> depthwise kxk -> SE -> project 1x1 (+ residual)."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, stride: int,
                 expand_ratio: float, se_ratio: float = 0.25, drop_path: float = 0.0):
        super().__init__()
        mid_chs = make_divisible(in_chs * expand_ratio) if expand_ratio != 1 else in_chs
        self.conv_pw = ConvBNAct(in_chs, mid_chs, 1) if expand_ratio != 1 else nn.Identity()
        self.conv_dw = ConvBNAct(mid_chs, mid_chs, kernel_size, stride, groups=mid_chs)
        # SE width comes from the block's *input* channels, not the expanded ones
        self.se = SqueezeExcite(mid_chs, max(1, int(in_chs * se_ratio)))
        self.conv_pwl = ConvBNAct(mid_chs, out_chs, 1, act=False)
        self.has_skip = stride == 1 and in_chs == out_chs
        self.drop_path = DropPath(drop_path) if self.has_skip else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv_pwl(self.se(self.conv_dw(self.conv_pw(x))))
        return x + self.drop_path(y) if self.has_skip else y


class ConvMlp(nn.Module):
    """fc1 (1x1 conv, bias) -> GELU -> fc2 (1x1 conv, bias), all on NCHW."""

    def __init__(self, chs: int, hidden_chs: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Conv2d(chs, hidden_chs, 1, bias=True)
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Conv2d(hidden_chs, chs, 1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))
