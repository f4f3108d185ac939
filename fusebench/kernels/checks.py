"""Input checks shared by the kernel impls: a clear error instead of a wrong answer."""
from __future__ import annotations

import torch


def check_nchw(op: str, x: torch.Tensor, dtypes: tuple[torch.dtype, ...],
               max_c: int | None = None) -> None:
    if x.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: unsupported dtype {x.dtype} (supported: {names})")
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be 4-D (N, C, H, W), got {x.dim()}-D")
    if max_c is not None and x.shape[1] > max_c:
        raise ValueError(f"{op}: C={x.shape[1]} exceeds the {max_c} channels one program holds")
