// Activation kernels on CPU: memory-efficient SiLU, SE gate, bias + GELU; forward + backward,
// each one pass over memory (read x [and dy], write the output), OpenMP via at::parallel_for.
//
// Layout: x is NCHW-contiguous or channels-last-contiguous (the Python side makes anything else
// contiguous and gives dy x's layout). NCHW: a task is one (n, c) plane of H*W values with a
// per-channel scalar (bias, gate). Channels-last: a task is a block of positions, each a
// contiguous row of C values with a per-channel vector. Inner loops run along the contiguous
// dim and are written for the auto-vectoriser.
// Math: float accumulation for float/bfloat16, double for double. expf/erff/tanhf are declared
// with glibc's SIMD variants (libmvec) so the loops vectorise without -ffast-math.
// Reductions (dbias, dgate) go through fixed per-task partials summed at the end: results do
// not depend on the thread count.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>

#if defined(__GLIBC__) && defined(__x86_64__)
extern "C" {
__attribute__((__simd__("notinbranch"))) float expf(float) noexcept;
__attribute__((__simd__("notinbranch"))) float erff(float) noexcept;
__attribute__((__simd__("notinbranch"))) float tanhf(float) noexcept;
}
#endif

namespace {

constexpr int64_t kGrainElems = 32768;  // below ~128 KiB of work per thread, threads cost more
constexpr int64_t kRowBlock = 16;       // channels-last: positions (rows of C) per task
constexpr int64_t kHwParts = 16;        // channels-last dgate: fixed partials per sample

int64_t grain(int64_t elems_per_item) {
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

// GELU and its derivative; exact (erf) or tanh approximation.
template <typename A> inline A gelu(A v, bool tanh_approx) {
  if (tanh_approx) {
    const A k = A(0.7978845608028654);  // sqrt(2 / pi)
    return A(0.5) * v * (A(1) + tanh_(k * (v + A(0.044715) * v * v * v)));
  }
  return A(0.5) * v * (A(1) + erf_(v * A(0.7071067811865476)));
}

template <typename A> inline A gelu_grad(A v, bool tanh_approx) {
  if (tanh_approx) {
    const A k = A(0.7978845608028654);
    const A t = tanh_(k * (v + A(0.044715) * v * v * v));
    return A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * k * (A(1) + A(0.134145) * v * v);
  }
  const A cdf = A(0.5) * (A(1) + erf_(v * A(0.7071067811865476)));
  return cdf + v * A(0.3989422804014327) * exp_(A(-0.5) * v * v);  // 1 / sqrt(2 pi)
}

enum class Layout { kNCHW, kChannelsLast };

Layout layout_of(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "expected a 4-D (N, C, H, W) tensor, got ", x.dim(), "-D");
  if (x.is_contiguous()) return Layout::kNCHW;
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast),
              "x must be NCHW- or channels-last-contiguous");
  return Layout::kChannelsLast;
}

at::Tensor like(const at::Tensor& t, Layout l) {
  return t.contiguous(l == Layout::kNCHW ? at::MemoryFormat::Contiguous
                                         : at::MemoryFormat::ChannelsLast);
}

// ---------------------------------------------------------------- SiLU (layout-free)
at::Tensor silu_forward(const at::Tensor& x_) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "silu_forward", [&] {
    using A = typename AccOf<scalar_t>::type;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const A v = static_cast<A>(xp[i]);
        yp[i] = static_cast<scalar_t>(v * sigmoid(v));
      }
    });
  });
  return y;
}

at::Tensor silu_backward(const at::Tensor& dy_, const at::Tensor& x_) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);
  at::Tensor dx = at::empty_like(x);
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "silu_backward", [&] {
    using A = typename AccOf<scalar_t>::type;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* gp = dy.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        const A v = static_cast<A>(xp[i]);
        const A s = sigmoid(v);
        dp[i] = static_cast<scalar_t>(static_cast<A>(gp[i]) * s * (A(1) + v * (A(1) - s)));
      }
    });
  });
  return dx;
}

// ---------------------------------------------------------------- bias + GELU
at::Tensor bias_gelu_forward(const at::Tensor& x_, const at::Tensor& bias, bool tanh_approx) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  TORCH_CHECK(bias.numel() == C, "bias has ", bias.numel(), " elements, C=", C);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "bias_gelu_forward", [&] {
    using A = typename AccOf<scalar_t>::type;
    at::Tensor b = bias.to(c10::CppTypeToScalarType<A>::value).contiguous();
    const A* bp = b.data_ptr<A>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    if (l == Layout::kNCHW) {
      at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const A bc = bp[t % C];
          const scalar_t* xc = xp + t * HW;
          scalar_t* yc = yp + t * HW;
#pragma omp simd
          for (int64_t i = 0; i < HW; ++i)
            yc[i] = static_cast<scalar_t>(gelu(static_cast<A>(xc[i]) + bc, tanh_approx));
        }
      });
    } else {
      at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* xr = xp + r * C;
          scalar_t* yr = yp + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c)
            yr[c] = static_cast<scalar_t>(gelu(static_cast<A>(xr[c]) + bp[c], tanh_approx));
        }
      });
    }
  });
  return y;
}

