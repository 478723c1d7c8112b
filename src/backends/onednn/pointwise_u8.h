// Static int8 1x1 convolution (pointwise), channels-last, on oneDNN's packed
// weights.
//
// oneDNN 3.2's brgemm 1x1 kernel runs MobileNetV2's expansions, with 16 to 32
// input channels, at 31-47 % of this core's VNNI peak (16->96 @112²: 262 us
// on one thread): with so few input channels per output its per-output work
// (requantization, stores) outweighs the multiply-adds. This kernel keeps a
// tile of R pixels x 16J output channels in registers (R J <= 24 zmm
// accumulators), broadcasts four input bytes of a pixel to all lanes and
// multiplies them with four input channels of 16 outputs in one AVX-512 VNNI
// instruction (vpdpbusd, u8 x s8 -> s32, exact), and requantizes the tile
// straight from the registers.
//
// It reads the weights where oneDNN packed them: [OC/B][IC/4][B][4] s8 with
// B = 16J output channels per block (the layout oneDNN's VNNI 1x1 kernels
// choose, "48a4b" and the like), checked by the caller, never assumed; the
// zero points and padding of the last block are zeros there. The source zero
// point enters as -zp * (sum of the output's weights), exact in int32.
//
// Requantization: own_u8.h's RequantU8.
#pragma once

#include <cstdint>

#include "backends/onednn/own_u8.h"

namespace qpack {
namespace onednn_rt {

struct PointwiseU8 {
  const uint8_t* x;  // [N][H][W][IC]
  uint8_t* y;        // [N][OH][OW][OC]
  int64_t N, H, W, IC, OC, OH, OW;
  int64_t SH, SW;    // strides; no padding
  const int8_t* w;   // [ceil(OC/B)][IC/4][B][4]
  int64_t block;     // B: 16, 32, 48 or 64
  const int32_t* weight_sums;  // OC sums over the input channels
  RequantU8 q;
};

// True when this kernel reads a weight of IC inputs in blocks of B outputs.
bool pointwise_u8_fits(int64_t IC, int64_t block);
// True when it is also the faster one for `pixels` outputs per image
// (measured, see pointwise_u8.cc).
bool pointwise_u8_faster(int64_t IC, int64_t block, int64_t pixels);
// The per-output weight sums the kernel needs, from the packed weights.
void pointwise_u8_weight_sums(const int8_t* w, int64_t IC, int64_t OC, int64_t block,
                              int32_t* sums);
// Runs the convolution on `threads` threads (output pixels split evenly).
void pointwise_u8(const PointwiseU8& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
