// fp32 linear for a few rows (M <= kGemmF32MaxRows) on CPUs with AVX2 and
// FMA, straight from the plain transposed weight ("ba": each output's K
// weights in a row), the layout the linear packs for oneDNN's gemm there.
//
// oneDNN 3.2's jit gemm copies B into its own panels on every call: with few
// rows each copied weight serves few multiply-adds (32x1024x4096 on one Zen 3
// core: 55 % of the FMA peak, ONNX Runtime, whose weights are packed once,
// 61 %). This kernel packs nothing: a tile of R rows x C outputs keeps R C
// accumulators of 8 partial sums each, reads 8 inputs of each row and 8
// weights of each output per step (FMA), and reduces the lanes at the end;
// the outputs' weights (C rows of K) stay in L1 while every row tile passes
// over them, the input rows in L2. Then bias and clamp. The sums are taken in
// another order than oneDNN's: results agree to fp32 rounding, not bit for
// bit.
#pragma once

#include <cstdint>

namespace qpack {
namespace onednn_rt {

constexpr int64_t kGemmF32MaxRows = 64;

struct GemmF32 {
  const float* x;     // [M][K]
  int64_t M, K, N;
  const float* w;     // [N][K]
  const float* bias;  // N, or null
  float lo, hi;       // clamp bounds, +-inf when unset
  float* y;           // [M][N]
};

// True when the kernel runs this problem: a few rows whose inputs stay in L2.
bool gemm_f32_fits(int64_t M, int64_t K);
// y = clamp(x w^T + bias), outputs split over `threads` threads; only where
// own_avx2_available() (own_u8.h).
void gemm_f32(const GemmF32& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
