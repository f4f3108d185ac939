"""What `fusebench kernel silu` measures: the family's impls against its float64 reference."""
from __future__ import annotations

from fusebench.kernels.silu.function import silu_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

PROBLEM = register_problem(KernelProblem(
    family="silu", signature="fn(x) -> y",
    reference=silu_reference, builds=(("cpu", lazy_build("fusebench.kernels.act.cpu")),)))
