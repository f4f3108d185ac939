// Depthwise KxK convolution (groups == C, K in 3/5/7, stride 1 or 2, dilation 1, zero padding
// K/2: ConvNeXt's 7x7, EfficientNet's 3x3 / 5x5) on channels-last (NHWC) tensors: the forward y
// and the backward dx, dweight, dbias.
//
// Why: oneDNN's depthwise backward was ~17% of a convnext_atto train step on a 2-vCPU VM
// (8x40x56x56, 7x7: ~10-12 ms for 0.2 GFLOP). In NHWC every tap is a multiply-add of two
// contiguous C-vectors, so the loops run along C (vectorised) and threads split output rows.
//
// No padded copy of any tensor: rows outside the image are left out of each output row's list
// of tap rows, and only the few edge columns (where some tap falls outside) take a checked
// path. (The first version copied x and dy into zero-padded buffers: two extra passes, which at
// 3x3 cost more than the arithmetic and made it slower than oneDNN there.)
//
// All three passes are one gather: out[a, b] = sum over tap rows q and tap columns t of
//   in[row_q, b * cs + co + t * cd] * w[wrow_q, wc0 + t * wcs]
//   forward: in = x, rows ih = oh*S - P + i, columns b*S - P + t, w[i, t]
//   dx:      in = dy, for dx row h the rows oh = (h + P - i) / S where S divides h + P - i;
//            dx columns split into S phases pw (w = pw + S*b) so that each phase is a stride-1
//            gather over dy columns with the taps j = j0 + S*t (the transposed conv).
// dweight/dbias: per-chunk partial sums (fixed chunking: deterministic), summed at the end.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "../huge_pages.h"
#include "../vec.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGrainElems = 16384;  // below ~64 KiB of output per thread, threads cost more
constexpr int kMaxK = 7;
// Weight gradient: a run accumulates in registers over a chunk of output rows of about
// kWChunkCols columns (at most kWChunk rows), so that the call and the accumulators' load / store
// are paid once per chunk, not per row: at ConvNeXt's 10x10 and 5x5 stages a row is 10 or 5
// outputs (per-row runs: 2.2-2.4x slower there, docs/fused.md, thirty-sixth session).
constexpr int kWChunk = 32;
constexpr int64_t kWChunkCols = 160;

// Accumulators live in registers (vec.h): GCC vector types of 16 floats / 8 doubles, then 8 / 4,
// then single lanes for what remains of C. An accumulator kept in memory serialises every tap
// on store-to-load forwarding (measured 4-7x slower).
using fusebench::ld;
using fusebench::st;
using fusebench::Vec;

// Run Op<S, lanes>::run(c0, args...) over C: full vectors, a half vector, then single lanes.
template <typename S, template <typename, int> class Op, typename... Args>
void by_lanes(int64_t C, Args... args) {
  constexpr int kW = 64 / sizeof(S);
  int64_t c0 = 0;
  for (; c0 + kW <= C; c0 += kW) Op<S, kW>::run(c0, args...);
  for (; c0 + kW / 2 <= C; c0 += kW / 2) Op<S, kW / 2>::run(c0, args...);
  for (; c0 < C; ++c0) Op<S, 1>::run(c0, args...);
}

// The tap rows of one output row: input row pointers and the weight rows they meet.
template <typename S>
struct TapRows {
  const S* in[kMaxK];
  int64_t wrow[kMaxK];
  int n = 0;
  void add(const S* p, int64_t i) { in[n] = p; wrow[n] = i; ++n; }
};

