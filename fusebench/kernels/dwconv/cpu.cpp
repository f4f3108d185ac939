// Backward of a depthwise KxK convolution (groups == C, stride 1, dilation 1, zero 'same'
// padding, K in 3/5/7) on channels-last (NHWC) tensors: dx, dweight, dbias.
//
// Why: ConvNeXt's 7x7 depthwise conv is cheap forward, but oneDNN's backward for it was ~17% of
// a convnext_atto train step on a 2-vCPU VM (8x40x56x56: ~10-12 ms for 0.2 GFLOP). The forward
// stays aten's (oneDNN's is faster than a correlation written like the one below: 0.8 vs 1.5 ms
// at that shape). In NHWC every tap is a multiply-add of two contiguous C-vectors, so the loops
// run along C (vectorised) and threads split the N*H output rows.
// dx is the forward correlation run on dy with the kernel flipped (odd K).
// dweight/dbias: per-chunk partial sums (fixed chunking: deterministic), summed at the end.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "../huge_pages.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGrainElems = 16384;  // below ~64 KiB of output per thread, threads cost more

constexpr int kSizes[] = {3, 5, 7};  // K with a compiled weight-gradient kernel

// The input is first copied into a zero-padded NHWC buffer (one pass; the conv itself does
// K*K multiply-adds per element), so no loop below has a boundary case. Accumulators live in
// registers: GCC vector types of 16 floats / 8 doubles (one AVX-512 register; narrower ISAs
// split them), then 8 / 4, then single lanes for what remains of C. An accumulator kept in
// memory serialises every tap on store-to-load forwarding (measured 4-7x slower).
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

// Run Op<S, lanes>::run(c0, args...) over C: full vectors, a half vector, then single lanes.
template <typename S, template <typename, int> class Op, typename... Args>
void by_lanes(int64_t C, Args... args) {
  constexpr int kW = 64 / sizeof(S);
  int64_t c0 = 0;
  for (; c0 + kW <= C; c0 += kW) Op<S, kW>::run(c0, args...);
  for (; c0 + kW / 2 <= C; c0 += kW / 2) Op<S, kW / 2>::run(c0, args...);
  for (; c0 < C; ++c0) Op<S, 1>::run(c0, args...);
}

// R adjacent outputs of one row, lanes [c0, c0+N): R independent FMA chains hide the latency.
template <typename S, int N, int R>
inline void outputs(const S* xw, const S* wt, const S* bias, S* yp, int64_t Wp, int64_t C,
                    int64_t K) {
  using V = Vec<S, N>;
  V a[R];
  const V b0 = bias ? ld<V>(bias) : V{};
  for (int r = 0; r < R; ++r) a[r] = b0;
  for (int64_t i = 0; i < K; ++i) {
    const S* xr = xw + i * Wp * C;
    for (int64_t j = 0; j < K; ++j) {
      const V wv = ld<V>(wt + (i * K + j) * C);
      for (int r = 0; r < R; ++r) a[r] += ld<V>(xr + (r + j) * C) * wv;
    }
  }
  for (int r = 0; r < R; ++r) st(yp + r * C, a[r]);
}

// One output row: xw = padded row h (top of the window), everything offset to lane c0.
template <typename S, int N>
struct RowOp {
  static void run(int64_t c0, const S* xw, const S* wt, const S* bias, S* yrow, int64_t W,
                  int64_t Wp, int64_t C, int64_t K) {
    xw += c0, wt += c0, yrow += c0;
    if (bias) bias += c0;
    int64_t w = 0;
    for (; w + 8 <= W; w += 8) outputs<S, N, 8>(xw + w * C, wt, bias, yrow + w * C, Wp, C, K);
    for (; w + 4 <= W; w += 4) outputs<S, N, 4>(xw + w * C, wt, bias, yrow + w * C, Wp, C, K);
    for (; w < W; ++w) outputs<S, N, 1>(xw + w * C, wt, bias, yrow + w * C, Wp, C, K);
  }
};

// xp: (N, H+2P, W+2P, C) zero-padded; y[n, h, w, :] = bias + sum_{i,j} xp[n, h+i, w+j, :] wt[i, j]
template <typename S>
void correlate(const S* xp, const S* wt, const S* bias, S* y, int64_t N, int64_t H, int64_t W,
               int64_t C, int64_t K) {
  const int64_t Hp = H + K - 1, Wp = W + K - 1;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, W * C));
  at::parallel_for(0, N * H, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / H, h = r % H;
      by_lanes<S, RowOp>(C, xp + (n * Hp + h) * Wp * C, wt, bias, y + r * W * C, W, Wp, C, K);
    }
  });
}

