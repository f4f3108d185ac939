// Output memory for the bundled C++ kernels (included by each kernel's cpu.cpp).
//
// A fresh output of several MiB usually comes from mmap (glibc serves anything over 32 MiB, and
// often much less, that way), so every 4 KiB page faults on first write. Measured here for a
// 38.5 MB fp32 tensor: filling it fresh costs 15 ms against 2.3 ms preallocated, more than the
// LN2d kernel's own arithmetic. Asking for transparent huge pages on the still untouched output
// (one fault per 2 MiB) cuts that to ~7 ms. A hint only: where THP is off or the memory was
// touched before, it changes nothing. Our own outputs only; the caller's tensors are never
// advised. fusebench/kernels/pages.py gives the reference copy the same hint.
// Only from 32 MiB up: glibc's largest mmap threshold, so the memory is surely a fresh mapping.
// Below it glibc may hand back recycled heap, and there the hint measured slower, not faster
// (16 MB GELU outputs in a convnext_atto step: 17-19 ms vs 3-9 ms; with defrag=madvise the
// kernel compacts memory on the fault).
#pragma once

#include <torch/extension.h>

#include <atomic>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fusebench {

// set_huge_pages(False) in each extension: benchmarks/kernels.py measures what the hint buys
inline std::atomic<bool>& huge_pages_enabled() {
  static std::atomic<bool> on{true};
  return on;
}

inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t k2M = uintptr_t(1) << 21;
  constexpr size_t kMinBytes = size_t(32) << 20;
  if (!huge_pages_enabled() || t.nbytes() < kMinBytes) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t a = (p + k2M - 1) & ~(k2M - 1), e = (p + t.nbytes()) & ~(k2M - 1);
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);  // failure is harmless
#else
  (void)t;
#endif
}

// An uninitialised tensor like `x` in `fmt`, hinted: for outputs the kernel fully overwrites.
inline at::Tensor empty_output(const at::Tensor& x, at::MemoryFormat fmt) {
  auto out = at::empty_like(x, x.options(), fmt);
  advise_huge_pages(out);
  return out;
}

}  // namespace fusebench
