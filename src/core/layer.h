// What PackedLinear and PackedConv2d share in the core: the retained original
// weight, and the validation of the parameters both C structs carry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace qpack {

// The original weight bytes while retained. Thread-safe; runs never touch it.
class OriginalWeights {
 public:
  void keep(const void* weight, size_t nbytes);
  void release();          // idempotent
  bool held() const;
  size_t nbytes() const;   // 0 once released
  // Copies the original into out and returns true, or returns false if released.
  bool copy_to(void* out) const;

 private:
  mutable std::mutex mutex_;
  std::vector<uint8_t> bytes_;  // empty once released (weights are never empty)
};

// Fused activation bounds (real domain): not NaN, min < max.
void parse_clamp(float clamp_min, float clamp_max, float* min_out, float* max_out);
// Bias of `channels` finite floats, or empty for NULL.
std::vector<float> parse_bias(const float* bias, int64_t channels);
// bias [channels] into out, zeros when there is no bias.
void copy_bias(const std::vector<float>& bias, int64_t channels, float* out);
// int8 weight quantization: 1 or `channels` positive normal scales, zero
// points in [-128, 127] (all 0 when NULL). `unit` names a channel in messages.
void parse_weight_quant(const float* scales, const int32_t* zero_points, int64_t num,
                        int64_t channels, const char* unit, std::vector<float>* scales_out,
                        std::vector<int32_t>* zero_points_out);
// Static int8 input/output parameters; an input scale of 0 means "per call".
void parse_static_io(float input_scale, int32_t input_zero_point, float output_scale,
                     int32_t output_zero_point, float* input_scale_out,
                     int32_t* input_zero_point_out, float* output_scale_out,
                     int32_t* output_zero_point_out);

}  // namespace qpack
