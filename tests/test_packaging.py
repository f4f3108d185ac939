"""A wheel (not an editable install) in a brand-new venv: it imports only declared dependencies,
ships every file the C++ kernels include, and runs `fusebench env` and one C++ kernel cell."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _sh(args, **kw):
    # without PYTHONPATH: a checkout on it (with its .egg-info) makes pip in the new venv think
    # fusebench is installed already, and it skips the wheel
    kw.setdefault("env", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args[:4]} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    _sh([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp / "dist"),
         str(ROOT)])
    wheel = next((tmp / "dist").glob("fusebench-*.whl"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)   # no system site-packages: a clean slate
    py = env_dir / "bin" / "python"
    # The torch we run under, pinned: an unpinned requirement could pull a multi-GB CUDA build.
    _sh([str(py), "-m", "pip", "install", "--quiet", f"torch=={torch.__version__.split('+')[0]}"])
    _sh([str(py), "-m", "pip", "install", "--quiet", str(wheel), "ninja"])
    return env_dir, wheel


@pytest.mark.slow
def test_wheel_ships_kernel_sources_and_headers(wheel_venv):
    import zipfile
    _, wheel = wheel_venv
    names = set(zipfile.ZipFile(wheel).namelist())
    bundled = {str(p.relative_to(ROOT)) for p in (ROOT / "fusebench").rglob("*")
               if p.suffix in (".cpp", ".h")}
    assert bundled and bundled <= names, sorted(bundled - names)


@pytest.mark.slow
def test_wheel_runs_env_and_a_cpp_kernel_cell(wheel_venv, tmp_path):
    env_dir, _ = wheel_venv
    exe = env_dir / "bin" / "fusebench"
    env = {**os.environ, "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}",
           "FUSEBENCH_CACHE": str(tmp_path / "cache")}   # a cold build from the wheel's files
    env.pop("PYTHONPATH", None)
    # run outside the checkout so `import fusebench` cannot pick up the source tree
    r = _sh([str(exe), "env", "--json"], cwd=tmp_path, env=env)
    assert json.loads(r.stdout)["torch"]["version"] == torch.__version__
    r = _sh([str(exe), "kernel", "ln2d", "--impl", "cpu", "--shape", "2,8,8,8", "--warmup", "1",
             "--steps", "2", "--json", "--no-save"], cwd=tmp_path, env=env, timeout=600)
    (rec,) = json.loads(r.stdout)["records"]
    assert rec["status"] == "ok", rec


def _declared() -> set[str]:
    """Distribution names pyproject.toml asks for, extras included (read as text: tomllib
    is not in Python 3.10, which pyproject allows)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("\ndependencies = ["):text.index("[project.scripts]")]
    block = re.sub(r"#.*", "", block)          # every string left is a requirement
    listed = re.findall(r'"([A-Za-z0-9_.\-]+)[^"]*"', block)
    return {_norm(name) for name in listed}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def test_every_package_fusebench_imports_is_declared():
    """A package the code imports that only arrives as someone else's dependency (click via
    typer, typing_extensions via torch) breaks the day that someone drops it: each top-level
    import outside the standard library is a declared dependency or extra."""
    import ast
    from importlib import metadata
    owners = metadata.packages_distributions()
    undeclared = {}
    for path in sorted((ROOT / "fusebench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "fusebench":
                    continue
                dists = {_norm(d) for d in owners.get(top, [top])}   # not installed: its name
                if not dists & _declared():
                    undeclared.setdefault(top, str(path.relative_to(ROOT)))
    assert not undeclared, f"imported, not declared in pyproject.toml: {undeclared}"