// Column map of one gather: input column of output b, tap t = b*cs + co + t*cd; weight column
// wc0 + t*wcs; T taps; input width inW; outputs [lo, hi) have every tap inside the image.
struct Cols {
  int64_t cs, co, cd, wc0, wcs, T, inW, B, lo, hi;
  int64_t col(int64_t b, int64_t t) const { return b * cs + co + t * cd; }
  bool inside(int64_t b, int64_t t) const { const int64_t c = col(b, t); return c >= 0 && c < inW; }
  bool all_inside(int64_t b) const { return inside(b, 0) && inside(b, T - 1); }
  // the outputs whose tap t is inside: [first(t), end(t)), closed forms of `inside`
  int64_t first(int64_t t) const {
    const int64_t off = co + t * cd;
    return off >= 0 ? 0 : (-off + cs - 1) / cs;
  }
  int64_t end(int64_t t) const {
    const int64_t room = inW - 1 - (co + t * cd);
    return room < 0 ? 0 : std::min(B, room / cs + 1);
  }
};

Cols make_cols(int64_t cs, int64_t co, int64_t cd, int64_t wc0, int64_t wcs, int64_t T,
               int64_t inW, int64_t B) {
  Cols c{cs, co, cd, wc0, wcs, T, inW, B, 0, 0};
  int64_t lo = 0, hi = B;
  while (lo < B && !c.all_inside(lo)) ++lo;
  while (hi > lo && !c.all_inside(hi - 1)) --hi;
  c.lo = lo, c.hi = std::max(lo, hi);
  return c;
}

// R adjacent outputs b..b+R-1 (all taps inside), lanes [c0, c0+N): R independent FMA chains.
template <typename S, int N, int R, int T>
inline void block(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm, int64_t b,
                  S* op, int64_t ostep, int64_t C, int64_t K) {
  using V = Vec<S, N>;
  V a[R];
  const V b0 = bias ? ld<V>(bias) : V{};
  for (int r = 0; r < R; ++r) a[r] = b0;
  const int64_t step = cm.cs * C;
  for (int q = 0; q < rows.n; ++q) {
    const S* wr = wt + rows.wrow[q] * K * C;
    for (int t = 0; t < T; ++t) {      // T known here: the taps unroll, registers stay put
      const V wv = ld<V>(wr + (cm.wc0 + t * cm.wcs) * C);
      const S* xp = rows.in[q] + cm.col(b, t) * C;
      for (int r = 0; r < R; ++r) a[r] += ld<V>(xp + r * step) * wv;
    }
  }
  for (int r = 0; r < R; ++r) st(op + r * ostep, a[r]);
}

