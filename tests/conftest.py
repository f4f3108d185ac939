"""Shared test setup, one place: the repo root on sys.path (tests import their helpers one way,
`from tests.helpers import ...`, `from tests.factories import ...`), the test marker for worker
processes, and the fixtures several test files use."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("FUSEBENCH_TEST", "1")     # inherited by every worker a test starts
# one worker process per cell unless a test asks for --repeat (the CLI's default is 3)
os.environ.setdefault("FUSEBENCH_REPEAT", "1")
# Triton fixes interpretation when it is imported (its standard library's @triton.jit): the
# full run sets this while collecting the kernel test modules, before torch imports triton
# lazily (under a profiler or a dispatch mode, say). Here, any subset runs the Triton kernels
# the same way, in any order (it read "Cannot call @triton.jit'd outside of the scope of a
# kernel" when a dispatch-mode test ran before test_fused_amp.py's interpreted kernels).
os.environ.setdefault("TRITON_INTERPRET", "1")


# seconds a build of each bundled C++ kernel took on the 2-core VM: the longest start first
# (a new kernel, not listed, is taken as the longest)
BUILD_SECONDS = {"bn_act": 81, "gn_act": 48, "act": 44, "dwconv": 41, "ln2d": 34, "rms_norm": 32}
WHOLE_RUN = 500                  # collected tests from which a run builds every kernel up front


def pytest_collection_finish(session) -> None:
    """A whole run builds every C++ kernel first, one compiler per core: each build is one
    single-threaded compile, and built one by one, as tests first touched them, they were
    ~4.7 of a fresh run's ~12 minutes. A build lands in the disk cache the tests then load
    from (kernels/build.py); one that fails here is built, and reported, by the tests that
    need it. A run of a few tests builds what it touches, as before."""
    from fusebench.kernels import build
    if (len(session.items) < WHOLE_RUN or session.config.option.collectonly
            or build.toolchain_reason()):
        return
    prebuild()


def prebuild() -> None:
    families = sorted((p.parent.name for p in (ROOT / "fusebench" / "kernels").glob("*/cpu.cpp")),
                      key=lambda f: -BUILD_SECONDS.get(f, 1e9))
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(_build_in_child, families))


def _build_in_child(family: str) -> None:
    subprocess.run([sys.executable, "-c", f"import fusebench.kernels.{family}.cpu as m; "
                    f"m.KERNEL.build()"], cwd=ROOT, capture_output=True, check=False)


@pytest.fixture(autouse=True)
def _subnormals_as_the_test_found_them():
    """A test whose torch.compile loads inductor's kernels built with -ffast-math (torch 2.4)
    leaves the process flushing subnormals; the tests after it (hypothesis' floats, the CSV's
    5e-324) would then fail for a reason of not their own. Each test starts IEEE again."""
    from fusebench.measure.fpstate import flushes_subnormals
    before = flushes_subnormals()
    yield
    if flushes_subnormals() and not before:
        import torch
        torch.set_flush_denormal(False)      # clears both FTZ and DAZ


def _load_plugins(monkeypatch, plugins: str) -> None:
    monkeypatch.setenv("FUSEBENCH_PLUGINS", plugins)      # every worker the test starts
    from fusebench.plugins import load_plugins
    load_plugins()                                        # and this process


@pytest.fixture
def fault_modes(monkeypatch) -> None:
    """The planted-fault modes of tests/assets/fault_modes.py."""
    from tests.helpers import FAULT_PLUGIN
    _load_plugins(monkeypatch, FAULT_PLUGIN)


@pytest.fixture
def all_fault_modes(monkeypatch) -> None:
    """fault_modes plus the compile-time and repro faults of tests/assets/more_faults.py."""
    from tests.helpers import ALL_FAULT_PLUGINS
    _load_plugins(monkeypatch, ALL_FAULT_PLUGINS)


@pytest.fixture
def site_calls(monkeypatch):
    """Calls of each fused graph site (Site.__call__, by its name), counted; and any warning
    (a site that ran aten instead says so) fails the test."""
    from fusebench.fuse.fx.pattern import Site
    calls: Counter = Counter()
    real = Site.__call__

    def counted(self, *args):
        calls[self.__name__] += 1
        return real(self, *args)
    monkeypatch.setattr(Site, "__call__", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # a measured choice, said once per shape (passes_for caches it): whether it shows up
        # here depended on which test saw the shape first
        warnings.filterwarnings("ignore", message="dwconv: aten's depthwise conv kept")
        yield calls
