// Shared pieces of the bundled C++ CPU kernels (included by act/, bn_act/ and ln2d/ cpu.cpp): the
// accumulation type, the parallel grain, fixed-chunk parallel loops and the activations with
// their derivatives. One definition each, so the families cannot drift apart in numerics.
//
// Math: float accumulation for float/bfloat16, double for double. expf is declared
// with glibc's SIMD variants (libmvec) so the act loops vectorise without -ffast-math.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>

#if defined(__GLIBC__) && defined(__x86_64__)
extern "C" {
__attribute__((__simd__("notinbranch"))) float expf(float) noexcept;
}
#endif

namespace fusebench {

constexpr int64_t kGrainElems = 32768;  // below ~128 KiB of work per thread, threads cost more

inline int64_t grain(int64_t elems_per_item) {
  return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, elems_per_item));
}

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

inline float exp_(float v) { return expf(v); }
inline double exp_(double v) { return std::exp(v); }
inline double erf_(double v) { return std::erf(v); }
inline double tanh_(double v) { return std::tanh(v); }

// exp(t) for t <= 0 in float, inline so that the act loops vectorise into straight-line code:
// Cephes' expf (round t / ln 2 to n, reduce with ln 2 split in two, a degree-6 polynomial on
// [-ln2/2, ln2/2], 2^n put into the exponent bits), max relative error 1e-7 (libmvec's: 2.5e-7).
// libmvec's vector expf is a call per 8 lanes that spills every ymm register: in the bn_act
// passes the sigmoid cost 4-6x the rest of the pass (8x240x20x20 apply, 1 thread: 1.53 ms
// SiLU vs 0.26 ms identity). Clamps are integer min/max (a float clamp before the arithmetic
// left GCC's loops scalar): t below -100 reads as -100 (t's bit pattern, sign dropped, is
// monotone in |t|; NaN and -inf land there too: callers that must propagate NaN check it), and
// n at -127, whose exponent bits are 0: results under 2^-126 flush to 0 (error < 1.2e-38).
// SiLU's loops only: GELU's derivative measured slower with it (Act<kGelu>).
inline float exp_nonpos(float t) {
  int32_t a = __builtin_bit_cast(int32_t, t) & 0x7fffffff;      // |t|
  a = a < 0x42c80000 ? a : 0x42c80000;                           // min(|t|, 100.f)
  t = -__builtin_bit_cast(float, a);
  const float n = (t * 1.44269504088896341f + 12582912.f) - 12582912.f;  // rint(t / ln 2)
  const float r = (t - n * 0.693359375f) + n * 2.12194440e-4f;   // t - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t ni = static_cast<int32_t>(n);
  ni = ni < -127 ? -127 : ni;
  return p * __builtin_bit_cast(float, (ni + 127) << 23);
}

// sigmoid from e = exp(-|v|) <= 1, which cannot overflow: 1 / (1 + e) for v >= 0, e / (1 + e)
// below (sigmoid(-inf) and anything under -88 is 0, as in float64 rounded); NaN is handed back
// by the last select.
template <typename A> inline A sigmoid(A v) { return A(1) / (A(1) + exp_(-v)); }
template <> inline float sigmoid(float v) {
  const float e = exp_nonpos(-std::fabs(v));
  const float s = (v >= 0.f ? 1.f : e) / (1.f + e);
  return __builtin_isunordered(v, v) ? v : s;
}

// (sigmoid(v), 1 - sigmoid(v)), the second as sigmoid(-v) from the same e, not 1 - s: at v > 3
// 1 - s cancels in float (SiLU's derivative off by 9.8e-7 from float64, as aten's). NaN: the
// callers multiply by v.
template <typename A> struct SigmoidPair { A s, one_minus_s; };
template <typename A> inline SigmoidPair<A> sigmoid_pair(A v) {
  const A s = sigmoid(v);
  return {s, A(1) - s};
}
template <> inline SigmoidPair<float> sigmoid_pair(float v) {
  const float e = exp_nonpos(-std::fabs(v));
  const float r = 1.f / (1.f + e), er = e * r;
  return {v >= 0.f ? r : er, v >= 0.f ? er : r};
}

