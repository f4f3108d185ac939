"""`cpu`: GroupNorm + act in C++/OpenMP (cpu.cpp), NCHW and channels-last, float32 / float64,
built on first use and cached on disk. `forward` / `backward` are the pure pair the fuser
composes; `gn_act_cpu` the registered impl (SiLU) `fusebench kernel gn_act` measures."""
from __future__ import annotations

from pathlib import Path

import torch

from fusebench.dtypes import dtype_names
from fusebench.kernels.bn_act.cpu import ACT_CODES
from fusebench.kernels.build import CppKernel
from fusebench.kernels.gn_act.function import gn_act_function_class
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_gn_act_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64)

KERNEL = CppKernel(EXT_NAME, SOURCE, "the gn_act cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def runs_on(x: torch.Tensor, groups: int) -> bool:
    """True where the kernel computes this x (else the caller runs aten's sequence)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 4 \
        and x.shape[1] % groups == 0 and x.numel() > 0


def forward(x, weight, bias, groups: int, eps: float, act: str):
    """(y, mean, rstd), mean / rstd (N, G)."""
    return tuple(extension().forward(x, weight, bias, int(groups), float(eps), ACT_CODES[act]))


def backward(dy, x, weight, bias, mean, rstd, groups: int, act: str):
    """(dx, dweight, dbias) from the saved x, mean, rstd (the GroupNorm output recomputed)."""
    return tuple(extension().backward(dy, x, weight, bias, mean, rstd, int(groups),
                                      ACT_CODES[act]))


GNActCpuFunction = gn_act_function_class(forward, backward, "GNActCpuFunction", once=True)


@register_impl("gn_act", "cpu", available=available, dtypes=dtype_names(DTYPES))
def gn_act_cpu(x, weight, bias, groups, eps: float):
    """C++/OpenMP: one stats pass + one write pass forward, two passes backward; saves x."""
    if not runs_on(x, int(groups)):
        raise TypeError(f"gn_act cpu: needs a 4-D CPU float32/float64 x whose C is divisible by "
                        f"groups={int(groups)}, got {x.dtype} {tuple(x.shape)} on {x.device}")
    return GNActCpuFunction.apply(x, weight, bias, int(groups), float(eps), "silu")
