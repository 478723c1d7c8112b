#include "core/linear.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/layer.h"
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

  parse_clamp(p.clamp_min, p.clamp_max, &s.clamp_min, &s.clamp_max);
  s.bias = parse_bias(p.bias, s.N);

  if (s.mode != QPACK_MODE_F32) {
    parse_weight_quant(p.weight_scales, p.weight_zero_points, p.num_weight_scales, s.N, "feature",
                       &s.weight_scales, &s.weight_zero_points);
  }
  if (s.mode == QPACK_MODE_INT8_STATIC) {
    parse_static_io(p.input_scale, p.input_zero_point, p.output_scale, p.output_zero_point,
                    &s.input_scale, &s.input_zero_point, &s.output_scale, &s.output_zero_point);
  }
  return s;
}

Linear::Linear(LinearSpec spec, const void* weight, bool retain) : spec_(std::move(spec)) {
  if (spec_.backend == QPACK_BACKEND_ONEDNN) {
    kernel_ = make_onednn_linear(spec_, weight);
  } else {
    kernel_ = make_qnnpack_linear(spec_, weight);
  }
  if (retain) original_.keep(weight, spec_.weight_nbytes());
}

void Linear::release_original() { original_.release(); }
bool Linear::has_original() const { return original_.held(); }
size_t Linear::nbytes_original() const { return original_.nbytes(); }

void Linear::unpack(void* weight_out, float* bias_out) const {
  if (weight_out != nullptr && !original_.copy_to(weight_out)) kernel_->unpack_weight(weight_out);
  if (bias_out != nullptr) copy_bias(spec_.bias, spec_.N, bias_out);
}

}  // namespace qpack