#if defined(__AVX512F__)
// AVX-512: a whole output row (or dx phase) in blocks of R adjacent outputs whose taps share
// input columns. Where the map is one of the three the passes use, (CS, CD) = (1, 1), (2, 1)
// (forward, stride 1 / 2) or (1, -1) (every dx phase), the R outputs' taps of one tap row read
// only U = (R-1)*CS + T input columns: each is loaded once and meets every weight it pairs
// with from registers (T weights, R accumulators: 16 of the 32 registers at R = 8, T = 7; 8
// chains keep both FMA ports busy). block() loads a column per (output, tap): at 7x7 that is
// 63 loads for 56 FMAs, and ConvNeXt's forward ran at 0.5-0.7x oneDNN's rate (docs/fused.md,
// forty-second session). Edge blocks load a zero vector for a column outside the image, so
// the narrow rows of late stages (10 or 5 wide: most columns are edges) run here too.
// AVX2's 16 registers would spill the weights, so it keeps block() and edge().
template <typename S, int N, int R, int T, int CS, int CD, bool Checked>
inline void block_reuse(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm,
                        int64_t c_lo, S* op, int64_t ostep, int64_t C, int64_t K) {
  using V = Vec<S, N>;
  constexpr int U = (R - 1) * CS + T;
  V a[R];
  const V b0 = bias ? ld<V>(bias) : V{};
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) a[r] = b0;
  for (int q = 0; q < rows.n; ++q) {
    const S* wr = wt + (rows.wrow[q] * K + cm.wc0) * C;
    V wv[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) wv[t] = ld<V>(wr + t * cm.wcs * C);
    const S* xq = rows.in[q];
#pragma GCC unroll 32
    for (int u = 0; u < U; ++u) {
      const int64_t col = c_lo + u;   // (no pointer formed to a column outside the row)
      if (Checked && (col < 0 || col >= cm.inW)) continue;             // a zero column
      const V xv = ld<V>(xq + col * C);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {   // output r's tap t reads column u = r*CS + (t or T-1-t)
        const int d = u - r * CS, t = CD > 0 ? d : T - 1 - d;
        if (d >= 0 && d < T) a[r] += xv * wv[t];
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) st(op + r * ostep, a[r]);
}

// Outputs [b, b+R) through block_reuse, checked only where a column falls outside.
template <typename S, int N, int R, int T, int CS, int CD>
inline void reuse_at(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm,
                     int64_t b, S* orow, int64_t ostep, int64_t C, int64_t K) {
  constexpr int U = (R - 1) * CS + T;
  const int64_t c_lo = cm.col(b, CD > 0 ? 0 : T - 1);    // output b's leftmost tap
  S* op = orow + b * ostep;
  if (c_lo >= 0 && c_lo + U <= cm.inW)
    block_reuse<S, N, R, T, CS, CD, false>(rows, wt, bias, cm, c_lo, op, ostep, C, K);
  else
    block_reuse<S, N, R, T, CS, CD, true>(rows, wt, bias, cm, c_lo, op, ostep, C, K);
}

template <typename S, int N, int T, int CS, int CD>
void row_reuse(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm, S* orow,
               int64_t ostep, int64_t C, int64_t K) {
  int64_t b = 0;
  for (; b + 8 <= cm.B; b += 8)
    reuse_at<S, N, 8, T, CS, CD>(rows, wt, bias, cm, b, orow, ostep, C, K);
  if (b + 4 <= cm.B) reuse_at<S, N, 4, T, CS, CD>(rows, wt, bias, cm, b, orow, ostep, C, K), b += 4;
  if (b + 2 <= cm.B) reuse_at<S, N, 2, T, CS, CD>(rows, wt, bias, cm, b, orow, ostep, C, K), b += 2;
  if (b < cm.B) reuse_at<S, N, 1, T, CS, CD>(rows, wt, bias, cm, b, orow, ostep, C, K);
}

// row_reuse for cm's map; false where it is none of the three. The forward's maps only come
// with T = K (odd): the other tap counts are grad-input phases, and instantiating the forward
// maps for them too cost the build a third more time.
template <typename S, int N, int T>
bool try_reuse(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm, S* orow,
               int64_t ostep, int64_t C, int64_t K) {
  if (cm.cs == 1 && cm.cd == -1) {
    row_reuse<S, N, T, 1, -1>(rows, wt, bias, cm, orow, ostep, C, K);
    return true;
  }
  if constexpr (T >= 3 && T % 2 == 1) {
    if (cm.cs == 1 && cm.cd == 1) {
      row_reuse<S, N, T, 1, 1>(rows, wt, bias, cm, orow, ostep, C, K);
      return true;
    }
    if (cm.cs == 2 && cm.cd == 1) {
      row_reuse<S, N, T, 2, 1>(rows, wt, bias, cm, orow, ostep, C, K);
      return true;
    }
  }
  return false;
}
#endif

// One output whose taps may fall outside the image (an edge column): checked per tap.
template <typename S, int N>
inline void edge(const TapRows<S>& rows, const S* wt, const S* bias, const Cols& cm, int64_t b,
                 S* op, int64_t C, int64_t K) {
  using V = Vec<S, N>;
  V a = bias ? ld<V>(bias) : V{};
  for (int q = 0; q < rows.n; ++q)
    for (int64_t t = 0; t < cm.T; ++t)
      if (cm.inside(b, t))
        a += ld<V>(rows.in[q] + cm.col(b, t) * C) *
             ld<V>(wt + (rows.wrow[q] * K + cm.wc0 + t * cm.wcs) * C);
  st(op, a);
}

// One output row (or one phase of it), everything offset to lane c0; T taps per tap row.
template <int T>
struct RowOp {
  template <typename S, int N>
  struct Op {
    static void run(int64_t c0, TapRows<S> rows, const S* wt, const S* bias, const Cols* cm,
                    S* orow, int64_t ostep, int64_t C, int64_t K) {
      for (int q = 0; q < rows.n; ++q) rows.in[q] += c0;
      wt += c0, orow += c0;
      if (bias) bias += c0;
#if defined(__AVX512F__)
      if (try_reuse<S, N, T>(rows, wt, bias, *cm, orow, ostep, C, K)) return;
#endif
      constexpr int R = 4;  // 4 outputs x (up to) 2 AVX2 registers: chains without spills
      int64_t b = 0;
      for (; b < cm->lo; ++b) edge<S, N>(rows, wt, bias, *cm, b, orow + b * ostep, C, K);
      for (; b + R <= cm->hi; b += R)
        block<S, N, R, T>(rows, wt, bias, *cm, b, orow + b * ostep, ostep, C, K);
      for (; b < cm->hi; ++b)
        block<S, N, 1, T>(rows, wt, bias, *cm, b, orow + b * ostep, ostep, C, K);
      for (; b < cm->B; ++b) edge<S, N>(rows, wt, bias, *cm, b, orow + b * ostep, C, K);
    }
  };
};

// One output row over all of C, with the tap count T as a compile-time constant.
template <typename S>
void row(const TapRows<S>& rows, const S* wt, const S* bias, const Cols* cm, S* orow,
         int64_t ostep, int64_t C, int64_t K) {
  switch (cm->T) {  // K in 3/5/7, stride 1/2: T in 1, 2, 3, 4, 5, 7
#define FB_ROW(T) \
  case T: return by_lanes<S, RowOp<T>::template Op>(C, rows, wt, bias, cm, orow, ostep, C, K);
    FB_ROW(1) FB_ROW(2) FB_ROW(3) FB_ROW(4) FB_ROW(5) FB_ROW(7)
#undef FB_ROW
    default: TORCH_CHECK(false, "dwconv cpu: no kernel for ", cm->T, " taps per row");
  }
}

struct Geom {
  int64_t N, C, H, W, OH, OW, K, S, P;
};

Geom geom(const at::Tensor& x, int64_t K, int64_t S) {
  const int64_t P = K / 2, H = x.size(2), W = x.size(3);
  return {x.size(0), x.size(1), H, W, (H + 2 * P - K) / S + 1, (W + 2 * P - K) / S + 1, K, S, P};
}

int64_t grain_rows(int64_t row_elems) {
  return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(1, row_elems));
}

