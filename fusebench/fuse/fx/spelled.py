"""Activations written out by hand, matched as one activation: nanoGPT's NewGELU
`0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))` (= GELU, approximate="tanh"), the erf form
`x*0.5*(1+erf(x/sqrt(2)))` (= GELU, approximate="none"), `x*sigmoid(x)` (= SiLU), quick GELU
`x*sigmoid(1.702*x)`, and MobileNetV3's from before torch had them (and timm's fallbacks):
`x*relu6(x+3)/6` (= hardswish) and the gate `relu6(x+3)/6` (= hardsigmoid, `hard_sigmoid`). A
product is read as its factors whatever the association or operand order (`0.5*x*(..)`,
`x*0.5*(..)`, `(..)*(0.5*x)`), a division by a constant as a factor, a cube as `x**3`,
`torch.pow(x, 3)` or `x*x*x`. Constants match to 1e-6 relative (a rounded sqrt(2/pi) is the same
GELU to float precision)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch.fx as fx

from fusebench.fuse.fx import nodes as N

RTOL = 1e-6
QUICK_GELU = 1.702


@dataclass(frozen=True)
class Spelled:
    """What a written-out activation computes: kind ('gelu' | 'silu' | 'quick_gelu'), gelu's
    approximate, its input and the interior nodes the match absorbs (all but the output)."""
    kind: str
    approximate: str
    x: fx.Node
    nodes: tuple[fx.Node, ...]


def _close(v: float | None, want: float) -> bool:
    return v is not None and math.isclose(v, want, rel_tol=RTOL)


def factors(n, seen: list) -> tuple[float, list]:
    """(product of the constant factors, the node factors) of a mul/div tree rooted at n; the
    mul/div nodes walked are appended to `seen` (the root included)."""
    if N.op(n) == "mul" or (N.op(n) == "div" and N.number(N.arg(n, 1, "other")) is not None):
        ab = N.operands(n)
        if ab is not None:
            seen.append(n)
            a, b = ab
            if N.op(n) == "div":
                ca, na = factors(a, seen)
                return ca / N.number(b), na
            ca, na = factors(a, seen) if isinstance(a, fx.Node) else (N.number(a), [])
            cb, nb = factors(b, seen) if isinstance(b, fx.Node) else (N.number(b), [])
            if ca is None or cb is None:
                return math.nan, []
            return ca * cb, na + nb
    return 1.0, [n]


def _one_plus(n, fn: str, seen: list):
    """The argument z of `1 + fn(z)` (either order), or None."""
    ab = N.operands(n) if N.op(n) == "add" else None
    if ab is None:
        return None
    inner = next((v for v in ab if N.op(v) == fn), None)
    const = next((N.number(v) for v in ab if v is not inner), None)
    if inner is None or not _close(const, 1.0):
        return None
    seen += [n, inner]
    return N.x_of(inner)


def _scaled_x(z, x, seen: list) -> float | None:
    """k when z computes k * x (z may be x itself), else None."""
    c, ns = factors(z, seen)
    return c if ns == [x] else None


def _is_cube(n, x, seen: list) -> bool:
    if N.op(n) == "pow" and N.x_of(n) is x and _close(N.number(N.arg(n, 1, "exponent")), 3.0):
        seen.append(n)
        return True
    c, ns = factors(n, seen)
    return _close(c, 1.0) and ns == [x, x, x]


def _tanh_arg(z, x, seen: list) -> bool:
    """z == sqrt(2/pi) * (x + 0.044715 * x**3)."""
    c, ns = factors(z, seen)
    if not _close(c, math.sqrt(2 / math.pi)) or len(ns) != 1 or N.op(ns[0]) != "add":
        return False
    a, b = N.operands(ns[0]) or (None, None)
    seen.append(ns[0])
    other = b if a is x else a if b is x else None
    if other is None:
        return False
    k, cube = factors(other, seen)
    return _close(k, 0.044715) and (cube == [x, x, x]
                                    or (len(cube) == 1 and _is_cube(cube[0], x, seen)))


def _gelu(const: float, x, rest, seen: list) -> str | None:
    if not _close(const, 0.5):
        return None
    z = _one_plus(rest, "tanh", seen)
    if z is not None:
        return "tanh" if _tanh_arg(z, x, seen) else None
    z = _one_plus(rest, "erf", seen)
    if z is not None and _close(_scaled_x(z, x, seen), 1 / math.sqrt(2)):
        return "none"
    return None


def _sigmoid(const: float, x, rest, seen: list) -> str | None:
    if N.op(rest) != "sigmoid" or not _close(const, 1.0):
        return None
    seen.append(rest)
    k = _scaled_x(N.x_of(rest), x, seen)
    return "silu" if _close(k, 1.0) else "quick_gelu" if _close(k, QUICK_GELU) else None


def _relu6_plus_3(n, seen: list) -> fx.Node | None:
    """x when n == relu6(x + 3) (either operand order), else None."""
    inner = N.x_of(n) if N.op(n) == "relu6" else None
    ab = N.operands(inner) if N.op(inner) == "add" else None
    for x, k in (ab, ab[::-1]) if ab else ():
        if isinstance(x, fx.Node) and _close(N.number(k), 3.0):
            seen += [n, inner]
            return x
    return None


def _hardswish(const: float, x, rest, seen: list) -> str | None:
    # not x * hardsigmoid(x): autograd of it takes aten's float 1/6 (kernels/act/gate.py), a
    # few 1e-8 off hardswish's own derivative, which the kernel computes
    return "hardswish" if _close(const, 1 / 6) and _relu6_plus_3(rest, seen) is x else None


def hard_sigmoid(out) -> tuple[fx.Node, tuple[fx.Node, ...]] | None:
    """(x, interior nodes) when `out` computes relu6(x + 3) / 6 (or * (1/6)), else None."""
    if N.op(out) not in ("mul", "div"):
        return None
    seen: list = []
    const, ns = factors(out, seen)
    x = _relu6_plus_3(ns[0], seen) if len(ns) == 1 and _close(const, 1 / 6) else None
    if x is None:
        return None
    inner = [v for v in dict.fromkeys(seen) if v is not out]
    return (x, tuple(inner)) if _closed(out, x, inner) else None


def _closed(out, x, inner: list) -> bool:
    """Every use of x and of the interior nodes stays inside the expression."""
    inside = set(inner) | {out}
    return all(set(v.users) <= inside for v in (x, *inner))


def spelled(out: fx.Node) -> Spelled | None:
    """The written-out activation whose last op is `out`, or None."""
    if N.op(out) not in ("mul", "div"):
        return None
    top: list = []
    const, ns = factors(out, top)
    if len(ns) != 2 or any(not isinstance(v, fx.Node) for v in ns):
        return None
    for x, rest in (ns, ns[::-1]):
        seen: list = []
        approx = _gelu(const, x, rest, seen)
        kind = "gelu" if approx else (_sigmoid(const, x, rest, seen)
                                      or _hardswish(const, x, rest, seen))
        inner = [v for v in dict.fromkeys(top + seen) if v is not out and v is not x]
        if kind and _closed(out, x, inner):
            return Spelled(kind, approx or "none", x, tuple(inner))
    return None
