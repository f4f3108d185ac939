"""SE gate: x * sigmoid(gate_logits). function.py: the four layers (pure fwd/bwd ->
autograd.Function -> functional -> nn.Module); native.py: the cpu and triton impls; problem.py:
what `fusebench kernel se_gate` measures. Importing the package registers impls and problem."""
from fusebench.kernels.se_gate.function import SEGate, SEGateFunction, se_gate
from fusebench.kernels.se_gate import native, problem  # noqa: F401,E402  (registration)

__all__ = ["SEGate", "SEGateFunction", "se_gate"]
