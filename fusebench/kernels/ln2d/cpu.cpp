// LN2d on CPU: LayerNorm over the channel dim of an (N, C, H, W) tensor, forward + fused backward.
//
// NCHW memory: a task is one sample n and a block of B positions along H*W (B = 512 for C = 96
// fp32, see block_len). Its C x B tile of x stays in L2, so x is read from memory once: a Welford
// pass over C gives mean/M2 per position (lanes along H*W, contiguous -> vectorised), a second
// pass over the cached tile writes y. Backward does the same with x and dy: one pass for the two
// channel sums and the dweight/dbias partials, a second (cached) pass writes dx. During a
// task's second pass the next task's tile is prefetched (prefetch_part).
// Channels-last memory (NHWC): each position's C values are contiguous, so it is a last-dim
// LayerNorm over N*H*W rows of C: rows split over threads, each row's passes over its
// L1-resident C values vectorised along C, dweight/dbias summed per thread part then reduced.
// Shift: statistics are taken of x - x[:, 0] (the first channel at the same position), so an
// input with a large mean (1e4 + noise) keeps its precision: the subtraction of nearby floats is
// exact. The saved `mean` is that shifted mean; backward re-reads x[:, 0] to undo it.
// Accumulation is in float for float/bfloat16 inputs, double for double. dweight/dbias partials
// are per chunk (fixed chunking, so results are deterministic; PartSums) and summed at the end.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../cpu_math.h"
#include "../huge_pages.h"
#include "../part_sums.h"
#include "../vec.h"

namespace {

using fusebench::AccOf;            // the shared accumulation type, grain and fixed chunks
using fusebench::grain;
using fusebench::parallel_chunks;
using fusebench::PartSums;
using fusebench::row_at;             // row sums in registers (vec.h)
using fusebench::sum_row;

// H*W positions per task. Measured (32x96x56x56 fp32, 2 threads): 64 positions (a 256-byte run
// per channel, 192 interleaved streams) left the kernel latency-bound at 1.5-2x its traffic;
// 512 (2 KiB runs) is near the copy bound. The C x block tile of x (and dy) must still sit in
// L2 for the second pass, so wide C gets shorter blocks.
constexpr int64_t kMaxBlock = 512;
constexpr int64_t kTileBytes = 192 * 1024;  // per tensor tile; bwd keeps two (x, dy) in L2
// Backward of a channels-last x with C up to this runs the tiled path (rows transposed into a
// (C, B) tile), wider C the per-row path (bwd_rows). Remeasured after bwd_rows lost its
// gathers (8xCx56x56 fp32, 1 thread, interleaved, load ~5, tile / row / aten ms): C=3
// 0.37 / 0.65 / 1.94, C=8 0.79 / 0.43 / 0.75, C=16 0.77 / 0.40 / 0.50, C=40 3.35 / 0.86 /
// 1.08, C=48 3.87 / 0.96 / 1.20 (before the fix the row path was the slower one up to 48).
// Forward of a channels-last x is always per row.
constexpr int64_t kBwdTileMaxC = 4;

// Row stride of the (C, B) transpose buffers: one cache line more than B. With rows of exactly
// B = 512 fp32 (2 KiB), the C rows of a tile map to the same few L1 sets, and the transposes
// (load_tile/store_tile) thrashed them: channels-last C=40 fwd 3.1 ms vs 0.43 ms for NCHW.
int64_t tile_ld(int64_t B, int64_t elem_bytes) { return B + 64 / elem_bytes; }

int64_t block_len(int64_t C, int64_t elem_bytes) {
  const int64_t b = kTileBytes / std::max<int64_t>(1, C * elem_bytes) / 16 * 16;
  return std::clamp<int64_t>(b, 16, kMaxBlock);
}

// ---------------------------------------------------------------- NCHW
// y_nhwc: y is written channels-last (each position's C values contiguous), as permute +
// layer_norm returns it, so the 1x1 convs that usually follow take oneDNN's NHWC path. The
// tile's y goes to an L1 buffer first and is stored transposed; x is still read once.
// x_nhwc (backward only): x is channels-last (C <= kBwdTileMaxC); each task loads its rows
// (L * C contiguous values) into the same (C, B) tile first, so small C keeps the
// vectorised-along-positions loops.
template <typename T>
void load_tile(const T* rows, T* tile, int64_t L, int64_t C, int64_t ld) {  // (L,C) -> (C,ld)
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < C; ++c) tile[c * ld + i] = rows[i * C + c];
}

