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
// Residual (optional, a ResNet block's `bn3 -> += identity -> ReLU`): y = act(z + r). Backward
// then takes act'(z + r) from z + r, or for ReLU / ReLU6 from y itself (the same where y =
// act(z + r): y > 0, 0 < y < 6), so a caller may keep y (which eager's ReLU keeps, and the next
// block's conv) instead of r (a downsample branch's output, kept by nothing else). It stores g =
// dy * act' as r's gradient in its first pass and the dx pass reads it back; for the identity
// act r's gradient is dy itself.
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
template <typename T, typename A, typename Act, bool Res>
void fwd_cl(const T* x, T* y, const A* w, const A* b, FwdOut<A> o, int64_t R, int64_t C,
            double eps, const T* res) {
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
    act_rows<T, A, Act, Res>(x, y, mp, sc, sh, r0, r1, C, res);
  });
}

template <typename T, typename A, typename Act, bool Res>
void fwd_nchw(const T* x, T* y, const A* w, const A* b, FwdOut<A> o, int64_t N, int64_t C,
              int64_t HW, double eps, const T* res) {
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
        act_plane<T, A, Act, Res>(xc + n * C * HW, yc + n * C * HW, m, sc, sh, HW,
                                  Res ? res + c * HW + n * C * HW : nullptr);
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

// What a backward reads for act' (its `res` pointer): no residual (act'(z)), the residual
// (act'(z + r)) or the forward's output y (act'(y), for the acts kFromOutputOk allows).
enum ResSrc { kNoRes = 0, kResidual = 1, kOutput = 2 };

template <typename Act>
inline constexpr bool kFromOutputOk = std::is_same_v<Act, fusebench::Act<kRelu>> ||
                                      std::is_same_v<Act, fusebench::Act<kRelu6>>;

// act' of the pre-activation z + r, from what the backward reads at index i
template <int Src, typename Act, typename A, typename T>
inline A act_d(A z, const T* res, int64_t i) {
  if constexpr (Src == kResidual) return Act::d(z + static_cast<A>(res[i]));
  if constexpr (Src == kOutput) return Act::d(static_cast<A>(res[i]));
  return Act::d(z);
}

// Where the first backward pass stores g for the dx pass: in r's gradient (a residual whose
// act is not the identity: r needs g anyway), else in dx where act' is costly; nowhere else.
template <typename Act, int Src>
inline constexpr bool kStoresG = Src != kNoRes ? !kIsIdentity<Act> : Act::kCostly;

template <typename T, typename A, typename Act, int Src>
void bwd_cl(const T* dy, const T* x, const A* mean, const A* invstd, const A* sc, const A* sh,
            T* dx, double* dw, double* db, int64_t R, int64_t C, const T* res, T* dr) {
  std::vector<double> sg, sgx;
  T* gbuf = Src != kNoRes ? dr : dx;
  cl_sums<A>(R, C, sg, sgx, [=](int64_t i, int64_t c, A& a1, A& a2) {
    const A xc = static_cast<A>(x[i * C + c]) - mean[c];
    const A g = static_cast<A>(dy[i * C + c]) *
                act_d<Src, Act>(xc * sc[c] + sh[c], res, i * C + c);
    if constexpr (kStoresG<Act, Src>) gbuf[i * C + c] = static_cast<T>(g);  // dx pass reads it
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
    if constexpr (kStoresG<Act, Src>)
      dx_from_g<T, A>(x, gbuf, dx, mean, sc, up, op, r0, r1, C);
    else  // act' recomputed (for a residual: the identity, whose act' needs no r)
      dx_rows<T, A, Act>(dy, x, dx, mean, sc, sh, up, op, r0, r1, C);
  });
}

template <typename T, typename A, typename Act, int Src>
void bwd_nchw(const T* dy, const T* x, const A* mean, const A* invstd, const A* scale,
              const A* shift, T* dx, double* dw, double* db, int64_t N, int64_t C, int64_t HW,
              const T* res, T* dr) {
  T* gbuf = Src != kNoRes ? dr : dx;
  at::parallel_for(0, C, grain(2 * N * HW), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t off = c * HW;
      const A sc = scale[c], sh = shift[c], m = mean[c];
      double sg = 0, sgx = 0;
      plane_sums<A>(N, HW, sg, sgx, [=](int64_t n, int64_t i, A& a1, A& a2) {
        const int64_t j = off + n * C * HW + i;
        const A xc = static_cast<A>(x[j]) - m;
        const A g = static_cast<A>(dy[j]) * act_d<Src, Act>(xc * sc + sh, res, j);
        if constexpr (kStoresG<Act, Src>) gbuf[j] = static_cast<T>(g);  // the dx pass reads it
        a1 += g;
        a2 += g * xc;
      });
      const auto k = coef<A>(sc, invstd[c], sg, sgx, N * HW);
      dw[c] = double(invstd[c]) * sgx;
      db[c] = sg;
      for (int64_t n = 0; n < N; ++n) {  // the channel's planes, usually still in L2
        const int64_t p = off + n * C * HW;
        if constexpr (kStoresG<Act, Src>)
          dx_plane_from_g<T, A>(x + p, gbuf + p, dx + p, m, sc, k.u, k.o, HW);
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

// The residual as the passes read it: x's shape, dtype and layout (a downsample branch may
// hand it in the other layout); undefined when none was given.
at::Tensor residual_like(const c10::optional<at::Tensor>& r, const at::Tensor& x, bool cl) {
  if (!r.has_value() || !r->defined()) return {};
  TORCH_CHECK(r->sizes() == x.sizes(), "bn_act cpu: the residual must have x's shape ",
              x.sizes(), ", got ", r->sizes());
  TORCH_CHECK(r->device().is_cpu(), "bn_act cpu: the residual must be a CPU tensor");
  return r->to(x.scalar_type()).contiguous(cl ? at::MemoryFormat::ChannelsLast
                                              : at::MemoryFormat::Contiguous);
}

// Calls f(std::true_type) where a residual was given, f(std::false_type) otherwise: the
// passes take it as a compile-time flag.
template <typename F> void with_res(const at::Tensor& r, const F& f) {
  if (r.defined())
    f(std::true_type{});
  else
    f(std::false_type{});
}

// Calls f(integral_constant<int, src>) for a backward's ResSrc; kOutput only for the acts it
// is right for (the others are refused before dispatch: no instantiation for them).
template <typename Ac, typename F> void with_src(int src, const F& f) {
  if (src == kResidual) return f(std::integral_constant<int, kResidual>{});
  if constexpr (kFromOutputOk<Ac>)
    if (src == kOutput) return f(std::integral_constant<int, kOutput>{});
  f(std::integral_constant<int, kNoRes>{});
}

template <typename T> const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
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

// (y, mean, invstd); running_mean / running_var updated in place when given; y = act(z + r)
// with a residual r.
std::vector<at::Tensor> forward(at::Tensor x, at::Tensor w, at::Tensor b,
                                c10::optional<at::Tensor> running_mean,
                                c10::optional<at::Tensor> running_var, double momentum,
                                double eps, int64_t act, c10::optional<at::Tensor> residual) {
  check_input(x, w, b);
  x = dense(x);
  const bool cl = is_cl(x);
  const at::Tensor r = residual_like(residual, x, cl);
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
    const scalar_t* rp = ptr_or_null<scalar_t>(r);
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      with_res(r, [&](auto rs) {
        constexpr bool Res = decltype(rs)::value;
        if (cl)
          fwd_cl<scalar_t, A, Ac, Res>(xp, yp, wa.const_data_ptr<A>(), ba.const_data_ptr<A>(),
                                       o, N * HW, C, eps, rp);
        else
          fwd_nchw<scalar_t, A, Ac, Res>(xp, yp, wa.const_data_ptr<A>(),
                                         ba.const_data_ptr<A>(), o, N, C, HW, eps, rp);
      });
    });
  });
  update_running(running_mean, running_var, mean_d, var, N * HW, momentum);
  return {y, mean, invstd};
}

