"""EventLog's Python warnings: every occurrence counted, and a warning raised by a module's
top-level code as it is imported names that module (a compile cell's jit deprecations come from
inductor importing torch.utils.mkldnn, not from TorchScript running)."""
import importlib
import sys
import warnings

import pytest

from fusebench.measure.events import EventLog


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `wpkg` whose `outer` imports `inner`; both warn at import, `inner.later` warns
    when called; `long` warns a 1000-character line at import."""
    root = tmp_path / "wpkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "inner.py").write_text(
        "import warnings\n"
        "def later():\n    warnings.warn('called', UserWarning)\n"
        "for _ in range(3):\n    warnings.warn('at import', DeprecationWarning)\n")
    (root / "outer.py").write_text(
        "import warnings\nfrom wpkg import inner\nwarnings.warn('outer too', FutureWarning)\n")
    (root / "long.py").write_text("import warnings\nwarnings.warn('y' * 1000)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [n for n in sys.modules if n == "wpkg" or n.startswith("wpkg.")]:
        del sys.modules[name]


def _by_message(log):
    return {e.message: (e.source, e.count) for e in log.events()}


def test_an_import_time_warning_names_the_module_being_imported(package):
    log, before = EventLog(), warnings.showwarning
    with log.capture_warnings():
        outer = importlib.import_module("wpkg.outer")
        outer.inner.later()
        outer.inner.later()
    assert _by_message(log) == {
        "at import (raised while importing wpkg.inner)": ("python:DeprecationWarning", 3),
        "outer too (raised while importing wpkg.outer)": ("python:FutureWarning", 1),
        "called": ("python:UserWarning", 2)}                # called later: no module named
    assert warnings.showwarning is before                   # put back on the way out


def test_a_long_message_is_cut_before_the_module_is_named(package):
    log = EventLog()
    with log.capture_warnings():
        warnings.warn("x" * 1000)
        importlib.import_module("wpkg.long")
    short, long = log.events()
    assert short.message == "x" * 300                       # first_line's cut
    assert long.message == "y" * 265 + " (raised while importing wpkg.long)"


def test_a_users_file_is_named_by_its_file_name(tmp_path, monkeypatch):
    """`run my_model.py:make` imports the file under a unique module name; the event names the
    file the user wrote."""
    from fusebench.loading import import_file
    monkeypatch.setattr(sys, "path", list(sys.path))        # import_file appends the folder
    path = tmp_path / "my_model.py"
    path.write_text("import warnings\nwarnings.warn('old config format', UserWarning)\n")
    log = EventLog()
    with log.capture_warnings():
        module = import_file(path, "model 'my_model.py:make'")
    try:
        assert [e.message for e in log.events()] == [
            "old config format (raised while importing my_model.py)"]
    finally:
        sys.modules.pop(module.__name__, None)