template <typename T>
void store_tile(const T* tile, T* rows, int64_t L, int64_t C, int64_t ld) {  // (C,ld) -> (L,C)
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < C; ++c) rows[i * C + c] = tile[c * ld + i];
}

// Where task t's tile starts in a tensor of either layout: NCHW planes (row c at + c * HW) or
// one channels-last block of L * C contiguous values.
template <typename T>
const T* tile_start(const T* base, bool nhwc, int64_t t, int64_t nblk, int64_t B, int64_t C,
                    int64_t HW) {
  const int64_t n = t / nblk, hw0 = (t % nblk) * B;
  return nhwc ? base + (n * HW + hw0) * C : base + n * C * HW + hw0;
}

// Software prefetch of part c (of C) of task t's tile, issued while the previous tile's second
// pass (L2-resident data) runs, so the first pass of t reads cache instead of waiting on DRAM:
// the hardware prefetchers do not keep up with C interleaved 2 KiB runs. Measured at
// 32x96x56x56 fp32, 2 threads, calls alternated with the old build: fwd 10.6-11.4 -> 9.4-9.9 ms,
// bwd 13.5-14.2 -> 12.2-12.7 ms (T1, to L2 only: the same within noise).
template <typename T>
void prefetch_part(const T* tile, bool nhwc, int64_t L, int64_t HW, int64_t c) {
  const char* p = reinterpret_cast<const char*>(nhwc ? tile + c * L : tile + c * HW);
  for (int64_t o = 0; o < L * int64_t(sizeof(T)); o += 64) __builtin_prefetch(p + o, 0, 3);
}

template <typename T, typename A>
void fwd_nchw(const T* x, const A* w, const A* b, T* y, A* mean, A* rstd, int64_t N, int64_t C,
              int64_t HW, double eps, bool y_nhwc) {
  const int64_t B = block_len(C, sizeof(T)), ld = tile_ld(B, sizeof(T));
  const int64_t nblk = (HW + B - 1) / B;
  at::parallel_for(0, N * nblk, grain(C * B), [&](int64_t t0, int64_t t1) {
    alignas(64) A k[kMaxBlock], m[kMaxBlock], m2[kMaxBlock];
    std::vector<T> ybuf(y_nhwc ? C * ld : 0);  // (C, B) tile of y before the transpose
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / nblk, hw0 = (t % nblk) * B;
      const int64_t L = std::min(B, HW - hw0);
      const T* xn = x + n * C * HW + hw0;
      T* yn = y + n * C * HW + hw0;
      for (int64_t i = 0; i < L; ++i) { k[i] = static_cast<A>(xn[i]); m[i] = 0; m2[i] = 0; }
      for (int64_t c = 0; c < C; ++c) {  // Welford over channels, one lane per position
        const T* xc = xn + c * HW;
        const A inv = A(1) / A(c + 1);
#pragma omp simd
        for (int64_t i = 0; i < L; ++i) {
          const A v = static_cast<A>(xc[i]) - k[i];
          const A d = v - m[i];
          m[i] += d * inv;
          m2[i] += d * (v - m[i]);
        }
      }
      A* mo = mean + n * HW + hw0;
      A* ro = rstd + n * HW + hw0;
      for (int64_t i = 0; i < L; ++i) {
        m2[i] = A(1) / std::sqrt(m2[i] / A(C) + A(eps));  // m2 now holds rstd
        mo[i] = m[i];
        ro[i] = m2[i];
      }
      const bool ahead = t + 1 < t1;
      const T* xnext = ahead ? tile_start(x, false, t + 1, nblk, B, C, HW) : nullptr;
      const int64_t Lnext = ahead ? std::min(B, HW - ((t + 1) % nblk) * B) : 0;
      for (int64_t c = 0; c < C; ++c) {
        if (ahead) prefetch_part(xnext, false, Lnext, HW, c);
        const T* xc = xn + c * HW;
        T* yc = y_nhwc ? ybuf.data() + c * ld : yn + c * HW;
        const A wc = w[c], bc = b[c];
#pragma omp simd
        for (int64_t i = 0; i < L; ++i)
          yc[i] = static_cast<T>((static_cast<A>(xc[i]) - k[i] - m[i]) * m2[i] * wc + bc);
      }
      if (y_nhwc) store_tile(ybuf.data(), y + (n * HW + hw0) * C, L, C, ld);
    }
  });
}

