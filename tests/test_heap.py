"""Heap policies (measure/heap.py): each one applies, and each does what it says to a block the
size of a big activation. Run in a subprocess: mallopt changes the process for good."""
from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from fusebench.measure.heap import DEFAULT_HEAP, HEAP_POLICIES, heap_policy
from fusebench.spec import CellSpec

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# A step's activations, 8 x 16 MiB (each under the 32 MiB mmap threshold, so from the heap),
# written and freed: how much of the 128 MiB stays resident says what the policy does with a
# freed heap top (the next step re-faults whatever went back). libc's malloc itself, so that no
# Python object lands above the blocks and pins the heap top.
_PROBE = """
import ctypes, json, sys
from fusebench.measure.memory import pin_malloc, rss_bytes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
ok = pin_malloc(sys.argv[1])
n = 16 << 20
r0 = rss_bytes()
blocks = [libc.malloc(n) for _ in range(8)]
for b in blocks:
    libc.memset(b, 1, n)
for b in reversed(blocks):
    libc.free(b)
print(json.dumps({"ok": ok, "kept": (rss_bytes() - r0) >> 20}))
"""


def _probe(policy: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, policy], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
@pytest.mark.parametrize("name", list(HEAP_POLICIES))
def test_every_policy_applies(name):
    assert _probe(name)["ok"] is True


@glibc
def test_keep_holds_on_to_the_freed_heap_top_and_trim_gives_it_back():
    keep, trim = _probe("keep"), _probe("trim")
    assert keep["kept"] >= 120, keep          # all of it, for the next step to reuse
    assert trim["kept"] <= 64, trim           # over the 64 MiB threshold: given back


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="keep, trim"):
        heap_policy("jemalloc")


def test_heap_is_a_run_setting_not_part_of_the_configuration():
    a = CellSpec.for_model("convnext_atto", "eager")
    b = CellSpec.for_model("convnext_atto", "eager", heap="trim")
    assert a.heap is None and heap_policy(a.heap).name == DEFAULT_HEAP == "keep"
    assert a.cell_key() == b.cell_key()
    assert CellSpec.from_dict(b.to_dict()) == b


@glibc
@pytest.mark.parametrize("policy", list(HEAP_POLICIES))
def test_the_policy_reaches_the_worker_and_the_record(tmp_path, policy):
    from typer.testing import CliRunner

    from fusebench.cli import app
    from tests.helpers import TINY
    res = CliRunner().invoke(app, ["run", TINY, "-m", "eager", "-b", "2", "--steps", "2",
                                   "--warmup", "1", "--threads", "1", "--heap", policy,
                                   "--json", "--no-save", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)["records"][0]
    assert rec["spec"]["heap"] == policy and rec["extra"]["heap"] == policy
