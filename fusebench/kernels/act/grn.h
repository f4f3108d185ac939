// GRN (ConvNeXt V2's Global Response Normalization) after an MLP's bias + activation, over
// rows of C channels: the grn_mlp site's elementwise part (fuse/fusions/fx_grn.py), compiled
// into the act kernels' extension (cpu.cpp includes it).
//
// With g = act(h + b) over an image's H*W rows, G[n, c] = ||g[n, :, c]||_2, m[n] = mean_c G +
// eps, s = 1 + gamma * G / m: GRN's output is u = g * s + beta. In torch ops the site's
// backward went over fc1's width ~17 times (rebuild g, rebuild u, du * g and its sum, du's sum,
// du * s + g * k, the act's backward); here forward is two passes that read h (the squares'
// sums, then u; g is recomputed rather than written and read back) and backward two more:
// (1) u for fc2's weight gradient and the (n, c) sums of du * g and du, (2) dh and db.
// Sums go through fixed parts per image (up to kParts, each of kPartRows rows or more), each
// part's rows on cache lines of their own: results do not depend on the thread count.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "../cpu_math.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fusebench::grn {

constexpr int64_t kParts = 16;            // partial sums per image, at most
constexpr int64_t kPartRows = 8;          // rows per part, at least (else fewer parts)
constexpr int64_t kLine = 64;             // bytes: a part's sums start on a line of their own

// ---------------------------------------------------------------- one row of C channels each
// (free functions over __restrict pointers: GCC vectorises these, not the lambdas' captures)
template <typename T, typename A, typename F>
void sumsq_row(const T* __restrict h, const A* __restrict b, A* __restrict acc, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const A g = F::f(static_cast<A>(h[c]) + b[c]);
    acc[c] += g * g;
  }
}

template <typename T, typename A, typename F>
void out_row(const T* __restrict h, const A* __restrict b, const A* __restrict s,
             const A* __restrict beta, T* __restrict u, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c)
    u[c] = static_cast<T>(F::f(static_cast<A>(h[c]) + b[c]) * s[c] + beta[c]);
}

// ds += du * g, sdu += du; kU: u = g * s + beta too (fc2's weight gradient reads it)
template <typename T, typename A, typename F, bool kU>
void sums_row(const T* __restrict du, const T* __restrict h, const A* __restrict b,
              const A* __restrict s, const A* __restrict beta, T* __restrict u,
              A* __restrict ds, A* __restrict sdu, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const A g = F::f(static_cast<A>(h[c]) + b[c]);
    const A d = static_cast<A>(du[c]);
    if constexpr (kU) u[c] = static_cast<T>(g * s[c] + beta[c]);
    ds[c] += d * g;
    sdu[c] += d;
  }
}

// dh = (du * s + g * k) * act'(z), db += dh; f and f' of one z share their exp (GCC's CSE)
template <typename T, typename A, typename F>
void grad_row(const T* __restrict du, const T* __restrict h, const A* __restrict b,
              const A* __restrict s, const A* __restrict k, T* __restrict dh,
              A* __restrict db, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    const A z = static_cast<A>(h[c]) + b[c];
    const A d = (static_cast<A>(du[c]) * s[c] + F::f(z) * k[c]) * F::d(z);
    dh[c] = static_cast<T>(d);
    db[c] += d;
  }
}

// ---------------------------------------------------------------- the schedule
// Per-part rows of C sums (`rows` of them per part), each part starting on a cache line.
template <typename A>
class Parts {
 public:
  Parts(int64_t parts, int64_t rows, int64_t C)
      : ld_((C * sizeof(A) + kLine - 1) / kLine * kLine / sizeof(A)), rows_(rows),
        buf_(parts * rows * ld_ + kLine / sizeof(A), A(0)) {
    const auto p = reinterpret_cast<uintptr_t>(buf_.data());
    base_ = buf_.data() + ((kLine - p % kLine) % kLine) / sizeof(A);
  }
  A* at(int64_t part, int64_t row) { return base_ + (part * rows_ + row) * ld_; }