// dy_nhwc: dy is channels-last (the gradient from a conv that ran NHWC): each task first copies
// its rows (one contiguous block of L * C values) into a (C, B) tile, instead of a
// whole-tensor .contiguous() pass before the kernel.
template <typename T, typename A>
void bwd_nchw(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, T* dx, A* dw,
              A* db, int64_t N, int64_t C, int64_t HW, bool x_nhwc, bool dy_nhwc) {
  const int64_t B = block_len(C, sizeof(T)), ld = tile_ld(B, sizeof(T));
  const int64_t nblk = (HW + B - 1) / B;
  const int64_t parts = std::max<int64_t>(1, at::get_num_threads());
  PartSums<A> part(parts, C);
  const A invC = A(1) / A(C);
  parallel_chunks(N * nblk, parts, grain(C * B), [&](int64_t p, int64_t t0, int64_t t1) {
    alignas(64) A kk[kMaxBlock], mm[kMaxBlock], rr[kMaxBlock], sg[kMaxBlock], sgx[kMaxBlock];
    std::vector<T> dybuf(dy_nhwc ? C * ld : 0);
    std::vector<T> xbuf(x_nhwc ? C * ld : 0), dxbuf(x_nhwc ? C * ld : 0);  // dx: x's
    const int64_t xs = x_nhwc ? ld : HW;
    A* dwp = part.dw(p);
    A* dbp = part.db(p);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / nblk, hw0 = (t % nblk) * B;
      const int64_t L = std::min(B, HW - hw0);
      const int64_t off = n * C * HW + hw0;
      if (dy_nhwc) load_tile(dy + (n * HW + hw0) * C, dybuf.data(), L, C, ld);
      if (x_nhwc) load_tile(x + (n * HW + hw0) * C, xbuf.data(), L, C, ld);
      const T* xt = x_nhwc ? xbuf.data() : x + off;
      // channel c of dy for this tile: the buffer row, or the NCHW plane
      auto dy_at = [&](int64_t c) {
        return dy_nhwc ? dybuf.data() + c * ld : dy + off + c * HW;
      };
      for (int64_t i = 0; i < L; ++i) {
        kk[i] = static_cast<A>(xt[i]);  // the shift: channel 0
        mm[i] = mean[n * HW + hw0 + i];
        rr[i] = rstd[n * HW + hw0 + i];
        sg[i] = 0;
        sgx[i] = 0;
      }
      for (int64_t c = 0; c < C; ++c) {  // channel sums of g = dy*w and g*xhat; dw/db partials
        const T* xc = xt + c * xs;
        const T* dyc = dy_at(c);
        const A wc = w[c];
        A sdw = 0, sdb = 0;
#pragma omp simd reduction(+ : sdw, sdb)
        for (int64_t i = 0; i < L; ++i) {
          const A xh = (static_cast<A>(xc[i]) - kk[i] - mm[i]) * rr[i];
          const A d = static_cast<A>(dyc[i]);
          sg[i] += d * wc;
          sgx[i] += d * wc * xh;
          sdw += d * xh;
          sdb += d;
        }
        dwp[c] += sdw;
        dbp[c] += sdb;
      }
      for (int64_t i = 0; i < L; ++i) { sg[i] *= invC; sgx[i] *= invC; }
      const bool ahead = t + 1 < t1;
      const T* xnext = ahead ? tile_start(x, x_nhwc, t + 1, nblk, B, C, HW) : nullptr;
      const T* dynext = ahead ? tile_start(dy, dy_nhwc, t + 1, nblk, B, C, HW) : nullptr;
      const int64_t Lnext = ahead ? std::min(B, HW - ((t + 1) % nblk) * B) : 0;
      for (int64_t c = 0; c < C; ++c) {  // dx = rstd * (g - mean_c(g) - xhat * mean_c(g*xhat))
        if (ahead) {
          prefetch_part(xnext, x_nhwc, Lnext, HW, c);
          prefetch_part(dynext, dy_nhwc, Lnext, HW, c);
        }
        const T* xc = xt + c * xs;
        const T* dyc = dy_at(c);
        T* dxc = x_nhwc ? dxbuf.data() + c * ld : dx + off + c * HW;
        const A wc = w[c];
#pragma omp simd
        for (int64_t i = 0; i < L; ++i) {
          const A xh = (static_cast<A>(xc[i]) - kk[i] - mm[i]) * rr[i];
          dxc[i] = static_cast<T>(rr[i] * (static_cast<A>(dyc[i]) * wc - sg[i] - xh * sgx[i]));
        }
      }
      if (x_nhwc) store_tile(dxbuf.data(), dx + (n * HW + hw0) * C, L, C, ld);
    }
  });
  part.add_to(dw, db, parts);
}

