// GELU over rows of C values with a bias per value, forward and backward: the act kernels'
// channels-last path (cpu.cpp) and the MLP's row blocks (mlp_blocks.h) run these loops.
#pragma once

#include "../cpu_math.h"

namespace fusebench {

// GELU and its derivative; exact (erf) or tanh approximation (cpu_math.h's Act).
template <bool kTanh> using Gelu = Act<kTanh ? kGeluTanh : kGelu>;

// (over __restrict pointers, called from the parallel lambdas: see the note above cpu.cpp's
// gelu_plane)
template <typename T, typename A, bool kTanh>
void gelu_row(const T* __restrict x, const A* __restrict b, T* __restrict y, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c)
    y[c] = static_cast<T>(Gelu<kTanh>::f(static_cast<A>(x[c]) + b[c]));
}

// dx = dy * gelu'(x + b) over one row of C, acc[c] += dx[c]; kY: y = gelu(x + b) too (f and
// f' of one z share their exp, so the extra output costs a write, not a pass)
template <typename T, typename A, bool kTanh, bool kY>
void gelu_grad_row(const T* __restrict dy, const T* __restrict x, const A* __restrict b,
                   T* __restrict dx, T* __restrict y, A* __restrict acc, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const A z = static_cast<A>(x[c]) + b[c];
    const A d = static_cast<A>(dy[c]) * Gelu<kTanh>::d(z);
    dx[c] = static_cast<T>(d);
    if constexpr (kY) y[c] = static_cast<T>(Gelu<kTanh>::f(z));
    acc[c] += d;
  }
}

}  // namespace fusebench
