"""The bundled C++ kernels' transcendental loops vectorise. Two deterministic marks in the built
library stand for it (timing would be a flaky test):
  - erf (GELU) goes through glibc's AVX2 vector erff (libmvec, `_ZGVdN8v_erff`); a loop GCC
    leaves scalar calls plain `erff` per value. That is how the bias+GELU backward ran 9-15x
    slower than aten's for sessions (its inner loop read dy / x / dx through a lambda's
    captures, which might alias).
  - exp in SiLU's sigmoid is cpu_math.h's inline `exp_nonpos`, whose 2^n is an
    8-lane float-to-int conversion (`vcvttps2dq` on a ymm register) only where the loop
    vectorised; scalar, it is `vcvttss2si`. Before exp_nonpos the libraries had none (libmvec's
    expf did the conversion inside glibc)."""
import importlib
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

VECTOR_ERFF = b"_ZGVdN8v_erff"   # glibc's 8-lane AVX2 erff
VECTOR_CVT = re.compile(r"\bvcvttps2dq\s+%ymm")


def _avx2_glibc() -> bool:
    if platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2 " in flags and " fma " in flags


pytestmark = pytest.mark.skipif(not _avx2_glibc(), reason="the AVX2 loops need x86_64 glibc on "
                                "an AVX2+FMA CPU (-march=native)")
FAMILIES = ["act", "bn_act"]     # the families with SiLU / GELU loops


def _library(family: str) -> Path:
    mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
    ok, reason = mod.build()
    if not ok:
        pytest.skip(reason)
    return Path(mod.extension().__file__)


@pytest.mark.parametrize("family", FAMILIES)
def test_erf_loops_call_the_vector_erff(family):
    assert VECTOR_ERFF in _library(family).read_bytes(), \
        f"{family}: no loop calls the AVX2 vector erff (left scalar?)"


@pytest.mark.parametrize("family", FAMILIES)
def test_exp_loops_are_vectorised(family):
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(_library(family))],
                         capture_output=True, text=True, check=True).stdout
    assert VECTOR_CVT.search(asm), f"{family}: no 8-lane exp_nonpos (its loops left scalar?)"
