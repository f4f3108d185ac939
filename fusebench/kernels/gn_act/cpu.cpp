// GroupNorm + activation on CPU, forward and backward, NCHW and channels-last x: a diffusion
// UNet's GroupNorm -> SiLU, and GroupNorm alone (the identity).
//
// Statistics per (sample n, group g) over its D = C/G channels x H*W values. Forward: per-(n, c)
// sums of x - k (k: that plane's first value, a shift that keeps a large mean precise), combined
// into the group's mean and variance (the channels' means and spreads, Chan's formula, in
// double), then one pass writing y = act((x - mean) * rstd * w[c] + b[c]). Saved for backward:
// x and the (N, G) mean / rstd, never the normalised tensor.
// Backward: one pass for the per-(n, c) sums of g = dy * act'(z) and g * (x - mean) (z
// recomputed; for SiLU/GELU g is stored in dx and read back, as bn_act does: one more write is
// cheaper than a second exp), then one pass writing dx = scale * g + (x - mean) * u + o:
//   dx = rstd * (w g - mean_grp(w g) - xhat * mean_grp(w g xhat)), so with M = D * H*W
//   u = -rstd^3 * sum_c(w_c Sgx_nc) / M, o = -rstd * sum_c(w_c Sg_nc) / M (per (n, g));
//   dweight_c = sum_n rstd_ng Sgx_nc, dbias_c = sum_n Sg_nc, summed over n in order.
// NCHW: a task is one (n, g), whose D planes are contiguous: the write pass (and backward's dx
// pass) rereads them from L2. Channels-last: each sample's H*W rows split into fixed parts with
// per-channel partial sums vectorised along C (norm_act.h's row_sums); the elementwise passes
// run over rows with that sample's per-channel slices.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../cpu_math.h"
#include "../huge_pages.h"
#include "../norm_act.h"

namespace {

using namespace fusebench;

struct Group {  // one (n, g)'s statistics
  double mean, rstd;
};

// From the D channels' shifted sums (k: shift, s = sum(x - k), q = sum((x - k)^2), HW values
// each): the group's mean and 1 / sqrt(biased variance + eps).
Group group_of(const double* k, const double* s, const double* q, int64_t D, int64_t HW,
               double eps) {
  double mean = 0;
  for (int64_t j = 0; j < D; ++j) mean += k[j] + s[j] / double(HW);
  mean /= double(D);
  double m2 = 0;
  for (int64_t j = 0; j < D; ++j) {
    const double mj = k[j] + s[j] / double(HW);
    m2 += std::max(0.0, q[j] - s[j] * s[j] / double(HW)) + double(HW) * (mj - mean) * (mj - mean);
  }
  return {mean, 1.0 / std::sqrt(m2 / double(D * HW) + eps)};
}

// u, o of dx = scale * g + (x - mean) * u + o for one (n, g), from its channels' Sg, Sgx.
template <typename A>
void group_coef(const A* w, const double* sg, const double* sgx, int64_t D, int64_t HW,
                double rstd, A& u, A& o) {
  double w1 = 0, w2 = 0;
  for (int64_t j = 0; j < D; ++j) {
    w1 += double(w[j]) * sg[j];
    w2 += double(w[j]) * sgx[j];
  }
  const double M = double(D * HW);
  u = A(-rstd * rstd * rstd * w2 / M);
  o = A(-rstd * w1 / M);
}

// rows [r0, r1) of a channels-last (N*HW, C) tensor, cut at sample boundaries: fn(n, a, b)
template <typename F>
void by_sample(int64_t r0, int64_t r1, int64_t HW, const F& fn) {
  while (r0 < r1) {
    const int64_t n = r0 / HW, end = std::min(r1, (n + 1) * HW);
    fn(n, r0, end);
    r0 = end;
  }
}

// Parts each sample's rows are split into for the channels-last sums: enough tasks for the
// threads, each at least a grain of rows.
int64_t parts_per_sample(int64_t N, int64_t HW, int64_t C) {
  const int64_t want = (at::get_num_threads() + N - 1) / N;
  return std::max<int64_t>(1, std::min(want, HW / grain(C)));
}

// One plane's sums as plain functions over __restrict pointers: through plane_sums' lambda
// (one plane, its pointer captured) GCC left these loops scalar, 4x slower than aten's pass.
// s += sum(x - k), q += sum((x - k)^2), in float blocks of kBlock added into double.
template <typename T, typename A>
void shifted_sums(const T* __restrict x, int64_t n, A k, double& s, double& q) {
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    A a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
    for (int64_t i = i0; i < i1; ++i) {
      const A d = static_cast<A>(x[i]) - k;
      a1 += d;
      a2 += d * d;
    }
    s += double(a1);
    q += double(a2);
  }
}

