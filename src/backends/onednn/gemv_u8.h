// Static and dynamic int8 linear for a few rows (M <= kGemvMaxRows) on
// weights within [-64, 64], on CPUs without VNNI: u8 x s8 -> s32 sums of the
// plain transposed weight ("ba": each output's K weights in a row).
//
// oneDNN 3.2's AVX2 int8 gemm spends a 1x512x512 product (262 k multiply-adds,
// under 3 us of this core's int8 peak) in set-up and zero-point compensation:
// 33 us without zero points, 64 us with them (Zen 3, 1 thread). This kernel
// takes the dot products straight from the packed rows with vpmaddubsw +
// vpmaddwd (exact: a pair sum is at most 2 * 255 * 64 = 32640), two rows per
// pass over four outputs' weights, over blocks of outputs whose weights stay
// in L2, and subtracts the source zero point as -zp * (the output's weight
// sum), exact in int32. The caller applies int8_split.h's epilogue, the one
// its split runs use.
//
// Against oneDNN on the same packed weight (Zen 3, 1 thread, zero points 120
// and 100, interleaved): 1x1280x1000 221 -> 57 us, 4x1280x1000 278 -> 118,
// 8x1024x4096 1406 -> 842, 16x512x512 145 -> 106; 32x1024x4096 the same
// (3310 / 3260), 64x1024x1024 slower (979 / 1222): up to 16 rows.
#pragma once

#include <cstdint>

namespace qpack {
namespace onednn_rt {

constexpr int64_t kGemvMaxRows = 16;

struct GemvU8 {
  const uint8_t* x;           // [M][K]
  int64_t M, K, N;
  const int8_t* w;            // [N][K], every value within [-64, 64]
  const int32_t* weight_sums; // N sums over K
  int32_t src_zero_point;
  int32_t* acc;               // [M][N]
};

// acc = x w^T - zp * sums, output rows split over `threads` threads; only
// where own_avx2_available() (own_u8.h).
void gemv_u8(const GemvU8& a, int threads);
// sums[n] = the sum of w[n][0 .. K).
void gemv_u8_weight_sums(const int8_t* w, int64_t N, int64_t K, int32_t* sums);

}  // namespace onednn_rt
}  // namespace qpack
