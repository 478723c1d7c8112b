#include "core/quant.h"

#include "core/policy.h"

#include <algorithm>
#include <memory>

namespace qpack {

QParams choose_qparams_u8(float min, float max) {
  const int32_t qmin = 0, qmax = 255;
  min = std::min(min, 0.0f);
  max = std::max(max, 0.0f);
  double scale = (static_cast<double>(max) - min) / (qmax - qmin);
  if (static_cast<float>(scale) == 0.0f || std::isinf(1.0f / static_cast<float>(scale))) {
    scale = 0.1;
  }
  constexpr float kSmallScale = 6.1e-5f;
  if (scale < kSmallScale) {
    float org_scale = static_cast<float>(scale);
    scale = kSmallScale;
    if (min == 0.0f) {
      max = kSmallScale * (qmax - qmin);
    } else if (max == 0.0f) {
      min = -kSmallScale * (qmax - qmin);
    } else {
      float amplifier = kSmallScale / org_scale;
      min *= amplifier;
      max *= amplifier;
    }
  }
  double zp_from_min = qmin - min / scale;
  double zp_from_max = qmax - max / scale;
  double zp_from_min_error = std::abs(qmin) - std::abs(min / scale);
  double zp_from_max_error = std::abs(qmax) - std::abs(max / scale);
  double initial_zp = zp_from_min_error < zp_from_max_error ? zp_from_min : zp_from_max;
  int32_t zp;
  if (initial_zp < qmin) {
    zp = qmin;
  } else if (initial_zp > qmax) {
    zp = qmax;
  } else {
    zp = static_cast<int32_t>(std::nearbyint(initial_zp));
  }
  return QParams{static_cast<float>(scale), zp};
}

uint8_t* quantize_buffer(size_t size) {
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };
  thread_local Buffer buffer;
  if (buffer.size < size) {
    buffer.data.reset(new uint8_t[size]);
    buffer.size = size;
  }
  return buffer.data.get();
}

// Round-half-to-even by the float magic-number trick (exact for |v| < 2^22,
// which the clamp below guarantees): it vectorises, unlike std::nearbyint.
void quantize_u8_array(const float* x, int64_t n, QParams q, uint8_t* out) {
  const float inv_scale = 1.0f / q.scale;
  const float zp = static_cast<float>(q.zero_point);
  const float magic = 12582912.0f;  // 1.5 * 2^23
#pragma omp parallel for simd num_threads(num_threads()) if (num_threads() > 1 && n > (int64_t(1) << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * inv_scale;
    v = std::min(std::max(v, -1.0e6f), 1.0e6f);
    v = (v + magic) - magic;
    v = std::min(std::max(v + zp, 0.0f), 255.0f);
    out[i] = static_cast<uint8_t>(v);
  }
}

void min_max(const float* x, int64_t n, float* min_out, float* max_out) {
  if (n == 0) {
    *min_out = *max_out = 0.0f;
    return;
  }
  float lo = x[0], hi = x[0], poison = 0.0f;
#pragma omp parallel for simd num_threads(num_threads()) if (num_threads() > 1 && n > (int64_t(1) << 16)) \
    reduction(min : lo) reduction(max : hi) reduction(+ : poison) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    poison += x[i] * 0.0f;  // NaN if any element is NaN or infinite
  }
  check(poison == 0.0f, QPACK_STATUS_INVALID_ARGUMENT,
        "dynamic quantization needs finite input; the input holds NaN or infinity");
  *min_out = lo;
  *max_out = hi;
}

}  // namespace qpack
