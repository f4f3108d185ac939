"""Every fallback is an event: Python warnings, C++ warnings on stderr, compiler counters.

EventLog aggregates by (category, source, message-first-line) so a warning raised every step is one
event with a count, not a thousand lines."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections import OrderedDict

from fusebench.errors import first_line
from fusebench.loading import USER_MODULE_PREFIX
from fusebench.spec import Event


class EventLog:
    def __init__(self):
        self._counts: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def add(self, category: str, source: str, message: object, count: int = 1) -> None:
        key = (category, source, first_line(message))
        self._counts[key] = self._counts.get(key, 0) + count

    def events(self) -> tuple[Event, ...]:
        return tuple(Event(k, s, m, c) for (k, s, m), c in self._counts.items())

    def count(self, category: str) -> int:
        return sum(c for (k, _, _), c in self._counts.items() if k == category)

    @contextlib.contextmanager
    def capture_warnings(self):
        """Record every Python warning (all categories, every occurrence) raised inside. One
        raised by a module's own top-level code as it is first imported says which module: a
        compile cell's 14 `torch.jit.script_method` deprecations come from inductor importing
        torch.utils.mkldnn, not from TorchScript running, and the warning's own file and line
        (torch/jit/_script.py) cannot tell those apart."""
        caught: list[tuple[type, object, str | None]] = []

        def keep(message, category, filename, lineno, file=None, line=None):
            caught.append((category, message, importing_module(sys._getframe(1))))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = keep         # restored by catch_warnings on the way out
            try:
                yield
            finally:
                for category, message, module in caught:
                    where = f" (raised while importing {module})" if module else ""
                    self.add("warning", f"python:{category.__name__}",
                             first_line(message, max(100, 300 - len(where))) + where)

    @contextlib.contextmanager
    def capture_stderr(self):
        """Capture fd 2 (where C++ TORCH_WARN and friends write) and turn lines into events.
        The captured text is echoed back to the real stderr so nothing is hidden."""
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile(mode="w+b") as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
                if text:
                    os.write(2, text.encode())
                for category, msg in parse_stderr(text):
                    self.add(category, "stderr", msg)


def importing_module(frame) -> str | None:
    """The innermost module whose top-level code `frame` runs inside as the module is imported:
    a `<module>` frame called by importlib's bootstrap; None outside any. A user's file loaded
    by path (`run my_model.py:make`) is named by its file name, not the unique module name
    it is imported under."""
    while frame is not None:
        back = frame.f_back
        if (frame.f_code.co_name == "<module>" and back is not None
                and back.f_code.co_filename.startswith("<frozen importlib")):
            name = frame.f_globals.get("__name__")
            if name and name.startswith(USER_MODULE_PREFIX):
                return os.path.basename(frame.f_globals.get("__file__") or name)
            return name
        frame = back
    return None


# C++ warnings look like "[W1130 10:58:36.123 file.cpp:42] Warning: ..." or "UserWarning: ...".
_CPP_WARN = re.compile(r"^\[W\S*\s+[^\]]*\]\s*(?:Warning:\s*)?(?P<msg>.+)$")
_PY_WARN_LINE = re.compile(r"^\S+:\d+: (?P<cat>\w*Warning): (?P<msg>.+)$")


def parse_stderr(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        m = _CPP_WARN.match(line)
        if m:
            out.append(("cpp_warning", m.group("msg")))
            continue
        m = _PY_WARN_LINE.match(line)
        if m:  # a warning printed by a library directly (already shown once)
            out.append(("warning", f"{m.group('cat')}: {m.group('msg')}"))
    return out
