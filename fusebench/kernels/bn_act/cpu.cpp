// Training-mode BatchNorm2d + activation (SiLU, ReLU, GELU, or none) on CPU, forward and backward.
//
// Forward: one statistics pass over x (per-channel sums of x - k, k = the channel's first
// value, a shift that keeps a large mean precise), then one pass writing y = act(z),
// z = (x - mean) * scale + bias, scale = invstd * weight (x - mean first: x * scale + shift
// cancels at a large mean). Only x and the (C,) mean / invstd are kept for backward.
// Backward: one pass reading x and dy that recomputes z and act'(z) on the
// fly for the channel sums of g = dy * act'(z) and g * (x - mean), then one pass writing
// dx = scale * g + (x - mean) * u[c] + o[c] (u, o from those sums); dweight / dbias come
// from the sums. For SiLU/GELU the first pass also stores g in dx and the second reads it
// back: act' costs an exp/erf per value, which made the backward compute-bound (silu 3.4 ms
// vs identity 1.2 ms at 8x32x80x80, 1 thread); one more write is cheaper than a second exp.
//
// NCHW: a task is one channel, stats then the write pass over its N planes (x, and dy, of one
// channel usually still sit in L2 for the second pass). Channels-last: the reductions split the
// N*H*W rows into fixed parts, each with per-channel partial sums vectorised along C; the
// elementwise passes are parallel over rows.
// Accumulation: float blocks of kBlock values added into double (float32), double throughout
// (float64). Running statistics are updated as aten's batch norm does (momentum, unbiased
// variance for running_var).
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

// Over all rows in fixed parts (one per thread), summed at the end in double.
template <typename A, typename Term>
void cl_sums(int64_t R, int64_t C, std::vector<double>& s1, std::vector<double>& s2,
             const Term& term) {
  const int64_t parts = std::max<int64_t>(1, at::get_num_threads());
  std::vector<double> p1(parts * C, 0.0), p2(parts * C, 0.0);
  parallel_chunks(R, parts, grain(C), [&](int64_t p, int64_t r0, int64_t r1) {
    row_sums<A>(r0, r1, C, p1.data() + p * C, p2.data() + p * C, term);
  });
  s1.assign(C, 0.0);
  s2.assign(C, 0.0);
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t c = 0; c < C; ++c) { s1[c] += p1[p * C + c]; s2[c] += p2[p * C + c]; }
}

// ---------------------------------------------------------------- per-channel coefficients
struct Stats {  // of one channel, from the shifted sums
  double mean, var, invstd;
};

Stats stats_of(double k, double s, double q, int64_t R, double eps) {
  const double m = s / double(R);
  const double var = std::max(0.0, q / double(R) - m * m);
  return {k + m, var, 1.0 / std::sqrt(var + eps)};
}

template <typename A> struct FwdOut {  // what the forward writes per channel
  A* mean;
  A* invstd;
  double* mean_d;
  double* var;
  A* scale;
  A* shift;  // the bias: z = (x - mean) * scale + shift
};

template <typename A>
void set_channel(FwdOut<A>& o, int64_t c, const Stats& st, const A* w, const A* b) {
  o.mean[c] = A(st.mean);
  o.invstd[c] = A(st.invstd);
  o.mean_d[c] = st.mean;
  o.var[c] = st.var;
  o.scale[c] = A(st.invstd * double(w[c]));
  o.shift[c] = b[c];
}

// ---------------------------------------------------------------- forward
template <typename T, typename A, typename Act>
void fwd_cl(const T* x, T* y, const A* w, const A* b, FwdOut<A> o, int64_t R, int64_t C,
            double eps) {
  std::vector<A> k(x, x + C);  // shift: the first row
  std::vector<double> s, q;
  const A* kp = k.data();
  cl_sums<A>(R, C, s, q, [=](int64_t i, int64_t c, A& a1, A& a2) {
    const A d = static_cast<A>(x[i * C + c]) - kp[c];
    a1 += d;
    a2 += d * d;
  });
  for (int64_t c = 0; c < C; ++c) set_channel(o, c, stats_of(kp[c], s[c], q[c], R, eps), w, b);
  const A* sc = o.scale;
  const A* sh = o.shift;
  const A* mp = o.mean;
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    act_rows<T, A, Act>(x, y, mp, sc, sh, r0, r1, C);
  });
}

