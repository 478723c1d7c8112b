// extern "C" surface of the packed linear layer (qpack_linear_*).
#include <cmath>
#include <cstring>

#include "api/handle.h"
#include "core/error.h"
#include "core/linear.h"
#include "qpack/qpack.h"

namespace qpack {
void fill_geometry(const LinearSpec& s, qpack_linear_info* out) {
  out->in_features = s.K;
  out->out_features = s.N;
}
}  // namespace qpack

namespace {
namespace api = qpack::api;
constexpr const char* kWhat = "linear";

template <typename In, typename Out, typename Run>
qpack_status run(const qpack_linear* linear, int64_t batch, const In* x, Out* y, Run body) {
  return api::guarded([&] {
    auto impl = api::live(linear, kWhat);
    api::check_batch_io(batch, x, y);
    body(impl->kernel());
  });
}
}  // namespace

extern "C" {

void qpack_linear_params_init(qpack_linear_params* params) {
  if (params == nullptr) return;
  std::memset(params, 0, sizeof(*params));
  params->mode = QPACK_MODE_F32;
  params->backend = QPACK_BACKEND_AUTO;
  params->retain = QPACK_RETAIN_DEFAULT;
  params->clamp_min = -INFINITY;
  params->clamp_max = INFINITY;
}

qpack_status qpack_linear_create(const qpack_linear_params* params, qpack_linear** linear_out) {
  return api::create(params, linear_out,
                     [](const qpack_linear_params& p) { return qpack::make_linear_spec(p); });
}

void qpack_linear_destroy(qpack_linear* linear) { delete linear; }

qpack_status qpack_linear_close(qpack_linear* linear) { return api::close(linear, kWhat); }

qpack_status qpack_linear_run_f32(const qpack_linear* linear, int64_t batch, const float* x,
                                  float* y_out) {
  return run(linear, batch, x, y_out,
             [&](const qpack::LinearKernel& k) { k.run_f32(batch, x, y_out); });
}

qpack_status qpack_linear_run_u8(const qpack_linear* linear, int64_t batch, const uint8_t* x,
                                 float input_scale, int32_t input_zero_point, uint8_t* y_out) {
  return run(linear, batch, x, y_out, [&](const qpack::LinearKernel& k) {
    k.run_u8(batch, x, input_scale, input_zero_point, y_out);
  });
}

qpack_status qpack_linear_release_original(qpack_linear* linear) {
  return api::release_original(linear, kWhat);
}

qpack_status qpack_linear_unpack(const qpack_linear* linear, void* weight_out, float* bias_out) {
  return api::unpack(linear, kWhat, weight_out, bias_out);
}

qpack_status qpack_linear_get_info(const qpack_linear* linear, qpack_linear_info* info_out) {
  return api::info(linear, kWhat, info_out);
}

qpack_status qpack_linear_get_stats(const qpack_linear* linear, qpack_linear_stats* stats_out) {
  return api::stats(linear, kWhat, stats_out);
}

}  // extern "C"
