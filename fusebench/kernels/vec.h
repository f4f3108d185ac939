// Register vectors for the bundled C++ kernels (included by each kernel's cpu.cpp that needs
// them): GCC vector types, unaligned loads / stores, and a row sum kept in registers.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusebench {

// Vec<S, N>: N lanes of S, e.g. 16 floats (two AVX2 or one AVX-512 register). An accumulator
// held in such a register, not in memory, is what keeps a loop from serialising on
// store-to-load forwarding.
template <typename S, int N>
struct VecOf {  // (an alias template would drop the attribute)
  typedef S type __attribute__((vector_size(sizeof(S) * N)));
  static_assert(sizeof(type) == sizeof(S) * N, "vector_size ignored");
};
template <typename S, int N>
using Vec = typename VecOf<S, N>::type;

template <typename V, typename S>
inline V ld(const S* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
template <typename V, typename S>
inline void st(S* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

// Sum of v's lanes, halving: log2(N) shuffle + add steps.
template <typename S, int N>
inline S hsum(const Vec<S, N>& v) {
  if constexpr (N == 2) {
    return v[0] + v[1];
  } else {
    Vec<S, N / 2> lo, hi;
    std::memcpy(&lo, &v, sizeof lo);
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
    return hsum<S, N / 2>(lo + hi);
  }
}

// K sums over c in [0, C) at once: f(z, c) returns an std::array of K terms at c..c+W-1, each a
// vector like z (a zero Vec<S, W>), or of the single terms at c for z = S(0). Full 64-byte
// vectors, then a half, then single values; the lanes are summed once per width at the end.
// Four accumulators per sum for one sum, two for two, so that the adds of a long row overlap
// instead of waiting on each other. An `omp simd reduction` over a short row is lowered by GCC
// to per-lane stack slots added one by one after the loop: 16 dependent scalar adds per sum,
// per row (LayerNorm over C = 40 channels-last rows ran at 0.59 ns a value that way, against
// 0.25 at C = 80; docs/fused.md, thirty-seventh session).
template <int K, typename S, typename F>
inline std::array<S, K> row_sums(int64_t C, F f) {
  constexpr int W = 64 / sizeof(S), U = K == 1 ? 4 : 2;
  using V = Vec<S, W>;
  V acc[U][K] = {};
  int64_t c = 0;
  for (; c + U * W <= C; c += U * W) {
    for (int u = 0; u < U; ++u) {
      const std::array<V, K> t = f(V{}, c + u * W);
      for (int k = 0; k < K; ++k) acc[u][k] += t[k];
    }
  }
  for (; c + W <= C; c += W) {
    const std::array<V, K> t = f(V{}, c);
    for (int k = 0; k < K; ++k) acc[0][k] += t[k];
  }
  std::array<S, K> s;
  for (int k = 0; k < K; ++k) {
    V v = acc[0][k];
    for (int u = 1; u < U; ++u) v += acc[u][k];
    s[k] = hsum<S, W>(v);
  }
  if (c + W / 2 <= C) {
    const std::array<Vec<S, W / 2>, K> t = f(Vec<S, W / 2>{}, c);
    for (int k = 0; k < K; ++k) s[k] += hsum<S, W / 2>(t[k]);
    c += W / 2;
  }
  for (; c < C; ++c) {
    const std::array<S, K> t = f(S(0), c);
    for (int k = 0; k < K; ++k) s[k] += t[k];
  }
  return s;
}

// K sums over one row's C values of f(z, c), the row stored as T and summed in A: row_sums
// where T is A; a bfloat16 row converts per value under `omp simd` instead (its reduction pays
// GCC's per-lane epilogue, as above).
template <int K, typename T, typename A, typename F>
inline std::array<A, K> sum_row(int64_t C, F f) {
  static_assert(K == 1 || K == 2, "one or two sums");
  if constexpr (std::is_same_v<T, A>) {
    return row_sums<K, A>(C, f);
  } else {
    A s = 0, t = 0;   // t: the second sum (K == 2)
#pragma omp simd reduction(+ : s, t)
    for (int64_t c = 0; c < C; ++c) {
      const std::array<A, K> v = f(A(0), c);
      s += v[0];
      if constexpr (K == 2) t += v[1];
    }
    if constexpr (K == 1) return {s};
    else return {s, t};
  }
}

// The values at p + c as sum_row's f asks for them: a Vec's worth (T == A), or one value as V.
template <typename V, typename T>
inline V row_at(const T* p, int64_t c) {
  if constexpr (std::is_arithmetic_v<V>) return static_cast<V>(p[c]);
  else return ld<V>(p + c);
}

}  // namespace fusebench
