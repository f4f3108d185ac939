"""Bundled kernel families. Each family package registers its impls (registry.py) and its kernel
problem (problem.py) when imported; this package imports them all, so any import of
fusebench.kernels sees every family. `import fusebench` alone stays cheap: it never imports this."""
from fusebench.kernels import (  # noqa: F401
    bias_gelu, bn_act, dwconv, glu, gn_act, grn, ln2d, rms_norm, se_gate, silu)
from fusebench.kernels.problem import PROBLEMS, KernelProblem, get_problem
from fusebench.kernels.registry import families, get_impl, list_impls, register_impl

__all__ = ["KernelProblem", "PROBLEMS", "families", "get_impl", "get_problem", "list_impls",
           "register_impl"]
