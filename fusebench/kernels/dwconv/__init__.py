"""Depthwise KxK convolution (ConvNeXt's 7x7): aten's forward with a C++ backward on
channels-last. Importing the package registers its impls and its kernel problem."""
from fusebench.kernels.dwconv import cpu, problem, reference  # noqa: F401  (registration)
