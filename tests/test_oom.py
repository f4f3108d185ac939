"""Out-of-memory failures: CPU allocator messages are an `oom` like a CUDA OOM, and retried
with a smaller batch (issue 14.7)."""
from __future__ import annotations

import pytest

from fusebench.cell.oom import OOM_PATTERNS, is_oom, oom_pattern
from fusebench.run.runner import RunOptions, run_one
from tests.helpers import ASSETS, tiny_spec

ALLOC_FAIL = f"{ASSETS / 'alloc_fail.py'}:alloc_fail_cnn"

# one real message per OOM_PATTERNS entry (what each allocator prints)
MESSAGES = {
    "out of memory": "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)",
    "can't allocate memory": "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                             "can't allocate memory: you tried to allocate 1099511627776 bytes. "
                             "Error code 12 (Cannot allocate memory)",
    "not enough memory": "[enforce fail at C:\\a\\pytorch\\c10\\core\\impl\\alloc_cpu.cpp:72] "
                         "data. DefaultCPUAllocator: not enough memory: you tried to allocate "
                         "4294967296 bytes.",
    "std::bad_alloc": "std::bad_alloc",
    "cannot allocate memory": "[Errno 12] Cannot allocate memory",
}


def test_every_pattern_has_a_real_message():
    assert set(MESSAGES) == set(OOM_PATTERNS)


@pytest.mark.parametrize("pattern", list(OOM_PATTERNS))
def test_allocator_messages_are_oom(pattern):
    msg = MESSAGES[pattern]
    assert oom_pattern(msg) == pattern
    assert is_oom(RuntimeError(msg))
    try:    # wrapped by a model or compiler: `raise ... from` keeps it an OOM
        try:
            raise RuntimeError(msg)
        except RuntimeError as e:
            raise ValueError("forward failed") from e
    except ValueError as wrapped:
        assert is_oom(wrapped)


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA error: an illegal memory access was encountered (out of memory?)"),
    RuntimeError("shape mismatch"), ValueError("memory layout must be contiguous"),
    MemoryError("an illegal memory access was encountered")])
def test_other_failures_are_not_oom(exc):
    assert not is_oom(exc)


def test_oom_types():
    import torch
    assert is_oom(MemoryError()) and is_oom(torch.OutOfMemoryError("x"))


def test_cpu_allocation_failure_is_oom_and_retried():
    rec = run_one(tiny_spec(model=ALLOC_FAIL, batch_size=6))
    assert rec.status == "ok" and rec.spec.model.batch_size == 2
    assert rec.extra["oom_failed_batch_sizes"] == [6, 4, 3]
    assert rec.extra["requested_batch_size"] == 6
    rec = run_one(tiny_spec(model=ALLOC_FAIL, batch_size=6), RunOptions(retry_oom=False))
    assert rec.status == "oom" and rec.spec.model.batch_size == 6
    assert rec.error.type == "RuntimeError" and "can't allocate memory" in rec.error.message
