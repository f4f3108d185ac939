"""Which failures are out-of-memory. An `oom` record is retried with a smaller batch
(run/runner.py), so a CPU allocation failure must read as one just like a CUDA OOM does.

torch raises torch.OutOfMemoryError for CUDA, but a failed CPU allocation is a plain
RuntimeError from c10's DefaultCPUAllocator (or a C++ std::bad_alloc passed through as text):
those are recognised by their message, from this table."""
from __future__ import annotations

# exception type names that are OOMs whatever they say (torch.OutOfMemoryError, Python's own)
OOM_TYPES = ("OutOfMemoryError", "MemoryError")

# lower-case message fragment -> where it comes from
OOM_PATTERNS: dict[str, str] = {
    "out of memory": "CUDA / HIP / MPS / XPU allocators ('CUDA out of memory. Tried to ...')",
    "can't allocate memory": "c10 DefaultCPUAllocator on Linux ('DefaultCPUAllocator: can't "
                             "allocate memory: you tried to allocate N bytes. Error code 12')",
    "not enough memory": "c10 DefaultCPUAllocator on Windows ('DefaultCPUAllocator: not enough "
                         "memory: you tried to allocate N bytes')",
    "std::bad_alloc": "a C++ allocation (new, std::vector) that failed, surfaced as text",
    "cannot allocate memory": "ENOMEM from the OS (errno 12: mmap, fork, posix_memalign)",
}

# fragments that make a matching message something else: after an illegal access the device
# is gone (a smaller batch cannot help), whatever else the message guesses
NOT_OOM = ("illegal memory access", "illegal address")


def oom_pattern(message: str) -> str | None:
    """The OOM_PATTERNS key `message` matches, or None."""
    msg = message.lower()
    if any(x in msg for x in NOT_OOM):
        return None
    return next((p for p in OOM_PATTERNS if p in msg), None)


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory failure: by type, or by message, here or in the exception it was raised
    from (`raise X from oom`: a model or a compiler that wraps the allocator's error)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names = {c.__name__ for c in type(e).__mro__}
        if names & set(OOM_TYPES) and not any(x in str(e).lower() for x in NOT_OOM):
            return True
        if oom_pattern(str(e)):
            return True
        e = e.__cause__
    return False