 private:
  int64_t ld_, rows_;
  std::vector<A> buf_;
  A* base_;
};

struct Shape {
  int64_t N, HW, C, P;                    // images, rows per image, channels, parts per image
  int64_t rows(int64_t p) const { return (p % P + 1) * HW / P - (p % P) * HW / P; }
  int64_t first(int64_t p) const { return (p / P) * HW + (p % P) * HW / P; }  // global row
};

inline Shape shape_of(const at::Tensor& h) {
  TORCH_CHECK(h.dim() == 4, "grn cpu: h must be 4-D (N, H, W, C), got ", h.dim(), "-D");
  const int64_t N = h.size(0), HW = h.size(1) * h.size(2), C = h.size(3);
  return {N, HW, C, std::clamp<int64_t>(HW / kPartRows, 1, kParts)};
}

// every part of every image once, in parallel: body(part index, first row, row count)
template <typename Body>
void each_part(const Shape& sh, const Body& body) {
  at::parallel_for(0, sh.N * sh.P, std::max<int64_t>(1, grain(sh.HW / sh.P * sh.C)),
                   [&](int64_t p0, int64_t p1) {
                     for (int64_t p = p0; p < p1; ++p) body(p, sh.first(p), sh.rows(p));
                   });
}

// out[c] = the sum of image n's parts' row `row` (parts in order: a fixed summation order)
template <typename A>
void part_sum(Parts<A>& parts, const Shape& sh, int64_t n, int64_t row, A* __restrict out) {
  std::fill(out, out + sh.C, A(0));
  for (int64_t p = 0; p < sh.P; ++p) {
    const A* __restrict v = parts.at(n * sh.P + p, row);
#pragma omp simd
    for (int64_t c = 0; c < sh.C; ++c) out[c] += v[c];
  }
}

// s = 1 + gamma * G / m per (n, c), G from the parts' sums of squares (written to G, m)
template <typename A>
std::vector<A> scales(Parts<A>& sq, const Shape& sh, const A* gamma, double eps, A* G, A* m) {
  std::vector<A> s(sh.N * sh.C);
  for (int64_t n = 0; n < sh.N; ++n) {
    A mean = 0;
    part_sum(sq, sh, n, 0, G + n * sh.C);
    for (int64_t c = 0; c < sh.C; ++c) {
      G[n * sh.C + c] = std::sqrt(G[n * sh.C + c]);
      mean += G[n * sh.C + c];
    }
    m[n] = mean / A(sh.C) + A(eps);
    for (int64_t c = 0; c < sh.C; ++c)
      s[n * sh.C + c] = A(1) + gamma[c] * G[n * sh.C + c] / m[n];
  }
  return s;
}

template <typename A>
std::vector<A> vec_of(const at::Tensor& t, int64_t C, at::ScalarType acc) {
  std::vector<A> out(C, A(0));
  if (t.defined()) {
    const at::Tensor v = t.detach().to(acc).contiguous();
    std::copy(v.const_data_ptr<A>(), v.const_data_ptr<A>() + C, out.begin());
  }
  return out;
}

