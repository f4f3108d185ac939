"""The glu family's native impls: `cpu` (C++/OpenMP, kernels/act/cpu.cpp) and `triton`
(kernels/act/_triton_kernels.py), each an autograd.Function over its pure pair saving a and b
only; one pass per direction (backward writes da and db from one read of dp, a and b)."""
from __future__ import annotations

from fusebench.kernels.act import cpu, triton
from fusebench.kernels.glu.function import checked_act, glu_function
from fusebench.kernels.registry import register_impl

CODES = triton.GLU_CODES     # cpu_math.h's ActCode, which the Triton kernels use too


def glu_cpu_fwd(a, b, act: str = "silu"):
    return cpu.extension().glu_forward(a, b, CODES[act])


def glu_cpu_bwd(dp, a, b, act: str = "silu", want_p: bool = False):
    return tuple(cpu.extension().glu_backward(dp, a, b, CODES[act], want_p))


def glu_packed_cpu_fwd(ab, act: str = "silu", gate_second: bool = False):
    return cpu.extension().glu_packed_forward(ab, CODES[act], gate_second)


def glu_packed_cpu_bwd(dp, ab, act: str = "silu", gate_second: bool = False,
                       want_p: bool = False):
    return tuple(cpu.extension().glu_packed_backward(dp, ab, CODES[act], gate_second,
                                                     want_p))


_CPU = glu_function(glu_cpu_fwd, glu_cpu_bwd, "GLUCpuFunction", once=True)
_TRITON = glu_function(triton.glu_triton_fwd, triton.glu_triton_bwd, "GLUTritonFunction",
                       once=True)


@register_impl("glu", "cpu", available=cpu.available)
def glu_cpu(a, b, act: str = "silu"):
    """C++/OpenMP: one pass per direction; saves a and b."""
    if a.dtype not in cpu.DTYPES or a.device.type != "cpu":
        raise TypeError(f"glu cpu: unsupported dtype {a.dtype} on {a.device.type} (CPU "
                        f"{', '.join(str(d).replace('torch.', '') for d in cpu.DTYPES)})")
    return _CPU.apply(a, b, checked_act(act))


@register_impl("glu", "triton", available=triton.available)
def glu_triton(a, b, act: str = "silu"):
    """Triton: one elementwise program per block, each direction one launch; saves a and b."""
    return _TRITON.apply(a, b, checked_act(act))
