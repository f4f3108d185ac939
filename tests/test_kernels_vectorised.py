"""The bundled C++ kernels' transcendental loops vectorise. Two deterministic marks in the built
library stand for it (timing would be a flaky test):
  - exp in SiLU's sigmoid and in GELU's erfc (cpu_math.h's inline `exp_nonpos`) has its 2^n
    as an 8-lane float-to-int conversion (`vcvttps2dq` on a ymm register) only where the loop
    vectorised; scalar, it is `vcvttss2si`. Before exp_nonpos the libraries had none (libmvec's
    expf did the conversion inside glibc). A GELU loop left scalar is how the bias+GELU
    backward ran 9-15x slower than aten's for sessions (its inner loop read dy / x / dx
    through a lambda's captures, which might alias), so the GELU functions are checked by name.
  - no float erf is called at all: GELU's erfc is inline since the twelfth session (libmvec's
    `erff` was a call per 8 lanes spilling every register, 35-37% of a copy's speed)."""
import importlib
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

VECTOR_CVT = re.compile(r"\bvcvttps2dq\s+%ymm")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
# the float GELU loops' functions (demangled): bn_act's Act<2> instantiations, act's bias_gelu
GELU_FLOAT = re.compile(r"Act<2>|Act<fusebench::kGelu>|bias_gelu_(fwd|bwd)_k<float, float, false>"
                        r"|bias_gelu_(fwd|bwd)_kIffLb0E")


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


def _vectorised_functions(family: str) -> set[str]:
    """Names of the functions that hold an 8-lane exp_nonpos conversion."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(_library(family))],
                         capture_output=True, text=True, check=True).stdout
    names, current = set(), ""
    for line in asm.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = m.group(1)
        elif VECTOR_CVT.search(line):
            names.add(current)
    return names


@pytest.mark.parametrize("family", FAMILIES)
def test_no_float_erf_is_called(family):
    data = _library(family).read_bytes()
    assert b"erff" not in data, f"{family}: calls a float erf (libmvec's erff) again"


@pytest.mark.parametrize("family", FAMILIES)
def test_exp_loops_are_vectorised(family):
    assert _vectorised_functions(family), f"{family}: no 8-lane exp_nonpos (loops left scalar?)"


@pytest.mark.parametrize("family", FAMILIES)
def test_gelu_loops_are_vectorised(family):
    gelu = [n for n in _vectorised_functions(family) if GELU_FLOAT.search(n)]
    assert gelu, f"{family}: no float GELU loop holds an 8-lane exp (left scalar?)"
