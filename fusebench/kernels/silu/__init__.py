"""SiLU, memory-efficient (saves its input only). function.py: the four layers (pure fwd/bwd ->
autograd.Function -> functional -> nn.Module); native.py: the cpu and triton impls; problem.py:
what `fusebench kernel silu` measures. Importing the package registers impls and problem."""
from fusebench.kernels.silu.function import SiLUFunction, SiLUMemEff, silu_me
from fusebench.kernels.silu import native, problem  # noqa: F401,E402  (registration)

__all__ = ["SiLUFunction", "SiLUMemEff", "silu_me"]
