"""Model size and work: parameter count, forward GFLOPs per sample, train-step FLOPs.

Every FLOP count in fusebench goes through `flop_counter()`: torch.utils.flop_counter with one
formula replaced (see `conv_backward_flops`)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count


def count_params(model: nn.Module) -> int:
    """All parameters (trainable or not); shared parameters count once."""
    return sum(p.numel() for p in model.parameters())


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation,
                        transposed, _output_padding, _groups, output_mask, out_shape=None,
                        **kwargs) -> int:
    """FLOPs of aten.convolution_backward: each multiply-add of the forward conv becomes one
    multiply-add in grad_input and one in grad_weight, so each requested gradient costs exactly
    the forward's FLOPs. torch's own formula (2.13) computes grad_weight as a dense conv and
    ignores `groups` there, counting a depthwise conv's backward ~(groups+1)x its forward."""
    # grad_out has the forward output's shape; w_shape already holds C_in/groups (or C_out/groups
    # for a transposed conv), which is how the forward count accounts for groups
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode with fusebench's corrected formulas. Counts a multiply-add as 2 FLOPs;
    only ops with a formula count (matmul, conv, attention); elementwise ops, norms and pooling
    count 0, as in every common FLOP counter."""
    return FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: conv_backward_flops})


def forward_gflops_per_sample(model: nn.Module, *example_inputs) -> float:
    """Forward FLOPs / batch size / 1e9 (batch = first dimension of the first input)."""
    batch = example_inputs[0].shape[0] if example_inputs and example_inputs[0].dim() else 0
    if batch < 1:
        raise ValueError("example_input needs a batch dimension of at least 1")
    counter = flop_counter()
    with torch.no_grad(), counter:
        model(*example_inputs)
    return counter.get_total_flops() / batch / 1e9


def step_flops(forward: Callable[[], torch.Tensor],
               backward: Callable[[torch.Tensor], None] | None) -> tuple[int, int]:
    """(forward FLOPs, whole-step FLOPs) of one step: `forward()` returns what `backward`
    (None for inference) takes, e.g. the loss."""
    with flop_counter() as fc:
        out = forward()
        fwd = fc.get_total_flops()
        if backward is not None:
            backward(out)
    return fwd, fc.get_total_flops()