template <typename T, typename A, typename Act>
void fwd_nchw(const T* x, T* y, const A* w, const A* b, FwdOut<A> o, int64_t N, int64_t C,
              int64_t HW, double eps) {
  at::parallel_for(0, C, grain(N * HW), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const T* xc = x + c * HW;
      T* yc = y + c * HW;
      const A k = static_cast<A>(xc[0]);
      double s = 0, q = 0;
      plane_sums<A>(N, HW, s, q, [=](int64_t n, int64_t i, A& a1, A& a2) {
        const A d = static_cast<A>(xc[n * C * HW + i]) - k;
        a1 += d;
        a2 += d * d;
      });
      set_channel(o, c, stats_of(k, s, q, N * HW, eps), w, b);
      const A sc = o.scale[c], sh = o.shift[c], m = o.mean[c];
      for (int64_t n = 0; n < N; ++n)  // the channel's planes, usually still in L2
        act_plane<T, A, Act>(xc + n * C * HW, yc + n * C * HW, m, sc, sh, HW);
    }
  });
}

// ---------------------------------------------------------------- backward
// g = dy * act'(z); Sg = sum g, Sgx = sum g * (x - mean) per channel.
// dx = scale * (g - Sg / R - xhat * invstd * Sgx / R) = scale * g + (x - mean) * u + o,
// u = -scale * invstd^2 * Sgx / R, o = -scale * Sg / R; dweight = invstd * Sgx.
template <typename A> struct BwdCoef {
  A u, o;
};

template <typename A>
BwdCoef<A> coef(double sc, double invstd, double sg, double sgx, int64_t R) {
  const double u = -sc * invstd * invstd * sgx / double(R);
  return {A(u), A(-sc * sg / double(R))};
}

template <typename T, typename A, typename Act>
void bwd_cl(const T* dy, const T* x, const A* mean, const A* invstd, const A* sc, const A* sh,
            T* dx, double* dw, double* db, int64_t R, int64_t C) {
  std::vector<double> sg, sgx;
  cl_sums<A>(R, C, sg, sgx, [=](int64_t i, int64_t c, A& a1, A& a2) {
    const A xc = static_cast<A>(x[i * C + c]) - mean[c];
    const A g = static_cast<A>(dy[i * C + c]) * Act::d(xc * sc[c] + sh[c]);
    if constexpr (Act::kCostly) dx[i * C + c] = static_cast<T>(g);  // the dx pass reads it
    a1 += g;
    a2 += g * xc;
  });
  std::vector<A> u(C), o(C);
  for (int64_t c = 0; c < C; ++c) {
    const auto k = coef<A>(sc[c], invstd[c], sg[c], sgx[c], R);
    u[c] = k.u;
    o[c] = k.o;
    dw[c] = double(invstd[c]) * sgx[c];
    db[c] = sg[c];
  }
  const A* up = u.data();
  const A* op = o.data();
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    if constexpr (Act::kCostly)
      dx_from_g<T, A>(x, dx, mean, sc, up, op, r0, r1, C);
    else
      dx_rows<T, A, Act>(dy, x, dx, mean, sc, sh, up, op, r0, r1, C);
  });
}

template <typename T, typename A, typename Act>
void bwd_nchw(const T* dy, const T* x, const A* mean, const A* invstd, const A* scale,
              const A* shift, T* dx, double* dw, double* db, int64_t N, int64_t C, int64_t HW) {
  at::parallel_for(0, C, grain(2 * N * HW), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t off = c * HW;
      const A sc = scale[c], sh = shift[c], m = mean[c];
      double sg = 0, sgx = 0;
      plane_sums<A>(N, HW, sg, sgx, [=](int64_t n, int64_t i, A& a1, A& a2) {
        const int64_t j = off + n * C * HW + i;
        const A xc = static_cast<A>(x[j]) - m;
        const A g = static_cast<A>(dy[j]) * Act::d(xc * sc + sh);
        if constexpr (Act::kCostly) dx[j] = static_cast<T>(g);  // the dx pass reads it
        a1 += g;
        a2 += g * xc;
      });
      const auto k = coef<A>(sc, invstd[c], sg, sgx, N * HW);
      dw[c] = double(invstd[c]) * sgx;
      db[c] = sg;
      for (int64_t n = 0; n < N; ++n) {  // the channel's planes, usually still in L2
        const int64_t p = off + n * C * HW;
        if constexpr (Act::kCostly)
          dx_plane_from_g<T, A>(x + p, dx + p, m, sc, k.u, k.o, HW);
        else
          dx_plane<T, A, Act>(dy + p, x + p, dx + p, m, sc, sh, k.u, k.o, HW);
      }
    }
  });
}

