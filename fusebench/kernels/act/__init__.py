"""Native code shared by the three activation families (kernels/silu, se_gate, bias_gelu): one
C++ extension (cpu.cpp / cpu.py, one build and one cache entry for the three) and one Triton
module (triton.py). It registers nothing: each family registers its own impls (native.py)."""
