"""loading.py: the one loader of user files (plugins, model files, kernel impls)."""
from __future__ import annotations

import pytest

from fusebench.errors import UsageError, describe, first_line
from fusebench.loading import import_file, load_ref


def test_import_file_is_unique_per_path_and_cached(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.py").write_text("X = 1\n")
    (tmp_path / "b" / "m.py").write_text("X = 2\n")
    a, b = import_file(tmp_path / "a" / "m.py", "t"), import_file(tmp_path / "b" / "m.py", "t")
    assert (a.X, b.X) == (1, 2) and a.__name__ != b.__name__
    assert import_file(tmp_path / "a" / "m.py", "t") is a


@pytest.mark.parametrize("text,ref,match", [
    ("def f(:\n", "f", r"syntax error in .*bad\.py line 1"),
    ("raise RuntimeError('boom\\nmore')\n", "f", r"importing .* failed: RuntimeError: boom$"),
    ("import os\n", "path", "defines no functions or classes"),
    ("def fn(): pass\n", "fm", "did you mean fn"),
    ("N = 3\ndef fn(): pass\n", "N", "'N' is a int, not callable"),
])
def test_load_ref_errors(tmp_path, text, ref, match):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        load_ref(f"{path}:{ref}", "user impl", "function")


@pytest.mark.parametrize("ref,match", [("x.py", "expected path/to/file.py:function"),
                                       ("x.txt:f", "not a .py file"),
                                       ("nope/x.py:f", "not found")])
def test_load_ref_bad_references(ref, match):
    with pytest.raises(UsageError, match=match):
        load_ref(ref, "user impl", "function")


def test_plugin_files_load_through_the_same_loader(tmp_path):
    from fusebench.plugins import load_plugins
    path = tmp_path / "plug.py"
    path.write_text("raise ValueError('broken plugin')\n")
    with pytest.raises(UsageError, match="plugin .*plug.py: importing .* ValueError: broken"):
        load_plugins(str(path))


def test_first_line_and_describe():
    assert first_line("\n  one\ntwo") == "one" and first_line(None) == ""
    assert first_line("x" * 400) == "x" * 300 and first_line("x" * 400, None) == "x" * 400
    assert describe(KeyError()) == "KeyError" and describe(ValueError("a\nb")) == "ValueError: a"


def test_a_file_imports_its_neighbours_as_a_script_would(tmp_path):
    (tmp_path / "fb_test_layers.py").write_text("class Block:\n    width = 3\n")
    (tmp_path / "model.py").write_text("from fb_test_layers import Block\n\n"
                                       "def make():\n    return Block.width\n")
    assert load_ref(f"{tmp_path / 'model.py'}:make", "model", "factory")() == 3
