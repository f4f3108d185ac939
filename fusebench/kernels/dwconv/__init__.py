"""Depthwise KxK convolution (ConvNeXt's 7x7, EfficientNet's 3x3 / 5x5, stride 1 or 2): a C++
forward / grad input / grad weight on channels-last (cpu), a Triton backward (triton).
Importing the package registers its impls and its kernel problem."""
from fusebench.kernels.dwconv import cpu, problem, reference, triton  # noqa: F401 (registration)