std::vector<at::Tensor> bias_gelu_backward(const at::Tensor& dy_, const at::Tensor& x_,
                                           const at::Tensor& bias, bool tanh_approx) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  at::Tensor dx = at::empty_like(x);
  at::Tensor db;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "bias_gelu_backward", [&] {
    using A = typename AccOf<scalar_t>::type;
    const auto acc_t = c10::CppTypeToScalarType<A>::value;
    at::Tensor b = bias.to(acc_t).contiguous();
    const A* bp = b.data_ptr<A>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* gp = dy.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    if (l == Layout::kNCHW) {
      at::Tensor part = at::empty({N, C}, x.options().dtype(acc_t));  // one sum per plane
      A* pp = part.data_ptr<A>();
      at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const A bc = bp[t % C];
          const int64_t o = t * HW;
          A s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t i = 0; i < HW; ++i) {
            const A d = static_cast<A>(gp[o + i]) *
                        gelu_grad(static_cast<A>(xp[o + i]) + bc, tanh_approx);
            dp[o + i] = static_cast<scalar_t>(d);
            s += d;  // dbias = sum over N, H, W of dx
          }
          pp[t] = s;
        }
      });
      db = part.sum(0);
    } else {
      const int64_t rows = N * HW, nblk = (rows + kRowBlock - 1) / kRowBlock;
      at::Tensor part = at::empty({nblk, C}, x.options().dtype(acc_t));  // one row per block
      A* pp = part.data_ptr<A>();
      at::parallel_for(0, nblk, grain(C * kRowBlock), [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          A* acc = pp + k * C;
          std::fill(acc, acc + C, A(0));
          for (int64_t r = k * kRowBlock; r < std::min(rows, (k + 1) * kRowBlock); ++r) {
            const int64_t o = r * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              const A d = static_cast<A>(gp[o + c]) *
                          gelu_grad(static_cast<A>(xp[o + c]) + bp[c], tanh_approx);
              dp[o + c] = static_cast<scalar_t>(d);
              acc[c] += d;
            }
          }
        }
      });
      db = part.sum(0);
    }
  });
  return {dx, db.to(bias.scalar_type())};
}

// ---------------------------------------------------------------- SE gate: x * sigmoid(g)
// g is (N, C, 1, 1): one gate per plane.
at::Tensor se_gate_forward(const at::Tensor& x_, const at::Tensor& g_) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  TORCH_CHECK(g_.numel() == N * C, "gate_logits must be (N, C, 1, 1)");
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "se_gate_forward", [&] {
    using A = typename AccOf<scalar_t>::type;
    at::Tensor s = g_.to(c10::CppTypeToScalarType<A>::value).reshape({N * C}).sigmoid();
    const A* sp = s.data_ptr<A>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    if (l == Layout::kNCHW) {
      at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const A st = sp[t];
          const int64_t o = t * HW;
#pragma omp simd
          for (int64_t i = 0; i < HW; ++i)
            yp[o + i] = static_cast<scalar_t>(static_cast<A>(xp[o + i]) * st);
        }
      });
    } else {
      at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const A* sn = sp + (r / HW) * C;
          const int64_t o = r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c)
            yp[o + c] = static_cast<scalar_t>(static_cast<A>(xp[o + c]) * sn[c]);
        }
      });
    }
  });
  return y;
}

std::vector<at::Tensor> se_gate_backward(const at::Tensor& dy_, const at::Tensor& x_,
                                         const at::Tensor& g_) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dg;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "se_gate_backward", [&] {
    using A = typename AccOf<scalar_t>::type;
    const auto acc_t = c10::CppTypeToScalarType<A>::value;
    at::Tensor s = g_.to(acc_t).reshape({N * C}).sigmoid();
    const A* sp = s.data_ptr<A>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* gp = dy.data_ptr<scalar_t>();
    scalar_t* dp = dx.data_ptr<scalar_t>();
    at::Tensor dot;  // sum over H*W of dy * x, (N*C)
    if (l == Layout::kNCHW) {
      dot = at::empty({N * C}, x.options().dtype(acc_t));
      A* op = dot.data_ptr<A>();
      at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const A st = sp[t];
          const int64_t o = t * HW;
          A acc = 0;
#pragma omp simd reduction(+ : acc)
          for (int64_t i = 0; i < HW; ++i) {
            const A g = static_cast<A>(gp[o + i]);
            dp[o + i] = static_cast<scalar_t>(g * st);
            acc += g * static_cast<A>(xp[o + i]);
          }
          op[t] = acc;
        }
      });
    } else {
      const int64_t P = std::min<int64_t>(kHwParts, std::max<int64_t>(1, HW));
      at::Tensor part = at::empty({N, P, C}, x.options().dtype(acc_t));
      A* pp = part.data_ptr<A>();
      at::parallel_for(0, N * P, grain(C * HW / P + 1), [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t n = k / P, p = k % P;
          const A* sn = sp + n * C;
          A* acc = pp + k * C;
          std::fill(acc, acc + C, A(0));
          for (int64_t hw = p * HW / P; hw < (p + 1) * HW / P; ++hw) {
            const int64_t o = (n * HW + hw) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              const A g = static_cast<A>(gp[o + c]);
              dp[o + c] = static_cast<scalar_t>(g * sn[c]);
              acc[c] += g * static_cast<A>(xp[o + c]);
            }
          }
        }
      });
      dot = part.sum(1).reshape({N * C});
    }
    dg = (dot * s * (1 - s)).view(g_.sizes());
  });
  return {dx, dg.to(g_.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_forward", &silu_forward, "SiLU forward");
  m.def("silu_backward", &silu_backward, "SiLU backward from the saved input");
  m.def("bias_gelu_forward", &bias_gelu_forward, "gelu(x + bias[c])");
  m.def("bias_gelu_backward", &bias_gelu_backward, "(dx, dbias) from the saved x and bias");
  m.def("se_gate_forward", &se_gate_forward, "x * sigmoid(g), g (N, C, 1, 1)");
  m.def("se_gate_backward", &se_gate_backward, "(dx, dg) from the saved x and g");
}
