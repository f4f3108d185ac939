// Activation kernels on CPU: memory-efficient SiLU, SE gate, bias + GELU, GLU gates; forward +
// backward, each one pass over memory (read x [and dy], write the output), OpenMP via
// at::parallel_for.
//
// Layout: x is NCHW-contiguous or channels-last-contiguous (the Python side makes anything else
// contiguous and gives dy x's layout). NCHW: a task is one (n, c) plane of H*W values with a
// per-channel scalar (bias, gate). Channels-last: a task is a block of positions, each a
// contiguous row of C values with a per-channel vector. Inner loops run along the contiguous
// dim and are written for the auto-vectoriser.
// Math (accumulation types, libmvec, the activations): cpu_math.h, shared with bn_act.
// Reductions (dbias, dgate) go through fixed per-task partials summed at the end: results do
// not depend on the thread count.
// Also here: the MLP's row blocks (mlp_blocks.h, fuse/mlp_blocks.py), which run these GELU rows
// between aten's GEMMs, and GRN after an act (grn.h, the grn_mlp site's elementwise part);
// compiled into this extension so that torch's headers are parsed once.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include "../cpu_math.h"
#include "../huge_pages.h"
#include "gelu_rows.h"
#include "grn.h"
#include "mlp_blocks.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace {

using namespace fusebench;

constexpr int64_t kRowBlock = 16;       // channels-last: positions (rows of C) per task
constexpr int64_t kHwParts = 16;        // channels-last dgate: fixed partials per sample

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

// ---------------------------------------------------------------- kernels on raw pointers
// (templates, not lambdas inside AT_DISPATCH: a #pragma cannot sit inside a macro argument)
// (the loops over __restrict pointers: see the note above gelu_plane)
template <typename T, typename A>
void silu_span(const T* __restrict x, T* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A v = static_cast<A>(x[i]);
    y[i] = static_cast<T>(v * sigmoid(v));
  }
}

template <typename T, typename A>
void silu_grad_span(const T* __restrict dy, const T* __restrict x, T* __restrict dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = static_cast<T>(static_cast<A>(dy[i]) * Act<kSilu>::d(static_cast<A>(x[i])));
  }
}

template <typename T, typename A>
void silu_fwd_k(const T* x, T* y, int64_t n) {
  at::parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
    silu_span<T, A>(x + b, y + b, e - b);
  });
}

template <typename T, typename A>
void silu_bwd_k(const T* dy, const T* x, T* dx, int64_t n) {
  at::parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
    silu_grad_span<T, A>(dy + b, x + b, dx + b, e - b);
  });
}

// The inner loops are plain functions over __restrict pointers, called from the parallel
// lambdas: read through a lambda's by-reference captures, dy / x / dx might alias each other
// and GCC left the GELU backward loop scalar, with a scalar expf per value (measured 9-15x
// slower than aten's gelu_backward at ConvNeXt's MLP shapes; bn_act hit the same trap).
// y = gelu(x + b) over n values with one bias (a plane) or a bias per value (a row).
template <typename T, typename A, bool kTanh>
void gelu_plane(const T* __restrict x, A bc, T* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(Gelu<kTanh>::f(static_cast<A>(x[i]) + bc));
}

// dx = dy * gelu'(x + b); returns the plane's sum of dx (its dbias share). kY: also y =
// gelu(x + b) (a consumer's recomputed input): f and f' of one z share their exp, which GCC
// computes once (the same pure arithmetic), so the extra output costs one write, not a pass.
template <typename T, typename A, bool kTanh, bool kY>
A gelu_grad_plane(const T* __restrict dy, const T* __restrict x, A bc, T* __restrict dx,
                  T* __restrict y, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const A z = static_cast<A>(x[i]) + bc;
    const A d = static_cast<A>(dy[i]) * Gelu<kTanh>::d(z);
    dx[i] = static_cast<T>(d);
    if constexpr (kY) y[i] = static_cast<T>(Gelu<kTanh>::f(z));
    s += d;
  }
  return s;
}

// One (n, c) plane of H*W values (NCHW) or one row of C values (channels-last) per inner call.
template <typename T, typename A, bool kTanh>
void bias_gelu_fwd_k(const T* x, const A* b, T* y, int64_t N, int64_t C, int64_t HW, Layout l) {
  if (l == Layout::kNCHW) {
    at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        gelu_plane<T, A, kTanh>(x + t * HW, b[t % C], y + t * HW, HW);
    });
  } else {
    at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) gelu_row<T, A, kTanh>(x + r * C, b, y + r * C, C);
    });
  }
}

