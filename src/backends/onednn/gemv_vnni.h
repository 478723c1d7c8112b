// Static and dynamic int8 linear for a few rows with AVX-512 VNNI, on the
// weight as oneDNN packs it for its brgemm matmul ("BA16a64b4a": blocks of
// 64 inputs x 64 outputs, the outputs' blocks outermost; within a block 16
// groups of [64 outputs][4 inputs] bytes: one zmm of a group is 16 outputs x
// 4 inputs, what vpdpbusd takes). u8 x s8 -> s32 sums, exact.
//
// oneDNN 3.2's brgemm matmul spends a 1x512x512 product (262 k multiply-adds,
// about 1.2 us of this core's VNNI peak) in 6.4 us (Zen 4, 1 thread,
// graph-node time). This kernel runs each 64-output block over K with the
// input's 4 bytes broadcast and 4 vpdpbusd per group, up to 4 rows sharing
// each weight load, then subtracts the source zero point as
// -zp * (the output's weight sum). The caller applies int8_split.h's epilogue.
//
// Against oneDNN on the same packed weight (Zen 4, 1 thread, static int8
// frozen Linear, float in and out, interleaved in one process): 1x512x512
// 13.6 -> 10.8 us (graph node 6.0 -> 3.5 us), 4x512x512 16.4 -> 14.2,
// 8x1024x4096 186 -> 182; 16 rows the same or slower (16x1024x1024 99.5 /
// 99.6, 16x512x512 31.9 / 32.8): up to kGemvVnniMaxRows rows.
#pragma once

#include <cstdint>

#include "backends/onednn/runtime.h"

namespace qpack {
namespace onednn_rt {

constexpr int64_t kGemvVnniMaxRows = 8;

struct GemvVnni {
  const uint8_t* x;  // [M][K]
  int64_t M, K, N;
  // input k, output n at: (n / 64) * nstride + (k / 64) * kstride + ((k % 64) / 4) * 256 + (n % 64) * 4 + k % 4
  const int8_t* w;
  int64_t nstride, kstride;
  const int32_t* weight_sums;  // N sums over K
  int32_t src_zero_point;
  int32_t* acc;  // [M][N]
};

// True, with the two strides (left as they are otherwise), when `layout` is that blocking of a [K, N] s8
// weight; false on CPUs without AVX-512 VNNI (own_u8_available()).
bool gemv_vnni_layout(const BlockedLayout& layout, int64_t K, int64_t N, int64_t* nstride, int64_t* kstride);
// sums[n] = the sum over k of the weight of input k, output n.
void gemv_vnni_weight_sums(const GemvVnni& a, int32_t* sums);
// acc = x w - zp * sums; 64-output blocks split over `threads` threads.
void gemv_vnni(const GemvVnni& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
