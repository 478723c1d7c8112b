// Small quantization helpers shared by the backends (no backend headers here).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace qpack {

inline void check_scale(float scale, const char* what, int64_t index) {
  if (!(std::isfinite(scale) && scale > 0.0f && std::isnormal(scale))) {
    if (index >= 0) {
      fail(QPACK_STATUS_INVALID_ARGUMENT, what, "[", index, "] = ", scale,
           " is not a valid scale: it must be a finite, positive, normal float32");
    }
    fail(QPACK_STATUS_INVALID_ARGUMENT, what, " = ", scale,
         " is not a valid scale: it must be a finite, positive, normal float32");
  }
}

inline void check_u8_zero_point(int32_t zp, const char* what) {
  check(zp >= 0 && zp <= 255, QPACK_STATUS_INVALID_ARGUMENT, what, " = ", zp,
        " is outside the uint8 range [0, 255]");
}

// Real value -> uint8 with PyTorch's rounding (round half to even) and clamping.
inline uint8_t quantize_u8(float value, float scale, int32_t zero_point) {
  if (std::isinf(value)) return value > 0 ? 255 : 0;
  float q = std::nearbyint(value / scale) + static_cast<float>(zero_point);
  if (q < 0.0f) return 0;
  if (q > 255.0f) return 255;
  return static_cast<uint8_t>(q);
}

// Output clamp of a fused activation in the uint8 domain.
inline void output_bounds_u8(float clamp_min, float clamp_max, float scale, int32_t zero_point,
                             uint8_t* qmin, uint8_t* qmax) {
  *qmin = std::isinf(clamp_min) ? 0 : quantize_u8(clamp_min, scale, zero_point);
  *qmax = std::isinf(clamp_max) ? 255 : quantize_u8(clamp_max, scale, zero_point);
}

struct QParams {
  float scale;
  int32_t zero_point;
};

// Dynamic-quantization parameters for a float range, as PyTorch's
// ChooseQuantizationParams (qmin 0, qmax 255, no reduce_range) computes them.
QParams choose_qparams_u8(float min, float max, int32_t qmax = 255);

// PyTorch's int32 bias for QNNPACK: round(bias / (weight_scale * input_scale)),
// one weight scale (per-tensor) or one per output channel. Throws
// INVALID_ARGUMENT when a value does not fit (|q| > 2^30, leaving headroom for
// the accumulator): such an input scale is too small for QNNPACK's int32 bias.
std::vector<int32_t> quantize_bias_i32(const std::vector<float>& bias,
                                       const std::vector<float>& weight_scales,
                                       float input_scale, int64_t channels);

// x [n] float -> uint8 with (scale, zero_point).
void quantize_u8_array(const float* x, int64_t n, QParams q, uint8_t* out);
// Per-thread scratch for quantized activations (grows, never shrinks, not zeroed).
uint8_t* quantize_buffer(size_t size);
// min/max over x [n]; (0, 0) for n == 0; NaN or infinity is an error.
void min_max(const float* x, int64_t n, float* min_out, float* max_out);

// y = x0 + x1 on uint8 values with their own parameters, requantized to qy
// and clamped to [lo, hi] (the u8 bounds of a fused ReLU or clamp): computed
// as a * x0 + b * x1 + c in float, rounded half to even.
void add_u8(const uint8_t* x0, QParams q0, const uint8_t* x1, QParams q1, int64_t n, QParams qy,
            uint8_t lo, uint8_t hi, uint8_t* y);

// A float input quantized for a dynamic int8 run: parameters chosen from its
// range as PyTorch's dynamic quantization does, values in the calling
// thread's quantize_buffer (valid until that thread's next call).
struct DynamicInput {
  const uint8_t* data;
  QParams q;
};
DynamicInput quantize_dynamic(const float* x, int64_t n);

}  // namespace qpack