// dx = dy * gelu'(x + b); `part` gets dbias partials: (N, C) for NCHW, (blocks, C) otherwise.
// y (kY only): gelu(x + b) as well.
template <typename T, typename A, bool kTanh, bool kY>
void bias_gelu_bwd_k(const T* dy, const T* x, const A* b, T* dx, T* y, A* part, int64_t N,
                     int64_t C, int64_t HW, Layout l) {
  if (l == Layout::kNCHW) {
    at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)   // dbias = sum over N, H, W of dx
        part[t] = gelu_grad_plane<T, A, kTanh, kY>(dy + t * HW, x + t * HW, b[t % C],
                                                    dx + t * HW, kY ? y + t * HW : nullptr, HW);
    });
  } else {
    const int64_t rows = N * HW, nblk = (rows + kRowBlock - 1) / kRowBlock;
    at::parallel_for(0, nblk, grain(C * kRowBlock), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        A* acc = part + k * C;
        std::fill(acc, acc + C, A(0));
        for (int64_t r = k * kRowBlock; r < std::min(rows, (k + 1) * kRowBlock); ++r)
          gelu_grad_row<T, A, kTanh, kY>(dy + r * C, x + r * C, b, dx + r * C,
                                          kY ? y + r * C : nullptr, acc, C);
      }
    });
  }
}

// s = sigmoid(g), (N*C). y = x * s[n, c].
template <typename T, typename A>
void se_gate_fwd_k(const T* x, const A* s, T* y, int64_t N, int64_t C, int64_t HW, Layout l) {
  if (l == Layout::kNCHW) {
    at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const A st = s[t];
        const int64_t o = t * HW;
#pragma omp simd
        for (int64_t i = 0; i < HW; ++i) y[o + i] = static_cast<T>(static_cast<A>(x[o + i]) * st);
      }
    });
  } else {
    at::parallel_for(0, N * HW, grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const A* sn = s + (r / HW) * C;
        const int64_t o = r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) y[o + c] = static_cast<T>(static_cast<A>(x[o + c]) * sn[c]);
      }
    });
  }
}

// dx = dy * s; `part` gets sum_hw(dy * x) partials: (N*C) for NCHW, (N, P, C) otherwise.
template <typename T, typename A>
void se_gate_bwd_k(const T* dy, const T* x, const A* s, T* dx, A* part, int64_t N, int64_t C,
                   int64_t HW, int64_t P, Layout l) {
  if (l == Layout::kNCHW) {
    at::parallel_for(0, N * C, grain(HW), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const A st = s[t];
        const int64_t o = t * HW;
        A acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < HW; ++i) {
          const A g = static_cast<A>(dy[o + i]);
          dx[o + i] = static_cast<T>(g * st);
          acc += g * static_cast<A>(x[o + i]);
        }
        part[t] = acc;
      }
    });
  } else {
    at::parallel_for(0, N * P, grain(C * HW / P + 1), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t n = k / P, p = k % P;
        const A* sn = s + n * C;
        A* acc = part + k * C;
        std::fill(acc, acc + C, A(0));
        for (int64_t hw = p * HW / P; hw < (p + 1) * HW / P; ++hw) {
          const int64_t o = (n * HW + hw) * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const A g = static_cast<A>(dy[o + c]);
            dx[o + c] = static_cast<T>(g * sn[c]);
            acc[c] += g * static_cast<A>(x[o + c]);
          }
        }
      }
    });
  }
}

// GLU gates (SwiGLU, GeGLU, ReGLU): p = act(a) * b over rows of H values, the MLP's gate and
// up projections (two tensors, or the halves of one packed projection: entry points below). Backward reads dp, a and b once and writes da, db and,
// for the down projection's weight gradient, p itself: a pass fewer than recomputing it.
template <typename T, typename A, typename F>
void glu_span(const T* __restrict a, const T* __restrict b, T* __restrict p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    p[i] = static_cast<T>(F::f(static_cast<A>(a[i])) * static_cast<A>(b[i]));
}

