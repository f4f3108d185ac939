"""RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * w (LLaMA's, T5's,
torch.nn.RMSNorm). Importing the package registers its impls and its kernel problem."""
from fusebench.kernels.rms_norm import reference  # noqa: F401  (registers the baselines)
from fusebench.kernels.rms_norm import cpu, function, problem, triton  # noqa: F401,E402
