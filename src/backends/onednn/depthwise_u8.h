// Static int8 depthwise convolution, channels-last, on oneDNN's packed weights.
//
// oneDNN 3.2's int8 depthwise kernels widen every product to 32 bits and run
// at about 20 G MAC/s on one core here (3x3 x144 @56²: 156-210 us, its f32
// kernel 116 us). This kernel pairs neighbouring taps of one channel as int16
// and sums each pair with one AVX-512 VNNI instruction (vpdpwssd): u8 - 0 and
// s8 fit in int16 and a pair sum in int32, so the result is exact, the same
// int32 accumulator as oneDNN's. It reads the weights where oneDNN packed
// them (blocks of 16 channels, [C/16][KH][KW][16] s8, layout Abcde16a): no
// copy is kept; each run widens them into a per-thread scratch.
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
  const int8_t* w;    // oneDNN Abcde16a: [ceil(C/16)][KH][KW][16]
  RequantU8 q;
};

// True when this kernel is the faster one: windows up to 8x8 taps, at least
// 64 channels. Below that a pixel's pointer set-up outweighs its one or two
// 32-channel blocks (3x3 x32 @112², one thread: 174 us against oneDNN's 156).
bool depthwise_u8_fits(int64_t KH, int64_t KW, int64_t C);
// Runs the convolution on `threads` threads (rows split evenly).
void depthwise_u8(const DepthwiseU8& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
