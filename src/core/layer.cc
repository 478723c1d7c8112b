#include "core/layer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/quant.h"

namespace qpack {

void OriginalWeights::keep(const void* weight, size_t nbytes) {
  const auto* bytes = static_cast<const uint8_t*>(weight);
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_.assign(bytes, bytes + nbytes);
}

void OriginalWeights::release() {
  std::vector<uint8_t> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  dropped.swap(bytes_);
}

bool OriginalWeights::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !bytes_.empty();
}

size_t OriginalWeights::nbytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_.size();
}

bool OriginalWeights::copy_to(void* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes_.empty()) return false;
  std::memcpy(out, bytes_.data(), bytes_.size());
  return true;
}

void parse_clamp(float clamp_min, float clamp_max, float* min_out, float* max_out) {
  check(!std::isnan(clamp_min) && !std::isnan(clamp_max), QPACK_STATUS_INVALID_ARGUMENT,
        "activation bounds must not be NaN");
  check(clamp_min < clamp_max, QPACK_STATUS_INVALID_ARGUMENT, "activation min (", clamp_min,
        ") must be below max (", clamp_max, ")");
  *min_out = clamp_min;
  *max_out = clamp_max;
}

std::vector<float> parse_bias(const float* bias, int64_t channels) {
  if (bias == nullptr) return {};
  std::vector<float> out(bias, bias + channels);
  for (int64_t n = 0; n < channels; ++n) {
    check(std::isfinite(out[n]), QPACK_STATUS_INVALID_ARGUMENT, "bias[", n, "] is not finite (",
          out[n], ")");
  }
  return out;
}

void copy_bias(const std::vector<float>& bias, int64_t channels, float* out) {
  if (bias.empty()) {
    std::memset(out, 0, sizeof(float) * static_cast<size_t>(channels));
  } else {
    std::memcpy(out, bias.data(), sizeof(float) * static_cast<size_t>(channels));
  }
}

void parse_weight_quant(const float* scales, const int32_t* zero_points, int64_t num,
                        int64_t channels, const char* unit, std::vector<float>* scales_out,
                        std::vector<int32_t>* zero_points_out) {
  check(scales != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
        "an int8 weight needs weight_scale (one float, or one per output channel)");
  check(num == 1 || num == channels, QPACK_STATUS_INVALID_ARGUMENT, "weight_scale has ", num,
        " values; expected 1 (per-tensor) or ", channels, " (per-channel, one per output ", unit,
        ")");
  scales_out->assign(scales, scales + num);
  for (int64_t i = 0; i < num; ++i) check_scale((*scales_out)[i], "weight_scale", i);
  if (zero_points == nullptr) {
    zero_points_out->assign(static_cast<size_t>(num), 0);
    return;
  }
  zero_points_out->assign(zero_points, zero_points + num);
  for (int64_t i = 0; i < num; ++i) {
    const int32_t zp = (*zero_points_out)[i];
    check(zp >= -128 && zp <= 127, QPACK_STATUS_INVALID_ARGUMENT, "weight zero point[", i,
          "] = ", zp, " is outside the int8 range [-128, 127]");
  }
}

void parse_static_io(float input_scale, int32_t input_zero_point, float output_scale,
                     int32_t output_zero_point, float* input_scale_out,
                     int32_t* input_zero_point_out, float* output_scale_out,
                     int32_t* output_zero_point_out) {
  check_scale(output_scale, "output_scale", -1);
  check_u8_zero_point(output_zero_point, "output_zero_point");
  if (input_scale != 0.0f) {
    check_scale(input_scale, "input_scale", -1);
    check_u8_zero_point(input_zero_point, "input_zero_point");
  }
  *output_scale_out = output_scale;
  *output_zero_point_out = output_zero_point;
  *input_scale_out = input_scale;
  *input_zero_point_out = input_zero_point;
}

}  // namespace qpack