// y[n, oh, ow] = bias + sum_{i,j} x[n, oh*S - P + i, ow*S - P + j] w[i, j]
template <typename S>
void forward_nhwc(const S* x, const S* wt, const S* bias, S* y, const Geom& g) {
  const Cols cm = make_cols(g.S, -g.P, 1, 0, 1, g.K, g.W, g.OW);
  at::parallel_for(0, g.N * g.OH, grain_rows(g.OW * g.C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      TapRows<S> rows;
      for (int64_t i = 0; i < g.K; ++i) {
        const int64_t ih = oh * g.S - g.P + i;
        if (ih >= 0 && ih < g.H) rows.add(x + (n * g.H + ih) * g.W * g.C, i);
      }
      row<S>(rows, wt, bias, &cm, y + r * g.OW * g.C, g.C, g.C, g.K);
    }
  });
}

// dx[n, h, w] = sum over (i, j) with oh*S = h + P - i, ow*S = w + P - j of dy[n, oh, ow] w[i, j]
template <typename S>
void input_grad_nhwc(const S* dy, const S* wt, S* dx, const Geom& g) {
  std::vector<Cols> phases;            // dx columns w = pw + S*b, one stride-1 gather each
  for (int64_t pw = 0; pw < g.S && pw < g.W; ++pw) {
    const int64_t j0 = (pw + g.P) % g.S, T = (g.K - j0 + g.S - 1) / g.S;
    phases.push_back(make_cols(1, (pw + g.P - j0) / g.S, -1, j0, g.S, T, g.OW,
                               (g.W - pw + g.S - 1) / g.S));
  }
  at::parallel_for(0, g.N * g.H, grain_rows(g.W * g.C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.H, h = r % g.H;
      TapRows<S> rows;
      for (int64_t i = 0; i < g.K; ++i) {
        const int64_t num = h + g.P - i;
        if (num >= 0 && num % g.S == 0 && num / g.S < g.OH)
          rows.add(dy + (n * g.OH + num / g.S) * g.OW * g.C, i);
      }
      for (size_t pw = 0; pw < phases.size(); ++pw)
        row<S>(rows, wt, nullptr, &phases[pw], dx + (r * g.W + pw) * g.C, g.S * g.C, g.C, g.K);
    }
  });
}

