"""`cpu`: BN(train) + act in C++/OpenMP (cpu.cpp), NCHW and channels-last, float32 / float64,
built on first use and cached on disk.

`forward` / `backward` are the pure pair the fuser composes (no autograd node of their own);
`bn_act_cpu` is the registered impl (SiLU, no running statistics) `fusebench kernel bn_act`
measures."""
from __future__ import annotations

from pathlib import Path

import torch

from fusebench.dtypes import dtype_names
from fusebench.kernels.build import CppKernel
from fusebench.kernels.bn_act.function import bn_act_function, bn_add_relu_function
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_bn_act_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64)
ACT_CODES = {"silu": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "identity": 4,  # cpu_math.h's
             "relu6": 5, "hardswish": 6}
# acts whose derivative at s reads off y = act(s) alike (y > 0; 0 < y < 6): a residual's
# backward may take the forward's output in place of the residual (`output=`)
FROM_OUTPUT = ("relu", "relu6")

KERNEL = CppKernel(EXT_NAME, SOURCE, "the bn_act cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def runs_on(x: torch.Tensor) -> bool:
    """True where the kernel computes this x (else the caller runs aten's sequence)."""
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 4 \
        and x.numel() > x.shape[1]


def forward(x, weight, bias, running_mean, running_var, momentum: float, eps: float,
            act: str, residual=None):
    """(y, mean, invstd); running_mean / running_var (or None) updated in place as aten does.
    With a residual r (x's shape): y = act(BN(x) + r), a residual block's end."""
    return tuple(extension().forward(x, weight, bias, running_mean, running_var,
                                     float(momentum), float(eps), ACT_CODES[act], residual))


def apply(x, weight, bias, mean, invstd, act: str, residual=None):
    """y = act(BN(x) [+ r]) from the saved (C,) mean / invstd: the forward's write pass alone."""
    return extension().apply(x, weight, bias, mean, invstd, ACT_CODES[act], residual)


def backward(dy, x, weight, bias, mean, invstd, act: str, residual=None, output=None):
    """(dx, dweight, dbias) from the saved x, mean, invstd (the BN output is recomputed); with
    the forward's residual r also dr (= dy * act'(BN(x) + r)): (dx, dweight, dbias, dr). For
    relu / relu6 the forward's output y may stand in for r (`output=y`: act' reads off y)."""
    return tuple(extension().backward(dy, x, weight, bias, mean, invstd, ACT_CODES[act],
                                      residual, output))


BNActCpuFunction = bn_act_function("BNActCpuFunction", forward, backward)


BNAddReLUCpuFunction = bn_add_relu_function("BNAddReLUCpuFunction", forward, backward)


@register_impl("bn_add_act", "cpu", available=available, dtypes=dtype_names(DTYPES))
def bn_add_act_cpu(x, residual, weight, bias, eps: float):
    """C++/OpenMP: the residual read in the write pass; backward's first pass stores g, r's
    gradient, which the dx pass reads; saves x and the output."""
    if not runs_on(x):
        raise TypeError(f"bn_add_act cpu: needs a 4-D CPU float32/float64 x with more than one "
                        f"value per channel, got {x.dtype} {tuple(x.shape)} on {x.device}")
    return BNAddReLUCpuFunction.apply(x, residual, weight, bias, eps)


@register_impl("bn_act", "cpu", available=available, dtypes=dtype_names(DTYPES))
def bn_act_cpu(x, weight, bias, eps: float):
    """C++/OpenMP: one stats pass + one write pass forward, two passes backward; saves x."""
    if not runs_on(x):
        raise TypeError(f"bn_act cpu: needs a 4-D CPU float32/float64 x with more than one "
                        f"value per channel, got {x.dtype} {tuple(x.shape)} on {x.device}")
    return BNActCpuFunction.apply(x, weight, bias, eps, "silu")
