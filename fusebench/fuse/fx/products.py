"""A matrix product over the last two dims, however the code writes it: `a @ b`, torch.matmul,
bmm, or an einsum whose equation is one (`torch.einsum("b h i d, b h j d -> b h i j", q, k)`,
Stable Diffusion's and lucidrains' attention; einops.einsum with word axes, equation last).

An einsum is a product here when both operands and the output share their leading axes (the
same names, in the same order: batch dims, or `...`), each has two more, and one of a's last
two is summed: `...ik,...kj->...ij` is a @ b, `...ik,...jk->...ij` is a @ b^T. Anything else
(a reduction over a batch axis, axes in another order, an outer product) is not one."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.fx as fx

from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.leaves import einops_function

ELLIPSIS = "..."


class Product(NamedTuple):
    a: fx.Node
    b: fx.Node
    b_rows: bool        # b is laid out (.., n, k): the product is a @ b^T


def product(n) -> Product | None:
    """n as a Product, or None."""
    if N.op(n) in ("matmul", "bmm"):
        ab = N.operands(n)
        return Product(*ab, False) if ab and all(isinstance(x, fx.Node) for x in ab) else None
    got = _einsum_call(n)
    if got is None:
        return None
    eq, tensors, words = got
    if len(tensors) != 2 or not all(isinstance(t, fx.Node) for t in tensors):
        return None
    b_rows = _as_product(eq, words)
    return None if b_rows is None else Product(*tensors, b_rows)


def _einsum_call(n) -> tuple[str, tuple, bool] | None:
    """(equation, operands, axes are words) of an einsum call node."""
    if not isinstance(n, fx.Node) or n.op != "call_function" or n.kwargs:
        return None
    if n.target is torch.einsum and n.args and isinstance(n.args[0], str):
        rest = n.args[1:]
        tensors = tuple(rest[0]) if len(rest) == 1 and isinstance(rest[0], (list, tuple)) \
            else rest
        return n.args[0], tensors, False
    if n.target is not None and n.target is einops_function("einsum") and n.args \
            and isinstance(n.args[-1], str):
        return n.args[-1], n.args[:-1], True
    return None


def _axes(side: str, words: bool) -> tuple[str, ...] | None:
    if words:
        return None if "(" in side else tuple(side.split())
    s, out = side.replace(" ", ""), []
    while s:
        step = 3 if s.startswith(ELLIPSIS) else 1
        out.append(s[:step])
        s = s[step:]
    return tuple(out) if all(a == ELLIPSIS or a.isalpha() for a in out) else None


def _as_product(eq: str, words: bool) -> bool | None:
    """b_rows for an equation that is a matrix product (module doc), else None."""
    if eq.count("->") != 1:
        return None
    lhs, rhs = eq.split("->")
    sides = [_axes(s, words) for s in (*lhs.split(","), rhs)]
    if len(sides) != 3 or any(s is None for s in sides):
        return None
    a, b, out = sides
    if not (len(a) == len(b) == len(out) >= 2) or any(len(set(s)) != len(s) for s in sides):
        return None
    lead = a[:-2]
    if b[:-2] != lead or out[:-2] != lead:
        return None
    i, k = a[-2:]
    if k in out:
        return None
    for b_rows, (kb, j) in ((False, b[-2:]), (True, b[-2:][::-1])):
        if kb == k and j not in (i, k) and j not in lead and out[-2:] == (i, j):
            return b_rows
    return None
