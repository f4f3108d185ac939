"""The one dtype table: CLI name -> torch dtype and short label. torch is imported only when a
dtype object is asked for, so the CLI can build its choices without it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeInfo:
    name: str          # CLI / record name, also the torch attribute: torch.<name>
    short: str         # table label
    model: bool        # whole models run in it (`run --dtype`); kernels take every entry

    @property
    def torch(self):
        import torch
        return getattr(torch, self.name)


DTYPES: dict[str, DtypeInfo] = {d.name: d for d in (
    DtypeInfo("float32", "fp32", model=True),
    DtypeInfo("bfloat16", "bf16", model=True),
    DtypeInfo("float16", "fp16", model=True),
    DtypeInfo("float64", "fp64", model=False),
)}

MODEL_DTYPES = tuple(n for n, d in DTYPES.items() if d.model)
AMP_DTYPES = ("bfloat16", "float16")     # what torch.autocast computes in
AMP_DEFAULT = {"cpu": "bfloat16", "cuda": "float16"}   # per device type, when not chosen


def amp_dtype_name(chosen: str | None, device: str) -> str:
    """The dtype autocast runs in: the one chosen, else the device type's default."""
    return chosen or AMP_DEFAULT.get(device.split(":")[0], "bfloat16")


def dtype_name(d) -> str:
    """torch.float32 -> 'float32': the name specs, records and messages use."""
    return str(d).removeprefix("torch.")


def dtype_names(dtypes) -> tuple[str, ...]:
    """(torch.float32, ...) -> ('float32', ...)."""
    return tuple(dtype_name(d) for d in dtypes)


def torch_dtype(name: str):
    """'bfloat16' -> torch.bfloat16."""
    return DTYPES[name].torch
