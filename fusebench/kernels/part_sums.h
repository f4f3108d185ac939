// Per-thread partial sums of per-channel gradients (a norm's dweight, dbias), shared by the
// row kernels of ln2d/ and rms_norm/ cpu.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace fusebench {

// Per-part dweight/dbias partial sums, each part's two rows of C on cache lines of their own.
// Packed at a stride of C in a malloc'ed vector (16-byte aligned), two threads' partials
// shared a line at every part boundary, and the channels-last backward updates them once per
// row: the line bounced between the cores (2 threads, 8x80x28x28: 1.6x aten's backward; aten's
// own buffer is a 64-byte aligned tensor with C a multiple of 16 floats at these widths).
template <typename A>
class PartSums {
 public:
  PartSums(int64_t parts, int64_t C)
      : C_(C), ld_((C + kLine - 1) / kLine * kLine), buf_(parts * 2 * ld_ + kLine, A(0)) {
    const auto p = reinterpret_cast<uintptr_t>(buf_.data());
    base_ = buf_.data() + ((64 - p % 64) % 64) / sizeof(A);
  }
  A* dw(int64_t p) { return base_ + p * 2 * ld_; }
  A* db(int64_t p) { return base_ + p * 2 * ld_ + ld_; }
  void add_to(A* dw_out, A* db_out, int64_t parts) {  // db_out nullptr: no bias (RMSNorm)
    for (int64_t p = 0; p < parts; ++p)
      for (int64_t c = 0; c < C_; ++c) {
        dw_out[c] += dw(p)[c];
        if (db_out) db_out[c] += db(p)[c];
      }
  }

 private:
  static constexpr int64_t kLine = 64 / sizeof(A);
  int64_t C_, ld_;
  std::vector<A> buf_;
  A* base_;
};

}  // namespace fusebench
