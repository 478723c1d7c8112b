// Static int8 1x1 convolution (pointwise), channels-last, on oneDNN's packed
// weights.
//
// oneDNN 3.2's brgemm 1x1 kernel runs MobileNetV2's expansions, with 16 to 32
// input channels, at 31-47 % of this core's VNNI peak (16->96 @112²: 262 us
// on one thread): with so few inputs per output its per-output work
// (requantization, stores) outweighs the multiply-adds. This kernel keeps a
// tile of R pixels x 16J output channels in registers (R J <= 24 zmm
// accumulators), broadcasts four input bytes of a pixel to all lanes and
// multiplies them with four input channels of 16 outputs in one AVX-512 VNNI
// instruction (vpdpbusd, u8 x s8 -> s32, exact), and requantizes the tile
// straight from the registers.
//
// It reads the weights where oneDNN packed them: blocks of B outputs x 4
// inputs ("48a4b" and the like; see PointwiseWeights), checked by the
// caller, never assumed; padding inputs and outputs are zeros there. The
// source zero point enters as -zp * (sum of the output's weights), exact in
// int32.
//
// Windows over images of few channels (window_u8_fits: a first layer over
// RGB or gray pixels) run on the same tiles, over a copy of the image padded
// with its zero point (which the weight sums cancel exactly): each of a
// window's KH rows is KW IC contiguous bytes there, read in groups of 4 (the
// last group's extra bytes against zero weights), so a 7x7 window over RGB
// takes 7 x 6 groups where oneDNN's int8 kernels, which pad each tap's 3
// channels to 4 inputs, take 49. Such a convolution keeps its weight plain,
// [OC][KH][KW][IC] (oneDNN's "acdb"), and each run lays it out in blocks of
// outputs x 4 inputs, row by row, in a scratch buffer (64 x 168 bytes for
// ResNet's 7x7 stem).
//
// Requantization: own_u8.h's RequantU8.
#pragma once

#include <cstdint>

#include "backends/onednn/own_u8.h"

namespace qpack {
namespace onednn_rt {

// Where the four weights of inputs 4g .. 4g+3 of outputs 16q .. 16q+15 are
// (64 bytes, [16][4] s8): w + (16q / block) * block_stride + (16q % block) /
// 16 * 64 + g * group_stride.
struct PointwiseWeights {
  int64_t block;  // 16, 32, 48 or 64 outputs
  int64_t block_stride, group_stride;
  int64_t blocks;  // of `block` outputs in the packed buffer
};

// The window of WindowU8 runs (see the top): IC < 4 channels, no dilation.
struct WindowU8 {
  int64_t IC, KH, KW, pad_t, pad_l;
};

struct PointwiseU8 {
  const uint8_t* x;  // [N][H][W][IC]
  uint8_t* y;        // [N][OH][OW][OC]
  int64_t N, H, W, IC, OC, OH, OW;
  int64_t SH, SW;    // strides; no padding
  const int8_t* w;
  PointwiseWeights wl;
  const int32_t* weight_sums;  // OC sums over the inputs
  RequantU8 q;
  // sum (a graph's residual add fused in, ConvShape::sum): y holds u8 values
  // on entry, each output is acc * mult + offset + residual_mult * y +
  // residual_offset in q's output quanta (q's dst: the add's output; q has no
  // clamp of its own), clamped to [sum_qmin, sum_qmax] (the add's activation),
  // then rounded: the residual is read before its pixel is written.
  bool sum = false;
  float residual_mult = 0.0f, residual_offset = 0.0f;
  uint8_t sum_qmin = 0, sum_qmax = 255;
  // A window over the input (window_u8_fits) instead of one pixel: IC is then
  // its KH KW window.IC inputs, w the plain weight [OC][KH][KW][window.IC]
  // (wl and weight_sums unused: each run lays w out and sums it), and no sum.
  const WindowU8* window = nullptr;
};

// The layout of a packed weight [OC, IC, 1, 1] this kernel reads, from its
// oneDNN description (inner blocks, strides, size), or false.
bool pointwise_u8_layout(int64_t OC, int64_t IC, int32_t nblks, const int64_t* blks,
                         const int64_t* idxs, const int64_t* strides, uint64_t size,
                         PointwiseWeights* out);
// True when this kernel is also the faster one for `pixels` outputs per
// image (measured, see pointwise_u8.cc).
bool pointwise_u8_faster(int64_t IC, const PointwiseWeights& wl, int64_t pixels);
// The per-output weight sums the kernel needs, from the packed weights.
void pointwise_u8_weight_sums(const int8_t* w, const PointwiseWeights& wl, int64_t IC, int64_t OC,
                              int32_t* sums);
// True when a convolution of these parameters (groups 1, no dilation) runs
// as a window (see the top): fewer than 4 input channels, and fewer groups of
// 4 inputs per window row than taps (where it measured faster).
bool window_u8_fits(int64_t IC, int64_t KH, int64_t KW);
// Runs the convolution on `threads` threads (output pixels split evenly).
void pointwise_u8(const PointwiseU8& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
