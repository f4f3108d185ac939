// The MLP's row-block schedule (fuse/mlp_blocks.py), compiled into the act kernels' extension
// (cpu.cpp includes it: one translation unit, so torch's headers are parsed once per build).
// A Linear -> bias + GELU -> Linear MLP over rows (channels-last pixels or tokens), run in row
// blocks that stay in L2: each thread takes its share of the rows and, block by block, runs
// fc1, the bias + GELU and fc2 (forward), or fc2's input gradient, the GELU's backward, both
// weight gradients and fc1's input gradient (backward), on the block while it is in cache.
//
// Why: run layer by layer, the MLP's hidden tensors (rows x 4C: fc1's output, the GELU's, their
// gradients) each make a round trip to memory between the GEMMs and the GELU, and at ConvNeXt's
// early stages they are 2-8 MB apiece. In a train step, where those reads come from memory,
// this schedule was 1.02-1.06x faster over the whole step; on hot data alone it gains nothing
// (docs/fused.md, thirty-fifth and fortieth sessions).
//
// The GEMMs are aten's (at::mm_out / addmm_out: MKL's sgemm in x86 wheels), called inside
// at::parallel_for, where each runs on its own thread. Weight and bias gradients are summed
// from one partial per thread: for a given thread count the result is fixed.
// What forward saves: fc1's output before its bias (h0), as the layer-by-layer path does; the
// GELU's output is rebuilt in backward.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "../cpu_math.h"
#include "gelu_rows.h"

#include <algorithm>
#include <vector>

namespace fusebench::mlp_blocks {

// g = gelu(h + b) over r rows of H
template <typename T, bool kTanh>
void gelu_rows(const T* h, const T* b, T* g, int64_t r, int64_t H) {
  for (int64_t i = 0; i < r; ++i) gelu_row<T, T, kTanh>(h + i * H, b, g + i * H, H);
}

// dh = dg * gelu'(h + b), g = gelu(h + b) (fc2's weight gradient needs it), db += column sums
template <typename T, bool kTanh>
void gelu_rows_backward(const T* dg, const T* h, const T* b, T* dh, T* g, T* db, int64_t r,
                        int64_t H) {
  for (int64_t i = 0; i < r; ++i)
    gelu_grad_row<T, T, kTanh, true>(dg + i * H, h + i * H, b, dh + i * H, g + i * H, db, H);
}

// column sums of r rows of O, added into s
template <typename T>
void add_column_sums(const T* __restrict x, T* __restrict s, int64_t r, int64_t O) {
  for (int64_t i = 0; i < r; ++i) {
#pragma omp simd
    for (int64_t c = 0; c < O; ++c) s[c] += x[i * O + c];
  }
}

// [begin, end) of part p of n rows split in `parts`
inline std::pair<int64_t, int64_t> share(int64_t p, int64_t parts, int64_t n) {
  return {p * n / parts, (p + 1) * n / parts};
}

inline void check(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                  int64_t rows) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "mlp cpu: x must be contiguous (rows, C)");
  TORCH_CHECK(w1.dim() == 2 && w2.dim() == 2 && w1.size(1) == x.size(1) &&
                  w2.size(1) == w1.size(0),
              "mlp cpu: w1 must be (H, C) and w2 (O, H)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "mlp cpu: float32 or float64 only, got ", x.scalar_type());
  TORCH_CHECK(rows > 0, "mlp cpu: rows per block must be positive");
}

// (out, h0): out = gelu(x w1^T + b1) w2^T [+ b2] [+ res]; h0 = x w1^T (saved for backward)
inline std::vector<at::Tensor> forward(const at::Tensor& x, const at::Tensor& w1,
                                       const at::Tensor& b1, const at::Tensor& w2,
                                       const c10::optional<at::Tensor>& b2,
                                       const c10::optional<at::Tensor>& res, bool tanh_approx,
                                       int64_t rows) {
  check(x, w1, w2, rows);
  const int64_t N = x.size(0), H = w1.size(0), O = w2.size(0);
  const at::Tensor w1t = w1.t(), w2t = w2.t(), b1c = b1.contiguous();
  at::Tensor h0 = at::empty({N, H}, x.options()), out = at::empty({N, O}, x.options());
  if (res) TORCH_CHECK(res->sizes() == out.sizes(), "mlp cpu: res must be (rows, O)");
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "mlp_forward", [&] {
    auto act = tanh_approx ? gelu_rows<scalar_t, true> : gelu_rows<scalar_t, false>;
    at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      at::NoGradGuard no_grad;  // grad mode is per thread: the pool's are not the caller's
      for (int64_t p = p0; p < p1; ++p) {
        const auto [begin, end] = share(p, parts, N);
        at::Tensor g = at::empty({std::min(rows, end - begin), H}, x.options());
        for (int64_t r0 = begin; r0 < end; r0 += rows) {
          const int64_t r = std::min(rows, end - r0);
          at::Tensor hv = h0.narrow(0, r0, r), gv = g.narrow(0, 0, r), ov = out.narrow(0, r0, r);
          at::mm_out(hv, x.narrow(0, r0, r), w1t);
          act(hv.const_data_ptr<scalar_t>(), b1c.const_data_ptr<scalar_t>(),
              gv.mutable_data_ptr<scalar_t>(), r, H);
          if (res) {
            at::addmm_out(ov, res->narrow(0, r0, r), gv, w2t);
            if (b2) ov.add_(*b2);
          } else if (b2) {
            at::addmm_out(ov, *b2, gv, w2t);
          } else {
            at::mm_out(ov, gv, w2t);
          }
        }
      }
    });
  });
  return {out, h0};
}

