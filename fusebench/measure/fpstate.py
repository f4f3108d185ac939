"""Whether this process flushes subnormal floats to zero.

A shared object built with -ffast-math links gcc's crtfastmath, which sets the CPU's
flush-to-zero / denormals-are-zero bits (x86 MXCSR) for the whole process when it is loaded.
torch 2.4's inductor builds its C++ kernels that way, so after a torch.compile step every op
in the process - eager ones, the float64 reference - reads and writes subnormals as zero. A
cell that starts IEEE and ends flushing says so: its later steps and checks ran like that."""
from __future__ import annotations

import sys


def flushes_subnormals() -> bool:
    """True when a subnormal double reads as zero (DAZ) or a result below the normal range is
    written as zero (FTZ). Python floats use the same SSE unit and control bits as the kernels
    (the products run when called: an attribute read is never folded at compile time)."""
    subnormal = sys.float_info.min * 0.5                # 0.0 under FTZ
    return subnormal == 0.0 or subnormal * 1.0 == 0.0   # the second: 0.0 under DAZ alone


def change_event(before: bool, after: bool) -> str | None:
    """The fp_state event's message for a cell that ran between the two readings, or None."""
    if after and not before:
        return ("subnormal floats flush to zero in this cell's process since the cell ran: "
                "something it loaded set FTZ/DAZ (a library built with -ffast-math; torch "
                "2.4's inductor builds its C++ kernels so), and the steps and checks after "
                "that ran with it")
    if after:
        return ("subnormal floats flushed to zero in this cell's process before the cell "
                "started (FTZ/DAZ set by the environment or a preloaded library)")
    if before:
        return "subnormal floats flushed to zero when the cell started and not after it"
    return None