template <typename T, typename A, typename F, bool kWantP>
void glu_grad_span(const T* __restrict dp, const T* __restrict a, const T* __restrict b,
                   T* __restrict da, T* __restrict db, T* __restrict p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A z = static_cast<A>(a[i]), g = static_cast<A>(dp[i]), bv = static_cast<A>(b[i]);
    const A s = F::f(z);
    da[i] = static_cast<T>(g * bv * F::d(z));
    db[i] = static_cast<T>(g * s);
    if constexpr (kWantP) p[i] = static_cast<T>(s * bv);
  }
}

template <typename T> using Acc = typename AccOf<T>::type;
template <typename T> c10::ScalarType acc_type() { return c10::CppTypeToScalarType<Acc<T>>::value; }

// ---------------------------------------------------------------- entry points
at::Tensor silu_forward(const at::Tensor& x_) {
  at::Tensor x = like(x_, layout_of(x_));
  at::Tensor y = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "silu_forward", [&] {
    silu_fwd_k<scalar_t, Acc<scalar_t>>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel());
  });
  return y;
}

at::Tensor silu_backward(const at::Tensor& dy_, const at::Tensor& x_) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);  // same strides as x: same flat index
  at::Tensor dx = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "silu_backward", [&] {
    silu_bwd_k<scalar_t, Acc<scalar_t>>(dy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                        dx.data_ptr<scalar_t>(), x.numel());
  });
  return dx;
}

at::Tensor bias_gelu_forward(const at::Tensor& x_, const at::Tensor& bias, bool tanh_approx) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  TORCH_CHECK(bias.numel() == C, "bias has ", bias.numel(), " elements, C=", C);
  at::Tensor y = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "bias_gelu_forward", [&] {
    using A = Acc<scalar_t>;
    at::Tensor b = bias.to(acc_type<scalar_t>()).contiguous();
    auto run = tanh_approx ? bias_gelu_fwd_k<scalar_t, A, true> : bias_gelu_fwd_k<scalar_t, A, false>;
    run(x.data_ptr<scalar_t>(), b.data_ptr<A>(), y.data_ptr<scalar_t>(), N, C, HW, l);
  });
  return y;
}

// (dx, dbias), or with want_y (dx, dbias, y = gelu(x + bias)): the MLP's backward recomputes
// y for fc2's weight gradient, and one kernel giving both saves a pass and an exp per value.
std::vector<at::Tensor> bias_gelu_backward(const at::Tensor& dy_, const at::Tensor& x_,
                                           const at::Tensor& bias, bool tanh_approx,
                                           bool want_y) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  TORCH_CHECK(bias.numel() == C, "bias has ", bias.numel(), " elements, C=", C);
  at::Tensor dx = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  at::Tensor y = want_y ? fusebench::empty_output(x, at::MemoryFormat::Preserve) : at::Tensor();
  at::Tensor db;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "bias_gelu_backward", [&] {
    using A = Acc<scalar_t>;
    at::Tensor b = bias.to(acc_type<scalar_t>()).contiguous();
    const int64_t rows = l == Layout::kNCHW ? N : (N * HW + kRowBlock - 1) / kRowBlock;
    at::Tensor part = at::empty({rows, C}, x.options().dtype(acc_type<scalar_t>()));
    using K = void (*)(const scalar_t*, const scalar_t*, const A*, scalar_t*, scalar_t*, A*,
                       int64_t, int64_t, int64_t, Layout);
    const K kernels[2][2] = {{bias_gelu_bwd_k<scalar_t, A, false, false>,
                              bias_gelu_bwd_k<scalar_t, A, false, true>},
                             {bias_gelu_bwd_k<scalar_t, A, true, false>,
                              bias_gelu_bwd_k<scalar_t, A, true, true>}};
    kernels[tanh_approx][want_y](dy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), b.data_ptr<A>(),
                                 dx.data_ptr<scalar_t>(),
                                 want_y ? y.data_ptr<scalar_t>() : nullptr, part.data_ptr<A>(),
                                 N, C, HW, l);
    db = part.sum(0);
  });
  if (want_y) return {dx, db.to(bias.scalar_type()), y};
  return {dx, db.to(bias.scalar_type())};
}

// s = sigmoid(g), or hardsigmoid(g) (hard != 0: MobileNetV3's gate, hard its slope inside the
// clamps), over the (N*C) logits, and ds/dg from s (kernels/act/gate.py: the same in torch
// for the other impls, and why the slope is a parameter).
at::Tensor gate_of(const at::Tensor& g, at::ScalarType acc, double hard) {
  at::Tensor ga = g.to(acc).reshape({-1});
  return (hard != 0 ? at::hardsigmoid(ga) : ga.sigmoid()).contiguous();
}

