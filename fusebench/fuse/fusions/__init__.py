"""One fusion per file: each holds its pattern's rewrite rule, its fused module and, where it
runs several ops in one Function, its MultiOpKernel. The order they are tried in is
fusebench.fuse.ORDER."""
