// fp32 linear for a few rows (M <= kGemvF32MaxRows) with AVX-512, straight
// from the weight as oneDNN packs it for its brgemm matmul ("BA16a64b":
// blocks of 16 inputs x 64 outputs, the outputs' blocks outermost; within a
// block, each input's 64 weights contiguous).
//
// oneDNN 3.2's brgemm matmul takes MobileNetV2's classifier (1x1280 ->
// 1000, a 5 MB weight streamed once per call) in 361-470 us on one Zen 4
// core: 11-14 GB/s. This kernel streams each 64-output block once for all
// rows: per input, its 64 weights (4 zmm) times the rows' input broadcast,
// 4 rows x 4 accumulators; then bias and clamp. The sums go in another
// order than oneDNN's: results agree to fp32 rounding, not bit for bit.
#pragma once

#include <cstdint>

#include "backends/onednn/runtime.h"

namespace qpack {
namespace onednn_rt {

constexpr int64_t kGemvF32MaxRows = 4;

struct GemvF32 {
  const float* x;  // [M][K]
  int64_t M, K, N;
  // input k, output n at: (n / 64) * nstride + (k / 16) * kstride + (k % 16) * 64 + n % 64
  const float* w;
  int64_t nstride, kstride;
  const float* bias;  // N, or null
  float lo, hi;       // clamp bounds, +-inf when unset
  float* y;           // [M][N]
};

// True, with the two strides (in floats; left as they are otherwise), when `layout` is that blocking of a
// [K, N] f32 weight; false without AVX-512 (the CPU's, and isa_has_avx512_core()).
bool gemv_f32_layout(const BlockedLayout& layout, int64_t K, int64_t N, int64_t* nstride, int64_t* kstride);
// y = clamp(x w + bias); 64-output blocks split over `threads` threads.
void gemv_f32(const GemvF32& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
