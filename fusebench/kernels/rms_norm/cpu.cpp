// RMSNorm on CPU over the last dim of a row-major (rows, C) tensor: y = x * rstd * w with
// rstd = 1 / sqrt(mean(x^2) + eps) per row (LLaMA's, T5's, torch.nn.RMSNorm).
//
// A row's C values (C = 256..8192 in transformers: 1-32 KiB) stay in L1 between its passes, so
// each direction reads x (and dy) from memory once: forward sums x^2 then writes y; backward
// sums g*x (g = dy*w) then writes dx and adds dy*x*rstd to this part's dweight partial.
// Saved for backward: x and rstd (rows floats), never the normalised tensor.
// Accumulation is in float for float/bfloat16 inputs, double for double; dweight partials are
// per fixed chunk (PartSums), so the result does not depend on the thread count.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>

#include "../cpu_math.h"
#include "../huge_pages.h"
#include "../part_sums.h"
#include "../vec.h"

namespace {

using fusebench::AccOf;
using fusebench::grain;
using fusebench::parallel_chunks;
using fusebench::PartSums;
using fusebench::row_at;   // row sums in registers (vec.h)
using fusebench::sum_row;

// Plain functions with __restrict pointers, not lambda bodies: GCC vectorised `omp simd` loops
// over a lambda's captured pointers with gathers (ln2d/cpu.cpp's bwd_rows note).
template <typename T, typename A>
void fwd_rows(const T* __restrict x, const A* __restrict w, T* __restrict y, A* __restrict rstd,
              int64_t r0, int64_t r1, int64_t C, double eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = x + r * C;
    T* __restrict yr = y + r * C;
    const A ss = sum_row<1, T, A>(C, [&](auto z, int64_t c) {
      using V = decltype(z);
      const V v = row_at<V>(xr, c);
      return std::array<V, 1>{v * v};
    })[0];
    const A rs = A(1) / std::sqrt(ss / A(C) + A(eps));
    rstd[r] = rs;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<T>(static_cast<A>(xr[c]) * rs * w[c]);
  }
}

// dx = rstd * g - x * rstd^3 * sum(g * x) / C, g = dy * w; dweight += dy * x * rstd.
template <typename T, typename A>
void bwd_rows(const T* __restrict dy, const T* __restrict x, const A* __restrict rstd,
              const A* __restrict w, T* __restrict dx, A* __restrict dwp, int64_t r0, int64_t r1,
              int64_t C) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict xr = x + r * C;
    const T* __restrict dyr = dy + r * C;
    T* __restrict dxr = dx + r * C;
    const A rs = rstd[r];
    const A sgx = sum_row<1, T, A>(C, [&](auto z, int64_t c) {
      using V = decltype(z);
      return std::array<V, 1>{row_at<V>(dyr, c) * row_at<V>(w, c) * row_at<V>(xr, c)};
    })[0];
    const A k = rs * rs * rs * sgx / A(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const A xv = static_cast<A>(xr[c]), d = static_cast<A>(dyr[c]);
      dwp[c] += d * xv * rs;
      dxr[c] = static_cast<T>(rs * d * w[c] - xv * k);
    }
  }
}

void check_input(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu(), "rms_norm cpu: x must be a CPU tensor, got ", x.device());
  TORCH_CHECK(x.dim() >= 1, "rms_norm cpu: x must have at least one dim");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16,
              "rms_norm cpu: unsupported dtype ", st, " (supported: float32, float64, bfloat16)");
  TORCH_CHECK(w.numel() == x.size(-1), "rms_norm cpu: weight must have C=", x.size(-1),
              " elements, got ", w.numel());
}

at::ScalarType acc_type(at::ScalarType st) { return st == at::kDouble ? at::kDouble : at::kFloat; }

// (y, rstd): rstd has x's shape with the last dim dropped, in the accumulation type.
std::vector<at::Tensor> forward(at::Tensor x, at::Tensor w, double eps) {
  check_input(x, w);
  x = x.contiguous();
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.to(at_).contiguous();
  auto y = fusebench::empty_output(x, at::MemoryFormat::Contiguous);
  auto stat_shape = x.sizes().vec();
  stat_shape.pop_back();
  auto rstd = at::empty(stat_shape, x.options().dtype(at_));
  if (x.numel() == 0) return {y, rstd};
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm_cpu_fwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const A* wp = wa.const_data_ptr<A>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    A* rp = rstd.mutable_data_ptr<A>();
    at::parallel_for(0, rows, grain(C), [&](int64_t r0, int64_t r1) {
      fwd_rows<scalar_t, A>(xp, wp, yp, rp, r0, r1, C, eps);
    });
  });
  return {y, rstd};
}

// (dx, dweight): dweight in w's dtype.
std::vector<at::Tensor> backward(at::Tensor dy, at::Tensor x, at::Tensor rstd, at::Tensor w) {
  check_input(x, w);
  TORCH_CHECK(dy.sizes() == x.sizes(), "rms_norm cpu: dy and x shapes differ");
  x = x.contiguous();
  dy = dy.to(x.scalar_type()).contiguous();
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  const auto at_ = acc_type(x.scalar_type());
  auto wa = w.to(at_).contiguous();
  rstd = rstd.to(at_).contiguous();
  auto dx = fusebench::empty_output(x, at::MemoryFormat::Contiguous);
  auto dw = at::zeros({C}, x.options().dtype(at_));
  if (x.numel() == 0) return {dx, dw.to(w.scalar_type())};
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm_cpu_bwd", [&] {
    using A = typename AccOf<scalar_t>::type;
    const int64_t parts = std::max<int64_t>(1, at::get_num_threads());
    PartSums<A> part(parts, C);
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const A* rp = rstd.const_data_ptr<A>();
    const A* wp = wa.const_data_ptr<A>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    parallel_chunks(rows, parts, grain(C), [&](int64_t p, int64_t r0, int64_t r1) {
      bwd_rows<scalar_t, A>(dyp, xp, rp, wp, dxp, part.dw(p), r0, r1, C);
    });
    part.add_to(dw.mutable_data_ptr<A>(), nullptr, parts);
  });
  return {dx, dw.to(w.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "RMSNorm forward over the last dim: (y, rstd)", py::arg("x"),
        py::arg("weight"), py::arg("eps"));
  m.def("backward", &backward, "RMSNorm backward: (dx, dweight)", py::arg("dy"), py::arg("x"),
        py::arg("rstd"), py::arg("weight"));
}
