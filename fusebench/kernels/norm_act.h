// The passes the norm + activation kernels share (bn_act/ and gn_act/ cpu.cpp): shifted
// per-channel sums (rows of C for channels-last, planes of H*W for NCHW) and the elementwise
// passes y = act((x - mean) * scale + shift) and dx = scale * g + (x - mean) * u + o, with g
// = dy * act'(z) recomputed or read back from dx. Per-channel arrays for rows, scalars for a
// plane: a caller with statistics per (sample, channel) passes each sample's slice.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "huge_pages.h"

namespace fusebench {

constexpr int64_t kBlock = 256;         // values summed in float before going into double

// ---------------------------------------------------------------- reductions
// Channels-last: per-channel sums over the rows [r0, r1) of (C,)-rows, added into s1 / s2:
// s1 += sum a(c, i), s2 += sum b(c, i) where term(xr, dr, c, a, b) yields both for row i.
template <typename A, typename Term>
void row_sums(int64_t r0, int64_t r1, int64_t C, double* s1, double* s2, const Term& term_) {
  const Term term = term_;  // a local copy: stores to b1/b2 cannot touch its pointers
  std::vector<A> b1(C), b2(C);
  for (int64_t r = r0; r < r1; r += kBlock) {
    std::fill(b1.begin(), b1.end(), A(0));
    std::fill(b2.begin(), b2.end(), A(0));
    A* p1 = b1.data();
    A* p2 = b2.data();
    for (int64_t i = r; i < std::min(r1, r + kBlock); ++i) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) term(i, c, p1[c], p2[c]);
    }
    for (int64_t c = 0; c < C; ++c) { s1[c] += double(p1[c]); s2[c] += double(p2[c]); }
  }
}

// NCHW: the sums over N planes of HW values (term(n, i, a1, a2) finds the value: bn_act's
// planes are one channel's across the batch, gn_act's one plane at a time).
template <typename A, typename Term>
void plane_sums(int64_t N, int64_t HW, double& s1, double& s2, const Term& term_) {
  const Term term = term_;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i0 = 0; i0 < HW; i0 += kBlock) {
      const int64_t i1 = std::min(HW, i0 + kBlock);
      A a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
      for (int64_t i = i0; i < i1; ++i) term(n, i, a1, a2);
      s1 += double(a1);
      s2 += double(a2);
    }
}

// ---------------------------------------------------------------- elementwise passes
// Plain functions over pointer arguments, called from the parallel lambdas: a pointer read
// through a lambda's captures is reloaded around every store (it might alias), and GCC then
// turned the per-channel loads into gathers (measured 3-10x slower backward passes).
// Res: y = act(z + res), res a residual in x's layout (a ResNet block's `bn3 -> += identity ->
// ReLU`); a compile-time flag, so the plain passes keep their loops as they were.
template <typename T, typename A, typename Act, bool Res = false>
void act_rows(const T* __restrict x, T* __restrict y, const A* __restrict m,
              const A* __restrict sc, const A* __restrict sh, int64_t r0, int64_t r1,
              int64_t C, const T* __restrict res = nullptr) {
  for (int64_t r = r0; r < r1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      A z = (static_cast<A>(x[r * C + c]) - m[c]) * sc[c] + sh[c];
      if constexpr (Res) z += static_cast<A>(res[r * C + c]);
      y[r * C + c] = static_cast<T>(Act::f(z));
    }
  }
}

template <typename T, typename A, typename Act, bool Res = false>
void act_plane(const T* __restrict x, T* __restrict y, A m, A sc, A sh, int64_t n,
               const T* __restrict res = nullptr) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    A z = (static_cast<A>(x[i]) - m) * sc + sh;
    if constexpr (Res) z += static_cast<A>(res[i]);
    y[i] = static_cast<T>(Act::f(z));
  }
}

// dx = scale * g + (x - mean) * u + o with g as the sums pass stored it: in dx itself
// (Act::kCostly; g == dx, so neither is __restrict) or in a residual's gradient
template <typename T, typename A>
void dx_from_g(const T* __restrict x, const T* g, T* dx, const A* __restrict m,
               const A* __restrict sc, const A* __restrict u, const A* __restrict o, int64_t r0,
               int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const A xc = static_cast<A>(x[r * C + c]) - m[c];
      dx[r * C + c] = static_cast<T>(sc[c] * static_cast<A>(g[r * C + c]) + xc * u[c] + o[c]);
    }
  }
}

template <typename T, typename A>
void dx_plane_from_g(const T* __restrict x, const T* g, T* dx, A m, A sc, A u, A o,
                     int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    dx[i] = static_cast<T>(sc * static_cast<A>(g[i]) + (static_cast<A>(x[i]) - m) * u + o);
}

// dx = scale * g + (x - mean) * u + o, g = dy * act'((x - mean) * scale + shift)
template <typename T, typename A, typename Act>
void dx_rows(const T* __restrict dy, const T* __restrict x, T* __restrict dx,
             const A* __restrict m, const A* __restrict sc, const A* __restrict sh,
             const A* __restrict u, const A* __restrict o, int64_t r0, int64_t r1, int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const A xc = static_cast<A>(x[r * C + c]) - m[c];
      const A g = static_cast<A>(dy[r * C + c]) * Act::d(xc * sc[c] + sh[c]);
      dx[r * C + c] = static_cast<T>(sc[c] * g + xc * u[c] + o[c]);
    }
  }
}

template <typename T, typename A, typename Act>
void dx_plane(const T* __restrict dy, const T* __restrict x, T* __restrict dx, A m, A sc, A sh,
              A u, A o, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A xc = static_cast<A>(x[i]) - m;
    const A g = static_cast<A>(dy[i]) * Act::d(xc * sc + sh);
    dx[i] = static_cast<T>(sc * g + xc * u + o);
  }
}

inline bool is_cl(const at::Tensor& x) {
  return !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

inline at::Tensor dense(const at::Tensor& x) {
  return x.is_contiguous() || x.is_contiguous(at::MemoryFormat::ChannelsLast) ? x
                                                                              : x.contiguous();
}

inline at::ScalarType acc_type(at::ScalarType st) {
  return st == at::kDouble ? at::kDouble : at::kFloat;
}

// A norm + act backward's inputs as its passes read them: x dense (NCHW or channels-last), dy
// in x's layout and dtype, the two saved statistics and the (C,) weight and bias in the
// accumulation type, dx allocated in x's layout.
struct BwdArgs {
  at::Tensor dy, x, s1, s2, w, b, dx;
  bool cl;
  at::ScalarType acc;
};

inline BwdArgs bwd_args(const char* op, const at::Tensor& dy, at::Tensor x, const at::Tensor& s1,
                        const at::Tensor& s2, const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(dy.sizes() == x.sizes(), op, ": dy and x shapes differ");
  x = dense(x);
  const bool cl = is_cl(x);
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const auto acc = acc_type(x.scalar_type());
  return {dy.to(x.scalar_type()).contiguous(fmt), x, s1.to(acc).contiguous(),
          s2.to(acc).contiguous(), w.detach().to(acc).contiguous(),
          b.detach().to(acc).contiguous(), empty_output(x, fmt), cl, acc};
}

}  // namespace fusebench