// The (dy row, x row) pairs that meet at one tap row i within a chunk of output rows.
template <typename S>
struct RowPairs {
  const S* dy[kWChunk];
  const S* x[kWChunk];
  int n = 0;
};

// For tap row i over a chunk of (dy row, x row) pairs: a[j] += dy[ow] * x[ow*S - P + j], K
// chains (two sets, alternate columns, in the interior where no tap is outside). The edge
// columns run per tap over the outputs whose column is inside: j is a constant of the unrolled
// tap loop, so a[j] stays in a register (a check per tap and column cost more than the
// interior's FMAs at ConvNeXt's 10x10 and 5x5 stages, where 6 of 10 and all 5 columns are
// edges; an array indexed by a runtime j went to the stack, zeroed with `rep stos` per call).
template <int K, int Sd>
struct WGrad {  // Sd: the conv's stride
  template <typename S, int N>
  struct Op {
    static void run(int64_t c0, const RowPairs<S>* rp, S* acc, const Cols* cm, int64_t C) {
      using V = Vec<S, N>;
      V a[K], a2[K];
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) a[j] = V{}, a2[j] = V{};
      constexpr int64_t cs = Sd;
      const int64_t lo = cm->lo, hi = cm->hi;
      int64_t first[K], end[K];      // per tap, once per run: divisions, not per row
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) first[j] = cm->first(j), end[j] = cm->end(j);
      for (int q = 0; q < rp->n; ++q) {
        const S* dyrow = rp->dy[q] + c0;
        const S* xrow = rp->x[q] + c0;
#pragma GCC unroll 8
        for (int j = 0; j < K; ++j) {   // edges: per tap, the outputs whose column is inside
          const int64_t off = cm->co + j;
          for (int64_t ow = first[j]; ow < std::min(lo, end[j]); ++ow)
            a[j] += ld<V>(dyrow + ow * C) * ld<V>(xrow + (ow * cs + off) * C);
          for (int64_t ow = std::max(hi, first[j]); ow < end[j]; ++ow)
            a2[j] += ld<V>(dyrow + ow * C) * ld<V>(xrow + (ow * cs + off) * C);
        }
        int64_t ow = lo;
        for (; ow + 2 <= hi; ow += 2) {   // the two outputs' taps share K - Sd columns of x
          const V g0 = ld<V>(dyrow + ow * C), g1 = ld<V>(dyrow + (ow + 1) * C);
          const S* xp = xrow + cm->col(ow, 0) * C;
          V xv[K + Sd];
#pragma GCC unroll 10
          for (int t = 0; t < K + Sd; ++t) xv[t] = ld<V>(xp + t * C);
#pragma GCC unroll 8
          for (int j = 0; j < K; ++j) {
            a[j] += g0 * xv[j];
            a2[j] += g1 * xv[j + Sd];
          }
        }
        if (ow < hi) {
          const V g0 = ld<V>(dyrow + ow * C);
          const S* xp = xrow + cm->col(ow, 0) * C;
#pragma GCC unroll 8
          for (int j = 0; j < K; ++j) a[j] += g0 * ld<V>(xp + j * C);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < K; ++j) st(acc + j * C + c0, ld<V>(acc + j * C + c0) + a[j] + a2[j]);
    }
  };
};

