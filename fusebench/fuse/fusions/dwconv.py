"""dwconv (train, CPU): depthwise 3x3/5x5/7x7 conv (stride 1 or 2, zero padding K//2) -> a conv
whose passes come from kernels.dwconv's C++ kernel where it was measured faster than aten's
(oneDNN) and from aten elsewhere, chosen per call from the layout and shape (`passes_for`).

Measured by benchmarks/dwconv.py (every depthwise conv of efficientnet_b0, batch 8, 160 px)
on a quiet machine (load ~1: the benchmark itself), 1 and 2 threads, interleaved in one
process, on the 2-vCPU AMD EPYC (AVX2) VM, 2026-12-01 (fifth session); ratios aten time / ours:
  - 3x3, every pass, both layouts, both thread counts: oneDNN's is faster (forward 0.26-0.71,
    grad input 0.32-0.75, grad weight 0.24-0.78; the whole backward 0.27-0.73; aten's grad
    input + our grad weight 0.36-0.89): aten keeps all of it, with a warning.
  - 5x5: our grad weight 1.0-1.9x (channels-last) and 1.9-4.4x (NCHW: aten's NCHW 5x5 weight
    grad is slow here); forward and grad input stay oneDNN's (ours 0.2-0.8x), and ours + theirs
    beats our whole backward at stride 2 too (1.17-1.32 vs 0.97-1.06 channels-last).
  An earlier table (fourth session) measured at 2 threads under load 5-7 had ours ahead at 3x3:
  oneDNN's OpenMP passes slow down more than ours when another process takes a core, so a
  busy machine favoured ours. Quiet, it does not.
A 3x3 site still runs as a FusedDepthwiseConv when its input is a fused BN + act's output
(fuse/recompute.py): aten's passes, but its input is rebuilt in backward instead of saved.
  - 7x7 (ConvNeXt's; convnext_atto's four shapes, 8x40x40x40 .. 8x320x5x5, sixth session, same
    machine, quiet): our grad weight 0.9-1.5x channels-last at 40..160 channels, 8.5-9.6x at
    320@5x5, 2.9-4.0x NCHW; our grad input 0.34-0.57x, so our whole backward (what 7x7 ran until
    then) lost to oneDNN's in channels-last (0.63-0.85x), the layout ConvNeXt's residual stream
    has. Aten's grad input + our grad weight: 0.92-1.15x channels-last at 40..160, 5.0x at 320,
    2.4-3.3x NCHW.
  - Thirty-sixth session (Intel Xeon VM, 2 threads, channels-last, 160 px), after our weight
    gradient's rework (1.3-2.4x faster per call at 7x7, 1.05-1.2x at 5x5): aten's grad input +
    ours 3.3-4.9x aten's backward at 5x5, 0.71-1.08x at 3x3 (most within 1.0-1.08x, noise
    here): the rule stands.
  - Forty-second session (Intel Xeon VM with AVX-512, family 6 model 167, 160 px, quiet): our
    forward and grad input load each input column once per 8 outputs there (`block_reuse`,
    AVX-512 builds only: `cpu.reuse_blocks()`), and beat oneDNN's in channels-last, 2 threads
    then 1: 7x7 (ConvNeXt-atto's four shapes) forward 1.32-1.69x, 1.19-1.56x, grad input
    1.72-2.28x, 1.50-2.27x; 5x5 (EfficientNet-B0/B3's) forward 0.97-1.40x, 0.93-1.47x, grad
    input 1.09-1.83x, 1.21-1.77x. So on such a build channels-last 5x5 and 7x7 run all three
    passes ours. NCHW input keeps oneDNN's forward and grad input (ours converts to
    channels-last and back: 5x5 forward 0.52-0.94x, 7x7 0.95-1.30x; fused mode runs
    ConvNeXt channels-last inside anyway). 3x3 stays aten's: forward 0.90-1.57x,
    whole backward 0.78-1.86x, a mix of wins and losses across shapes and thread counts.
Rerun the benchmark on a quiet machine before changing passes_for."""
from __future__ import annotations

import functools
import warnings
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.recompute import recipe_of
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.dwconv import cpu
from fusebench.kernels.dwconv.cpu import ALL, Passes

GRAD_WEIGHT = Passes(forward=False, input_grad=False, weight_grad=True)
ATEN = Passes(False, False, False)


# conv shape -> the passes it ran (what fused mode reports: per shape, as gemm's race line)
_taken: dict[tuple, Passes] = {}
SAYS = {ALL: "all three passes ours", GRAD_WEIGHT: "our grad weight with oneDNN's forward and "
        "grad input", ATEN: "oneDNN's three"}