// y = act((x - mean) * invstd * weight + bias) from saved statistics: the forward's write pass
// alone (a consumer recomputes the BN + act output in its backward instead of saving it).
at::Tensor apply(at::Tensor x, at::Tensor w, at::Tensor b, at::Tensor mean, at::Tensor invstd,
                 int64_t act, c10::optional<at::Tensor> residual) {
  check_input(x, w, b);
  x = dense(x);
  const bool cl = is_cl(x);
  const at::Tensor r = residual_like(residual, x, cl);
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
    const scalar_t* rp = ptr_or_null<scalar_t>(r);
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      with_res(r, [&](auto rs) {
        constexpr bool Res = decltype(rs)::value;
        if (cl) {
          at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
            act_rows<scalar_t, A, Ac, Res>(xp, yp, m, scp, sh, r0, r1, C, rp);
          });
        } else {
          at::parallel_for(0, N * C, grain(HW), [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; ++p) {
              const int64_t c = p % C;
              act_plane<scalar_t, A, Ac, Res>(xp + p * HW, yp + p * HW, m[c], scp[c], sh[c], HW,
                                              Res ? rp + p * HW : nullptr);
            }
          });
        }
      });
    });
  });
  return y;
}

// (dx, dweight, dbias) from the saved x, mean, invstd; dy takes x's layout. With a residual r,
// or for ReLU / ReLU6 the forward's output y = act(BN(x) + r) in its place: (dx, dweight,
// dbias, dr), dr in x's layout and dtype.
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor w, at::Tensor b,
                                 at::Tensor mean, at::Tensor invstd, int64_t act,
                                 c10::optional<at::Tensor> residual,
                                 c10::optional<at::Tensor> output) {
  check_input(x, w, b);
  const BwdArgs a = bwd_args("bn_act cpu", dy, x, mean, invstd, w, b);
  x = a.x, dy = a.dy, mean = a.s1, invstd = a.s2;
  const at::Tensor &wa = a.w, &ba = a.b, &dx = a.dx;
  const bool cl = a.cl;
  const bool from_out = output.has_value() && output->defined();
  TORCH_CHECK(!(from_out && residual.has_value() && residual->defined()),
              "bn_act cpu: give the residual or the output, not both");
  TORCH_CHECK(!from_out || act == kRelu || act == kRelu6,
              "bn_act cpu: act' from the output needs relu or relu6");
  const at::Tensor r = residual_like(from_out ? output : residual, x, cl);
  const int src = !r.defined() ? kNoRes : from_out ? kOutput : kResidual;
  // the identity act's g is dy: r's gradient is dy as it is, nothing to write
  const at::Tensor dr = !r.defined() ? at::Tensor()
                        : act == kIdentity ? dy
                                           : empty_output(x, cl ? at::MemoryFormat::ChannelsLast
                                                                : at::MemoryFormat::Contiguous);
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
    const scalar_t* rp = ptr_or_null<scalar_t>(r);
    // written only where kStoresG (never for the identity, whose dr is dy)
    scalar_t* drp = r.defined() && act != kIdentity ? dr.mutable_data_ptr<scalar_t>() : nullptr;
    with_act(act, [&](auto a) {
      using Ac = decltype(a);
      with_src<Ac>(src, [&](auto s) {
        constexpr int Src = decltype(s)::value;
        if (cl)
          bwd_cl<scalar_t, A, Ac, Src>(dy.const_data_ptr<scalar_t>(),
                                       x.const_data_ptr<scalar_t>(), m, is, sc.data(),
                                       sh.data(), dx.mutable_data_ptr<scalar_t>(), dwd.data(),
                                       dbd.data(), N * HW, C, rp, drp);
        else
          bwd_nchw<scalar_t, A, Ac, Src>(dy.const_data_ptr<scalar_t>(),
                                         x.const_data_ptr<scalar_t>(), m, is, sc.data(),
                                         sh.data(), dx.mutable_data_ptr<scalar_t>(), dwd.data(),
                                         dbd.data(), N, C, HW, rp, drp);
      });
    });
    std::copy(dwd.begin(), dwd.end(), dw.mutable_data_ptr<A>());
    std::copy(dbd.begin(), dbd.end(), db.mutable_data_ptr<A>());
  });
  if (r.defined()) return {dx, dw.to(w.scalar_type()), db.to(b.scalar_type()), dr};
  return {dx, dw.to(w.scalar_type()), db.to(b.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward,
        "BN (training statistics) + act forward: (y, mean, invstd); running stats updated",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"),
        py::arg("running_var"), py::arg("momentum"), py::arg("eps"), py::arg("act"),
        py::arg("residual") = py::none());
  m.def("apply", &apply, "y = act(BN(x) [+ r]) from saved mean / invstd (no statistics pass)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        py::arg("act"), py::arg("residual") = py::none());
  m.def("backward", &backward,
        "BN + act backward: (dx, dweight, dbias[, dresidual]); act' from the residual or the "
        "output",
        py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"),
        py::arg("invstd"), py::arg("act"), py::arg("residual") = py::none(),
        py::arg("output") = py::none());
}
