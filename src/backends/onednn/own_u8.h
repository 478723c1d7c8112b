// What qpack's own static int8 kernels on the oneDNN backend share
// (depthwise_u8.h, pointwise_u8.h): the requantization of their int32
// sums, the CPU check, and a per-thread scratch buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/parallel.h"

namespace qpack {
namespace onednn_rt {

// real = acc * src_scale * wei_scale[o] + bias[o], the fused clamp folded
// into the uint8 bounds, round half to even of real / dst_scale, plus the
// zero point: one fp32 FMA, acc * mult(o) + offset(o), in output quanta.
// Within one quantum of oneDNN's epilogue and of PyTorch.
struct RequantU8 {
  float src_scale;
  int32_t src_zero_point;
  const float* wei_scales;  // one per output, or one when !per_channel
  bool per_channel;
  const float* bias;        // one per output, or null
  float clamp_min, clamp_max;  // +-inf when unset
  float dst_scale;
  int32_t dst_zero_point;

  float mult(int64_t o) const {
    return src_scale * wei_scales[per_channel ? o : 0] * (1.0f / dst_scale);
  }
  float offset(int64_t o) const {
    return (bias != nullptr ? bias[o] * (1.0f / dst_scale) : 0.0f) + static_cast<float>(dst_zero_point);
  }
  void bounds(uint8_t* qmin, uint8_t* qmax) const;
};

// Bits [lo, hi) of 16, clipped to [0, 16): an AVX-512 lane mask (a row's
// tail, the columns of a window inside its input).
inline uint32_t lanes16(int64_t lo, int64_t hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 16 ? 16 : hi;
  return hi <= lo ? 0u : ((1u << hi) - 1) & ~((1u << lo) - 1);
}

// The few-row linear kernels' walk (gemv_f32.h, gemv_vnni.h): N's 64-output
// blocks split over `threads` (a part below 4 blocks of 64 outputs x
// `part_inputs` inputs, or below 2 blocks, is not worth waking a thread for),
// each block run for the rows in groups of up to 4: block(r, m, nb), r a
// std::integral_constant<int, 1..4> rows from row m, nb the block.
template <typename Block>
void for_gemv_blocks(int64_t M, int64_t K, int64_t N, int64_t part_inputs, int threads, const Block& block) {
  const int64_t blocks = (N + 63) / 64;
  const int64_t grain = std::max<int64_t>(2, 4 * part_inputs / std::max<int64_t>(K, 1));
  parallel_chunks(blocks, grain, threads, [&](int, int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) block(std::integral_constant<int, 4>{}, m, nb);
      switch (M - m) {
        case 3: block(std::integral_constant<int, 3>{}, m, nb); break;
        case 2: block(std::integral_constant<int, 2>{}, m, nb); break;
        case 1: block(std::integral_constant<int, 1>{}, m, nb); break;
        default: break;
      }
    }
  });
}

// True when this CPU allows AVX-512 with VNNI (the callers also respect
// ONEDNN_MAX_CPU_ISA, through isa_has_avx512_vnni()).
bool own_u8_available();
// True when this CPU has AVX2 and FMA (the AVX2 kernels: depthwise_u8.h,
// gemv_u8.h); false on other architectures.
bool own_avx2_available();
// False when the environment variable `name` is "0": QPACK_ONEDNN_OWN_DEPTHWISE,
// QPACK_ONEDNN_OWN_POINTWISE, QPACK_ONEDNN_OWN_WINDOW, QPACK_ONEDNN_OWN_GEMM keep the convolutions or
// linears made while it is set on oneDNN's kernels (to compare them).
bool own_enabled(const char* name);
// The calling thread's buffer number `slot` (0 or 1) of at least `size`
// bytes, 64-byte aligned, reused by its next call with that slot.
void* own_u8_scratch(int slot, size_t size);

}  // namespace onednn_rt
}  // namespace qpack
