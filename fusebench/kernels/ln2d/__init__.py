"""LayerNorm over the channel dim of NCHW ("LN2d"): y = (x - mean_c) * rstd_c * w[c] + b[c]."""
from fusebench.kernels.ln2d import reference  # noqa: F401  (registers the baselines)