// ---------------------------------------------------------------- channels-last (NHWC memory)
template <typename T, typename A>
void fwd_rows(const T* __restrict x, const A* __restrict w, const A* __restrict b,
              T* __restrict y, A* __restrict mean, A* __restrict rstd, int64_t r0, int64_t r1,
              int64_t C, A eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = x + r * C;
    T* __restrict yr = y + r * C;
    const A k = static_cast<A>(xr[0]);
    const A m = sum_row<1, T, A>(C, [&](auto z, int64_t c) {
      using V = decltype(z);
      return std::array<V, 1>{row_at<V>(xr, c) - k};
    })[0] / A(C);
    // second pass over the L1-resident row: numerically stable variance
    const A v = sum_row<1, T, A>(C, [&](auto z, int64_t c) {
      using V = decltype(z);
      const V d = row_at<V>(xr, c) - k - m;
      return std::array<V, 1>{d * d};
    })[0];
    const A rs = A(1) / std::sqrt(v / A(C) + eps);
    mean[r] = m;
    rstd[r] = rs;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c)
      yr[c] = static_cast<T>((static_cast<A>(xr[c]) - k - m) * rs * w[c] + b[c]);
  }
}

template <typename T, typename A>
void fwd_nhwc(const T* x, const A* w, const A* b, T* y, A* mean, A* rstd, int64_t rows, int64_t C,
              double eps) {
  at::parallel_for(0, rows, grain(C), [&](int64_t r0, int64_t r1) {
    fwd_rows(x, w, b, y, mean, rstd, r0, r1, C, static_cast<A>(eps));
  });
}