inline at::ScalarType acc_type(const at::Tensor& h) {
  return h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (u, G, m): u = GRN(act(h + b)) in h's dtype; G (N, C) and m (N) in the accumulation type
template <typename T, typename F>
std::vector<at::Tensor> forward_t(const at::Tensor& h, const at::Tensor& b,
                                  const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  using A = typename AccOf<T>::type;
  const Shape sh = shape_of(h);
  const auto acc = acc_type(h);
  const auto bv = vec_of<A>(b, sh.C, acc), gv = vec_of<A>(gamma, sh.C, acc),
             betav = vec_of<A>(beta, sh.C, acc);
  at::Tensor u = at::empty_like(h), G = at::empty({sh.N, sh.C}, h.options().dtype(acc)),
             m = at::empty({sh.N}, h.options().dtype(acc));
  const T* hp = h.const_data_ptr<T>();
  T* up = u.mutable_data_ptr<T>();
  Parts<A> sq(sh.N * sh.P, 1, sh.C);
  each_part(sh, [&](int64_t p, int64_t r0, int64_t nr) {
    for (int64_t r = r0; r < r0 + nr; ++r)
      sumsq_row<T, A, F>(hp + r * sh.C, bv.data(), sq.at(p, 0), sh.C);
  });
  const auto s = scales<A>(sq, sh, gv.data(), eps, G.mutable_data_ptr<A>(),
                           m.mutable_data_ptr<A>());
  each_part(sh, [&](int64_t p, int64_t r0, int64_t nr) {
    const A* sn = s.data() + (p / sh.P) * sh.C;
    for (int64_t r = r0; r < r0 + nr; ++r)
      out_row<T, A, F>(hp + r * sh.C, bv.data(), sn, betav.data(), up + r * sh.C, sh.C);
  });
  return {u, G, m};
}

// (dh, db, dgamma, dbeta[, u]) from du (GRN's output gradient) and what forward saved
template <typename T, typename F, bool kU>
std::vector<at::Tensor> backward_t(const at::Tensor& du, const at::Tensor& h,
                                   const at::Tensor& b, const at::Tensor& gamma,
                                   const at::Tensor& beta, const at::Tensor& G_,
                                   const at::Tensor& m_) {
  using A = typename AccOf<T>::type;
  const Shape sh = shape_of(h);
  const auto acc = acc_type(h);
  const auto bv = vec_of<A>(b, sh.C, acc), gv = vec_of<A>(gamma, sh.C, acc),
             betav = vec_of<A>(beta, sh.C, acc);
  const at::Tensor G = G_.to(acc).contiguous(), m = m_.to(acc).contiguous();
  const A *Gp = G.const_data_ptr<A>(), *mp = m.const_data_ptr<A>();
  std::vector<A> s(sh.N * sh.C);
  for (int64_t n = 0; n < sh.N; ++n)
    for (int64_t c = 0; c < sh.C; ++c) s[n * sh.C + c] = A(1) + gv[c] * Gp[n * sh.C + c] / mp[n];
  at::Tensor u = kU ? at::empty_like(h) : at::Tensor(), dh = at::empty_like(h);
  const T *dup = du.const_data_ptr<T>(), *hp = h.const_data_ptr<T>();
  T *upp = kU ? u.mutable_data_ptr<T>() : nullptr, *dhp = dh.mutable_data_ptr<T>();
  Parts<A> sums(sh.N * sh.P, 2, sh.C);                    // rows: du * g, du
  each_part(sh, [&](int64_t p, int64_t r0, int64_t nr) {
    const A* sn = s.data() + (p / sh.P) * sh.C;
    for (int64_t r = r0; r < r0 + nr; ++r)
      sums_row<T, A, F, kU>(dup + r * sh.C, hp + r * sh.C, bv.data(), sn, betav.data(),
                            kU ? upp + r * sh.C : nullptr, sums.at(p, 0), sums.at(p, 1), sh.C);
  });
  // GRN's backward on (N, C): ds = sum_hw du * g; n = G / m; dgamma = sum_n ds * n; dbeta =
  // sum du; dG = dn / m - sum_c(dn * G) / (m^2 C) with dn = ds * gamma; k = dG / G (0 where
  // G is: g is 0 there), so that dg = du * s + g * k
  std::vector<A> k(sh.N * sh.C), dgamma(sh.C, A(0)), dbeta(sh.C, A(0)), ds(sh.C), sdu(sh.C);
  for (int64_t n = 0; n < sh.N; ++n) {
    A dot = 0;
    part_sum(sums, sh, n, 0, ds.data());
    part_sum(sums, sh, n, 1, sdu.data());
    for (int64_t c = 0; c < sh.C; ++c) {
      dgamma[c] += ds[c] * Gp[n * sh.C + c] / mp[n];
      dbeta[c] += sdu[c];
      dot += ds[c] * gv[c] * Gp[n * sh.C + c];
    }
    const A mn = mp[n], shared = dot / (mn * mn * A(sh.C));
    for (int64_t c = 0; c < sh.C; ++c) {
      const A Gc = Gp[n * sh.C + c], dG = ds[c] * gv[c] / mn - shared;
      k[n * sh.C + c] = Gc > A(0) ? dG / Gc : A(0);
    }
  }
  Parts<A> dbp(sh.N * sh.P, 1, sh.C);
  each_part(sh, [&](int64_t p, int64_t r0, int64_t nr) {
    const int64_t n = p / sh.P;
    for (int64_t r = r0; r < r0 + nr; ++r)
      grad_row<T, A, F>(dup + r * sh.C, hp + r * sh.C, bv.data(), s.data() + n * sh.C,
                        k.data() + n * sh.C, dhp + r * sh.C, dbp.at(p, 0), sh.C);
  });
  std::vector<A> db(sh.C, A(0)), dbn(sh.C);
  for (int64_t n = 0; n < sh.N; ++n) {
    part_sum(dbp, sh, n, 0, dbn.data());
    for (int64_t c = 0; c < sh.C; ++c) db[c] += dbn[c];
  }
  const auto vec = [&](const std::vector<A>& v, const at::Tensor& like) {
    at::Tensor t = at::empty({sh.C}, h.options().dtype(acc));
    std::copy(v.begin(), v.end(), t.mutable_data_ptr<A>());
    return like.defined() ? t.to(like.scalar_type()).reshape(like.sizes()) : t;
  };
  std::vector<at::Tensor> out{dh, b.defined() ? vec(db, b) : at::Tensor(), vec(dgamma, gamma),
                              vec(dbeta, beta)};
  if (kU) out.push_back(u);
  return out;
}

inline void check(const at::Tensor& h, const at::Tensor& gamma, const at::Tensor& beta) {
  TORCH_CHECK(h.device().is_cpu(), "grn cpu: h must be a CPU tensor");
  TORCH_CHECK(h.dim() == 4 && h.is_contiguous(),
              "grn cpu: h must be a contiguous (N, H, W, C) tensor");
  TORCH_CHECK(gamma.numel() == h.size(3) && beta.numel() == h.size(3),
              "grn cpu: gamma and beta must have C = ", h.size(3), " values");
}

inline std::vector<at::Tensor> forward(const at::Tensor& h_, const c10::optional<at::Tensor>& b,
                                       const at::Tensor& gamma, const at::Tensor& beta,
                                       double eps, int64_t act) {
  const at::Tensor h = h_.contiguous();
  check(h, gamma, beta);
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, h.scalar_type(), "grn_forward", [&] {
    with_act(act, [&](auto f) {
      out = forward_t<scalar_t, decltype(f)>(h, b.value_or(at::Tensor()), gamma, beta, eps);
    });
  });
  return out;
}

inline std::vector<at::Tensor> backward(const at::Tensor& du_, const at::Tensor& h_,
                                        const c10::optional<at::Tensor>& b,
                                        const at::Tensor& gamma, const at::Tensor& beta,
                                        const at::Tensor& G, const at::Tensor& m, int64_t act,
                                        bool want_u) {
  const at::Tensor h = h_.contiguous(), du = du_.to(h.scalar_type()).contiguous();
  check(h, gamma, beta);
  TORCH_CHECK(du.sizes() == h.sizes(), "grn cpu: du must have h's shape");
  TORCH_CHECK(G.numel() == h.size(0) * h.size(3) && m.numel() == h.size(0),
              "grn cpu: G must be (N, C) and m (N,)");
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, h.scalar_type(), "grn_backward", [&] {
    with_act(act, [&](auto f) {
      const at::Tensor bb = b.value_or(at::Tensor());
      out = want_u ? backward_t<scalar_t, decltype(f), true>(du, h, bb, gamma, beta, G, m)
                   : backward_t<scalar_t, decltype(f), false>(du, h, bb, gamma, beta, G, m);
    });
  });
  return out;
}

}  // namespace fusebench::grn