// Split [0, n) into at most `parts` fixed chunks; fn(chunk_index, begin, end) runs in parallel.
// Fixed chunks (not at::parallel_for's own split) keep reductions independent of thread count.
template <typename F>
void parallel_chunks(int64_t n, int64_t parts, int64_t grain_items, const F& fn) {
  parts = std::max<int64_t>(1, std::min(parts, (n + grain_items - 1) / grain_items));
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p, p * n / parts, (p + 1) * n / parts);
  });
}

// ---------------------------------------------------------------- activations: f and f'
// The codes are the Python side's (kernels/bn_act/cpu.py passes them).
enum ActCode { kSilu = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3, kIdentity = 4, kRelu6 = 5,
               kHardswish = 6 };

template <int K> struct Act;
// kCostly: the derivative costs a transcendental per value (exp/erf/tanh): a backward pass
// that needs it twice stores it once instead (bn_act's dx pass reads g back).
template <> struct Act<kSilu> {
  static constexpr bool kCostly = true;
  template <typename A> static A f(A z) { return z * sigmoid(z); }
  template <typename A> static A d(A z) {
    const SigmoidPair<A> p = sigmoid_pair(z);
    return p.s * (A(1) + z * p.one_minus_s);
  }
};
template <> struct Act<kRelu> {
  static constexpr bool kCostly = false;
  // quiet compares: GCC (with -ftrapping-math) kept `z > 0` as control flow, and the dx loop
  // stayed scalar (relu backward 3x slower than silu's)
  template <typename A> static A f(A z) { return __builtin_isgreater(z, A(0)) ? z : A(0); }
  template <typename A> static A d(A z) { return static_cast<A>(__builtin_isgreater(z, A(0))); }
};
// Half of erfc(|z| / sqrt 2) and exp(-z^2 / 2) for float z, inline and branch-free: the erfc
// of Abramowitz & Stegun 7.1.26 (Hastings' t = 1 / (1 + p x), a degree-5 polynomial in t, times
// exp(-x^2)), whose exp(-x^2) at x = |z| / sqrt 2 is the Gaussian density's exp(-z^2 / 2): the
// GELU derivative reuses it, one exp for both. Absolute error in Phi under 1.5e-7 (GELU within
// 2.2e-7, its derivative 7.2e-8 of float64; aten's float32 kernels: 1.2e-6 and 2.8e-7), and
// relative error in the tail, erfc kept apart from 1 so that Phi(z < 0) has no cancellation.
// libmvec's erff is a call per 8 lanes that spills every vector register: bias_gelu ran at
// 4 GB/s, 35-37% of a copy (eleventh session's bound, convnext_atto).
struct GaussTail {
  float half_erfc;  // 0.5 * erfc(|z| / sqrt 2) = Phi(-|z|)
  float density;    // exp(-z^2 / 2)
};
inline GaussTail gauss_tail(float z) {
  const float x = std::fabs(z) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.3275911f * x);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496739f;
  p = p * t + 0.254829592f;
  const float e = exp_nonpos(-0.5f * z * z);
  return {0.5f * p * t * e, e};
}