// acc[c] += sum over the row's w of dy[w, c] (dbias), vectorised along C
template <typename S>
void row_sum(const S* __restrict dyrow, S* __restrict acc, int64_t W, int64_t C) {
  for (int64_t w = 0; w < W; ++w) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += dyrow[w * C + c];
  }
}

// dwt[i, j] = sum_{n,oh,ow} dy[n, oh, ow] * x[n, oh*S - P + i, ow*S - P + j];  db = sum dy
template <typename S, int K, int Sd>
void weight_grad_nhwc(const S* dy, const S* x, S* dwt, S* db, const Geom& g) {
  const Cols cm = make_cols(g.S, -g.P, 1, 0, 1, K, g.W, g.OW);
  const int64_t rows = g.N * g.OH, KKC = K * K * g.C, C = g.C;
  const int64_t parts = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), rows * g.OW * C / kGrainElems));
  std::vector<S> pw(parts * KKC, S(0)), pb(db ? parts * C : 0, S(0));
  const int64_t chunk = std::clamp<int64_t>(kWChunkCols / std::max<int64_t>(1, g.OW), 1, kWChunk);
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      S* acc = pw.data() + p * KKC;
      const int64_t r1 = (p + 1) * rows / parts;
      for (int64_t r0 = p * rows / parts; r0 < r1; r0 += chunk) {
        const int64_t re = std::min(r1, r0 + chunk);
        if (db)
          for (int64_t r = r0; r < re; ++r) row_sum(dy + r * g.OW * C, pb.data() + p * C, g.OW, C);
        for (int64_t i = 0; i < K; ++i) {
          RowPairs<S> rp;
          for (int64_t r = r0; r < re; ++r) {
            const int64_t n = r / g.OH, ih = (r % g.OH) * g.S - g.P + i;
            if (ih < 0 || ih >= g.H) continue;
            rp.dy[rp.n] = dy + r * g.OW * C;
            rp.x[rp.n++] = x + (n * g.H + ih) * g.W * C;
          }
          if (rp.n) by_lanes<S, WGrad<K, Sd>::template Op>(C, &rp, acc + i * K * C, &cm, C);
        }
      }
    }
  });
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t k = 0; k < KKC; ++k) dwt[k] += pw[p * KKC + k];
    if (db)
      for (int64_t c = 0; c < C; ++c) db[c] += pb[p * C + c];
  }
}

void check(const at::Tensor& x, const at::Tensor& w, int64_t stride) {
  TORCH_CHECK(x.device().is_cpu(), "dwconv cpu: x must be a CPU tensor");
  TORCH_CHECK(x.dim() == 4, "dwconv cpu: x must be 4-D (N, C, H, W)");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble,
              "dwconv cpu: unsupported dtype ", st, " (supported: float32, float64)");
  const int64_t K = w.dim() == 4 ? w.size(2) : 0;
  TORCH_CHECK(w.dim() == 4 && w.size(0) == x.size(1) && w.size(1) == 1 && w.size(3) == K &&
                  (K == 3 || K == 5 || K == 7),
              "dwconv cpu: weight must be (C, 1, K, K) with K in 3, 5, 7; got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == st, "dwconv cpu: weight dtype ", w.scalar_type(),
              " differs from x's ", st);
  TORCH_CHECK(stride == 1 || stride == 2, "dwconv cpu: stride must be 1 or 2, got ", stride);
}

// (C, 1, K, K) -> (K, K, C): each tap a contiguous C-vector
at::Tensor taps(const at::Tensor& w) { return w.squeeze(1).permute({1, 2, 0}).contiguous(); }

at::Tensor nhwc_output(const at::Tensor& like, const Geom& g) {
  auto out = at::empty({g.N, g.C, g.OH, g.OW},
                       like.options().memory_format(at::MemoryFormat::ChannelsLast));
  fusebench::advise_huge_pages(out);
  return out;
}

