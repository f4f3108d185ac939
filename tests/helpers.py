"""Shared test helpers: paths of the asset models and plugin modes, env for workers."""
from __future__ import annotations

import os
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TINY = f"{ASSETS / 'tiny_models.py'}:tiny_cnn"
GRAPH_BREAK = f"{ASSETS / 'tiny_models.py'}:graph_break_cnn"
WARNING = f"{ASSETS / 'tiny_models.py'}:warning_cnn"
RAISING = f"{ASSETS / 'tiny_models.py'}:raising_factory"
SPAWNING = f"{ASSETS / 'tiny_models.py'}:spawning_cnn"
FAULT_PLUGIN = str(ASSETS / "fault_modes.py")


def with_fault_modes(monkeypatch) -> None:
    """Load the planted-fault modes here and in every worker the test starts."""
    monkeypatch.setenv("FUSEBENCH_PLUGINS", FAULT_PLUGIN)
    from fusebench.plugins import load_plugins
    load_plugins()


def tiny_spec(**kw):
    from fusebench.spec import CellSpec
    base = dict(model=TINY, mode="eager", batch_size=4, warmup=1, steps=3, device="cpu",
                timeout=120.0, threads=1)   # tiny shapes: one thread is fastest
    base.update(kw)
    return CellSpec.for_model(base.pop("model"), base.pop("mode"), **base)


os.environ.setdefault("FUSEBENCH_TEST", "1")
