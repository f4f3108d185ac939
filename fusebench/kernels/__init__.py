"""Bundled kernels. Families register implementations in fusebench.kernels.registry."""
from fusebench.kernels.registry import families, get_impl, list_impls, register_impl

__all__ = ["families", "get_impl", "list_impls", "register_impl"]
