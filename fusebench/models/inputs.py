"""What a model is called with: the positional args of one step.

Image models need nothing: a float (B, C, H, W) batch from `input_size` (the shortcut). Any other
model (token ids, masks, several tensors) provides

    example_inputs(batch_size, device, dtype) -> tuple of positional args

on the built model, on the factory function, or in the factory's module (first found wins).
`dtype` is the run dtype: float inputs should use it, integer inputs (token ids) ignore it.
The same args feed every mode, the correctness reference (float tensors cast to float64,
integers unchanged), the FLOP count and repro scripts (they replay the cell).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusebench.dtypes import dtype_name
from fusebench.errors import UsageError

HOOK = "example_inputs"


@dataclass(frozen=True)
class ModelInputs:
    args: tuple                      # positional args of model(*args)
    image_size: tuple[int, int, int] | None = None   # (C, H, W) when built from input_size

    def describe(self) -> str:
        """'int64[4, 16], float32[4, 5, 8]': what the model was given, for error messages."""
        return ", ".join(describe_arg(a) for a in self.args)

    def shapes(self) -> list:
        """JSON-able shapes ([C, H, W] for images, as records always had)."""
        if self.image_size is not None:
            return list(self.image_size)
        return [list(a.shape) if torch.is_tensor(a) else type(a).__name__ for a in self.args]

    def reference(self) -> tuple:
        """The args for a float64 reference: float tensors cast, integers unchanged."""
        return tuple(a.double() if torch.is_tensor(a) and a.is_floating_point() else a
                     for a in self.args)

    def perturbed(self, rel: float = 1e-3, seed: int = 0) -> "ModelInputs | None":
        """The same args with every float tensor moved by rel x its std of fixed noise (same
        dtype, device and layout); None when there is no float tensor to move (token ids)."""
        if not any(torch.is_tensor(a) and a.is_floating_point() for a in self.args):
            return None
        gen = torch.Generator().manual_seed(seed)

        def move(a):
            if not (torch.is_tensor(a) and a.is_floating_point()):
                return a
            noise = torch.randn(a.shape, generator=gen).to(a.device, a.dtype)
            return torch.empty_like(a).copy_(a + rel * a.float().std().to(a.dtype) * noise)
        return ModelInputs(tuple(move(a) for a in self.args), self.image_size)


def describe_arg(a) -> str:
    if torch.is_tensor(a):
        return f"{dtype_name(a.dtype)}{list(a.shape)}"
    return type(a).__name__


def find_hook(model: nn.Module | None, factory: Callable | None) -> Callable | None:
    """The model's, the factory's or the factory module's example_inputs, or None."""
    module = sys.modules.get(getattr(factory, "__module__", None) or "")
    for owner in (model, factory, module):
        fn = getattr(owner, HOOK, None) if owner is not None else None
        if callable(fn):
            return fn
    return None


def from_hook(name: str, fn: Callable, batch_size: int, device: torch.device,
              dtype: torch.dtype) -> ModelInputs:
    """Call a model's example_inputs; anything but a tensor or a tuple/list with a tensor in it
    is the user's mistake, said in one line."""
    try:
        got = fn(batch_size, device, dtype)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"model '{name}': {HOOK}({batch_size}, {device}, {dtype}) failed: "
                         f"{type(e).__name__}: {first}") from e
    args = (got,) if torch.is_tensor(got) else got
    if not isinstance(args, (tuple, list)) or not any(torch.is_tensor(a) for a in args):
        raise UsageError(f"model '{name}': {HOOK} must return a tensor or a tuple of positional "
                         f"args with at least one tensor, got {type(got).__name__}")
    return ModelInputs(tuple(a.to(device) if torch.is_tensor(a) else a for a in args))


def image_batch(size: tuple[int, int, int], batch_size: int, device: torch.device,
                dtype: torch.dtype, generator: torch.Generator,
                memory_format=torch.contiguous_format) -> ModelInputs:
    """A random float (B, C, H, W) batch, drawn on the CPU generator (same on every device)."""
    x = torch.randn(batch_size, *size, generator=generator).to(device, dtype)
    return ModelInputs((x.contiguous(memory_format=memory_format),), tuple(size))


def with_memory_format(inputs: ModelInputs, memory_format) -> ModelInputs:
    """Channels-last applies to 4-D float args only (token ids and masks keep their layout)."""
    return ModelInputs(tuple(a.contiguous(memory_format=memory_format)
                             if torch.is_tensor(a) and a.dim() == 4 and a.is_floating_point()
                             else a for a in inputs.args), inputs.image_size)


def annotate_call_error(e: BaseException, inputs: ModelInputs) -> None:
    """Append what the model was given to a failing call's message, in place: the exception
    keeps its type (OOM detection, error kinds) and traceback."""
    note = f" [model called with: {inputs.describe()}]"
    if e.args and isinstance(e.args[0], str) and note not in e.args[0]:
        first, sep, rest = e.args[0].partition("\n")
        e.args = (first + note + sep + rest, *e.args[1:])
