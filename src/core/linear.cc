#include "core/linear.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/quant.h"

namespace qpack {

void LinearKernel::run_f32(int64_t, const float*, float*) const {
  fail(QPACK_STATUS_INVALID_TYPE,
       "this layer takes uint8 input with a scale and zero point (it is a static int8 layer); "
       "float input needs a float32 or dynamic int8 layer");
}

void LinearKernel::run_u8(int64_t, const uint8_t*, float, int32_t, uint8_t*) const {
  fail(QPACK_STATUS_INVALID_TYPE,
       "this layer takes float32 input; uint8 input needs a static int8 layer "
       "(int8 weight with output_scale and output_zero_point)");
}

LinearSpec make_linear_spec(const qpack_linear_params& p) {
  LinearSpec s;
  check(p.in_features >= 1, QPACK_STATUS_INVALID_ARGUMENT, "in_features must be >= 1, got ",
        p.in_features);
  check(p.out_features >= 1, QPACK_STATUS_INVALID_ARGUMENT, "out_features must be >= 1, got ",
        p.out_features);
  check(p.in_features <= (int64_t(1) << 31) && p.out_features <= (int64_t(1) << 31),
        QPACK_STATUS_INVALID_ARGUMENT, "in_features and out_features must be < 2^31");
  check(p.weight != nullptr, QPACK_STATUS_INVALID_ARGUMENT, "weight is NULL");
  s.K = p.in_features;
  s.N = p.out_features;
  s.mode = p.mode;
  check(p.mode == QPACK_MODE_F32 || p.mode == QPACK_MODE_INT8_STATIC ||
            p.mode == QPACK_MODE_INT8_DYNAMIC,
        QPACK_STATUS_INVALID_ARGUMENT, "unknown mode ", static_cast<int>(p.mode));
  s.backend = p.backend;
  if (s.backend == QPACK_BACKEND_AUTO) {
    s.backend = s.mode == QPACK_MODE_F32 ? QPACK_BACKEND_ONEDNN : QPACK_BACKEND_QNNPACK;
  }
  check(s.backend == QPACK_BACKEND_ONEDNN || s.backend == QPACK_BACKEND_QNNPACK,
        QPACK_STATUS_INVALID_ARGUMENT, "unknown backend ", static_cast<int>(p.backend));
  check(!(s.mode == QPACK_MODE_F32 && s.backend == QPACK_BACKEND_QNNPACK),
        QPACK_STATUS_UNSUPPORTED,
        "QNNPACK has no float32 linear; use backend='onednn' or quantize the weight to int8");

  // Fused activation bounds.
  check(!std::isnan(p.clamp_min) && !std::isnan(p.clamp_max), QPACK_STATUS_INVALID_ARGUMENT,
        "activation bounds must not be NaN");
  check(p.clamp_min < p.clamp_max, QPACK_STATUS_INVALID_ARGUMENT,
        "activation min (", p.clamp_min, ") must be below max (", p.clamp_max, ")");
  s.clamp_min = p.clamp_min;
  s.clamp_max = p.clamp_max;

  if (p.bias != nullptr) {
    s.bias.assign(p.bias, p.bias + s.N);
    for (int64_t n = 0; n < s.N; ++n) {
      check(std::isfinite(s.bias[n]), QPACK_STATUS_INVALID_ARGUMENT, "bias[", n,
            "] is not finite (", s.bias[n], ")");
    }
  }

  if (s.mode != QPACK_MODE_F32) {
    check(p.weight_scales != nullptr, QPACK_STATUS_INVALID_ARGUMENT,
          "an int8 weight needs weight_scale (one float, or one per output channel)");
    check(p.num_weight_scales == 1 || p.num_weight_scales == s.N, QPACK_STATUS_INVALID_ARGUMENT,
          "weight_scale has ", p.num_weight_scales, " values; expected 1 (per-tensor) or ", s.N,
          " (per-channel, one per output feature)");
    s.weight_scales.assign(p.weight_scales, p.weight_scales + p.num_weight_scales);
    for (size_t i = 0; i < s.weight_scales.size(); ++i) {
      check_scale(s.weight_scales[i], "weight_scale", static_cast<int64_t>(i));
    }
    if (p.weight_zero_points != nullptr) {
      s.weight_zero_points.assign(p.weight_zero_points,
                                  p.weight_zero_points + p.num_weight_scales);
      for (size_t i = 0; i < s.weight_zero_points.size(); ++i) {
        int32_t zp = s.weight_zero_points[i];
        check(zp >= -128 && zp <= 127, QPACK_STATUS_INVALID_ARGUMENT, "weight zero point[", i,
              "] = ", zp, " is outside the int8 range [-128, 127]");
      }
    } else {
      s.weight_zero_points.assign(s.weight_scales.size(), 0);
    }
  }
  if (s.mode == QPACK_MODE_INT8_STATIC) {
    check_scale(p.output_scale, "output_scale", -1);
    check_u8_zero_point(p.output_zero_point, "output_zero_point");
    s.output_scale = p.output_scale;
    s.output_zero_point = p.output_zero_point;
    if (p.input_scale != 0.0f) {
      check_scale(p.input_scale, "input_scale", -1);
      check_u8_zero_point(p.input_zero_point, "input_zero_point");
    }
    s.input_scale = p.input_scale;
    s.input_zero_point = p.input_zero_point;
  }
  return s;
}

Linear::Linear(LinearSpec spec, const void* weight, bool retain) : spec_(std::move(spec)) {
  if (spec_.backend == QPACK_BACKEND_ONEDNN) {
    kernel_ = make_onednn_linear(spec_, weight);
  } else {
    kernel_ = make_qnnpack_linear(spec_, weight);
  }
  if (retain) {
    const auto* bytes = static_cast<const uint8_t*>(weight);
    original_.assign(bytes, bytes + spec_.weight_nbytes());
    has_original_ = true;
  }
}

void Linear::release_original() {
  std::vector<uint8_t> dropped;
  {
    std::lock_guard<std::mutex> lock(original_mutex_);
    dropped.swap(original_);
    has_original_ = false;
  }
}

bool Linear::has_original() const {
  std::lock_guard<std::mutex> lock(original_mutex_);
  return has_original_;
}

size_t Linear::nbytes_original() const {
  std::lock_guard<std::mutex> lock(original_mutex_);
  return original_.size();
}

void Linear::unpack(void* weight_out, float* bias_out) const {
  if (weight_out != nullptr) {
    bool copied = false;
    {
      std::lock_guard<std::mutex> lock(original_mutex_);
      if (has_original_) {
        std::memcpy(weight_out, original_.data(), original_.size());
        copied = true;
      }
    }
    if (!copied) kernel_->unpack_weight(weight_out);
  }
  if (bias_out != nullptr) {
    if (spec_.bias.empty()) {
      std::memset(bias_out, 0, sizeof(float) * spec_.N);
    } else {
      std::memcpy(bias_out, spec_.bias.data(), sizeof(float) * spec_.N);
    }
  }
}

}  // namespace qpack