// Rows [r0, r1) of a channels-last backward. A plain function with __restrict pointer
// parameters, not a lambda body: inside the parallel lambda the captured pointers are
// references, and GCC vectorised the `omp simd` loops over them with gathers (vgatherqps, 12
// in the build) - what made this path 1.4-2x slower than aten's row backward at C = 80..320.
// The two row sums in one pass (sum_row), then one pass that updates this part's
// dweight/dbias partials and writes dx (the old three-pass split was only needed for the
// gather-vectorised build).
template <typename T, typename A>
void bwd_rows(const T* __restrict dy, const T* __restrict x, const A* __restrict mean,
              const A* __restrict rstd, const A* __restrict w, T* __restrict dx,
              A* __restrict dwp, A* __restrict dbp, int64_t r0, int64_t r1, int64_t C) {
  const A invC = A(1) / A(C);
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = x + r * C;
    const T* __restrict dyr = dy + r * C;
    T* __restrict dxr = dx + r * C;
    const A k = static_cast<A>(xr[0]), m = mean[r], rs = rstd[r];
    // sum(g), sum(g * (x - k - m)) with g = dy * w
    const std::array<A, 2> sums = sum_row<2, T, A>(C, [&](auto z, int64_t c) {
      using V = decltype(z);
      const V g = row_at<V>(dyr, c) * row_at<V>(w, c);
      return std::array<V, 2>{g, g * (row_at<V>(xr, c) - k - m)};
    });
    const A sg = sums[0] * invC, sgx = sums[1] * rs * invC;  // mean of g, of g * xhat
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const A xh = (static_cast<A>(xr[c]) - k - m) * rs;
      const A d = static_cast<A>(dyr[c]);
      dwp[c] += d * xh;
      dbp[c] += d;
      dxr[c] = static_cast<T>(rs * (d * w[c] - sg - xh * sgx));
    }
  }
}

template <typename T, typename A>
void bwd_nhwc(const T* dy, const T* x, const A* mean, const A* rstd, const A* w, T* dx, A* dw,
              A* db, int64_t rows, int64_t C) {
  const int64_t parts = std::max<int64_t>(1, at::get_num_threads());
  PartSums<A> part(parts, C);
  parallel_chunks(rows, parts, grain(C), [&](int64_t p, int64_t r0, int64_t r1) {
    bwd_rows(dy, x, mean, rstd, w, dx, part.dw(p), part.db(p), r0, r1, C);
  });
  part.add_to(dw, db, parts);
}

// ---------------------------------------------------------------- checks + dispatch
enum class Layout { NCHW, NHWC };

Layout pick_layout(const at::Tensor& x) {
  if (x.is_contiguous()) return Layout::NCHW;
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast)) return Layout::NHWC;
  TORCH_CHECK(false, "internal: x must be made dense before dispatch");
}

at::MemoryFormat fmt(Layout l) {
  return l == Layout::NCHW ? at::MemoryFormat::Contiguous : at::MemoryFormat::ChannelsLast;
}

void check_input(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  TORCH_CHECK(x.device().is_cpu(), "ln2d cpu: x must be a CPU tensor, got ", x.device());
  TORCH_CHECK(x.dim() == 4, "ln2d cpu: x must be 4-D (N, C, H, W), got ", x.dim(), "-D");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16,
              "ln2d cpu: unsupported dtype ", st, " (supported: float32, float64, bfloat16)");
  TORCH_CHECK(x.size(1) > 0, "ln2d cpu: C must be >= 1");
  TORCH_CHECK(w.numel() == x.size(1) && b.numel() == x.size(1),
              "ln2d cpu: weight and bias must have C=", x.size(1), " elements, got ", w.numel(),
              " and ", b.numel());
}

at::ScalarType acc_type(at::ScalarType st) { return st == at::kDouble ? at::kDouble : at::kFloat; }

