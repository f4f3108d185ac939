"""GRN after a bias + activation, u = GRN(act(h + b)) over an (N, H, W, C) h: the middle of
ConvNeXt V2's MLP (fc1 -> GELU -> GRN -> fc2), what the grn_mlp site runs between its GEMMs.
function.py: the pure pair in torch ops, the float64 reference, the autograd.Function;
native.py: the cpu and triton impls (code in kernels/act with the other act kernels);
problem.py: what `fusebench kernel grn` measures. Importing the package registers them."""
from fusebench.kernels.grn import function, native, problem  # noqa: F401