// sg += sum g, sgx += sum g * (x - m), g = dy * act'((x - m) * sc + sh); g stored in dx for
// the dx pass to read back when act' is costly.
template <typename T, typename A, typename Act>
void grad_sums(const T* __restrict dy, const T* __restrict x, T* __restrict dx, A m, A sc, A sh,
               int64_t n, double& sg, double& sgx) {
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    A a1 = 0, a2 = 0;
#pragma omp simd reduction(+ : a1, a2)
    for (int64_t i = i0; i < i1; ++i) {
      const A xc = static_cast<A>(x[i]) - m;
      const A g = static_cast<A>(dy[i]) * Act::d(xc * sc + sh);
      if constexpr (Act::kCostly) dx[i] = static_cast<T>(g);
      a1 += g;
      a2 += g * xc;
    }
    sg += double(a1);
    sgx += double(a2);
  }
}

// ---------------------------------------------------------------- forward
template <typename T, typename A, typename Act>
void fwd_nchw(const T* x, T* y, const A* w, const A* b, A* mean, A* rstd, int64_t N, int64_t C,
              int64_t HW, int64_t G, double eps) {
  const int64_t D = C / G;
  at::parallel_for(0, N * G, grain(D * HW), [&](int64_t t0, int64_t t1) {
    std::vector<double> k(D), s(D), q(D);
    for (int64_t t = t0; t < t1; ++t) {
      const T* xt = x + t * D * HW;  // (n, g)'s D planes
      T* yt = y + t * D * HW;
      for (int64_t j = 0; j < D; ++j) {
        const T* xp = xt + j * HW;
        k[j] = double(static_cast<A>(xp[0]));
        s[j] = q[j] = 0;
        shifted_sums<T, A>(xp, HW, static_cast<A>(xp[0]), s[j], q[j]);
      }
      const Group st = group_of(k.data(), s.data(), q.data(), D, HW, eps);
      mean[t] = A(st.mean);
      rstd[t] = A(st.rstd);
      const A* wg = w + (t % G) * D;
      const A* bg = b + (t % G) * D;
      for (int64_t j = 0; j < D; ++j)  // the group's planes, usually still in L2
        act_plane<T, A, Act>(xt + j * HW, yt + j * HW, A(st.mean), A(st.rstd * double(wg[j])),
                             bg[j], HW);
    }
  });
}

// Per-(n, c) slices of the per-group coefficients: mean, scale = rstd * w, shift = b.
template <typename A>
void per_channel(const A* mean, const A* rstd, const A* w, const A* b, int64_t N, int64_t C,
                 int64_t G, A* m_nc, A* sc_nc, A* sh_nc) {
  const int64_t D = C / G;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t t = n * G + c / D;
      m_nc[n * C + c] = mean[t];
      sc_nc[n * C + c] = A(double(rstd[t]) * double(w[c]));
      sh_nc[n * C + c] = b[c];
    }
}

template <typename T, typename A, typename Act>
void fwd_cl(const T* x, T* y, const A* w, const A* b, A* mean, A* rstd, int64_t N, int64_t C,
            int64_t HW, int64_t G, double eps) {
  const int64_t D = C / G, P = parts_per_sample(N, HW, C);
  std::vector<A> k(N * C);
  for (int64_t n = 0; n < N; ++n)  // shift: each sample's first row
    for (int64_t c = 0; c < C; ++c) k[n * C + c] = static_cast<A>(x[n * HW * C + c]);
  std::vector<double> ps(N * P * C, 0.0), pq(N * P * C, 0.0);
  at::parallel_for(0, N * P, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / P, p = t % P;
      const A* kn = k.data() + n * C;
      row_sums<A>(n * HW + p * HW / P, n * HW + (p + 1) * HW / P, C, ps.data() + t * C,
                  pq.data() + t * C, [=](int64_t i, int64_t c, A& a1, A& a2) {
                    const A d = static_cast<A>(x[i * C + c]) - kn[c];
                    a1 += d;
                    a2 += d * d;
                  });
    }
  });
  std::vector<double> kd(C), s(C), q(C);
  for (int64_t n = 0; n < N; ++n) {
    std::fill(s.begin(), s.end(), 0.0);
    std::fill(q.begin(), q.end(), 0.0);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t c = 0; c < C; ++c) {
        s[c] += ps[(n * P + p) * C + c];
        q[c] += pq[(n * P + p) * C + c];
      }
    for (int64_t c = 0; c < C; ++c) kd[c] = double(k[n * C + c]);
    for (int64_t g = 0; g < G; ++g) {
      const Group st = group_of(kd.data() + g * D, s.data() + g * D, q.data() + g * D, D, HW, eps);
      mean[n * G + g] = A(st.mean);
      rstd[n * G + g] = A(st.rstd);
    }
  }
  std::vector<A> m(N * C), sc(N * C), sh(N * C);
  per_channel(mean, rstd, w, b, N, C, G, m.data(), sc.data(), sh.data());
  const A* mp = m.data();
  const A* scp = sc.data();
  const A* shp = sh.data();
  at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
    by_sample(r0, r1, HW, [&](int64_t n, int64_t a, int64_t e) {
      act_rows<T, A, Act>(x, y, mp + n * C, scp + n * C, shp + n * C, a, e, C);
    });
  });
}