// channels_last_out: for an NCHW-contiguous x, return y channels-last (see fwd_nchw).
std::vector<at::Tensor> forward(at::Tensor x, at::Tensor w, at::Tensor b, double eps,
                                bool channels_last_out) {
  check_input(x, w, b);
  if (!x.is_contiguous() && !x.is_contiguous(at::MemoryFormat::ChannelsLast)) x = x.contiguous();
  const Layout lay = pick_layout(x);
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.to(at_).contiguous(), ba = b.to(at_).contiguous();
  const bool y_nhwc = lay == Layout::NCHW && channels_last_out;
  auto y = fusebench::empty_output(x, y_nhwc ? at::MemoryFormat::ChannelsLast : fmt(lay));
  auto mean = at::empty({N, HW}, x.options().dtype(at_));
  auto rstd = at::empty({N, HW}, x.options().dtype(at_));
  if (x.numel() == 0) return {y, mean, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "ln2d_cpu_fwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    if (lay == Layout::NCHW)
      fwd_nchw<scalar_t, A>(x.const_data_ptr<scalar_t>(), wa.const_data_ptr<A>(),
                            ba.const_data_ptr<A>(), y.mutable_data_ptr<scalar_t>(),
                            mean.mutable_data_ptr<A>(), rstd.mutable_data_ptr<A>(), N, C, HW, eps,
                            y_nhwc);
    else
      fwd_nhwc<scalar_t, A>(x.const_data_ptr<scalar_t>(), wa.const_data_ptr<A>(),
                            ba.const_data_ptr<A>(), y.mutable_data_ptr<scalar_t>(),
                            mean.mutable_data_ptr<A>(), rstd.mutable_data_ptr<A>(), N * HW, C,
                            eps);
  });
  return {y, mean, rstd};
}

std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor mean, at::Tensor rstd,
                                 at::Tensor w) {
  TORCH_CHECK(dy.sizes() == x.sizes(), "ln2d cpu: dy and x shapes differ");
  if (!x.is_contiguous() && !x.is_contiguous(at::MemoryFormat::ChannelsLast)) x = x.contiguous();
  const Layout lay = pick_layout(x);
  dy = dy.to(x.scalar_type());
  // NCHW x takes dy NCHW or channels-last (read per tile); otherwise dy gets x's layout
  const bool dy_nhwc = lay == Layout::NCHW && !dy.is_contiguous() &&
                       dy.is_contiguous(at::MemoryFormat::ChannelsLast);
  if (!dy_nhwc) dy = dy.contiguous(fmt(lay));
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.to(at_).contiguous();
  auto dx = fusebench::empty_output(x, fmt(lay));
  auto dw = at::zeros({C}, x.options().dtype(at_));
  auto db = at::zeros({C}, x.options().dtype(at_));
  if (x.numel() == 0) return {dx, dw.to(w.scalar_type()), db.to(w.scalar_type())};
  mean = mean.contiguous();
  rstd = rstd.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "ln2d_cpu_bwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    if (lay == Layout::NCHW || C <= kBwdTileMaxC)
      bwd_nchw<scalar_t, A>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                            mean.const_data_ptr<A>(), rstd.const_data_ptr<A>(),
                            wa.const_data_ptr<A>(), dx.mutable_data_ptr<scalar_t>(),
                            dw.mutable_data_ptr<A>(), db.mutable_data_ptr<A>(), N, C, HW,
                            lay == Layout::NHWC, dy_nhwc || lay == Layout::NHWC);
    else
      bwd_nhwc<scalar_t, A>(dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                            mean.const_data_ptr<A>(), rstd.const_data_ptr<A>(),
                            wa.const_data_ptr<A>(), dx.mutable_data_ptr<scalar_t>(),
                            dw.mutable_data_ptr<A>(), db.mutable_data_ptr<A>(), N * HW, C);
  });
  return {dx, dw.to(w.scalar_type()), db.to(w.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "LN2d forward: (y, mean, rstd); y channels-last if asked",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
        py::arg("channels_last_out") = false);
  m.def("backward", &backward, "LN2d backward: (dx, dweight, dbias)");
  m.def("set_huge_pages", [](bool on) { fusebench::huge_pages_enabled() = on; },
        "ask for transparent huge pages on large outputs (default on)");
}
