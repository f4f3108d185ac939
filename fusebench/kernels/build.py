"""Lazy C++ extension builds shared by the kernel families, cached on disk.

`load_extension(name, sources)` builds once per (sources, flags, torch, CPU) and reuses the
build on later calls and in later processes: ninja skips up-to-date objects in a stable
build_directory under $FUSEBENCH_CACHE (default ~/.cache/fusebench). A build that fails is
remembered for the process so the cost (and the compiler's error) is paid once; the reason is
a short line the caller turns into a fallback event."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import threading
from pathlib import Path

import torch

from fusebench.errors import describe

# -O3 + -march=native: the inner loops over H*W / C are written for the auto-vectoriser;
# -fopenmp: at::parallel_for is a header template that only parallelises under OpenMP, and
# `#pragma omp simd` needs it too (libgomp.so.1 resolves to the one torch already loaded).
# No -std: cpp_extension passes the standard the installed torch's headers need (2.13 passes
# C++20, and 2.14's headers refuse anything older); a -std of ours came after it and won, so
# under torch 2.14 every C++ kernel failed to build and fell back to its `function` impl.
# -fno-trapping-math: without it GCC may not turn a float compare-and-select (GELU's erf
# half, z < 0 ? h : 1 - h) into a vector blend where the ISA has no masked lanes (AVX2), as a
# compare may raise an FP exception the scalar branch would not: on an AMD EPYC (Zen 3,
# -march=znver3) every float erf-GELU loop stayed scalar, the bias_gelu kernel 4-10x slower
# than with it and 2-4x slower than aten's (forty-sixth session). Values are unchanged: only
# FP exception flags, which nothing reads, may differ (unlike -ffast-math).
DEFAULT_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-trapping-math")
DEFAULT_LDFLAGS = ("-fopenmp",)


class BuildError(RuntimeError):
    """A bundled C++ kernel could not be built here (no compiler, no ninja, compile error)."""


_lock = threading.Lock()
_failed: dict[str, str] = {}


def cache_root() -> Path:
    root = os.environ.get("FUSEBENCH_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fusebench")
    return Path(root)


@functools.cache  # once per process: the PATH lookups sit on per-call paths (docs/figures.md)
def toolchain_reason() -> str:
    """'' when a C++ compiler and ninja are on PATH, else why not (cheap: no build)."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH)"
    if shutil.which("ninja") is None:
        return "ninja is not installed (pip install ninja)"
    return ""


def build_reason(name: str) -> str:
    """'' if `name` may be built (toolchain present, no earlier failure), else the reason."""
    return _failed.get(name) or toolchain_reason()


def _cpu_flags() -> str:
    # -march=native objects must not be reused on a CPU with fewer instructions.
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor()


def _fingerprint(sources: list[Path], cflags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    # the kernels' own sources plus the headers they include: the family folder's own (act/'s
    # mlp_blocks.h) and the ones the families share (`#include "../cpu_math.h"`: the folder's
    # parent; for a copy built elsewhere, benchmarks/kernel_ab.py, its own)
    headers = sorted({h for s in sources for d in (s.parent, s.parent.parent)
                      for h in d.glob("*.h")})
    for s in [*sources, *headers]:
        h.update(s.read_bytes())
    for part in (*cflags, torch.__version__, sys.version, _cpu_flags()):
        h.update(part.encode())
    return h.hexdigest()[:16]


@functools.cache
def _load(name: str, sources: tuple[str, ...], cflags: tuple[str, ...], ldflags: tuple[str, ...]):
    from torch.utils import cpp_extension

    paths = [Path(s) for s in sources]
    build_dir = cache_root() / "ext" / f"{name}-{_fingerprint(paths, cflags)}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch takes a file lock inside build_dir, so concurrent workers build once and share it.
    return cpp_extension.load(name=name, sources=[str(p) for p in paths],
                              extra_cflags=list(cflags), extra_ldflags=list(ldflags),
                              build_directory=str(build_dir), verbose=False)


def load_extension(name: str, sources: list[str | Path], *, cflags=DEFAULT_CFLAGS,
                   ldflags=DEFAULT_LDFLAGS):
    """The built module, or BuildError with a one-line reason (remembered for this process)."""
    with _lock:
        reason = build_reason(name)
        if reason:
            raise BuildError(f"cannot build {name}: {reason}")
        try:
            return _load(name, tuple(str(s) for s in sources), tuple(cflags), tuple(ldflags))
        except Exception as e:  # compiler/linker errors arrive as RuntimeError/CalledProcessError
            msg = _short(e)
            _failed[name] = f"build failed: {msg}"
            raise BuildError(f"cannot build {name}: {msg}") from e


class CppKernel:
    """One bundled C++ extension: `extension()` builds/loads it, `available(device)` says whether
    it may run there (cheap: no build), `build()` builds now and returns (ok, reason)."""

    def __init__(self, name: str, source: Path, what: str):
        self.name, self.source, self.what = name, source, what
        self._module = None

    def extension(self):
        # Kept once loaded: load_extension's checks (two PATH lookups for the toolchain) are not
        # free, and every forward and backward of a fused kernel asks for the module.
        if self._module is None:
            self._module = load_extension(self.name, [self.source])
        return self._module

    def available(self, device: str = "cpu") -> tuple[bool, str]:
        if not str(device).startswith("cpu"):
            return False, f"{self.what} on CPU tensors only (device {device})"
        reason = build_reason(self.name)
        return (False, reason) if reason else (True, "")

    def build(self) -> tuple[bool, str]:
        """Build now (the first build is slow, docs/figures.md; later ones reuse the disk cache)."""
        try:
            self.extension()
        except BuildError as e:
            return False, str(e)
        return True, ""


def _short(e: Exception) -> str:
    """The first compiler 'error:' line if there is one, else the exception's first line."""
    text = str(e)
    for line in text.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    return describe(e, 300)
