#include "core/linear.h"

#include "core/error.h"

namespace qpack {

void LinearKernel::run_f32(int64_t M, const float* x, float* y) const {
  check_run_mode(spec_, OpKind::linear, false);
  counters_.ran();
  if (M > 0) do_run_f32(M, x, y);
}

bool LinearKernel::run_f32_fused(int64_t M, const float* x, float* y, qpack_activation act, float lo,
                                 float hi) const {
  check_run_mode(spec_, OpKind::linear, false);
  if (spec_.mode != QPACK_MODE_F32 || M <= 0 || !do_run_f32_fused(M, x, y, act, lo, hi)) return false;
  counters_.ran();
  return true;
}

void LinearKernel::run_u8(int64_t M, const uint8_t* x, float input_scale,
                          int32_t input_zero_point, uint8_t* y) const {
  check_run_mode(spec_, OpKind::linear, true);
  check_input_qparams(input_scale, input_zero_point);
  counters_.ran();
  if (M > 0) do_run_u8(M, x, input_scale, input_zero_point, y);
}

void LinearKernel::do_run_f32(int64_t, const float*, float*) const { not_run(spec_, OpKind::linear); }
void LinearKernel::do_run_u8(int64_t, const uint8_t*, float, int32_t, uint8_t*) const {
  not_run(spec_, OpKind::linear);
}

LinearSpec make_linear_spec(const qpack_linear_params& p, bool weight_given) {
  LinearSpec s;
  check(p.in_features >= 1 && p.out_features >= 1, QPACK_STATUS_INVALID_ARGUMENT,
        "the weight needs at least one row and column: in_features and out_features must be "
        ">= 1, got ", p.in_features, " and ", p.out_features);
  check(p.in_features <= (int64_t(1) << 31) && p.out_features <= (int64_t(1) << 31) &&
            p.in_features * p.out_features < (int64_t(1) << 40),
        QPACK_STATUS_INVALID_ARGUMENT, "in_features and out_features must be < 2^31");
  s.K = p.in_features;
  s.N = p.out_features;
  parse_op_spec(OpParams::of(p), OpKind::linear, p.weight, s.K * s.N, s.N, "feature", &s, weight_given);
  return s;
}

}  // namespace qpack
