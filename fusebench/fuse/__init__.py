"""The fuser: the only package that knows both models and kernels."""
