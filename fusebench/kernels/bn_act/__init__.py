"""Training-mode BatchNorm2d + activation (SiLU / ReLU / GELU) in one forward and one backward:
statistics and the elementwise pass in as few memory passes as possible, saving only x and the
(C,) mean / invstd. Importing the package registers its impls and its kernel problem."""
from fusebench.kernels.bn_act import reference  # noqa: F401  (registers the baselines)
from fusebench.kernels.bn_act import cpu, problem, triton  # noqa: F401,E402
