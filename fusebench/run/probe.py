"""User code runs in a child, never in the CLI: the coordinator side of the probe.

Every command that resolves names calls `load()` first. Without FUSEBENCH_PLUGINS and without a
user file nothing is started. Otherwise one child process (`python -m PROBE_MODULE`, the cell
side is cell/probe.py) imports the plugins and the user's files under a timeout and answers with
plain data: what the plugins registered (installed here as stand-ins in the registries, so
`list`, `env` and the planners see plugin modes, models and kernel impls by name) and the checks
each command asked for. A probe that exits, hangs or raises is one UsageError line (exit 2)."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from fusebench.errors import UsageError
from fusebench.protocol import PROBE_MODULE, probe_note_path

TIMEOUT_ENV = "FUSEBENCH_PROBE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0   # loading a file should take seconds; a hang should not cost --timeout

_UNDO: list[Callable[[], None]] = []     # how to remove the stand-ins installed last time
_ANSWERS: dict[str, dict] = {}           # _cache_key -> the probe's answer


def plugins_value() -> str:
    return os.environ.get("FUSEBENCH_PLUGINS", "").strip()


def probe_timeout(cell_timeout: float | None = None) -> float:
    """min(--timeout, FUSEBENCH_PROBE_TIMEOUT or 60 s)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        base = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        base = math.nan
    if not (math.isfinite(base) and 0 < base <= 7 * 24 * 3600):
        raise UsageError(f"{TIMEOUT_ENV} must be seconds > 0, got '{text}'")
    return base if cell_timeout is None else min(base, cell_timeout)


def is_user_model(name: str) -> bool:
    """A model given as a file (path/file.py:factory) rather than a zoo or timm name."""
    return not name.startswith("timm:") and (":" in name or name.endswith(".py"))


def load(*, device: str = "cpu", timeout: float | None = None, models: list[str] = (),
         model_kwargs: dict[str, str] | None = None, img_sizes: list[int] = (),
         img_sizes_given: bool = False,
         impls: list[str] = (), summary: dict | None = None) -> dict:
    """Load plugins and the given user files in a probe; install what the plugins registered.
    Returns the probe's answer ({} when nothing needed loading)."""
    uninstall()
    if not (plugins_value() or models or impls or summary):
        return {}
    request = {"plugins": plugins_value(), "device": device, "models": list(models),
               "model_kwargs": dict(model_kwargs or {}), "img_sizes": list(img_sizes),
               "img_sizes_given": img_sizes_given,
               "impls": list(impls), "summary": summary}
    key = _cache_key(request)
    answer = _ANSWERS.get(key) if key else None
    if answer is None:
        answer = ask(request, probe_timeout(timeout))
        if key:
            _ANSWERS[key] = answer
    install(answer.get("catalog") or {})
    return answer


def _cache_key(request: dict) -> str | None:
    """The same request on unchanged files is answered once per process (a library user or a
    test calling the CLI's main() many times pays one probe). None: not cacheable (a plugin
    given as a module name, whose files we do not stat)."""
    paths = [r.rpartition(":")[0] for r in [*request["models"], *request["impls"]] if ":" in r]
    if request["summary"]:
        return None                        # info builds the model: always fresh
    for name in request["plugins"].split(","):
        name = name.strip()
        if name and not name.endswith(".py"):
            return None
        paths.append(name)
    stats = []
    for p in filter(None, paths):
        try:
            st = os.stat(p)
        except OSError:
            return None
        stats.append((os.path.abspath(p), st.st_mtime_ns, st.st_size))
    return json.dumps([request, os.getcwd(), stats], sort_keys=True)


# ----------------------------------------------------------------------------- the child
def ask(request: dict, timeout: float) -> dict:
    """Run one probe; its answer, or a UsageError that names what failed."""
    with tempfile.TemporaryDirectory(prefix="fusebench-probe-") as tmp:
        req_path, ans_path = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        req_path.write_text(json.dumps(request))
        proc = subprocess.Popen(
            [sys.executable, "-m", PROBE_MODULE, str(req_path), str(ans_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,   # prints: the child's stderr
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True)       # own group: a timeout kills all it started
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise UsageError(f"{_loading(ans_path, 'loading ')} did not finish within "
                             f"{timeout:g} s (killed; the limit is min(--timeout, {TIMEOUT_ENV}, "
                             f"default {DEFAULT_TIMEOUT_S:g} s))") from None
        except BaseException:             # Ctrl-C while waiting: the child goes too
            _kill(proc)
            raise
        _kill(proc)                       # whatever the user code left running
        if not ans_path.exists():
            raise UsageError(f"{_loading(ans_path)} ended the probe process (exit code "
                             f"{proc.returncode}) before it answered; user code must not exit")
        answer = json.loads(ans_path.read_text())
    if "error" in answer:
        raise UsageError(answer["error"])
    return answer


def _loading(ans_path: Path, prefix: str = "") -> str:
    """What the probe was loading when it stopped (from its note), else its start-up."""
    try:
        what = probe_note_path(ans_path).read_text().strip()
    except OSError:
        what = ""
    return prefix + what if what else "the probe process (starting up, before any user file)"


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# ----------------------------------------------------------------------------- stand-ins
def install(cat: dict) -> None:
    """Register stand-ins for what the plugins registered (names the CLI already has are left
    alone). A stand-in knows what the probe reported; the worker runs the real thing."""
    import fusebench.kernels  # noqa: F401  (the bundled families registered: never shadowed)
    from fusebench.kernels.problem import PROBLEMS, KernelProblem
    from fusebench.kernels.registry import KernelImpl, add_impl, discard_impl, families
    from fusebench.kernels.registry import family as family_registry
    from fusebench.models import MODELS, ModelInfo, list_models
    from fusebench.modes import MODES, list_modes

    list_modes(), list_models()            # the built-ins first: never shadowed
    for name, d in cat.get("modes", {}).items():
        if name not in MODES:
            MODES.add(name, _mode(name, d))
            _UNDO.append(lambda n=name: MODES.discard(n))
    for name, d in cat.get("models", {}).items():
        if name not in MODELS:
            MODELS.add(name, ModelInfo(name, None, d["family"], d["train_size"], d["infer_size"],
                                       d.get("in_chans", 3), d.get("description", "")))
            _UNDO.append(lambda n=name: MODELS.discard(n))
    for fam, impls in cat.get("impls", {}).items():
        for name, d in impls.items():
            if fam in families() and name in family_registry(fam):
                continue
            add_impl(KernelImpl(fam, name, None, _fixed(d), d.get("description", "")))
            _UNDO.append(lambda f=fam, n=name: discard_impl(f, n))
    for fam, d in cat.get("problems", {}).items():
        if fam not in PROBLEMS:
            PROBLEMS.add(fam, KernelProblem(fam, d["signature"], reference=None,
                                            default_shape=d["default_shape"]))
            _UNDO.append(lambda f=fam: PROBLEMS.discard(f))


def uninstall() -> None:
    while _UNDO:
        _UNDO.pop()()


def _fixed(d: dict) -> Callable[..., tuple[bool, str]]:
    result = (bool(d.get("available")), str(d.get("reason") or ""))
    return lambda *args, **kwargs: result


def _mode(name: str, d: dict):
    from fusebench.modes.base import Mode
    mode = Mode()
    mode.name, mode.description = name, d.get("description", "")
    mode.dist_unsupported = dict(d.get("dist_unsupported") or {})
    mode.available = _fixed(d)
    return mode
