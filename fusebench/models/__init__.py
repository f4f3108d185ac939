"""Bundled model zoo. Each family file registers its factories with @register_model."""
from __future__ import annotations

from fusebench.models.registry import MODELS, ModelInfo, register_model


def _load_all() -> None:
    from fusebench.models import convnext, efficientnet  # noqa: F401  (registration)


def list_models(pattern: str = "*") -> list[str]:
    _load_all()
    return MODELS.names(pattern)


def get_model_info(name: str) -> ModelInfo:
    _load_all()
    return MODELS[name]


def create_model(name: str, **kwargs):
    return get_model_info(name).factory(**kwargs)


__all__ = ["MODELS", "ModelInfo", "register_model", "list_models", "get_model_info",
           "create_model"]