// (dx, dw1, db1, dw2, db2) from the saved x and h0; db2 undefined unless has_b2
inline std::vector<at::Tensor> backward(const at::Tensor& dout, const at::Tensor& x,
                                        const at::Tensor& h0, const at::Tensor& b1,
                                        const at::Tensor& w1, const at::Tensor& w2,
                                        bool tanh_approx, int64_t rows, bool has_b2) {
  check(x, w1, w2, rows);
  const int64_t N = x.size(0), C = x.size(1), H = w1.size(0), O = w2.size(0);
  TORCH_CHECK(dout.dim() == 2 && dout.is_contiguous() && dout.size(0) == N && dout.size(1) == O,
              "mlp cpu: dout must be contiguous (rows, O)");
  TORCH_CHECK(h0.is_contiguous() && h0.size(0) == N && h0.size(1) == H,
              "mlp cpu: h0 must be contiguous (rows, H)");
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), N));
  const at::Tensor w1c = w1.contiguous(), w2c = w2.contiguous(), b1c = b1.contiguous();
  at::Tensor dx = at::empty({N, C}, x.options());
  at::Tensor dw1 = at::zeros({parts, H, C}, x.options());
  at::Tensor dw2 = at::zeros({parts, O, H}, x.options());
  at::Tensor db1 = at::zeros({parts, H}, x.options()), db2 = at::zeros({parts, O}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "mlp_backward", [&] {
    auto act = tanh_approx ? gelu_rows_backward<scalar_t, true>
                           : gelu_rows_backward<scalar_t, false>;
    at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      at::NoGradGuard no_grad;  // grad mode is per thread: the pool's are not the caller's
      for (int64_t p = p0; p < p1; ++p) {
        const auto [begin, end] = share(p, parts, N);
        const int64_t most = std::min(rows, end - begin);
        at::Tensor dg = at::empty({most, H}, x.options()), g = at::empty({most, H}, x.options()),
                   dh = at::empty({most, H}, x.options());
        at::Tensor dw1p = dw1[p], dw2p = dw2[p];
        for (int64_t r0 = begin; r0 < end; r0 += rows) {
          const int64_t r = std::min(rows, end - r0);
          at::Tensor dgv = dg.narrow(0, 0, r), gv = g.narrow(0, 0, r), dhv = dh.narrow(0, 0, r);
          at::Tensor dov = dout.narrow(0, r0, r), xv = x.narrow(0, r0, r);
          at::mm_out(dgv, dov, w2c);                                  // fc2's input gradient
          act(dgv.const_data_ptr<scalar_t>(), h0.const_data_ptr<scalar_t>() + r0 * H,
              b1c.const_data_ptr<scalar_t>(), dhv.mutable_data_ptr<scalar_t>(),
              gv.mutable_data_ptr<scalar_t>(), db1[p].mutable_data_ptr<scalar_t>(), r, H);
          dw2p.addmm_(dov.t(), gv);
          dw1p.addmm_(dhv.t(), xv);
          at::Tensor dxv = dx.narrow(0, r0, r);
          at::mm_out(dxv, dhv, w1c);                                  // fc1's input gradient
          if (has_b2)
            add_column_sums(dov.const_data_ptr<scalar_t>(), db2[p].mutable_data_ptr<scalar_t>(),
                            r, O);
        }
      }
    });
  });
  return {dx, dw1.sum(0), db1.sum(0), dw2.sum(0), has_b2 ? db2.sum(0) : at::Tensor()};
}

}  // namespace fusebench::mlp_blocks