at::Tensor forward(at::Tensor x, at::Tensor w, c10::optional<at::Tensor> bias, int64_t stride) {
  check(x, w, stride);
  x = x.contiguous(at::MemoryFormat::ChannelsLast);
  const Geom g = geom(x, w.size(2), stride);
  auto y = nhwc_output(x, g);
  auto wt = taps(w.to(x.scalar_type()));
  at::Tensor b = bias.has_value() ? bias->to(x.scalar_type()).contiguous() : at::Tensor();
  if (y.numel() > 0)
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dwconv_cpu_fwd", [&] {
      forward_nhwc<scalar_t>(x.const_data_ptr<scalar_t>(), wt.const_data_ptr<scalar_t>(),
                             b.defined() ? b.const_data_ptr<scalar_t>() : nullptr,
                             y.mutable_data_ptr<scalar_t>(), g);
    });
  return y;
}

at::Tensor backward_input(at::Tensor dy, at::Tensor x, at::Tensor w, int64_t stride) {
  check(x, w, stride);
  const Geom g = geom(x, w.size(2), stride);
  TORCH_CHECK(dy.size(0) == g.N && dy.size(1) == g.C && dy.size(2) == g.OH &&
                  dy.size(3) == g.OW, "dwconv cpu: dy shape ", dy.sizes(), " does not match");
  dy = dy.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  auto dx = fusebench::empty_output(x, at::MemoryFormat::ChannelsLast);
  auto wt = taps(w);
  if (dx.numel() > 0) {
    if (dy.numel() == 0) return dx.zero_();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dwconv_cpu_bwd_input", [&] {
      input_grad_nhwc<scalar_t>(dy.const_data_ptr<scalar_t>(), wt.const_data_ptr<scalar_t>(),
                                dx.mutable_data_ptr<scalar_t>(), g);
    });
  }
  return dx;
}

std::vector<at::Tensor> backward_weight(at::Tensor dy, at::Tensor x, at::Tensor w,
                                        int64_t stride, bool bias) {
  check(x, w, stride);
  const Geom g = geom(x, w.size(2), stride);
  x = x.contiguous(at::MemoryFormat::ChannelsLast);
  dy = dy.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  auto dwt = at::zeros({g.K, g.K, g.C}, x.options());
  auto db = at::zeros({g.C}, x.options());
  if (dy.numel() > 0)
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dwconv_cpu_bwd_weight", [&] {
      using S = scalar_t;
      using WG = void (*)(const S*, const S*, S*, S*, const Geom&);
      const WG by_k_s[3][2] = {{weight_grad_nhwc<S, 3, 1>, weight_grad_nhwc<S, 3, 2>},
                               {weight_grad_nhwc<S, 5, 1>, weight_grad_nhwc<S, 5, 2>},
                               {weight_grad_nhwc<S, 7, 1>, weight_grad_nhwc<S, 7, 2>}};
      const WG wg = by_k_s[g.K / 2 - 1][g.S - 1];
      wg(dy.const_data_ptr<S>(), x.const_data_ptr<S>(), dwt.mutable_data_ptr<S>(),
         bias ? db.mutable_data_ptr<S>() : nullptr, g);
    });
  auto dw = dwt.permute({2, 0, 1}).unsqueeze(1).contiguous();
  return {dw, bias ? db : at::Tensor()};
}

std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor w, bool bias,
                                 int64_t stride) {
  auto dwb = backward_weight(dy, x, w, stride, bias);
  return {backward_input(dy, x, w, stride), dwb[0], dwb[1]};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("reuse_blocks", [] {
#if defined(__AVX512F__)
    return true;
#else
    return false;
#endif
  }, "whether the forward and grad input run AVX-512's column-reuse blocks (block_reuse)");
  m.def("forward", &forward, "y (channels-last)", py::arg("x"), py::arg("weight"),
        py::arg("bias"), py::arg("stride") = 1);
  m.def("backward_input", &backward_input, "dx (channels-last)", py::arg("dy"), py::arg("x"),
        py::arg("weight"), py::arg("stride") = 1);
  m.def("backward_weight", &backward_weight, "(dweight, dbias or None)", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("stride") = 1, py::arg("bias") = true);
  m.def("backward", &backward, "(dx channels-last, dweight, dbias or None)", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride") = 1);
}
