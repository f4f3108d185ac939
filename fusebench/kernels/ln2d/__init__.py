"""LayerNorm over the channel dim of NCHW ("LN2d"): y = (x - mean_c) * rstd_c * w[c] + b[c]."""
from fusebench.kernels.ln2d import reference  # noqa: F401  (registers the baselines)
from fusebench.kernels.ln2d import cpu, function, fused, triton  # noqa: F401,E402  (bundled kernels)