// ---------------------------------------------------------------- checks + dispatch
void check_input(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(x.device().is_cpu(), "bn_act cpu: x must be a CPU tensor, got ", x.device());
  TORCH_CHECK(x.dim() == 4, "bn_act cpu: x must be 4-D (N, C, H, W), got ", x.dim(), "-D");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble, "bn_act cpu: unsupported dtype ", st,
              " (supported: float32, float64)");
  TORCH_CHECK(w.numel() == x.size(1) && b.numel() == x.size(1),
              "bn_act cpu: weight and bias must have C=", x.size(1), " elements");
  TORCH_CHECK(x.numel() > x.size(1),
              "bn_act cpu: expected more than 1 value per channel when training, got input "
              "size ", x.sizes());
}

// aten's update: running = momentum * batch + (1 - momentum) * running, unbiased variance.
template <typename R>
void update_loop(R* rm, R* rv, const std::vector<double>& mean, const std::vector<double>& var,
                 double bessel, double momentum) {
  for (size_t c = 0; c < mean.size(); ++c) {
    rm[c] = R(momentum * mean[c] + (1 - momentum) * double(rm[c]));
    rv[c] = R(momentum * var[c] * bessel + (1 - momentum) * double(rv[c]));
  }
}

void update_running(const c10::optional<at::Tensor>& rm_, const c10::optional<at::Tensor>& rv_,
                    const std::vector<double>& mean, const std::vector<double>& var, int64_t R,
                    double momentum) {
  if (!rm_.has_value() || !rm_->defined()) return;
  at::Tensor rm = *rm_, rv = *rv_;
  TORCH_CHECK(rm.is_contiguous() && rv.is_contiguous() && rm.numel() == int64_t(mean.size()) &&
                  rv.numel() == int64_t(mean.size()) && rm.scalar_type() == rv.scalar_type(),
              "bn_act cpu: running_mean / running_var must be contiguous (C,) of one dtype");
  const double bessel = double(R) / double(R - 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rm.scalar_type(), "bn_act_run", [&] {
    update_loop(rm.mutable_data_ptr<scalar_t>(), rv.mutable_data_ptr<scalar_t>(), mean, var,
                bessel, momentum);
  });
}

// (y, mean, invstd); running_mean / running_var updated in place when given.
std::vector<at::Tensor> forward(at::Tensor x, at::Tensor w, at::Tensor b,
                                c10::optional<at::Tensor> running_mean,
                                c10::optional<at::Tensor> running_var, double momentum,
                                double eps, int64_t act) {
  check_input(x, w, b);
  x = dense(x);
  const bool cl = is_cl(x);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.detach().to(at_).contiguous(), ba = b.detach().to(at_).contiguous();
  auto y = fusebench::empty_output(x, cl ? at::MemoryFormat::ChannelsLast
                                         : at::MemoryFormat::Contiguous);
  auto mean = at::empty({C}, x.options().dtype(at_));
  auto invstd = at::empty({C}, x.options().dtype(at_));
  std::vector<double> var(C), mean_d(C);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bn_act_cpu_fwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    std::vector<A> scale(C), shift(C);
    FwdOut<A> o{mean.mutable_data_ptr<A>(), invstd.mutable_data_ptr<A>(), mean_d.data(),
                var.data(), scale.data(), shift.data()};
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      if (cl)
        fwd_cl<scalar_t, A, Ac>(xp, yp, wa.const_data_ptr<A>(), ba.const_data_ptr<A>(), o,
                                N * HW, C, eps);
      else
        fwd_nchw<scalar_t, A, Ac>(xp, yp, wa.const_data_ptr<A>(), ba.const_data_ptr<A>(), o, N,
                                  C, HW, eps);
    });
  });
  update_running(running_mean, running_var, mean_d, var, N * HW, momentum);
  return {y, mean, invstd};
}

