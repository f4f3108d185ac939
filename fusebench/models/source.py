"""Where a model comes from: the zoo, a user file (`path/to/file.py:factory`) or timm.

`resolve_model(text)` is cheap (nothing is built) and reports bad input as a UsageError with one
clear line; `ModelSource.build(**kwargs)` makes the nn.Module.
"""
from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from fusebench.errors import UsageError, describe, first_line, unknown_name
from fusebench.loading import load_ref
from fusebench.models import inputs as model_inputs

DEFAULT_INPUT_SIZE = (3, 224, 224)   # for user/timm models that do not say
ZOO_MIN_SIZE = 32                    # zoo models downsample by 32


@dataclass(frozen=True)
class ModelSource:
    name: str                        # what the user typed, e.g. "convnext_tiny", "m.py:make"
    origin: str                      # "zoo" | "file" | "timm"
    factory: Callable = field(repr=False, compare=False, default=None)
    default_input_size: tuple[int, int, int] | None = None   # zoo/timm: train size
    infer_input_size: tuple[int, int, int] | None = None
    family: str = ""
    description: str = ""

    @property
    def min_size(self) -> int:
        """Smallest --img-size the model accepts (1 where we cannot tell)."""
        if self.origin == "zoo":
            return ZOO_MIN_SIZE
        return int(getattr(self.factory, "min_size", 1))

    def build(self, **kwargs) -> nn.Module:
        if self.origin == "timm":
            import timm
            return timm.create_model(self.name.split(":", 1)[1], pretrained=False, **kwargs)
        try:
            model = self.factory(**kwargs)
        except UsageError:
            raise
        except TypeError as e:
            if "keyword argument" in str(e):        # a kwarg the factory does not take
                raise UsageError(f"model '{self.name}': {e}") from e
            if self.origin == "zoo":
                raise
            raise UsageError(f"model '{self.name}' failed to build: {describe(e)}") from e
        except Exception as e:
            if self.origin == "zoo":                  # our bug: keep the traceback
                raise
            raise UsageError(f"model '{self.name}' failed to build: {describe(e)}") from e
        if not isinstance(model, nn.Module):
            raise UsageError(f"model '{self.name}': factory returned {type(model).__name__}, "
                             f"not an nn.Module")
        return model

    def input_size(self, bench: str, img_size: int | None = None,
                   model: nn.Module | None = None) -> tuple[int, int, int]:
        """(C, H, W) for `bench` ("train"/"infer"); img_size overrides H and W.

        For user files an `input_size` attribute on the built `model` (if given) or on the
        factory function wins over the (3, 224, 224) default.
        """
        size = self._default_size(bench, model)
        if img_size is None:
            return size
        self.validate_img_size(img_size)
        return (size[0], img_size, img_size)

    def example_inputs(self, model: nn.Module, bench: str, batch_size: int,
                       img_size: int | None = None, device="cpu", dtype=torch.float32,
                       generator: torch.Generator | None = None,
                       memory_format=torch.contiguous_format,
                       size_preset: bool = False) -> model_inputs.ModelInputs:
        """The positional args of one call: the model's own `example_inputs(batch_size, device,
        dtype)` where it has one (see models/inputs.py), else a float image batch of
        `input_size`. The image batch is drawn from `generator` (seed 0 when None). An
        img_size the user asked for does not apply to a model with its own inputs (a
        UsageError); a preset one (size_preset: --quick's) is dropped there, and for a model
        whose size is fixed (fixed_size)."""
        device = torch.device(device)
        hook = model_inputs.find_hook(model, self.factory)
        if size_preset and fixed_size(model, self.factory):
            img_size = None
        if hook is None:
            size = self.input_size(bench, img_size, model=model)
            gen = generator if generator is not None else torch.Generator().manual_seed(0)
            return model_inputs.image_batch(size, batch_size, device, dtype, gen, memory_format)
        if img_size is not None and not size_preset:
            raise UsageError(f"--img-size does not apply to '{self.name}': it provides "
                             f"{model_inputs.HOOK}()")
        got = model_inputs.from_hook(self.name, hook, batch_size, device, dtype)
        return model_inputs.with_memory_format(got, memory_format)

    def _default_size(self, bench: str, model: nn.Module | None) -> tuple[int, int, int]:
        if self.origin == "file":
            for owner in (model, self.factory):
                s = getattr(owner, "input_size", None) if owner is not None else None
                if s is not None:
                    return _check_size(self.name, s)
            return DEFAULT_INPUT_SIZE
        if bench != "train" and self.infer_input_size is not None:
            return self.infer_input_size
        return self.default_input_size or DEFAULT_INPUT_SIZE

    def refuse_img_size(self) -> None:
        """An --img-size asked for a model that makes its own inputs is a UsageError here, at
        planning, where its example_inputs() sits on the factory (a class) or the factory's
        module; a hook on the built model only shows in the cell (the same error there)."""
        if self.origin == "file" and model_inputs.find_hook(None, self.factory) is not None:
            raise UsageError(f"--img-size does not apply to '{self.name}': it provides "
                             f"{model_inputs.HOOK}()")

    def validate_img_size(self, size: int) -> None:
        if size <= 0:
            raise UsageError(f"--img-size must be positive, got {size}")
        if size < self.min_size:
            raise UsageError(f"{self.name} needs --img-size >= {self.min_size}, got {size}")