at::Tensor gate_grad(const at::Tensor& s, double hard) {
  return hard != 0 ? at::logical_and(s > 0, s < 1).to(s.scalar_type()) * hard : s * (1 - s);
}

// g is (N, C, 1, 1): one gate per plane.
at::Tensor se_gate_forward(const at::Tensor& x_, const at::Tensor& g, double hard) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  TORCH_CHECK(g.numel() == N * C, "gate_logits must be (N, C, 1, 1)");
  at::Tensor y = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "se_gate_forward", [&] {
    using A = Acc<scalar_t>;
    at::Tensor s = gate_of(g, acc_type<scalar_t>(), hard);
    se_gate_fwd_k<scalar_t, A>(x.data_ptr<scalar_t>(), s.data_ptr<A>(), y.data_ptr<scalar_t>(),
                               N, C, HW, l);
  });
  return y;
}

std::vector<at::Tensor> se_gate_backward(const at::Tensor& dy_, const at::Tensor& x_,
                                         const at::Tensor& g, double hard) {
  const Layout l = layout_of(x_);
  at::Tensor x = like(x_, l);
  at::Tensor dy = like(dy_.to(x.scalar_type()), l);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  at::Tensor dx = fusebench::empty_output(x, at::MemoryFormat::Preserve);
  at::Tensor dg;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "se_gate_backward", [&] {
    using A = Acc<scalar_t>;
    at::Tensor s = gate_of(g, acc_type<scalar_t>(), hard);
    const int64_t P = l == Layout::kNCHW ? 1 : std::min<int64_t>(kHwParts, std::max<int64_t>(1, HW));
    at::Tensor part = at::empty({N, P, C}, x.options().dtype(acc_type<scalar_t>()));
    se_gate_bwd_k<scalar_t, A>(dy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), s.data_ptr<A>(),
                               dx.data_ptr<scalar_t>(), part.data_ptr<A>(), N, C, HW, P, l);
    at::Tensor dot = part.sum(1).reshape({N * C});  // sum over H*W of dy * x
    dg = (dot * gate_grad(s, hard)).view(g.sizes());
  });
  return {dx, dg.to(g.scalar_type())};
}

// ---------------------------------------------------------------- GLU entry points
// Rows of H values with their own row strides: separate contiguous a and b (ld = H), or one
// packed (rows, 2H) tensor whose halves are a and b (`gate, up = proj(x).chunk(2, -1)`: ld =
// 2H, b or a at + H), read in place and, backward, its gradient written as one packed tensor
// (no cat: the projection's backward takes it as it is).
struct GluRows {
  int64_t rows, H, ld_in, ld_out;
};

template <typename T, typename F>
void glu_fwd_rows(const T* a, const T* b, T* p, const GluRows& g) {
  at::parallel_for(0, g.rows, grain(g.H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      glu_span<T, Acc<T>, F>(a + r * g.ld_in, b + r * g.ld_in, p + r * g.H, g.H);
  });
}

template <typename T, typename F>
void glu_bwd_rows(const T* dp, const T* a, const T* b, T* da, T* db, T* p, const GluRows& g) {
  at::parallel_for(0, g.rows, grain(g.H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r * g.ld_in, o = r * g.ld_out, q = r * g.H;
      if (p)
        glu_grad_span<T, Acc<T>, F, true>(dp + q, a + i, b + i, da + o, db + o, p + q, g.H);
      else
        glu_grad_span<T, Acc<T>, F, false>(dp + q, a + i, b + i, da + o, db + o, nullptr, g.H);
    }
  });
}

void glu_check(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "glu cpu: CPU tensors only, got ", t.device());
  TORCH_CHECK(t.dim() >= 1, "glu cpu: tensors must have at least one dim");
}

GluRows rows_of(const at::Tensor& t, int64_t H, int64_t ld_in, int64_t ld_out) {
  return {H ? t.numel() / H : 0, H, ld_in, ld_out};
}

