"""The bundled C++ kernels' transcendental loops vectorise: their built library calls glibc's
AVX2 vector expf (libmvec, `_ZGVdN8v_expf`). A loop GCC leaves scalar calls plain `expf` per
value instead; that is how the bias+GELU backward ran 9-15x slower than aten's for sessions
(its inner loop read dy / x / dx through a lambda's captures, which might alias). Timing would
be a flaky test; the symbol is a deterministic one."""
import importlib
import platform
from pathlib import Path

import pytest

VECTOR_EXPF = b"_ZGVdN8v_expf"   # glibc's 8-lane AVX2 expf


def _avx2_glibc() -> bool:
    if platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx2 " in flags and " fma " in flags


pytestmark = pytest.mark.skipif(not _avx2_glibc(), reason="libmvec's AVX2 variants need "
                                "x86_64 glibc on an AVX2+FMA CPU (-march=native)")


@pytest.mark.parametrize("family", ["act", "bn_act"])   # the families whose loops call expf
def test_exp_loops_call_the_vector_expf(family):
    mod = importlib.import_module(f"fusebench.kernels.{family}.cpu")
    ok, reason = mod.build()
    if not ok:
        pytest.skip(reason)
    lib = Path(mod.extension().__file__).read_bytes()
    assert VECTOR_EXPF in lib, f"{family}: no loop calls the AVX2 vector expf (left scalar?)"
