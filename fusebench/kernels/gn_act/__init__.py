"""GroupNorm + activation (a diffusion UNet's GroupNorm -> SiLU; GroupNorm alone with the
identity) in one forward and one backward, saving only x and the (N, G) mean / rstd. Importing
the package registers its impls and its kernel problem."""
from fusebench.kernels.gn_act import reference  # noqa: F401  (registers the baselines)
from fusebench.kernels.gn_act import cpu, function, problem, triton  # noqa: F401,E402