// p = act(a) * b for a, b of one shape (made contiguous); or, packed, for ab's two halves
// along the last dim (a first unless gate_second).
at::Tensor glu_forward(const at::Tensor& a_, const at::Tensor& b_, int64_t act) {
  glu_check(a_);
  TORCH_CHECK(a_.sizes() == b_.sizes(), "glu cpu: a and b shapes differ: ", a_.sizes(), " vs ",
              b_.sizes());
  at::Tensor a = a_.contiguous(), b = b_.to(a.scalar_type()).contiguous();
  at::Tensor p = fusebench::empty_output(a, at::MemoryFormat::Contiguous);
  const auto g = rows_of(a, a.size(-1), a.size(-1), a.size(-1));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, a.scalar_type(), "glu_forward", [&] {
    with_act(act, [&](auto f) {
      glu_fwd_rows<scalar_t, decltype(f)>(a.const_data_ptr<scalar_t>(),
                                          b.const_data_ptr<scalar_t>(),
                                          p.mutable_data_ptr<scalar_t>(), g);
    });
  });
  return p;
}

// (da, db), or want_p: (da, db, act(a) * b)
std::vector<at::Tensor> glu_backward(const at::Tensor& dp_, const at::Tensor& a_,
                                     const at::Tensor& b_, int64_t act, bool want_p) {
  glu_check(a_);
  TORCH_CHECK(a_.sizes() == b_.sizes() && dp_.sizes() == a_.sizes(),
              "glu cpu: dp, a and b shapes differ");
  at::Tensor a = a_.contiguous(), b = b_.to(a.scalar_type()).contiguous();
  at::Tensor dp = dp_.to(a.scalar_type()).contiguous();
  at::Tensor da = fusebench::empty_output(a, at::MemoryFormat::Contiguous);
  at::Tensor db = fusebench::empty_output(a, at::MemoryFormat::Contiguous);
  at::Tensor p = want_p ? fusebench::empty_output(a, at::MemoryFormat::Contiguous) : at::Tensor();
  const auto g = rows_of(a, a.size(-1), a.size(-1), a.size(-1));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, a.scalar_type(), "glu_backward", [&] {
    with_act(act, [&](auto f) {
      glu_bwd_rows<scalar_t, decltype(f)>(
          dp.const_data_ptr<scalar_t>(), a.const_data_ptr<scalar_t>(),
          b.const_data_ptr<scalar_t>(), da.mutable_data_ptr<scalar_t>(),
          db.mutable_data_ptr<scalar_t>(), want_p ? p.mutable_data_ptr<scalar_t>() : nullptr, g);
    });
  });
  if (want_p) return {da, db, p};
  return {da, db};
}

std::pair<int64_t, int64_t> packed_halves(const at::Tensor& ab, bool gate_second) {
  glu_check(ab);
  TORCH_CHECK(ab.size(-1) % 2 == 0, "glu cpu: a packed gate needs an even last dim, got ",
              ab.size(-1));
  const int64_t H = ab.size(-1) / 2;
  return gate_second ? std::pair<int64_t, int64_t>{H, 0} : std::pair<int64_t, int64_t>{0, H};
}

at::Tensor glu_packed_forward(const at::Tensor& ab_, int64_t act, bool gate_second) {
  const auto [ga, gb] = packed_halves(ab_, gate_second);
  at::Tensor ab = ab_.contiguous();
  auto shape = ab.sizes().vec();
  const int64_t H = shape.back() / 2;
  shape.back() = H;
  at::Tensor p = at::empty(shape, ab.options());       // ab's shape, half its last dim
  fusebench::advise_huge_pages(p);
  const auto g = rows_of(p, H, 2 * H, 2 * H);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ab.scalar_type(), "glu_packed_forward", [&] {
    const scalar_t* base = ab.const_data_ptr<scalar_t>();
    with_act(act, [&](auto f) {
      glu_fwd_rows<scalar_t, decltype(f)>(base + ga, base + gb, p.mutable_data_ptr<scalar_t>(),
                                          g);
    });
  });
  return p;
}

