// fp32 depthwise convolution on planar (NCHW) data, on oneDNN's packed
// weights.
//
// A graph's float NCHW input read by a depthwise convolution went through two
// transposes around oneDNN's channels-last kernel (its NCHW path is slower
// still): for MobileNetV2's 3x3 x144 @56², one thread, Zen 4, the convolution
// took 121 us of the layer's 262-285. Planar data needs no transpose: each
// channel is its own image.
// - 3x3, stride 1, dense, with AVX-512: straight from the input, tiles of 4
//   rows x 64 pixels (16 sums), each input row loaded once for the output
//   rows it serves, masked loads reading zeros outside the input.
// - Otherwise (AVX2 + FMA): the channel's plane copied into a zero-padded
//   buffer (the next plane's copy made before this one runs), then tiles of
//   3 rows x 32 pixels, each tap's weight broadcast once for the tile;
//   stride 2 takes the even columns of two loads.
// Bias and the clamps (the layer's fused ReLU / ReLU6 / Hardtanh, and a
// graph's fused ReLU or clamp) come last: the sums oneDNN makes, in another
// order (float rounding differs, within DESIGN.md's tolerance).
#pragma once

#include <cstdint>

namespace qpack {
namespace onednn_rt {

struct DepthwiseNchwF32 {
  const float* x;  // [N][C][H][W]
  float* y;        // [N][C][OH][OW]
  int64_t N, C, H, W, OH, OW;
  int64_t KH, KW, SH, SW, PT, PL, DH, DW;  // dilation 1 = dense
  // channel c, tap (kh, kw): w[(c / cblock) * cstride + c % cblock + kh * wsh + kw * wsw]
  const float* w;
  int64_t cblock, cstride, wsh, wsw;
  const float* bias;  // [C] or null
  float lo, hi;       // the clamp (-inf, +inf: none)
};

// True when this CPU has AVX2 and FMA and the kernel takes the window: at
// most 64 taps, stride 1 or 2 along the width (any along the height).
bool depthwise_nchw_f32_fits(int64_t KH, int64_t KW, int64_t SW);
// True for problems where it measured faster than oneDNN's channels-last
// kernel with the transposes around it (one thread, NCHW float in and out,
// interleaved in one process, Zen 4): output planes from 28x28 on the
// AVX-512 path (3x3 x144 @56² 0.64-0.74x the time, x192 @28² 0.77-0.81x;
// x576 @14² 1.01x, x960 @7² 1.76x: a plane's rows are then too short for
// its vectors), from 56x56 on the AVX2 path (ONEDNN_MAX_CPU_ISA=AVX2, both
// sides: x144 @56² 0.80x, x96 @112² stride 2 0.54-0.89x (0.63x on AVX2);
// x192 @28² 1.16x, x144 @28² stride 2 1.64x).
bool depthwise_nchw_f32_faster(const DepthwiseNchwF32& a);
// Runs the convolution on `threads` threads (channel planes split evenly).
void depthwise_nchw_f32(const DepthwiseNchwF32& a, int threads);

}  // namespace onednn_rt
}  // namespace qpack
