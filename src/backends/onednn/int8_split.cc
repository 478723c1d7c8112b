#include "backends/onednn/int8_split.h"

#include <algorithm>

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

// Calls store(index, real value) for every output element, the real value
// scaled, biased and clamped.
template <typename Store>
void epilogue(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
              const Store& store) {
  const int64_t total = outer * C * inner;
  const int32_t* hi = acc;
  const int32_t* lo = acc + total;
  for_outer(outer, C * inner, [&](int64_t o) {
    for (int64_t c = 0; c < C; ++c) {
      const float scale = e.src_scale * e.wei_scales[e.per_channel ? c : 0];
      const float bias = e.bias != nullptr ? e.bias[c] : 0.0f;
      const int64_t base = (o * C + c) * inner;
      for (int64_t i = base; i < base + inner; ++i) {
        const int64_t sum = 2 * static_cast<int64_t>(hi[i]) + lo[i];
        float real = static_cast<float>(sum) * scale + bias;
        real = std::min(std::max(real, e.clamp_min), e.clamp_max);  // +-inf when unset
        store(i, real);
      }
    }
  });
}

}  // namespace

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
    const int64_t end = std::min(n, (ch + 1) * kChunk);
    for (int64_t i = ch * kChunk; i < end; ++i) {
      const int32_t v = x[i] + d;
      hi[i] = static_cast<uint8_t>(v >> 1);
      lo[i] = static_cast<uint8_t>(v & 1);
    }
  });
  return SplitInput{out, z, acc};
}

void epilogue_u8(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                 uint8_t* out) {
  epilogue(acc, outer, C, inner, e, [&](int64_t i, float real) {
    out[i] = quantize_u8(real, e.dst_scale, e.dst_zero_point);
  });
}

void epilogue_f32(const int32_t* acc, int64_t outer, int64_t C, int64_t inner, const Epilogue& e,
                  float* out) {
  epilogue(acc, outer, C, inner, e, [&](int64_t i, float real) { out[i] = real; });
}

}  // namespace onednn_rt
}  // namespace qpack
