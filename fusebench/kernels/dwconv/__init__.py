"""Depthwise KxK convolution kernels (ConvNeXt's 7x7): a C++ forward/backward on channels-last."""
