"""LayerNorm over the channel dim of NCHW ("LN2d"): y = (x - mean_c) * rstd_c * w[c] + b[c].
Importing the package registers its impls and its kernel problem."""
from fusebench.kernels.ln2d import reference  # noqa: F401  (registers the baselines)
from fusebench.kernels.ln2d import auto, cpu, function, problem, triton  # noqa: F401,E402
