"""The bias_gelu family's native impls: `cpu` (C++/OpenMP) and `triton`. Their code is shared with
the other activation families in kernels/act (one C++ extension, one Triton module); the
family registers them here under its own name."""
from fusebench.kernels.act import cpu, triton
from fusebench.kernels.registry import register_impl

register_impl("bias_gelu", "cpu", available=cpu.available)(cpu.bias_gelu_cpu)
register_impl("bias_gelu", "triton", available=triton.available)(triton.bias_gelu_triton)
