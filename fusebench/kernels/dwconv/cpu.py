"""`cpu`: a depthwise KxK conv (K 3/5/7, stride 1/2, zero padding K//2) in C++/OpenMP (cpu.cpp)
on channels-last float32 / float64: forward, grad input and grad weight as separate calls, built
on first use and cached on disk. Which of the three run ours and which aten's is a `Passes`
choice per call: oneDNN's forward and grad input are often faster, its grad weight is not
(benchmarks/dwconv.py, docs/fused.md); fuse/fusions/dwconv.py picks per shape."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.dtypes import dtype_names
from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_dwconv_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64)
SIZES = (3, 5, 7)
STRIDES = (1, 2)

KERNEL = CppKernel(EXT_NAME, SOURCE, "the depthwise conv cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


@dataclass(frozen=True)
class Passes:
    """Which passes of one depthwise conv run our kernel (True) rather than aten's."""
    forward: bool = False
    input_grad: bool = True
    weight_grad: bool = True

    def any(self) -> bool:
        return self.forward or self.input_grad or self.weight_grad


ALL = Passes(True, True, True)


def supports(conv: nn.Conv2d) -> str:
    """'' if the kernel computes this conv exactly, else why not."""
    k, s = conv.kernel_size, conv.stride
    if not (conv.groups == conv.in_channels == conv.out_channels):
        return "not depthwise (groups != in == out channels)"
    if k[0] != k[1] or k[0] not in SIZES:
        return f"kernel {k} not square with K in {SIZES}"
    if s[0] != s[1] or s[0] not in STRIDES:
        return f"stride {s} not one of {STRIDES} in both dims"
    if conv.dilation != (1, 1):
        return "dilation != 1"
    # "same" at stride 1 and an odd K is K//2 on every side (HF transformers' depthwise convs)
    pad = (k[0] // 2, k[1] // 2) if conv.padding == "same" else conv.padding
    if pad != (k[0] // 2, k[1] // 2) or conv.padding_mode != "zeros":
        return "padding is not zero 'same' padding (K//2)"
    return ""


def reuse_blocks() -> bool:
    """Whether this build's forward and grad input load each input column once per block of
    outputs (AVX-512's registers: block_reuse in cpu.cpp), which made them faster than oneDNN's
    at 5x5 and 7x7 channels-last; AVX2 builds keep the per-tap loads."""
    return bool(extension().reuse_blocks())


def runs_on(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 4


def is_channels_last(x: torch.Tensor) -> bool:
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _aten_backward(dy, x, weight, stride, k, mask):
    """aten's passes in the dtype forward computed in, dy's: under autocast a bf16 input met
    the fp32 weight as autocast's bf16 copy (aten's CPU convolution backward takes no mixed
    dtypes on AVX2 machines), and each gradient goes back in its input's dtype, as autocast's
    own cast's backward gives it."""
    grads = torch.ops.aten.convolution_backward(
        dy, x.to(dy.dtype), weight.to(dy.dtype), None, [stride] * 2, [k // 2] * 2, [1, 1],
        False, [0, 0], weight.shape[0], mask)
    return tuple(g if g is None else g.to(t.dtype) for g, t in zip(grads, (x, weight, weight)))


def _like(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Ours come back channels-last; an NCHW model gets NCHW back (mixed layouts cost more)."""
    return t if is_channels_last(x) else t.contiguous()


class DwConvCpuFunction(torch.autograd.Function):
    """y = depthwise conv(x) with each pass from our kernel or aten's (`passes`). Saves x and
    weight, as aten does; or, given `recompute` (a callable with .tensors that rebuilds x from
    them, e.g. fuse/recompute.py's Recompute for a BN + act output), saves those tensors
    instead of x and rebuilds x in backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride: int, passes: Passes, recompute=None):
        k = weight.shape[-1]
        src = (x,) if recompute is None else recompute.tensors
        ctx.save_for_backward(weight, *src)
        ctx.has_bias, ctx.stride, ctx.passes, ctx.recompute = (bias is not None, stride, passes,
                                                               recompute)
        if passes.forward:
            return _like(extension().forward(x, weight, bias, stride), x)
        # where any pass is ours (x is then fp32 / fp64), in x's dtype as ours compute: under
        # autocast aten's conv would return bf16, and backward would get a bf16 dy beside the
        # saved fp32 x and weight (oneDNN has no such convolution backward on AVX2 CPUs, whose
        # rule runs this pass on aten's). All passes aten's: autocast's dtypes, as eager's
        with torch.autocast(x.device.type, enabled=False) if passes.any() else nullcontext():
            return F.conv2d(x, weight, bias, stride, k // 2, 1, weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        weight, *src = ctx.saved_tensors
        x = src[0] if ctx.recompute is None else ctx.recompute(*src)
        s, p, k = ctx.stride, ctx.passes, weight.shape[-1]
        need = ctx.needs_input_grad
        aten_mask = [need[0] and not p.input_grad, need[1] and not p.weight_grad,
                     need[2] and not p.weight_grad]
        dx, dw, db = (_aten_backward(dy, x, weight, s, k, aten_mask) if any(aten_mask)
                      else (None, None, None))
        if need[0] and p.input_grad:
            dx = _like(extension().backward_input(dy, x, weight, s), x)
        if (need[1] or need[2]) and p.weight_grad:
            dw, db = extension().backward_weight(dy, x, weight, s, ctx.has_bias)
        return dx, dw, db if ctx.has_bias else None, None, None, None


@register_impl("dwconv", "cpu", available=available, dtypes=dtype_names(DTYPES))
def dwconv_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               stride: int = 1, passes: Passes = ALL, recompute=None) -> torch.Tensor:
    """Depthwise conv (zero padding K//2) with our C++/OpenMP forward, grad input and grad
    weight on channels-last (`passes` hands any of them to aten); saves x and weight, or
    `recompute`'s tensors (DwConvCpuFunction)."""
    if not runs_on(x):
        raise TypeError(f"dwconv cpu: needs a 4-D CPU float32/float64 x, got {x.dtype} on "
                        f"{x.device}")
    return DwConvCpuFunction.apply(x, weight, bias, stride, passes, recompute)
