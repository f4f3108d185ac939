"""Model registry: @register_model factories, glob listing, default input sizes."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusebench.errors import first_line
from fusebench.registry import Registry


@dataclass(frozen=True)
class ModelInfo:
    name: str
    factory: Callable            # factory(**kwargs) -> nn.Module
    family: str
    train_size: int              # default square input size for the train bench
    infer_size: int              # default square input size for the infer bench
    in_chans: int = 3
    description: str = ""

    def input_size(self, bench: str) -> tuple[int, int, int]:
        s = self.train_size if bench == "train" else self.infer_size
        return (self.in_chans, s, s)


MODELS: Registry[ModelInfo] = Registry("model")


def register_model(*, family: str, train_size: int, infer_size: int, name: str | None = None,
                   in_chans: int = 3):
    def deco(fn):
        n = name or fn.__name__
        MODELS.add(n, ModelInfo(n, fn, family, train_size, infer_size, in_chans,
                                first_line(fn.__doc__, None)))
        return fn
    return deco
