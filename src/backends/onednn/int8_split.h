// Exact u8 x s8 on CPUs without VNNI.
//
// Without VNNI, oneDNN's int8 kernels multiply u8 x s8 pairs with vpmaddubsw,
// whose int16 pair sums saturate (255*127*2 > 32767): results are silently
// wrong. There qpack splits the activations so that no pair sum can saturate
// and runs the primitive once on both halves, stacked along the batch, with an
// s32 destination and no scales, zero point of the output or post-ops; the
// epilogue (scales, bias, clamp, requantization) is done here.
//
// Split: with z = ceil(zp / 3) and d = 3z - zp (0, 1 or 2), v = x + d,
//   x - zp = 2 * ((v >> 1) - z) + ((v & 1) - z).
// Both halves share the source zero point z (so one primitive run covers them,
// and a padded element, which equals z, is real 0 in both), and v >> 1 <= 128,
// so a pair sum is at most 2 * 128 * 128 = 32768 in magnitude, and exactly
// -32768 only when negative: inside int16.
//
// Compensation: the source zero point stays a runtime attribute, so oneDNN
// handles it as on VNNI (a per-column weight sum kept in the packed weights,
// flag "zpm" in its verbose output, times the zero point of the run; or
// computed at run time by gemm:jit); it depends on the mask, not on the value.
// u8 sources need no s8s8 compensation. The packed layout is queried at pack
// time with the attributes of the mode the ISA selects, so it always matches.
//
// Narrow inputs need no split: when every byte of the input and its zero point
// are below 128, a pair sum is at most 2 * 127 * 128 = 32512 in magnitude, and
// the fused primitive (requantization, bias and clamp in oneDNN) is exact. A
// scan of the input decides per run (narrow()); a static int8 graph calibrated
// for such a CPU maps its values to [0, 127] (PyTorch's reduce_range), so its
// layers take the fused path unless a value passes its calibrated range.
//
// Narrow weights need no split either: when every weight is within
// [-kNarrowWeight, kNarrowWeight] = [-64, 64], a pair sum is at most
// 2 * 255 * 64 = 32640 in magnitude for any u8 input. A packed object checks
// its weights once, at pack or load, and then always runs fused; freeze's
// reduce_range="weights" (its default on such a CPU) quantizes weights so
// (7-bit weights, as ONNX Runtime's reduce_range), activations staying 8-bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/onednn/runtime.h"

namespace qpack {
namespace onednn_rt {

// The stacked halves of an input and room for the two halves' accumulators,
// in a per-thread buffer (valid until the thread's next split_input).
struct SplitInput {
  uint8_t* halves;     // [2][n_in]: high halves, then low halves
  int32_t zero_point;  // the halves' common source zero point
  int32_t* acc;        // [2][n_out], not initialised
};
// True when every x[i] < 128 and zero_point < 128: the fused primitive is exact.
bool narrow(const uint8_t* x, int64_t n, int32_t zero_point);
// True when every w[i] is within [-kNarrowWeight, kNarrowWeight]: the fused
// primitive is exact for every input.
constexpr int kNarrowWeight = 64;
bool narrow_weights(const int8_t* w, int64_t n);
// The same for saved packed s8 weights in `layout` (padding included); false
// when the bytes do not hold the layout (the loader reports that).
bool narrow_weights(const BlockedLayout& layout, const uint8_t* data, size_t size);
SplitInput split_input(const uint8_t* x, int64_t n_in, int32_t zero_point, int64_t n_out);

// acc holds the two halves' s32 accumulators, [2][outer][C][inner]; the
// epilogue forms 2 * hi + lo and applies the rest of the int8 op.
struct Epilogue {
  float src_scale;
  const float* wei_scales;  // C values, or 1 when per_channel is false
  bool per_channel;
  const float* bias;        // C values, or null
  float clamp_min, clamp_max;
  float dst_scale;          // u8 output only
  int32_t dst_zero_point;   // u8 output only
};
void epilogue_u8(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                 uint8_t* out);
void epilogue_f32(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                  float* out);

}  // namespace onednn_rt
}  // namespace qpack