def fixed_size(model: nn.Module | None, factory: Callable | None) -> bool:
    """The model takes one input size only: timm's `pretrained_cfg["fixed_input_size"]` (ViT,
    Swin, ... assert their patch grid), or a `fixed_input_size = True` attribute on a user's
    model or factory (the same name). --quick's smaller preset size is not given to these:
    eager itself would fail on it."""
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and cfg.get("fixed_input_size"):
        return True
    return any(getattr(owner, "fixed_input_size", False) is True
               for owner in (model, factory) if owner is not None)


def resolve_model(text: str) -> ModelSource:
    text = text.strip()
    if text.startswith("timm:"):
        return _resolve_timm(text)
    if ":" in text or text.endswith(".py"):
        return _resolve_file(text)
    return _resolve_zoo(text)


def _resolve_zoo(name: str) -> ModelSource:
    from fusebench.models import get_model_info
    info = get_model_info(name)              # unknown -> UsageError with close matches
    return ModelSource(name, "zoo", info.factory, info.input_size("train"),
                       info.input_size("infer"), info.family, info.description)


def _resolve_file(text: str) -> ModelSource:
    factory = load_ref(text, "model", "factory")
    doc = first_line(getattr(factory, "__doc__", None), None)
    return ModelSource(text, "file", factory, family="file", description=doc)


def _resolve_timm(text: str) -> ModelSource:
    name = text.split(":", 1)[1].strip()
    if not name:
        raise UsageError("expected timm:MODEL_NAME, e.g. timm:resnet50")
    try:
        import timm
    except ImportError:
        raise UsageError("timm is not installed; pip install timm") from None
    if not timm.is_model(name):
        raise unknown_name("timm model", [name], timm.list_models())
    train = infer = None
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:            # older timm: sizes come from the built model instead
        cfg = None
    if cfg is not None:
        train = tuple(cfg.input_size)
        infer = tuple(cfg.test_input_size) if cfg.test_input_size else train
    return ModelSource(text, "timm", None, train, infer, family="timm")


def _check_size(name: str, s) -> tuple[int, int, int]:
    try:
        c, h, w = (int(v) for v in s)
    except (TypeError, ValueError):
        raise UsageError(f"model '{name}': input_size must be (C, H, W), got {s!r}") from None
    return (c, h, w)


# ----- kwargs from the command line -----------------------------------------------------------

def parse_model_kwargs(items: Iterable[str] | None) -> dict[str, str]:
    """['ln_impl=sqm', 'num_classes=10'] -> {'ln_impl': 'sqm', 'num_classes': '10'}. The one
    --model-kwarg parser: `run` (through the plan) and `info` read KEY=VALUE by these rules."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"malformed --model-kwarg '{item}': expected KEY=VALUE")
        if key in out:
            raise UsageError(f"--model-kwarg '{key}' given twice")
        out[key] = value.strip()
    return out


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def coerce_kwargs(factory: Callable | None, kwargs: dict[str, str]) -> dict:
    """Turn CLI strings into the types the factory expects.

    The type comes from the parameter's default (bool/int/float/str); otherwise the string is
    read as a Python literal, or kept as a string. Unknown keys are a UsageError unless the
    factory takes **kwargs (or is None: unknown signature, e.g. timm).
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):          # builtins without a signature: best effort
        params = {}
    var_kw = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    accepted = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown and not var_kw:
        raise unknown_name("model kwarg", unknown, accepted)
    out = {}
    for key, text in kwargs.items():
        default = params[key].default if key in params else inspect.Parameter.empty
        out[key] = _coerce(key, text, default)
    return out


def _coerce(key: str, text: str, default):
    if not isinstance(text, str):
        return text
    if isinstance(default, bool):
        low = text.lower()
        if low in _TRUE | _FALSE:
            return low in _TRUE
        raise UsageError(f"model kwarg {key} expects true/false, got '{text}'")
    if isinstance(default, (int, float)):
        typ = type(default)
        try:
            return typ(text)
        except ValueError:
            try:                            # "1e-3" for a float, "10.0" for an int
                value = float(text)
            except ValueError:
                value = None
            if value is not None and (typ is float or value.is_integer()):
                return typ(value)
            raise UsageError(f"model kwarg {key} expects {typ.__name__}, got '{text}'") from None
    if isinstance(default, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
