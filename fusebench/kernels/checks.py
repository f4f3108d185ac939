"""Input checks shared by the kernel impls (a clear error instead of a wrong answer), and the
kernel cell's checks of what an impl's call did besides its numbers (call_violations)."""
from __future__ import annotations

import torch

from fusebench.dtypes import dtype_name, dtype_names


def check_nchw(op: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...],
               max_c: int | None = None) -> None:
    if x.dtype not in dtypes:
        names = ", ".join(dtype_names(dtypes))
        raise TypeError(f"{op}: unsupported dtype {x.dtype} (supported: {names})")
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be 4-D (N, C, H, W), got {x.dim()}-D")
    if max_c is not None and x.shape[1] > max_c:
        raise ValueError(f"{op}: C={x.shape[1]} exceeds the {max_c} channels one program holds")


def check_gate(x: torch.Tensor, g: torch.Tensor) -> None:
    """se_gate: gate logits (N, C, 1, 1) for an x (N, C, H, W)."""
    if x.dim() != 4 or tuple(g.shape) != (x.shape[0], x.shape[1], 1, 1):
        raise ValueError(f"se_gate: expected x (N, C, H, W) and gate_logits (N, C, 1, 1), got "
                         f"{tuple(x.shape)} and {tuple(g.shape)}")


GELU_APPROXIMATE = ("none", "tanh")


def check_bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    """bias_gelu: a (C,) bias for an x (N, C, H, W) and an approximation F.gelu knows."""
    if approximate not in GELU_APPROXIMATE:
        raise ValueError(f"bias_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if x.dim() != 4 or bias.dim() != 1 or bias.numel() != x.shape[1]:
        raise ValueError(f"bias_gelu: expected x (N, C, H, W) and bias (C,), got "
                         f"{tuple(x.shape)} and {tuple(bias.shape)}")


def call_violations(y, y_ref: torch.Tensor, inputs: dict[str, torch.Tensor],
                    after: dict[str, torch.Tensor]) -> list[str]:
    """What one call of an impl did wrong besides its numbers, for the correctness check: an
    output that is not a tensor, or of another dtype or shape than the reference's (in the
    input's dtype), and any input (x, a parameter) it modified in place. `inputs` are copies
    taken before the call, `after` the same tensors as the impl left them."""
    out = []
    if not torch.is_tensor(y):
        return [f"returned {type(y).__name__}, not a tensor"]
    want = inputs["x"].dtype
    if y.dtype != want:
        out.append(f"returned {dtype_name(y.dtype)}, expected {dtype_name(want)} "
                   f"(the input's dtype)")
    if tuple(y.shape) != tuple(y_ref.shape):
        out.append(f"returned shape {tuple(y.shape)}, expected {tuple(y_ref.shape)}")
    changed = [name for name, t in after.items()
               if not torch.equal(t.detach(), inputs[name])]
    if changed:
        out.append(f"modified its input{'s' if len(changed) > 1 else ''} "
                   f"{', '.join(changed)} in place")
    return out
