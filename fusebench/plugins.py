"""User plugins: FUSEBENCH_PLUGINS="pkg.module,/path/to/file.py" is imported by the CLI and by
every worker, so a plugin can register its own modes, models or kernel impls."""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from fusebench.errors import UsageError
from fusebench.loading import import_file

_loaded: set[str] = set()


def load_plugins(env_value: str | None = None) -> list[str]:
    value = os.environ.get("FUSEBENCH_PLUGINS", "") if env_value is None else env_value
    names = [p.strip() for p in value.split(",") if p.strip()]
    for name in names:
        if name in _loaded:
            continue
        try:
            if name.endswith(".py"):
                import_file(Path(name), f"plugin {name}")
            else:
                importlib.import_module(name)
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(f"plugin {name} failed to load: {type(e).__name__}: {e}") from None
        _loaded.add(name)
    return names
