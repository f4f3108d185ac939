"""GLU gates, act(a) * b (SwiGLU: silu, GeGLU: gelu, ReGLU: relu), the middle of a gated MLP
(LLaMA's down(silu(gate(x)) * up(x))). function.py: the pure pair and the autograd.Function;
native.py: the cpu and triton impls (code shared with the act families in kernels/act);
problem.py: what `fusebench kernel glu` measures. Importing the package registers them."""
from fusebench.kernels.glu import function, native, problem  # noqa: F401