def passes_for(channels_last: bool, k: int, stride: int, h: int, w: int) -> Passes:
    """The measured rule (module docstring) for this build (`cpu.reuse_blocks()`)."""
    return _rule(channels_last, k, stride, h, w, cpu.reuse_blocks())


@functools.cache
def _rule(channels_last: bool, k: int, stride: int, h: int, w: int, reuse: bool) -> Passes:
    """passes_for's, per shape and build flag; says once per shape when aten keeps all of it."""
    if k in (5, 7):              # our grad weight 0.9-9.6x oneDNN's (quiet, 1 and 2 threads)
        passes = ALL if channels_last and reuse else GRAD_WEIGHT
    else:
        why = ("ours per pass are 0.65-2.2x its speed, and no faster over a train step "
               "(EfficientNet-B0 1.000-1.004x, docs/kernels.md)") if reuse \
            else "oneDNN's passes measured faster than ours (benchmarks/dwconv.py, quiet)"
        warnings.warn(f"dwconv: aten's depthwise conv kept for {k}x{k} stride {stride} at "
                      f"{h}x{w} ({'channels-last' if channels_last else 'NCHW'}): {why}",
                      stacklevel=3)
        passes = ATEN
    _taken[(channels_last, k, stride, h, w)] = passes
    return passes


def describe() -> str | None:
    """The event line: which passes the depthwise conv shapes called so far ran, and the
    build the rule read (None before a call)."""
    if not _taken:
        return None
    counts = Counter(_taken.values())
    build = "AVX-512 column-reuse build" if cpu.reuse_blocks() else "build without AVX-512"
    return (f"dwconv: of {len(_taken)} conv shapes, "
            + ", ".join(f"{SAYS[p]} at {counts[p]}" for p in SAYS if counts[p])
            + f" ({build}; fuse/fusions/dwconv.py passes_for)")


class FusedDepthwiseConv(FusedModule):
    """Depthwise conv with each pass from fusebench's C++ kernel or aten's (`passes_for`).
    Same Parameters under the same names (weight, bias) as the nn.Conv2d it replaces."""
    fusion = "dwconv"

    def __init__(self, src: nn.Conv2d):
        super().__init__()
        self.in_channels, self.kernel_size = src.in_channels, src.kernel_size
        self.stride = src.stride[0]
        self.weight, self.bias = src.weight, src.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size[0]
        if not cpu.runs_on(x):
            # e.g. bf16 under autocast: aten runs, and says so (captured as a warning event)
            warnings.warn(f"dwconv: the C++ kernel takes float32/float64 CPU input, got "
                          f"{x.dtype} on {x.device}; ran aten's depthwise conv instead",
                          stacklevel=2)
            passes = ATEN
        else:
            passes = passes_for(cpu.is_channels_last(x), k, self.stride, *x.shape[2:])
        recipe = recipe_of(x, "dwconv") if x.device.type == "cpu" else None
        if not passes.any() and recipe is None:
            return F.conv2d(x, self.weight, self.bias, self.stride, k // 2, 1, self.in_channels)
        # an input a fused BN + act tagged (fuse/recompute.py): saved as that BN's input and
        # statistics, rebuilt in backward, instead of kept
        return cpu.DwConvCpuFunction.apply(x, self.weight, self.bias, self.stride, passes,
                                           recipe)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, kernel_size={self.kernel_size}, stride={self.stride}"


@register_fusion("dwconv", nn.Conv2d, benches=("train",))
def dwconv(m: nn.Conv2d, ctx: FuseContext):
    """Depthwise 3x3/5x5/7x7 conv (stride 1/2, padding K//2) -> the C++ kernel's passes (CPU)
    where they were measured faster, aten's elsewhere."""
    if not ctx.device.startswith("cpu") or not _is_depthwise(m):
        return None
    reason = cpu.supports(m)
    if reason:
        ctx.notes.append(("not_fused", f"dwconv: depthwise conv left to aten: {reason}"))
        return None
    if ctx.dwconv is None:                 # build (or fail) once per fuse(), not per site
        ok, why = cpu.build()
        ctx.dwconv = ok
        if not ok:
            ctx.notes.append(("kernel_fallback", f"dwconv cpu unavailable ({why}); "
                                                 f"depthwise convs left to aten"))
    return FusedDepthwiseConv(m) if ctx.dwconv else None


def _is_depthwise(m: nn.Conv2d) -> bool:
    return m.groups == m.in_channels == m.out_channels > 1
