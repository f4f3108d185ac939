"""Bias + GELU: gelu(x + bias[c]). function.py: the four layers (pure fwd/bwd ->
autograd.Function -> functional -> nn.Module); native.py: the cpu and triton impls; problem.py:
what `fusebench kernel bias_gelu` measures. Importing the package registers impls and problem."""
from fusebench.kernels.bias_gelu.function import BiasGELU, BiasGELUFunction, bias_gelu
from fusebench.kernels.bias_gelu import native, problem  # noqa: F401,E402  (registration)

__all__ = ["BiasGELU", "BiasGELUFunction", "bias_gelu"]