template <> struct Act<kGelu> {  // exact (erf)
  static constexpr bool kCostly = true;
  template <typename A> static A f(A z) {
    return A(0.5) * z * (A(1) + erf_(z * A(0.7071067811865476)));
  }
  template <typename A> static A d(A z) {
    const A cdf = A(0.5) * (A(1) + erf_(z * A(0.7071067811865476)));
    return cdf + z * A(0.3989422804014327) * exp_(A(-0.5) * z * z);  // 1 / sqrt(2 pi)
  }
  // float: gauss_tail's inline erfc (NaN propagates through t; gelu(+inf) = inf, (-inf) = NaN,
  // as float64 says)
  static float f(float z) {
    const float h = gauss_tail(z).half_erfc;
    return z * (z < 0.f ? h : 1.f - h);
  }
  static float d(float z) {
    const GaussTail g = gauss_tail(z);
    return (z < 0.f ? g.half_erfc : 1.f - g.half_erfc) + z * 0.3989422804014327f * g.density;
  }
};
template <> struct Act<kGeluTanh> {  // tanh approximation
  static constexpr bool kCostly = true;
  template <typename A> static A u(A z) {
    return A(0.7978845608028654) * (z + A(0.044715) * z * z * z);  // sqrt(2 / pi)
  }
  template <typename A> static A f(A z) { return A(0.5) * z * (A(1) + tanh_(u(z))); }
  template <typename A> static A d(A z) {
    const A th = tanh_(u(z));
    return A(0.5) * (A(1) + th) +
           A(0.5) * z * (A(1) - th * th) * A(0.7978845608028654) * (A(1) + A(0.134145) * z * z);
  }
  // float: the halves of tanh that do not cancel, inline (libmvec's tanhf is a call per 8
  // lanes, as erff was). e = exp(-2|u|) <= 1, r = 1 / (1 + e): (1 + tanh u) / 2 is r for u >= 0
  // and e r below, 1 - tanh(u)^2 is 4 e r^2. 1 + t and 1 - t^2 from t itself subtract numbers
  // near 1: the derivative was off by up to 1.0e-6 at |z| in [3, 12] (as aten's tanh form),
  // this way by 1.3e-7 (docs/kernels.md, "GELU's tanh form"), and no slower. NaN: exp_nonpos
  // drops it (e = 0), but u is NaN only where z is, and both f and d multiply by z.
  // (These are sigmoid(2u) and 4 sigmoid(2u) sigmoid(-2u), but through sigmoid_pair the backward
  // measured 4-7% slower per call: its second select.)
  struct Halves { float half_1p, sech2; };
  static Halves halves(float z) {
    const float v = u(z);
    const float e = exp_nonpos(-2.f * std::fabs(v));
    const float r = 1.f / (1.f + e), er = e * r;
    return {v >= 0.f ? r : er, 4.f * er * r};
  }
  static float f(float z) { return z * halves(z).half_1p; }
  static float d(float z) {
    const Halves h = halves(z);
    return h.half_1p + 0.5f * z * h.sech2 * 0.7978845608028654f * (1.f + 0.134145f * z * z);
  }
};

template <> struct Act<kIdentity> {  // BN alone (a projection's BN): z and 1
  static constexpr bool kCostly = false;
  template <typename A> static A f(A z) { return z; }
  template <typename A> static A d(A) { return A(1); }
};
// MobileNet's two (torchvision, timm): quiet compares as for ReLU, so the loops vectorise. The
// derivatives are aten's at the kinks: hardtanh_backward is 0 at z <= 0 and z >= 6;
// hardswish_backward is 0 below -3, z / 3 + 1/2 on [-3, 3], 1 above. NaN stays NaN in f.
template <> struct Act<kRelu6> {
  static constexpr bool kCostly = false;
  template <typename A> static A f(A z) {
    return __builtin_isless(z, A(0)) ? A(0) : (__builtin_isgreater(z, A(6)) ? A(6) : z);
  }
  template <typename A> static A d(A z) {
    return static_cast<A>(__builtin_isgreater(z, A(0)) & __builtin_isless(z, A(6)));
  }
};
template <> struct Act<kHardswish> {  // z * relu6(z + 3) / 6, as aten writes it
  static constexpr bool kCostly = false;
  template <typename A> static A f(A z) { return z * Act<kRelu6>::f(z + A(3)) / A(6); }
  template <typename A> static A d(A z) {
    return __builtin_isless(z, A(-3)) ? A(0)
           : (__builtin_islessequal(z, A(3)) ? z / A(3) + A(0.5) : A(1));
  }
};

template <typename A> inline constexpr bool kIsIdentity = std::is_same_v<A, Act<kIdentity>>;

// Calls f(Act<K>{}) for a runtime activation code: one instantiation per activation.
template <typename F> void with_act(int64_t act, const F& f) {
  switch (act) {
    case kSilu: return f(Act<kSilu>{});
    case kRelu: return f(Act<kRelu>{});
    case kGelu: return f(Act<kGelu>{});
    case kGeluTanh: return f(Act<kGeluTanh>{});
    case kIdentity: return f(Act<kIdentity>{});
    case kRelu6: return f(Act<kRelu6>{});
    case kHardswish: return f(Act<kHardswish>{});
  }
  TORCH_CHECK(false, "unknown activation code ", act);
}

}  // namespace fusebench
