"""`auto`: not a kernel of its own but a dispatcher to the device's best LN2d kernel: `triton` on
CUDA, `cpu` on CPU. (Called "fused" before; renamed because "fused" is the mode's name.)

`resolve(device)` names the impl that would really run, so callers (bench, the fuser) can record
it. If neither builds, `auto` is unavailable with the reason, and callers run `function` under
its own name with a fallback event. Called directly while unavailable, it warns (FallbackWarning,
which the worker records as an event) and runs `function`: never a silent fallback."""
from __future__ import annotations

import warnings

from fusebench.kernels.ln2d import cpu, function, triton
from fusebench.kernels.registry import register_impl

FALLBACK = "function"


class FallbackWarning(UserWarning):
    """The device's native kernel could not be used; a plain-torch implementation ran instead."""


def candidate(device) -> str:
    """The impl `auto` means on this device."""
    return "triton" if str(device).startswith("cuda") else "cpu"


def resolve(device, *, build: bool = True) -> tuple[str | None, str]:
    """(impl name, '') when the device's kernel is usable, else (None, reason). With build=True
    the cpu extension is built now (cached on disk) so a compile error shows up here."""
    name = candidate(device)
    mod = triton if name == "triton" else cpu
    ok, reason = mod.available(str(device))
    if ok and build and name == "cpu":
        ok, reason = cpu.build()
    return (name, "") if ok else (None, f"{name}: {reason}")


def available(device: str = "cpu") -> tuple[bool, str]:
    name, reason = resolve(device, build=False)
    return (True, "") if name else (False, reason)


_IMPLS = {"cpu": cpu.ln2d_cpu, "triton": triton.ln2d_triton}


@register_impl("ln2d", "auto", available=available)
def ln2d_auto(x, weight, bias, eps: float):
    """Dispatch to the device's kernel: triton on CUDA, cpu (C++/OpenMP) on CPU."""
    name, reason = resolve(x.device)
    if name is None:
        warnings.warn(f"ln2d auto unavailable ({reason}); ran '{FALLBACK}' instead",
                      FallbackWarning, stacklevel=2)
        return function.ln2d_function(x, weight, bias, eps)
    return _IMPLS[name](x, weight, bias, eps)