// y = act((x - mean) * invstd * weight + bias) from saved statistics: the forward's write pass
// alone (a consumer recomputes the BN + act output in its backward instead of saving it).
at::Tensor apply(at::Tensor x, at::Tensor w, at::Tensor b, at::Tensor mean, at::Tensor invstd,
                 int64_t act) {
  check_input(x, w, b);
  x = dense(x);
  const bool cl = is_cl(x);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = acc_type(x.scalar_type());
  mean = mean.to(at_).contiguous();
  invstd = invstd.to(at_).contiguous();
  auto wa = w.detach().to(at_).contiguous(), ba = b.detach().to(at_).contiguous();
  auto y = fusebench::empty_output(x, cl ? at::MemoryFormat::ChannelsLast
                                         : at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bn_act_cpu_apply", [&] {
    using A = typename AccOf<scalar_t>::type;
    const A* m = mean.const_data_ptr<A>();
    const A* is = invstd.const_data_ptr<A>();
    const A* wp = wa.const_data_ptr<A>();
    std::vector<A> sc(C);
    for (int64_t c = 0; c < C; ++c) sc[c] = A(double(is[c]) * double(wp[c]));
    const A* scp = sc.data();
    const A* sh = ba.const_data_ptr<A>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      if (cl) {
        at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
          act_rows<scalar_t, A, Ac>(xp, yp, m, scp, sh, r0, r1, C);
        });
      } else {
        at::parallel_for(0, N * C, grain(HW), [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            const int64_t c = p % C;
            act_plane<scalar_t, A, Ac>(xp + p * HW, yp + p * HW, m[c], scp[c], sh[c], HW);
          }
        });
      }
    });
  });
  return y;
}

// (dx, dweight, dbias) from the saved x, mean, invstd; dy takes x's layout.
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor w, at::Tensor b,
                                 at::Tensor mean, at::Tensor invstd, int64_t act) {
  check_input(x, w, b);
  const BwdArgs a = bwd_args("bn_act cpu", dy, x, mean, invstd, w, b);
  x = a.x, dy = a.dy, mean = a.s1, invstd = a.s2;
  const at::Tensor &wa = a.w, &ba = a.b, &dx = a.dx;
  const bool cl = a.cl;
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = a.acc;
  auto dw = at::empty({C}, x.options().dtype(at_));
  auto db = at::empty({C}, x.options().dtype(at_));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bn_act_cpu_bwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    const A* m = mean.const_data_ptr<A>();
    const A* is = invstd.const_data_ptr<A>();
    std::vector<A> sc(C), sh(C);   // z = (x - mean) * scale + shift, as the forward has it
    for (int64_t c = 0; c < C; ++c) {
      const double s = double(is[c]) * double(wa.const_data_ptr<A>()[c]);
      sc[c] = A(s);
      sh[c] = ba.const_data_ptr<A>()[c];
    }
    std::vector<double> dwd(C), dbd(C);
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      if (cl)
        bwd_cl<scalar_t, A, Ac>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), m,
                                is, sc.data(), sh.data(), dx.mutable_data_ptr<scalar_t>(),
                                dwd.data(), dbd.data(), N * HW, C);
      else
        bwd_nchw<scalar_t, A, Ac>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                  m, is, sc.data(), sh.data(), dx.mutable_data_ptr<scalar_t>(),
                                  dwd.data(), dbd.data(), N, C, HW);
    });
    std::copy(dwd.begin(), dwd.end(), dw.mutable_data_ptr<A>());
    std::copy(dbd.begin(), dbd.end(), db.mutable_data_ptr<A>());
  });
  return {dx, dw.to(w.scalar_type()), db.to(b.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward,
        "BN (training statistics) + act forward: (y, mean, invstd); running stats updated",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"),
        py::arg("running_var"), py::arg("momentum"), py::arg("eps"), py::arg("act"));
  m.def("apply", &apply, "y = act(BN(x)) from saved mean / invstd (no statistics pass)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        py::arg("act"));
  m.def("backward", &backward, "BN + act backward: (dx, dweight, dbias)", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        py::arg("act"));
}
