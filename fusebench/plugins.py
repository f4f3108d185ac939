"""User plugins: FUSEBENCH_PLUGINS="pkg.module,/path/to/file.py" is imported by the probe (the
CLI's child process that loads user code, cell/probe.py) and by every worker, so a plugin can
register its own modes, models or kernel impls, or graph patterns for the fused mode
(`fusebench.fuse.fx.register_pattern`, tried after the built-in ones unless `before=` names one). The CLI process itself never imports them."""
from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Callable
from pathlib import Path

from fusebench.errors import UsageError, describe
from fusebench.loading import import_file

_loaded: set[str] = set()


def plugin_names(env_value: str | None = None) -> list[str]:
    value = os.environ.get("FUSEBENCH_PLUGINS", "") if env_value is None else env_value
    return [p.strip() for p in value.split(",") if p.strip()]


def load_plugins(env_value: str | None = None,
                 on_load: Callable[[str], None] | None = None) -> list[str]:
    """Import each plugin once; on_load(what) is told which one is being imported."""
    names = plugin_names(env_value)
    for name in names:
        if name in _loaded:
            continue
        if on_load is not None:
            on_load(f"plugin {name}")
        try:
            if name.endswith(".py"):
                import_file(Path(name), f"plugin {name}")
            else:
                importlib.import_module(name)
        except UsageError:
            raise
        except Exception as e:
            frames = traceback.extract_tb(e.__traceback__)
            where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
            raise UsageError(f"plugin {name} failed to load{where}: {describe(e)}") from None
        _loaded.add(name)
    return names
