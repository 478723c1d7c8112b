// Static int8 depthwise convolution, channels-last, on oneDNN's packed weights.
//
// oneDNN 3.2's int8 depthwise kernels widen every product to 32 bits and run
// at about 20 G MAC/s on one core of a Zen 4 (3x3 x144 @56²: 156-210 us, its
// f32 kernel 116 us), at about 7 on a Zen 3 with AVX2 (589 us). This kernel
// interleaves four taps of one channel per 32-bit lane and sums them into the
// int32 accumulator, the same one as oneDNN's:
// - AVX-512 VNNI: one vpdpbusd per four taps, exact for any weights;
// - AVX2: vpmaddubsw (pairs into int16) then vpmaddwd by 1 (into int32),
//   exact only when every weight is within [-64, 64] (a pair sum is at most
//   2 * 255 * 64 = 32640): the caller runs it on such weights only (freeze's
//   reduce_range="weights", its default on CPUs without VNNI, makes them).
// The algorithm is written once (depthwise_u8_kernel.inc) and compiled per
// instruction set. It reads the weights where oneDNN packed them (blocks of
// 16 or 8 channels, [C/16][KH][KW][16] or [C/8][KH][KW][8] s8, layouts
// Abcde16a / Abcde8a): no copy is kept; each run interleaves them into a
// per-thread scratch.
//
// Requantization: own_u8.h's RequantU8.
#pragma once

#include <cstdint>

#include "backends/onednn/own_u8.h"

namespace qpack {
namespace onednn_rt {

struct DepthwiseU8 {
  const uint8_t* x;   // [N][H][W][C]
  uint8_t* y;         // [N][OH][OW][C]
  int64_t N, H, W, C, OH, OW;
  int64_t KH, KW, SH, SW, PT, PL, DH, DW;  // dilation 1 = dense
  const int8_t* w;    // oneDNN Abcde16a / Abcde8a: [ceil(C/wblock)][KH][KW][wblock]
  int64_t wblock;     // 16 or 8
  RequantU8 q;
};

enum class DepthwiseIsa { avx512_vnni, avx2 };

// True when this CPU runs the kernel for `isa` and it is the faster one:
// windows up to 8x8 taps; with AVX-512 VNNI at least 64 channels (below that
// a pixel's pointer set-up outweighs its one or two 32-channel blocks: 3x3
// x32 @112², one thread: 174 us against oneDNN's 156 on a Zen 4); with AVX2
// at least 16 in multiples of 8, and past 3x3 no last block of 8 channels (Zen 3, one thread,
// 3x3 x144 @56² batch 2: 373 against oneDNN's 764 us; x32 @112²: 454 / 528).
bool depthwise_u8_fits(int64_t KH, int64_t KW, int64_t C, DepthwiseIsa isa);
// Runs the convolution on `threads` threads (rows split evenly).
void depthwise_u8(const DepthwiseU8& a, int threads, DepthwiseIsa isa);

}  // namespace onednn_rt
}  // namespace qpack