// For one output row and window row i: a[j] += dy[w] * xp[w + j] over the row, K chains.
template <int K>
struct WGrad {
  template <typename S, int N>
  struct Op {
    static void run(int64_t c0, const S* dyrow, const S* xprow, S* acc, int64_t W, int64_t C) {
      using V = Vec<S, N>;
      V a[K] = {};
      for (int64_t w = 0; w < W; ++w) {
        const V g = ld<V>(dyrow + w * C + c0);
        for (int j = 0; j < K; ++j) a[j] += g * ld<V>(xprow + (w + j) * C + c0);
      }
      for (int j = 0; j < K; ++j) st(acc + j * C + c0, ld<V>(acc + j * C + c0) + a[j]);
    }
  };
};

// dwt[i, j, :] = sum_{n,h,w} dy[n, h, w, :] * xp[n, h+i, w+j, :];  db[:] = sum dy
template <typename S, int K>
void weight_grad(const S* dy, const S* xp, S* dwt, S* db, int64_t N, int64_t H, int64_t W,
                 int64_t C) {
  const int64_t rows = N * H, KKC = K * K * C, Hp = H + K - 1, Wp = W + K - 1;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), rows * W * C / kGrainElems));
  std::vector<S> pw(parts * KKC, S(0)), pb(parts * C, S(0));
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      S* acc = pw.data() + p * KKC;
      S* accb = pb.data() + p * C;
      for (int64_t r = p * rows / parts; r < (p + 1) * rows / parts; ++r) {
        const int64_t n = r / H, h = r % H;
        const S* dyrow = dy + r * W * C;
        for (int64_t w = 0; w < W; ++w)
          for (int64_t c = 0; c < C; ++c) accb[c] += dyrow[w * C + c];
        for (int64_t i = 0; i < K; ++i)
          by_lanes<S, WGrad<K>::template Op>(C, dyrow, xp + ((n * Hp + h + i) * Wp) * C,
                                             acc + i * K * C, W, C);
      }
    }
  });
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t k = 0; k < KKC; ++k) dwt[k] += pw[p * KKC + k];
    for (int64_t c = 0; c < C; ++c) db[c] += pb[p * C + c];
  }
}

// (N, C, H, W) channels-last -> (N, H+K-1, W+K-1, C) zero-padded, contiguous
at::Tensor pad_nhwc(const at::Tensor& x, int64_t K) {
  const int64_t P = K / 2, H = x.size(2), W = x.size(3);
  auto xp = at::zeros({x.size(0), H + 2 * P, W + 2 * P, x.size(1)}, x.options());
  xp.narrow(1, P, H).narrow(2, P, W).copy_(x.permute({0, 2, 3, 1}));
  return xp;
}

void check(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu(), "dwconv cpu: x must be a CPU tensor");
  TORCH_CHECK(x.dim() == 4, "dwconv cpu: x must be 4-D (N, C, H, W)");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble,
              "dwconv cpu: unsupported dtype ", st, " (supported: float32, float64)");
  const int64_t K = w.dim() == 4 ? w.size(2) : 0;
  TORCH_CHECK(w.dim() == 4 && w.size(0) == x.size(1) && w.size(1) == 1 && w.size(3) == K &&
                  std::find(std::begin(kSizes), std::end(kSizes), K) != std::end(kSizes),
              "dwconv cpu: weight must be (C, 1, K, K) with K in 3, 5, 7; got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == st, "dwconv cpu: weight dtype ", w.scalar_type(),
              " differs from x's ", st);
}

// (C, 1, K, K) -> (K, K, C); flipped: taps reversed (the dx correlation)
at::Tensor taps(const at::Tensor& w, bool flipped) {
  auto t = w.squeeze(1);
  if (flipped) t = t.flip({1, 2});
  return t.permute({1, 2, 0}).contiguous();
}

std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor w, bool bias) {
  check(x, w);
  TORCH_CHECK(dy.sizes() == x.sizes(), "dwconv cpu: dy and x shapes differ");
  x = x.contiguous(at::MemoryFormat::ChannelsLast);
  dy = dy.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), K = w.size(2);
  auto wf = taps(w, true);
  auto dx = fusebench::empty_output(x, at::MemoryFormat::ChannelsLast);
  auto dwt = at::zeros({K, K, C}, x.options());
  auto db = at::zeros({C}, x.options());
  if (x.numel() > 0) {
    auto dyp = pad_nhwc(dy, K);
    auto xp = pad_nhwc(x, K);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dwconv_cpu_bwd", [&] {
      using S = scalar_t;
      correlate<S>(dyp.const_data_ptr<S>(), wf.const_data_ptr<S>(), nullptr,
                   dx.mutable_data_ptr<S>(), N, H, W, C, K);
      auto wg = K == 3 ? weight_grad<S, 3> : K == 5 ? weight_grad<S, 5> : weight_grad<S, 7>;
      wg(dy.const_data_ptr<S>(), xp.const_data_ptr<S>(), dwt.mutable_data_ptr<S>(),
         db.mutable_data_ptr<S>(), N, H, W, C);
    });
  }
  auto dw = dwt.permute({2, 0, 1}).unsqueeze(1).contiguous();
  return {dx, dw, bias ? db : at::Tensor()};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("backward", &backward, "(dx channels-last, dweight, dbias or None)", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("bias"));
}
