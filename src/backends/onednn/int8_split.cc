#include "backends/onednn/int8_split.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/onednn/runtime.h"
#include "core/policy.h"
#include "core/quant.h"

namespace qpack {
namespace onednn_rt {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// Calls body(o) for every outer index o, in parallel when the work is large.
template <typename Body>
void for_outer(int64_t outer, int64_t per_outer, const Body& body) {
  const bool parallel = outer > 1 && outer * per_outer >= kParallelMin && num_threads() > 1;
#pragma omp parallel for num_threads(num_threads()) if (parallel) schedule(static)
  for (int64_t o = 0; o < outer; ++o) body(o);
}

// Value selects (not std::min/max, which return references) let the
// compiler vectorize the loops below.
inline float clamp(float v, float lo, float hi) {
  v = v < lo ? lo : v;
  return v > hi ? hi : v;
}

// n outputs of one span: a row of channels (kPerChannel: scale[j], bias[j])
// or one channel's pixels (scale[0], bias[0]). 2 * hi + lo is formed in
// wrapping 32-bit arithmetic, exact while |x - zp| * |w| summed stays in int32
// (as the fused path's int32 accumulator must), then converted to float once,
// as oneDNN converts its own accumulator.
template <bool kPerChannel, typename Out>
void epilogue_span(const int32_t* __restrict hi, const int32_t* __restrict lo,
                   const float* __restrict scale, const float* __restrict bias, int64_t n,
                   const Epilogue& e, Out* __restrict out) {
  // u8: the fused clamp and the uint8 range are one clamp of the rounded
  // value (rounding is monotonic), as output_bounds_u8 computes it.
  // (v + 1.5 * 2^23) - 1.5 * 2^23 rounds half to even (default rounding mode)
  // for |v| < 2^22; larger values keep their sign and stay outside the bounds.
  constexpr float kRound = 12582912.0f;
  const float inv_scale = 1.0f / e.dst_scale;
  uint8_t qmin = 0, qmax = 255;
  output_bounds_u8(e.clamp_min, e.clamp_max, e.dst_scale, e.dst_zero_point, &qmin, &qmax);
  const auto zero_point = static_cast<float>(e.dst_zero_point);
  const float vmin = qmin - zero_point, vmax = qmax - zero_point;
  const float clamp_min = e.clamp_min, clamp_max = e.clamp_max;  // +-inf when unset
  for (int64_t j = 0; j < n; ++j) {
    const auto sum = static_cast<int32_t>(2u * static_cast<uint32_t>(hi[j]) +
                                          static_cast<uint32_t>(lo[j]));
    const int64_t c = kPerChannel ? j : 0;
    const float real = static_cast<float>(sum) * scale[c] + bias[c];
    if constexpr (std::is_same_v<Out, float>) {
      out[j] = clamp(real, clamp_min, clamp_max);
    } else {
      const float v = clamp((real * inv_scale + kRound) - kRound, vmin, vmax);
      out[j] = static_cast<uint8_t>(static_cast<int32_t>(v + zero_point));
    }
  }
}

void split_span(const uint8_t* __restrict x, int64_t n, int32_t d, uint8_t* __restrict hi,
                uint8_t* __restrict lo) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = x[i] + d;
    hi[i] = static_cast<uint8_t>(v >> 1);
    lo[i] = static_cast<uint8_t>(v & 1);
  }
}

template <typename Out>
void epilogue(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
              Out* out) {
  const int64_t total = outer * C * inner;
  std::vector<float> scales(C), biases(C);
  for (int64_t c = 0; c < C; ++c) {
    scales[c] = e.src_scale * e.wei_scales[e.per_channel ? c : 0];
    biases[c] = e.bias != nullptr ? e.bias[c] : 0.0f;
  }
  for_outer(outer, C * inner, [&](int64_t o) {
    if (inner == 1) {  // matmul, channels-last
      const int64_t i = o * C;
      epilogue_span<true>(acc + i, acc + total + i, scales.data(), biases.data(), C, e, out + i);
      return;
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = (o * C + c) * inner;
      epilogue_span<false>(acc + i, acc + total + i, &scales[c], &biases[c], inner, e, out + i);
    }
  });
}

}  // namespace

bool narrow(const uint8_t* x, int64_t n, int32_t zero_point) {
  if (zero_point < 0 || zero_point > 127) return false;
  // OR of every byte, eight at a time (the compiler vectorizes the loop)
  uint64_t any = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, x + i, 8);
    any |= w;
  }
  for (; i < n; ++i) any |= x[i];
  return (any & 0x8080808080808080ull) == 0;
}

bool narrow_weights(const int8_t* w, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= w[i] >= -kNarrowWeight && w[i] <= kNarrowWeight;
  return ok;
}

bool narrow_weights(const BlockedLayout& layout, const uint8_t* data, size_t size) {
  const int64_t span = layout.span();
  return layout.data_type == static_cast<uint32_t>(dnnl::memory::data_type::s8) &&
         span <= static_cast<int64_t>(std::min<uint64_t>(size, layout.size)) &&
         narrow_weights(reinterpret_cast<const int8_t*>(data), span);
}

SplitInput split_input(const uint8_t* x, int64_t n, int32_t zero_point, int64_t n_out) {
  const size_t size = 2 * (static_cast<size_t>(n_out) * sizeof(int32_t) + static_cast<size_t>(n));
  auto* acc = static_cast<int32_t*>(thread_buffer(ThreadBuffer::split, size));
  uint8_t* out = reinterpret_cast<uint8_t*>(acc + 2 * n_out);
  const int32_t z = (zero_point + 2) / 3;
  const int32_t d = 3 * z - zero_point;
  uint8_t* hi = out;
  uint8_t* lo = out + n;
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  for_outer(chunks, kChunk, [&](int64_t ch) {
    const int64_t i = ch * kChunk;
    split_span(x + i, std::min(kChunk, n - i), d, hi + i, lo + i);
  });
  return SplitInput{out, z, acc};
}

void epilogue_u8(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                 uint8_t* out) {
  epilogue(acc, outer, C, inner, e, out);
}

void epilogue_f32(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                  float* out) {
  epilogue(acc, outer, C, inner, e, out);
}

}  // namespace onednn_rt
}  // namespace qpack