// ---------------------------------------------------------------- backward
template <typename T, typename A, typename Act>
void bwd_nchw(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const A* b,
              T* dx, double* sg_nc, double* sgx_nc, int64_t N, int64_t C, int64_t HW,
              int64_t G) {
  const int64_t D = C / G;
  at::parallel_for(0, N * G, grain(2 * D * HW), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const A m = mean[t];
      const double r = double(rstd[t]);
      const A* wg = w + (t % G) * D;
      const A* bg = b + (t % G) * D;
      double* sg = sg_nc + t * D;  // (n, g)'s channels: n * C + g * D = t * D
      double* sgx = sgx_nc + t * D;
      for (int64_t j = 0; j < D; ++j) {
        const int64_t off = (t * D + j) * HW;
        const A sc = A(r * double(wg[j])), sh = bg[j];
        sg[j] = sgx[j] = 0;
        grad_sums<T, A, Act>(dy + off, x + off, dx + off, m, sc, sh, HW, sg[j], sgx[j]);
      }
      A u, o;
      group_coef(wg, sg, sgx, D, HW, r, u, o);
      for (int64_t j = 0; j < D; ++j) {  // the group's planes, usually still in L2
        const int64_t off = (t * D + j) * HW;
        const A sc = A(r * double(wg[j]));
        if constexpr (Act::kCostly)
          dx_plane_from_g<T, A>(x + off, dx + off, dx + off, m, sc, u, o, HW);
        else
          dx_plane<T, A, Act>(dy + off, x + off, dx + off, m, sc, bg[j], u, o, HW);
      }
    }
  });
}

template <typename T, typename A, typename Act>
void bwd_cl(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, const A* b,
            T* dx, double* sg_nc, double* sgx_nc, int64_t N, int64_t C, int64_t HW, int64_t G) {
  const int64_t D = C / G, P = parts_per_sample(N, HW, C);
  std::vector<A> m(N * C), sc(N * C), sh(N * C);
  per_channel(mean, rstd, w, b, N, C, G, m.data(), sc.data(), sh.data());
  std::vector<double> p1(N * P * C, 0.0), p2(N * P * C, 0.0);
  at::parallel_for(0, N * P, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / P, p = t % P;
      const A* mn = m.data() + n * C;
      const A* scn = sc.data() + n * C;
      const A* shn = sh.data() + n * C;
      row_sums<A>(n * HW + p * HW / P, n * HW + (p + 1) * HW / P, C, p1.data() + t * C,
                  p2.data() + t * C, [=](int64_t i, int64_t c, A& a1, A& a2) {
                    const A xc = static_cast<A>(x[i * C + c]) - mn[c];
                    const A g = static_cast<A>(dy[i * C + c]) * Act::d(xc * scn[c] + shn[c]);
                    if constexpr (Act::kCostly) dx[i * C + c] = static_cast<T>(g);
                    a1 += g;
                    a2 += g * xc;
                  });
    }
  });
  for (int64_t n = 0; n < N; ++n)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t c = 0; c < C; ++c) {
        sg_nc[n * C + c] += p1[(n * P + p) * C + c];
        sgx_nc[n * C + c] += p2[(n * P + p) * C + c];
      }
  std::vector<A> u(N * C), o(N * C);
  for (int64_t t = 0; t < N * G; ++t) {
    const int64_t g = t % G, base = t * D;  // = n * C + g * D
    A ut, ot;
    group_coef(w + g * D, sg_nc + base, sgx_nc + base, D, HW, double(rstd[t]), ut, ot);
    std::fill(u.begin() + base, u.begin() + base + D, ut);
    std::fill(o.begin() + base, o.begin() + base + D, ot);
  }
  const A* mp = m.data();
  const A* scp = sc.data();
  const A* shp = sh.data();
  const A* up = u.data();
  const A* op = o.data();
  at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
    by_sample(r0, r1, HW, [&](int64_t n, int64_t a, int64_t e) {
      const int64_t q = n * C;
      if constexpr (Act::kCostly)
        dx_from_g<T, A>(x, dx, dx, mp + q, scp + q, up + q, op + q, a, e, C);
      else
        dx_rows<T, A, Act>(dy, x, dx, mp + q, scp + q, shp + q, up + q, op + q, a, e, C);
    });
  });
}

