"""The silu family's native impls: `cpu` (C++/OpenMP) and `triton`. Their code is shared with
the other activation families in kernels/act (one C++ extension, one Triton module); the
family registers them here under its own name."""
from fusebench.kernels.act import cpu, triton
from fusebench.kernels.registry import register_impl

register_impl("silu", "cpu", available=cpu.available)(cpu.silu_cpu)
register_impl("silu", "triton", available=triton.available)(triton.silu_triton)
