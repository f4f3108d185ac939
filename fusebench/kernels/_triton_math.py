"""Activation math shared by the Triton kernels (act, bn_act). Imported only by the lazily
imported `_triton_kernels` modules: importing triton is their cost, not the package's.

GELU's tanh form in the halves of tanh that do not cancel. With u = sqrt(2/pi)(z + 0.044715 z^3),
e = exp(-2|u|) <= 1 and r = 1 / (1 + e):
  (1 + tanh u) / 2 = r (u >= 0) or e r (u < 0),  1 - tanh(u)^2 = 4 e r^2.
The spelled form 0.5 z (1 + t) + 0.5 z (1 - t^2) ... with t = 2 sigmoid(2u) - 1 subtracts numbers
near 1 in float32: against float64, its derivative was off by up to 2.0e-6 at |z| in [3, 12]
(aten's: 1.0e-6), 7.8e-7 below; this form's by 1.4e-7 and 1.7e-7 (docs/kernels.md, "GELU's tanh
form"). SiLU's derivative s (1 + z (1 - s)) likewise takes 1 - s as sigmoid(-z) from the same
exp, not as a difference (9.8e-7 from float64 at z > 3 before, as aten's)."""
import triton
import triton.language as tl


@triton.jit
def _sigmoid_pair(v):
    """(sigmoid(v), sigmoid(-v)) from one exp, the second not as 1 - sigmoid(v)."""
    e = tl.exp(-tl.abs(v))
    r = 1.0 / (1.0 + e)
    er = e * r
    return tl.where(v >= 0.0, r, er), tl.where(v >= 0.0, er, r)


@triton.jit
def _gelu_tanh_halves(z):
    """((1 + tanh u) / 2, 1 - tanh(u)^2) for GELU's u: sigmoid(2u), 4 sigmoid(2u) sigmoid(-2u)."""
    s, ms = _sigmoid_pair(2.0 * 0.7978845608028654 * (z + 0.044715 * z * z * z))
    return s, 4.0 * s * ms


@triton.jit
def gelu_tanh(z):
    half_1p, _ = _gelu_tanh_halves(z)
    return z * half_1p


@triton.jit
def gelu_tanh_grad(z):
    half_1p, sech2 = _gelu_tanh_halves(z)
    return half_1p + 0.5 * z * sech2 * 0.7978845608028654 * (1.0 + 0.134145 * z * z)


@triton.jit
def gelu_erf(z):
    return 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))


@triton.jit
def gelu_erf_grad(z):
    cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
    return cdf + z * 0.3989422804014327 * tl.exp(-0.5 * z * z)


@triton.jit
def silu_grad(z):
    s, ms = _sigmoid_pair(z)
    return s * (1.0 + z * ms)
