// Shared pieces of the bundled C++ CPU kernels (included by act/, bn_act/ and ln2d/ cpu.cpp): the
// accumulation type, the parallel grain, fixed-chunk parallel loops and the activations with
// their derivatives. One definition each, so the families cannot drift apart in numerics.
//
// Math: float accumulation for float/bfloat16, double for double. expf/erff/tanhf are declared
// with glibc's SIMD variants (libmvec) so the act loops vectorise without -ffast-math.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__GLIBC__) && defined(__x86_64__)
extern "C" {
__attribute__((__simd__("notinbranch"))) float expf(float) noexcept;
__attribute__((__simd__("notinbranch"))) float erff(float) noexcept;
__attribute__((__simd__("notinbranch"))) float tanhf(float) noexcept;
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
inline float erf_(float v) { return erff(v); }
inline double erf_(double v) { return std::erf(v); }
inline float tanh_(float v) { return tanhf(v); }
inline double tanh_(double v) { return std::tanh(v); }

template <typename A> inline A sigmoid(A v) { return A(1) / (A(1) + exp_(-v)); }

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
enum ActCode { kSilu = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3, kIdentity = 4 };

template <int K> struct Act;
// kCostly: the derivative costs a transcendental per value (exp/erf/tanh): a backward pass
// that needs it twice stores it once instead (bn_act's dx pass reads g back).
template <> struct Act<kSilu> {
  static constexpr bool kCostly = true;
  template <typename A> static A f(A z) { return z / (A(1) + exp_(-z)); }
  template <typename A> static A d(A z) {
    const A s = sigmoid(z);
    return s * (A(1) + z * (A(1) - s));
  }
};
template <> struct Act<kRelu> {
  static constexpr bool kCostly = false;
  // quiet compares: GCC (with -ftrapping-math) kept `z > 0` as control flow, and the dx loop
  // stayed scalar (relu backward 3x slower than silu's)
  template <typename A> static A f(A z) { return __builtin_isgreater(z, A(0)) ? z : A(0); }
  template <typename A> static A d(A z) { return static_cast<A>(__builtin_isgreater(z, A(0))); }
};
template <> struct Act<kGelu> {  // exact (erf)
  static constexpr bool kCostly = true;
  template <typename A> static A f(A z) {
    return A(0.5) * z * (A(1) + erf_(z * A(0.7071067811865476)));
  }
  template <typename A> static A d(A z) {
    const A cdf = A(0.5) * (A(1) + erf_(z * A(0.7071067811865476)));
    return cdf + z * A(0.3989422804014327) * exp_(A(-0.5) * z * z);  // 1 / sqrt(2 pi)
  }
};
template <> struct Act<kGeluTanh> {  // tanh approximation
  static constexpr bool kCostly = true;
  template <typename A> static A t(A z) {
    return tanh_(A(0.7978845608028654) * (z + A(0.044715) * z * z * z));  // sqrt(2 / pi)
  }
  template <typename A> static A f(A z) { return A(0.5) * z * (A(1) + t(z)); }
  template <typename A> static A d(A z) {
    const A th = t(z);
    return A(0.5) * (A(1) + th) +
           A(0.5) * z * (A(1) - th * th) * A(0.7978845608028654) * (A(1) + A(0.134145) * z * z);
  }
};

template <> struct Act<kIdentity> {  // BN alone (a projection's BN): z and 1
  static constexpr bool kCostly = false;
  template <typename A> static A f(A z) { return z; }
  template <typename A> static A d(A) { return A(1); }
};

// Calls f(Act<K>{}) for a runtime activation code: one instantiation per activation.
template <typename F> void with_act(int64_t act, const F& f) {
  switch (act) {
    case kSilu: return f(Act<kSilu>{});
    case kRelu: return f(Act<kRelu>{});
    case kGelu: return f(Act<kGelu>{});
    case kGeluTanh: return f(Act<kGeluTanh>{});
    case kIdentity: return f(Act<kIdentity>{});
  }
  TORCH_CHECK(false, "unknown activation code ", act);
}

}  // namespace fusebench