// (d_ab) or, want_p, (d_ab, act(gate) * up): d_ab packed as ab is
std::vector<at::Tensor> glu_packed_backward(const at::Tensor& dp_, const at::Tensor& ab_,
                                            int64_t act, bool gate_second, bool want_p) {
  const auto [ga, gb] = packed_halves(ab_, gate_second);
  at::Tensor ab = ab_.contiguous();
  const int64_t H = ab.size(-1) / 2;
  at::Tensor dp = dp_.to(ab.scalar_type()).contiguous();
  TORCH_CHECK(dp.numel() * 2 == ab.numel() && dp.size(-1) == H,
              "glu cpu: dp must have ab's shape with half its last dim");
  at::Tensor dab = fusebench::empty_output(ab, at::MemoryFormat::Contiguous);
  at::Tensor p = want_p ? fusebench::empty_output(dp, at::MemoryFormat::Contiguous)
                        : at::Tensor();
  const auto g = rows_of(dp, H, 2 * H, 2 * H);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, ab.scalar_type(), "glu_packed_backward", [&] {
    const scalar_t* base = ab.const_data_ptr<scalar_t>();
    scalar_t* dbase = dab.mutable_data_ptr<scalar_t>();
    with_act(act, [&](auto f) {
      glu_bwd_rows<scalar_t, decltype(f)>(dp.const_data_ptr<scalar_t>(), base + ga, base + gb,
                                          dbase + ga, dbase + gb,
                                          want_p ? p.mutable_data_ptr<scalar_t>() : nullptr, g);
    });
  });
  if (want_p) return {dab, p};
  return {dab};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_forward", &silu_forward, "SiLU forward");
  m.def("silu_backward", &silu_backward, "SiLU backward from the saved input");
  m.def("bias_gelu_forward", &bias_gelu_forward, "gelu(x + bias[c])");
  m.def("bias_gelu_backward", &bias_gelu_backward,
        "(dx, dbias) from the saved x and bias; want_y: (dx, dbias, gelu(x + bias))",
        py::arg("dy"), py::arg("x"), py::arg("bias"), py::arg("tanh_approx"),
        py::arg("want_y") = false);
  m.def("se_gate_forward", &se_gate_forward,
        "x * sigmoid(g) (hard != 0: hardsigmoid), g (N, C, 1, 1)", py::arg("x"), py::arg("g"),
        py::arg("hard") = 0.0);
  m.def("se_gate_backward", &se_gate_backward, "(dx, dg) from the saved x and g", py::arg("dy"),
        py::arg("x"), py::arg("g"), py::arg("hard") = 0.0);
  m.def("glu_forward", &glu_forward, "act(a) * b (act: cpu_math.h's ActCode)", py::arg("a"),
        py::arg("b"), py::arg("act"));
  m.def("glu_backward", &glu_backward, "(da, db) from the saved a and b; want_p: also act(a)*b",
        py::arg("dp"), py::arg("a"), py::arg("b"), py::arg("act"), py::arg("want_p") = false);
  m.def("glu_packed_forward", &glu_packed_forward,
        "act(gate) * up for ab = [gate, up] along the last dim ([up, gate]: gate_second)",
        py::arg("ab"), py::arg("act"), py::arg("gate_second") = false);
  m.def("glu_packed_backward", &glu_packed_backward,
        "(d_ab,) from the saved ab, packed as ab; want_p: (d_ab, act(gate) * up)", py::arg("dp"),
        py::arg("ab"), py::arg("act"), py::arg("gate_second") = false, py::arg("want_p") = false);
  m.def("grn_forward", &fusebench::grn::forward,
        "(u, G, m): u = GRN(act(h + b)) over a contiguous (N, H, W, C) h (grn.h)", py::arg("h"),
        py::arg("b"), py::arg("gamma"), py::arg("beta"), py::arg("eps"), py::arg("act"));
  m.def("grn_backward", &fusebench::grn::backward,
        "(dh, db, dgamma, dbeta[, u]) from du and the saved h, G, m (grn.h)", py::arg("du"),
        py::arg("h"), py::arg("b"), py::arg("gamma"), py::arg("beta"), py::arg("G"),
        py::arg("m"), py::arg("act"), py::arg("want_u") = false);
  m.def("mlp_forward", &fusebench::mlp_blocks::forward,
        "(out, h0): gelu(x w1^T + b1) w2^T [+ b2] [+ res], in row blocks (mlp_blocks.h)",
        py::arg("x"), py::arg("w1"), py::arg("b1"), py::arg("w2"), py::arg("b2"), py::arg("res"),
        py::arg("tanh_approx"), py::arg("rows"));
  m.def("mlp_backward", &fusebench::mlp_blocks::backward,
        "(dx, dw1, db1, dw2, db2) from the saved x and h0, in row blocks (mlp_blocks.h)",
        py::arg("dout"), py::arg("x"), py::arg("h0"), py::arg("b1"), py::arg("w1"),
        py::arg("w2"), py::arg("tanh_approx"), py::arg("rows"), py::arg("has_b2"));
}