// ---------------------------------------------------------------- checks + dispatch
void check_input(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, int64_t G) {
  TORCH_CHECK(x.device().is_cpu(), "gn_act cpu: x must be a CPU tensor, got ", x.device());
  TORCH_CHECK(x.dim() == 4, "gn_act cpu: x must be 4-D (N, C, H, W), got ", x.dim(), "-D");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble, "gn_act cpu: unsupported dtype ", st,
              " (supported: float32, float64)");
  TORCH_CHECK(G > 0 && x.size(1) % G == 0, "gn_act cpu: C=", x.size(1),
              " is not divisible by groups=", G);
  TORCH_CHECK(w.numel() == x.size(1) && b.numel() == x.size(1),
              "gn_act cpu: weight and bias must have C=", x.size(1), " elements");
}

// (y, mean, rstd): mean / rstd (N, G) in the accumulation type.
std::vector<at::Tensor> forward(at::Tensor x, at::Tensor w, at::Tensor b, int64_t G, double eps,
                                int64_t act) {
  check_input(x, w, b, G);
  x = dense(x);
  const bool cl = is_cl(x);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.detach().to(at_).contiguous(), ba = b.detach().to(at_).contiguous();
  auto y = empty_output(x, cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  auto mean = at::empty({N, G}, x.options().dtype(at_));
  auto rstd = at::empty({N, G}, x.options().dtype(at_));
  if (x.numel() == 0) return {y, mean.fill_(NAN), rstd.fill_(NAN)};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gn_act_cpu_fwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const A* wp = wa.const_data_ptr<A>();
    const A* bp = ba.const_data_ptr<A>();
    A* mp = mean.mutable_data_ptr<A>();
    A* rp = rstd.mutable_data_ptr<A>();
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      if (cl)
        fwd_cl<scalar_t, A, Ac>(xp, yp, wp, bp, mp, rp, N, C, HW, G, eps);
      else
        fwd_nchw<scalar_t, A, Ac>(xp, yp, wp, bp, mp, rp, N, C, HW, G, eps);
    });
  });
  return {y, mean, rstd};
}

// (dx, dweight, dbias) from the saved x, mean, rstd; dy takes x's layout.
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor w, at::Tensor b,
                                 at::Tensor mean, at::Tensor rstd, int64_t G, int64_t act) {
  check_input(x, w, b, G);
  const BwdArgs a = bwd_args("gn_act cpu", dy, x, mean, rstd, w, b);
  x = a.x, dy = a.dy, mean = a.s1, rstd = a.s2;
  const at::Tensor &wa = a.w, &ba = a.b, &dx = a.dx;
  const bool cl = a.cl;
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  auto dw = at::zeros({C}, x.options().dtype(at::kDouble));
  auto db = at::zeros({C}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return {dx, dw.to(w.scalar_type()), db.to(b.scalar_type())};
  std::vector<double> sg(N * C, 0.0), sgx(N * C, 0.0);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gn_act_cpu_bwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    const A* mp = mean.const_data_ptr<A>();
    const A* rp = rstd.const_data_ptr<A>();
    const A* wp = wa.const_data_ptr<A>();
    const A* bp = ba.const_data_ptr<A>();
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      if (cl)
        bwd_cl<scalar_t, A, Ac>(dyp, xp, mp, rp, wp, bp, dxp, sg.data(), sgx.data(), N, C, HW,
                                G);
      else
        bwd_nchw<scalar_t, A, Ac>(dyp, xp, mp, rp, wp, bp, dxp, sg.data(), sgx.data(), N, C,
                                  HW, G);
    });
    double* dwp = dw.mutable_data_ptr<double>();
    double* dbp = db.mutable_data_ptr<double>();
    const int64_t D = C / G;
    for (int64_t n = 0; n < N; ++n)  // over n in order: the same sums at any thread count
      for (int64_t c = 0; c < C; ++c) {
        dwp[c] += double(rp[n * G + c / D]) * sgx[n * C + c];
        dbp[c] += sg[n * C + c];
      }
  });
  return {dx, dw.to(w.scalar_type()), db.to(b.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "GroupNorm + act forward: (y, mean, rstd), mean / rstd (N, G)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("groups"), py::arg("eps"),
        py::arg("act"));
  m.def("backward", &backward, "GroupNorm + act backward: (dx, dweight, dbias)", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("rstd"),
        py::arg("groups"), py::arg("act"));
}
