"""Loading a user's Python file: one way for plugins, model files (`file.py:factory`) and kernel
impls (`file.py:fn`). Every way it can fail is one UsageError that names the file."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from fusebench.errors import UsageError, describe, unknown_name


def is_file_ref(name: str) -> bool:
    """'path/to/file.py:name' rather than a registered name."""
    return ":" in name


def check_file(path: Path, what: str) -> Path:
    """The checks that run none of the file's code: a .py file that exists and parses. The CLI
    makes them itself (user code only ever runs in a probe or a worker), so the commonest
    mistakes cost no child process. Returns the resolved path."""
    path = Path(path).expanduser()
    if path.suffix != ".py":
        raise UsageError(f"{what}: {path} is not a .py file")
    if not path.is_file():
        raise UsageError(f"{what}: {path} not found (no such file)")
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        raise UsageError(f"{what}: syntax error in {path} line {e.lineno}: {e.msg}") from None
    except (OSError, ValueError) as e:      # unreadable, or NUL bytes in the source
        raise UsageError(f"{what}: cannot read {path}: {describe(e)}") from None
    return path.resolve()


def split_ref(ref: str, what: str, attr_kind: str) -> tuple[str, str]:
    """'path/to/file.py:name' -> (path, name); a malformed reference is a UsageError."""
    path_text, sep, attr = ref.rpartition(":")
    if not sep or not path_text or not attr.isidentifier():
        raise UsageError(f"{what} '{ref}': expected path/to/file.py:{attr_kind}")
    return path_text, attr


def check_ref(ref: str, what: str, attr_kind: str) -> None:
    """What the CLI can check of a file reference without running the file (see check_file)."""
    path_text, _ = split_ref(ref, what, attr_kind)
    check_file(Path(path_text), f"{what} '{ref}'")


def _where(e: BaseException, resolved: Path) -> str:
    """':LINE' of the innermost frame of the user's file in e's traceback ('' if none)."""
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if f.filename == str(resolved)]
    return f":{lines[-1]}" if lines else ""


USER_MODULE_PREFIX = "fusebench_user_"    # import_file's module names: prefix, stem, digest


def import_file(path: Path, what: str) -> ModuleType:
    """Import a .py file under a unique module name (two files named model.py coexist), kept in
    sys.modules (dataclasses and pickling in the file need it), so a second load is the same
    module. `what` starts the error messages ("model 'x.py:make'", "plugin x.py")."""
    path = Path(path).expanduser()
    if path.suffix != ".py":
        raise UsageError(f"{what}: {path} is not a .py file")
    if not path.is_file():
        raise UsageError(f"{what}: {path} not found (no such file)")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    mod_name = f"{USER_MODULE_PREFIX}{resolved.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise UsageError(f"{what}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    # a model file imports its neighbours (`from layers import Block`) as it does when run as
    # a script; at the end of the path, so that a neighbour never shadows an installed module
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        del sys.modules[mod_name]
        raise UsageError(f"{what}: syntax error in {path} line {e.lineno}: {e.msg}") from None
    except Exception as e:
        del sys.modules[mod_name]
        raise UsageError(f"{what}: importing {path}{_where(e, resolved)} failed: "
                         f"{describe(e)}") from e
    return module


def load_ref(ref: str, what: str, attr_kind: str):
    """'path/to/file.py:name' -> the callable `name` defined there. `what` names the reference
    in errors ("model", "user impl"), `attr_kind` what the name is ("factory", "function")."""
    path_text, attr = split_ref(ref, what, attr_kind)
    module = import_file(Path(path_text), f"{what} '{ref}'")
    if not hasattr(module, attr):
        # offer the functions/classes the file itself defines, not what it imported
        own = [n for n, v in vars(module).items()
               if callable(v) and getattr(v, "__module__", None) == module.__name__]
        if not own:
            raise UsageError(f"no '{attr}' in {path_text} (it defines no functions or classes)")
        raise unknown_name(f"{attr_kind} in {path_text}:", [attr], own)
    obj = getattr(module, attr)
    if not callable(obj):
        raise UsageError(f"{what} '{ref}': '{attr}' is a {type(obj).__name__}, not callable")
    return obj
